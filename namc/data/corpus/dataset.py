"""Streaming the pre-training corpus: :class:`CorpusDataset` over a manifest or tar shards, with a shuffle buffer.

The units (shards, or manifest lines) are dealt round-robin to ``world_size * num_workers`` readers (unit ``j``
goes to reader ``j % (world_size * num_workers)``, reader id ``rank * num_workers + worker_id``), so readers never
overlap and together see every unit once per epoch. Shard order is permuted per epoch (same seed on every rank) and
a seeded buffer shuffles samples within a reader, when ``shuffle_buffer > 1``. Only the buffer (raw bytes / lines,
not decoded images) is held in memory.

A reader's order is a pure function of ``(source, seed, epoch, reader)`` and is exposed undecoded
(:meth:`CorpusDataset.units`), then decoded one unit at a time (:meth:`CorpusDataset.decode`): a resumed stream
(:class:`namc.data.views.EvenStream`) finds its place by reading the consumed units again without decoding them.

A manifest is read as :func:`~namc.data.corpus.pack.pack_corpus` reads it: its images are image references
(:mod:`namc.data.refs`: a path, ``SHARD.tar::MEMBER`` or ``FILE.parquet::ROW::COLUMN``), and a line reusing an
earlier line's id is skipped as ``duplicate_id``; so a manifest and the shards packed from it give the same samples.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from namc.data.corpus.records import (
    IMAGE_ERRORS,
    CorpusRecord,
    RecordError,
    duplicate_lines,
    image_error,
    iter_manifest,
    parse_line,
    parse_record,
    read_codes,
)
from namc.data.corpus.shards import iter_tar_groups, list_shards, shard_sizes
from namc.data.corpus.targets import read_targets
from namc.data.issues import DataIssues, IssueKind
from namc.data.refs import read_ref
from namc.data.transforms import MAX_IMAGE_PIXELS, ImageTransform
from namc.jsonl import JSONError, loads

__all__ = ["CorpusDataset"]

_TARGETS = "\x00targets"  # a sample's precomputed (codes, grids) ride in its tar group under this key
_TAKEN = "\x00taken"  # a shard sample whose id an earlier sample of this reader took: where that one is


class _DuplicateLine(str):
    """A manifest line whose id an earlier line (``first``) took: skipped as ``duplicate_id`` once it parses (as
    packing checks it)."""

    first: int

    def __new__(cls, line: str, first: int) -> _DuplicateLine:
        unit = super().__new__(cls, line)
        unit.first = first
        return unit


logger = logging.getLogger(__name__)


def _resolve_source(source: str | Path | Sequence[str | Path]) -> tuple[str, list[Path]]:
    """Returns ``("manifest", [path])`` or ``("shards", [tar paths])``."""
    if isinstance(source, str | Path):
        path = Path(source)
        if path.is_dir():
            return "shards", list_shards(path)  # index.json order; sorted *.tar if it is missing or unreadable
        if not path.exists():
            raise FileNotFoundError(f"corpus source not found: {path}")
        if path.suffix == ".tar":
            return "shards", [path]
        return "manifest", [path]
    paths = [Path(p) for p in source]
    if not paths or not all(p.suffix == ".tar" for p in paths):
        raise ValueError("a sequence source must be a non-empty list of .tar shards")
    return "shards", paths


class CorpusDataset(IterableDataset):
    """Streams the pre-training corpus from a manifest or from tar shards.

    Each item is a dict::

        {"id": str, "source": str,
         "image1": Tensor (3, H, W) float in [0, 1] | None, "image2": ...,
         "description": str, "verb1": str, "desc1": str, "verb2": str, "desc2": str,
         "noise1": list[int] | None, "noise2": list[int] | None,
         "codes1": LongTensor (N,) | None, "codes2": LongTensor (N,) | None,
         "grid1": FloatTensor (N, C) | None, "grid2": ...,
         "free_text": bool}

    ``codes``/``grid`` come from the targets ``namc data precompute`` wrote beside a shard
    (:mod:`namc.data.corpus.targets`) when ``precomputed`` is on and the sample has a row there (codes also from a
    sample's own ``codes.npy``); else they are None and the frozen encoders compute them.

    ``description`` is the record's text with whitespace normalised (not re-templated); a free-text record
    (:mod:`namc.data.corpus.records`) has ``free_text`` True and empty verbs and halves; the images are ``None``
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
        max_image_pixels: images with more pixels are skipped as ``oversized_image`` before decoding (None: no cap;
            :mod:`namc.data.transforms` states the policy).
        precomputed: read the precomputed VQGAN codes / grids beside the shards when present.
        sources: keep only records whose ``source`` is listed (None: all). Left-out records are not issues.
        fraction: keep a deterministic subset of about this fraction of the records: those whose
            ``hash(subset_seed, id)`` falls below it, so a smaller fraction's subset lies inside a larger one's and
            the choice does not depend on order, ranks or workers.
        subset_seed: seed of that hash.

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
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
        precomputed: bool = True,
        sources: Sequence[str] | None = None,
        fraction: float = 1.0,
        subset_seed: int = 0,
    ) -> None:
        super().__init__()
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        self.mode, self.paths = _resolve_source(source)
        self.precomputed = precomputed
        self.sources = set(sources) if sources is not None else None
        self.fraction = fraction
        self.subset_seed = subset_seed
        self.transform = ImageTransform(image_size, max_image_pixels)
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.epoch = 0
        self._rank = rank
        self._world_size = world_size
        self.load_images = load_images
        self.issues = issues if issues is not None else DataIssues("corpus")
        self._duplicates: dict[int, int] | None = None  # a manifest's lines reusing an id: read on first use

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

    def reader(self, slot: int | None = None) -> tuple[int, int]:
        """This process's ``(reader_id, n_readers)`` over ranks x DataLoader workers.

        Args:
            slot: read as this worker slot of the rank (default: this process's DataLoader worker id); a resumed
                stream hands its workers the slots whose batches come next (:class:`namc.data.views.EvenStream`).
        """
        rank, world = self._dist()
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * n_workers + (worker if slot is None else slot), world * n_workers

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for where, unit in self.units(*self.reader()):
            sample = self.decode(where, unit)
            if sample is not None:
                yield sample

    def units(self, reader: int, n_readers: int) -> Iterator[tuple[str, Any]]:
        """Reader ``reader``'s undecoded units (``(where, raw sample)``) of this epoch, in shuffle-buffer order.

        A pure function of ``(source, seed, epoch, reader, n_readers)``: no image is decoded, so a resumed reader
        skips the units it has already consumed by reading them again (raw bytes or lines only), which also rebuilds
        its shuffle buffer exactly. :meth:`decode` turns a unit into a sample (or ``None``, counted).
        """
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
        yield from _buffer_shuffle(raw, self.shuffle_buffer, rng)

    def _raw_manifest(self, reader: int, n_readers: int) -> Iterator[tuple[str, Any]]:
        path = self.paths[0]
        if self._duplicates is None:
            self._duplicates = duplicate_lines(path)
        for j, (line_no, line) in enumerate(iter_manifest(path)):
            if j % n_readers == reader:
                first = self._duplicates.get(line_no)
                yield f"{path}:{line_no}", (line if first is None else _DuplicateLine(line, first))

    def _raw_shards(self, shards: list[Path]) -> Iterator[tuple[str, Any]]:
        """The reader's shard samples; one whose record id an earlier sample took (two packs of one manifest, a
        shard copied twice) is marked, and :meth:`decode` skips it as ``duplicate_id``, as a manifest's repeated id.

        Ids are compared across the shards of this reader (a shard's own repeated keys are dropped by
        :func:`iter_tar_groups`); readers share no state, so a repeat dealt to another reader is not seen here.
        """
        sizes = shard_sizes(shards)
        first: dict[str, str] = {}
        for shard in shards:
            targets = read_targets(shard, self.transform.image_size) if self.precomputed else None
            for key, group in iter_tar_groups(shard, self.issues, sizes.get(shard)):
                where = f"{shard}:{key}"
                found = targets.get(key) if targets is not None else None
                unit = {**group, _TARGETS: found} if found is not None else group
                rid = _record_id(group)
                if rid is not None and first.setdefault(rid, where) != where:
                    unit = {**unit, _TAKEN: first[rid]}
                yield where, unit

    def keep(self, rec: CorpusRecord) -> bool:
        """Whether the record is in the selected subset (``sources``, ``fraction``)."""
        if self.sources is not None and rec.source not in self.sources:
            return False
        if self.fraction >= 1.0:
            return True
        digest = hashlib.blake2b(f"{self.subset_seed}\x00{rec.id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < self.fraction

    def decode(self, where: str, unit: Any) -> dict[str, Any] | None:
        """The sample of one unit of :meth:`units`, or ``None`` when it is bad (skipped and counted in ``issues``)."""
        try:
            root = self.paths[0].parent
            if isinstance(unit, str):
                rec = parse_record(parse_line(unit))  # not UTF-8, not JSON: malformed_line, with the reason
                if isinstance(unit, _DuplicateLine):
                    raise RecordError(IssueKind.DUPLICATE_ID, f"id {rec.id!r} is taken by line {unit.first}")
                img_src: tuple[Any, Any] = (rec.image1, rec.image2)  # image references, relative to the manifest
                codes_src: Any = root / rec.codes if rec.codes is not None else None
            else:
                img_src, codes_src, rec = self._shard_parts(unit)
            if not self.keep(rec):
                return None  # outside the selected subset: not an issue
            images: list[torch.Tensor | None] = [None, None]
            if self.load_images:
                for i, src in enumerate(img_src):  # a manifest's reference (str) or a shard member's bytes
                    slot = f"image{i + 1}"
                    try:
                        images[i] = self.transform.load(read_ref(src, root) if isinstance(src, str) else src)
                    except FileNotFoundError as err:  # the message names the file (and the reference)
                        raise RecordError(IssueKind.MISSING_IMAGE, f"{slot} not found: {err}") from None
                    except IMAGE_ERRORS as err:
                        raise image_error(err, slot, root / src if isinstance(src, str) else None) from None
            codes: list[torch.Tensor | None] = [None, None]
            if codes_src is not None:
                try:
                    arr = torch.from_numpy(read_codes(codes_src).astype(np.int64))  # (2, N)
                except (OSError, ValueError) as err:
                    raise RecordError(IssueKind.BAD_CODES, str(err)) from None
                codes = [arr[0], arr[1]]
            grids: list[torch.Tensor | None] = [None, None]
            pre = unit.get(_TARGETS) if isinstance(unit, dict) else None
            if pre is not None:  # (2, N) int16 codes, (2, N, C) float16 grids or None
                arr = torch.from_numpy(np.asarray(pre[0], dtype=np.int64))
                codes = [arr[0], arr[1]]
                if pre[1] is not None:
                    grid = torch.from_numpy(np.asarray(pre[1], dtype=np.float32))
                    grids = [grid[0], grid[1]]
        except RecordError as err:
            self.issues.add(err.kind, where, str(err))
            return None
        self.issues.add_ok()
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
            "grid1": grids[0],
            "grid2": grids[1],
            "free_text": rec.free_text,
        }

    @staticmethod
    def _shard_parts(group: dict[str, Any]) -> tuple[tuple[bytes, bytes], bytes | None, CorpusRecord]:
        if "json" not in group:
            raise RecordError(IssueKind.INCOMPLETE_SAMPLE, f"no .json member (members: {sorted(group)})")
        try:
            obj = loads(group["json"])
        except JSONError as err:  # invalid, not UTF-8, too deep, a duplicate key
            raise RecordError(IssueKind.MALFORMED_LINE, f"json member: {err}") from None
        rec = parse_record(obj, with_paths=False)
        img1 = next((v for k, v in group.items() if k.startswith("1.")), None)
        img2 = next((v for k, v in group.items() if k.startswith("2.")), None)
        if img1 is None or img2 is None:
            raise RecordError(IssueKind.INCOMPLETE_SAMPLE, f"missing image member (members: {sorted(group)})")
        if _TAKEN in group:  # a usable copy of a sample already read: its own defects are counted first
            raise RecordError(IssueKind.DUPLICATE_ID, f"id {rec.id!r} is taken by {group[_TAKEN]}")
        return (img1, img2), group.get("codes.npy"), rec

    def count(self) -> int:
        """Samples in the whole source before validation (index.json totals for shards, lines for a manifest)."""
        if self.mode == "manifest":
            return sum(1 for _ in iter_manifest(self.paths[0]))
        sizes = shard_sizes(self.paths)
        return sum(
            sizes[p] if p in sizes else sum(1 for _ in iter_tar_groups(p, DataIssues("count"))) for p in self.paths
        )


def _record_id(group: dict[str, bytes]) -> str | None:
    """The ``id`` of a shard sample's json member (None when it has none or does not parse: decoding reports it)."""
    try:
        obj = loads(group["json"])
    except (KeyError, JSONError):
        return None
    rid = obj.get("id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, str) and rid.strip() else None


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
