"""Distribution shifts for the robustness study (paper appendix A.3, Table 10): image corruptions at a severity of
Hendrycks and Dietterich (2019, "Benchmarking Neural Network Robustness to Common Corruptions and Perturbations",
ICLR; ImageNet-C) and caption word replacement at a rate.

The two corruptions follow the published definitions of ImageNet-C (``make_imagenet_c.py``), as packaged in
``imagecorruptions`` 1.1.2 (Michaelis et al. 2019), which generalises them to any image size (the fog map is the
next power of two above the longer side, cropped). That package does not run here: it imports ``pkg_resources``
(gone from current setuptools), needs OpenCV for every corruption, and its fog allocates with ``np.float_``
(removed in NumPy 2). So the two are implemented below from the same definitions:

- Gaussian noise: ``x / 255 + N(0, c^2)`` clipped to [0, 1], ``c = [.08, .12, .18, .26, .38][severity - 1]``.
- Fog: ``(x + c0 * plasma) * max(x) / (max(x) + c0)`` clipped, ``(c0, decay) = [(1.5, 2), (2, 2), (2.5, 1.7),
  (2.5, 1.5), (3, 1.4)][severity - 1]``, ``plasma`` a diamond-square height map in [0, 1].

Randomness comes from an explicit ``numpy.random.Generator``, so a corrupted dataset is a pure function of its seed
and the item's id (the same corrupted image every epoch, as a fixed corrupted test set would be).

Dimension letters: H, W image height and width.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = [
    "CORRUPTIONS",
    "CaptionNoiseView",
    "CorruptedView",
    "corrupt",
    "fog",
    "gaussian_noise",
    "plasma_fractal",
    "replace_words",
]

# ImageNet-C's parameters per severity 1..5 (make_imagenet_c.py)
_GAUSSIAN_SIGMA = (0.08, 0.12, 0.18, 0.26, 0.38)
_FOG = ((1.5, 2.0), (2.0, 2.0), (2.5, 1.7), (2.5, 1.5), (3.0, 1.4))


def _check_severity(severity: int) -> int:
    if not 1 <= int(severity) <= 5:
        raise ValueError(f"corruption severity must be 1..5 (Hendrycks and Dietterich 2019), got {severity}")
    return int(severity)


def gaussian_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """ImageNet-C Gaussian noise: ``clip(x + N(0, c^2), 0, 1)``.

    Args:
        x: (H, W, 3) float image in [0, 1].
        severity: 1..5.
        rng: the noise's generator.

    Returns:
        (H, W, 3) float64 in [0, 1].
    """
    c = _GAUSSIAN_SIGMA[_check_severity(severity) - 1]
    return np.clip(x + rng.normal(size=x.shape, scale=c), 0.0, 1.0)


def plasma_fractal(mapsize: int, wibbledecay: float, rng: np.random.Generator) -> np.ndarray:
    """A (mapsize, mapsize) diamond-square height map scaled to [0, 1] (ImageNet-C's ``plasma_fractal``).

    Args:
        mapsize: a power of two.
        wibbledecay: how fast the random displacement shrinks per level (larger: smoother fog).
        rng: the displacements' generator.
    """
    if mapsize < 2 or mapsize & (mapsize - 1):
        raise ValueError(f"mapsize must be a power of two >= 2, got {mapsize}")
    grid = np.zeros((mapsize, mapsize), dtype=np.float64)
    step, wibble = mapsize, 100.0

    def wibbled_mean(a: np.ndarray) -> np.ndarray:
        return a / 4 + wibble * rng.uniform(-wibble, wibble, a.shape)

    while step >= 2:
        half = step // 2
        # squares: the centre of every square of corners `step` apart
        corners = grid[0:mapsize:step, 0:mapsize:step]
        acc = corners + np.roll(corners, shift=-1, axis=0)
        acc = acc + np.roll(acc, shift=-1, axis=1)
        grid[half:mapsize:step, half:mapsize:step] = wibbled_mean(acc)
        # diamonds: the edge midpoints, from the two centres and the two corners around each
        centres = grid[half:mapsize:step, half:mapsize:step]
        corners = grid[0:mapsize:step, 0:mapsize:step]
        left = centres + np.roll(centres, 1, axis=0) + corners + np.roll(corners, -1, axis=1)
        grid[0:mapsize:step, half:mapsize:step] = wibbled_mean(left)
        top = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=0)
        grid[half:mapsize:step, 0:mapsize:step] = wibbled_mean(top)
        step //= 2
        wibble /= wibbledecay
    grid -= grid.min()
    return grid / max(grid.max(), 1e-12)


def fog(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """ImageNet-C fog: a plasma height map added to the image, then the contrast rescaled.

    Args:
        x: (H, W, 3) float image in [0, 1].
        severity: 1..5.
        rng: the height map's generator.

    Returns:
        (H, W, 3) float64 in [0, 1].
    """
    c0, decay = _FOG[_check_severity(severity) - 1]
    H, W = x.shape[:2]
    mapsize = 1 << (max(H, W) - 1).bit_length()  # the next power of two (imagecorruptions' generalisation)
    max_val = float(x.max())
    out = x + c0 * plasma_fractal(mapsize, decay, rng)[:H, :W, None]  # (H, W, 3)
    return np.clip(out * max_val / (max_val + c0), 0.0, 1.0)


CORRUPTIONS: dict[str, Callable[[np.ndarray, int, np.random.Generator], np.ndarray]] = {
    "gaussian_noise": gaussian_noise,
    "fog": fog,
}


def _seed_of(*parts: Any) -> int:
    """A stable 64-bit seed from any printable parts (independent of PYTHONHASHSEED)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "little")


