"""Figures 6-8 of the paper for any image pair and implicit-change description: NIM's patch relevance ``R_I`` as a heat
map over both images, the normalised word relevance ``R_T`` of each description half as bars (Figure 7/8's
"normalized relevance": min-max over the half's words), and MIR's co-attention maps (the last layer's
cross-attention, averaged over heads and queries: how much each cell of one image is read by the other stream).

matplotlib is imported inside :func:`plot_pair` (the ``[train]`` extra).

Dimension letters: N grid cells (h * w), L description tokens, H heads.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from namc.data.collate import PretrainCollator
from namc.data.transforms import ImageTransform
from namc.models.namc import NAMC
from namc.text import template

__all__ = ["pair_batch", "pair_maps", "plot_pair"]


def pair_batch(model: NAMC, image1: str | Path, image2: str | Path, description: str, max_text_len: int) -> dict:
    """A one-pair :class:`~namc.data.collate.PretrainCollator` batch from two image files and a description that
    follows the implicit-change template (section 3.1.2; :class:`namc.text.template.TemplateError` otherwise)."""
    parsed = template.parse(description)
    load = ImageTransform(model.config.image_size).load
    item = {
        "id": Path(image1).stem,
        "image1": load(Path(image1)),
        "image2": load(Path(image2)),
        "verb1": parsed.verb1,
        "desc1": parsed.desc1,
        "verb2": parsed.verb2,
        "desc2": parsed.desc2,
    }
    return PretrainCollator(model.tokenizer, max_text_len, model.config.max_caption_len)([item])


@torch.no_grad()
def pair_maps(model: NAMC, batch: dict[str, Any]) -> dict[str, Any]:
    """Relevance and co-attention of the first pair of ``batch``.

    Returns:
        ``heat`` [(h, w), (h, w)] patch relevance of both images; ``words`` [[str], [str]] and ``relevance`` [[float],
        [float]] per description half (raw R_T); ``coattention`` [(h, w), (h, w)]: cells of image 1 as read by image
        2's stream, and cells of image 2 as read by image 1's.
    """
    device = next(model.parameters()).device
    images = torch.stack([batch["image1"][0], batch["image2"][0]]).to(device)  # (2, 3, H, W)
    text = torch.stack([batch["desc1"][0], batch["desc2"][0]]).to(device)  # (2, L)
    r_img, r_txt = model.relevance(images, text)  # (2, N), (2, L)
    words, _ = model.text_masks(text)
    side = math.isqrt(r_img.shape[1])
    x = model.mir.embed(model.grid(images))  # (2, N, D)
    _, weights = model.mir.interact(x[:1], x[1:], return_weights=True)
    cross = weights[-1]["cross"].float()  # (2, H, N, N): stream k's queries over the other image's cells
    if cross.ndim == 4:
        cross = cross.mean(dim=1)  # (2, H, N, N) -> (2, N, N), the mean over heads
    read = cross.mean(dim=1)  # (2, N): row 0 = image 2's cells read by stream 1, row 1 = image 1's by stream 2
    return {
        "heat": [r_img[k].view(side, side).cpu() for k in range(2)],
        "words": [[model.tokenizer.decode([i]) or "?" for i in text[k][words[k]].tolist()] for k in range(2)],
        "relevance": [r_txt[k][words[k]].tolist() for k in range(2)],
        "coattention": [read[1].view(side, side).cpu(), read[0].view(side, side).cpu()],
    }


def _normalised(values: list[float]) -> list[float]:
    lo, hi = min(values, default=0.0), max(values, default=1.0)
    return [(v - lo) / (hi - lo) if hi > lo else 0.5 for v in values]


def plot_pair(maps: dict[str, Any], images: list[torch.Tensor], path: str | Path, title: str = "") -> Path:
    """Draw one pair: images with the relevance heat map, word bars, and co-attention maps; save a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(10, 11), height_ratios=[3, 2, 3], dpi=110)
    for k in range(2):
        img = images[k].permute(1, 2, 0).cpu().numpy()  # (3, H, W) -> (H, W, 3)
        H, W = img.shape[:2]
        for row, key, label in ((0, "heat", "NIM relevance R_I"), (2, "coattention", "MIR co-attention")):
            ax = axes[row, k]
            ax.imshow(img)
            im = ax.imshow(
                maps[key][k].numpy(),
                cmap="coolwarm_r" if key == "heat" else "viridis",
                alpha=0.5,
                extent=(0, W, H, 0),
                interpolation="nearest",
            )
            ax.set_title(f"image {k + 1}: {label}", fontsize=9)
            ax.axis("off")
            fig.colorbar(im, ax=ax, shrink=0.7)
        ax = axes[1, k]
        words, rel = maps["words"][k], _normalised(maps["relevance"][k])
        ax.barh(range(len(words)), rel, color=["C3" if r < 0.5 else "C0" for r in rel])
        ax.set_yticks(range(len(words)), words, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel("normalised word relevance (red: below 0.5, noise candidates)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9, wrap=True)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
