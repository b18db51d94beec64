"""The three graphs ``namc export onnx`` writes, as plain PyTorch modules over a trained :class:`~namc.models.NAMC`'s
own parameters.

Dimension letters: B pairs, S image side, N memory positions (n_I), D width, H heads, E head width (D / H),
t positions decoded so far, V vocabulary, L decoder layers.

- :class:`PairEncoder`: the pixels of both images -> E_MIR, what ``model.encode_pair`` returns.
- :class:`CrossKV`: E_MIR -> each decoder layer's cross-attention keys and values, what ``model.fdg.cross_kv``
  returns (once per generation).
- :class:`DecoderStep`: one greedy step of FDG with an explicit key/value cache, the maths of ``FDG._step`` (the
  module path, without dropout): the new token at a position, the keys/values of the t positions before it and
  the cross-attention keys/values -> the next token's logits and the keys/values of the t + 1 positions.

The decoding step is written out from the blocks' parameters (LayerNorm, linear maps, attention, GELU) rather than
traced through FDG, whose eval step takes CPU-specific fused paths; the cross-attention keys/values get their own
graph so that the encoder's output stays E_MIR and each graph does one job. An export traces these modules with
autograd on, so the model's inference-only in-place paths (GELU, residual additions) stay out of the graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from namc.models import NAMC
from namc.models.layers import Block

__all__ = ["CrossKV", "DecoderStep", "PairEncoder", "cache_names", "cross_names"]


def cache_names(layers: int, prefix: str) -> list[str]:
    """``[prefix.0.key, prefix.0.value, prefix.1.key, ...]``: the names of L layers' keys and values."""
    return [f"{prefix}.{i}.{part}" for i in range(layers) for part in ("key", "value")]


def cross_names(layers: int) -> list[str]:
    """The names of the cross-attention keys/values (outputs of cross_kv.onnx, inputs of decoder_step.onnx)."""
    return cache_names(layers, "cross")


def _layer_norm(x: torch.Tensor, ln: nn.LayerNorm) -> torch.Tensor:
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)


def _linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


class PairEncoder(nn.Module):
    """``(images_1, images_2)`` (B, 3, S, S) in [0, 1] -> E_MIR (B, N, D): the ResNet grid, MIR's embedding,
    co-attention and fusion, as ``model.encode_pair``."""

    def __init__(self, model: NAMC) -> None:
        super().__init__()
        self.model = model

    def forward(self, images_1: torch.Tensor, images_2: torch.Tensor) -> torch.Tensor:
        return self.model.encode_pair(images_1, images_2)


class CrossKV(nn.Module):
    """E_MIR (B, N, D) -> 2L tensors (B, H, N, E): each layer's cross-attention keys, then values
    (``Block.context_kv``)."""

    def __init__(self, model: NAMC) -> None:
        super().__init__()
        self.blocks = model.fdg.blocks

    def forward(self, memory: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out: list[torch.Tensor] = []
        for block in self.blocks:
            out += _split_heads(_linear(_layer_norm(memory, block.ln_context), block.cross_attn.kv), block, 2)
        return tuple(out)


def _split_heads(x: torch.Tensor, block: Block, parts: int) -> list[torch.Tensor]:
    """(B, T, parts * D) -> ``parts`` tensors (B, H, T, E), in ``Attention.split_kv``'s layout (key, then value)."""
    H, E = block.self_attn.heads, block.self_attn.head_dim
    B, T, _ = x.shape
    x = x.view(B, T, parts, H, E).permute(2, 0, 3, 1, 4)  # (parts, B, H, T, E)
    return [x[i] for i in range(parts)]


class DecoderStep(nn.Module):
    """One decoding step of FDG in eval mode.

    Inputs: ``tokens`` (B, 1) int64, ``position`` (1,) int64 (the tokens' position, t), then per layer the
    self-attention keys and values of the t positions before (B, H, t, E) (``past.{i}.key``, ``past.{i}.value``),
    then per layer the cross-attention keys and values (B, H, N, E) (:class:`CrossKV`'s outputs).

    Outputs: ``logits`` (B, V), then per layer the keys and values of the t + 1 positions (B, H, t + 1, E)
    (``present.{i}.key``, ``present.{i}.value``), the next step's ``past``.
    """

    def __init__(self, model: NAMC) -> None:
        super().__init__()
        fdg = model.fdg
        self.blocks = fdg.blocks
        self.tok, self.pos, self.ln_f = fdg.tok, fdg.pos, fdg.ln_f
        self.tied = fdg.lm_head is None
        self.vocab = fdg.tok.weight if self.tied else fdg.lm_head.weight  # (V, D): tied or its own head

    def forward(self, tokens: torch.Tensor, position: torch.Tensor, *caches: torch.Tensor) -> tuple[torch.Tensor, ...]:
        L = len(self.blocks)
        past, cross = caches[: 2 * L], caches[2 * L :]
        # The projection reads the vocabulary matrix transposed, which the exporter stores as a (D, V) copy; a tied
        # embedding looks its rows up as columns of that copy, so the file holds the matrix once (namc_base: 152 MB)
        vocab_t = self.vocab.t()  # (D, V)
        if self.tied:
            x = vocab_t.index_select(1, tokens.view(-1)).t().unsqueeze(1)  # (B, 1, D)
        else:
            x = F.embedding(tokens, self.tok.weight)  # (B, 1, D)
        x = x + self.pos.index_select(0, position)
        B, T, D = x.shape
        present: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            h = _layer_norm(x, block.ln_self)
            (q,) = _split_heads(_linear(h, block.self_attn.q), block, 1)  # (B, H, 1, E)
            k, v = _split_heads(_linear(h, block.self_attn.kv), block, 2)
            k = torch.cat([past[2 * i], k], dim=2)  # (B, H, t + 1, E)
            v = torch.cat([past[2 * i + 1], v], dim=2)
            present += [k, v]
            y = F.scaled_dot_product_attention(q, k, v)  # (B, H, 1, E)
            x = x + _linear(y.transpose(1, 2).reshape(B, T, D), block.self_attn.out)
            (q,) = _split_heads(_linear(_layer_norm(x, block.ln_cross), block.cross_attn.q), block, 1)
            y = F.scaled_dot_product_attention(q, cross[2 * i], cross[2 * i + 1])  # (B, H, 1, E)
            x = x + _linear(y.transpose(1, 2).reshape(B, T, D), block.cross_attn.out)
            f_in, gelu, _, f_out = block.ffn
            x = x + _linear(F.gelu(_linear(_layer_norm(x, block.ln_ffn), f_in), approximate=gelu.approximate), f_out)
        logits = torch.matmul(_layer_norm(x[:, -1], self.ln_f), vocab_t)  # (B, V)
        return (logits, *present)
