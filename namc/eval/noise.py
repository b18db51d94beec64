"""Noise identification and relevance maps: how well NIM's irrelevance ``1 - R_T`` finds injected noise words.

The shapes-world corpus marks every injected noise word (``noise1``/``noise2``, aligned to ``desc.split()``);
:class:`~namc.data.collate.PretrainCollator` turns those labels into token labels of the description halves. NIM
ranks tokens by irrelevance ``IR_T = 1 - R_T`` (Eq. 1) before it samples its masks, so the area under the ROC curve
of ``IR_T`` against the labels measures how well it tells noise from clean words (0.5 is chance, 1 is perfect).

Dimension letters: B pairs, N image patches (grid cells), L description tokens.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from namc.models.namc import NAMC

__all__ = ["auroc", "noise_auroc", "noise_scores", "plot_relevance"]

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
        words, _ = model._text_masks(text)  # (B', L) word tokens between [SOS] and [EOS]
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


def _word_relevance(
    model: NAMC, image: torch.Tensor, text: torch.Tensor
) -> tuple[torch.Tensor, list[str], list[float]]:
    """Patch relevance (h, w) and per-token words/relevance of one image and one description half."""
    r_img, r_txt = model.relevance(image[None], text[None])  # (1, N), (1, L)
    words, _ = model._text_masks(text[None])
    ids = text[words[0]].tolist()
    tokens = [model.tokenizer.decode([i]) or "?" for i in ids]
    side = int(math.isqrt(r_img.shape[1]))
    return r_img[0].view(side, side).cpu(), tokens, r_txt[0][words[0]].tolist()  # (N,) -> (h, w)


@torch.no_grad()
def plot_relevance(model: NAMC, batch: dict[str, Any], path: str | Path, pairs: Sequence[int] = (0,)) -> Path:
    """Draw NIM's relevance maps like the paper's Figures 6-8 and save them as a PNG.

    One row per pair: each image with its patch relevance ``R_I`` overlaid (blue = relevant), and under it the words
    of its description half on backgrounds coloured by ``R_T`` (the colour bar gives the scale of the values drawn);
    injected noise words, when the batch labels them, are framed in red.

    Args:
        model: a NAMC with its NIM module.
        batch: a :class:`~namc.data.collate.PretrainCollator` batch (on any device).
        path: the PNG to write.
        pairs: which pairs of the batch to draw.

    Returns:
        the path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import cm, colormaps
    from matplotlib.colors import Normalize

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    panels = []
    for b in pairs:
        for k in ("1", "2"):
            image = batch["image" + k][b].to(device)
            heat, tokens, rel = _word_relevance(model, image, batch["desc" + k][b].to(device))
            labels = batch.get("noise" + k)
            noise = labels[b][1 : 1 + len(tokens)].tolist() if labels is not None else [False] * len(tokens)
            panels.append((b, k, image.cpu(), heat, tokens, rel, noise))
    values = [r for p in panels for r in p[5]]
    norm = Normalize(vmin=min(values, default=0.0), vmax=max(values, default=1.0) + 1e-6)
    cmap = colormaps["coolwarm_r"]
    dpi = 110  # text widths are measured at this resolution, so the figure is saved at it too
    fig, axes = plt.subplots(
        2 * len(pairs), 2, figsize=(10, 5.2 * len(pairs)), height_ratios=[3, 1.4] * len(pairs), dpi=dpi
    )
    axes = axes.reshape(2 * len(pairs), 2)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for i, (b, k, image, heat, tokens, rel, noise) in enumerate(panels):
        row, col = 2 * (i // 2), i % 2
        ax = axes[row, col]
        side = image.shape[-1]
        ax.imshow(image.permute(1, 2, 0).clamp(0, 1).numpy())  # (3, H, W) -> (H, W, 3)
        ax.imshow(heat.numpy(), cmap="Blues", alpha=0.5, extent=(0, side, side, 0), interpolation="nearest")
        ax.set_title(f"{batch['ids'][b]} image {k}: patch relevance", fontsize=9)
        ax.axis("off")
        tax = axes[row + 1, col]
        tax.axis("off")
        box = tax.get_window_extent(renderer)
        char = 0.6 * 9 * dpi / 72  # width in pixels of one monospace character at 9 pt
        x, y = 0.0, 0.95
        for word, r, is_noise in zip(tokens, rel, noise):
            text = tax.text(x, y, word, fontsize=9, family="monospace", transform=tax.transAxes, va="top",
                            bbox=dict(facecolor=cmap(norm(r)), edgecolor="red" if is_noise else "none", pad=1.5,
                                      linewidth=1.5))  # fmt: skip
            width = (len(word) + 2) * char / box.width
            if x > 0 and x + width > 1.0:  # wrap: move the word to the next line
                x, y = 0.0, y - 0.25
                text.set_position((x, y))
            x += width
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes.ravel().tolist(), shrink=0.4,
                 label="word relevance R_T (red frame: injected noise)")  # fmt: skip
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    model.train(was_training)
    return path
