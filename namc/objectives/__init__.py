"""Training objectives over a :class:`~namc.models.namc.NAMC`: functions of the model and a batch, not model methods.

- :func:`pretrain_step`: ``L = L_NIM + L_MIR + L_FDG`` (Eq. 2), each term its own function in :mod:`.pretrain`.
- :func:`finetune_step`: next-token cross-entropy on benchmark captions.
- :func:`sequence_logprob`: log pi(T | X1, X2) of whole captions (preference training, likelihood-based choice).
- :mod:`.preference`: the DPO margin and loss of ADPO (Eq. 2/4) and the REINFORCE loss of its hard-negative
  retriever, over sequence log-probabilities; :mod:`.retriever`: that retriever, q_phi.
- :mod:`.optim`: the paper's learning rates and cosine schedule (appendix F).
"""

from namc.objectives.caption import caption_loss, finetune_step, sequence_logprob
from namc.objectives.optim import FINETUNE_LR, PREFERENCE_LR, PRETRAIN_LR, CosineSchedule, GroupLR, optimizer_groups
from namc.objectives.preference import dpo_loss, dpo_margin, dpo_reward, reinforce_loss
from namc.objectives.pretrain import pretrain_step

__all__ = [
    "FINETUNE_LR",
    "PREFERENCE_LR",
    "PRETRAIN_LR",
    "CosineSchedule",
    "GroupLR",
    "caption_loss",
    "dpo_loss",
    "dpo_margin",
    "dpo_reward",
    "finetune_step",
    "optimizer_groups",
    "pretrain_step",
    "reinforce_loss",
    "sequence_logprob",
]
