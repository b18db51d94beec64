"""What every image source yields, the registry of source kinds, and the one image check.

A source reads one image collection in the layout its owner publishes and yields either single images
(:class:`ImageItem`: to be embedded and mined, appendix D.1) or ready pairs (:class:`PairItem`: InstructPix2Pix,
Spot-the-Diff). Items carry image references (:mod:`namc.data.refs`), never decoded pixels, and the encoded bytes
when the reader already holds them (a tar or parquet batch), so checking an image costs no second read.

Bad input is counted in a :class:`~namc.data.issues.DataIssues` the reader is handed (the file or member named),
never raised out of a long run: a missing file or member, an unreadable tar shard, a malformed annotation line.
Image checks (:func:`check_image`) are the index step's: empty, truncated, corrupt, oversized.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from namc.data.issues import DataIssues, IssueKind, RecordError
from namc.data.refs import read_ref
from namc.data.transforms import MAX_IMAGE_PIXELS, ImageTooLargeError, open_image

__all__ = [
    "IMAGE_EXTENSIONS",
    "SOURCE_KINDS",
    "ImageItem",
    "PairItem",
    "SourceSpec",
    "check_image",
    "register_source",
]

#: file extensions read as images by the folder sources (lower-case)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


@dataclass
class ImageItem:
    """One single image: ``key`` is unique across all sources (``"<source name>/<key in the source>"``)."""

    key: str
    ref: str
    caption: str | None = None
    data: bytes | None = None  # the encoded bytes when the reader already has them


@dataclass
class PairItem:
    """One ready pair (before -> after) with whatever text its source has."""

    key: str
    ref1: str
    ref2: str
    caption1: str | None = None
    caption2: str | None = None
    instruction: str | None = None  # InstructPix2Pix edit prompt
    difference: str | None = None  # Spot-the-Diff human sentences
    data1: bytes | None = None
    data2: bytes | None = None


@dataclass
class SourceSpec:
    """One entry of the pipeline YAML's ``sources`` list.

    Attributes:
        name: the key prefix and the ``source`` field of every record (``ip2p``, ``cc3m``, ...).
        kind: a registered reader (:data:`SOURCE_KINDS`).
        root: the collection (a folder, a file, a glob or a brace pattern, by kind).
        captions: an optional ``{"key", "caption"}`` JSONL joined by image key (:mod:`.captions`).
        options: the kind's own keys (``splits``, ``tsv``, ...).
    """

    name: str
    kind: str
    root: str
    captions: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: Any) -> SourceSpec:
        """From a YAML mapping ``{name, kind, root, captions?, ...}`` or a command-line ``[NAME=]KIND:ROOT``."""
        if isinstance(value, str):  # [NAME=]KIND:ROOT
            name, eq, body = value.partition("=")
            if not eq:
                name, body = "", value
            kind, sep, root = body.partition(":")
            if not sep or not root:
                raise ValueError(f"source {value!r}: expected [NAME=]KIND:ROOT (kinds: {', '.join(SOURCE_KINDS)})")
            value = {"kind": kind, "root": root, "name": name or kind}
        if not isinstance(value, dict):
            raise ValueError(f"source entry must be a mapping {{name, kind, root}}, got {value!r}")
        missing = [k for k in ("kind", "root") if not value.get(k)]
        if missing:
            raise ValueError(f"source entry {value!r} lacks {', '.join(missing)}")
        kind = str(value["kind"])
        if kind not in SOURCE_KINDS:
            raise ValueError(f"source {value!r}: unknown kind {kind!r} (known: {', '.join(sorted(SOURCE_KINDS))})")
        name = str(value.get("name") or kind)
        if "/" in name or not name.strip():
            raise ValueError(f"source name {name!r} must be non-empty and contain no '/'")
        rest = {k: v for k, v in value.items() if k not in ("name", "kind", "root", "captions")}
        captions = value.get("captions")
        return cls(
            name=name, kind=kind, root=str(value["root"]), captions=str(captions) if captions else None, options=rest
        )


# kind -> reader(spec, issues) yielding ImageItem / PairItem
Reader = Callable[[SourceSpec, DataIssues], Iterator[ImageItem | PairItem]]
SOURCE_KINDS: dict[str, Reader] = {}


def register_source(kind: str) -> Callable[[Reader], Reader]:
    """Registers a reader under ``kind`` (the ``kind`` of a YAML source entry)."""

    def wrap(fn: Reader) -> Reader:
        if kind in SOURCE_KINDS:
            raise ValueError(f"source kind {kind!r} registered twice")
        SOURCE_KINDS[kind] = fn
        return fn

    return wrap


def check_image(ref: str, data: bytes | None, max_pixels: int | None = MAX_IMAGE_PIXELS) -> str | None:
    """Reads (if ``data`` is None) and fully decodes an image; returns its PIL mode.

    Raises:
        RecordError: ``missing_image`` (no such file / member / row), ``corrupt_image`` (unreadable, empty, truncated,
            not an image), ``oversized_image`` (over ``max_pixels``, from the header; nothing decoded).
    """
    try:
        if data is None:
            data = read_ref(ref)
        img = open_image(data, max_pixels)
    except FileNotFoundError as err:
        raise RecordError(IssueKind.MISSING_IMAGE, str(err)) from None
    except ImageTooLargeError as err:
        raise RecordError(IssueKind.OVERSIZED_IMAGE, f"{ref}: {err}") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise RecordError(IssueKind.CORRUPT_IMAGE, f"{ref}: {err}") from None
    mode = img.mode
    img.close()
    return mode
