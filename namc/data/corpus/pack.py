"""Packing a JSONL manifest into tar shards (:func:`pack_corpus`), resumably.

Shard ``i`` holds manifest lines ``[i * shard_size, (i + 1) * shard_size)`` that pass validation, is written to
``.tar.partial`` and renamed when complete, and gets a sidecar ``shard-%06d.json`` with its counts and a digest of
its manifest lines and one of the tar's bytes (``tar_digest``, which precomputed targets are bound to:
:mod:`namc.data.corpus.targets`); a rerun skips shards whose tar and sidecar exist with the same lines digest and
rewrites any other (a partial one, or one packed from different lines), deleting the old shard's precomputed
targets. ``index.json`` lists the shards and the totals. The format is
described in :mod:`namc.data.corpus.shards`. A manifest's ``image1``/``image2`` are image references
(:mod:`namc.data.refs`): a path, ``SHARD.tar::MEMBER`` or ``FILE.parquet::ROW::COLUMN``.

Every manifest line is accounted for: packed, or rejected and counted by :class:`~namc.data.issues.IssueKind`
(a line that is not UTF-8 or not JSON, a record that fails validation, a missing, corrupt or oversized image, bad
codes, or an id an earlier line already took: ``duplicate_id``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from namc.data.corpus.records import (
    IMAGE_ERRORS,
    CorpusRecord,
    RecordError,
    UndecodableLine,
    duplicate_lines,
    image_error,
    iter_manifest,
    parse_line,
    parse_record,
    read_codes,
)
from namc.data.corpus.shards import INDEX_FILE, SHARD_PATTERN
from namc.data.corpus.targets import TARGET_FILES, targets_path
from namc.data.issues import IssueKind
from namc.data.refs import read_ref, ref_ext
from namc.data.transforms import MAX_IMAGE_PIXELS, ImageTooLargeError, open_image
from namc.jsonl import JSONError, loads

__all__ = ["PackReport", "pack_corpus"]

logger = logging.getLogger(__name__)


@dataclass
class PackReport:
    """What :func:`pack_corpus` did."""

    out_dir: Path
    shards: list[str] = field(default_factory=list)
    n_lines: int = 0
    n_samples: int = 0
    n_resumed_shards: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    @property
    def n_rejected(self) -> int:
        return sum(self.rejected.values())

    def summary(self) -> str:
        rate = self.n_rejected / self.n_lines if self.n_lines else 0.0
        head = (
            f"packed {self.n_samples} of {self.n_lines} records into {len(self.shards)} shards in {self.out_dir} "
            f"({self.n_resumed_shards} already complete); rejected {self.n_rejected} ({100 * rate:.2f}%)"
        )
        if self.rejected:
            head += ": " + ", ".join(f"{k}={v}" for k, v in sorted(self.rejected.items()))
        return "\n".join([head] + [f"  {e}" for e in self.examples])


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0  # deterministic bytes for identical input
    tar.addfile(info, io.BytesIO(data))


def _load_for_pack(rec: CorpusRecord, root: Path, verify_images: bool, max_pixels: int | None) -> dict[str, bytes]:
    members: dict[str, bytes] = {}
    for slot, rel in (("1", rec.image1), ("2", rec.image2)):
        path = root / rel  # a path, or an image reference (SHARD.tar::MEMBER, FILE.parquet::ROW::COL): namc.data.refs
        try:
            data = read_ref(rel, root)
        except FileNotFoundError as err:
            raise RecordError(IssueKind.MISSING_IMAGE, f"image{slot} not found: {err}") from None
        except OSError as err:
            raise RecordError(IssueKind.CORRUPT_IMAGE, f"image{slot} unreadable: {path}: {err}") from None
        if verify_images:
            try:
                open_image(data, max_pixels)
            except (*IMAGE_ERRORS, ImageTooLargeError) as err:
                raise image_error(err, f"image{slot}", path) from None
        members[f"{slot}.{ref_ext(rel, data)}"] = data
    if rec.codes is not None:
        path = root / rec.codes
        try:
            data = path.read_bytes()
            read_codes(data)
        except (OSError, ValueError) as err:
            raise RecordError(IssueKind.BAD_CODES, f"codes {path}: {err}") from None
        members["codes.npy"] = data
    return members


def _write_shard(
    lines: list[tuple[int, str]],
    manifest: Path,
    tar_path: Path,
    duplicates: dict[int, int],
    verify_images: bool,
    max_pixels: int | None,
) -> dict[str, Any]:
    """Writes one shard from its manifest lines; returns the sidecar dict."""
    partial = tar_path.with_name(tar_path.name + ".partial")
    rejected: dict[str, int] = {}
    examples: list[str] = []
    n = 0
    with tarfile.open(partial, "w") as tar:
        for line_no, line in lines:
            where = f"{manifest}:{line_no}"
            try:
                rec = parse_record(parse_line(line))
                if line_no in duplicates:
                    raise RecordError(IssueKind.DUPLICATE_ID, f"id {rec.id!r} is taken by line {duplicates[line_no]}")
                members = _load_for_pack(rec, manifest.parent, verify_images, max_pixels)
            except RecordError as err:
                rejected[err.kind.value] = rejected.get(err.kind.value, 0) + 1
                examples.append(f"{where}: {err.kind.value}: {err}")
                continue
            key = f"{line_no - 1:09d}"
            _add_member(tar, f"{key}.json", json.dumps(rec.to_json(with_paths=False), ensure_ascii=False).encode())
            for ext, data in members.items():
                _add_member(tar, f"{key}.{ext}", data)
            n += 1
    digest = hashlib.blake2b(digest_size=16)
    with open(partial, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    os.replace(partial, tar_path)
    return {"samples": n, "rejected": rejected, "examples": examples[:20], "tar_digest": digest.hexdigest()}


def _read_sidecar(path: Path) -> dict[str, Any] | None:
    try:
        side = loads(path.read_bytes())
    except (OSError, JSONError):
        return None  # rewritten with its shard
    return side if isinstance(side, dict) and "samples" in side else None


def _lines_digest(lines: list[tuple[int, str]], duplicates: dict[int, int]) -> str:
    """What a shard is packed from: its lines' bytes and which of them lose their id to an earlier line."""
    h = hashlib.blake2b(digest_size=16)
    for _, line in lines:
        h.update(line.raw if isinstance(line, UndecodableLine) else line.encode("utf-8"))
    dups = sorted((n, first) for n, _ in lines if (first := duplicates.get(n)) is not None)
    if dups:  # shards without duplicates keep the digest they had before duplicates were checked
        h.update(json.dumps(dups).encode())
    return h.hexdigest()


