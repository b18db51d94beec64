"""The corpus's tar shard format (WebDataset-style): names, the index file, and reading samples back.

Shards (``shard-000000.tar`` ...; one sample = consecutive members sharing a key without dots, as in WebDataset)::

    {key}.json        the manifest record without the path fields
    {key}.1.png|jpg   first image, bytes copied from the source file
    {key}.2.png|jpg   second image
    {key}.codes.npy   optional codes, shape (2, N)

Each shard has a sidecar ``shard-%06d.json`` (its counts and a digest of its manifest lines, written by
:func:`namc.data.corpus.pack.pack_corpus`), and ``index.json`` beside them lists the shards, their sample counts
and the totals. A reader checks a shard against its expected count (``index.json``, else the sidecar) and its
end-of-archive marker, so a truncated shard is reported instead of silently losing its tail.

Accounting for a damaged shard (:func:`iter_tar_groups`), exactly:

- A sample is *closed* once a member of the next key starts (members of a sample are consecutive): every closed
  sample is yielded, even when the shard breaks right after it.
- The sample open when the shard breaks (a short member, a read error, or the end of the file without the
  end-of-archive marker) is yielded only if the break fell on a member boundary and it already holds its ``json``
  and both images; its optional ``codes.npy`` may have been cut (the VQGAN then computes the codes). Otherwise it
  is dropped.
- Samples lost = expected - yielded when the expected count is known (``index.json``, else the shard's sidecar);
  they are counted as one ``corrupt_shard`` issue with ``n`` = that number (and samples the reader yields but the
  dataset rejects, e.g. ``incomplete_sample``, are counted there, never twice). Without either file the tail after
  the break is unknowable: the count is the one open sample dropped (0 or 1) and the reason says "at least".
- A shard that breaks without losing a sample is still reported (an example with ``n = 0``), so the damage shows.
"""

from __future__ import annotations

import json
import logging
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from namc.data.issues import DataIssues, IssueKind

__all__ = ["INDEX_FILE", "SHARD_PATTERN", "is_complete", "iter_tar_groups", "list_shards", "shard_sizes"]

logger = logging.getLogger(__name__)

SHARD_PATTERN = "shard-{:06d}.tar"
INDEX_FILE = "index.json"


def _read_index(folder: Path) -> list[dict] | None:
    """The ``shards`` entries of ``folder/index.json``; None (and a warning naming the problem) if it is unusable."""
    index = folder / INDEX_FILE
    if not index.exists():
        return None
    try:
        entries = json.loads(index.read_bytes().decode("utf-8"))["shards"]
        if not isinstance(entries, list) or not all(isinstance(e, dict) and "file" in e for e in entries):
            raise TypeError("'shards' must be a list of {file, samples} entries")
        return entries
    except json.JSONDecodeError as err:
        problem = f"invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}"
    except (OSError, UnicodeDecodeError, KeyError, TypeError) as err:
        problem = f"{type(err).__name__}: {err}"
    logger.warning(
        "%s is unreadable (%s): reading the folder's *.tar in sorted order, sample counts from the shards' sidecars; "
        "rerun `namc data pack` to rewrite it",
        index,
        problem,
    )
    return None


def list_shards(folder: str | Path) -> list[Path]:
    """The shards of a packed folder: in ``index.json`` order, or sorted ``*.tar`` when it is absent or unreadable.

    Raises:
        FileNotFoundError: the folder holds no shard.
    """
    folder = Path(folder)
    entries = _read_index(folder)
    shards = [folder / str(e["file"]) for e in entries] if entries is not None else sorted(folder.glob("*.tar"))
    if not shards:
        raise FileNotFoundError(f"no shards (*.tar) in {folder}: pack a manifest into it with `namc data pack`")
    return shards


