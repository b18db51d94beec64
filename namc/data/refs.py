"""Image references: one string that names the bytes of an image wherever they are stored.

The curation pipeline never copies images: ``images.jsonl``, ``pairs.jsonl`` and the corpus manifest hold references
that ``namc data pack`` (and the embedding step) read through :func:`read_ref`. Three forms:

- ``path/to/image.jpg``: a file, absolute or relative to ``base`` (the folder of the JSONL that holds the reference).
- ``SHARD.tar::MEMBER``: a member of a tar file, e.g. ``/data/cc3m/00000.tar::000000042.jpg`` in a WebDataset shard
  as img2dataset writes it.
- ``FILE.parquet::ROW::COLUMN``: the image cell of row ``ROW`` (0-based, over the whole file) of a parquet file, e.g.
  ``train-00000-of-00262.parquet::17::edited_image`` in the Hub's InstructPix2Pix release. The cell is the encoded
  bytes, or a struct with a ``bytes`` field as the Hugging Face ``Image`` feature stores it.

A reference is a tar or parquet reference only when the part before the first ``::`` ends in ``.tar`` /
``.parquet`` (and, for parquet, ``ROW`` is an integer); anything else is a plain path.

Reading many members of one tar or many rows of one parquet file is the common case (``namc data pack`` walks a
manifest in order), so each process keeps a few open tar files with their member tables and the last row group read
per parquet file and column. pyarrow is imported only when a parquet reference is read (it is a ``[curate]`` extra).

A tar member is read only when its header's size is within :data:`namc.data.tars.MAX_MEMBER_BYTES` and the file
holds all of it, and a member name that appears twice in one tar is refused rather than resolved to either copy.

Errors name the reference in one line: :class:`FileNotFoundError` for a missing file, member or row (so a reader
counts it as ``missing_image``), :class:`RefError` (an ``OSError``) for a tar or parquet file that cannot be read,
a column that is not there or a cell that holds no bytes.
"""

from __future__ import annotations

import os
import tarfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from namc.data.tars import MAX_MEMBER_BYTES

__all__ = ["ImageRef", "RefError", "parquet_ref", "parse_ref", "read_ref", "rebase_ref", "ref_ext", "tar_ref"]

SEP = "::"
_MAX_OPEN = 8  # open tar files / cached parquet row groups kept per process


class RefError(OSError):
    """An image reference that cannot be read (the message names the reference)."""


@dataclass(frozen=True)
class ImageRef:
    """A parsed reference: ``kind`` is ``"path"``, ``"tar"`` or ``"parquet"``; ``member`` / ``row`` + ``column``
    locate the image inside ``file``."""

    kind: str
    file: str
    member: str | None = None
    row: int | None = None
    column: str | None = None


def tar_ref(shard: str | Path, member: str) -> str:
    """``"SHARD.tar::MEMBER"``."""
    return f"{shard}{SEP}{member}"


def parquet_ref(file: str | Path, row: int, column: str) -> str:
    """``"FILE.parquet::ROW::COLUMN"``."""
    return f"{file}{SEP}{int(row)}{SEP}{column}"


def parse_ref(ref: str) -> ImageRef:
    """Splits a reference into its parts (see the module docstring for the forms)."""
    if not isinstance(ref, str) or not ref:
        raise RefError(f"image reference must be a non-empty string, got {ref!r}")
    if SEP in ref:
        head, rest = ref.split(SEP, 1)
        if head.endswith(".tar") and rest:
            return ImageRef("tar", head, member=rest)
        if head.endswith(".parquet") and SEP in rest:
            row, column = rest.split(SEP, 1)
            if row.isdigit() and column:
                return ImageRef("parquet", head, row=int(row), column=column)
    return ImageRef("path", ref)


def _resolve(file: str, base: str | Path | None) -> Path:
    p = Path(file)
    return p if p.is_absolute() or base is None else Path(base) / p


# ---- tar members ---------------------------------------------------------------------------------------------------

