"""Image loading and the one data transform: any PIL image -> RGB -> bicubic resize -> float tensor in [0, 1].

Normalisation is *not* done here. The model has three image towers that want three different normalisations
(CLIP mean/std for NIM's ViT, ImageNet mean/std for the ResNet grid, [-1, 1] for the VQGAN tokenizer), so images
travel as (3, H, W) floats in [0, 1] and each tower normalises its own input.

Choices:

- **Resize** is to a square ``image_size x image_size`` with PIL's bicubic filter (which antialiases when it
  shrinks); the aspect ratio is not kept, as in the IDC benchmarks' usual preprocessing: CLEVR-Change's 480x320
  images go to 224x224 with a bicubic squash in DUDA's ``scripts/extract_features.py``
  (Seth-Park/RobustChangeCaptioning: ``imresize(img, (224, 224), interp='bicubic')``) and in CLIP4IDC's
  ``dataloaders/rawimage_util.py`` (``Resize([n_px, n_px], interpolation=BICUBIC)``, its CenterCrop commented out).
- **Alpha** (RGBA, LA, PA, palette images with a transparency entry) is composited onto a white background instead
  of being dropped, so transparent pixels do not show whatever colour happens to sit under them. CLEVR's RGBA
  renders are fully opaque, so for them this equals ``convert("RGB")``.
- **16-bit and float** grey images are scaled to 8 bits before the RGB conversion, instead of being clipped: 16-bit
  modes (``I;16*``) are divided by 257; 32-bit integers (``I``) too where a value exceeds 255 (else read as 8-bit);
  floats (``F``) whose values all lie in [0, 1] are multiplied by 255, others read as integers are.
- **EXIF orientation** is applied (``ImageOps.exif_transpose``), so a phone photo is read upright, as every viewer
  shows it: otherwise two views of one scene, one with an orientation tag and one saved rotated, would differ by a
  rotation. The benchmarks' and the shapes world's images carry no such tag, so for them nothing changes.

Image-size policy (decompression bombs): an image is refused when its width x height exceeds ``max_image_pixels``
(default :data:`MAX_IMAGE_PIXELS` = 89,478,485, PIL's own ``Image.MAX_IMAGE_PIXELS``: about 9459 x 9459, 268 MB
decoded as RGB; ``None`` lifts the cap). The size is read from the file's header *before* anything is decoded, so
a 25 kB PNG that claims 14000 x 14000 pixels costs no memory. A refused image raises :class:`ImageTooLargeError`
(naming the file, its size, the cap and how to raise it; a :class:`~namc.data.issues.RecordError` of kind
``oversized_image``, hence a ``ValueError``): datasets and corpora skip it and count it as ``oversized_image``;
``namc describe`` prints it as a one-line error (exit 1). PIL's own global limit is left as it is,
except while a caller's larger cap (or None) is in force, and for the header read that sizes an image PIL refused
outright: then it is lifted for the call under a lock and restored. PIL's ``DecompressionBombError`` (which some
formats also raise while decoding a frame or a tile) is reported as the same :class:`ImageTooLargeError`.
"""

from __future__ import annotations

import argparse
import io
import logging
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from namc.data.errors import IssueKind, RecordError

if TYPE_CHECKING:  # torch is imported where a tensor is made: image checks (curation, packing) run without it
    import torch

__all__ = ["MAX_IMAGE_PIXELS", "ImageTooLargeError", "ImageTransform", "open_image", "to_rgb"]

logger = logging.getLogger(__name__)

_WHITE = (255, 255, 255)

#: the default cap on width x height: PIL's own default ``Image.MAX_IMAGE_PIXELS`` (1024**3 // 4 // 3)
MAX_IMAGE_PIXELS: int | None = 89_478_485

_PIL_LIMIT_LOCK = threading.Lock()  # guards the scoped changes of PIL's global Image.MAX_IMAGE_PIXELS


