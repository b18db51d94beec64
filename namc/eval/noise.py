"""Noise identification: how well NIM's irrelevance ``1 - R_T`` finds injected noise words.

The shapes-world corpus marks every injected noise word (``noise1``/``noise2``, aligned to ``desc.split()``);
:class:`~namc.data.collate.PretrainCollator` turns those labels into token labels of the description halves. NIM
ranks tokens by irrelevance ``IR_T = 1 - R_T`` (Eq. 1) before it samples its masks, so the area under the ROC curve
of ``IR_T`` against the labels measures how well it tells noise from clean words (0.5 is chance, 1 is perfect).

Relevance-map figures are drawn by :func:`namc.eval.plots.plot_relevance`.

Dimension letters: B pairs, L description tokens.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from namc.models.namc import NAMC

__all__ = ["auroc", "noise_auroc", "noise_scores"]

logger = logging.getLogger(__name__)


def auroc(scores: torch.Tensor | Sequence[float], labels: torch.Tensor | Sequence[int]) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney U) formula, ties counted as one half.

    ``AUROC = (sum of the ranks of the positives - P (P + 1) / 2) / (P * Q)`` with 1-based ranks over all scores,
    tied scores sharing their average rank; P positives, Q negatives. It is the probability that a random positive
    scores higher than a random negative.

    Args:
        scores: (K,) higher = more likely positive.
        labels: (K,) 1 / True for positives.

    Returns:
        the AUROC in [0, 1]; NaN when either class is empty.
    """
    s = torch.as_tensor(scores, dtype=torch.float64).flatten()
    y = torch.as_tensor(labels).flatten().bool()
    if s.shape != y.shape:
        raise ValueError(f"scores {tuple(s.shape)} and labels {tuple(y.shape)} differ in length")
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = s.argsort()
    sorted_s = s[order]
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).to(torch.float64)  # last 1-based rank of each tie group
    average = ends - (counts.to(torch.float64) - 1) / 2  # mean rank of each tie group
    ranks = torch.empty_like(s)
    ranks[order] = average[inverse]
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@torch.no_grad()
def noise_scores(model: NAMC, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Irrelevance ``1 - R_T`` and noise labels of every word token of the pairs that carry labels.

    Args:
        model: a NAMC with its NIM module (pre-training model).
        batch: a :class:`~namc.data.collate.PretrainCollator` batch: ``image1``, ``image2`` (B, 3, H, W), ``desc1``,
            ``desc2`` (B, L), ``noise1``, ``noise2`` (B, L) bool, ``has_noise`` (B,).

    Returns:
        ``(scores, labels)``: (K,) float irrelevance and (K,) bool labels on the CPU, K word tokens of the labelled
        pairs (both halves; [SOS], [EOS] and padding excluded).
    """
    scores, labels = [], []
    keep = batch["has_noise"].to(batch["image1"].device)
    if not bool(keep.any()):
        return torch.zeros(0), torch.zeros(0, dtype=torch.bool)
    for k in ("1", "2"):
        images, text = batch["image" + k][keep], batch["desc" + k][keep]
        _, r_txt = model.relevance(images, text)  # (B', L)
        words, _ = model.text_masks(text)  # (B', L) word tokens between [SOS] and [EOS]
        scores.append((1 - r_txt)[words].float().cpu())
        labels.append(batch["noise" + k][keep][words].cpu())
    return torch.cat(scores), torch.cat(labels)


@torch.no_grad()
def noise_auroc(model: NAMC, batches: Iterable[dict[str, Any]]) -> dict[str, float]:
    """AUROC of irrelevance against injected-noise labels over all word tokens of ``batches``.

    Returns:
        ``{"auroc", "tokens", "noise_tokens", "mean_irrelevance_noise", "mean_irrelevance_clean"}``.
    """
    was_training = model.training
    model.eval()
    all_s, all_y = [], []
    device = next(model.parameters()).device
    for batch in batches:
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        s, y = noise_scores(model, batch)
        all_s.append(s)
        all_y.append(y)
    model.train(was_training)
    s = torch.cat(all_s) if all_s else torch.zeros(0)
    y = torch.cat(all_y) if all_y else torch.zeros(0, dtype=torch.bool)
    return {
        "auroc": auroc(s, y),
        "tokens": int(y.numel()),
        "noise_tokens": int(y.sum()),
        "mean_irrelevance_noise": float(s[y].mean()) if y.any() else math.nan,
        "mean_irrelevance_clean": float(s[~y].mean()) if (~y).any() else math.nan,
    }
