"""The resumable results file: one JSON line per finished item, appended and flushed as each result arrives.

Why it survives SIGKILL: a line is written with one unbuffered ``write`` of its bytes, newline last, and JSON never
holds a raw newline inside a line (``json.dumps`` escapes it). So a line that ends in ``"\\n"`` was written whole,
and a kill mid-write can only leave a *tail without a newline*. :meth:`ResultStore.open` finds such a torn tail,
truncates the file back to the last newline (logging how many bytes it dropped) and never parses it; the item it
held is simply not finished and is requested again. At most the requests in flight are lost.

A complete line that is not a JSON object with a string id (a file edited by hand, a disk error) is skipped and
counted (``corrupt_lines``), never guessed at; its item is requested again. When an id has several lines (a
failure retried by ``--retry-failed``), the last one wins.

Memory: only the ids are kept (plus the ids of failed items), not the results, so a 770K-line file costs tens of MB.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from namc.jsonl import JSONError, json_line, loads

__all__ = ["ResultStore", "atomic_write_text", "iter_results", "last_results", "read_at"]

logger = logging.getLogger(__name__)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Writes a small text file through a temporary file and a rename (readers never see half of it).

    The same contract as :func:`namc.models.files.atomic_write_text`, without importing the model library (and
    torch) into the LLM steps, which start in a fraction of a second without it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _complete_lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """``(line_number, byte_offset, raw)`` of the newline-terminated lines of ``path`` (a torn tail is left out)."""
    offset = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):
                return
            yield number, offset, raw
            offset += len(raw)


def _decode(raw: bytes, id_field: str) -> dict[str, Any] | None:
    """The result object of one line; None where it is not one (not UTF-8 or JSON, nested or long past the bounded
    reader's limits, a duplicate key, no string id or no status)."""
    try:
        obj = loads(raw)
    except JSONError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get(id_field), str) or "status" not in obj:
        return None
    return obj


def iter_results(path: str | Path, id_field: str = "id") -> Iterator[tuple[int, dict[str, Any] | None]]:
    """``(line_number, result)`` for every complete line of a results file; ``result`` is None for a corrupt line."""
    for number, _, raw in _complete_lines(Path(path)):
        if raw.strip():
            yield number, _decode(raw, id_field)


def last_results(path: str | Path, id_field: str = "id") -> tuple[dict[str, int], int]:
    """``({id: byte offset of its last line}, corrupt_lines)``: where each item's final result is, for a second
    pass that reads the results one by one (:func:`read_at`) without holding them all."""
    where: dict[str, int] = {}
    corrupt = 0
    for _, offset, raw in _complete_lines(Path(path)):
        if not raw.strip():
            continue
        obj = _decode(raw, id_field)
        if obj is None:
            corrupt += 1
            continue
        where.pop(obj[id_field], None)  # re-insert: dict order becomes the order of the last lines
        where[obj[id_field]] = offset
    return where, corrupt


def read_at(f: Any, offset: int, id_field: str = "id") -> dict[str, Any]:
    """The result on the line at ``offset`` of an open binary file (one :func:`last_results` found valid).

    Raises:
        ValueError: the line is no longer a result object (the file changed between the two passes).
    """
    f.seek(offset)
    obj = _decode(f.readline(), id_field)
    if obj is None:
        raise ValueError(f"{getattr(f, 'name', 'results file')}: the line at byte {offset} is no longer a result")
    return obj


class ResultStore:
    """Append-only JSONL of results keyed by ``id_field``.

    Args:
        path: the results file (created with its folder if missing).
        id_field: the key of an item (``"id"`` for pairs, ``"key"`` for images).
    """

    def __init__(self, path: str | Path, id_field: str = "id") -> None:
        self.path = Path(path)
        self.id_field = id_field
        self.done: set[str] = set()
        self.failed: set[str] = set()
        self.corrupt_lines = 0
        self.torn_bytes = 0
        self._fd: int | None = None

    def open(self) -> ResultStore:
        """Reads the finished ids, truncates a torn tail, and opens the file for appending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        end = 0
        if self.path.exists():
            for number, offset, raw in _complete_lines(self.path):
                end = offset + len(raw)
                if not raw.strip():
                    continue
                obj = _decode(raw, self.id_field)
                if obj is None:
                    self.corrupt_lines += 1
                    logger.warning("%s line %d: not a result object, ignored (its item is redone)", self.path, number)
                    continue
                key = obj[self.id_field]
                self.done.add(key)
                if obj["status"] == "ok":
                    self.failed.discard(key)
                else:
                    self.failed.add(key)
            size = self.path.stat().st_size
            if size > end:
                self.torn_bytes = size - end
                logger.warning(
                    "%s: dropped a torn last line of %d bytes (a run was killed mid-write; its item is redone)",
                    self.path,
                    self.torn_bytes,
                )
                os.truncate(self.path, end)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self

    def forget_failed(self) -> int:
        """Makes the failed items unfinished again (``--retry-failed``); returns how many."""
        n = len(self.failed)
        self.done -= self.failed
        self.failed.clear()
        return n

    def append(self, result: dict[str, Any]) -> None:
        """Writes one result line (one ``write`` call per chunk the kernel accepts; newline last)."""
        if self._fd is None:
            raise RuntimeError("ResultStore.open() first")
        data = json_line(result).encode("utf-8")
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        key = result[self.id_field]
        self.done.add(key)
        if result.get("status") == "ok":
            self.failed.discard(key)
        else:
            self.failed.add(key)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ResultStore:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
