"""An fp32 decoding step's large matrices reordered once into oneDNN's blocked layout.

:func:`~namc.models.onednn.dense` runs an fp32 matrix of :data:`~namc.models.onednn.MIN_WEIGHT` entries or more on
oneDNN's kernel (namc_base's fused q/k/v, feed-forward and 49,409 x 768 vocabulary matrices), smaller ones on
``F.linear``. Given a plain weight, oneDNN computes from it as it lies in memory; reordered once
(``torch.ops.mkldnn._reorder_linear_weight``, what inductor does to a compiled step's frozen weights), the
vocabulary projection runs faster from 2 rows up and the layer matrices from about 4, both a little slower at 1, and
from 4 rows the reordered kernel also beats ``F.linear`` on namc_base's 768 x 768 matrices (docs/performance.md).

So an eval-mode FDG in fp32 on a CPU decodes a batch of :data:`MIN_ROWS` rows or more on reordered copies of its
matrices of :data:`MIN_WEIGHT` entries or more (:data:`~namc.thresholds.REORDER_MIN_ROWS`,
:data:`~namc.thresholds.REORDER_MIN_WEIGHT`), made at its first such generation and kept (:class:`PackedStep`, in
FDG's ``__dict__``) until one of FDG's parameters is replaced or changed in place
(:func:`~namc.models.precision._fingerprint`, as the inference copies are rebuilt): namc_base's take 228 MB (its
inference weights 474 MB) and 92 ms to make. Training steps, other devices, bf16 and int8 copies (:meth:`FDG.pack_step
<namc.models.fdg.FDG.pack_step>` lays those out) and compiled graphs (which lay out their own) are unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from namc.models import onednn
from namc.models.layers import StepWeights
from namc.models.precision import _fingerprint
from namc.thresholds import REORDER_MIN_ROWS as MIN_ROWS  # read at each call, as MIN_WEIGHT is
from namc.thresholds import REORDER_MIN_WEIGHT as MIN_WEIGHT

__all__ = ["MIN_ROWS", "MIN_WEIGHT", "PackedStep", "fp32_step_weights", "reorders"]


def fp32_step_weights(fdg: nn.Module, rows: int) -> list[StepWeights]:
    """FDG's eval step weights (per layer) from its live parameters for a generation of ``rows`` rows: as they are,
    or, where :func:`reorders` says so, the kept reordered copies (built or rebuilt here)."""
    key = _fingerprint(fdg) if rows >= MIN_ROWS else None
    packed = fdg.__dict__.get("_packed_fp32")
    if key is not None and packed is not None and packed.key == key:
        return packed.weights
    plain = [StepWeights.of(block, fdg._vocab()) for block in fdg.blocks]
    if key is None or not any(reorders(getattr(w, n)[0]) for w in plain for n in StepWeights.NAMES):
        return plain
    fdg.__dict__["_packed_fp32"] = None  # the stale copies go before the new ones are made
    fdg.__dict__["_packed_fp32"] = packed = PackedStep(key, plain)
    return packed.weights


def reorders(weight: torch.Tensor) -> bool:
    """Whether a plain step matrix runs reordered: an fp32 CPU matrix of :data:`MIN_WEIGHT` entries or more, on
    oneDNN's kernel (:func:`~namc.models.onednn.fp32_kernel`)."""
    return onednn.fp32_kernel(weight, MIN_WEIGHT)


class PackedStep:
    """One FDG's step weights with its large fp32 matrices reordered (:func:`reorders`), and ``key``, the fingerprint
    of the parameters they came from. A deep copy (an inference copy of the model) has none: oneDNN's opaque
    tensors cannot be copied."""

    __slots__ = ("key", "weights")

    def __init__(self, key: tuple | None = None, plain: list[StepWeights] = ()) -> None:
        self.key, self.weights = key, StepWeights.each_matrix(list(plain), _reordered)

    def __deepcopy__(self, memo: dict) -> PackedStep:
        return PackedStep()


def _reordered(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    return (onednn.pack_linear(weight.detach()) if reorders(weight) else weight, bias)
