"""The pre-training corpus: a JSONL manifest, WebDataset-style tar shards, and a streaming dataset over either.

Manifest (one JSON object per line; image paths relative to the manifest's folder)::

    {"id": "ip2p-0000001", "source": "ip2p",
     "image1": "images/0000001_1.jpg", "image2": "images/0000001_2.jpg",
     "description": "The difference between the two images is that the first image shows ..., while ...",
     "verb1": "shows", "desc1": "...", "verb2": "shows", "desc2": "...",      # optional: parsed if absent
     "noise1": [0, 0, 1, ...], "noise2": [...],                               # optional word-level noise labels
     "codes": "codes/0000001.npy"}                                             # optional (2, N) VQGAN codes

``source`` is a free string (``ip2p``, ``cc3m``, ``std``, ``shapes``, ...). ``noise1[k]`` is 1 when word
``desc1.split()[k]`` is injected noise. ``codes`` is an ``.npy`` file (no pickle) holding two rows of N small
non-negative integers: the VQGAN tokens of image 1 and image 2 (N = 196 at 224 px with f16).

Shards (``shard-000000.tar`` ...; one sample = consecutive members sharing a key without dots, as in WebDataset)::

    {key}.json        the manifest record without the path fields
    {key}.1.png|jpg   first image, bytes copied from the source file
    {key}.2.png|jpg   second image
    {key}.codes.npy   optional codes, shape (2, N)

``pack_corpus`` writes them from a manifest: shard ``i`` holds manifest lines ``[i * shard_size, (i + 1) *
shard_size)`` that pass validation, is written to ``.tar.partial`` and renamed when complete, and gets a sidecar
``shard-%06d.json`` with its counts and a digest of its manifest lines; a rerun skips shards whose tar and sidecar
exist with the same digest and rewrites any other (a partial one, or one packed from different lines).
``index.json`` lists the shards and the totals. Image paths may also be absolute.

:class:`CorpusDataset` streams a manifest or shards: the units (shards, or manifest lines) are dealt round-robin to
``world_size * num_workers`` readers (unit ``j`` goes to reader ``j % (world_size * num_workers)``, reader id
``rank * num_workers + worker_id``), so readers never overlap and together see every unit once per epoch. Shard
order is permuted per epoch (same seed on every rank) and a seeded buffer shuffles samples within a reader, when
``shuffle_buffer > 1``.
Only the buffer (raw bytes / lines, not decoded images) is held in memory.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from namc.data.issues import DataIssues, IssueKind
from namc.data.transforms import ImageTransform, open_image
from namc.text.template import TemplateError, normalize_whitespace, parse

__all__ = [
    "CorpusDataset",
    "CorpusRecord",
    "PackReport",
    "RecordError",
    "iter_manifest",
    "pack_corpus",
    "parse_record",
    "read_codes",
    "write_manifest",
]

logger = logging.getLogger(__name__)

SHARD_PATTERN = "shard-{:06d}.tar"
INDEX_FILE = "index.json"
_IMAGE_ERRORS = (OSError, SyntaxError, ValueError)  # PIL.UnidentifiedImageError is an OSError


class RecordError(ValueError):
    """A manifest or shard record is unusable; ``kind`` is the :class:`IssueKind` to count it under."""

    def __init__(self, kind: IssueKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class CorpusRecord:
    """One pair of the pre-training corpus (a manifest line)."""

    id: str
    source: str
    image1: str
    image2: str
    description: str
    verb1: str
    desc1: str
    verb2: str
    desc2: str
    noise1: list[int] | None = None
    noise2: list[int] | None = None
    codes: str | None = None

    def to_json(self, with_paths: bool = True) -> dict[str, Any]:
        """The manifest line (``with_paths=False``: the shard's ``{key}.json``, without image/codes paths)."""
        out: dict[str, Any] = {"id": self.id, "source": self.source}
        if with_paths:
            out["image1"], out["image2"] = self.image1, self.image2
        out.update(description=self.description, verb1=self.verb1, desc1=self.desc1, verb2=self.verb2, desc2=self.desc2)
        if self.noise1 is not None:
            out["noise1"] = self.noise1
        if self.noise2 is not None:
            out["noise2"] = self.noise2
        if with_paths and self.codes is not None:
            out["codes"] = self.codes
        return out


def _check_labels(labels: Any, desc: str, name: str) -> list[int] | None:
    if labels is None:
        return None
    n_words = len(desc.split())
    if not isinstance(labels, list) or not all(isinstance(x, int) and x in (0, 1) for x in labels):
        raise RecordError(IssueKind.BAD_LABELS, f"{name} must be a list of 0/1 integers")
    if len(labels) != n_words:
        raise RecordError(IssueKind.BAD_LABELS, f"{name} has {len(labels)} labels for {n_words} words")
    return labels


def parse_record(obj: Any, with_paths: bool = True) -> CorpusRecord:
    """Validates one decoded manifest line (or shard json) and returns the record.

    The description is parsed with :func:`namc.text.template.parse`; halves given in the record must agree with it
    (verbs compared lower-cased, descriptions after whitespace normalisation).

    Args:
        obj: the decoded JSON object.
        with_paths: require ``image1``/``image2`` (manifest lines); shard records carry no paths.

    Raises:
        RecordError: with ``kind`` MALFORMED_LINE, OFF_TEMPLATE or BAD_LABELS.
    """
    if not isinstance(obj, dict):
        raise RecordError(IssueKind.MALFORMED_LINE, f"expected a JSON object, got {type(obj).__name__}")
    required = ("id", "source", "description") + (("image1", "image2") if with_paths else ())
    for key in required:
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            raise RecordError(IssueKind.MALFORMED_LINE, f"missing or empty string field {key!r}")
    try:
        parsed = parse(obj["description"])
    except TemplateError as err:
        raise RecordError(IssueKind.OFF_TEMPLATE, str(err)) from None
    for key, value in parsed._asdict().items():
        given = obj.get(key)
        if given is None:
            continue
        if not isinstance(given, str):
            raise RecordError(IssueKind.MALFORMED_LINE, f"field {key!r} must be a string")
        same = given.strip().lower() == value if key.startswith("verb") else normalize_whitespace(given) == value
        if not same:
            raise RecordError(IssueKind.MALFORMED_LINE, f"field {key!r}={given!r} disagrees with the description")
    codes = obj.get("codes")
    if codes is not None and not isinstance(codes, str):
        raise RecordError(IssueKind.MALFORMED_LINE, "field 'codes' must be a path string")
    return CorpusRecord(
        id=obj["id"],
        source=obj["source"],
        image1=obj.get("image1", ""),
        image2=obj.get("image2", ""),
        description=normalize_whitespace(obj["description"]),
        verb1=parsed.verb1,
        desc1=parsed.desc1,
        verb2=parsed.verb2,
        desc2=parsed.desc2,
        noise1=_check_labels(obj.get("noise1"), parsed.desc1, "noise1"),
        noise2=_check_labels(obj.get("noise2"), parsed.desc2, "noise2"),
        codes=codes,
    )


def read_codes(data: bytes | str | Path) -> np.ndarray:
    """Reads precomputed VQGAN codes: an ``.npy`` (no pickle) of shape (2, N) with non-negative integers.

    Raises:
        ValueError: wrong dtype, shape or negative values (OSError for an unreadable file).
    """
    src = io.BytesIO(data) if isinstance(data, bytes) else data
    arr = np.load(src, allow_pickle=False)
    if arr.ndim != 2 or arr.shape[0] != 2 or arr.shape[1] == 0:
        raise ValueError(f"codes must have shape (2, N), got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"codes must be integers, got {arr.dtype}")
    if arr.size and arr.min() < 0:
        raise ValueError("codes must be non-negative")
    return arr


def iter_manifest(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yields ``(line_number, line)`` for the non-blank lines of a JSONL file (line numbers are 1-based)."""
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if line.strip():
                yield i, line


def write_manifest(records: Sequence[CorpusRecord], path: str | Path) -> None:
    """Writes records as a JSONL manifest (one compact JSON object per line)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------------------------


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


def _image_ext(path: Path) -> str:
    ext = path.suffix.lower().lstrip(".")
    return {"jpeg": "jpg"}.get(ext, ext) or "img"


def _load_for_pack(rec: CorpusRecord, root: Path, verify_images: bool) -> dict[str, bytes]:
    members: dict[str, bytes] = {}
    for slot, rel in (("1", rec.image1), ("2", rec.image2)):
        path = root / rel
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise RecordError(IssueKind.MISSING_IMAGE, f"image{slot} not found: {path}") from None
        except OSError as err:
            raise RecordError(IssueKind.CORRUPT_IMAGE, f"image{slot} unreadable: {path}: {err}") from None
        if verify_images:
            try:
                open_image(data)
            except _IMAGE_ERRORS as err:
                raise RecordError(IssueKind.CORRUPT_IMAGE, f"image{slot} does not decode: {path}: {err}") from None
        members[f"{slot}.{_image_ext(path)}"] = data
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
    lines: list[tuple[int, str]], root: Path, manifest: Path, tar_path: Path, verify_images: bool
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
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise RecordError(IssueKind.MALFORMED_LINE, f"invalid JSON: {err}") from None
                rec = parse_record(obj)
                members = _load_for_pack(rec, root, verify_images)
            except RecordError as err:
                rejected[err.kind.value] = rejected.get(err.kind.value, 0) + 1
                examples.append(f"{where}: {err.kind.value}: {err}")
                continue
            key = f"{line_no - 1:09d}"
            _add_member(tar, f"{key}.json", json.dumps(rec.to_json(with_paths=False), ensure_ascii=False).encode())
            for ext, data in members.items():
                _add_member(tar, f"{key}.{ext}", data)
            n += 1
    os.replace(partial, tar_path)
    return {"samples": n, "rejected": rejected, "examples": examples[:20]}


def _read_sidecar(path: Path) -> dict[str, Any] | None:
    try:
        side = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return side if isinstance(side, dict) and "samples" in side else None


def pack_corpus(
    manifest: str | Path,
    out_dir: str | Path,
    shard_size: int = 1000,
    verify_images: bool = True,
    progress: bool = True,
) -> PackReport:
    """Packs a JSONL manifest into tar shards, validating descriptions, labels, codes and images.

    Args:
        manifest: the JSONL manifest (image paths relative to its folder).
        out_dir: folder for ``shard-%06d.tar``, their ``.json`` sidecars and ``index.json``.
        shard_size: manifest lines per shard.
        verify_images: fully decode every image (catches truncated files; costs a decode per image).
        progress: show a tqdm progress bar over manifest lines.

    Returns:
        A :class:`PackReport`; rejected lines are counted by :class:`IssueKind` value and the first ones listed.
    """
    from tqdm import tqdm

    if shard_size <= 0:
        raise ValueError("shard_size must be positive")
    manifest = Path(manifest)
    root = manifest.parent
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = PackReport(out_dir=out)

    with open(manifest, encoding="utf-8") as f:
        n_physical = sum(1 for _ in f)
    n_shards = (n_physical + shard_size - 1) // shard_size
    bar = tqdm(total=n_physical, desc=f"packing {manifest.name}", unit="line", disable=not progress)

    def finish(index: int, lines: list[tuple[int, str]]) -> None:
        tar_path = out / SHARD_PATTERN.format(index)
        side_path = tar_path.with_suffix(".json")
        digest = hashlib.blake2b("".join(line for _, line in lines).encode("utf-8"), digest_size=16).hexdigest()
        side = _read_sidecar(side_path) if tar_path.exists() else None
        if side is not None and side.get("lines_digest") == digest:
            report.n_resumed_shards += 1
        else:  # missing, partial, or packed from other manifest lines / another shard size: (re)write it
            side_path.unlink(missing_ok=True)
            side = _write_shard(lines, root, manifest, tar_path, verify_images)
            side["lines_digest"] = digest
            side_path.write_text(json.dumps(side, indent=1))
        report.shards.append(tar_path.name)
        report.n_samples += side["samples"]
        for k, v in side["rejected"].items():
            report.rejected[k] = report.rejected.get(k, 0) + v
        report.examples.extend(side["examples"][: max(0, 20 - len(report.examples))])
        bar.update(min(shard_size, n_physical - index * shard_size))

    current: list[tuple[int, str]] = []
    shard_index = 0
    for line_no, line in iter_manifest(manifest):
        idx = (line_no - 1) // shard_size
        while idx > shard_index:
            finish(shard_index, current)
            current, shard_index = [], shard_index + 1
        current.append((line_no, line))
    while shard_index < n_shards:
        finish(shard_index, current)
        current, shard_index = [], shard_index + 1
    bar.close()

    report.n_lines = sum(1 for _ in iter_manifest(manifest))
    index = {
        "manifest": str(manifest),
        "shard_size": shard_size,
        "shards": [
            {"file": s, "samples": json.loads((out / s).with_suffix(".json").read_text())["samples"]}
            for s in report.shards
        ],
        "samples": report.n_samples,
        "lines": report.n_lines,
        "rejected": report.rejected,
    }
    (out / INDEX_FILE).write_text(json.dumps(index, indent=1))
    logger.info(report.summary())
    return report


# ---------------------------------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------------------------------


def _resolve_source(source: str | Path | Sequence[str | Path]) -> tuple[str, list[Path]]:
    """Returns ``("manifest", [path])`` or ``("shards", [tar paths])``."""
    if isinstance(source, str | Path):
        path = Path(source)
        if path.is_dir():
            index = path / INDEX_FILE
            if index.exists():
                shards = [path / s["file"] for s in json.loads(index.read_text())["shards"]]
            else:
                shards = sorted(path.glob("*.tar"))
            if not shards:
                raise FileNotFoundError(f"no shards (*.tar) in {path}")
            return "shards", shards
        if not path.exists():
            raise FileNotFoundError(f"corpus source not found: {path}")
        if path.suffix == ".tar":
            return "shards", [path]
        return "manifest", [path]
    paths = [Path(p) for p in source]
    if not paths or not all(p.suffix == ".tar" for p in paths):
        raise ValueError("a sequence source must be a non-empty list of .tar shards")
    return "shards", paths


def _shard_sizes(shards: Sequence[Path]) -> dict[Path, int]:
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


def _iter_tar_groups(
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


class CorpusDataset(IterableDataset):
    """Streams the pre-training corpus from a manifest or from tar shards.

    Each item is a dict::

        {"id": str, "source": str,
         "image1": Tensor (3, H, W) float in [0, 1] | None, "image2": ...,
         "description": str, "verb1": str, "desc1": str, "verb2": str, "desc2": str,
         "noise1": list[int] | None, "noise2": list[int] | None,
         "codes1": LongTensor (N,) | None, "codes2": LongTensor (N,) | None}

    ``description`` is the record's text with whitespace normalised (not re-templated); the images are ``None``
    only when ``load_images=False``. Bad samples are skipped and counted in :attr:`issues`.

    Args:
        source: a manifest (``.jsonl``), one ``.tar`` shard, a folder of shards (``index.json`` order if present,
            else sorted ``*.tar``), or a list of ``.tar`` paths.
        image_size: output side for the images (bicubic); ``None`` keeps the stored size.
        shuffle_buffer: size of the seeded shuffle buffer per reader; 0 or 1 keeps the stored order.
        seed: base seed; the shard permutation uses ``(seed, epoch)`` and the buffer ``(seed, epoch, reader)``.
        rank: DDP rank (default: ``torch.distributed`` if initialised, else 0).
        world_size: DDP world size (default: ``torch.distributed`` if initialised, else 1).
        load_images: decode images (False yields the records only, e.g. to benchmark the reader).
        issues: where to count skipped samples (default: a new :class:`DataIssues`).

    Call :meth:`set_epoch` before each epoch (with ``persistent_workers=False`` the workers receive the new epoch).
    Ranks can receive different numbers of samples when shards differ in size; drop the remainder or pad in
    the training loop if the ranks must step together.
    """

    def __init__(
        self,
        source: str | Path | Sequence[str | Path],
        image_size: int | None = 224,
        *,
        shuffle_buffer: int = 0,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        load_images: bool = True,
        issues: DataIssues | None = None,
    ) -> None:
        super().__init__()
        self.mode, self.paths = _resolve_source(source)
        self.transform = ImageTransform(image_size)
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.epoch = 0
        self._rank = rank
        self._world_size = world_size
        self.load_images = load_images
        self.issues = issues if issues is not None else DataIssues("corpus")

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch that seeds the shard permutation and the shuffle buffer."""
        self.epoch = epoch

    def _dist(self) -> tuple[int, int]:
        initialised = dist.is_available() and dist.is_initialized()
        rank = self._rank if self._rank is not None else (dist.get_rank() if initialised else 0)
        world = self._world_size if self._world_size is not None else (dist.get_world_size() if initialised else 1)
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world size {world}")
        return rank, world

    def reader(self) -> tuple[int, int]:
        """This process's ``(reader_id, n_readers)`` over ranks x DataLoader workers."""
        rank, world = self._dist()
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * n_workers + worker, world * n_workers

    def __iter__(self) -> Iterator[dict[str, Any]]:
        reader, n_readers = self.reader()
        if self.mode == "shards":
            shards = list(self.paths)
            if self.shuffle_buffer > 1:
                random.Random(f"shards-{self.seed}-{self.epoch}").shuffle(shards)
            if len(shards) < n_readers:
                logger.warning("%d shards for %d readers: some readers get no data", len(shards), n_readers)
            raw: Iterator[tuple[str, Any]] = self._raw_shards(shards[reader::n_readers])
        else:
            raw = self._raw_manifest(reader, n_readers)
        rng = random.Random(f"buffer-{self.seed}-{self.epoch}-{reader}")
        for where, unit in _buffer_shuffle(raw, self.shuffle_buffer, rng):
            sample = self._decode(where, unit)
            if sample is not None:
                self.issues.add_ok()
                yield sample

    def _raw_manifest(self, reader: int, n_readers: int) -> Iterator[tuple[str, Any]]:
        path = self.paths[0]
        for j, (line_no, line) in enumerate(iter_manifest(path)):
            if j % n_readers == reader:
                yield f"{path}:{line_no}", line

    def _raw_shards(self, shards: list[Path]) -> Iterator[tuple[str, Any]]:
        sizes = _shard_sizes(shards)
        for shard in shards:
            for key, group in _iter_tar_groups(shard, self.issues, sizes.get(shard)):
                yield f"{shard}:{key}", group

    def _decode(self, where: str, unit: Any) -> dict[str, Any] | None:
        try:
            if isinstance(unit, str):
                try:
                    obj = json.loads(unit)
                except json.JSONDecodeError as err:
                    raise RecordError(IssueKind.MALFORMED_LINE, f"invalid JSON: {err}") from None
                rec = parse_record(obj)
                root = self.paths[0].parent
                img_src: tuple[Any, Any] = (root / rec.image1, root / rec.image2)
                codes_src: Any = root / rec.codes if rec.codes is not None else None
            else:
                img_src, codes_src, rec = self._shard_parts(unit)
            images: list[torch.Tensor | None] = [None, None]
            if self.load_images:
                for i, src in enumerate(img_src):
                    try:
                        images[i] = self.transform.load(src)
                    except FileNotFoundError:
                        raise RecordError(IssueKind.MISSING_IMAGE, f"image{i + 1} not found: {src}") from None
                    except _IMAGE_ERRORS as err:
                        name = src if isinstance(src, Path) else f"image{i + 1}"
                        raise RecordError(IssueKind.CORRUPT_IMAGE, f"{name}: {err}") from None
            codes: list[torch.Tensor | None] = [None, None]
            if codes_src is not None:
                try:
                    arr = torch.from_numpy(read_codes(codes_src).astype(np.int64))  # (2, N)
                except (OSError, ValueError) as err:
                    raise RecordError(IssueKind.BAD_CODES, str(err)) from None
                codes = [arr[0], arr[1]]
        except RecordError as err:
            self.issues.add(err.kind, where, str(err))
            return None
        return {
            "id": rec.id,
            "source": rec.source,
            "image1": images[0],
            "image2": images[1],
            "description": rec.description,
            "verb1": rec.verb1,
            "desc1": rec.desc1,
            "verb2": rec.verb2,
            "desc2": rec.desc2,
            "noise1": rec.noise1,
            "noise2": rec.noise2,
            "codes1": codes[0],
            "codes2": codes[1],
        }

    @staticmethod
    def _shard_parts(group: dict[str, bytes]) -> tuple[tuple[bytes, bytes], bytes | None, CorpusRecord]:
        if "json" not in group:
            raise RecordError(IssueKind.INCOMPLETE_SAMPLE, f"no .json member (members: {sorted(group)})")
        try:
            obj = json.loads(group["json"])
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RecordError(IssueKind.MALFORMED_LINE, f"invalid JSON: {err}") from None
        rec = parse_record(obj, with_paths=False)
        img1 = next((v for k, v in group.items() if k.startswith("1.")), None)
        img2 = next((v for k, v in group.items() if k.startswith("2.")), None)
        if img1 is None or img2 is None:
            raise RecordError(IssueKind.INCOMPLETE_SAMPLE, f"missing image member (members: {sorted(group)})")
        return (img1, img2), group.get("codes.npy"), rec

    def count(self) -> int:
        """Samples in the whole source before validation (index.json totals for shards, lines for a manifest)."""
        if self.mode == "manifest":
            return sum(1 for _ in iter_manifest(self.paths[0]))
        sizes = _shard_sizes(self.paths)
        return sum(
            sizes[p] if p in sizes else sum(1 for _ in _iter_tar_groups(p, DataIssues("count"))) for p in self.paths
        )


def _buffer_shuffle(items: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Shuffles a stream with a buffer of ``size`` items (``size <= 1``: passes the stream through)."""
    if size <= 1:
        yield from items
        return
    buf: list[Any] = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        yield buf[j]
        buf[j] = item
    rng.shuffle(buf)
    yield from buf