def _sidecar_size(shard: Path) -> int | None:
    """The sample count in a shard's sidecar ``shard-%06d.json`` (None when absent or unreadable)."""
    side = shard.with_suffix(".json")
    if side.name == INDEX_FILE or not side.is_file():
        return None
    try:
        samples = json.loads(side.read_bytes().decode("utf-8")).get("samples")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    return samples if isinstance(samples, int) and not isinstance(samples, bool) and samples >= 0 else None


def shard_sizes(shards: Sequence[Path]) -> dict[Path, int]:
    """Expected sample counts of shards: from the ``index.json`` beside them, else from each shard's sidecar.

    Shards with neither are left out (their losses can only be bounded from below).
    """
    sizes: dict[Path, int] = {}
    for folder in {p.parent for p in shards}:
        for e in _read_index(folder) or []:
            try:
                sizes[folder / str(e["file"])] = int(e["samples"])
            except (KeyError, TypeError, ValueError):
                continue
    for shard in shards:
        if shard not in sizes and (n := _sidecar_size(shard)) is not None:
            sizes[shard] = n
    return sizes


def is_complete(group: dict[str, bytes]) -> bool:
    """Whether a sample holds its ``json`` and both images."""
    return "json" in group and any(k.startswith("1.") for k in group) and any(k.startswith("2.") for k in group)


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


def _split_name(name: str) -> tuple[str, str] | None:
    """``"dir/000001.1.png"`` -> ``("dir/000001", "1.png")``; None for a member without an extension."""
    base = name.rsplit("/", 1)[-1]
    if "." not in base:
        return None
    k, ext = base.split(".", 1)
    return name[: len(name) - len(base)] + k, ext


def iter_tar_groups(
    path: Path, issues: DataIssues, expected: int | None = None
) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yields ``(key, {ext: bytes})`` for consecutive members sharing a key.

    A shard that fails to read, has a short member, lacks its end-of-archive marker, or yields fewer samples than
    ``expected`` (its ``index.json`` or sidecar count) is reported as one ``corrupt_shard`` issue whose ``n`` is
    the number of samples lost, by the rule in the module docstring.
    """
    key: str | None = None
    group: dict[str, bytes] = {}
    n_yielded = 0
    error = ""
    in_member = False  # a member's data is being read: a break now cuts the open sample
    try:
        with tarfile.open(path, mode="r|") as tar:
            for member in tar:
                parts = _split_name(member.name) if member.isfile() else None
                if parts is None:
                    continue
                k, ext = parts
                if k != key:
                    if key is not None:  # the previous sample is closed: a member of the next key has started
                        n_yielded += 1
                        yield key, group
                    key, group = k, {}
                in_member = True
                f = tar.extractfile(member)
                data = f.read() if f is not None else b""
                if len(data) != member.size:
                    error = f"member {member.name} is truncated ({len(data)} of {member.size} bytes)"
                    break
                group[ext] = data
                in_member = False
            else:
                error = _check_tar_end(path, tar.offset)
    except (tarfile.TarError, OSError, EOFError) as err:
        error = f"{type(err).__name__}: {err}"
    at_boundary = not in_member  # the open sample's members, if any, were all read whole
    if key is not None and (not error or (at_boundary and is_complete(group))):
        n_yielded += 1
        key_open = False
        yield key, group
    else:
        key_open = key is not None
    if not error and expected is not None and n_yielded < expected:
        error = f"{n_yielded} samples, {expected} expected"
    if not error:
        if expected is not None and n_yielded > expected:
            logger.warning("%s: %d samples, its index says %d (a stale index?)", path, n_yielded, expected)
        return
    if expected is not None:
        lost = max(expected - n_yielded, int(key_open))
        reason = f"{lost} of {expected} samples lost"
    else:
        lost = int(key_open)
        reason = (
            f"at least {lost} sample{'s' if lost != 1 else ''} lost (how many followed the break is unknowable "
            "without index.json or the shard's sidecar)"
        )
    issues.add(IssueKind.CORRUPT_SHARD, str(path), f"{error}; {reason}", n=lost)
