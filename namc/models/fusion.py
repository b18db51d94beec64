"""MIR fusion blocks: how the two co-attended image streams become one memory ``E_MIR`` for FDG.

Dimension letters: B pairs, N grid positions, D width.

A fusion block is an ``nn.Module`` built as ``cls(dim)`` whose forward takes the final (B, N, D) states of the two
streams, ``forward(x1, x2) -> (B, N, D)``. A block that sets ``multi_scale = True`` also receives ``layers``: the
list of (x1, x2) outputs of every MIR layer (before MIR's final LayerNorm), for blocks that fuse several depths.
Register a block with ``@register_fusion("name")`` and pick it with ``NAMCConfig.fusion = "name"`` (like timm's
``get_attn``): the block is one class and one registry line.

``concat`` is the paper's: ``E_MIR = FC([Y1; Y2])`` (section 3.2.2). It *is* an ``nn.Linear(2D, D)`` so its
parameters keep the names every saved model has (``mir.fuse.weight``, ``mir.fuse.bias``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["ConcatFusion", "create_fusion", "list_fusions", "register_fusion"]

_FUSIONS: dict[str, type[nn.Module]] = {}


def register_fusion(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: make a fusion block available as ``NAMCConfig.fusion = name``."""

    def add(cls: type[nn.Module]) -> type[nn.Module]:
        if name in _FUSIONS:
            raise ValueError(f"a fusion block named {name!r} is already registered ({_FUSIONS[name].__name__})")
        _FUSIONS[name] = cls
        return cls

    return add


def list_fusions() -> list[str]:
    """Names of the registered fusion blocks."""
    return sorted(_FUSIONS)


def create_fusion(name: str, dim: int) -> nn.Module:
    """Build the fusion block ``name`` for width ``dim``."""
    if name not in _FUSIONS:
        raise ValueError(f"unknown MIR fusion {name!r}; registered: {list_fusions()}")
    return _FUSIONS[name](dim)


@register_fusion("concat")
class ConcatFusion(nn.Linear):
    """The paper's fusion: concatenate the two streams per position and project back to D (an FC, section 3.2.2)."""

    multi_scale = False

    def __init__(self, dim: int) -> None:
        super().__init__(2 * dim, dim)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(torch.cat([x1, x2], dim=-1))  # (B, N, 2D) -> (B, N, D)
