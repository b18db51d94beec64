"""Streaming the pre-training corpus: :class:`CorpusDataset` over a manifest or tar shards, with a shuffle buffer.

The units (shards, or manifest lines) are dealt round-robin to ``world_size * num_workers`` readers (unit ``j``
goes to reader ``j % (world_size * num_workers)``, reader id ``rank * num_workers + worker_id``), so readers never
overlap and together see every unit once per epoch. Shard order is permuted per epoch (same seed on every rank) and
a seeded buffer shuffles samples within a reader, when ``shuffle_buffer > 1``. Only the buffer (raw bytes / lines,
not decoded images) is held in memory.

A reader's order is a pure function of ``(source, seed, epoch, reader)`` and is exposed undecoded
(:meth:`CorpusDataset.units`), then decoded one unit at a time (:meth:`CorpusDataset.decode`): a resumed stream
(:class:`namc.data.views.EvenStream`) finds its place by reading the consumed units again without decoding them.
"""

from __future__ import annotations

import json
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
    iter_manifest,
    parse_line,
    parse_record,
    read_codes,
)
from namc.data.corpus.shards import iter_tar_groups, list_shards, shard_sizes
from namc.data.issues import DataIssues, IssueKind
from namc.data.transforms import MAX_IMAGE_PIXELS, ImageTransform

__all__ = ["CorpusDataset"]

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
        max_image_pixels: images with more pixels are skipped as ``oversized_image`` before decoding (None: no cap;
            :mod:`namc.data.transforms` states the policy).

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
    ) -> None:
        super().__init__()
        self.mode, self.paths = _resolve_source(source)
        self.transform = ImageTransform(image_size, max_image_pixels)
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
        for j, (line_no, line) in enumerate(iter_manifest(path)):
            if j % n_readers == reader:
                yield f"{path}:{line_no}", line

    def _raw_shards(self, shards: list[Path]) -> Iterator[tuple[str, Any]]:
        sizes = shard_sizes(shards)
        for shard in shards:
            for key, group in iter_tar_groups(shard, self.issues, sizes.get(shard)):
                yield f"{shard}:{key}", group

    def decode(self, where: str, unit: Any) -> dict[str, Any] | None:
        """The sample of one unit of :meth:`units`, or ``None`` when it is bad (skipped and counted in ``issues``)."""
        try:
            if isinstance(unit, str):
                rec = parse_record(parse_line(unit))  # not UTF-8, not JSON: malformed_line, with the reason
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
                    except IMAGE_ERRORS as err:
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
        sizes = shard_sizes(self.paths)
        return sum(
            sizes[p] if p in sizes else sum(1 for _ in iter_tar_groups(p, DataIssues("count"))) for p in self.paths
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
