"""``results.jsonl``: one row per finished run of a study, rewritten atomically (a temporary file in the same folder,
then ``os.replace``), so a killed study never leaves a half row and a row's presence means the run finished.

A row::

    {"variant": "namc", "seed": 0, "config_hash": "3f2a...", "wall_s": 412.3, "metrics": {"test/CIDEr-D": 131.2, ...},
     "stages": {"pretrain": {"hash": "...", "wall_s": 250.1, "reused": false}, ...}, "finished": "2026-...Z"}
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from namc.jsonl import JSONError, loads
from namc.models.files import atomic_write_text

__all__ = ["RESULTS", "read_results", "write_results"]

logger = logging.getLogger(__name__)

RESULTS = "results.jsonl"
_REQUIRED = ("variant", "seed", "config_hash", "wall_s", "metrics")


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``results.jsonl`` (a folder means ``folder/results.jsonl``; missing: no rows).

    Raises:
        ValueError: a line that is not JSON or lacks a required field (names the file and line).
    """
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = loads(line.decode("utf-8-sig" if number == 1 else "utf-8"))
        except (UnicodeDecodeError, JSONError) as err:
            raise ValueError(f"{path}:{number}: not a JSON line: {err}") from None
        missing = [k for k in _REQUIRED if not isinstance(row, dict) or k not in row]
        if missing:
            raise ValueError(f"{path}:{number}: row lacks {missing}")
        rows.append(row)
    return rows


def write_results(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write every row (sorted by variant order of appearance, then seed) atomically."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return path
