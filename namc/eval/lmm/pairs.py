"""The pairs an LMM comparison runs on: a split of a registered benchmark, or a pair list of one's own.

A pair list is a JSONL file, one pair per line::

    {"id": "0001", "image1": "before/0001.png", "image2": "after/0001.png",
     "references": ["the red car is gone", ...], "change_type": "drop",        # change_type: optional
     "caption1": "...", "caption2": "..."}                                        # only for the d2_cc3m prompt

Image references are paths (or ``SHARD.tar::MEMBER`` / ``FILE.parquet::ROW::COLUMN``, :mod:`namc.data.refs`)
relative to the list's folder. A line that is not such an object, repeats an id, or has no non-empty reference is
skipped and counted by reason (``malformed_line``, ``duplicate_id``, ``missing_references``), never guessed at.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from namc.jsonl import loads

__all__ = ["DISTRACTOR_TYPES", "EvalPair", "benchmark_pairs", "is_distractor", "read_pair_list"]

logger = logging.getLogger(__name__)

#: change types of the pairs without a change: CLEVR-Change's loader calls them ``no_change``, its papers
#: ``distractor``
DISTRACTOR_TYPES = frozenset({"no_change", "distractor"})


@dataclass(frozen=True)
class EvalPair:
    """One pair to caption and score: its id, the two image references, where relative ones start, its references
    and change type (None when unknown; a tuple for a pair of several types), and optional per-image captions."""

    id: str
    image1: str
    image2: str
    base: Path | None
    references: tuple[str, ...]
    change_type: str | tuple[str, ...] | None = None
    caption1: str | None = None
    caption2: str | None = None


def is_distractor(change_type: str | tuple[str, ...] | None) -> bool:
    """Whether a change type marks a pair without a change (:data:`DISTRACTOR_TYPES`)."""
    types = change_type if isinstance(change_type, tuple) else (change_type,)
    return any(t in DISTRACTOR_TYPES for t in types)


def benchmark_pairs(name: str, root: str | Path, split: str) -> tuple[list[EvalPair], Counter[str]]:
    """The pairs of a split of a registered benchmark (:func:`namc.data.idc.build_benchmark`), read in its official
    layout; images are not decoded here (a corrupt one fails its request as ``corrupt_image``).

    Returns:
        ``(pairs, skipped)``: the pairs in the dataset's order, and the pairs its loader skipped, by kind
        (``missing_image``, ``empty_captions``).

    Raises:
        FileNotFoundError: the dataset is not at ``root`` (the message says where to download it).
        ValueError: an unknown benchmark or split.
    """
    from namc.data.idc import build_benchmark, check_benchmark_root

    check_benchmark_root(name, root)
    dataset = build_benchmark(name, root, split, image_size=None)
    pairs = [
        EvalPair(
            key,
            str(p1),
            str(p2),
            None,
            tuple(captions),
            tuple(ctype) if isinstance(ctype, (list, tuple)) else ctype,
        )
        for key, p1, p2, captions, ctype in dataset.entries
    ]
    return pairs, Counter({k: v for k, v in dataset.issues.counts.items() if v})


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def read_pair_list(path: str | Path) -> tuple[list[EvalPair], Counter[str], int]:
    """The pairs of a pair list (module docstring).

    Returns:
        ``(pairs, skipped, lines)``: the pairs in file order, the lines skipped by reason, and the non-blank lines.

    Raises:
        ValueError: the file cannot be read (one line naming it).
    """
    path = Path(path)
    pairs: list[EvalPair] = []
    skipped: Counter[str] = Counter()
    seen: set[str] = set()
    lines = 0
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below; the error message needs the open to fail alone)
    except OSError as err:
        raise ValueError(f"pair list {path}: cannot read ({err.strerror})") from None
    with f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            lines += 1
            try:
                obj = loads(raw)
                if not isinstance(obj, dict) or not _text(obj.get("id")):
                    raise ValueError("not a JSON object with a string 'id'")
                if not (_text(obj.get("image1")) and _text(obj.get("image2"))):
                    raise ValueError("no string 'image1' and 'image2'")
            except ValueError as err:  # namc.jsonl.JSONError is a ValueError
                skipped["malformed_line"] += 1
                logger.warning("%s line %d: skipped: %s", path, number, str(err)[:200])
                continue
            refs = obj.get("references")
            refs = [r.strip() for r in refs if _text(r)] if isinstance(refs, list) else []
            if not refs:
                skipped["missing_references"] += 1
                logger.warning("%s line %d: skipped: no non-empty 'references'", path, number)
                continue
            if obj["id"] in seen:
                skipped["duplicate_id"] += 1
                logger.warning("%s line %d: skipped: id %r already seen", path, number, obj["id"])
                continue
            seen.add(obj["id"])
            ctype = obj.get("change_type")
            if isinstance(ctype, list):
                ctype = tuple(str(t) for t in ctype)
            elif ctype is not None:
                ctype = str(ctype)
            pairs.append(
                EvalPair(
                    obj["id"],
                    obj["image1"],
                    obj["image2"],
                    path.parent,
                    tuple(refs),
                    ctype,
                    _text(obj.get("caption1")),
                    _text(obj.get("caption2")),
                )
            )
    return pairs, skipped, lines