class ImageTooLargeError(RecordError):
    """An image's width x height exceeds the pixel cap (``max_image_pixels``); nothing of it was decoded.

    A :class:`~namc.data.issues.RecordError` of kind ``oversized_image`` (so also a ``ValueError``): a dataset that
    skips bad samples counts it under that kind.

    Attributes:
        pixels: width x height as the header states it (None when only PIL's message is known).
        limit: the cap that was in force (None: PIL's own limit refused it).
    """

    def __init__(self, name: str, limit: int | None, size: tuple[int, int] | None = None, detail: str = "") -> None:
        self.pixels = size[0] * size[1] if size is not None else None
        self.limit = limit
        what = f"{size[0]}x{size[1]} = {self.pixels:,} pixels" if size is not None else detail
        cap = f"the cap of {limit:,} pixels" if limit is not None else "PIL's decompression-bomb limit"
        super().__init__(
            IssueKind.OVERSIZED_IMAGE,
            f"{name}: {what} is over {cap} (a decompression-bomb guard); if the image is trusted, raise "
            "max_image_pixels (namc describe: --max-image-pixels N, 0 for no cap)",
        )


def _check_max_pixels(max_pixels: int | None) -> None:
    if max_pixels is not None and (isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels <= 0):
        raise ValueError(f"max_image_pixels must be a positive integer or None, got {max_pixels!r}")


@contextmanager
def _lifted_pil_limit() -> Iterator[None]:
    """PIL's global decompression-bomb limit lifted for the block, under a lock, and restored."""
    with _PIL_LIMIT_LOCK:
        saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
        try:
            yield
        finally:
            Image.MAX_IMAGE_PIXELS = saved


@contextmanager
def _pil_defers_to(max_pixels: int | None) -> Iterator[None]:
    """PIL's decompression-bomb check made to defer to namc's cap ``max_pixels`` for the block.

    A cap at or below PIL's limit leaves PIL's global alone and silences PIL's warning (it only fires for images
    that namc refuses anyway); a larger cap, or None, lifts PIL's limit for the block.
    """
    pil_limit = Image.MAX_IMAGE_PIXELS
    if pil_limit is not None and (max_pixels is None or max_pixels > pil_limit):
        with _lifted_pil_limit():
            yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


def _header_size(fp: Path | io.BytesIO) -> tuple[int, int]:
    """Width and height read from the header alone (nothing is decoded), PIL's own limit lifted for the call."""
    if isinstance(fp, io.BytesIO):
        fp.seek(0)
    with _lifted_pil_limit(), Image.open(fp) as img:
        return img.size


