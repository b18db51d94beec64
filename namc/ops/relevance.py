"""Token-to-token relevance between image patches and words (paper Eq. 1).

Dimension letters: B batch, N image patches, L text tokens, D shared embedding width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def similarity_matrix(h_img: torch.Tensor, h_txt: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every patch with every token, ``S`` of Eq. 1.

    Args:
        h_img: (B, N, D) patch embeddings ``H_I``.
        h_txt: (B, L, D) token embeddings ``H_T``.

    Returns:
        (B, N, L) cosine similarities.
    """
    return torch.einsum("bnd,bld->bnl", F.normalize(h_img, dim=-1), F.normalize(h_txt, dim=-1))


def token_relevance(
    h_img: torch.Tensor, h_txt: torch.Tensor, txt_valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Relevance of each patch and each word, Eq. 1: row and column maxima of the cosine matrix ``S``.

    Only real word tokens take part: padding, [SOS] and [EOS] are excluded from the row maximum and get relevance
    0 (they are never masked because :func:`namc.ops.mask_probabilities` zeroes them).

    Args:
        h_img: (B, N, D) patch embeddings.
        h_txt: (B, L, D) token embeddings.
        txt_valid: (B, L) bool, True for real word tokens.

    Returns:
        ``(r_img, r_txt)``: (B, N) ``R_I[m] = max_n S[m, n]`` and (B, L) ``R_T[n] = max_m S[m, n]``.
        A sample without any valid word gets ``r_img = 0``.
    """
    return relevance_from_similarity(similarity_matrix(h_img, h_txt), txt_valid)


def relevance_from_similarity(s: torch.Tensor, txt_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1's row and column maxima of a similarity tensor ``S`` with any leading dimensions.

    Args:
        s: (..., N, L) patch-word cosine similarities.
        txt_valid: (..., L) bool (broadcastable to ``s`` without its N dimension), True for real words.

    Returns:
        ``(r_img, r_txt)``: (..., N) best word of each patch (0 where no word is valid) and (..., L) best patch of
        each word (0 at invalid words).
    """
    r_img = s.masked_fill(~txt_valid[..., None, :], float("-inf")).amax(dim=-1)  # (..., N)
    r_img = torch.where(torch.isfinite(r_img), r_img, torch.zeros_like(r_img))
    r_txt = s.amax(dim=-2).masked_fill(~txt_valid, 0.0)  # (..., L)
    return r_img, r_txt
