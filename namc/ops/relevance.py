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
    s = similarity_matrix(h_img, h_txt)  # (B, N, L)
    valid = txt_valid[:, None, :]  # (B, 1, L)
    r_img = s.masked_fill(~valid, float("-inf")).amax(dim=2)  # (B, N)
    r_img = torch.where(torch.isfinite(r_img), r_img, torch.zeros_like(r_img))
    r_txt = s.amax(dim=1).masked_fill(~txt_valid, 0.0)  # (B, L)
    return r_img, r_txt
