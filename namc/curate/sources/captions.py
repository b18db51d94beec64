"""Per-image captions joined by key from a ``{"key": ..., "caption": ...}`` JSONL (LLaVA-ReCap style, or
``namc curate caption``'s output).

A caption line's key may be the full image key (``cc3m/000000123``) or the key within its source (``000000123``); the
full key wins. A line that is not UTF-8, not a JSON object with string ``key`` and ``caption``, or repeats a key is
skipped and counted (``malformed_line`` / ``duplicate_id``) with its line number. Captions are held in memory (a
dict of strings: about 1 GB for 3M paragraph captions).
"""

from __future__ import annotations

from pathlib import Path

from namc.data.issues import DataIssues, IssueKind
from namc.jsonl import JSONError, loads

__all__ = ["read_captions"]


def read_captions(path: str | Path, issues: DataIssues) -> dict[str, str]:
    """Key -> caption of a captions JSONL (bad lines skipped and counted in ``issues``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"captions file not found: {path}")
    out: dict[str, str] = {}
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            where = f"{path}:{line_no}"
            if not raw.strip():
                continue
            try:
                obj = loads(raw)  # bounded (depth, length, duplicate keys); a byte-order mark is dropped
            except JSONError as err:
                issues.add(IssueKind.MALFORMED_LINE, where, f"not a UTF-8 JSON line: {err}")
                continue
            if (
                not isinstance(obj, dict)
                or not isinstance(obj.get("key"), str)
                or not isinstance(obj.get("caption"), str)
            ):
                issues.add(IssueKind.MALFORMED_LINE, where, 'expected {"key": str, "caption": str}')
                continue
            if obj["key"] in out:
                issues.add(IssueKind.DUPLICATE_ID, where, f"caption key {obj['key']!r} repeats an earlier line")
                continue
            out[obj["key"]] = obj["caption"].strip()
    return out
