"""Captioning objectives over a :class:`~namc.models.namc.NAMC`: next-token cross-entropy (fine-tuning, and FDG's
term in pre-training) and per-sequence log-probabilities (preference training, likelihood-based evaluation)."""

from __future__ import annotations

from typing import Any

import torch

from namc import ops
from namc.models.namc import NAMC

__all__ = ["caption_loss", "finetune_step", "sequence_logprob"]


def caption_loss(
    model: NAMC, caption: torch.Tensor, memory: torch.Tensor, ignore: torch.Tensor | None = None
) -> torch.Tensor:
    """Next-token CE of (B, T) ``caption`` ([BOS] ... [EOS] pad) given (B, N, D) memory; padding after [EOS] and
    positions where (B, T) ``ignore`` is True are not targets."""
    inputs, targets = ops.next_token_targets(caption, model.tokenizer.eos_id, ignore)
    return ops.caption_ce(model.fdg(inputs, memory), targets)


def finetune_step(model: NAMC, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One fine-tuning forward pass: MIR interaction + FDG on a reference caption (no masks, no NIM).

    Args:
        model: the captioner (NIM and the VQGAN are not used).
        batch: ``image1``, ``image2`` (B, 3, H, W) in [0, 1]; ``caption`` (B, T) ids ``[BOS] ... [EOS] pad``;
            optional ``grid1``, ``grid2`` (B, N, C) pre-extracted grid features.

    Returns:
        ``loss`` and ``fdg`` (the same scalar).
    """
    memory = model.encode_pair(batch["image1"], batch["image2"], batch.get("grid1"), batch.get("grid2"))
    loss = caption_loss(model, batch["caption"], memory)
    return {"loss": loss, "fdg": loss.detach()}


def sequence_logprob(model: NAMC, memory: torch.Tensor, ids: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """log pi(T | X1, X2): the summed log-probability FDG gives each caption (its [EOS] included, [BOS] not).

    Args:
        model: the captioner.
        memory: (B, N, D) E_MIR of the pairs (:meth:`NAMC.encode_pair`).
        ids: (B, T) caption ids ``[BOS] ... [EOS] pad``.
        normalize: divide by the number of scored tokens (length-normalised, for choosing among candidates).

    Returns:
        (B,) log-probabilities, differentiable (wrap in ``torch.no_grad()`` for evaluation).
    """
    inputs, targets = ops.next_token_targets(ids, model.tokenizer.eos_id)
    return ops.sequence_logprobs(model.fdg(inputs, memory), targets, normalize)
