"""CC3M (Sharma et al. 2018) single images, as img2dataset writes them or as a plain folder with a captions TSV.

- **WebDataset shards** (``kind: webdataset``; root = a folder of ``*.tar``, a glob, a brace pattern such as
  ``/data/cc3m/{00000..00331}.tar``, or one file). img2dataset's ``--output_format webdataset`` writes ``00000.tar``,
  ``00001.tar``, ... each holding ``KEY.jpg`` (the resized image), ``KEY.txt`` (the caption) and ``KEY.json``
  (url, caption, status, sizes), with ``KEY`` = shard number and index within it (``000420031`` is the 32nd sample of
  ``00042.tar``), and a ``00000.parquet`` / ``00000_stats.json`` beside each shard; checked against img2dataset's
  README ("output_format ... webdataset") and NVIDIA NeMo Curator's WebDataset page, which documents that exact
  layout for img2dataset output. Read with the ``webdataset`` package (``wds.WebDataset``, no decoding, shards in
  order); an unreadable or truncated shard is counted as ``corrupt_shard`` (what it yielded before the damage is
  kept), a sample without an image as ``incomplete_sample``. Images are references ``SHARD.tar::KEY.jpg``; key
  ``cc3m/KEY``; the caption is ``KEY.txt`` (else ``caption`` of ``KEY.json``).
- **Folder + TSV** (``kind: image_tsv``; root = the image folder, ``tsv`` = the captions file). Each line
  ``IMAGE<TAB>CAPTION`` with ``IMAGE`` a path relative to root; a first line whose first field is ``image``,
  ``filepath``, ``file``, ``path`` or ``filename`` is a header. (The released ``Train_GCC-training.tsv`` is
  ``CAPTION<TAB>URL``; once downloaded, write the local file names in the first column.) Key ``cc3m/IMAGE``.
"""

from __future__ import annotations

import glob
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import webdataset as wds

from namc.curate.sources.base import ImageItem, SourceSpec, register_source
from namc.data.issues import DataIssues, IssueKind
from namc.data.refs import tar_ref

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
        text = txt.decode("utf-8", errors="replace").strip()
        if text:
            return text
    meta = sample.get("json")
    if isinstance(meta, bytes):
        try:
            cap = json.loads(meta.decode("utf-8")).get("caption")
        except (UnicodeDecodeError, ValueError, AttributeError):
            return None
        return cap.strip() if isinstance(cap, str) and cap.strip() else None
    return None


def _member_names(url: str) -> dict[str, str]:
    """``{lower-cased member name: member name}`` of a tar shard (headers only; {} where they do not read)."""
    try:
        with tarfile.open(url) as tar:
            return {name.lower(): name for name in tar.getnames()}
    except (tarfile.TarError, OSError):
        return {}


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

        dataset = wds.WebDataset([url], shardshuffle=False, handler=handler, empty_check=False)
        members = _member_names(url)
        for sample in dataset:
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
        if damaged:  # webdataset reports one failure at each stage it passes through: one shard, one count
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
                line = raw.decode("utf-8").rstrip("\r\n")
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
