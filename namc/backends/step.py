"""The hand-written CPU decoding path: a fused eval step over prepared weights, for an inference copy's decoder.

The model core (:mod:`namc.models`) decodes with its blocks' modules, one position at a time. An inference copy
(:mod:`namc.backends.precision`) swaps in what this module defines, leaving the model's parameters and state dict
as they are:

- :class:`FusedFDG`, FDG with the fused eval step (:class:`StepWeights`): one (3D x D) projection gives the
  self-attention query, key and value, the hidden states stay (b, D) instead of (b, 1, D), the cross-attention
  keys/values are made contiguous once, and the large skinny products run through oneDNN
  (:func:`~namc.backends.onednn.dense`); :meth:`FusedFDG.pack_step` keeps an int8 or bf16 copy's matrices prepared
  once;
- :class:`ThreadedLayerNorm` and :class:`InplaceGELU`, the blocks' LayerNorm and GELU on one thread where their input
  is small (:func:`namc.kernels.run`), the GELU in place;
- :func:`first_max_index`, the greedy pick's blocked argmax.

Size: over the soft budget, because the fused step, its weights and the kernels' choices are one unit that reads
best together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from namc import kernels
from namc.backends import onednn
from namc.backends.qlinear import int8_linear, int8_worthwhile
from namc.models.fdg import FDG
from namc.models.layers import KVCache
from namc.models.shortlist import Shortlist
from namc.thresholds import ARGMAX_MIN_ROWS, CROSS_KV_BF16_MIN, GELU_ATEN_MAX, SERIAL_FLOPS

__all__ = [
    "FusedFDG",
    "InplaceGELU",
    "StepWeights",
    "ThreadedLayerNorm",
    "attend_one",
    "attend_step",
    "cache_dtype",
    "first_max_index",
    "fuse_decoder",
    "fused_view",
]


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one query per row and head, ``F.scaled_dot_product_attention``'s maths as two batched matrix
    products: (B, H, 1, E) queries over (B, H, S, E) keys and values -> (B, H, 1, E); ``mask`` (B, 1, 1, S) bool,
    True where a key may be attended.

    For a single query, the CPU kernel behind ``scaled_dot_product_attention`` (flash attention, blocked for long
    query sequences) is the slower choice in bf16 (several times slower over hundreds of keys), where this reads keys
    and values once and is bound by memory; in fp32 the gain is small over a whole decoding, so fp32 keeps the fused
    kernel (:func:`attend_step` says where in bf16). The scores are rounded to the inputs' dtype before the softmax
    (the fused kernel keeps them in fp32).
    """
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-2, -1))  # (B, H, 1, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), v)


def attend_sized(
    attend: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args, **kwargs
) -> torch.Tensor:
    """``attend(q, k, v, ...)`` (:func:`attend_one` or ``F.scaled_dot_product_attention``), on one thread where its
    4 B H Q S E FLOPs are too few to pay for waking a second (:func:`namc.kernels.run`)."""
    if not q.is_cpu:
        return attend(q, k, v, *args, **kwargs)
    kind = "attend_one" if attend is attend_one else ("sdpa_bf16" if q.dtype == torch.bfloat16 else "sdpa_fp32")
    return kernels.run(kind, 4.0 * q.numel() * k.shape[-2], attend, q, k, v, *args, **kwargs)


# 4 B H S E FLOPs of one query per row and head from which attend_step takes attend_one for bf16 keys and values:
# where the fused bf16 kernel stops running on one thread (its threads rule), the size from which it loses
ONE_QUERY_FUSED_FLOPS = SERIAL_FLOPS["sdpa_bf16"]


