"""OmniDiff (Liu et al., ICCV 2025, arXiv 2503.11093): real and rendered image pairs with long multi-change captions.

The benchmark (paper, sections 3.3 and 5.1): 15,598 pairs, one human caption each (60 words on average, 2.5
sentences), 12 change types (viewpoint, illumination, addition, disappearance, removal, substitution, size, color,
orientation, pose, OCR, counting; a pair has one or more); two subsets scored separately, **Real** (8,609 pairs:
7,007 / 799 / 803 train / val / test) and **Render** (6,989 pairs rendered with Blender: 5,445 / 777 / 767).

**The release layout could not be confirmed.** Searched (Nov 2026, the search tools of this project): GitHub
repositories named like OmniDiff / M3Diff (only unrelated diff tools), code and issues for "OmniDiff dataset", the
documentation index for the Hugging Face datasets. Found: the paper (arXiv 2503.11093: "the dataset, code, and
models will be made publicly available"), its project page name ``yuan-liu-omnidiff.github.io`` (as cited by
paper-notes sites; its content is not stored), and the Hugging Face dataset card ``IVC-liuyuan/training_m3diff``
(JSON, tagged image-difference-captioning / visual-instruction-tuning): M3Diff's instruction-tuning mix, not the
benchmark's split files, and its files are not readable here. So this loader reads the layout below, which follows
the paper's structure (two subsets, three splits, one caption and a list of change types per pair); convert a
release in another form to it (one JSON list per subset and split, paths relative to the subset folder)::

    <root>/
      Real/
        train.json  val.json  test.json
        ...images, in any folders below Real/ (the JSON paths are relative to Real/)
      Render/
        train.json  val.json  test.json
        ...

    train.json = [{"id": "real_000001",                    # optional; default "<split>.json#<index>"
                   "image1": "images/000001_1.jpg",        # the "before" image, relative to the subset folder
                   "image2": "images/000001_2.jpg",        # the "after" image
                   "caption": "A man in a blue shirt ...", # or "captions": ["...", ...]
                   "change_types": ["pose", "addition"]},  # or "change_type": "pose"; optional
                  ...]

Three registered names: ``omnidiff_real`` and ``omnidiff_render`` read one subset (the paper scores them
separately), ``omnidiff`` reads both (item ids ``real/<id>`` and ``render/<id>``, unique across the two).

Change types: names are lower-cased with spaces and hyphens as ``_``; ``colour`` -> ``color``, ``ocr
(textual changes)`` / ``text`` / ``textual_changes`` -> ``ocr``, ``count`` -> ``counting``. A name outside the 12
is kept as written and logged once per file (never dropped). An item's ``change_type`` is the sorted tuple of its
types (``()`` when the entry has none): per-type scores (:mod:`namc.eval.captions`) count a pair under each of its
types, so a type's numbers are over every pair that has that change.

Bad input, as for every loader (:mod:`~namc.data.idc.base`): a malformed split file (not UTF-8, not JSON, an entry
that is not an object, no image path, no caption, a wrong type, an id twice) raises :class:`AnnotationError`
naming the file and the entry; a missing image is skipped and counted (``missing_image``); an entry whose captions
are all empty is skipped and counted (``empty_captions``); a path that leaves the subset folder is an error.
"""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal

from namc.data.idc.base import AnnotationError, BenchmarkDataset, caption_list, load_json, normalise_split
from namc.data.idc.registry import register_dataset
from namc.data.transforms import MAX_IMAGE_PIXELS

__all__ = ["CHANGE_TYPES", "OmniDiff", "OmniDiffReal", "OmniDiffRender", "normalise_change_type"]

logger = logging.getLogger(__name__)

#: the 12 change types of OmniDiff (paper, section 3.1), as this loader names them
CHANGE_TYPES = (
    "viewpoint",
    "illumination",
    "addition",
    "disappearance",
    "removal",
    "substitution",
    "size",
    "color",
    "orientation",
    "pose",
    "ocr",
    "counting",
)
_ALIASES = {
    "colour": "color",
    "text": "ocr",
    "textual_changes": "ocr",
    "ocr_(textual_changes)": "ocr",
    "count": "counting",
}
#: subset folder names and the prefix of their item ids
SUBSETS = {"real": "Real", "render": "Render"}


def normalise_change_type(name: str) -> str:
    """``"OCR (textual changes)"`` -> ``"ocr"``, ``"Colour"`` -> ``"color"``; other names lower-cased, ``_``-joined."""
    key = "_".join(name.strip().lower().replace("-", " ").split())
    return _ALIASES.get(key, key)


def _relative_path(value: Any, folder: Path, path: Path, entry: str, key: str) -> Path:
    """``folder / value`` for a relative POSIX path that stays inside ``folder``."""
    if not isinstance(value, str) or not value.strip():
        raise AnnotationError(f"{path}: entry {entry}: {key!r} must be a non-empty path string")
    rel = PurePosixPath(value.strip().replace("\\", "/"))
    if rel.is_absolute() or ".." in rel.parts:
        raise AnnotationError(f"{path}: entry {entry}: {key!r} = {value!r} must be a path inside {folder}")
    return folder.joinpath(*rel.parts)


