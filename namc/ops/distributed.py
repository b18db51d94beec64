"""Collectives for DDP training: an all-gather that keeps gradients, and gathering Python objects.

The NIM loss (SDM, appendix E.1) contrasts every image of a global batch with every text of it, so each rank needs
the other ranks' embeddings as negatives, *with* gradient: ``torch.distributed.nn.functional.all_gather`` returns
the gathered tensors in the autograd graph, and its backward sends each rank the gradient of its own rows summed
over all ranks. Every rank then computes the same global loss; DDP's gradient averaging over W ranks turns the W
copies of ``dL/d(own rows)`` back into exactly the single-process gradient of that global loss.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_with_grad", "broadcast_object", "distributed_ready", "gather_objects", "world"]


def distributed_ready() -> bool:
    """Whether ``torch.distributed`` is initialised with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world() -> tuple[int, int]:
    """``(rank, world_size)``; ``(0, 1)`` without ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate a (B_r, ...) tensor from every rank along dim 0, differentiably.

    Ranks may hold different B_r and different trailing sizes (e.g. token ids padded to each rank's longest
    description): every dimension is zero-padded to the largest size first, and rows and trailing padding beyond a
    rank's real size are dropped again after the gather, so only dimension 0 keeps every rank's rows. Integer and
    bool tensors are gathered as they are (without gradient); float ids work too.

    Args:
        tensor: (B_r, ...) on this rank.

    Returns:
        (sum_r B_r, ...) in rank order; ``tensor`` itself without ``torch.distributed``. Trailing dimensions are
        padded with zeros to the largest size over ranks.
    """
    if not distributed_ready():
        return tensor
    from torch.distributed.nn.functional import all_gather

    world_size = dist.get_world_size()
    shape = torch.tensor(tensor.shape, dtype=torch.long, device=tensor.device)
    shapes = [torch.zeros_like(shape) for _ in range(world_size)]
    dist.all_gather(shapes, shape)
    sizes = torch.stack(shapes)  # (W, ndim)
    full = sizes.max(dim=0).values.tolist()
    pad: list[int] = []
    for have, want in zip(reversed(tensor.shape), reversed(full)):
        pad += [0, want - have]
    padded = torch.nn.functional.pad(tensor, pad) if any(pad) else tensor
    if padded.is_floating_point():
        with warnings.catch_warnings():
            # deprecated in favour of the private _functional_collectives, whose autograd backward needs a
            # reduce-scatter that gloo lacks; this one falls back to all-to-all on gloo
            warnings.simplefilter("ignore", FutureWarning)
            parts = all_gather(padded.contiguous())
    else:  # integer tensors carry no gradient; the plain collective is enough
        parts = [torch.empty_like(padded) for _ in range(world_size)]
        dist.all_gather(parts, padded.contiguous())
    rows = sizes[:, 0].tolist()
    return torch.cat([part[:n] for part, n in zip(parts, rows)], dim=0)


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable, e.g. lists of captions) in rank order; ``[obj]`` on one process.

    Every rank must call it (it is a collective).
    """
    if not distributed_ready():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` of rank ``src`` on every rank (itself on one process)."""
    if not distributed_ready():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
