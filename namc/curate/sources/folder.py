"""Any folder of images (a user's own collection, or img2dataset's ``--output_format files``): single images to mine.

``kind: image_folder``; root is searched recursively for the extensions in
:data:`~namc.curate.sources.base.IMAGE_EXTENSIONS` (case-insensitive), in sorted order, hidden files and folders
skipped. Key ``<name>/<path relative to root>``. A ``.txt`` beside an image with the same stem is its caption: this
is img2dataset's ``files`` layout (``00000/000000042.jpg`` + ``000000042.txt`` + ``000000042.json``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from namc.curate.sources.base import IMAGE_EXTENSIONS, ImageItem, SourceSpec, register_source
from namc.data.issues import DataIssues, IssueKind

__all__ = ["read_image_folder"]


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS:
                yield Path(dirpath) / name


@register_source("image_folder")
def read_image_folder(spec: SourceSpec, issues: DataIssues) -> Iterator[ImageItem]:
    """Single images of a folder tree (see the module docstring)."""
    root = Path(spec.root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: image folder not found")
    for path in _walk(root):
        rel = path.relative_to(root).as_posix()
        if "\n" in rel or "\r" in rel:
            issues.add(IssueKind.MALFORMED_LINE, repr(str(path)), "a line break in the file name")
            continue
        caption = None
        txt = path.with_suffix(".txt")
        if txt.is_file():
            try:
                caption = txt.read_text(encoding="utf-8-sig").strip() or None
            except (OSError, UnicodeDecodeError) as err:
                issues.add(IssueKind.MALFORMED_LINE, str(txt), f"caption not read: {err}", n=0)
        yield ImageItem(key=f"{spec.name}/{rel}", ref=str(path.absolute()), caption=caption)