def _captions(entry: dict[str, Any], path: Path, name: str) -> list[str]:
    if "captions" in entry:
        return caption_list(entry["captions"], path, name)
    if "caption" in entry:
        if not isinstance(entry["caption"], str):
            raise AnnotationError(f"{path}: entry {name}: 'caption' must be a string")
        return [entry["caption"].strip()] if entry["caption"].strip() else []
    raise AnnotationError(f"{path}: entry {name} has neither 'caption' nor 'captions'")


def _types(entry: dict[str, Any], path: Path, name: str) -> tuple[str, ...]:
    value = entry.get("change_types", entry.get("change_type", []))
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise AnnotationError(f"{path}: entry {name}: change types must be a string or a list of strings")
    return tuple(sorted({normalise_change_type(t) for t in value if t.strip()}))


@register_dataset
class OmniDiff(BenchmarkDataset):
    """OmniDiff, Real and Render together (``omnidiff``); :class:`OmniDiffReal` and :class:`OmniDiffRender` read one.

    Args:
        root: the folder holding ``Real/`` and ``Render/`` (the layout in the module docstring).
        split: ``train``, ``val`` or ``test``.
        image_size: side of the square output images.
        on_error: ``"skip"`` (count a corrupt image and return ``None``) or ``"raise"``.
        max_image_pixels: an image over this many pixels is skipped and counted as ``oversized_image`` (None: no
            cap; see :mod:`namc.data.transforms`).
    """

    name = "omnidiff"
    title = "OmniDiff"
    layout = "Real/ and Render/, each {train,val,test}.json: [{id, image1, image2, caption, change_types}] (ours)"
    url = "https://arxiv.org/abs/2503.11093 (the authors' release; convert it to the layout in namc.data.idc.omnidiff)"
    marker = "Real"
    subsets: ClassVar[tuple[str, ...]] = ("real", "render")

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
        for subset in self.subsets:
            folder = root / SUBSETS[subset]
            if not folder.is_dir():
                raise FileNotFoundError(
                    f"{self.title}: {folder} not found: download OmniDiff ({self.url}) and lay out each subset as "
                    f"{root}/Real/{{train,val,test}}.json and {root}/Render/{{train,val,test}}.json (see "
                    "namc.data.idc.omnidiff)"
                )
            self._read(folder, folder / f"{split}.json", subset)
        self._finish(root, split)

    def _read(self, folder: Path, path: Path, subset: str) -> None:
        data = load_json(path)
        if not isinstance(data, list):
            raise AnnotationError(f"{path}: expected a list of {{id, image1, image2, caption, change_types}} entries")
        listing: dict[Path, set[str]] = {}
        seen: set[str] = set()
        unknown: set[str] = set()
        for i, entry in enumerate(data):
            if not isinstance(entry, dict):
                raise AnnotationError(f"{path}: entry {i} is not an object")
            raw_id = entry.get("id", f"{path.name}#{i}")
            if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) or not str(raw_id).strip():
                raise AnnotationError(f"{path}: entry {i}: 'id' must be a non-empty string or an integer")
            item_id = f"{subset}/{str(raw_id).strip()}"
            if item_id in seen:
                raise AnnotationError(f"{path}: entry {i}: id {raw_id!r} appears twice")
            seen.add(item_id)
            name = f"{i} (id {raw_id})"
            p1 = _relative_path(entry.get("image1"), folder, path, name, "image1")
            p2 = _relative_path(entry.get("image2"), folder, path, name, "image2")
            types = _types(entry, path, name)
            unknown.update(t for t in types if t not in CHANGE_TYPES)
            self._add(item_id, p1, p2, _captions(entry, path, name), types, listing)
        if unknown:
            logger.warning(
                "%s: change types outside OmniDiff's 12 (kept as written): %s", path, ", ".join(sorted(unknown))
            )

    def change_types(self) -> dict[str, int]:
        """Items per change type; a pair with several types counts under each (``"none"``: a pair without types)."""
        out: dict[str, int] = {}
        for e in self.entries:
            for key in e[4] or ("none",):
                out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))


@register_dataset
class OmniDiffReal(OmniDiff):
    """OmniDiff-Real only (8,609 real-world pairs; ``<root>/Real/``), scored on its own as in the paper (Table 3)."""

    name = "omnidiff_real"
    title = "OmniDiff-Real"
    layout = "Real/{train,val,test}.json: [{id, image1, image2, caption, change_types}] (ours, see omnidiff)"
    marker = "Real"
    subsets = ("real",)


@register_dataset
class OmniDiffRender(OmniDiff):
    """OmniDiff-Render only (6,989 Blender-rendered pairs; ``<root>/Render/``), scored on its own (Table 3)."""

    name = "omnidiff_render"
    title = "OmniDiff-Render"
    layout = "Render/{train,val,test}.json: [{id, image1, image2, caption, change_types}] (ours, see omnidiff)"
    marker = "Render"
    subsets = ("render",)