def to_rgb(img: Image.Image) -> Image.Image:
    """Converts any PIL mode to 8-bit RGB (alpha composited onto white, 16-bit/float scaled to 8 bits)."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode.startswith("I") or mode == "F":
        arr = np.asarray(img, dtype=np.float64)
        top = arr.max() if arr.size else 0.0
        if mode.startswith("I;16") or top > 255:
            arr = arr / 257.0
        elif mode == "F" and arr.min(initial=0.0) >= 0 and top <= 1:
            arr = arr * 255.0
        img = Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), mode="L")
        return img.convert("RGB")
    if mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
        mode = "RGBA"
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, _WHITE + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def open_image(source: str | Path | bytes, max_pixels: int | None = MAX_IMAGE_PIXELS) -> Image.Image:
    """Opens and fully decodes an image from a path or from encoded bytes, refusing an oversized one first.

    Args:
        source: a file path or the encoded bytes.
        max_pixels: the cap on width x height, checked from the header before decoding (None: no cap); see the
            module docstring for the policy.

    Raises:
        FileNotFoundError: the path does not exist.
        IsADirectoryError: the path is a directory.
        ImageTooLargeError: width x height exceeds ``max_pixels`` (a ``RecordError`` of kind ``oversized_image``,
            so a ``ValueError``; nothing was decoded).
        OSError (PIL.UnidentifiedImageError included) / SyntaxError: the file is not a decodable image (empty,
            truncated, corrupt, unknown format).
    """
    _check_max_pixels(max_pixels)
    fp: Path | io.BytesIO
    if isinstance(source, bytes | bytearray | memoryview):
        name, data = "image bytes", bytes(source)
        if not data:
            raise UnidentifiedImageError(f"{name}: empty (0 bytes), not an image")
        fp = io.BytesIO(data)
    else:
        fp = Path(source)
        name = str(fp)
        if fp.is_dir():
            raise IsADirectoryError(f"{fp} is a directory, not an image file")
        if fp.is_file() and fp.stat().st_size == 0:
            raise UnidentifiedImageError(f"{fp}: empty file (0 bytes), not an image")
    with _pil_defers_to(max_pixels):
        try:
            img = Image.open(fp)
        except Image.DecompressionBombError:  # over twice PIL's limit: PIL refuses before namc sees the size
            raise ImageTooLargeError(name, max_pixels, _header_size(fp)) from None
        width, height = img.size
        if max_pixels is not None and width * height > max_pixels:
            img.close()
            raise ImageTooLargeError(name, max_pixels, (width, height))
        try:
            img.load()  # decode now, so a truncated file fails here and not later in a worker
        except Image.DecompressionBombError as err:  # raised while decoding (a GIF frame, a TIFF tile)
            raise ImageTooLargeError(name, max_pixels, detail=str(err).split(",")[0]) from None
        except (ValueError, EOFError) as err:  # some decoders' way of saying "corrupt": one error type for callers
            raise OSError(f"{name}: cannot decode: {type(err).__name__}: {err}") from err
        try:
            ImageOps.exif_transpose(img, in_place=True)  # upright, as viewers show it (module docstring)
        except (ValueError, OSError, SyntaxError) as err:  # a damaged EXIF block: the pixels as stored
            logger.debug("%s: EXIF orientation unreadable (%s), used as stored", name, err)
    return img


class ImageTransform:
    """PIL image -> RGB -> bicubic resize to ``image_size`` -> ``(3, H, W)`` float32 tensor in [0, 1].

    Args:
        image_size: side of the square output; ``None`` keeps the input size.
        max_image_pixels: :meth:`load` refuses an image whose width x height exceeds this, before decoding it
            (:class:`ImageTooLargeError`); ``None``: no cap. Default: PIL's own limit, 89,478,485.
    """

    def __init__(self, image_size: int | None, max_image_pixels: int | None = MAX_IMAGE_PIXELS) -> None:
        if image_size is not None and image_size <= 0:
            raise ValueError(f"image_size must be positive, got {image_size}")
        _check_max_pixels(max_image_pixels)
        self.image_size = image_size
        self.max_image_pixels = max_image_pixels

    def __call__(self, img: Image.Image) -> torch.Tensor:
        return self.to_tensor(self.pixels(img))

    def pixels(self, img: Image.Image) -> np.ndarray:
        """The resized RGB image as a ``(3, H, W)`` uint8 array (4x smaller than the tensor, for caches)."""
        img = to_rgb(img)
        if self.image_size is not None and img.size != (self.image_size, self.image_size):
            img = img.resize((self.image_size, self.image_size), Image.Resampling.BICUBIC)
        return np.ascontiguousarray(np.asarray(img, dtype=np.uint8).transpose(2, 0, 1))

    @staticmethod
    def to_tensor(pixels: np.ndarray) -> torch.Tensor:
        """``(3, H, W)`` uint8 pixels -> float32 tensor in [0, 1]."""
        # numpy, not torch ops: torch's intra-op threads cost ~5x on such small tensors when cores are busy
        arr = pixels.astype(np.float32, order="C")
        np.divide(arr, 255.0, out=arr)
        import torch

        return torch.from_numpy(arr)

    def load(self, source: str | Path | bytes) -> torch.Tensor:
        """Opens, decodes and transforms an image from a path or bytes (see :func:`open_image` for errors)."""
        return self(open_image(source, self.max_image_pixels))

    def __repr__(self) -> str:
        return f"ImageTransform(image_size={self.image_size}, max_image_pixels={self.max_image_pixels})"


def pixel_cap_arg(text: str) -> int | None:
    """``argparse`` type of a ``--max-image-pixels`` option: a number of pixels, 0 for no cap (None)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of pixels (0: no cap), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (no cap) or more, got {value}")
    return value or None
