"""``torch.compile`` of FDG's eval-mode decoding step (:meth:`FusedFDG.compile_step`).

By default the step's weights are *frozen* into the compiled code: they are buffers of a small module
(:class:`FrozenStep`) compiled under inductor's ``freezing``, which treats a compiled module's parameters and buffers
as constants. On a CPU inductor then lays every matrix out once for oneDNN and fuses each residual addition into its
product; with the weights as inputs of the graph every product is a plain BLAS call, slower than eager decoding's
oneDNN kernel from 8 rows up. Eager decoding reorders its matrices for oneDNN too (:mod:`namc.backends.step`)
and runs its small products on one thread (:mod:`namc.backends.threads`), so the compiled step decodes at about eager's
speed on a CPU (docs/performance.md).

fp32's ids are eager's to the bit; bf16's fused kernels round differently, so on random weights, whose runners-up
are close, some tokens at batch 8 and 32 differ. An int8 copy's step is refused (``ValueError``): the compiler cannot
trace its packed int8 layers, so each one breaks the graph and the step decodes slower than eager; on the plain
kernels (:func:`namc.backends.qlinear.int8_kernels`) dynamo fails, and made opaque ops the whole graph gains nothing
measurable. Eager int8 is the fastest decoding.

Frozen weights are copies laid out at compile time (about 500 MB more peak memory for namc_base's fp32 step), so
:class:`CompiledStep` fingerprints FDG's parameters before every generation and compiles again when one of them was
replaced or changed in place (an optimiser step, ``load_state_dict``, ``.to()``) or
:meth:`~namc.backends.step.FusedFDG.pack_step` ran again.

A step compiles four graphs at most: batch 1 and any larger batch (``dynamic=True`` specialises sizes 0 and 1), each
for the first token (an empty cache) and the rest. Nothing in the step tests a size while it is traced (the thread
and kernel choices by size in :mod:`namc.backends.threads` and :mod:`namc.models.layers` stand aside under
``torch.compiler.is_compiling()``): each such test would guard the graph to one side of it (odd batch sizes, more
than 32 rows of a 512-wide FFN), so that a process captioning batches of many sizes would compile again and again.
Dynamo keeps compiled graphs, and counts them against ``torch._dynamo.config.recompile_limit`` (8), per code object,
dead ones included; so each :class:`FrozenStep` has a ``forward`` of its own, or the third version of the weights
would run its step eagerly for the rest of the process (unfrozen steps share ``FusedFDG._fused_step`` and its graphs:
their weights are inputs).
"""

from __future__ import annotations

import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch import nn
from torch._inductor.codecache import PyCodeCache

from namc.backends.versions import fingerprint as _fingerprint

__all__ = ["CompiledStep", "FrozenStep", "int8_layers"]

INT8_REFUSED = (
    "an int8 copy's decoding step does not compile: torch.compile cannot trace its {n} int8 layers (each breaks the "
    "graph, and the step compiled around them decodes slower than eager); decode it eagerly, its fastest form, or "
    "compile an fp32 or bf16 copy"
)


def int8_layers(weights: list) -> int:
    """How many of a decoding step's matrices (FDG's per-layer layout, shared ones once) are an int8 copy's packed
    layers (:func:`namc.backends.qlinear.int8_linear`)."""
    return len({id(m) for w in weights for name in type(w).NAMES if isinstance(m := getattr(w, name)[0], nn.Module)})


