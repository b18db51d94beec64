"""Caption your own image pairs: ``namc.describe(model, "before.png", "after.png")`` and ``namc describe``.

(The module is ``namc.inference``, not ``namc.describe``, so that ``namc.describe`` stays the function.)

Both take a saved model (a ``save_pretrained`` folder or a namc Lightning ``.ckpt``) through the one loader,
:func:`namc.models.load_model`, and read images through :func:`namc.data.transforms.open_image`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image

from namc.data.transforms import ImageTransform, open_image
from namc.models import NAMC, load_model

ImageLike = str | Path | Image.Image

__all__ = ["describe", "main"]


def _load(image: ImageLike, transform: ImageTransform) -> torch.Tensor:
    """(3, H, W) tensor of a PIL image or an image file; a missing or unreadable file names itself."""
    if isinstance(image, Image.Image):
        return transform(image)
    path = Path(image)
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    try:
        return transform(open_image(path))
    except (OSError, SyntaxError, ValueError) as err:
        raise OSError(f"cannot read image {path}: {err}") from err


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
        model: a :class:`NAMC` (put in eval mode here), or a ``save_pretrained`` folder or namc ``.ckpt`` to load.
        images_1: a path / PIL image, or a list of them (the "before" images).
        images_2: the "after" images, as many as ``images_1``.
        num_beams: 1 for greedy decoding (the paper), more for beam search.
        max_new_tokens: at most this many tokens (default: the model's, 23).
        batch_size: pairs per forward pass.

    Returns:
        one caption, or a list of captions when lists were given.
    """
    if not isinstance(model, NAMC):
        model = load_model(model, pretraining=False)
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


def main(argv: Sequence[str] | None = None) -> int:
    """``namc describe A.png B.png --model DIR``: caption what changed from the first image to the second."""
    parser = argparse.ArgumentParser(prog="namc describe", description="Caption the change between two image files.")
    parser.add_argument("image1", help="the first ('before') image")
    parser.add_argument("image2", help="the second ('after') image")
    parser.add_argument("--model", required=True, help="a save_pretrained folder (or a namc .ckpt)")
    parser.add_argument("--beams", type=int, default=1, help="beam width (1: greedy, as the paper)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="longest caption (default: the model's, 23)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    args = parser.parse_args(argv)
    try:
        model = load_model(args.model, pretraining=False).to(args.device)
        caption = describe(model, args.image1, args.image2, args.beams, args.max_new_tokens)
    except (OSError, ValueError) as err:  # a missing or unreadable file, a wrong model folder
        print(f"namc describe: error: {err}", file=sys.stderr)
        return 2
    print(caption)
    return 0
