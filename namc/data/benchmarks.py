"""Loaders for the four IDC benchmarks, reading their official file layouts (DESIGN.md section 5).

Every loader is a map-style ``torch.utils.data.Dataset`` whose items are::

    {"id": str, "image1": Tensor (3, H, W) float in [0, 1], "image2": Tensor (3, H, W),
     "captions": list[str], "change_type": str | None}

Layouts, and where they were checked:

- **CLEVR-Change** (Park et al. 2019, ``Seth-Park/RobustChangeCaptioning``): ``images/CLEVR_default_%06d.png``
  (before), ``sc_images/CLEVR_semantic_%06d.png`` (after, changed), ``nsc_images/CLEVR_nonsemantic_%06d.png``
  (distractor); ``splits.json`` = ``{"train": [int], "val": [...], "test": [...]}``; ``change_captions.json`` and
  ``no_change_captions.json`` keyed by the *before* file name (``"CLEVR_default_000123.png"``; see
  ``scripts/preprocess_captions.py`` and CLIP4IDC's ``dataloader_clevr_caption.py``); ``type_mapping.json`` =
  ``{type: [image ids]}`` with types ``color, material, add, drop, move`` and ids such as ``"000123.png"`` (its
  ``datasets/rcc_dataset.py`` reads them with ``int(x.split('.')[0])``). Distractor pairs (before vs nsc image,
  captions from ``no_change_captions.json``) get the type ``"no_change"``, the name ``rcc_dataset.py``'s
  ``type_to_label`` uses. Item ids follow the official evaluation (``utils/eval_utils.py``): ``"000123.png"`` for
  the change pair and ``"000123.png_n"`` for its distractor.
- **CLEVR-DC** (Kim et al. 2021, ``hsgkim/clevr-dc``): released as before/after folders plus ``split.json``; the
  preprocessing used by later work (e.g. Tu et al.'s DIRL/SMART code: ``pad_img.py``, ``rename_dc_caption.py``)
  puts them in ``images/{N}.png`` and ``sc_images/{N}.png`` with ``captions.json`` keyed by the bare number
  (``"123"``), then pads names to ``%06d.png`` and writes ``change_captions.json`` keyed ``"000123.png"``. Both
  forms are read (as are ``splits.json``/``split.json`` and ``type_mapping.json``/``type_mapping_dc.json``). Split
  values are the image numbers. Note: the README lists "Do nothing (distractor)" among the six after-scene actions,
  so about one sixth of CLEVR-DC pairs are no-change pairs (there are just no separate ``nsc_images``). Ids are
  ``"%06d.png"``.
- **Spot-the-Diff** (Jhamtani & Berg-Kirkpatrick 2018, ``harsh19/spot-the-diff``): ``annotations/{train,val,
  test}.json`` = ``[{"img_id": "5406", "sentences": [...]}, ...]``; an ``img_id`` may repeat and its sentences are
  merged (as CLIP4IDC's ``preprocess/reformat_dataset.py`` does); images ``resized_images/{img_id}.png`` and
  ``resized_images/{img_id}_2.png`` (also ``.jpg``, as ``airsplay/VisualRelationships``'
  ``process_dataset_spotdiff.py`` allows). Some entries have empty sentences (``"8069": [""]`` in val.json): empty
  strings are dropped, and an item left without captions is skipped and counted (``empty_captions``). Ids are the
  ``img_id``.
- **Image-Editing-Request** (Tan et al. 2019, ``airsplay/VisualRelationships``): ``train.json``, ``valid.json``,
  ``test.json`` = ``[{"img0": "...jpg", "img1": "...jpg", "sents": [...], "uid": "Reddit_1012"}, ...]``; the image
  names are looked up in one folder (``images/`` under the root if it exists, else the root). Ids are the ``uid``.

Bad input: a malformed annotation file (invalid JSON, a missing key, a wrong type) raises
:class:`AnnotationError` naming the file and the entry at once. A missing image is found when the dataset is built
(one directory listing per folder), skipped and counted in :attr:`issues`; a corrupt image is found when read:
with ``on_error="skip"`` (default) ``__getitem__`` counts it and returns ``None`` (the collate function drops
``None`` items), with ``on_error="raise"`` it raises naming the file.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from namc.data.issues import DataIssues, IssueKind
from namc.data.transforms import ImageTransform, open_image

__all__ = [
    "BENCHMARKS",
    "AnnotationError",
    "BenchmarkDataset",
    "ClevrChange",
    "ClevrDC",
    "ImageEditingRequest",
    "SpotTheDiff",
    "NO_CHANGE",
    "build_benchmark",
    "collate_skip_none",
]

logger = logging.getLogger(__name__)

NO_CHANGE = "no_change"
_SPLIT_ALIASES = {"valid": "val", "validation": "val", "dev": "val"}
_NUMBER_RE = re.compile(r"(\d+)(?:\.[A-Za-z]+)*$")


class AnnotationError(ValueError):
    """A benchmark annotation file is malformed; the message names the file and the entry."""


def _load_json(path: Path) -> Any:
    if not path.exists():
        raise FileNotFoundError(f"annotation file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise AnnotationError(f"{path}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None


def _image_number(name: Any, path: Path) -> int:
    """``123``, ``"123"``, ``"123.png"``, ``"000123.png"``, ``"CLEVR_default_000123.png"`` -> 123."""
    if isinstance(name, int) and not isinstance(name, bool):
        return name
    if isinstance(name, str):
        m = _NUMBER_RE.search(name.rsplit("_", 1)[-1])
        if m:
            return int(m.group(1))
    raise AnnotationError(f"{path}: cannot read an image number from entry {name!r}")


def _captions(value: Any, path: Path, entry: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise AnnotationError(f"{path}: entry {entry}: captions must be a list of strings")
    return [c.strip() for c in value if c.strip()]


def _normalise_split(split: str) -> str:
    split = _SPLIT_ALIASES.get(split, split)
    if split not in ("train", "val", "test"):
        raise ValueError(f"unknown split {split!r}; expected train, val or test")
    return split


def _listdir(folder: Path) -> set[str]:
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder not found: {folder}")
    return {e.name for e in os.scandir(folder)}


class BenchmarkDataset(Dataset):
    """Common item access: a list of ``(id, path1, path2, captions, change_type)`` entries and the transform."""

    name = "benchmark"

    def __init__(self, image_size: int | None, on_error: Literal["skip", "raise"] = "skip") -> None:
        if on_error not in ("skip", "raise"):
            raise ValueError("on_error must be 'skip' or 'raise'")
        self.transform = ImageTransform(image_size)
        self.on_error = on_error
        self.issues = DataIssues(self.name)
        self.entries: list[tuple[str, Path, Path, list[str], str | None]] = []
        self._pixels: dict[Path, np.ndarray] | None = None

    def enable_image_cache(self) -> BenchmarkDataset:
        """Keep every decoded image in memory (uint8, 3 x H x W bytes each) after its first read.

        For small datasets read many times by one process (``num_workers=0``); decoding the PNGs was about a third
        of a CPU fine-tuning step of the demo. Unreadable images are not cached: they fail (or are skipped and
        counted) at every read.
        """
        if self._pixels is None:
            self._pixels = {}
        return self

    def _load(self, path: Path) -> torch.Tensor:
        if self._pixels is None:
            return self.transform.load(path)
        pixels = self._pixels.get(path)
        if pixels is None:
            pixels = self._pixels[path] = self.transform.pixels(open_image(path))
        return self.transform.to_tensor(pixels)

    def _add(
        self,
        item_id: str,
        p1: Path,
        p2: Path,
        captions: list[str],
        change_type: str | None,
        listing: dict[Path, set[str]],
    ) -> None:
        for p in (p1, p2):
            if p.parent not in listing:
                listing[p.parent] = _listdir(p.parent)
            if p.name not in listing[p.parent]:
                self.issues.add(IssueKind.MISSING_IMAGE, str(p), f"item {item_id}")
                return
        if not captions:
            self.issues.add(IssueKind.EMPTY_CAPTIONS, item_id, "no non-empty caption")
            return
        self.entries.append((item_id, p1, p2, captions, change_type))

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> dict[str, Any] | None:
        item_id, p1, p2, captions, change_type = self.entries[index]
        try:
            image1 = self._load(p1)
            image2 = self._load(p2)
        except (OSError, SyntaxError, ValueError) as err:
            if self.on_error == "raise":
                raise OSError(f"{self.name}: cannot read image of item {item_id}: {err}") from err
            self.issues.add(IssueKind.CORRUPT_IMAGE, f"{p1} / {p2}", f"item {item_id}: {err}")
            return None
        self.issues.add_ok()
        return {
            "id": item_id,
            "image1": image1,
            "image2": image2,
            "captions": list(captions),
            "change_type": change_type,
        }

    def change_types(self) -> dict[str, int]:
        """Items per change type (``None`` counted as ``"none"``)."""
        out: dict[str, int] = {}
        for e in self.entries:
            key = e[4] or "none"
            out[key] = out.get(key, 0) + 1
        return out

    def _finish(self, root: Path, split: str) -> None:
        if self.issues.skipped:
            logger.warning("%s %s: %s", self.name, split, self.issues.summary())
        logger.info("%s %s: %d items from %s", self.name, split, len(self.entries), root)


def _read_splits(path: Path, split: str) -> list[int]:
    splits = _load_json(path)
    if not isinstance(splits, dict) or split not in splits:
        raise AnnotationError(f"{path}: missing key {split!r}")
    ids = splits[split]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise AnnotationError(f"{path}: {split!r} must be a list of integers")
    return ids


def _read_type_mapping(path: Path) -> dict[int, str]:
    mapping = _load_json(path)
    if not isinstance(mapping, dict):
        raise AnnotationError(f"{path}: expected an object {{type: [image ids]}}")
    out: dict[int, str] = {}
    for change_type, names in mapping.items():
        if not isinstance(names, list):
            raise AnnotationError(f"{path}: entry {change_type!r} must be a list of image ids")
        for name in names:
            out[_image_number(name, path)] = change_type
    return out


def _read_numbered_captions(path: Path) -> dict[int, list[str]]:
    raw = _load_json(path)
    if not isinstance(raw, dict):
        raise AnnotationError(f"{path}: expected an object {{image name: [captions]}}")
    out: dict[int, list[str]] = {}
    for key, caps in raw.items():
        n = _image_number(key, path)
        if n in out:
            raise AnnotationError(f"{path}: image number {n} appears twice (entry {key!r})")
        out[n] = _captions(caps, path, repr(key))
    return out


class ClevrChange(BenchmarkDataset):
    """CLEVR-Change: change pairs (before vs sc image) and, optionally, distractor pairs (before vs nsc image).

    Args:
        root: the dataset folder (``images/``, ``sc_images/``, ``nsc_images/``, ``splits.json``, captions files).
        split: ``train``, ``val`` or ``test``.
        image_size: side of the square output images.
        include_distractors: also yield the no-change pairs (type ``"no_change"``); True by default, as both are
            trained on and evaluated.
        on_error: ``"skip"`` (count a corrupt image and return ``None``) or ``"raise"``.
    """

    name = "clevr_change"

    def __init__(
        self,
        root: str | Path,
        split: str,
        image_size: int | None = 224,
        include_distractors: bool = True,
        on_error: Literal["skip", "raise"] = "skip",
    ) -> None:
        super().__init__(image_size, on_error)
        root = Path(root)
        split = _normalise_split(split)
        ids = _read_splits(root / "splits.json", split)
        change = _read_numbered_captions(root / "change_captions.json")
        no_change = _read_numbered_captions(root / "no_change_captions.json") if include_distractors else {}
        type_path = root / "type_mapping.json"
        types = _read_type_mapping(type_path) if type_path.exists() else {}
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


def _first_existing(root: Path, *names: str) -> Path | None:
    """``root / name`` for the first of ``names`` that exists, else None."""
    return next((root / n for n in names if (root / n).exists()), None)


class ClevrDC(BenchmarkDataset):
    """CLEVR-DC: change pairs under drastic viewpoint changes, released or padded naming (see the module docstring).

    Args:
        root: folder with ``images/``, ``sc_images/``, ``captions.json`` or ``change_captions.json``, and
            ``splits.json`` or ``split.json``; optional ``type_mapping.json`` / ``type_mapping_dc.json``.
        split: ``train``, ``val`` or ``test``.
        image_size: side of the square output images.
        on_error: ``"skip"`` or ``"raise"``.
    """

    name = "clevr_dc"

    def __init__(
        self, root: str | Path, split: str, image_size: int | None = 224, on_error: Literal["skip", "raise"] = "skip"
    ) -> None:
        super().__init__(image_size, on_error)
        root = Path(root)
        split = _normalise_split(split)
        split_path = _first_existing(root, "splits.json", "split.json")
        if split_path is None:
            raise FileNotFoundError(f"{root}: no splits.json or split.json")
        ids = _read_splits(split_path, split)
        cap_path = _first_existing(root, "change_captions.json", "captions.json")
        if cap_path is None:
            raise FileNotFoundError(f"{root}: no change_captions.json or captions.json")
        captions = _read_numbered_captions(cap_path)
        type_path = _first_existing(root, "type_mapping.json", "type_mapping_dc.json")
        types = _read_type_mapping(type_path) if type_path is not None else {}
        listing: dict[Path, set[str]] = {root / "images": _listdir(root / "images")}
        padded = any(re.fullmatch(r"\d{6}\.png", n) for n in listing[root / "images"])
        for n in ids:
            if n not in captions:
                raise AnnotationError(f"{cap_path}: no captions for image {n} (split {split})")
            fname = f"{n:06d}.png" if padded else f"{n}.png"
            self._add(
                f"{n:06d}.png", root / "images" / fname, root / "sc_images" / fname, captions[n], types.get(n), listing
            )
        self._finish(root, split)


class SpotTheDiff(BenchmarkDataset):
    """Spot-the-Diff: ``annotations/{split}.json`` and ``resized_images/`` (repeated ``img_id``s merged).

    Args:
        root: folder with ``annotations/`` and ``resized_images/``.
        split: ``train``, ``val`` or ``test``.
        image_size: side of the square output images.
        on_error: ``"skip"`` or ``"raise"``.
    """

    name = "spot_the_diff"

    def __init__(
        self, root: str | Path, split: str, image_size: int | None = 224, on_error: Literal["skip", "raise"] = "skip"
    ) -> None:
        super().__init__(image_size, on_error)
        root = Path(root)
        split = _normalise_split(split)
        path = root / "annotations" / f"{split}.json"
        data = _load_json(path)
        if not isinstance(data, list):
            raise AnnotationError(f"{path}: expected a list of {{img_id, sentences}} entries")
        merged: dict[str, list[str]] = {}
        for i, entry in enumerate(data):
            if not isinstance(entry, dict) or "img_id" not in entry or "sentences" not in entry:
                raise AnnotationError(f"{path}: entry {i} lacks 'img_id' or 'sentences'")
            img_id = str(entry["img_id"])
            merged.setdefault(img_id, []).extend(_captions(entry["sentences"], path, f"{i} (img_id {img_id})"))
        folder = root / "resized_images"
        names = _listdir(folder)
        listing = {folder: names}
        for img_id, caps in merged.items():
            p1 = next((folder / f"{img_id}{e}" for e in (".png", ".jpg") if f"{img_id}{e}" in names), None)
            p2 = next((folder / f"{img_id}_2{e}" for e in (".png", ".jpg") if f"{img_id}_2{e}" in names), None)
            self._add(img_id, p1 or folder / f"{img_id}.png", p2 or folder / f"{img_id}_2.png", caps, None, listing)
        self._finish(root, split)


class ImageEditingRequest(BenchmarkDataset):
    """Image-Editing-Request: ``{train,valid,test}.json`` with ``img0``/``img1``/``sents``/``uid`` entries.

    Args:
        root: folder with the three json files.
        split: ``train``, ``val`` (read from ``valid.json``) or ``test``.
        image_size: side of the square output images.
        image_dir: folder of the images (default: ``root/images`` if it exists, else ``root``).
        on_error: ``"skip"`` or ``"raise"``.
    """

    name = "ier"

    def __init__(
        self,
        root: str | Path,
        split: str,
        image_size: int | None = 224,
        image_dir: str | Path | None = None,
        on_error: Literal["skip", "raise"] = "skip",
    ) -> None:
        super().__init__(image_size, on_error)
        root = Path(root)
        split = _normalise_split(split)
        path = root / f"{'valid' if split == 'val' else split}.json"
        data = _load_json(path)
        if not isinstance(data, list):
            raise AnnotationError(f"{path}: expected a list of {{img0, img1, sents, uid}} entries")
        folder = Path(image_dir) if image_dir is not None else (root / "images" if (root / "images").is_dir() else root)
        listing = {folder: _listdir(folder)}
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
            caps = _captions(entry["sents"], path, f"{i} (uid {uid})")
            self._add(uid, folder / entry["img0"], folder / entry["img1"], caps, None, listing)
        self._finish(root, split)


BENCHMARKS: dict[str, type[BenchmarkDataset]] = {
    "clevr_change": ClevrChange,
    "clevr_dc": ClevrDC,
    "spot_the_diff": SpotTheDiff,
    "ier": ImageEditingRequest,
}


def build_benchmark(
    name: str, root: str | Path, split: str, image_size: int | None = 224, **kwargs: Any
) -> BenchmarkDataset:
    """Builds a benchmark dataset by name (``clevr_change``, ``clevr_dc``, ``spot_the_diff``, ``ier``).

    Args:
        name: benchmark name.
        root: the dataset folder in its official layout.
        split: ``train``, ``val`` or ``test``.
        image_size: side of the square output images.
        **kwargs: loader-specific options (``include_distractors``, ``image_dir``, ``on_error``).
    """
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose from {sorted(BENCHMARKS)}")
    return BENCHMARKS[name](root, split, image_size, **kwargs)


def collate_skip_none(batch: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Drops the ``None`` items that ``on_error="skip"`` returns for corrupt images (for a collate function)."""
    return [b for b in batch if b is not None]