class FrozenStep(nn.Module):
    """FDG's eval step with its matrices (``weights``: per layer, as :meth:`FusedFDG._start` gives them to a compiled
    step) held as this module's buffers, so that a compiled copy sees them as constants; FDG is a submodule for its
    embeddings, positions and LayerNorms.

    Call it as FDG's step without the weights: ``(tokens, position, caches, cross_kv, memory_mask) -> logits``.
    """

    def __init__(self, fdg: nn.Module, weights: list) -> None:
        super().__init__()
        # a code object of its own: dynamo's graphs and recompile limit are per code object (module docstring)
        plain = FrozenStep.forward
        self.forward = types.MethodType(
            types.FunctionType(plain.__code__.replace(), plain.__globals__, plain.__name__, plain.__defaults__), self
        )
        self.fdg = fdg
        self._layout = type(weights[0])  # fdg._StepWeights
        for i, w in enumerate(weights):
            for name in self._layout.NAMES:
                weight, bias = getattr(w, name)
                self.register_buffer(f"{name}_{i}", weight.detach(), persistent=False)
                self.register_buffer(f"{name}_{i}_bias", None if bias is None else bias.detach(), persistent=False)

    def step_weights(self) -> list:
        """The weights in FDG's per-layer layout, read from this module's buffers."""
        return [
            self._layout(
                **{
                    name: (getattr(self, f"{name}_{i}"), getattr(self, f"{name}_{i}_bias"))
                    for name in self._layout.NAMES
                }
            )
            for i in range(len(self.fdg.blocks))
        ]

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
        _refuse_int8(fdg.step_weights())
        self.fdg, self.freeze = fdg, freeze
        self.options = {"dynamic": True} | (options or {})
        self._compiled: Callable[..., torch.Tensor] | None = None
        self._key: tuple | None = None
        self._modules: list = []  # inductor's modules of the frozen graphs of these weights (_frozen)
        weakref.finalize(self, _release, self._modules)

    def for_generation(self, fused: list) -> Callable[..., torch.Tensor]:
        """The step for the next generation, with FDG's step signature ``(tokens, position, caches, cross_kv,
        memory_mask, fused) -> logits``; ``fused``: the generation's step weights, which a frozen step holds (and
        then ignores in its calls), compiled again when they went stale. Compilation itself happens at the first
        call (5-15 s on a CPU). An int8 copy's step (``pack_step("int8")`` after :meth:`FusedFDG.compile_step`)
        raises ``ValueError``, as ``compile_step`` does on one."""
        _refuse_int8(fused)
        if not self.freeze:
            if self._compiled is None:
                self._compiled = torch.compile(self.fdg._fused_step, **self.options)  # one graph for every FDG alike
            return self._compiled
        # pack_step replaces the matrices; a shortlist (namc.models.shortlist) replaces the vocabulary's
        key = _fingerprint(self.fdg) + (id(getattr(self.fdg, "_packed_step", None)), id(fused[-1].vocab[0]))
        if key != self._key:
            _release(self._modules)
            self._compiled = torch.compile(FrozenStep(self.fdg, fused), **self.options)
            self._key = key
        return self._frozen

    def _frozen(self, tokens, position, caches, cross_kv, memory_mask, fused) -> torch.Tensor:
        loaded = len(PyCodeCache.modules)
        # freezing is read when inductor compiles, which happens lazily in any call (a recompilation too)
        with inductor_config.patch(freezing=True):
            logits = self._compiled(tokens, position, caches, cross_kv, memory_mask)
        self._modules.extend(PyCodeCache.modules[loaded:])  # what this call compiled, if anything
        return logits


def _release(modules: list) -> None:
    """Take a compiled step's graphs out of inductor's module cache, then forget them. A frozen graph's module holds
    its constants (copies of the weights, laid out), and inductor keeps every module it loaded with constants for the
    rest of the process: without this, each version of the weights a step compiled for stayed in memory (namc_base's
    fp32 step at batch 2, two graphs: the process grew by 470-481 MB a version; with it by 146-148 MB, then 31-35 and
    20, resident after ``gc.collect()``). The cache only lends modules to new compilations; a graph keeps its own."""
    if modules:
        own = {id(m) for m in modules}
        PyCodeCache.modules[:] = [m for m in PyCodeCache.modules if id(m) not in own]
        for m in modules:  # inductor registers each module it loads in sys.modules too
            if sys.modules.get(m.__name__) is m:
                del sys.modules[m.__name__]
        modules.clear()


def _refuse_int8(weights: list) -> None:
    if n := int8_layers(weights):
        raise ValueError(INT8_REFUSED.format(n=n))
