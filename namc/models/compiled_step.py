"""``torch.compile`` of FDG's eval-mode decoding step (:meth:`FDG.compile_step <namc.models.fdg.FDG.compile_step>`).

By default the step's weights are *frozen* into the compiled code: they are buffers of a small module
(:class:`FrozenStep`) compiled under inductor's ``freezing``, which treats a compiled module's parameters and buffers
as constants. On a CPU inductor then lays every matrix out once for oneDNN and fuses each residual addition into its
product; with the weights as inputs of the graph every product is a plain BLAS call, slower than eager decoding's
oneDNN kernel from 8 rows up. namc_base's decoding, compiled against eager (23 tokens, two AMD EPYC threads, one
process alternating the three, two runs; the same ids throughout; docs/throughput.md, session 24):

==================  ===========  ===========  ===========  ===========  ===========  ===========
compiled step       fp32, b 1    fp32, b 32   bf16, b 1    bf16, b 32   int8, b 1    int8, b 32
==================  ===========  ===========  ===========  ===========  ===========  ===========
weights frozen      1.38-1.52x   1.14-1.15x   0.97-1.02x   1.02-1.05x   0.72-0.79x   0.83-0.84x
weights as inputs   1.01x        0.68-0.69x   1.00x        0.86-0.87x   0.85-0.91x   0.85x
==================  ===========  ===========  ===========  ===========  ===========  ===========

Compiling is worth it in fp32 only. The compiler cannot trace int8's packed dynamic layers, so each one breaks the
graph (made opaque ops instead, the whole graph decoded only 1.00-1.04x faster than eager; docs/throughput.md,
session 25), and eager int8 stays the fastest decoding. Frozen weights are copies laid out at compile time
(namc_base's fp32 step at batch 1 raised the process's peak memory by about 500 MB), so :class:`CompiledStep`
fingerprints FDG's parameters before every generation and compiles again when one of them was replaced or changed in
place (an optimiser step, ``load_state_dict``, ``.to()``) or :meth:`~namc.models.fdg.FDG.pack_step` ran again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch import nn

from namc.models.precision import _fingerprint

__all__ = ["CompiledStep", "FrozenStep"]


class FrozenStep(nn.Module):
    """FDG's eval step with its matrices (``weights``: per layer, as :meth:`FDG._start
    <namc.models.fdg.FDG._start>` gives them to a compiled step) held as this module's buffers, an int8 copy's packed
    layers as submodules, so that a compiled copy sees them as constants; FDG is a submodule for its embeddings,
    positions and LayerNorms.

    Call it as FDG's step without the weights: ``(tokens, position, caches, cross_kv, memory_mask) -> logits``.
    """

    def __init__(self, fdg: nn.Module, weights: list) -> None:
        super().__init__()
        self.fdg = fdg
        self._layout = type(weights[0])  # fdg._StepWeights
        for i, w in enumerate(weights):
            for name in self._layout.NAMES:
                entry, key = getattr(w, name), f"{name}_{i}"
                if isinstance(entry[0], nn.Module):  # a packed int8 layer
                    self.add_module(key, entry[0])
                else:
                    self.register_buffer(key, entry[0].detach(), persistent=False)
                    bias = None if entry[1] is None else entry[1].detach()
                    self.register_buffer(f"{key}_bias", bias, persistent=False)

    def step_weights(self) -> list:
        """The weights in FDG's per-layer layout, read from this module's buffers and submodules."""
        out = []
        for i in range(len(self.fdg.blocks)):
            entries = {}
            for name in self._layout.NAMES:
                value = getattr(self, f"{name}_{i}")
                entries[name] = (value,) if isinstance(value, nn.Module) else (value, getattr(self, f"{name}_{i}_bias"))
            out.append(self._layout(**entries))
        return out

    def forward(
        self,
        tokens: torch.Tensor,
        position: int,
        caches: list,
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        memory_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        return self.fdg._fused_step(tokens, position, caches, cross_kv, memory_mask, self.step_weights())


class CompiledStep:
    """The compiled step of one FDG: ``torch.compile(**options)`` of :class:`FrozenStep` (``freeze``) or of FDG's
    eager step with the weights as inputs."""

    def __init__(self, fdg: nn.Module, freeze: bool = True, options: dict[str, Any] | None = None) -> None:
        self.fdg, self.freeze = fdg, freeze
        self.options = {"dynamic": True} | (options or {})
        self._compiled: Callable[..., torch.Tensor] | None = None
        self._key: tuple | None = None

    def for_generation(self, fused: list) -> Callable[..., torch.Tensor]:
        """The step for the next generation, with FDG's step signature ``(tokens, position, caches, cross_kv,
        memory_mask, fused) -> logits``; ``fused``: the generation's step weights, which a frozen step holds (and
        then ignores in its calls), compiled again when they went stale. Compilation itself happens at the first
        call (5-15 s on a CPU)."""
        if not self.freeze:
            if self._compiled is None:
                self._compiled = torch.compile(self.fdg._fused_step, **self.options)
            return self._compiled
        # pack_step replaces the matrices; a shortlist (namc.models.shortlist) replaces the vocabulary's
        key = _fingerprint(self.fdg) + (id(getattr(self.fdg, "_packed_step", None)), id(fused[-1].vocab[0]))
        if key != self._key:
            self._compiled = torch.compile(FrozenStep(self.fdg, fused), **self.options)
            self._key = key
        return self._frozen

    def _frozen(self, tokens, position, caches, cross_kv, memory_mask, fused) -> torch.Tensor:
        # freezing is read when inductor compiles, which happens lazily in any call (a recompilation too)
        with inductor_config.patch(freezing=True):
            return self._compiled(tokens, position, caches, cross_kv, memory_mask)
