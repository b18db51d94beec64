"""CLEVR-Change (Park et al. 2019, ``Seth-Park/RobustChangeCaptioning``): change pairs and distractor pairs.

The layout: ``images/CLEVR_default_%06d.png`` (before), ``sc_images/CLEVR_semantic_%06d.png`` (after, changed),
``nsc_images/CLEVR_nonsemantic_%06d.png`` (distractor); ``splits.json`` = ``{"train": [int], "val": [...], "test":
[...]}``; ``change_captions.json`` and ``no_change_captions.json`` keyed by the *before* file name
(``"CLEVR_default_000123.png"``; see ``scripts/preprocess_captions.py`` and CLIP4IDC's
``dataloader_clevr_caption.py``); ``type_mapping.json`` = ``{type: [image ids]}`` with types ``color, material, add,
drop, move`` and ids such as ``"000123.png"`` (its ``datasets/rcc_dataset.py`` reads them with
``int(x.split('.')[0])``). Distractor pairs (before vs nsc image, captions from ``no_change_captions.json``) get the
type ``"no_change"``, the name ``rcc_dataset.py``'s ``type_to_label`` uses. Item ids follow the official evaluation
(``utils/eval_utils.py``): ``"000123.png"`` for the change pair and ``"000123.png_n"`` for its distractor.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from namc.data.idc.base import (
    NO_CHANGE,
    AnnotationError,
    BenchmarkDataset,
    normalise_split,
    read_numbered_captions,
    read_splits,
    read_type_mapping,
)
from namc.data.idc.registry import register_dataset
from namc.data.transforms import MAX_IMAGE_PIXELS

__all__ = ["ClevrChange"]

logger = logging.getLogger(__name__)


@register_dataset
class ClevrChange(BenchmarkDataset):
    """CLEVR-Change: change pairs (before vs sc image) and, optionally, distractor pairs (before vs nsc image).

    Args:
        root: the dataset folder (``images/``, ``sc_images/``, ``nsc_images/``, ``splits.json``, captions files).
        split: ``train``, ``val`` or ``test``.
        image_size: side of the square output images.
        include_distractors: also yield the no-change pairs (type ``"no_change"``); True by default, as both are
            trained on and evaluated.
        on_error: ``"skip"`` (count a corrupt image and return ``None``) or ``"raise"``.
        max_image_pixels: an image over this many pixels is skipped and counted as ``oversized_image`` (None: no
            cap; see :mod:`namc.data.transforms`).
    """

    name = "clevr_change"
    title = "CLEVR-Change"
    layout = "images/, sc_images/, nsc_images/ (CLEVR_*_%06d.png), splits.json, {change,no_change}_captions.json"
    url = "https://github.com/Seth-Park/RobustChangeCaptioning (the dataset link in its README)"
    marker = "images"

    def __init__(
        self,
        root: str | Path,
        split: str,
        image_size: int | None = 224,
        include_distractors: bool = True,
        on_error: Literal["skip", "raise"] = "skip",
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    ) -> None:
        super().__init__(image_size, on_error, max_image_pixels)
        root = Path(root)
        split = normalise_split(split)
        ids = read_splits(root / "splits.json", split)
        change = read_numbered_captions(root / "change_captions.json")
        no_change = read_numbered_captions(root / "no_change_captions.json") if include_distractors else {}
        type_path = root / "type_mapping.json"
        types = read_type_mapping(type_path) if type_path.exists() else {}
        if not type_path.exists():
            logger.warning("%s: no type_mapping.json; change_type is None for change pairs", root)
        listing: dict[Path, set[str]] = {}
        for n in ids:
            before = root / "images" / f"CLEVR_default_{n:06d}.png"
            if n not in change:
                raise AnnotationError(f"{root / 'change_captions.json'}: no entry for {before.name} (split {split})")
            self._add(
                f"{n:06d}.png",
                before,
                root / "sc_images" / f"CLEVR_semantic_{n:06d}.png",
                change[n],
                types.get(n),
                listing,
            )
            if include_distractors:
                if n not in no_change:
                    raise AnnotationError(f"{root / 'no_change_captions.json'}: no entry for {before.name}")
                self._add(
                    f"{n:06d}.png_n",
                    before,
                    root / "nsc_images" / f"CLEVR_nonsemantic_{n:06d}.png",
                    no_change[n],
                    NO_CHANGE,
                    listing,
                )
        self._finish(root, split)
