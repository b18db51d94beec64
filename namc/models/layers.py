"""Transformer blocks shared by the MIR encoder and the FDG decoder.

Dimension letters: B batch, T query positions, S key positions, D width, H heads, E head width (D / H).

Blocks are pre-LayerNorm (the paper says "standard Transformer layers", appendix F; pre-LN is the standard that
trains stably without warm-up at the paper's learning rates). Each block is self-attention -> cross-attention -> FFN
(section 3.2.2); the three sub-layers are also callable one by one so the MIR co-attention can swap the two image
streams between self- and cross-attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from namc.models import onednn, threads
from namc.models.qlinear import int8_linear, int8_worthwhile
from namc.thresholds import GELU_ATEN_MAX, SERIAL_FLOPS


class KVCache:
    """Pre-allocated key/value buffers of one self-attention layer for incremental decoding.

    Args:
        batch: rows.
        heads: attention heads.
        max_len: the most positions the cache will hold.
        head_dim: width of one head.
        device: where to allocate.
        dtype: buffer dtype.
    """

    mask: torch.Tensor | None = None  # what ``append`` returns is all attendable

    def __init__(self, batch: int, heads: int, max_len: int, head_dim: int, device, dtype) -> None:
        self.k = torch.empty(batch, heads, max_len, head_dim, device=device, dtype=dtype)  # (B, H, S, E)
        self.v = torch.empty_like(self.k)
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, H, T, E) new keys/values and return the (B, H, length, E) views of all so far."""
        t = k.shape[2]
        self.k[:, :, self.length : self.length + t] = k
        self.v[:, :, self.length : self.length + t] = v
        self.length += t
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def select(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` (finished rows dropped, or beams re-ordered)."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)


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
    4 B H Q S E FLOPs are too few to pay for waking a second (:mod:`namc.models.threads`)."""
    if not q.is_cpu:
        return attend(q, k, v, *args, **kwargs)
    kind = "attend_one" if attend is attend_one else ("sdpa_bf16" if q.dtype == torch.bfloat16 else "sdpa_fp32")
    return threads.run(kind, 4.0 * q.numel() * k.shape[-2], attend, q, k, v, *args, **kwargs)


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
    compiled (:mod:`namc.models.compiled_step`). So does bf16 on a CPU with AMX
    (:func:`~namc.models.onednn.amx_bf16`), where the fused kernel runs its products on the tiles and is the faster
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


class Attention(nn.Module):
    """Multi-head attention over ``F.scaled_dot_product_attention``.

    ``key_mask`` is a (B, S) bool with True where a key may be attended; masked keys get exactly zero weight.
    With ``need_weights`` the weights are computed explicitly and returned (for tests and plots).
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"width {dim} is not divisible by {heads} heads")
        self.heads, self.head_dim, self.dropout = heads, dim // heads, dropout
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)

    def split_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Project a (B, S, D) context to (B, H, S, E) keys and values (cacheable for cross-attention)."""
        B, S, _ = context.shape
        kv = self.kv(context).view(B, S, 2, self.heads, self.head_dim)  # (B, S, 2, H, E)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # 2 x (B, H, S, E)
        return k, v

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``x`` (B, T, D) to ``context`` (B, S, D; ``x`` itself when None).

        Args:
            x: (B, T, D) queries.
            context: (B, S, D) keys/values source; self-attention when None.
            key_mask: (B, S) bool, True where a key may be attended.
            causal: causal self-attention (queries are the last T positions of the keys).
            cache: a :class:`KVCache` for incremental self-attention; new keys are appended.
            kv: precomputed (B, H, S, E) keys and values (cached cross-attention); ``context`` is then ignored.
            need_weights: also return the (B, H, T, S) attention weights.
        """
        B, T, D = x.shape
        q = self.q(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, E)
        if kv is not None:
            k, v = kv
        else:
            k, v = self.split_kv(x if context is None else context)
            if cache is not None:
                k, v = cache.append(k, v)
        S = k.shape[2]
        mask = None
        if key_mask is not None:
            mask = key_mask[:, None, None, :]  # (B, 1, 1, S)
        if causal and T > 1:
            # query t sits at key position S - T + t and sees keys up to there
            tri = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=S - T)  # (T, S)
            mask = tri if mask is None else mask & tri
        p = self.dropout if self.training else 0.0
        if need_weights:
            scores = (q @ k.transpose(-2, -1)) / self.head_dim**0.5  # (B, H, T, S)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = scores.softmax(dim=-1)
            y = F.dropout(weights, p, self.training) @ v  # (B, H, T, E)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, H, T, E)
        y = self.out(y.transpose(1, 2).reshape(B, T, D))  # (B, T, D)
        return (y, weights) if need_weights else y


class GELU(nn.GELU):
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
        if x.is_cpu:  # oneDNN's kernel, on one thread where it is small (threads.SERIAL_ELEMENTS)
            return threads.run("gelu", x.numel(), torch.ops.aten.gelu_, x, approximate=self.approximate)
        return torch.ops.aten.gelu_(x, approximate=self.approximate)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` that runs on one thread where its input is small and OpenMP's idle threads sleep
    (:mod:`namc.models.threads`): PyTorch's CPU kernel opens a parallel region over the rows from a few rows up,
    and waking the second thread costs more than normalising a decoding step's states (a 32 x 768 input normalises
    about 4x faster on one thread under ``OMP_WAIT_POLICY=PASSIVE``). The same parameters, state dict and values.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cpu:
            return threads.run("layer_norm", x.numel(), super().forward, x)
        return super().forward(x)


