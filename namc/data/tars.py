"""Reading tar files whose headers may lie: :func:`iter_tar_files`, bounded in memory and in time.

A tar member's header declares its size, and Python's ``tarfile`` trusts it: in stream mode it skips an unread
member by reading ``size / 10 KiB`` blocks even after the file has ended (a header declaring 2^60 bytes keeps a
reader busy for hours), and ``extractfile(member).read()`` allocates whatever the header says before any check of
the content can run. Corpus shards, WebDataset shards and image-reference tars all come from elsewhere, so every tar
namc reads goes through this module:

- a member larger than ``max_member_bytes`` (read or skipped) stops the archive with :class:`TarReadError`, before
  any of its data is read;
- a member whose data runs past the end of the file (when the file's size is known) stops it the same way;
- no loop runs longer than the bytes actually present, so a reader never hangs on a header.

Regular files are yielded as ``(name, bytes)`` in archive order; directories, links and other entries are skipped.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["MAX_MEMBER_BYTES", "TarReadError", "check_tar_end", "iter_tar_files"]

# one member of a shard: a photo is a few MB and a record a few kB; a larger member is a lying header or not a shard
MAX_MEMBER_BYTES = 64 * 1024 * 1024


class TarReadError(ValueError):
    """A tar file that cannot be read on (broken header, truncated member, member over the size limit).

    Attributes:
        at_boundary: True when the break fell between members: a header that cannot be read, or one refused (over
            the limit, past the end of the file) before any of its data was read; False when reading a member's
            data failed.
        offset: the archive offset reached (the end of the last member yielded).
    """

    def __init__(self, message: str, at_boundary: bool, offset: int) -> None:
        super().__init__(message)
        self.at_boundary = at_boundary
        self.offset = offset


def check_tar_end(path: Path, offset: int) -> str:
    """``""`` if the archive ends with its end-of-archive marker (two zero blocks) after ``offset``, else the problem.

    ``tarfile`` stops silently at a missing or truncated header, so an archive cut at a member boundary would lose its
    tail unnoticed.
    """
    size = path.stat().st_size
    if size - offset < 2 * tarfile.BLOCKSIZE:
        return f"no end-of-archive marker after byte {offset} (file has {size} bytes): truncated"
    with open(path, "rb") as f:
        f.seek(offset)
        if f.read(2 * tarfile.BLOCKSIZE).strip(b"\0"):
            return f"unreadable data after byte {offset}: truncated or corrupt header"
    return ""


def _blocks(size: int) -> int:
    """Bytes a member of ``size`` data bytes occupies in the archive (padded to whole 512-byte blocks)."""
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _members(
    tar: tarfile.TarFile, total: int | None, max_member_bytes: int, wanted: Callable[[str], bool] | None
) -> Iterator[tuple[str, bytes]]:
    """The body of :func:`iter_tar_files` over an open stream-mode ``tar``."""
    stream = tar.fileobj  # the _Stream: tell() is where this member's data starts
    end = 0  # archive offset after the last member yielded (or skipped whole)
    for member in tar:
        start = stream.tell()
        span = tar.offset - start  # what advancing past this member reads or skips
        if member.size > max_member_bytes or span > _blocks(max_member_bytes):
            raise TarReadError(
                f"member {member.name!r} declares {member.size:,} bytes, over the limit of {max_member_bytes:,}",
                True,
                end,
            )
        if total is not None and start + member.size > total:
            raise TarReadError(
                f"member {member.name!r} is truncated ({max(0, total - start):,} of {member.size:,} bytes in the file)",
                True,
                end,
            )
        if member.isfile() and (wanted is None or wanted(member.name)):
            try:
                f = tar.extractfile(member)
                data = f.read(member.size) if f is not None else b""
            except (tarfile.TarError, OSError, EOFError) as err:  # the stream ended inside this member
                raise TarReadError(f"member {member.name}: {type(err).__name__}: {err}", False, end) from None
            if len(data) != member.size:
                raise TarReadError(
                    f"member {member.name} is truncated ({len(data)} of {member.size} bytes)", False, end
                )
            end = tar.offset
            yield member.name, data
        else:
            end = tar.offset


def iter_tar_files(
    source: str | os.PathLike | BinaryIO,
    *,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    wanted: Callable[[str], bool] | None = None,
    check_end: bool = True,
) -> Iterator[tuple[str, bytes]]:
    """Yields ``(member name, data)`` for the regular files of a tar archive, in order, within bounds.

    Args:
        source: a path, or a binary file object read from its current position (a pipe or socket works: it is read
            forward only).
        max_member_bytes: the largest member accepted (read or skipped).
        wanted: read only members whose name it accepts (the others are skipped, within the same bounds).
        check_end: for a path, require the end-of-archive marker after the last member (a file cut at a member
            boundary reads as a shorter archive otherwise).

    Raises:
        TarReadError: a header that cannot be read, a truncated member, a member over ``max_member_bytes`` or a
            missing end-of-archive marker; the members before it were yielded (see ``at_boundary``).
        FileNotFoundError: no file at ``source``.
    """
    path = Path(source) if isinstance(source, str | os.PathLike) else None
    end = 0
    try:
        with open(path, "rb") if path is not None else _borrowed(source) as raw:
            total = os.fstat(raw.fileno()).st_size if path is not None else None
            with tarfile.open(fileobj=raw, mode="r|") as tar:
                for name, data in _members(tar, total, max_member_bytes, wanted):
                    end = tar.offset
                    yield name, data
                end = tar.offset  # where the end-of-archive marker should start
    except (TarReadError, FileNotFoundError):
        raise
    except (tarfile.TarError, OSError, EOFError) as err:  # a header that cannot be read: between members
        raise TarReadError(f"{type(err).__name__}: {err}", True, end) from None
    if check_end and path is not None and (problem := check_tar_end(path, end)):
        raise TarReadError(problem, True, end)


class _borrowed:
    """A caller's file object as a context manager that leaves it open."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def __enter__(self) -> BinaryIO:
        return self.f

    def __exit__(self, *exc: object) -> None:
        return None
