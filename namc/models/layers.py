"""Transformer blocks shared by the MIR encoder and the FDG decoder.

Dimension letters: B batch, T query positions, S key positions, D width, H heads, E head width (D / H).

Blocks are pre-LayerNorm (the paper says "standard Transformer layers", appendix F; pre-LN is the standard that
trains stably without warm-up at the paper's learning rates). Each block is self-attention -> cross-attention -> FFN
(section 3.2.2); the three sub-layers are also callable one by one so the MIR co-attention can swap the two image
streams between self- and cross-attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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


def residual(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``x + h`` for a sub-layer's fresh output ``h``: written into ``h`` where autograd is off and nothing changes
    dtype or shape (the same values to the bit), saving an activation-sized allocation (namc_base's MIR at batch 32
    has (64, 196, 768) residual streams, 39 MB each)."""
    if torch.is_grad_enabled() or h.dtype != x.dtype or h.shape != x.shape:
        return x + h
    return h.add_(x)


class Block(nn.Module):
    """Pre-LN transformer layer: self-attention -> cross-attention -> feed-forward (section 3.2.2)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, dropout: float = 0.1) -> None:
        super().__init__()
        self.ln_self = nn.LayerNorm(dim)
        self.self_attn = Attention(dim, heads, dropout)
        self.ln_cross = nn.LayerNorm(dim)
        self.ln_context = nn.LayerNorm(dim)
        self.cross_attn = Attention(dim, heads, dropout)
        self.ln_ffn = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.ffn = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim))
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
