"""An fp32 decoding step's large matrices reordered once into oneDNN's blocked layout.

:func:`~namc.models.onednn.dense` runs an fp32 matrix of :data:`~namc.models.onednn.MIN_WEIGHT` entries or more on
oneDNN's kernel (namc_base's fused q/k/v, feed-forward and 49,409 x 768 vocabulary matrices). Given a plain weight,
oneDNN computes from it as it lies in memory; reordered once (``torch.ops.mkldnn._reorder_linear_weight``, what
inductor does to a compiled step's frozen weights), the same products run faster from 2 rows up and a little
slower at 1. One ``mkldnn._linear_pointwise`` call, plain / reordered, us, two AMD EPYC threads,
``OMP_WAIT_POLICY=PASSIVE``, medians of 60-300 calls alternating (session 37): 49,409 x 768 at 1 / 8 / 32 rows 7643
/ 7484, 12129 / 9140, 19780 / 15598; 2304 x 768 267 / 333, 470 / 479, 1187 / 998; 768 x 3072 633 / 663, 846 / 755,
1429 / 1248. namc_base's fp32 decoding (23 tokens, one process alternating, the same ids): 0.91x at batch 1, 1.17x
at 2, 1.19x at 4, 1.31x at 6, 1.20x at 8, 1.19x at 32.

So an eval-mode FDG in fp32 on a CPU decodes a batch of :data:`MIN_ROWS` rows or more on reordered copies of those
matrices, made at its first such generation and kept (:class:`PackedStep`, in FDG's ``__dict__``) until one of
FDG's parameters is replaced or changed in place (:func:`~namc.models.precision._fingerprint`, as the inference
copies are rebuilt): namc_base's hold 204 MB (its fp32 weights 422 MB), made in about 0.1 s. Training steps, other
devices, bf16 and int8 copies (:meth:`FDG.pack_step <namc.models.fdg.FDG.pack_step>` lays those out) and
compiled graphs (which lay out their own) are unchanged.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from namc.models import onednn
from namc.models.layers import StepWeights
from namc.models.precision import _fingerprint

__all__ = ["MIN_ROWS", "PackedStep", "fp32_step_weights"]

MIN_ROWS = 2  # a generation of this many rows or more decodes on the reordered matrices (read at each call)


def fp32_step_weights(fdg: nn.Module, rows: int) -> list[StepWeights]:
    """FDG's eval step weights (per layer) from its live parameters for a generation of ``rows`` rows: as they are,
    or, where :func:`reorders` says so, the kept reordered copies (built or rebuilt here)."""
    plain = [StepWeights.of(block, fdg._vocab()) for block in fdg.blocks]
    if rows < MIN_ROWS or not any(reorders(getattr(w, n)[0]) for w in plain for n in StepWeights.NAMES):
        return plain
    packed = fdg.__dict__.get("_packed_fp32")
    if packed is None:
        packed = fdg.__dict__["_packed_fp32"] = PackedStep()
    return packed.weights(fdg, plain)


def reorders(weight: torch.Tensor | nn.Module) -> bool:
    """Whether a step matrix runs reordered: an fp32 CPU matrix that :func:`~namc.models.onednn.dense` gives to
    oneDNN's kernel, outside a graph being compiled."""
    return (
        isinstance(weight, torch.Tensor)
        and not weight.is_mkldnn
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.numel() >= onednn.MIN_WEIGHT
        and torch.backends.mkldnn.enabled
        and not torch.compiler.is_compiling()
        and onednn.linear_available()
    )


class PackedStep:
    """One FDG's reordered step matrices and the fingerprint of the parameters they came from. A deep copy (an
    inference copy of the model) starts empty: oneDNN's opaque tensors cannot be copied."""

    __slots__ = ("_key", "_weights")

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._weights: list[StepWeights] = []

    def __deepcopy__(self, memo: dict) -> PackedStep:
        return PackedStep()

    def weights(self, fdg: nn.Module, plain: list[StepWeights]) -> list[StepWeights]:
        key = _fingerprint(fdg)
        if key != self._key:
            self._key, self._weights = None, []  # the stale copies go before the new ones are made
            done: dict[int, tuple] = {}  # the vocabulary matrix is shared by the layers: reorder it once
            for w in plain:
                for name in StepWeights.NAMES:
                    weight, bias = getattr(w, name)
                    if id(weight) not in done:
                        form = onednn.pack_linear(weight.detach()) if reorders(weight) else weight
                        done[id(weight)] = (form, bias)
                self._weights.append(dataclasses.replace(w, **{n: done[id(getattr(w, n)[0])] for n in w.NAMES}))
            self._key = key
        return self._weights
