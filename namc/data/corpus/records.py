"""Pre-training corpus records: the JSONL manifest, its validation (:func:`parse_record`) and precomputed codes.

Manifest (one JSON object per line; image paths relative to the manifest's folder, or absolute)::

    {"id": "ip2p-0000001", "source": "ip2p",
     "image1": "images/0000001_1.jpg", "image2": "images/0000001_2.jpg",
     "description": "The difference between the two images is that the first image shows ..., while ...",
     "verb1": "shows", "desc1": "...", "verb2": "shows", "desc2": "...",      # optional: parsed if absent
     "noise1": [0, 0, 1, ...], "noise2": [...],                               # optional word-level noise labels
     "codes": "codes/0000001.npy"}                                             # optional (2, N) VQGAN codes

A *free-text* record (``"free_text": true``) holds a description written without the template, as appendix B.2's
"conventional" prompt asks for (``namc curate describe --prompt conventional``; Table 11)::

    {"id": "std-256", "source": "std", "image1": "...", "image2": "...", "free_text": true,
     "description": "The word hunger is no longer there, the keys are different."}

It has no halves (``verb1``, ``desc1``, ``noise1``, ... are refused), so only FDG can learn from it. The flag is
declared by whoever wrote the description rather than inferred from a failed parse: a templated description that
went wrong must stay an ``off_template`` rejection, not turn into free text.

``source`` is a free string (``ip2p``, ``cc3m``, ``std``, ``shapes``, ...). ``noise1[k]`` is 1 when word
``desc1.split()[k]`` is injected noise. ``codes`` is an ``.npy`` file (no pickle) holding two rows of N small
non-negative integers: the VQGAN tokens of image 1 and image 2 (N = 196 at 224 px with f16).

The manifest is read as bytes and decoded line by line (:func:`iter_manifest`), so a line that is not UTF-8 costs
that one sample (skipped and counted as ``malformed_line`` with its line number, by :func:`parse_line`), not the
whole file. ``id`` names a pair everywhere (caches of codes and grids are keyed by it), so a manifest line whose id
an earlier line already took is skipped as ``duplicate_id`` (:func:`duplicate_lines`), whether or not the earlier
line is usable.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from namc.data.issues import IssueKind, RecordError
from namc.data.transforms import ImageTooLargeError
from namc.jsonl import JSONError, json_line, loads
from namc.text.template import MAX_DESCRIPTION_CHARS, TemplateError, normalize_whitespace, parse

__all__ = [
    "IMAGE_ERRORS",
    "CorpusRecord",
    "RecordError",
    "UndecodableLine",
    "duplicate_lines",
    "image_error",
    "iter_manifest",
    "parse_line",
    "parse_record",
    "read_codes",
    "write_manifest",
]

# What decoding a bad image raises: open_image reports every decoder failure as OSError (UnidentifiedImageError
# included) or SyntaxError. An image over the pixel cap raises ImageTooLargeError, a RecordError of kind
# oversized_image, which is deliberately not in this tuple: a reader's `except RecordError` counts it under its kind.
IMAGE_ERRORS = (OSError, SyntaxError)


@dataclass
class CorpusRecord:
    """One pair of the pre-training corpus (a manifest line)."""

    id: str
    source: str
    image1: str
    image2: str
    description: str
    verb1: str
    desc1: str
    verb2: str
    desc2: str
    noise1: list[int] | None = None
    noise2: list[int] | None = None
    codes: str | None = None
    free_text: bool = False  # a description without the template (appendix B.2): no halves, FDG only

    def to_json(self, with_paths: bool = True) -> dict[str, Any]:
        """The manifest line (``with_paths=False``: the shard's ``{key}.json``, without image/codes paths)."""
        out: dict[str, Any] = {"id": self.id, "source": self.source}
        if with_paths:
            out["image1"], out["image2"] = self.image1, self.image2
        if self.free_text:
            out.update(description=self.description, free_text=True)
        else:
            out.update(
                description=self.description, verb1=self.verb1, desc1=self.desc1, verb2=self.verb2, desc2=self.desc2
            )
        if self.noise1 is not None:
            out["noise1"] = self.noise1
        if self.noise2 is not None:
            out["noise2"] = self.noise2
        if with_paths and self.codes is not None:
            out["codes"] = self.codes
        return out


def _check_labels(labels: Any, desc: str, name: str) -> list[int] | None:
    if labels is None:
        return None
    n_words = len(desc.split())
    if not isinstance(labels, list) or not all(isinstance(x, int) and x in (0, 1) for x in labels):
        raise RecordError(IssueKind.BAD_LABELS, f"{name} must be a list of 0/1 integers")
    if len(labels) != n_words:
        raise RecordError(IssueKind.BAD_LABELS, f"{name} has {len(labels)} labels for {n_words} words")
    return labels


def parse_record(obj: Any, with_paths: bool = True) -> CorpusRecord:
    """Validates one decoded manifest line (or shard json) and returns the record.

    The description is parsed with :func:`namc.text.template.parse`; halves given in the record must agree with it
    (verbs compared lower-cased, descriptions after whitespace normalisation). A free-text record
    (``"free_text": true``) is not parsed and must not give halves (module docstring).

    Args:
        obj: the decoded JSON object.
        with_paths: require ``image1``/``image2`` (manifest lines); shard records carry no paths.

    Raises:
        RecordError: with ``kind`` MALFORMED_LINE, OFF_TEMPLATE or BAD_LABELS.
    """
    if not isinstance(obj, dict):
        raise RecordError(IssueKind.MALFORMED_LINE, f"expected a JSON object, got {type(obj).__name__}")
    required = ("id", "source", "description") + (("image1", "image2") if with_paths else ())
    for key in required:
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            raise RecordError(IssueKind.MALFORMED_LINE, f"missing or empty string field {key!r}")
    free_text = obj.get("free_text", False)
    if not isinstance(free_text, bool):
        raise RecordError(IssueKind.MALFORMED_LINE, "field 'free_text' must be true or false")
    codes = obj.get("codes")
    if codes is not None and not isinstance(codes, str):
        raise RecordError(IssueKind.MALFORMED_LINE, "field 'codes' must be a path string")
    if free_text:
        return _free_text_record(obj, codes)
    try:
        parsed = parse(obj["description"])
    except TemplateError as err:
        raise RecordError(IssueKind.OFF_TEMPLATE, str(err)) from None
    for key, value in parsed._asdict().items():
        given = obj.get(key)
        if given is None:
            continue
        if not isinstance(given, str):
            raise RecordError(IssueKind.MALFORMED_LINE, f"field {key!r} must be a string")
        same = given.strip().lower() == value if key.startswith("verb") else normalize_whitespace(given) == value
        if not same:
            raise RecordError(IssueKind.MALFORMED_LINE, f"field {key!r}={given!r} disagrees with the description")
    return CorpusRecord(
        id=obj["id"],
        source=obj["source"],
        image1=obj.get("image1", ""),
        image2=obj.get("image2", ""),
        description=normalize_whitespace(obj["description"]),
        verb1=parsed.verb1,
        desc1=parsed.desc1,
        verb2=parsed.verb2,
        desc2=parsed.desc2,
        noise1=_check_labels(obj.get("noise1"), parsed.desc1, "noise1"),
        noise2=_check_labels(obj.get("noise2"), parsed.desc2, "noise2"),
        codes=codes,
    )


_HALF_FIELDS = ("verb1", "desc1", "verb2", "desc2", "noise1", "noise2")


def _free_text_record(obj: dict[str, Any], codes: str | None) -> CorpusRecord:
    """The record of a validated free-text line (module docstring): its description as written, whitespace
    normalised, and no halves."""
    halves = [key for key in _HALF_FIELDS if obj.get(key) is not None]
    if halves:
        raise RecordError(
            IssueKind.MALFORMED_LINE, f"a free-text record has no template halves, but it gives {', '.join(halves)}"
        )
    text = normalize_whitespace(obj["description"])
    if len(text) > MAX_DESCRIPTION_CHARS:
        raise RecordError(
            IssueKind.MALFORMED_LINE,
            f"description of {len(text):,} characters (the limit is {MAX_DESCRIPTION_CHARS:,})",
        )
    return CorpusRecord(
        id=obj["id"],
        source=obj["source"],
        image1=obj.get("image1", ""),
        image2=obj.get("image2", ""),
        description=text,
        verb1="",
        desc1="",
        verb2="",
        desc2="",
        codes=codes,
        free_text=True,
    )


def image_error(err: BaseException, slot: str, source: object) -> RecordError:
    """The :class:`RecordError` for an image that failed to load.

    Args:
        err: what :func:`namc.data.transforms.open_image` raised.
        slot: ``"image1"`` or ``"image2"``.
        source: the image's path (bytes from a shard are named by ``slot`` alone).

    Returns:
        ``oversized_image`` for :class:`~namc.data.transforms.ImageTooLargeError` (with its own message),
        ``missing_image`` for a path that does not exist, ``corrupt_image`` for anything else (empty, truncated,
        not an image, a directory).
    """
    if isinstance(err, ImageTooLargeError):
        return RecordError(err.kind, f"{slot}: {err}")
    name = str(source) if isinstance(source, str | Path) else slot
    if isinstance(err, FileNotFoundError):
        return RecordError(IssueKind.MISSING_IMAGE, f"{slot} not found: {name}")
    named = name == slot or name in str(err)  # most messages already name the file
    return RecordError(IssueKind.CORRUPT_IMAGE, f"{slot}: {err}" if named else f"{slot}: {name}: {err}")


def read_codes(data: bytes | str | Path) -> np.ndarray:
    """Reads precomputed VQGAN codes: an ``.npy`` (no pickle) of shape (2, N) with non-negative integers.

    Raises:
        ValueError: wrong dtype, shape or negative values (OSError for an unreadable file).
    """
    src = io.BytesIO(data) if isinstance(data, bytes) else data
    arr = np.load(src, allow_pickle=False)
    if arr.ndim != 2 or arr.shape[0] != 2 or arr.shape[1] == 0:
        raise ValueError(f"codes must have shape (2, N), got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"codes must be integers, got {arr.dtype}")
    if arr.size and arr.min() < 0:
        raise ValueError("codes must be non-negative")
    return arr


class UndecodableLine(str):
    """A manifest line that is not valid UTF-8, as :func:`iter_manifest` yields it.

    Its text is empty (a JSON parser rejects it, so even a reader that does not know this class skips and counts
    the line); ``raw`` holds the line's bytes and ``reason`` says which byte failed. :func:`parse_line` raises
    :class:`RecordError` with that reason.
    """

    raw: bytes
    reason: str

    def __new__(cls, raw: bytes, reason: str) -> UndecodableLine:
        line = super().__new__(cls, "")
        line.raw, line.reason = raw, reason
        return line

    def __reduce__(self) -> tuple[type, tuple[bytes, str]]:
        return UndecodableLine, (self.raw, self.reason)


def _decode_line(raw: bytes, line_no: int) -> str:
    try:
        text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
    except UnicodeDecodeError as err:
        return UndecodableLine(
            raw,
            f"not UTF-8: byte 0x{raw[err.start]:02x} at byte {err.start + 1} of the line ({err.reason}); "
            "save the manifest as UTF-8",
        )
    return text[:-2] + "\n" if text.endswith("\r\n") else text


def iter_manifest(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yields ``(line_number, line)`` for the non-blank lines of a JSONL file (line numbers are 1-based).

    The file is read as bytes and each line decoded on its own: a line that is not UTF-8 comes as an
    :class:`UndecodableLine` (empty text; :func:`parse_line` rejects it naming the byte), so one bad line costs one
    sample. CRLF line ends are read as LF, and a UTF-8 byte-order mark at the start of the file is dropped.
    """
    with open(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            if raw.strip():
                line = _decode_line(raw, i)
                if isinstance(line, UndecodableLine) or line.strip():
                    yield i, line


def parse_line(line: str) -> Any:
    """The decoded JSON value of one manifest line (validate it with :func:`parse_record`).

    Raises:
        RecordError: ``malformed_line``: the line is not UTF-8 (an :class:`UndecodableLine`), not JSON, nested
            deeper than :data:`namc.jsonl.MAX_DEPTH`, or an object naming one key twice.
    """
    if isinstance(line, UndecodableLine):
        raise RecordError(IssueKind.MALFORMED_LINE, line.reason)
    try:
        return loads(line)
    except JSONError as err:  # invalid, too deep, too long, or a key given twice
        raise RecordError(IssueKind.MALFORMED_LINE, str(err)) from None


def duplicate_lines(path: str | Path) -> dict[int, int]:
    """``{line number: line number of the first line with the same id}`` for every later line reusing an id.

    A line's id is its ``"id"`` string when the line is a JSON object (other lines have none and never collide).
    The first line with an id owns it, whether or not it is otherwise usable, so the answer depends on the
    manifest alone.
    """
    first: dict[str, int] = {}
    dups: dict[int, int] = {}
    for line_no, line in iter_manifest(path):
        try:
            obj = parse_line(line)
        except RecordError:
            continue
        key = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(key, str) and key.strip():
            if key in first:
                dups[line_no] = first[key]
            else:
                first[key] = line_no
    return dups


def write_manifest(records: Sequence[CorpusRecord], path: str | Path) -> None:
    """Writes records as a JSONL manifest (one compact JSON object per line)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json_line(r.to_json()))