def residual(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``x + h`` for a sub-layer's fresh output ``h``: written into ``h`` where autograd is off and nothing changes
    dtype or shape (the same values to the bit), saving an activation-sized allocation (:class:`GELU`)."""
    if torch.is_grad_enabled() or h.dtype != x.dtype or h.shape != x.shape:
        return x + h
    return h.add_(x)


class Block(nn.Module):
    """Pre-LN transformer layer: self-attention -> cross-attention -> feed-forward (section 3.2.2)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, dropout: float = 0.1) -> None:
        super().__init__()
        self.ln_self = LayerNorm(dim)
        self.self_attn = Attention(dim, heads, dropout)
        self.ln_cross = LayerNorm(dim)
        self.ln_context = LayerNorm(dim)
        self.cross_attn = Attention(dim, heads, dropout)
        self.ln_ffn = LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.ffn = nn.Sequential(nn.Linear(dim, hidden), GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim))
        self.drop = nn.Dropout(dropout)

    def self_attend(
        self,
        x: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Residual self-attention; with ``need_weights`` also the (B, H, T, T) weights."""
        h = self.self_attn(self.ln_self(x), key_mask=key_mask, causal=causal, cache=cache, need_weights=need_weights)
        if need_weights:
            return residual(x, self.drop(h[0])), h[1]
        return residual(x, self.drop(h))

    def context_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys/values of a context, computed once per generation."""
        return self.cross_attn.split_kv(self.ln_context(context))

    def cross_attend(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Residual cross-attention to ``context`` (or its precomputed ``kv``); with ``need_weights`` also the
        (B, H, T, S) weights."""
        if kv is None:
            kv = self.context_kv(context)
        h = self.cross_attn(self.ln_cross(x), key_mask=key_mask, kv=kv, need_weights=need_weights)
        if need_weights:
            return residual(x, self.drop(h[0])), h[1]
        return residual(x, self.drop(h))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return residual(x, self.drop(self.ffn(self.ln_ffn(x))))

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        self_mask: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        causal: bool = False,
    ) -> torch.Tensor:
        x = self.self_attend(x, self_mask, causal)
        x = self.cross_attend(x, context, context_mask)
        return self.feed_forward(x)


def ensure_attendable(key_mask: torch.Tensor | None) -> torch.Tensor | None:
    """Let a row whose keys are all masked attend to every key instead of producing NaN.

    With the paper's ratios (p_I = 0.2) a fully masked image is practically impossible; at extreme ablation ratios
    it can happen, and attending to the e_M placeholders is the least harmful fallback.
    """
    if key_mask is None:
        return None
    empty = ~key_mask.any(dim=1, keepdim=True)  # (B, 1)
    return key_mask | empty


@dataclass
class StepWeights:
    """The matrices of one block's eval step, each ``(weight, bias)`` or ``(packed int8 layer,)``
    (:func:`~namc.models.onednn.dense`).

    The self-attention query/key/value weights are stacked for one (3D x D) projection, rows ``[q; k; v]``
    (:meth:`~namc.models.layers.Attention.split_kv`'s key-then-value layout). Built once per generation from the
    live parameters, so it never goes stale after training; :meth:`FDG.pack_step <namc.models.fdg.FDG.pack_step>`
    keeps an int8 or prepacked bf16 copy instead.
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
        """One matrix in the form :meth:`FDG.pack_step <namc.models.fdg.FDG.pack_step>` keeps: ``"int8"`` a
        dynamic int8 layer ``(layer,)`` (a matrix too small to gain from int8 stays fp32 ``(matrix, bias)``,
        :func:`~namc.models.qlinear.int8_worthwhile`), ``"bf16"`` a bf16 matrix reordered once for oneDNN ``(matrix,
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
