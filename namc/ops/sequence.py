"""Token sequences: where a token first occurs, next-token targets, and per-sequence log-probabilities.

Dimension letters: B sequences, T positions, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100  # the target id that cross-entropy and the log-probabilities skip


def first_index(ids: torch.Tensor, value: int) -> torch.Tensor:
    """(B,) position of the first ``value`` in each row of (B, T) ``ids`` (T - 1 when absent)."""
    hit = ids == value
    pos = hit.int().argmax(dim=1)
    return torch.where(hit.any(dim=1), pos, torch.full_like(pos, ids.shape[1] - 1))


def used_length(ids: torch.Tensor, pad_id: int) -> int:
    """Columns of (B, T) ``ids`` up to the last non-padding token in any row (at least 1)."""
    used = (ids != pad_id).any(dim=0).nonzero()
    return int(used.max()) + 1 if used.numel() else 1


def next_token_targets(
    ids: torch.Tensor, eos_id: int, ignore: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forcing inputs and targets of (B, T) ``ids`` (``[BOS] ... [EOS] pad``).

    Args:
        ids: (B, T) token ids.
        eos_id: the end token; every target after the first [EOS] of a row is ignored (padding).
        ignore: (B, T) bool, True at positions of ``ids`` that must not be targets (e.g. [MASK]ed words).

    Returns:
        ``(inputs, targets)``, both (B, T - 1); ignored targets are :data:`IGNORE`.
    """
    inputs, targets = ids[:, :-1], ids[:, 1:].clone()  # (B, T - 1)
    ar = torch.arange(targets.shape[1], device=ids.device)[None]
    skip = ar > first_index(targets, eos_id)[:, None]
    if ignore is not None:
        skip |= ignore[:, 1:]
    targets[skip] = IGNORE
    return inputs, targets


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, T) log-probability of each target under (B, T, V) ``logits``; 0 where the target is :data:`IGNORE`."""
    keep = targets != IGNORE
    logp = F.log_softmax(logits.float(), dim=-1).gather(-1, targets.clamp_min(0)[..., None])[..., 0]  # (B, T)
    return logp * keep


def sequence_logprobs(logits: torch.Tensor, targets: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """(B,) summed log-probability of each row's targets; ``normalize`` divides by the number of targets."""
    total = token_logprobs(logits, targets).sum(dim=1)
    if normalize:
        total = total / (targets != IGNORE).sum(dim=1).clamp_min(1)
    return total
