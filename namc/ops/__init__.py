"""The paper's math as pure tensor functions: relevance (Eq. 1), noise masking, the losses, token sequences
(targets, log-probabilities) and the differentiable collectives DDP needs (:mod:`namc.ops.distributed`)."""

from namc.ops.losses import (
    caption_ce,
    info_nce_loss,
    masked_regression_loss,
    masked_token_ce,
    ngram_presence,
    sdm_loss,
    token_sigmoid_loss,
)
from namc.ops.masking import mask_probabilities, random_mask_probabilities, sample_mask
from namc.ops.relevance import relevance_from_similarity, similarity_matrix, token_relevance
from namc.ops.sequence import (
    IGNORE,
    first_index,
    next_token_targets,
    sequence_logprobs,
    token_logprobs,
    used_length,
)

__all__ = [
    "IGNORE",
    "first_index",
    "next_token_targets",
    "sequence_logprobs",
    "token_logprobs",
    "used_length",
    "caption_ce",
    "info_nce_loss",
    "mask_probabilities",
    "masked_regression_loss",
    "masked_token_ce",
    "ngram_presence",
    "random_mask_probabilities",
    "relevance_from_similarity",
    "sample_mask",
    "sdm_loss",
    "similarity_matrix",
    "token_relevance",
    "token_sigmoid_loss",
]
