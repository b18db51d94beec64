"""Losses of NAMC (section 3.3, appendix E) and the ablation alternatives of Table 7.

Dimension letters: B local batch, G gathered batch (all ranks), D embedding width, N positions, V classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _kl_to_targets(logits: torch.Tensor, targets: torch.Tensor, eps: float) -> torch.Tensor:
    """Mean over rows of ``KL(softmax(logits) || targets)``."""
    p = logits.softmax(dim=1)
    kl = p * (logits.log_softmax(dim=1) - torch.log(targets + eps))
    return kl.sum(dim=1).mean()


def sdm_loss(
    img_emb: torch.Tensor, txt_emb: torch.Tensor, positives: torch.Tensor, tau: float = 0.02, eps: float = 1e-8
) -> torch.Tensor:
    """Similarity-distribution matching loss of Jiang & Ye (CVPR 2023), appendix E.1, Eqs. 13-15, one subset.

    ``p_i = softmax_j(cos(e_I_i, e_T_j) / tau)``, ``q_i = y_i / |y_i|``, ``L = KL(p || q)`` image-to-text plus the
    symmetric text-to-image term. Identical texts in a batch are positives (``positives`` says so). The paper does not
    give ``tau``; 0.02 is the value of Jiang & Ye's released code (logit scale 50).

    Args:
        img_emb: (B, D) image [CLS] embeddings.
        txt_emb: (B, D) text [EOS] embeddings (row i is the text paired with image i).
        positives: (B, B) bool ``y``; ``y[i, j]`` when image i is paired with text j. The diagonal must be True.
        tau: temperature.
        eps: added inside the log of the target distribution, where it is 0.

    Returns:
        scalar ``L_i2t + L_t2i`` (Eq. 15).
    """
    logits = F.normalize(img_emb, dim=-1) @ F.normalize(txt_emb, dim=-1).T / tau  # (B, B)
    y = positives.to(logits.dtype)
    q_i2t = y / y.sum(dim=1, keepdim=True)
    q_t2i = y.T / y.T.sum(dim=1, keepdim=True)
    return _kl_to_targets(logits, q_i2t, eps) + _kl_to_targets(logits.T, q_t2i, eps)


def info_nce_loss(img_emb: torch.Tensor, txt_emb: torch.Tensor, tau: float = 0.02) -> torch.Tensor:
    """Symmetric InfoNCE (CLIP) loss, the NIM ablation of Table 7.

    Args:
        img_emb: (B, D) image embeddings.
        txt_emb: (B, D) text embeddings; row i is the positive of image i. Only the diagonal is positive:
            duplicate texts count as negatives, which is the difference from :func:`sdm_loss`.
        tau: temperature.

    Returns:
        scalar ``(CE_i2t + CE_t2i) / 2``.
    """
    logits = F.normalize(img_emb, dim=-1) @ F.normalize(txt_emb, dim=-1).T / tau  # (B, B)
    target = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def masked_token_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """MIR discrete reconstruction loss, Eq. 18, over masked positions only (appendix E.2).

    The head runs only on masked positions (BEiT), so the caller passes the gathered rows.

    Args:
        logits: (M, V) predictions for the M masked positions of the batch.
        targets: (M,) ground-truth VQGAN codes.

    Returns:
        scalar mean cross-entropy; 0 (with a graph) when nothing is masked.
    """
    if targets.numel() == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits.float(), targets)


def masked_regression_loss(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, kind: str) -> torch.Tensor:
    """L1 / L2 regression onto the raw grid features at masked positions, the MIR ablation of Table 7.

    Args:
        pred: (B, N, C) reconstructed features.
        target: (B, N, C) raw features ``X``.
        mask: (B, N) bool, True where masked.
        kind: ``"l1"`` or ``"l2"``.

    Returns:
        scalar mean over masked elements; 0 (with a graph) when nothing is masked.
    """
    if kind not in ("l1", "l2"):
        raise ValueError(f"kind must be 'l1' or 'l2', got {kind!r}")
    if not mask.any():
        return pred.sum() * 0.0
    p, t = pred[mask].float(), target[mask].float()  # (M, C)
    return F.l1_loss(p, t) if kind == "l1" else F.mse_loss(p, t)


def caption_ce(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """FDG next-token cross-entropy (section 3.3) over positions whose target is not ``ignore_index``.

    Args:
        logits: (B, T, V) next-token logits.
        targets: (B, T) target ids; padding and excluded positions hold ``ignore_index``.
        ignore_index: the id to skip.

    Returns:
        scalar mean over counted positions; 0 (with a graph) when none counts.
    """
    if not (targets != ignore_index).any():
        return logits.sum() * 0.0
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=ignore_index)
