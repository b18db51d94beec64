"""Caption your own image pairs: ``namc.describe(model, "before.png", "after.png")``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image

from namc.data.transforms import ImageTransform, open_image
from namc.models.namc import NAMC

ImageLike = str | Path | Image.Image


def _load(image: ImageLike, transform: ImageTransform) -> torch.Tensor:
    img = image if isinstance(image, Image.Image) else open_image(image)
    return transform(img)


def describe(
    model: NAMC | str | Path,
    images_1: ImageLike | Sequence[ImageLike],
    images_2: ImageLike | Sequence[ImageLike],
    num_beams: int = 1,
    max_new_tokens: int | None = None,
    batch_size: int = 32,
) -> str | list[str]:
    """Say what changed between image pairs.

    Any PIL mode is converted to RGB and every image is resized to the model's ``image_size``.

    Args:
        model: a :class:`NAMC` (put in eval mode here) or a folder written by ``save_pretrained``.
        images_1: a path / PIL image, or a list of them (the "before" images).
        images_2: the "after" images, as many as ``images_1``.
        num_beams: 1 for greedy decoding (the paper), more for beam search.
        max_new_tokens: at most this many tokens (default: the model's, 23).
        batch_size: pairs per forward pass.

    Returns:
        one caption, or a list of captions when lists were given.
    """
    if not isinstance(model, NAMC):
        model = NAMC.from_pretrained(model)
    model.eval()
    single = isinstance(images_1, (str, Path, Image.Image))
    firsts = [images_1] if single else list(images_1)
    seconds = [images_2] if single else list(images_2)
    if len(firsts) != len(seconds):
        raise ValueError(f"{len(firsts)} first images but {len(seconds)} second images")
    transform = ImageTransform(model.config.image_size)
    device = next(model.parameters()).device
    captions: list[str] = []
    for start in range(0, len(firsts), batch_size):
        a = torch.stack([_load(x, transform) for x in firsts[start : start + batch_size]]).to(device)
        b = torch.stack([_load(x, transform) for x in seconds[start : start + batch_size]]).to(device)
        captions += model.generate(a, b, max_new_tokens=max_new_tokens, num_beams=num_beams)
    return captions[0] if single else captions
