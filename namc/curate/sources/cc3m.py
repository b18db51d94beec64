"""CC3M (Sharma et al. 2018) single images, as img2dataset writes them or as a plain folder with a captions TSV.

- **WebDataset shards** (``kind: webdataset``; root = a folder of ``*.tar``, a glob, a brace pattern such as
  ``/data/cc3m/{00000..00331}.tar``, or one file). img2dataset's ``--output_format webdataset`` writes ``00000.tar``,
  ``00001.tar``, ... each holding ``KEY.jpg`` (the resized image), ``KEY.txt`` (the caption) and ``KEY.json``
  (url, caption, status, sizes), with ``KEY`` = shard number and index within it (``000420031`` is the 32nd sample of
  ``00042.tar``), and a ``00000.parquet`` / ``00000_stats.json`` beside each shard; checked against img2dataset's
  README ("output_format ... webdataset") and NVIDIA NeMo Curator's WebDataset page, which documents that exact
  layout for img2dataset output. Read with the ``webdataset`` package (``wds.WebDataset``, no decoding, shards in
  order); an unreadable or truncated shard is counted as ``corrupt_shard`` (what it yielded before the damage is
  kept), a sample without an image as ``incomplete_sample``. A member header that declares more bytes than the
  file holds (``2**60``) is damage too: the shard's headers are checked first, and the reader is given only the
  bytes before that member (Python's tar stream reader would otherwise skip those bytes block by block, CPU-bound,
  for hours). Images are references ``SHARD.tar::KEY.jpg``; key
  ``cc3m/KEY``; the caption is ``KEY.txt`` (else ``caption`` of ``KEY.json``).
- **Folder + TSV** (``kind: image_tsv``; root = the image folder, ``tsv`` = the captions file). Each line
  ``IMAGE<TAB>CAPTION`` with ``IMAGE`` a path relative to root; a first line whose first field is ``image``,
  ``filepath``, ``file``, ``path`` or ``filename`` is a header. (The released ``Train_GCC-training.tsv`` is
  ``CAPTION<TAB>URL``; once downloaded, write the local file names in the first column.) Key ``cc3m/IMAGE``.
"""

from __future__ import annotations

import glob
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from webdataset.tariterators import group_by_keys, tar_file_expander

from namc.curate.sources.base import ImageItem, SourceSpec, register_source
from namc.data.issues import DataIssues, IssueKind
from namc.data.refs import tar_ref
from namc.jsonl import JSONError, loads

__all__ = ["read_image_tsv", "read_webdataset", "shard_urls"]

_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
_HEADER_NAMES = ("image", "filepath", "file", "path", "filename")


def shard_urls(root: str) -> list[str]:
    """The tar shards a root names: a folder (its ``*.tar``), a glob, a brace pattern, or one file; sorted."""
    path = Path(root)
    if path.is_dir():
        urls = sorted(str(p.absolute()) for p in path.glob("*.tar"))
    elif "{" in root and ".." in root:
        import braceexpand  # a dependency of webdataset

        urls = [str(Path(u).absolute()) for u in braceexpand.braceexpand(root)]
    elif any(c in root for c in "*?["):
        urls = sorted(str(Path(p).absolute()) for p in glob.glob(root))
    else:
        urls = [str(path.absolute())]
    if not urls:
        raise FileNotFoundError(f"{root}: no .tar shards; run img2dataset with --output_format webdataset into it")
    return urls


def _caption(sample: dict[str, Any]) -> str | None:
    txt = sample.get("txt")
    if isinstance(txt, bytes):
        text = txt.decode("utf-8-sig", errors="replace").strip()
        if text:
            return text
    meta = sample.get("json")
    if isinstance(meta, bytes):
        try:
            cap = loads(meta).get("caption")
        except (JSONError, AttributeError):
            return None
        return cap.strip() if isinstance(cap, str) and cap.strip() else None
    return None