_lock = threading.Lock()
# per open tar: its regular members by name (None: a name that appears twice, which no reference may pick)
_Members = dict[str, tarfile.TarInfo | None]
_tars: OrderedDict[tuple[str, int, int], tuple[tarfile.TarFile, _Members]] = OrderedDict()


def _file_id(path: Path) -> tuple[str, int, int]:
    st = path.stat()  # FileNotFoundError for a missing file
    return str(path.resolve()), st.st_mtime_ns, st.st_size


def _open_tar(path: Path, ref: str) -> tuple[tarfile.TarFile, _Members]:
    key = _file_id(path)
    entry = _tars.get(key)
    if entry is not None:
        _tars.move_to_end(key)
        return entry
    try:
        tar = tarfile.open(path, "r:")  # noqa: SIM115  (kept open in the cache, closed on eviction)
        members: _Members = {}
        for m in tar.getmembers():
            if m.isfile():
                members[m.name] = None if m.name in members else m
    except (tarfile.TarError, OSError, EOFError) as err:
        # a truncated shard: keep what could be listed before the damage
        raise RefError(f"{ref}: cannot read tar file {path}: {type(err).__name__}: {err}") from None
    _tars[key] = (tar, members)
    while len(_tars) > _MAX_OPEN:
        _, (old, _) = _tars.popitem(last=False)
        old.close()
    return tar, members


def _read_tar(path: Path, member: str, ref: str) -> bytes:
    with _lock:  # one TarFile object is not safe to read from two threads at once
        tar, members = _open_tar(path, ref)
        if member not in members:
            raise FileNotFoundError(f"{ref}: no member {member!r} in {path}")
        info = members[member]
        if info is None:
            raise RefError(f"{ref}: member {member!r} appears twice in {path}: which copy is the image is unknown")
        if info.size > MAX_MEMBER_BYTES:  # a header's size is not trusted: refuse before allocating it
            raise RefError(f"{ref}: member {member!r} declares {info.size:,} bytes, over {MAX_MEMBER_BYTES:,}")
        if info.offset_data + info.size > _file_id(path)[2]:
            raise RefError(f"{ref}: member {member!r} is truncated (its data runs past the end of {path})")
        try:
            f = tar.extractfile(info)
            data = f.read(info.size) if f is not None else None
        except (tarfile.TarError, OSError, EOFError) as err:
            raise RefError(f"{ref}: cannot read member {member!r}: {type(err).__name__}: {err}") from None
    if data is None or len(data) != info.size:
        raise RefError(
            f"{ref}: member {member!r} is truncated ({0 if data is None else len(data)} of {info.size} bytes)"
        )
    return data


# ---- parquet cells -------------------------------------------------------------------------------------------------

_groups: OrderedDict[tuple[tuple[str, int, int], str, int], list[Any]] = OrderedDict()
_offsets: dict[tuple[str, int, int], list[int]] = {}
_parquets: OrderedDict[tuple[str, int, int], Any] = OrderedDict()  # open pyarrow.parquet.ParquetFile objects


def _cell_bytes(cell: Any, ref: str) -> bytes:
    if isinstance(cell, dict):
        cell = cell.get("bytes")
    if isinstance(cell, bytes | bytearray | memoryview) and len(cell):
        return bytes(cell)
    raise RefError(f"{ref}: the cell holds no image bytes ({type(cell).__name__})")