def attend_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """A decoding step's attention, one query per row and head ((B, H, 1, E) over (B, H, S, E) -> (B, H, 1, E)), on
    the faster kernel (:func:`attend_sized`): ``F.scaled_dot_product_attention``, except for bf16 keys and values on
    a CPU from ``ONE_QUERY_FUSED_FLOPS`` up, where :func:`attend_one` is. PyTorch's fused bf16 kernel is quick for
    small ones on one thread and slow on two, whether idle threads sleep or spin: the threshold is where the fused
    kernel takes its second thread (figures in docs/performance.md).

    fp32 keeps the fused kernel at every size (bit for bit the module path's attention), and so does a step being
    traced by ``torch.compile``. So does bf16 on a CPU with AMX
    (:func:`~namc.backends.onednn.amx_bf16`), where the fused kernel runs its products on the tiles and is the faster
    one."""
    if (
        k.is_cpu
        and k.dtype != torch.float32
        and not onednn.amx_bf16()
        and not torch.compiler.is_compiling()  # a graph would be guarded to each side of the threshold
        and 4.0 * q.numel() * k.shape[-2] >= ONE_QUERY_FUSED_FLOPS
    ):
        return attend_sized(attend_one, q, k, v, mask)
    return attend_sized(F.scaled_dot_product_attention, q, k, v, mask)


class InplaceGELU(nn.GELU):
    """``nn.GELU`` that overwrites its input where autograd is off (inference), with PyTorch's values.

    In a block's feed-forward the GELU's input is the first layer's fresh output, which nothing else reads. In place
    it saves an activation-sized allocation, which above glibc's mmap threshold (at most 32 MiB) comes as fresh
    pages to fault in and zero: namc_base's MIR at batch 32 has (64, 196, 3072) FFN activations, 154 MB. Training
    keeps PyTorch's GELU, whose backward reads the input.

    Up to ``SERIAL_NUMEL`` elements on a CPU (a decoding step of up to 5 rows in namc_base), the GELU runs
    ATen's own kernel on a non-contiguous view of the same memory: PyTorch hands the exact GELU of a contiguous fp32
    or bf16 CPU tensor to oneDNN, which opens a parallel region at any size, and under ``OMP_WAIT_POLICY=PASSIVE``
    waking the sleeping thread costs many times the GELU itself, where ATen's kernel stays on one thread up to that
    size. The two kernels can differ in the last bit; ATen's values are those of
    ``torch.backends.mkldnn.flags(enabled=False)``.
    """

    SERIAL_NUMEL = GELU_ATEN_MAX  # ATen's exact GELU stays on one thread up to this many elements

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return super().forward(x)
        if (
            x.is_cpu
            and not torch.compiler.is_compiling()  # a graph would be guarded to each side of these size tests
            and x.is_contiguous()
            and 1 < x.numel() <= self.SERIAL_NUMEL
            and x.numel() % 2 == 0
        ):
            torch.ops.aten.gelu_(x.view(2, -1).t(), approximate=self.approximate)  # not contiguous: ATen's kernel
            return x
        if x.is_cpu:  # oneDNN's kernel, on one thread where it is small (kernels.SERIAL_ELEMENTS)
            return kernels.run("gelu", x.numel(), torch.ops.aten.gelu_, x, approximate=self.approximate)
        return torch.ops.aten.gelu_(x, approximate=self.approximate)


class ThreadedLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` that runs on one thread where its input is small and OpenMP's idle threads sleep
    (:func:`namc.kernels.run`): PyTorch's CPU kernel opens a parallel region over the rows from a few rows up,
    and waking the second thread costs more than normalising a decoding step's states (a 32 x 768 input normalises
    about 4x faster on one thread under ``OMP_WAIT_POLICY=PASSIVE``). The same parameters, state dict and values.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cpu:
            return kernels.run("layer_norm", x.numel(), super().forward, x)
        return super().forward(x)


@dataclass
class StepWeights:
    """The matrices of one block's eval step, each ``(weight, bias)`` or ``(packed int8 layer,)``
    (:func:`~namc.backends.onednn.dense`).

    The self-attention query/key/value weights are stacked for one (3D x D) projection, rows ``[q; k; v]``
    (:meth:`~namc.models.layers.Attention.split_kv`'s key-then-value layout). Built once per generation from the
    live parameters, so it never goes stale after training; :meth:`FusedFDG.pack_step` keeps an int8 or prepacked
    bf16 copy instead.
    """

    NAMES = ("qkv", "self_out", "cross_q", "cross_out", "ffn_in", "ffn_out", "vocab")
    qkv: tuple  # (3D, D), (3D,)
    self_out: tuple
    cross_q: tuple
    cross_out: tuple
    ffn_in: tuple
    ffn_out: tuple
    vocab: tuple  # (V, D), None: the tied embedding or lm_head

    @classmethod
    def of(cls, block: nn.Module, vocab: tuple) -> StepWeights:
        s, c, (f_in, _, _, f_out) = block.self_attn, block.cross_attn, block.ffn
        qkv = (torch.cat([s.q.weight, s.kv.weight]), torch.cat([s.q.bias, s.kv.bias]))
        pairs = [(m.weight, m.bias) for m in (s.out, c.q, c.out, f_in, f_out)]
        return cls(qkv, *pairs, vocab)

    @staticmethod
    def each_matrix(weights: list[StepWeights], form: Callable[[torch.Tensor, torch.Tensor | None], tuple]) -> list:
        """``weights`` with every ``(weight, bias)`` entry replaced by ``form(weight, bias)``, made once per matrix
        (the vocabulary's is shared by the layers)."""
        done: dict[int, tuple] = {}
        out = []
        for w in weights:
            for name in w.NAMES:
                weight, bias = getattr(w, name)
                if id(weight) not in done:
                    done[id(weight)] = form(weight, bias)
            out.append(replace(w, **{name: done[id(getattr(w, name)[0])] for name in w.NAMES}))
        return out

    @staticmethod
    def packed(weight: torch.Tensor, bias: torch.Tensor | None, precision: str) -> tuple:
        """One matrix in the form :meth:`FusedFDG.pack_step` keeps: ``"int8"`` a
        dynamic int8 layer ``(layer,)`` (a matrix too small to gain from int8 stays fp32 ``(matrix, bias)``,
        :func:`~namc.backends.qlinear.int8_worthwhile`), ``"bf16"`` a bf16 matrix reordered once for oneDNN ``(matrix,
        bias)`` (an fp32 one, which a bf16 copy keeps where bf16 does not pay, stays as it is)."""
        if precision == "int8" and int8_worthwhile(weight):
            return (int8_linear(weight, bias),)
        if precision == "int8" or weight.dtype != torch.bfloat16:
            return (weight.detach(), None if bias is None else bias.detach())
        bias = None if bias is None else bias.detach().to(torch.bfloat16)
        return (onednn.pack_linear(weight.detach()), bias)


def cache_dtype(memory: torch.Tensor, fused: list[StepWeights] | None) -> torch.dtype:
    """The dtype of the self-attention keys / values an eval step with ``fused`` weights writes: on a CPU its
    matrices' (a bf16 copy's decoder may be fp32 behind a bf16 MIR), else the memory's."""
    if fused is not None and memory.device.type == "cpu" and isinstance(fused[0].qkv[0], torch.Tensor):
        return fused[0].qkv[0].dtype
    return memory.dtype


class FusedFDG(FDG):
    """FDG with the fused eval step (module docstring). It has no parameters or state of its own: an inference copy's
    decoder becomes one in place (:func:`fuse_decoder`), and the state dict is FDG's. In training mode (dropout
    active) it decodes with the modules, as FDG does."""

    def decoding(
        self, memory: torch.Tensor, max_new_tokens: int, shortlist: Shortlist | None = None
    ) -> tuple[list[KVCache], list[tuple[torch.Tensor, torch.Tensor]], Callable[..., torch.Tensor]]:
        caches, cross_kv, fused = self._start(memory, max_new_tokens, shortlist)
        if fused is None:  # training: the modules, as FDG
            return super().decoding(memory, max_new_tokens, shortlist)

        def fused_step(tokens, position, caches, cross_kv, memory_mask):
            return self._fused_step(tokens, position, caches, cross_kv, memory_mask, fused)

        return caches, cross_kv, fused_step

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        return first_max_index(logits)

    def _fused_step(
        self,
        tokens: torch.Tensor,
        position: int,
        caches: list[KVCache],
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        memory_mask: torch.Tensor | None,
        fused: list[StepWeights],
    ) -> torch.Tensor:
        """Eval-mode step on (b,) tokens with (b, D) states; the same maths as the module path without dropout."""
        x = F.embedding(tokens, self.tok.weight) + self.pos[position]  # (b, D)
        return self._fused_layers(x, caches, cross_kv, memory_mask, fused)

    def _fused_layers(
        self,
        x: torch.Tensor,
        caches: list[KVCache],
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        memory_mask: torch.Tensor | None,
        fused: list[StepWeights],
    ) -> torch.Tensor:
        """The eval step's layers on (b, D) input states -> (b, V) logits; each cache's keys are attended under its
        ``mask`` (None: all it returns; :class:`~namc.backends.static_decode.StaticKVCache` masks the slots ahead)."""
        b, D = x.shape
        mask = None if memory_mask is None else memory_mask[:, None, None, :]  # (b, 1, 1, N)
        kv_dtype = cross_kv[0][0].dtype  # bf16 in a bf16 or int8 copy (FusedFDG.pack_step)
        for block, cache, (k_mem, v_mem), w in zip(self.blocks, caches, cross_kv, fused):
            H, E = block.self_attn.heads, block.self_attn.head_dim
            qkv = onednn.dense(block.ln_self(x), *w.qkv).view(b, 3, H, 1, E)  # (b, 3, H, 1, E)
            k, v = cache.append(qkv[:, 1], qkv[:, 2])  # 2 x (b, H, t, E)
            y = attend_step(qkv[:, 0], k, v, cache.mask)  # (b, H, 1, E)
            x = x + onednn.dense(y.view(b, D), *w.self_out)  # (b, D)
            q = onednn.dense(block.ln_cross(x), *w.cross_q).view(b, H, 1, E)
            y = attend_step(q.to(kv_dtype), k_mem, v_mem, mask).to(q.dtype)  # (b, H, 1, E); int8: casts
            x = x + onednn.dense(y.view(b, D), *w.cross_out)  # (b, D)
            x = x + onednn.dense(block.ffn[1](onednn.dense(block.ln_ffn(x), *w.ffn_in)), *w.ffn_out)
        return onednn.dense(self.ln_f(x), *fused[-1].vocab)  # (b, V)

    def _start(
        self, memory: torch.Tensor, max_new_tokens: int, shortlist: Shortlist | None = None
    ) -> tuple[list[KVCache], list[tuple[torch.Tensor, torch.Tensor]], list[StepWeights] | None]:
        """Caches, cross-attention keys/values (each 2 x (B, H, N, E), contiguous) and fused step weights (the
        vocabulary projection onto ``shortlist``'s rows only where one is given)."""
        if max_new_tokens + 1 > self.max_len:
            raise ValueError(f"max_new_tokens={max_new_tokens} needs {max_new_tokens + 1} positions > {self.max_len}")
        B, _, D = memory.shape
        fused = None if self.training else self.step_weights()
        dtype = cache_dtype(memory, fused)
        caches = [
            KVCache(B, self.heads, max_new_tokens + 1, D // self.heads, memory.device, dtype) for _ in self.blocks
        ]
        if fused is not None and shortlist is not None:
            fused = self.shortlisted(fused, shortlist)
        return caches, self.cross_kv(memory), fused

    def shortlisted(self, fused: list[StepWeights], shortlist: Shortlist) -> list[StepWeights]:
        """``fused`` with the vocabulary projection onto ``shortlist``'s rows (:mod:`namc.models.shortlist`)."""
        head = shortlist_head(shortlist, fused[-1].vocab, self._vocab()[0])
        return [dataclasses.replace(w, vocab=head) for w in fused]

    def cross_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's cross-attention keys and values of (B, N, D) ``memory``, 2 x (B, H, N, E), contiguous: once
        per generation. An int8 copy keeps them in bf16 from ``CROSS_KV_BF16_MIN`` elements of memory up (below,
        fp32's fused SDPA kernel is as fast or faster; :meth:`pack_step`)."""
        big = not self.training and memory.numel() >= CROSS_KV_BF16_MIN
        kv_dtype = getattr(self, "_cross_kv_dtype", None) if big else None
        return [
            tuple(
                t.contiguous() if kv_dtype in (None, t.dtype) else t.to(kv_dtype, memory_format=torch.contiguous_format)
                for t in block.context_kv(memory)
            )
            for block in self.blocks
        ]

    def step_weights(self) -> list[StepWeights]:
        """The eval step's matrices per layer: those :meth:`pack_step` prepared, else the live parameters."""
        return getattr(self, "_packed_step", None) or [StepWeights.of(block, self._vocab()) for block in self.blocks]

    def pack_step(self, precision: str) -> None:
        """Keep the eval step's matrices (the vocabulary projection included) in a form prepared once, for an
        inference copy (:mod:`namc.backends.precision`) whose weights no longer change.

        - ``"int8"``: dynamic int8 layers (per-channel weight scales, activations quantised per call).
        - ``"bf16"``: on a CPU with oneDNN, the bf16 matrices reordered once into oneDNN's blocked layout
          (:func:`namc.kernels.reorder_linear_weight`); fp32 ones (too small to gain from bf16,
          :func:`~namc.backends.onednn.bf16_worthwhile`) stay. A plain bf16 weight is reordered at every call, which
          for namc_base's 49409 x 768 vocabulary costs more than the product from batch 8. Without oneDNN, or where
          it has no bf16 here (:func:`~namc.backends.onednn.bf16_supported`), nothing changes.

        The prefill (cross-attention keys/values of the memory, once per generation) stays in the weights' dtype in
        bf16 and becomes a dynamic int8 layer in int8, since in fp32 it would be a large share of int8 decoding. In
        int8, where oneDNN has bf16 on this CPU (its own check), the keys/values it writes are kept in bf16 from a
        memory of :data:`~namc.thresholds.CROSS_KV_BF16_MIN` elements up (namc_base's from 7 pairs), and each
        step's cross-attention reads them in bf16 as two batched products (:func:`~namc.backends.step.attend_one`):
        that attention is bound by reading the keys/values, so half the bytes pay from there, and fp32's fused
        kernel is as fast below. With AMX the int8 prefill runs in bf16 on the tiles, as MIR does, writing bf16 keys
        / values at any size (figures in docs/performance.md)."""
        if precision not in ("int8", "bf16"):
            raise ValueError(f"pack_step packs 'int8' or 'bf16' weights, not {precision!r}")
        vocab = self._vocab()
        packed = [StepWeights.of(block, vocab) for block in self.blocks]
        if precision == "bf16" and not (
            vocab[0].device.type == "cpu" and onednn.linear_available() and onednn.bf16_supported()
        ):
            return
        packed = StepWeights.each_matrix(packed, lambda weight, bias: StepWeights.packed(weight, bias, precision))
        if precision == "int8":
            bf16_kv = onednn.amx_bf16() and onednn.bf16_supported() and onednn.linear_available()
            for attn in (block.cross_attn for block in self.blocks):  # the prefill (bf16 with AMX, as MIR)
                if isinstance(attn.kv, nn.Linear) and bf16_kv and onednn.bf16_worthwhile(attn.kv.weight):
                    attn.kv = onednn.OneDNNLinear(attn.kv.weight, attn.kv.bias, torch.bfloat16)
                elif isinstance(attn.kv, nn.Linear) and int8_worthwhile(attn.kv.weight):
                    attn.kv = int8_linear(attn.kv.weight, attn.kv.bias)
            if vocab[0].device.type == "cpu" and onednn.bf16_supported():
                self._cross_kv_dtype = torch.bfloat16
        self._packed_step = packed


def fuse_decoder(fdg: FDG) -> FusedFDG:
    """Make ``fdg`` (an inference copy's decoder, not a model you train) a :class:`FusedFDG`, its LayerNorms
    :class:`ThreadedLayerNorm` and its feed-forward GELUs :class:`InplaceGELU`: the same parameters, state dict and
    maths, decoded through the fused step."""
    for module in fdg.modules():
        if type(module) is nn.LayerNorm:
            module.__class__ = ThreadedLayerNorm
        elif type(module) is nn.GELU:
            module.__class__ = InplaceGELU
    fdg.__class__ = FusedFDG
    return fdg


def fused_view(fdg: FDG) -> FusedFDG:
    """``fdg`` itself where it is a :class:`FusedFDG`, else a :class:`FusedFDG` that shares its modules and parameters
    (nothing copied, ``fdg`` unchanged; the LayerNorms and GELUs stay the model's own)."""
    if isinstance(fdg, FusedFDG):
        return fdg
    view = FusedFDG.__new__(FusedFDG)
    view.__dict__.update(fdg.__dict__)  # the same _parameters / _modules dicts: a second handle on one decoder
    for name in ("_packed_step", "_cross_kv_dtype"):
        view.__dict__.pop(name, None)
    return view


def shortlist_head(shortlist: Shortlist, entry: tuple, weight: torch.Tensor) -> tuple:
    """A fused step's vocabulary entry (no bias) restricted to ``shortlist``'s rows, in the entry's form: ``(matrix,
    None)`` plain or prepacked bf16, ``(packed int8 layer,)``; kept with the list while ``entry`` and ``weight``
    are unchanged (:meth:`~namc.models.shortlist.Shortlist.head`)."""

    def form(rows: torch.Tensor) -> tuple:
        if isinstance(entry[0], nn.Module):  # pack_step("int8"): the same per-row codes as the full matrix's
            return (int8_linear(rows, None),)  # int8 however few the rows, as the full matrix's are
        if onednn.is_packed(entry[0]):  # pack_step("bf16")
            return StepWeights.packed(rows, None, "bf16")
        return (rows.to(entry[0].dtype), None)

    return shortlist.head(entry, weight, form)


_BLOCK = 256  # columns per block of first_max_index's first pass (namc_base's 49,409 logits: 193 blocks)


def first_max_index(x: torch.Tensor) -> torch.Tensor:
    """``x.max(dim=-1).indices`` of a (b, V) tensor, the same indices (the first of ties, the first NaN), faster on
    a CPU's wide fp32 rows.

    PyTorch's max with indices passes over the row tracking an index per element; a value-only reduction (``amax``)
    is an order of magnitude faster. So the row is cut into blocks of 256 columns: the largest value of each block
    (``amax``), the first block holding the row's largest (``max`` over the block maxima), the first index of it
    within that block, and the columns after the last whole block compared on their own. From
    :data:`~namc.thresholds.ARGMAX_MIN_ROWS` rows this is faster than ``max`` on fp32 logits (up to 4x); one row
    keeps ``max``, as fast there. bf16 logits keep ``max`` too: their ``amax`` gains too little to pay
    (docs/performance.md). The small reductions run on one thread where idle threads sleep
    (:func:`namc.kernels.run`, ``argmax``)."""
    b, V = x.shape
    if (
        x.device.type != "cpu"
        or x.dtype != torch.float32
        or b < ARGMAX_MIN_ROWS
        or V < 16 * _BLOCK
        or x.stride(-1) != 1
    ):
        return x.max(dim=-1).indices
    return kernels.run("argmax", x.numel(), _blocked_first_max, x)


def _blocked_first_max(x: torch.Tensor) -> torch.Tensor:
    b, V = x.shape
    n = V - V % _BLOCK
    blocks = x[:, :n].unflatten(-1, (n // _BLOCK, _BLOCK))  # (b, n / 256, 256), a view
    best, block = blocks.amax(dim=-1).max(dim=-1)  # the row's largest over whole blocks and the first block holding it
    index = block * _BLOCK + blocks[torch.arange(b, device=x.device), block].max(dim=-1).indices
    if n < V:  # the last columns: they win only where strictly larger (or a NaN the blocks lack)
        tail, at = x[:, n:].max(dim=-1)
        later = (tail > best) | (tail.isnan() & ~best.isnan())
        index = torch.where(later, at + n, index)
    return index
