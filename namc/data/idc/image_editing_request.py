"""Image-Editing-Request (Tan et al. 2019, ``airsplay/VisualRelationships``): photo edits and their requests.

The layout: ``train.json``, ``valid.json``, ``test.json`` = ``[{"img0": "...jpg", "img1": "...jpg", "sents": [...],
"uid": "Reddit_1012"}, ...]``; the image names are looked up in one folder (``images/`` under the root if it exists,
else the root). Ids are the ``uid``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from namc.data.idc.base import AnnotationError, BenchmarkDataset, caption_list, list_folder, load_json, normalise_split
from namc.data.idc.registry import register_dataset
from namc.data.transforms import MAX_IMAGE_PIXELS

__all__ = ["ImageEditingRequest"]


@register_dataset
class ImageEditingRequest(BenchmarkDataset):
    """Image-Editing-Request: ``{train,valid,test}.json`` with ``img0``/``img1``/``sents``/``uid`` entries.

    Args:
        root: folder with the three json files.
        split: ``train``, ``val`` (read from ``valid.json``) or ``test``.
        image_size: side of the square output images.
        image_dir: folder of the images (default: ``root/images`` if it exists, else ``root``).
        on_error: ``"skip"`` or ``"raise"``.
        max_image_pixels: an image over this many pixels is skipped and counted as ``oversized_image`` (None: no
            cap; see :mod:`namc.data.transforms`).
    """

    name = "ier"
    title = "Image-Editing-Request"
    layout = "{train,valid,test}.json of img0/img1/sents/uid entries; the images in images/ or the root"
    url = "https://github.com/airsplay/VisualRelationships (Image Editing Request data link in its README)"
    marker = "train.json"

    def __init__(
        self,
        root: str | Path,
        split: str,
        image_size: int | None = 224,
        image_dir: str | Path | None = None,
        on_error: Literal["skip", "raise"] = "skip",
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    ) -> None:
        super().__init__(image_size, on_error, max_image_pixels)
        root = Path(root)
        split = normalise_split(split)
        path = root / f"{'valid' if split == 'val' else split}.json"
        data = load_json(path)
        if not isinstance(data, list):
            raise AnnotationError(f"{path}: expected a list of {{img0, img1, sents, uid}} entries")
        folder = Path(image_dir) if image_dir is not None else (root / "images" if (root / "images").is_dir() else root)
        listing = {folder: list_folder(folder)}
        seen: set[str] = set()
        for i, entry in enumerate(data):
            if not isinstance(entry, dict) or any(k not in entry for k in ("img0", "img1", "sents", "uid")):
                raise AnnotationError(f"{path}: entry {i} lacks one of 'img0', 'img1', 'sents', 'uid'")
            uid = str(entry["uid"])
            if uid in seen:
                raise AnnotationError(f"{path}: entry {i}: uid {uid!r} appears twice")
            seen.add(uid)
            if not isinstance(entry["img0"], str) or not isinstance(entry["img1"], str):
                raise AnnotationError(f"{path}: entry {i} (uid {uid}): img0/img1 must be file names")
            caps = caption_list(entry["sents"], path, f"{i} (uid {uid})")
            self._add(uid, folder / entry["img0"], folder / entry["img1"], caps, None, listing)
        self._finish(root, split)