def _read_parquet(path: Path, row: int, column: str, ref: str) -> bytes:
    import pyarrow.parquet as pq

    key = _file_id(path)
    with _lock:
        pf = _parquets.get(key)
        if pf is None:
            try:
                pf = pq.ParquetFile(path)
            except Exception as err:  # pyarrow raises ArrowInvalid / OSError for a corrupt or non-parquet file
                raise RefError(f"{ref}: cannot read parquet file {path}: {type(err).__name__}: {err}") from None
            _parquets[key] = pf
            while len(_parquets) > _MAX_OPEN:
                _parquets.popitem(last=False)
        else:
            _parquets.move_to_end(key)
        if column not in pf.schema_arrow.names:
            raise RefError(f"{ref}: no column {column!r} in {path} (columns: {', '.join(pf.schema_arrow.names)})")
        offsets = _offsets.get(key)
        if offsets is None:
            offsets = [0]
            for i in range(pf.metadata.num_row_groups):
                offsets.append(offsets[-1] + pf.metadata.row_group(i).num_rows)
            _offsets[key] = offsets
        if row >= offsets[-1]:
            raise FileNotFoundError(f"{ref}: no row {row} in {path} ({offsets[-1]} rows)")
        group = next(i for i in range(len(offsets) - 1) if offsets[i] <= row < offsets[i + 1])
        gkey = (key, column, group)
        cells = _groups.get(gkey)
        if cells is None:
            try:
                cells = pf.read_row_group(group, columns=[column]).column(0).to_pylist()
            except Exception as err:
                raise RefError(f"{ref}: cannot read row group {group} of {path}: {type(err).__name__}: {err}") from None
            _groups[gkey] = cells
            while len(_groups) > _MAX_OPEN:
                _groups.popitem(last=False)
        else:
            _groups.move_to_end(gkey)
        cell = cells[row - offsets[group]]
    return _cell_bytes(cell, ref)


# ---- public --------------------------------------------------------------------------------------------------------


def read_ref(ref: str, base: str | Path | None = None) -> bytes:
    """The bytes an image reference names.

    Args:
        ref: a path, ``SHARD.tar::MEMBER`` or ``FILE.parquet::ROW::COLUMN``.
        base: the folder relative file parts are taken from (the folder of the JSONL holding ``ref``).

    Raises:
        FileNotFoundError: the file, the tar member or the parquet row does not exist (message names ``ref``).
        RefError: an unreadable tar or parquet file, a missing column, a cell without bytes, a truncated member.
        OSError: an unreadable plain file (a directory, no permission).
    """
    parsed = parse_ref(ref)
    path = _resolve(parsed.file, base)
    if parsed.kind == "path":
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(str(path)) from None  # the message is the path: "image1 not found: PATH"
        except IsADirectoryError:
            raise RefError(f"{path} is a directory, not an image file") from None
    if not path.is_file():
        raise FileNotFoundError(f"{ref}: file not found: {path}")
    if parsed.kind == "tar":
        return _read_tar(path, parsed.member or "", ref)
    return _read_parquet(path, parsed.row or 0, parsed.column or "", ref)


def ref_ext(ref: str, data: bytes | None = None) -> str:
    """The image's file extension without the dot (``jpg``, ``png``, ...): from the path or member name, else sniffed
    from the first bytes (parquet cells), else ``img``."""
    parsed = parse_ref(ref)
    name = parsed.member if parsed.kind == "tar" else parsed.file if parsed.kind == "path" else ""
    ext = os.path.splitext(name or "")[1].lower().lstrip(".")
    if ext:
        return {"jpeg": "jpg"}.get(ext, ext)
    if data:
        for magic, kind in ((b"\xff\xd8", "jpg"), (b"\x89PNG", "png"), (b"GIF8", "gif"), (b"BM", "bmp")):
            if data.startswith(magic):
                return kind
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            return "webp"
    return "img"


def rebase_ref(ref: str, from_dir: str | Path, to_dir: str | Path) -> str:
    """``ref`` as written in a JSONL in ``from_dir``, rewritten for a JSONL in ``to_dir`` (absolute when no relative
    path exists between them)."""
    parsed = parse_ref(ref)
    if Path(parsed.file).is_absolute():
        return ref
    target = Path(from_dir, parsed.file).absolute()
    try:
        new = os.path.relpath(target, Path(to_dir).absolute())
    except ValueError:  # another drive (Windows)
        new = str(target)
    return new + ref[len(parsed.file) :]
