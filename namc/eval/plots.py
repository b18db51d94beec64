"""Figures of NIM's relevance (Eq. 1): patch relevance ``R_I`` over each image, word relevance ``R_T`` under it.

matplotlib is an optional extra (``namc[train]``): it is imported inside :func:`plot_relevance`, so importing this
module needs only torch.

Dimension letters: N image patches (grid cells), L description tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from namc.models.namc import NAMC

__all__ = ["plot_relevance"]


@dataclass
class _Panel:
    """What one image and its description half show: the image, its relevance map and its words."""

    pair: int
    half: str  # "1" or "2"
    image: torch.Tensor  # (3, H, W) on the CPU
    heat: torch.Tensor  # (h, w) patch relevance R_I
    tokens: list[str]
    relevance: list[float]  # R_T of each token
    noise: list[bool]  # whether each token is an injected noise word


def _word_relevance(
    model: NAMC, image: torch.Tensor, text: torch.Tensor
) -> tuple[torch.Tensor, list[str], list[float]]:
    """Patch relevance (h, w) and per-token words/relevance of one image and one description half."""
    r_img, r_txt = model.relevance(image[None], text[None])  # (1, N), (1, L)
    words, _ = model.text_masks(text[None])
    ids = text[words[0]].tolist()
    tokens = [model.tokenizer.decode([i]) or "?" for i in ids]
    side = int(math.isqrt(r_img.shape[1]))
    return r_img[0].view(side, side).cpu(), tokens, r_txt[0][words[0]].tolist()  # (N,) -> (h, w)


def _panels(model: NAMC, batch: dict[str, Any], pairs: Sequence[int]) -> list[_Panel]:
    """Both halves of every pair drawn, in drawing order (pair by pair, image 1 then image 2)."""
    device = next(model.parameters()).device
    panels = []
    for b in pairs:
        for k in ("1", "2"):
            image = batch["image" + k][b].to(device)
            heat, tokens, rel = _word_relevance(model, image, batch["desc" + k][b].to(device))
            labels = batch.get("noise" + k)
            noise = labels[b][1 : 1 + len(tokens)].tolist() if labels is not None else [False] * len(tokens)
            panels.append(_Panel(b, k, image.cpu(), heat, tokens, rel, noise))
    return panels


def _draw_image(ax: Any, panel: _Panel, pair_id: str) -> None:
    """The image with its patch relevance overlaid (blue = relevant)."""
    side = panel.image.shape[-1]
    ax.imshow(panel.image.permute(1, 2, 0).clamp(0, 1).numpy())  # (3, H, W) -> (H, W, 3)
    ax.imshow(panel.heat.numpy(), cmap="Blues", alpha=0.5, extent=(0, side, side, 0), interpolation="nearest")
    ax.set_title(f"{pair_id} image {panel.half}: patch relevance", fontsize=9)
    ax.axis("off")


def _draw_words(ax: Any, panel: _Panel, renderer: Any, cmap: Any, norm: Any, dpi: int) -> None:
    """The words of the description half, wrapped, on backgrounds coloured by R_T; noise words framed in red."""
    ax.axis("off")
    box = ax.get_window_extent(renderer)
    char = 0.6 * 9 * dpi / 72  # width in pixels of one monospace character at 9 pt
    x, y = 0.0, 0.95
    for word, r, is_noise in zip(panel.tokens, panel.relevance, panel.noise):
        text = ax.text(
            x,
            y,
            word,
            fontsize=9,
            family="monospace",
            transform=ax.transAxes,
            va="top",
            bbox=dict(facecolor=cmap(norm(r)), edgecolor="red" if is_noise else "none", pad=1.5, linewidth=1.5),
        )
        width = (len(word) + 2) * char / box.width
        if x > 0 and x + width > 1.0:  # wrap: move the word to the next line
            x, y = 0.0, y - 0.25
            text.set_position((x, y))
        x += width


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
    panels = _panels(model, batch, pairs)
    values = [r for p in panels for r in p.relevance]
    norm = Normalize(vmin=min(values, default=0.0), vmax=max(values, default=1.0) + 1e-6)
    cmap = colormaps["coolwarm_r"]
    dpi = 110  # text widths are measured at this resolution, so the figure is saved at it too
    fig, axes = plt.subplots(
        2 * len(pairs), 2, figsize=(10, 5.2 * len(pairs)), height_ratios=[3, 1.4] * len(pairs), dpi=dpi
    )
    axes = axes.reshape(2 * len(pairs), 2)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for i, panel in enumerate(panels):
        row, col = 2 * (i // 2), i % 2
        _draw_image(axes[row, col], panel, batch["ids"][panel.pair])
        _draw_words(axes[row + 1, col], panel, renderer, cmap, norm, dpi)
    fig.colorbar(
        cm.ScalarMappable(norm=norm, cmap=cmap),
        ax=axes.ravel().tolist(),
        shrink=0.4,
        label="word relevance R_T (red frame: injected noise)",
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    model.train(was_training)
    return path
