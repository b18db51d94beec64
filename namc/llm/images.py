"""Images as ``data:`` URLs for chat requests, and the chat messages of one request.

The OpenAI chat format carries an image as an ``image_url`` content part; vLLM and the OpenAI API both accept a
``data:image/png;base64,...`` URL there, so the server never needs access to our files. Every image is decoded once
here (the pixel cap, then a full decode that catches truncation) so that a corrupt or missing image is a counted
failure of one item (``missing_image``, ``corrupt_image``, ``oversized_image``), never a 400 from the server or a
crash deep in a long run.

Bytes are sent unchanged when the format is one every server reads (PNG, JPEG, WebP, GIF) and the image fits
``max_side``; otherwise the image is re-encoded (PNG, or JPEG at quality 90 after a ``max_side`` resize: a 7B VLM's
token count grows with resolution, and Qwen2-VL reads any size, so the cap is optional).
"""

from __future__ import annotations

import base64
import io
import warnings
from pathlib import Path
from typing import Any

from PIL import Image

from namc.data.refs import read_ref

#: the same default cap as :data:`namc.data.transforms.MAX_IMAGE_PIXELS` (PIL's own limit)
MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS

__all__ = ["BadInput", "data_url", "image_message", "load_image"]

_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


class BadInput(ValueError):
    """An item that cannot be sent (missing or corrupt image, missing field); ``kind`` says which."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _decode(data: bytes, ref: str, max_pixels: int | None) -> Image.Image:
    """Opens and fully decodes image bytes, refusing one over ``max_pixels`` from its header first.

    The policy of :func:`namc.data.transforms.open_image` (cap checked before decoding, a full decode so a truncated
    file fails here), written against PIL alone: that module imports torch, which would add seconds to the start
    of every ``namc curate describe`` run for nothing else.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own cap below decides
        try:
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            if max_pixels is not None and width * height > max_pixels:
                raise BadInput("oversized_image", f"{ref}: {width}x{height} pixels exceeds the cap of {max_pixels}")
            img.load()
        except BadInput:
            raise
        except Image.DecompressionBombError as err:
            raise BadInput("oversized_image", f"{ref}: {err}") from None
        except (OSError, SyntaxError, ValueError, EOFError) as err:
            raise BadInput("corrupt_image", f"{ref}: not a decodable image: {err}") from None
    return img


def _rgb(img: Image.Image) -> Image.Image:
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return img.convert("RGB")


def load_image(ref: str, base: str | Path | None, max_pixels: int | None = MAX_IMAGE_PIXELS) -> Image.Image:
    """The fully decoded image a reference names (:func:`namc.data.refs.read_ref`), its format and PNG text kept.

    Raises:
        BadInput: ``missing_image``, ``corrupt_image`` or ``oversized_image``, with a one-line message naming ``ref``.
    """
    return _decode(_read(ref, base), ref, max_pixels)


def _read(ref: str, base: str | Path | None) -> bytes:
    try:
        data = read_ref(ref, base)
    except FileNotFoundError as err:
        raise BadInput("missing_image", str(err)) from None
    except OSError as err:
        raise BadInput("corrupt_image", f"{ref}: {err}") from None
    if not data:
        raise BadInput("corrupt_image", f"{ref}: empty (0 bytes), not an image")
    return data


def data_url(
    ref: str, base: str | Path | None, max_side: int | None = None, max_pixels: int | None = MAX_IMAGE_PIXELS
) -> str:
    """The image a reference names (:func:`namc.data.refs.read_ref`), as a base64 ``data:`` URL.

    Args:
        ref: a path, ``SHARD.tar::MEMBER`` or ``FILE.parquet::ROW::COLUMN``.
        base: the folder relative references start from (the folder of the JSONL that holds them).
        max_side: resize so that the longer side is at most this (None: send as is).
        max_pixels: the decoding cap (default PIL's limit, as :data:`namc.data.transforms.MAX_IMAGE_PIXELS`).

    Raises:
        BadInput: ``missing_image``, ``corrupt_image`` or ``oversized_image``, with a one-line message naming ``ref``.
    """
    data = _read(ref, base)
    img = _decode(data, ref, max_pixels)
    mime = _MIME.get(img.format or "")
    too_big = max_side is not None and max(img.size) > max_side
    if mime is None or too_big:
        img = _rgb(img)
        if too_big:
            img.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)  # type: ignore[arg-type]
        out = io.BytesIO()
        fmt = "JPEG" if too_big else "PNG"
        img.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        data, mime = out.getvalue(), _MIME[fmt]
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def image_message(text: str, urls: list[str]) -> list[dict[str, Any]]:
    """One user message: the images first (in order: first image, second image), then the instruction text.

    Qwen2-VL's chat template places images where their parts stand; images before the text is how its model card
    and vLLM's multi-image example write a multi-image question.
    """
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    parts.append({"type": "text", "text": text})
    return [{"role": "user", "content": parts}]