class _Prefix(io.RawIOBase):
    """The first ``limit`` bytes of a binary file, as a readable stream (EOF after them)."""

    def __init__(self, f: Any, limit: int) -> None:
        self._f, self._left = f, limit

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        size = self._left if size is None or size < 0 else min(size, self._left)
        data = self._f.read(size)
        self._left -= len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _scan_headers(url: str) -> tuple[dict[str, str], int, str | None]:
    """``({lower-cased member name: member name}, intact bytes, damage)`` of a tar shard, from its headers only.

    ``intact bytes`` ends before the first member whose data would run past the end of the file (``damage`` says
    which), else it is the file's size; headers that do not read leave the names found so far and the whole file to
    the reader, which reports that damage itself.
    """
    size = os.path.getsize(url)
    names: dict[str, str] = {}
    try:
        with tarfile.open(url, "r:") as tar:
            for member in tar:  # random access: the next header is a seek away, never a read through the data
                if member.offset_data + member.size > size:
                    damage = f"member {member.name!r} declares {member.size:,} bytes past the end of the file"
                    return names, member.offset, damage
                names[member.name.lower()] = member.name
    except (tarfile.TarError, OSError):
        pass
    return names, size, None


def _shard_samples(url: str, limit: int, handler: Any) -> Iterator[dict[str, Any]]:
    """webdataset's samples of the first ``limit`` bytes of a shard (its tar expander and key grouping)."""
    with open(url, "rb") as f:
        files = tar_file_expander([{"url": url, "stream": _Prefix(f, limit)}], handler=handler)
        yield from group_by_keys(files, handler=handler)


@register_source("webdataset")
def read_webdataset(spec: SourceSpec, issues: DataIssues) -> Iterator[ImageItem]:
    """Single images of img2dataset WebDataset shards (see the module docstring)."""
    for url in shard_urls(spec.root):
        if not Path(url).is_file():
            issues.add(IssueKind.CORRUPT_SHARD, url, "shard not found")
            continue
        damaged: list[str] = []

        def handler(exn: Exception, url: str = url, damaged: list[str] = damaged) -> bool:
            damaged.append(f"{type(exn).__name__}: {exn}")
            return True  # keep what was read; webdataset goes on with the next shard (there is none)

        members, intact, damage = _scan_headers(url)
        for sample in _shard_samples(url, intact, handler):
            key = sample.get("__key__")
            ext = next((e for e in _IMAGE_EXTS if isinstance(sample.get(e), bytes)), None)
            if not isinstance(key, str) or ext is None:
                issues.add(IssueKind.INCOMPLETE_SAMPLE, f"{url}::{key}", f"no image member ({', '.join(_IMAGE_EXTS)})")
                continue
            name = f"{key}.{ext}"  # webdataset lower-cases the extension: the reference needs the member's own name
            yield ImageItem(
                key=f"{spec.name}/{key}",
                ref=tar_ref(url, members.get(name.lower(), name)),
                caption=_caption(sample),
                data=sample[ext],
            )
        if damage is not None:
            issues.add(IssueKind.CORRUPT_SHARD, url, f"unreadable from here on (what came before kept): {damage}")
        elif damaged:  # webdataset reports one failure at each stage it passes through: one shard, one count
            issues.add(IssueKind.CORRUPT_SHARD, url, f"unreadable from here on (what came before kept): {damaged[0]}")


@register_source("image_tsv")
def read_image_tsv(spec: SourceSpec, issues: DataIssues) -> Iterator[ImageItem]:
    """Single images of a folder listed by a captions TSV (``tsv`` option; see the module docstring)."""
    root = Path(spec.root)
    tsv = spec.options.get("tsv")
    if not tsv:
        raise ValueError(f"source {spec.name!r} (image_tsv): needs 'tsv', the IMAGE<TAB>CAPTION file")
    tsv = Path(tsv)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: image folder not found")
    with open(tsv, "rb") as f:  # FileNotFoundError names the file
        for line_no, raw in enumerate(f, 1):
            where = f"{tsv}:{line_no}"
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                issues.add(IssueKind.MALFORMED_LINE, where, f"not UTF-8: {err}")
                continue
            if not line.strip():
                continue
            fields = line.split("\t")
            if line_no == 1 and fields[0].strip().lower() in _HEADER_NAMES:
                continue
            rel = fields[0].strip()
            if not rel or len(fields) > 2:
                issues.add(IssueKind.MALFORMED_LINE, where, "expected IMAGE<TAB>CAPTION")
                continue
            path = root / rel
            if not path.is_file():
                issues.add(IssueKind.MISSING_IMAGE, str(path), where)
                continue
            caption = fields[1].strip() if len(fields) == 2 and fields[1].strip() else None
            yield ImageItem(key=f"{spec.name}/{rel}", ref=str(path.absolute()), caption=caption)
