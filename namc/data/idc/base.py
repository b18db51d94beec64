"""The base of the image difference captioning (IDC) datasets: :class:`BenchmarkDataset` and shared JSON helpers.

Every loader is a map-style ``torch.utils.data.Dataset`` whose items are::

    {"id": str, "image1": Tensor (3, H, W) float in [0, 1], "image2": Tensor (3, H, W),
     "captions": list[str], "change_type": str | tuple[str, ...] | None}   # a tuple: several types (OmniDiff)

Bad input: a malformed annotation file (not UTF-8, invalid JSON, a missing key, a wrong type) raises
:class:`AnnotationError` naming the file and the line or entry at once. A missing image is found when the dataset
is built (one directory listing per folder), skipped and counted in :attr:`BenchmarkDataset.issues`; a corrupt
image (empty, truncated, not an image, a directory) or one over ``max_image_pixels`` (``oversized_image``, see
:mod:`namc.data.transforms`) is found when read: with ``on_error="skip"`` (default) ``__getitem__`` counts it and
returns ``None`` (the collate wrapper :class:`namc.data.collate.SkipNone` drops ``None`` items), with
``on_error="raise"`` it raises naming the file.

The counts are per item, so the skip rate means the same after one epoch or forty: a missing image is counted once
when the dataset is built, and an item read from its files is counted once, in whichever DataLoader worker reads it
(a shared-memory byte per item records how): accepted, or skipped from the first read that fails (an item that read
well and then fails, its file changed, moves from accepted to skipped and is logged).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from namc.data.issues import DataIssues, IssueKind
from namc.data.transforms import MAX_IMAGE_PIXELS, ImageTooLargeError, ImageTransform, open_image
from namc.jsonl import JSONError, loads

__all__ = [
    "NO_CHANGE",
    "AnnotationError",
    "BenchmarkDataset",
    "caption_list",
    "list_folder",
    "load_json",
    "normalise_split",
    "read_numbered_captions",
    "read_splits",
    "read_type_mapping",
]

logger = logging.getLogger(__name__)

NO_CHANGE = "no_change"
_SPLIT_ALIASES = {"valid": "val", "validation": "val", "dev": "val"}
_NUMBER_RE = re.compile(r"(\d+)(?:\.[A-Za-z]+)*$")


class AnnotationError(ValueError):
    """A benchmark annotation file is malformed; the message names the file and the entry."""


def load_json(path: Path) -> Any:
    """The decoded JSON file; FileNotFoundError if absent, :class:`AnnotationError` naming the file (and the position)
    if it is not UTF-8, not JSON, nested deeper than :data:`namc.jsonl.MAX_DEPTH` or holds an object naming one
    key twice."""
    if not path.exists():
        raise FileNotFoundError(f"annotation file not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        column = err.start - raw.rfind(b"\n", 0, err.start)
        raise AnnotationError(
            f"{path}: not UTF-8: byte 0x{raw[err.start]:02x} at line {line}, column {column}: save the file as UTF-8"
        ) from None
    try:
        return loads(text, max_chars=None)  # a whole annotation file: its size is the dataset's; depth is bounded
    except JSONError as err:  # invalid, too deep, or an entry naming one key twice
        raise AnnotationError(f"{path}: {err}") from None


def image_number(name: Any, path: Path) -> int:
    """``123``, ``"123"``, ``"123.png"``, ``"000123.png"``, ``"CLEVR_default_000123.png"`` -> 123."""
    if isinstance(name, int) and not isinstance(name, bool):
        return name
    if isinstance(name, str):
        m = _NUMBER_RE.search(name.rsplit("_", 1)[-1])
        if m:
            return int(m.group(1))
    raise AnnotationError(f"{path}: cannot read an image number from entry {name!r}")


def caption_list(value: Any, path: Path, entry: str) -> list[str]:
    """The stripped non-empty captions of one entry (``value`` must be a list of strings)."""
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise AnnotationError(f"{path}: entry {entry}: captions must be a list of strings")
    return [c.strip() for c in value if c.strip()]


def normalise_split(split: str) -> str:
    """``train``, ``val`` or ``test`` (``valid``, ``validation`` and ``dev`` mean ``val``)."""
    split = _SPLIT_ALIASES.get(split, split)
    if split not in ("train", "val", "test"):
        raise ValueError(f"unknown split {split!r}; expected train, val or test")
    return split


def list_folder(folder: Path) -> set[str]:
    """The names in an image folder (one listing, to check many images at once)."""
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder not found: {folder}")
    return {e.name for e in os.scandir(folder)}


_UNCOUNTED, _ACCEPTED, _SKIPPED = 0, 1, 2  # BenchmarkDataset._counted


class BenchmarkDataset(Dataset):
    """Common item access: a list of ``(id, path1, path2, captions, change_type)`` entries and the transform.

    A loader registered with :func:`namc.data.idc.registry.register_dataset` sets the class attributes below:
    ``name`` (its registry name), ``title``, a one-line ``layout``, and the download hint ``url`` and ``marker``
    (a path under the root that exists once the dataset is unpacked).
    """

    name: ClassVar[str] = "benchmark"
    title: ClassVar[str] = ""
    layout: ClassVar[str] = ""
    url: ClassVar[str] = ""
    marker: ClassVar[str] = ""

    def __init__(
        self,
        image_size: int | None,
        on_error: Literal["skip", "raise"] = "skip",
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    ) -> None:
        if on_error not in ("skip", "raise"):
            raise ValueError("on_error must be 'skip' or 'raise'")
        self.transform = ImageTransform(image_size, max_image_pixels)
        self.on_error = on_error
        self.issues = DataIssues(self.name)
        self.entries: list[tuple[str, Path, Path, list[str], str | None]] = []
        self._pixels: dict[Path, np.ndarray] | None = None
        self._counted: torch.Tensor | None = None  # (len(entries),) uint8, shared: _UNCOUNTED, _ACCEPTED, _SKIPPED

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
            pixels = self._pixels[path] = self.transform.pixels(open_image(path, self.transform.max_image_pixels))
        return self.transform.to_tensor(pixels)

    def _add(
        self,
        item_id: str,
        p1: Path,
        p2: Path,
        captions: list[str],
        change_type: str | tuple[str, ...] | None,
        listing: dict[Path, set[str]],
    ) -> None:
        for p in (p1, p2):
            if p.parent not in listing:
                listing[p.parent] = list_folder(p.parent)
            if p.name not in listing[p.parent]:
                self.issues.add(IssueKind.MISSING_IMAGE, str(p), f"item {item_id}")
                return
        if not captions:
            self.issues.add(IssueKind.EMPTY_CAPTIONS, item_id, "no non-empty caption")
            return
        self.entries.append((item_id, p1, p2, captions, change_type))

    def __len__(self) -> int:
        return len(self.entries)

    def _count(self, index: int, ok: bool) -> bool:
        """Counts item ``index`` as accepted or skipped unless it already is (by any worker); returns whether a skip
        is new (to be added to :attr:`issues` by the caller). An item counted as accepted that now fails moves."""
        if self._counted is None or len(self._counted) != len(self.entries):  # a loader that skipped _finish
            self._counted = torch.zeros(len(self.entries), dtype=torch.uint8).share_memory_()
        before = int(self._counted[index])
        if ok:
            if before == _UNCOUNTED:
                self._counted[index] = _ACCEPTED
                self.issues.add_ok()
            return False
        if before == _SKIPPED:
            return False
        if before == _ACCEPTED:
            self.issues.add_ok(-1)
        self._counted[index] = _SKIPPED
        return True

    def __getitem__(self, index: int) -> dict[str, Any] | None:
        item_id, p1, p2, captions, change_type = self.entries[index]
        index = range(len(self.entries))[index]  # a negative index counts as its item
        try:
            image1 = self._load(p1)
            image2 = self._load(p2)
        except (OSError, SyntaxError, ValueError) as err:
            if self.on_error == "raise":
                if isinstance(err, ImageTooLargeError):
                    raise
                raise OSError(f"{self.name}: cannot read image of item {item_id}: {err}") from err
            if self._count(index, ok=False):
                kind = IssueKind.OVERSIZED_IMAGE if isinstance(err, ImageTooLargeError) else IssueKind.CORRUPT_IMAGE
                self.issues.add(kind, f"{p1} / {p2}", f"item {item_id}: {err}")
            return None
        self._count(index, ok=True)
        return {
            "id": item_id,
            "image1": image1,
            "image2": image2,
            "captions": list(captions),
            "change_type": change_type,
        }

    def change_types(self) -> dict[str, int]:
        """Items per change type (``None`` counted as ``"none"``; an item with several types counts under each)."""
        out: dict[str, int] = {}
        for e in self.entries:
            keys = e[4] if isinstance(e[4], tuple) else (e[4] or "none",)
            for key in keys:
                out[key] = out.get(key, 0) + 1
        return out

    def _finish(self, root: Path, split: str) -> None:
        self._counted = torch.zeros(len(self.entries), dtype=torch.uint8).share_memory_()  # before workers start
        if self.issues.skipped:
            logger.warning("%s %s: %s", self.name, split, self.issues.summary())
        logger.info("%s %s: %d items from %s", self.name, split, len(self.entries), root)


def read_splits(path: Path, split: str) -> list[int]:
    """The image numbers of ``split`` in a ``{"train": [int], "val": [...], "test": [...]}`` file."""
    splits = load_json(path)
    if not isinstance(splits, dict) or split not in splits:
        raise AnnotationError(f"{path}: missing key {split!r}")
    ids = splits[split]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise AnnotationError(f"{path}: {split!r} must be a list of integers")
    return ids


def read_type_mapping(path: Path) -> dict[int, str]:
    """Image number -> change type, from a ``{type: [image ids]}`` file."""
    mapping = load_json(path)
    if not isinstance(mapping, dict):
        raise AnnotationError(f"{path}: expected an object {{type: [image ids]}}")
    out: dict[int, str] = {}
    for change_type, names in mapping.items():
        if not isinstance(names, list):
            raise AnnotationError(f"{path}: entry {change_type!r} must be a list of image ids")
        for name in names:
            out[image_number(name, path)] = change_type
    return out


def read_numbered_captions(path: Path) -> dict[int, list[str]]:
    """Image number -> captions, from a ``{image name: [captions]}`` file (names such as ``"000123.png"``)."""
    raw = load_json(path)
    if not isinstance(raw, dict):
        raise AnnotationError(f"{path}: expected an object {{image name: [captions]}}")
    out: dict[int, list[str]] = {}
    for key, caps in raw.items():
        n = image_number(key, path)
        if n in out:
            raise AnnotationError(f"{path}: image number {n} appears twice (entry {key!r})")
        out[n] = caption_list(caps, path, repr(key))
    return out