def _pack_shard(
    index: int,
    lines: list[tuple[int, str]],
    manifest: Path,
    out: Path,
    duplicates: dict[int, int],
    verify_images: bool,
    max_pixels: int | None,
) -> tuple[str, dict[str, Any], bool]:
    """Writes shard ``index`` from its manifest lines, unless a complete shard of the same lines exists.

    Returns:
        The shard's file name, its sidecar dict, and whether it was already complete (resumed).
    """
    tar_path = out / SHARD_PATTERN.format(index)
    side_path = tar_path.with_suffix(".json")
    digest = _lines_digest(lines, duplicates)
    side = _read_sidecar(side_path) if tar_path.exists() else None
    if side is not None and side.get("lines_digest") == digest:
        return tar_path.name, side, True
    # missing, partial, or packed from other manifest lines / another shard size: (re)write it
    side_path.unlink(missing_ok=True)
    for what in TARGET_FILES:  # made from the old shard: its rows would join other images by key
        targets_path(tar_path, what).unlink(missing_ok=True)
    side = _write_shard(lines, manifest, tar_path, duplicates, verify_images, max_pixels)
    side["lines_digest"] = digest
    side_path.write_text(json.dumps(side, indent=1))
    return tar_path.name, side, False


def _shard_lines(manifest: Path, shard_size: int, n_shards: int) -> Iterator[tuple[int, list[tuple[int, str]]]]:
    """Yields ``(shard index, [(line number, line), ...])`` for all ``n_shards`` shards, empty ones included."""
    current: list[tuple[int, str]] = []
    shard_index = 0
    for line_no, line in iter_manifest(manifest):
        idx = (line_no - 1) // shard_size
        while idx > shard_index:
            yield shard_index, current
            current, shard_index = [], shard_index + 1
        current.append((line_no, line))
    while shard_index < n_shards:
        yield shard_index, current
        current, shard_index = [], shard_index + 1


def _write_index(out: Path, manifest: Path, shard_size: int, report: PackReport) -> None:
    index = {
        "manifest": str(manifest),
        "shard_size": shard_size,
        "shards": [
            {"file": s, "samples": loads((out / s).with_suffix(".json").read_bytes())["samples"]} for s in report.shards
        ],
        "samples": report.n_samples,
        "lines": report.n_lines,
        "rejected": report.rejected,
    }
    (out / INDEX_FILE).write_text(json.dumps(index, indent=1))


def pack_corpus(
    manifest: str | Path,
    out_dir: str | Path,
    shard_size: int = 1000,
    verify_images: bool = True,
    progress: bool = True,
    max_image_pixels: int | None = MAX_IMAGE_PIXELS,
) -> PackReport:
    """Packs a JSONL manifest into tar shards, validating descriptions, labels, codes and images.

    Args:
        manifest: the JSONL manifest (image paths relative to its folder).
        out_dir: folder for ``shard-%06d.tar``, their ``.json`` sidecars and ``index.json``.
        shard_size: manifest lines per shard.
        verify_images: fully decode every image (catches truncated files and, from the header, images over
            ``max_image_pixels``; costs a decode per image).
        progress: show a tqdm progress bar over manifest lines.
        max_image_pixels: with ``verify_images``, reject an image whose width x height exceeds this
            (``oversized_image``); None: no cap (see :mod:`namc.data.transforms`).

    Returns:
        A :class:`PackReport`; rejected lines are counted by :class:`IssueKind` value and the first ones listed.
    """
    from tqdm import tqdm

    if shard_size <= 0:
        raise ValueError("shard_size must be positive")
    manifest = Path(manifest)
    if not manifest.is_file():
        raise FileNotFoundError(f"manifest not found: {manifest}" + (" (a folder)" if manifest.is_dir() else ""))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = PackReport(out_dir=out)

    with open(manifest, "rb") as f:  # bytes: a line that is not UTF-8 is rejected by itself, not the whole file
        n_physical = sum(1 for _ in f)
    n_shards = (n_physical + shard_size - 1) // shard_size
    duplicates = duplicate_lines(manifest)
    bar = tqdm(total=n_physical, desc=f"packing {manifest.name}", unit="line", disable=not progress)
    for index, lines in _shard_lines(manifest, shard_size, n_shards):
        name, side, resumed = _pack_shard(index, lines, manifest, out, duplicates, verify_images, max_image_pixels)
        if resumed:
            report.n_resumed_shards += 1
        report.shards.append(name)
        report.n_samples += side["samples"]
        for k, v in side["rejected"].items():
            report.rejected[k] = report.rejected.get(k, 0) + v
        report.examples.extend(side["examples"][: max(0, 20 - len(report.examples))])
        bar.update(min(shard_size, n_physical - index * shard_size))
    bar.close()

    report.n_lines = sum(1 for _ in iter_manifest(manifest))
    _write_index(out, manifest, shard_size, report)
    logger.info(report.summary())
    return report
