"""Greedy decoding in fixed-shape steps: a static KV cache, and on CUDA one CUDA graph replayed per step.

Dimension letters: B batch, N memory positions, D width, V vocabulary, H heads, E head width, L new tokens.

:meth:`FDG.generate <namc.models.fdg.FDG.generate>` lets its shapes change as it goes: the self-attention cache
returns the t positions written so far, finished rows leave the batch, and the host reads the finished flags at
every step. That suits a CPU. On a GPU a small decoder's step is a few dozen short kernels, and launching them
costs more than running them at moderate batch sizes; a CUDA graph launches a recorded sequence of kernels at once,
but only on the same buffers with the same shapes. :class:`StaticDecoder` keeps everything one greedy generation
touches in buffers allocated once per (batch, memory length, dtype, memory mask or not):

- each layer's self-attention keys and values for all L positions (:class:`StaticKVCache`), attended in full at
  every step under a mask of the positions written so far (the slots ahead get exactly zero weight);
- the position, a one-element tensor the step advances itself, and the tokens, finished flags and output ids,
  all written in place by the step, so the host has nothing to feed it between steps;
- the cross-attention keys and values of the memory, written once per call by the ordinary prefill
  (:meth:`FDG.cross_kv <namc.models.fdg.FDG.cross_kv>`).

Finished rows stay in the batch and produce padding; the host looks at the finished flags every ``check_every``
steps (one synchronisation each) to stop early, never when [EOS] cannot occur. The step's layers are FDG's own eval
path (:meth:`FusedFDG._fused_layers`, the same matrices: fp32, a bf16 or int8 copy of
:mod:`namc.backends.precision`, or a model converted with ``.to(torch.bfloat16)``), so the ids are FDG.generate's up
to the rounding of attention over more (masked) slots, and equal where no near-tie flips (tests/test_static_decode.py).

On CUDA the step is captured once per shape (``torch.cuda.CUDAGraph``) after warm-up calls on a side stream, and
each step of a generation is one ``replay()``. On a CPU there are no graphs: the same step runs eagerly, as fast as
FDG.generate (docs/performance.md), with FDG.generate's ids in fp32 and bf16; in int8, whose activations are rounded
with one scale per call, the rounding-level difference of the masked attention can move a random-weight row onto
another token late in the caption. Its CUDA test (tests/test_static_decode.py) is skipped on machines without a
GPU.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from namc import ops
from namc.backends.step import cache_dtype, first_max_index, fused_view
from namc.backends.versions import fingerprint as _fingerprint
from namc.models.fdg import FDG
from namc.models.layers import KVCache
from namc.models.shortlist import Shortlist

__all__ = ["StaticDecoder", "StaticKVCache"]


class StaticKVCache(KVCache):
    """A self-attention cache of fixed shape: ``append`` writes the step's keys and values at ``position`` (a
    one-element long tensor) and returns all ``max_len`` slots; ``mask`` (1, 1, 1, max_len) marks the slots written
    so far (the step sets it). The buffers start zeroed, so a masked slot never holds a non-finite value."""

    def __init__(self, batch: int, heads: int, max_len: int, head_dim: int, position: torch.Tensor, dtype) -> None:
        super().__init__(batch, heads, max_len, head_dim, position.device, dtype)
        self.k.zero_()
        self.v.zero_()
        self.position = position

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # (B, H, L, E) <- (B, H, 1, E) at the position; in the buffers' dtype, as KVCache's slice assignment casts
        self.k.index_copy_(2, self.position, k.to(self.k.dtype))
        self.v.index_copy_(2, self.position, v.to(self.v.dtype))
        return self.k, self.v

    def select(self, index: torch.Tensor) -> None:
        raise NotImplementedError("a static cache keeps its rows: finished rows stay in the batch")


@dataclass(eq=False)
class _State:
    """The buffers of one shape, and its CUDA graph once captured."""

    position: torch.Tensor  # (1,) long: the step's position, advanced by the step
    slots: torch.Tensor  # (L,) long: 0 .. L-1
    tokens: torch.Tensor  # (B,) long: the step's input tokens
    finished: torch.Tensor  # (B,) bool
    eos: torch.Tensor  # () long: [EOS] (-1 while the throughput harness disables it)
    out: torch.Tensor  # (B, L) long: generated ids, padding after [EOS]
    caches: list[StaticKVCache]
    cross_kv: list[tuple[torch.Tensor, torch.Tensor]]  # 2 x (B, H, N, E) per layer
    memory_mask: torch.Tensor | None  # (B, N) bool
    weights: list  # FusedFDG.step_weights() when built (on a shortlist's rows where one is given)
    graph: torch.cuda.CUDAGraph | None = None


class StaticDecoder:
    """Greedy decoding of FDG in fixed-shape steps (module docstring); a CUDA graph per shape on CUDA.

    Call it on (B, N, D) memory (E_MIR, :meth:`NAMC.encode_pair <namc.models.namc.NAMC.encode_pair>`) as
    ``fdg.generate(memory, max_new_tokens)`` is called; it returns the same (B, T) ids. Buffers (and graphs) are
    kept for the ``max_shapes`` most recent shapes, and all dropped when a parameter of the FDG changed since they
    were built (an optimiser step, ``load_state_dict``): a captured graph reads the matrices it was captured with.
    The FDG must be in eval mode.

    Args:
        fdg: the decoder (eval mode).
        max_new_tokens: the most tokens generated per row, [EOS] included (23 in the paper).
        graph: capture the step as a CUDA graph; None (default): on CUDA devices only.
        check_every: steps between looks at the finished flags (each a host synchronisation).
        max_shapes: shapes whose buffers are kept.
        warmup: eager steps on a side stream before a capture.
        vocabulary: the only tokens to generate, as :meth:`FDG.generate <namc.models.fdg.FDG.generate>`'s
            (:mod:`namc.models.shortlist`); None: all.
    """

    def __init__(
        self,
        fdg: FDG,
        max_new_tokens: int = 23,
        graph: bool | None = None,
        check_every: int = 4,
        max_shapes: int = 4,
        warmup: int = 3,
        vocabulary: Shortlist | Iterable[int] | None = None,
    ) -> None:
        if max_new_tokens < 1 or max_new_tokens > fdg.max_len:
            raise ValueError(f"max_new_tokens must be in [1, {fdg.max_len}] (FDG's positions), got {max_new_tokens}")
        if check_every < 1 or max_shapes < 1 or warmup < 1:
            raise ValueError("check_every, max_shapes and warmup must be >= 1")
        self.fdg, self.max_new_tokens, self.graph = fused_view(fdg), max_new_tokens, graph
        self.check_every, self.max_shapes, self.warmup = check_every, max_shapes, warmup
        self.shortlist = fdg._shortlist(vocabulary)
        self._states: OrderedDict[tuple, _State] = OrderedDict()
        self._built_for: tuple = ()  # the FDG's parameters when the states were built (_fingerprint)
        self._weights: list | None = None  # FusedFDG.step_weights then (every state's step reads these matrices)

    @torch.inference_mode()
    def __call__(self, memory: torch.Tensor, memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy ids (B, T) for (B, N, D) ``memory``: without [BOS], padded with ``pad_id`` after [EOS]."""
        fdg = self.fdg
        if fdg.training:
            raise RuntimeError("StaticDecoder decodes an eval-mode FDG: call .eval() first (dropout is on)")
        if memory.dim() != 3 or memory.shape[-1] != fdg.config.dim:
            raise ValueError(f"memory must be (B, N, {fdg.config.dim}), got {tuple(memory.shape)}")
        if memory_mask is not None and memory_mask.shape != memory.shape[:2]:
            raise ValueError(f"memory_mask must be {tuple(memory.shape[:2])}, got {tuple(memory_mask.shape)}")
        cross_kv = fdg.cross_kv(memory)  # the prefill, once per call
        s = self._state(memory, memory_mask, cross_kv)
        for (k_buf, v_buf), (k, v) in zip(s.cross_kv, cross_kv):
            k_buf.copy_(k)
            v_buf.copy_(v)
        if memory_mask is not None:
            s.memory_mask.copy_(memory_mask)
        self._reset(s)
        stop_early = fdg.eos_id >= 0
        for t in range(1, self.max_new_tokens + 1):
            if s.graph is not None:
                s.graph.replay()
            else:
                self._step(s)
            if stop_early and t % self.check_every == 0 and t < self.max_new_tokens and bool(s.finished.all()):
                break
        return s.out[:, : ops.used_length(s.out, fdg.pad_id)].clone()

    def _reset(self, s: _State) -> None:
        fdg = self.fdg
        s.position.zero_()
        s.tokens.fill_(fdg.bos_id)
        s.finished.zero_()
        s.eos.fill_(fdg.eos_id)
        s.out.fill_(fdg.pad_id)

    def _step(self, s: _State) -> None:
        """One step on the buffers: the next token of every row, written at the position, which then advances."""
        fdg = self.fdg
        x = F.embedding(s.tokens, fdg.tok.weight) + fdg.pos.index_select(0, s.position)  # (B, D)
        seen = (s.slots <= s.position)[None, None, None, :]  # (1, 1, 1, L): the slots written so far
        for cache in s.caches:
            cache.mask = seen
        logits = fdg._fused_layers(x, s.caches, s.cross_kv, s.memory_mask, s.weights)  # (B, V)
        nxt = first_max_index(logits)
        nxt = (nxt if self.shortlist is None else self.shortlist.to_vocabulary(nxt)).masked_fill(s.finished, fdg.pad_id)
        s.out.index_copy_(1, s.position, nxt[:, None])
        s.finished |= nxt == s.eos
        s.tokens.copy_(nxt)
        s.position += 1

    def _state(self, memory: torch.Tensor, memory_mask: torch.Tensor | None, cross_kv: list) -> _State:
        built_for = _fingerprint(self.fdg)
        if built_for != self._built_for:
            self._states.clear()
            self._built_for, self._weights = built_for, None
        key = (tuple(memory.shape), memory.dtype, memory.device, memory_mask is not None)
        if key in self._states:
            self._states.move_to_end(key)
            return self._states[key]
        while len(self._states) >= self.max_shapes:
            self._states.popitem(last=False)
        self._states[key] = s = self._build(memory, memory_mask, cross_kv)
        return s

    def _build(self, memory: torch.Tensor, memory_mask: torch.Tensor | None, cross_kv: list) -> _State:
        """The buffers of ``memory``'s shape, holding this call's prefill ``cross_kv`` (a capture's warm-up steps
        run on it); the CUDA graph where one is captured."""
        fdg, L = self.fdg, self.max_new_tokens
        B, _, D = memory.shape
        if self._weights is None:
            weights = fdg.step_weights()
            self._weights = weights if self.shortlist is None else fdg.shortlisted(weights, self.shortlist)
        weights = self._weights  # the matrices this state's step (and graph) reads
        device, dtype = memory.device, cache_dtype(memory, weights)
        position = torch.zeros(1, dtype=torch.long, device=device)
        s = _State(
            position=position,
            slots=torch.arange(L, device=device),
            tokens=torch.empty(B, dtype=torch.long, device=device),
            finished=torch.empty(B, dtype=torch.bool, device=device),
            eos=torch.empty((), dtype=torch.long, device=device),
            out=torch.empty(B, L, dtype=torch.long, device=device),
            caches=[StaticKVCache(B, fdg.heads, L, D // fdg.heads, position, dtype) for _ in fdg.blocks],
            cross_kv=[(k.clone(), v.clone()) for k, v in cross_kv],
            memory_mask=None if memory_mask is None else memory_mask.clone(),
            weights=weights,
        )
        if self.graph if self.graph is not None else device.type == "cuda":
            s.graph = self._capture(s)
        return s

    def _capture(self, s: _State) -> torch.cuda.CUDAGraph:
        """Record one step as a CUDA graph, after ``warmup`` eager steps on a side stream (cuBLAS handles and
        workspaces, lazily built kernels: nothing a graph may allocate while it records). Under CUDA autocast both
        run with autocast's cast cache off: a cached cast made during the capture would not outlive it."""
        device = s.position.device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        on = torch.is_autocast_enabled("cuda")

        def amp() -> contextlib.AbstractContextManager:
            dtype = torch.get_autocast_dtype("cuda")
            return torch.autocast("cuda", dtype=dtype, cache_enabled=False) if on else contextlib.nullcontext()

        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), amp():
            self._reset(s)
            for _ in range(min(self.warmup, self.max_new_tokens)):
                self._step(s)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), amp():
            self._step(s)
        return graph
