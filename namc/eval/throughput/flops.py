"""The analytic FLOP count of FDG's KV-cached greedy decoding, the numerator of the decode FLOP efficiency."""

from __future__ import annotations

from collections.abc import Sequence

from namc.models.namc import NAMC

__all__ = ["decoder_flops", "fdg_shape"]


def decoder_flops(
    dim: int, heads: int, layers: int, hidden: int, vocab_size: int, memory_len: int, lengths: Sequence[int]
) -> dict[str, float]:
    """Analytic FLOPs (2 per multiply-add) of KV-cached greedy decoding, as FDG performs it.

    Per sequence, once: the cross-attention keys/values of the N memory positions, ``layers * 2 N D (2D)``.
    Per generated token at step t (t = 0, 1, ...; the self-attention cache then holds t + 1 keys), per layer:
    the fused query/key/value projection ``2 D (3D)``, self-attention scores and weighted sum ``4 (t + 1) D``, its
    output projection ``2 D D``, the cross-attention query and output projections ``2 * 2 D D``, cross-attention
    over the memory ``4 N D``, and the FFN ``2 * 2 D F``; then the vocabulary projection of the last position
    only, ``2 D V``. Layer norms, GELU, softmax and residual additions (O(D) per token) are not counted. The head
    count does not change the count (it splits D).

    Args:
        dim: D.
        heads: attention heads (kept for the record).
        layers: decoder layers.
        hidden: FFN hidden width F.
        vocab_size: V.
        memory_len: N memory positions.
        lengths: tokens generated for each row.

    Returns:
        ``total``, ``prefill`` (cross-attention keys/values) and ``per_token_mean`` FLOPs.
    """
    del heads
    D, N = dim, memory_len
    fixed = layers * (2 * D * 3 * D + 2 * D * D + 2 * 2 * D * D + 4 * N * D + 2 * 2 * D * hidden) + 2 * D * vocab_size
    prefill = len(lengths) * layers * 2 * N * D * 2 * D
    steps = 0.0
    for n in lengths:
        # sum over t < n of (fixed + layers * 4 (t + 1) D)
        steps += n * fixed + layers * 4 * D * n * (n + 1) / 2
    tokens = sum(lengths)
    return {
        "total": float(prefill + steps),
        "prefill": float(prefill),
        "per_token_mean": float(steps / tokens) if tokens else 0.0,
    }


def fdg_shape(model: NAMC) -> dict[str, int]:
    """The decoder's sizes as :func:`decoder_flops` takes them (all but ``lengths``)."""
    fdg = model.fdg
    block = fdg.blocks[0]
    return {
        "dim": fdg.tok.weight.shape[1],
        "heads": fdg.heads,
        "layers": len(fdg.blocks),
        "hidden": block.ffn[0].out_features,
        "vocab_size": fdg.tok.weight.shape[0],
        "memory_len": model.grid_size**2,
    }
