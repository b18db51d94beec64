"""Naive decoders that the throughput harness (and the decoding tests) compare namc's cached decoding against.

Dimension letters: B pairs, T tokens, N memory positions, D width, V vocabulary.

- :func:`generate_uncached`: FDG without a KV cache: every step runs the decoder over the whole prefix, recomputes
  the cross-attention keys/values of the memory and projects every position onto the vocabulary.
- :func:`generate_reference`: the same, and it also re-encodes both images (ResNet grid + MIR) at every step.

Both return exactly what :meth:`namc.models.fdg.FDG.generate` returns with ``num_beams=1``: they are correctness
oracles for the cached decoder (tests/test_decoding.py). ``generate_reference`` is not a speed peer (no published
captioner re-encodes its images at every step); the harness compares namc's speed with the CLIP4IDC peer
(:mod:`.clip4idc`), built from that model's published architecture and decoding loop.
"""

from __future__ import annotations

import torch

from namc import ops
from namc.models.fdg import FDG
from namc.models.namc import NAMC
from namc.models.shortlist import Shortlist, greedy_ids

__all__ = ["generate_reference", "generate_uncached"]


@torch.inference_mode()
def generate_uncached(
    fdg: FDG,
    memory: torch.Tensor,
    max_new_tokens: int = 23,
    memory_mask: torch.Tensor | None = None,
    vocabulary: Shortlist | None = None,
) -> torch.Tensor:
    """Naive greedy decoding: no self-attention cache, every prefix position re-run and projected at every step.

    Args:
        fdg: the decoder.
        memory: (B, N, D) E_MIR.
        max_new_tokens: the most tokens generated after [BOS], [EOS] included.
        memory_mask: (B, N) bool, True where memory may be attended.
        vocabulary: the only tokens to generate (the full logits' columns of the list), as FDG.generate's.

    Returns:
        (B, T) generated ids without [BOS], padded with ``pad_id`` after [EOS].
    """
    if max_new_tokens + 1 > fdg.max_len:
        raise ValueError(f"max_new_tokens={max_new_tokens} needs {max_new_tokens + 1} positions > {fdg.max_len}")
    B = memory.shape[0]
    tokens = torch.full((B, 1), fdg.bos_id, dtype=torch.long, device=memory.device)
    out = torch.full((B, max_new_tokens), fdg.pad_id, dtype=torch.long, device=memory.device)
    finished = torch.zeros(B, dtype=torch.bool, device=memory.device)
    for t in range(max_new_tokens):
        logits = fdg(tokens, memory, memory_mask)  # (B, t + 1, V): every position projected
        last = logits[:, -1] if vocabulary is None else vocabulary.columns(logits[:, -1])  # (B, V or S)
        nxt = greedy_ids(last, vocabulary).masked_fill(finished, fdg.pad_id)  # (B,)
        out[:, t] = nxt
        finished |= nxt == fdg.eos_id
        if bool(finished.all()):
            break
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (B, t + 2)
    return out[:, : ops.used_length(out, fdg.pad_id)]


@torch.inference_mode()
def generate_reference(
    model: NAMC, images_1: torch.Tensor, images_2: torch.Tensor, max_new_tokens: int | None = None
) -> torch.Tensor:
    """Naive greedy decoding that re-encodes both images at every step, re-runs the decoder over the whole prefix
    without a cache and projects every position onto the vocabulary. Returns the same (B, T) ids as
    :meth:`NAMC.generate_ids` with ``num_beams=1``.
    """
    steps = max_new_tokens or model.config.max_new_tokens
    tok = model.tokenizer
    B = images_1.shape[0]
    tokens = torch.full((B, 1), tok.bos_id, dtype=torch.long, device=images_1.device)
    finished = torch.zeros(B, dtype=torch.bool, device=images_1.device)
    for _ in range(steps):
        memory = model.encode_pair(images_1, images_2)
        logits = model.fdg(tokens, memory)  # (B, t, V): every position projected
        nxt = logits[:, -1].argmax(dim=-1).masked_fill(finished, tok.pad_id)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        finished |= nxt == tok.eos_id
        if bool(finished.all()):
            break
    out = tokens[:, 1:]
    return out[:, : ops.used_length(out, tok.pad_id)]
