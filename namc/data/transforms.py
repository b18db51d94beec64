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
- **16-bit and float** grey images (modes ``I;16*``, ``I``, ``F``) are scaled to 8 bits (values above 255 are read
  as 16-bit and divided by 257) before the RGB conversion, instead of being clipped.
- No EXIF rotation: the benchmark and corpus images are used as stored.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image

__all__ = ["ImageTransform", "open_image", "to_rgb"]

_WHITE = (255, 255, 255)


def to_rgb(img: Image.Image) -> Image.Image:
    """Converts any PIL mode to 8-bit RGB (alpha composited onto white, 16-bit/float scaled to 8 bits)."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode.startswith("I") or mode == "F":
        arr = np.asarray(img, dtype=np.float64)
        if arr.size and arr.max() > 255:
            arr = arr / 257.0
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


def open_image(source: str | Path | bytes) -> Image.Image:
    """Opens and fully decodes an image from a path or from encoded bytes.

    Raises:
        FileNotFoundError: the path does not exist.
        OSError / PIL.UnidentifiedImageError / SyntaxError / ValueError: the file is not a decodable image
            (truncated, corrupt, unknown format).
    """
    if isinstance(source, bytes | bytearray | memoryview):
        img = Image.open(io.BytesIO(bytes(source)))
    else:
        img = Image.open(Path(source))
    img.load()  # decode now, so a truncated file fails here and not later in a worker
    return img


class ImageTransform:
    """PIL image -> RGB -> bicubic resize to ``image_size`` -> ``(3, H, W)`` float32 tensor in [0, 1].

    Args:
        image_size: side of the square output; ``None`` keeps the input size.
    """

    def __init__(self, image_size: int | None) -> None:
        if image_size is not None and image_size <= 0:
            raise ValueError(f"image_size must be positive, got {image_size}")
        self.image_size = image_size

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
        return torch.from_numpy(arr)

    def load(self, source: str | Path | bytes) -> torch.Tensor:
        """Opens, decodes and transforms an image from a path or bytes (see :func:`open_image` for errors)."""
        return self(open_image(source))

    def __repr__(self) -> str:
        return f"ImageTransform(image_size={self.image_size})"
