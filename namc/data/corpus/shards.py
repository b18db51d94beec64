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
- A member over :data:`namc.data.tars.MAX_MEMBER_BYTES` is a break like a short member: no header's size is
  trusted (:mod:`namc.data.tars`).
- A sample or member that appears twice in one shard is skipped after its first copy and counted as
  ``duplicate_id`` (the first copy is what the shard's index counts).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from namc.data.issues import DataIssues, IssueKind
from namc.data.tars import MAX_MEMBER_BYTES, TarReadError, iter_tar_files
from namc.jsonl import JSONError, loads

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
        entries = loads(index.read_bytes())["shards"]
        if not isinstance(entries, list) or not all(isinstance(e, dict) and "file" in e for e in entries):
            raise TypeError("'shards' must be a list of {file, samples} entries")
        return entries
    except JSONError as err:  # invalid, not UTF-8, too deep, a duplicate key
        problem = str(err)
    except (OSError, KeyError, TypeError) as err:
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
        samples = loads(side.read_bytes()).get("samples")
    except (OSError, JSONError, AttributeError):
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


def _split_name(name: str) -> tuple[str, str] | None:
    """``"dir/000001.1.png"`` -> ``("dir/000001", "1.png")``; None for a member without an extension."""
    base = name.rsplit("/", 1)[-1]
    if "." not in base:
        return None
    k, ext = base.split(".", 1)
    return name[: len(name) - len(base)] + k, ext


class _Samples:
    """Groups a shard's members into samples (consecutive members sharing a key); a repeat is skipped and counted.

    A member name seen before in the open sample, or a key whose sample already closed, is a repeat (a tar
    appended to, or two packs written into one file): the first copy is kept, so a repeated member never replaces
    the image the sample was packed with, and each repeated key counts once as ``duplicate_id``.
    """

    def __init__(self, path: Path, issues: DataIssues) -> None:
        self.path, self.issues = path, issues
        self.key: str | None = None
        self.group: dict[str, bytes] = {}
        self._closed: set[str] = set()
        self._counted: set[str] = set()

    def add(self, key: str, ext: str, data: bytes) -> tuple[str, dict[str, bytes]] | None:
        """Adds one member; returns the sample it closed, if any."""
        if key == self.key:
            if ext in self.group:
                self._repeat(key, f"member {key}.{ext} appears twice in the shard")
            else:
                self.group[ext] = data
            return None
        if key in self._closed:
            self._repeat(key, f"sample {key} appears again after other samples")
            return None
        closed = (self.key, self.group) if self.key is not None else None
        if self.key is not None:
            self._closed.add(self.key)
        self.key, self.group = key, {ext: data}
        return closed

    def _repeat(self, key: str, detail: str) -> None:
        if key not in self._counted:
            self._counted.add(key)
            self.issues.add(IssueKind.DUPLICATE_ID, f"{self.path}:{key}", f"{detail}; the repeat is skipped")


def iter_tar_groups(
    path: Path, issues: DataIssues, expected: int | None = None, max_member_bytes: int = MAX_MEMBER_BYTES
) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yields ``(key, {ext: bytes})`` for consecutive members sharing a key.

    A shard that fails to read, has a short member or one over ``max_member_bytes`` (read through
    :func:`namc.data.tars.iter_tar_files`, which never trusts a header's size), lacks its end-of-archive marker, or
    yields fewer samples than ``expected`` (its ``index.json`` or sidecar count) is reported as one ``corrupt_shard``
    issue whose ``n`` is the number of samples lost, by the rule in the module docstring. A repeated sample or member
    is skipped and counted as ``duplicate_id`` (:class:`_Samples`).
    """
    samples = _Samples(path, issues)
    n_yielded = 0
    error = ""
    at_boundary = True  # the open sample's members, if any, were all read whole
    try:
        for name, data in iter_tar_files(path, max_member_bytes=max_member_bytes):
            parts = _split_name(name)
            if parts is not None and (closed := samples.add(*parts, data)) is not None:
                n_yielded += 1
                yield closed
    except TarReadError as err:
        error, at_boundary = str(err), err.at_boundary
    except OSError as err:
        error = f"{type(err).__name__}: {err}"
    key, group = samples.key, samples.group
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
