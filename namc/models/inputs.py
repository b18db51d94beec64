"""What :meth:`NAMC.generate <namc.models.namc.NAMC.generate>` accepts, checked before any layer runs.

A batch of the wrong size, shape or dtype otherwise fails deep in the ResNet or MIR with a shape error that names
no argument, or, worse, runs: the int8 copy broadcast batches of 2 and 1 into two captions, and uint8 pixels (as
``torchvision.io.read_image`` gives them) went through as if they were in [0, 1].
"""

from __future__ import annotations

import torch

__all__ = ["check_inputs"]

_NAMES = ("images_1", "images_2", "grid_1", "grid_2")


def check_inputs(
    image_size: int, batches: tuple[torch.Tensor | None, ...], max_new_tokens: int | None, num_beams: int
) -> int:
    """The number of pairs in ``batches``: ``(images_1, images_2, grid_1, grid_2)`` (None: not given).

    Raises:
        ValueError: a side has neither images nor grid features; an image batch is not (B, 3, S, S) floats with S
            ``image_size``; a batch is not floating point; the batches differ in size; ``max_new_tokens`` (None:
            the model's) or ``num_beams`` is below 1.
    """
    if max_new_tokens is not None and max_new_tokens < 1 or num_beams < 1:
        raise ValueError(f"max_new_tokens and num_beams must be at least 1, got {max_new_tokens} and {num_beams}")
    given = {name: t for name, t in zip(_NAMES, batches) if t is not None}
    for k in (0, 1):
        if _NAMES[k] not in given and _NAMES[k + 2] not in given:
            raise ValueError(f"give {_NAMES[k]} (or {_NAMES[k + 2]})")
    for name, t in given.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be floats in [0, 1], got {t.dtype} (divide uint8 pixels by 255)")
        if name.startswith("images") and (t.dim() != 4 or tuple(t.shape[1:]) != (3, image_size, image_size)):
            raise ValueError(f"{name} must be (B, 3, {image_size}, {image_size}) for this model, got {tuple(t.shape)}")
    sizes = {name: t.shape[0] for name, t in given.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"the batches hold different numbers of pairs: {sizes}")
    return next(iter(sizes.values()))