def corrupt(image: torch.Tensor, name: str, severity: int = 5, seed: int | str = 0) -> torch.Tensor:
    """Corrupt a (3, H, W) image tensor in [0, 1] with ``CORRUPTIONS[name]``; the result is quantised to 8 bits, as
    ImageNet-C's saved images are, and returned in the input's dtype.

    Args:
        image: (3, H, W) in [0, 1].
        name: ``gaussian_noise`` or ``fog``.
        severity: 1..5 (Table 10: 5).
        seed: seeds the corruption (e.g. ``"<dataset seed>-<item id>-1"``).
    """
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; choose from {sorted(CORRUPTIONS)}")
    if image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"expected a (3, H, W) image, got {tuple(image.shape)}")
    x = image.detach().cpu().permute(1, 2, 0).double().numpy()  # (3, H, W) -> (H, W, 3)
    y = CORRUPTIONS[name](x, severity, np.random.default_rng(_seed_of(name, severity, seed)))
    y = np.round(y * 255.0) / 255.0
    return torch.from_numpy(y).permute(2, 0, 1).to(image.dtype).contiguous()  # (H, W, 3) -> (3, H, W)


def replace_words(caption: str, rate: float, vocabulary: Sequence[str], rng: random.Random) -> str:
    """Replace ``round(rate * n)`` of a caption's n words, chosen at random, by other words of ``vocabulary``
    (Table 10's "replacing 20/40/60/80% word"; the paper does not say how the substitutes are drawn: here uniformly
    from the training captions' vocabulary, never the word itself)."""
    words = caption.split()
    k = min(len(words), round(rate * len(words)))
    if k == 0 or len(vocabulary) < 2:
        return caption
    for i in rng.sample(range(len(words)), k):
        new = words[i]
        while new == words[i]:
            new = vocabulary[rng.randrange(len(vocabulary))]
        words[i] = new
    return " ".join(words)


class _View(Dataset):
    """A wrapped split: its length, and every other attribute (entries, issues, change_types) read through."""

    dataset: Dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)


class CorruptedView(_View):
    """A benchmark split whose two images are corrupted (seeded per item id and image slot).

    Args:
        dataset: items with ``id``, ``image1``, ``image2`` ((3, H, W) in [0, 1]); ``None`` items pass through.
        name: a key of :data:`CORRUPTIONS`.
        severity: 1..5.
        seed: the view's seed.
    """

    def __init__(self, dataset: Dataset, name: str, severity: int = 5, seed: int = 0) -> None:
        if name not in CORRUPTIONS:
            raise ValueError(f"unknown corruption {name!r}; choose from {sorted(CORRUPTIONS)}")
        _check_severity(severity)
        self.dataset, self.name, self.severity, self.seed = dataset, name, severity, seed

    def __getitem__(self, index: int) -> dict[str, Any] | None:
        item = self.dataset[index]
        if item is None:
            return None
        out = dict(item)
        for slot in ("1", "2"):
            out["image" + slot] = corrupt(
                item["image" + slot], self.name, self.severity, f"{self.seed}-{item['id']}-{slot}"
            )
        return out


class CaptionNoiseView(_View):
    """A training split whose captions have ``rate`` of their words replaced (seeded per item id and caption).

    Args:
        dataset: items with ``id`` and ``captions``; ``None`` items pass through.
        rate: the fraction of words replaced, in [0, 1].
        vocabulary: the substitutes (the clean training captions' words).
        seed: the view's seed.
    """

    def __init__(self, dataset: Dataset, rate: float, vocabulary: Sequence[str], seed: int = 0) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"caption noise rate must be in [0, 1], got {rate}")
        self.dataset, self.rate, self.seed = dataset, float(rate), seed
        self.vocabulary = sorted(set(vocabulary))

    def __getitem__(self, index: int) -> dict[str, Any] | None:
        item = self.dataset[index]
        if item is None:
            return None
        noisy = [
            replace_words(c, self.rate, self.vocabulary, random.Random(_seed_of("words", self.seed, item["id"], j)))
            for j, c in enumerate(item["captions"])
        ]
        return {**item, "captions": noisy}
