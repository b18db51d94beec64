"""The grid encoder's inference forms on a CPU: BatchNorm folded, oneDNN's fused convolutions, static int8.

Each changes a frozen :class:`~namc.models.grid.GridEncoder` in place and is applied to an inference copy
(:mod:`namc.backends.precision`), never to a model you train or save.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from namc.backends.onednn import fuse_resnet
from namc.backends.qconv import calibrate_resnet, quantize_resnet
from namc.models.grid import GridEncoder

__all__ = ["fold_batchnorm", "fuse_grid", "grid_int8_peaks", "quantize_grid"]


def fold_batchnorm(grid: GridEncoder) -> int:
    """Fold every BatchNorm into the convolution that feeds it, for inference with a frozen encoder.

    A frozen encoder's BatchNorm uses fixed running statistics, so ``bn(conv(x))`` is one convolution with the
    weights ``w * g / sqrt(var + eps)`` and bias ``b' = (b - mean) * g / sqrt(var + eps) + beta``: the separate
    normalisation pass (about 9% of namc_base's end-to-end time on a CPU) disappears. Pairs are a ``Conv2d``
    child registered immediately before a ``BatchNorm2d`` child of the same module (timm's ResNet stem,
    ``convN``/``bnN`` of every block, the ``downsample`` sequence); the BatchNorm becomes ``nn.Identity``. The
    result equals the unfolded encoder up to float rounding (tests/test_precision.py); the weights stay
    channels-last. Changes this module in place: fold an inference copy (:mod:`namc.backends.precision`), not a
    model you will save (its state dict loses the ``bn*`` keys).

    Returns:
        how many BatchNorm layers were folded.

    Raises:
        ValueError: the encoder is trainable (its statistics would still change).
    """
    if not grid.frozen:
        raise ValueError("fold_batchnorm needs a frozen grid encoder (BatchNorm statistics must be fixed)")
    folded = 0
    for module in list(grid.backbone.modules()):
        children = list(module.named_children())
        for (name, conv), (bn_name, bn) in zip(children, children[1:]):
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d) and bn.track_running_stats:
                setattr(module, name, fuse_conv_bn_eval(conv.eval(), bn.eval()))
                setattr(module, bn_name, nn.Identity())
                folded += 1
    grid.backbone.to(memory_format=torch.channels_last)
    return folded


def fuse_grid(grid: GridEncoder) -> int:
    """Run the folded backbone's convolutions with their ReLUs and residual additions fused into single oneDNN
    calls, in the convolutions' current dtype (:func:`namc.backends.onednn.fuse_resnet`). Call it after
    :func:`fold_batchnorm` (and after casting the convolutions) on an inference copy: the fused encoder cannot
    be trained, saved or copied.

    Returns:
        how many convolutions run fused (0 where this torch build lacks the kernels).
    """
    if any(isinstance(m, nn.BatchNorm2d) for m in grid.backbone.modules()):
        raise ValueError("fuse_grid needs a folded encoder: call fold_batchnorm first")
    return fuse_resnet(grid.backbone)


def grid_int8_peaks(grid: GridEncoder, batches: Iterable[torch.Tensor]) -> list[list[float]]:
    """Calibrate a static int8 grid: the largest activation of every block (input, each inner convolution,
    output; :func:`namc.backends.qconv.calibrate_resnet`) over ``batches`` of (B, 3, H, W) images in [0, 1], seen
    by a folded, fused fp32 copy of this frozen encoder (the one :func:`quantize_grid` quantises)."""
    twin = copy.deepcopy(grid).eval()
    fold_batchnorm(twin)
    if not fuse_grid(twin):
        raise RuntimeError("static int8 needs oneDNN's fused convolutions, which this torch build lacks")

    def normalized(images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"calibration images must be (B, 3, H, W), got {tuple(images.shape)}")
        return twin.normalize(images.float())

    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        return calibrate_resnet(twin.backbone, (normalized(images) for images in batches))


def quantize_grid(grid: GridEncoder, peaks: list[list[float]], ceiling: int | None = None) -> int:
    """Run the blocks of this folded, fused fp32 encoder in static int8 (:func:`namc.backends.qconv.quantize_resnet`)
    with activation scales from :func:`grid_int8_peaks`, and the stem and its max-pool with the pixels' scale from
    the normalisation (:class:`namc.backends.qconv.QuantStem`). Inference only, like :func:`fuse_grid`.
    ``ceiling``: the largest activation code (:func:`namc.backends.qconv.code_ceiling`: 255 with VNNI, else 127).

    Returns:
        how many convolutions now run in int8 (0 where this torch build lacks the kernels).
    """
    lowest, highest = (0 - grid.mean) / grid.std, (1 - grid.mean) / grid.std  # normalised pixels of [0, 1]
    pixel_peak = float(torch.maximum(lowest.abs(), highest.abs()).max())
    return quantize_resnet(grid.backbone, peaks, pixel_peak, ceiling)
