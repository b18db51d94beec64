"""Preference fine-tuning objectives (ADPO, seed paper 003): the DPO margin and loss of Eq. 2 / Eq. 4, the reward of
Algorithm 1 and the REINFORCE loss of the adversarial hard-negative retriever (Eq. 7).

Dimension letters: B pairs, N grid positions, D width, T caption tokens, K candidate negatives.

The margin (Eq. 2; Eq. 4 with ``T' = T'(phi)`` drawn by the retriever)::

    M = beta log pi_theta(T | X1, X2) / pi_ref(T | X1, X2) - beta log pi_theta(T' | X1, X2) / pi_ref(T' | X1, X2)

the policy loss ``L = -log sigma(M)`` (section 4.1, Eq. 5), and the retriever's reward ``R(T') = -log sigma(M)``
(Algorithm 1, line 7): the retriever maximises the policy's loss (Eq. 6), so its REINFORCE loss is
``-(R - b) log q_phi(T' | X1, X2)`` with ``R`` and the baseline ``b`` held constant. (Algorithm 1, line 12, writes
the update as a descent step along ``R grad log q``, which would *minimise* the reward; Eq. 6 and the text say the
retriever maximises it, which is what we do.)

Every function here is pure: log-probabilities in, losses out. :func:`preference_logprobs` computes the four
log-probabilities with :func:`namc.objectives.caption.sequence_logprob`, one FDG pass per model over the stacked
positives and negatives.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from namc.models.namc import NAMC
from namc.objectives.caption import sequence_logprob

__all__ = [
    "dpo_loss",
    "dpo_margin",
    "dpo_reward",
    "leave_one_out_baseline",
    "preference_logprobs",
    "reinforce_loss",
]


def dpo_margin(
    policy_pos: torch.Tensor,
    policy_neg: torch.Tensor,
    ref_pos: torch.Tensor,
    ref_neg: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """M of Eq. 2 / Eq. 4: ``beta (log pi(T) - log ref(T)) - beta (log pi(T') - log ref(T'))``.

    Args:
        policy_pos: (B,) log pi_theta(T | X1, X2) of the true captions.
        policy_neg: (B,) log pi_theta(T' | X1, X2) of the negatives.
        ref_pos: (B,) log pi_ref(T | X1, X2) (no gradient needed).
        ref_neg: (B,) log pi_ref(T' | X1, X2).
        beta: the temperature of the preference (section 4.1).

    Returns:
        (B,) margins.
    """
    return beta * (policy_pos - ref_pos) - beta * (policy_neg - ref_neg)


def dpo_loss(margin: torch.Tensor) -> torch.Tensor:
    """(B,) ``-log sigma(M)`` (Eq. 5 before the expectation); ``ln 2`` where the policy equals the reference."""
    return -F.logsigmoid(margin)


def dpo_reward(margin: torch.Tensor) -> torch.Tensor:
    """(B,) the retriever's reward ``R(T') = -log sigma(M)`` (Algorithm 1, line 7), without gradient."""
    return -F.logsigmoid(margin.detach())


def leave_one_out_baseline(reward: torch.Tensor) -> torch.Tensor:
    """(B,) baseline of each item: the mean reward of the *other* items of the batch (0 for a batch of one).

    It does not depend on the item's own sample, so subtracting it keeps the REINFORCE estimate unbiased (section
    4.4: "a baseline can be subtracted from the reward to reduce variance"; the paper does not say which).
    """
    B = reward.shape[0]
    if B < 2:
        return torch.zeros_like(reward)
    return (reward.sum() - reward) / (B - 1)


def reinforce_loss(log_q: torch.Tensor, reward: torch.Tensor, baseline: torch.Tensor | None = None) -> torch.Tensor:
    """The retriever's REINFORCE loss (Eq. 7 with a baseline): ``mean(-(R - b) log q_phi(T'))``.

    Minimising it raises the probability of negatives whose reward is above the baseline, i.e. ascends the
    policy's loss (the max over phi of Eq. 6).

    Args:
        log_q: (B,) log q_phi(T' | X1, X2) of the sampled negatives (with gradient to the retriever).
        reward: (B,) R(T'); treated as a constant.
        baseline: (B,) or scalar, treated as a constant; None for none.
    """
    advantage = reward.detach()
    if baseline is not None:
        advantage = advantage - baseline.detach()
    return -(advantage * log_q).mean()


def _pad_to(ids: torch.Tensor, length: int, pad_id: int) -> torch.Tensor:
    """(B, T) ids right-padded with ``pad_id`` to (B, length)."""
    return F.pad(ids, (0, length - ids.shape[1]), value=pad_id) if ids.shape[1] < length else ids


def preference_logprobs(
    policy: NAMC,
    reference: NAMC,
    batch: dict[str, Any],
    negative: torch.Tensor,
    ref_memory: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """log pi_theta and log pi_ref of the true captions and of the negatives (the inputs of :func:`dpo_margin`).

    Args:
        policy: the captioner being trained.
        reference: the frozen reference (run without gradient).
        batch: ``image1``, ``image2`` (B, 3, H, W), ``caption`` (B, T) ids ``[BOS] ... [EOS] pad``; optional
            ``grid1``, ``grid2`` (B, N, C) pre-extracted grids.
        negative: (B, T') ids of the negative captions.
        ref_memory: (B, N, D) E_MIR of the reference, when the caller computed it already.

    Returns:
        ``policy_pos``, ``policy_neg`` (with gradient), ``ref_pos``, ``ref_neg`` (B,) and ``ref_memory`` (B, N, D).
    """
    pad = policy.tokenizer.pad_id
    caption = batch["caption"]
    B = caption.shape[0]
    T = max(caption.shape[1], negative.shape[1])
    ids = torch.cat([_pad_to(caption, T, pad), _pad_to(negative, T, pad)])  # (2B, T)
    args = (batch["image1"], batch["image2"], batch.get("grid1"), batch.get("grid2"))
    memory = policy.encode_pair(*args)  # (B, N, D)
    policy_lp = sequence_logprob(policy, torch.cat([memory, memory]), ids)  # (2B,)
    with torch.no_grad():
        if ref_memory is None:
            ref_memory = reference.encode_pair(*args)
        ref_lp = sequence_logprob(reference, torch.cat([ref_memory, ref_memory]), ids)
    return {
        "policy_pos": policy_lp[:B],
        "policy_neg": policy_lp[B:],
        "ref_pos": ref_lp[:B],
        "ref_neg": ref_lp[B:],
        "ref_memory": ref_memory,
    }
