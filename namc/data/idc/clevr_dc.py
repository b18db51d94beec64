"""CLEVR-DC (Kim et al. 2021, ``hsgkim/clevr-dc``): change pairs under drastic viewpoint changes.

Released as before/after folders plus ``split.json``; the preprocessing used by later work (e.g. Tu et al.'s
DIRL/SMART code: ``pad_img.py``, ``rename_dc_caption.py``) puts them in ``images/{N}.png`` and ``sc_images/{N}.png``
with ``captions.json`` keyed by the bare number (``"123"``), then pads names to ``%06d.png`` and writes
``change_captions.json`` keyed ``"000123.png"``. Both forms are read (as are ``splits.json``/``split.json`` and
``type_mapping.json``/``type_mapping_dc.json``). Split values are the image numbers. Note: the README lists "Do
nothing (distractor)" among the six after-scene actions, so about one sixth of CLEVR-DC pairs are no-change pairs
(there are just no separate ``nsc_images``). Ids are ``"%06d.png"``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from namc.data.idc.base import (
    AnnotationError,
    BenchmarkDataset,
    list_folder,
    normalise_split,
    read_numbered_captions,
    read_splits,
    read_type_mapping,
)
from namc.data.idc.registry import register_dataset
from namc.data.transforms import MAX_IMAGE_PIXELS

__all__ = ["ClevrDC"]


def _first_existing(root: Path, *names: str) -> Path | None:
    """``root / name`` for the first of ``names`` that exists, else None."""
    return next((root / n for n in names if (root / n).exists()), None)


@register_dataset
class ClevrDC(BenchmarkDataset):
    """CLEVR-DC: change pairs under drastic viewpoint changes, released or padded naming (see the module docstring).

    Args:
        root: folder with ``images/``, ``sc_images/``, ``captions.json`` or ``change_captions.json``, and
            ``splits.json`` or ``split.json``; optional ``type_mapping.json`` / ``type_mapping_dc.json``.
        split: ``train``, ``val`` or ``test``.
        image_size: side of the square output images.
        on_error: ``"skip"`` or ``"raise"``.
        max_image_pixels: an image over this many pixels is skipped and counted as ``oversized_image`` (None: no
            cap; see :mod:`namc.data.transforms`).
    """

    name = "clevr_dc"
    title = "CLEVR-DC"
    layout = "images/, sc_images/ ({N}.png or %06d.png), split(s).json, captions.json or change_captions.json"
    url = "https://github.com/hsgkim/clevr-dc"
    marker = "images"

    def __init__(
        self,
        root: str | Path,
        split: str,
        image_size: int | None = 224,
        on_error: Literal["skip", "raise"] = "skip",
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    ) -> None:
        super().__init__(image_size, on_error, max_image_pixels)
        root = Path(root)
        split = normalise_split(split)
        split_path = _first_existing(root, "splits.json", "split.json")
        if split_path is None:
            raise FileNotFoundError(f"{root}: no splits.json or split.json")
        ids = read_splits(split_path, split)
        cap_path = _first_existing(root, "change_captions.json", "captions.json")
        if cap_path is None:
            raise FileNotFoundError(f"{root}: no change_captions.json or captions.json")
        captions = read_numbered_captions(cap_path)
        type_path = _first_existing(root, "type_mapping.json", "type_mapping_dc.json")
        types = read_type_mapping(type_path) if type_path is not None else {}
        listing: dict[Path, set[str]] = {root / "images": list_folder(root / "images")}
        padded = any(re.fullmatch(r"\d{6}\.png", n) for n in listing[root / "images"])
        for n in ids:
            if n not in captions:
                raise AnnotationError(f"{cap_path}: no captions for image {n} (split {split})")
            fname = f"{n:06d}.png" if padded else f"{n}.png"
            self._add(
                f"{n:06d}.png", root / "images" / fname, root / "sc_images" / fname, captions[n], types.get(n), listing
            )
        self._finish(root, split)
