"""The paper's optimisation (appendix F), stated once: learning rates per parameter group and the cosine schedule.

Adam; pre-training: NIM lr 1e-4 with a cosine decay to 1e-5, MIR + FDG 3e-4 to 1e-4; fine-tuning: MIR + FDG 2e-4
(the paper gives no minimum for fine-tuning; we decay to 1e-4, the pre-training MIR/FDG minimum). The Lightning
modules take these as their defaults and the throughput harness times steps with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["FINETUNE_LR", "PREFERENCE_LR", "PRETRAIN_LR", "CosineSchedule", "GroupLR", "optimizer_groups"]


@dataclass(frozen=True)
class GroupLR:
    """Initial and final learning rate of one parameter group (``NAMC.param_groups`` names the groups)."""

    lr: float
    min_lr: float


PRETRAIN_LR: dict[str, GroupLR] = {"nim": GroupLR(1e-4, 1e-5), "mir_fdg": GroupLR(3e-4, 1e-4)}  # appendix F
FINETUNE_LR: dict[str, GroupLR] = {"mir_fdg": GroupLR(2e-4, 1e-4)}  # appendix F (lr); the minimum is ours
#: ADPO section 5: the captioner's lr 3e-6 to 5e-6 (for a 3B MLLM) and the retriever's 1e-4.
PREFERENCE_LR: dict[str, float] = {"policy": 5e-6, "retriever": 1e-4}


def optimizer_groups(param_groups: dict[str, list[nn.Parameter]], rates: dict[str, GroupLR]) -> list[dict[str, object]]:
    """Optimiser parameter groups (``name``, ``params``, ``lr``, ``min_lr``) for the groups named in ``rates``.

    Groups without trainable parameters are left out (a frozen NIM, a model without pre-training modules).
    """
    groups = []
    for name, rate in rates.items():
        params = param_groups.get(name, [])
        if params:
            groups.append({"name": name, "params": params, "lr": rate.lr, "min_lr": rate.min_lr})
    return groups


class CosineSchedule:
    """LR multiplier for ``LambdaLR``: linear warm-up, then a half cosine from 1 down to ``min_ratio``.

    A callable object (not a lambda) so ``LambdaLR.state_dict()`` stores its plain attributes.

    Args:
        total_steps: optimiser steps of the whole run.
        warmup_steps: steps of linear warm-up from 0 (0: none).
        min_ratio: final lr / initial lr (e.g. 1e-5 / 1e-4 = 0.1 for NIM, appendix F).
    """

    def __init__(self, total_steps: int, warmup_steps: int = 0, min_ratio: float = 0.0) -> None:
        self.total_steps = max(int(total_steps), 1)
        self.warmup_steps = max(int(warmup_steps), 0)
        self.min_ratio = float(min_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def adam_with_cosine(
    groups: list[dict[str, object]], total_steps: int, warmup_steps: int = 0, weight_decay: float = 0.0
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam over ``groups`` (from :func:`optimizer_groups`) with a per-group cosine schedule stepped per step."""
    optimizer = torch.optim.Adam(
        [{"params": g["params"], "lr": g["lr"], "name": g["name"]} for g in groups], weight_decay=weight_decay
    )
    lambdas = [CosineSchedule(total_steps, warmup_steps, g["min_lr"] / g["lr"]) for g in groups]
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)
