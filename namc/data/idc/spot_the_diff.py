"""Spot-the-Diff (Jhamtani & Berg-Kirkpatrick 2018, ``harsh19/spot-the-diff``): pairs of surveillance frames.

The layout: ``annotations/{train,val,test}.json`` = ``[{"img_id": "5406", "sentences": [...]}, ...]``; an ``img_id``
may repeat and its sentences are merged (as CLIP4IDC's ``preprocess/reformat_dataset.py`` does); images
``resized_images/{img_id}.png`` and ``resized_images/{img_id}_2.png`` (also ``.jpg``, as
``airsplay/VisualRelationships``' ``process_dataset_spotdiff.py`` allows). Some entries have empty sentences
(``"8069": [""]`` in val.json): empty strings are dropped, and an item left without captions is skipped and counted
(``empty_captions``). Ids are the ``img_id``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from namc.data.idc.base import AnnotationError, BenchmarkDataset, caption_list, list_folder, load_json, normalise_split
from namc.data.idc.registry import register_dataset
from namc.data.transforms import MAX_IMAGE_PIXELS

__all__ = ["SpotTheDiff"]


@register_dataset
class SpotTheDiff(BenchmarkDataset):
    """Spot-the-Diff: ``annotations/{split}.json`` and ``resized_images/`` (repeated ``img_id``s merged).

    Args:
        root: folder with ``annotations/`` and ``resized_images/``.
        split: ``train``, ``val`` or ``test``.
        image_size: side of the square output images.
        on_error: ``"skip"`` or ``"raise"``.
        max_image_pixels: an image over this many pixels is skipped and counted as ``oversized_image`` (None: no
            cap; see :mod:`namc.data.transforms`).
    """

    name = "spot_the_diff"
    title = "Spot-the-Diff"
    layout = "annotations/{train,val,test}.json and resized_images/{img_id}.png, {img_id}_2.png"
    url = "https://github.com/harsh19/spot-the-diff (annotations in the repository, images from its README link)"
    marker = "annotations"

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
        path = root / "annotations" / f"{split}.json"
        data = load_json(path)
        if not isinstance(data, list):
            raise AnnotationError(f"{path}: expected a list of {{img_id, sentences}} entries")
        merged: dict[str, list[str]] = {}
        for i, entry in enumerate(data):
            if not isinstance(entry, dict) or "img_id" not in entry or "sentences" not in entry:
                raise AnnotationError(f"{path}: entry {i} lacks 'img_id' or 'sentences'")
            img_id = str(entry["img_id"])
            merged.setdefault(img_id, []).extend(caption_list(entry["sentences"], path, f"{i} (img_id {img_id})"))
        folder = root / "resized_images"
        names = list_folder(folder)
        listing = {folder: names}
        for img_id, caps in merged.items():
            p1 = next((folder / f"{img_id}{e}" for e in (".png", ".jpg") if f"{img_id}{e}" in names), None)
            p2 = next((folder / f"{img_id}_2{e}" for e in (".png", ".jpg") if f"{img_id}_2{e}" in names), None)
            self._add(img_id, p1 or folder / f"{img_id}.png", p2 or folder / f"{img_id}_2.png", caps, None, listing)
        self._finish(root, split)
