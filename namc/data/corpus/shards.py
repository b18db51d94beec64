"""The corpus's tar shard format (WebDataset-style): names, the index file, and reading samples back.

Shards (``shard-000000.tar`` ...; one sample = consecutive members sharing a key without dots, as in WebDataset)::

    {key}.json        the manifest record without the path fields
    {key}.1.png|jpg   first image, bytes copied from the source file
    {key}.2.png|jpg   second image
    {key}.codes.npy   optional codes, shape (2, N)

Each shard has a sidecar ``shard-%06d.json`` (its counts and a digest of its manifest lines, written by
:func:`namc.data.corpus.pack.pack_corpus`), and ``index.json`` beside them lists the shards, their sample counts
and the totals. A reader checks a shard against its ``index.json`` count and its end-of-archive marker, so a
truncated shard is reported instead of silently losing its tail.
"""

from __future__ import annotations

import json
import logging
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from namc.data.issues import DataIssues, IssueKind

__all__ = ["INDEX_FILE", "SHARD_PATTERN", "iter_tar_groups", "shard_sizes"]

logger = logging.getLogger(__name__)

SHARD_PATTERN = "shard-{:06d}.tar"
INDEX_FILE = "index.json"


def shard_sizes(shards: Sequence[Path]) -> dict[Path, int]:
    """Sample counts of shards listed in the ``index.json`` beside them (shards without one are left out)."""
    sizes: dict[Path, int] = {}
    for folder in {p.parent for p in shards}:
        index = folder / INDEX_FILE
        if index.exists():
            try:
                entries = json.loads(index.read_text())["shards"]
                sizes.update({folder / e["file"]: int(e["samples"]) for e in entries})
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                logger.warning("%s: unreadable (%s); shard sizes are not checked", index, err)
    return sizes


def _check_tar_end(path: Path, offset: int) -> str:
    """ "" if the archive ends with its end-of-archive marker (two zero blocks) after ``offset``, else the problem.

    tarfile stops silently at a truncated header, so a shard cut at a member boundary would lose its tail unnoticed.
    """
    size = path.stat().st_size
    if size - offset < 2 * tarfile.BLOCKSIZE:
        return f"no end-of-archive marker after byte {offset} (file has {size} bytes): truncated"
    with open(path, "rb") as f:
        f.seek(offset)
        if f.read(2 * tarfile.BLOCKSIZE).strip(b"\0"):
            return f"unreadable data after byte {offset}: truncated or corrupt header"
    return ""


def iter_tar_groups(
    path: Path, issues: DataIssues, expected: int | None = None
) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yields ``(key, {ext: bytes})`` for consecutive members sharing a key.

    A shard that fails to read, has a short member (truncated file), or holds fewer samples than ``expected`` (its
    ``index.json`` count) is reported as ``corrupt_shard``: the number of lost samples when ``expected`` is known,
    else one. The sample being read when the error happened is dropped with the rest of the shard.
    """
    key: str | None = None
    group: dict[str, bytes] = {}
    n_groups = 0
    error = ""
    try:
        with tarfile.open(path, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                base = member.name.rsplit("/", 1)[-1]
                if "." not in base:
                    continue
                k, ext = base.split(".", 1)
                k = member.name[: len(member.name) - len(base)] + k
                f = tar.extractfile(member)
                data = f.read() if f is not None else b""
                if len(data) != member.size:
                    error = f"member {member.name} is truncated ({len(data)} of {member.size} bytes)"
                    break
                if k != key:
                    if key is not None:
                        n_groups += 1
                        yield key, group
                    key, group = k, {}
                group[ext] = data
            else:
                error = _check_tar_end(path, tar.offset)
    except (tarfile.TarError, OSError, EOFError) as err:
        error = f"{type(err).__name__}: {err}"
    if not error and key is not None:
        n_groups += 1
        yield key, group
    if not error and expected is not None and n_groups < expected:
        error = f"{n_groups} samples, index.json says {expected}"
    if error:
        lost = max(1, expected - n_groups) if expected is not None else 1
        issues.add(IssueKind.CORRUPT_SHARD, str(path), f"{error}; rest of the shard skipped", n=lost)
