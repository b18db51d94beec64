"""Training views of datasets, drawn without the global RNG so that workers, ranks and resuming do not change them,
and the DataLoader that resumes them in the middle of an epoch.

- :class:`ReferencePicker`: each benchmark item keeps one reference caption, drawn from ``(seed, epoch, index)``.
- :class:`EvenStream`: every reader of a :class:`~namc.data.corpus.CorpusDataset` yields exactly the same number of
  samples (DDP would hang otherwise), with image-order swapping (appendix B.3) drawn from ``(seed, epoch, reader)``.
- :class:`EpochSampler`: a seeded :class:`~torch.utils.data.DistributedSampler` that can start an epoch part way.
- :class:`ResumableLoader`: a DataLoader with ``state_dict()`` / ``load_state_dict()`` (Lightning stores them in its
  checkpoints), so a run resumed from a mid-epoch checkpoint gets exactly the batches an uninterrupted one would.

Exact resume by replay, not by snapshots: the data order of an epoch is a pure function of ``(seed, epoch, rank,
reader)``, so the saved position is small (the epoch, the batches consumed and, per corpus reader, the raw units
and samples it had consumed) and restoring it means skipping what was consumed. A benchmark sampler drops the
consumed indices; a corpus reader reads its consumed units again without decoding them (raw bytes or lines), which
also rebuilds its shuffle buffer exactly, and advances its swap generator by the samples it had yielded. Skipped
bad samples count as consumed units, so decoding is never needed to find the place. DataLoader workers take batches
in turn, so a stream resumed after ``k`` batches hands worker ``w`` the reader slot ``(w + k) % workers``, whose
batch comes next.
"""

from __future__ import annotations

import logging
import multiprocessing
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from namc.data.corpus import CorpusDataset
from namc.ops.distributed import gather_objects, world

__all__ = ["EpochSampler", "EvenStream", "ReferencePicker", "ResumableLoader", "loader_workers", "swap_pair"]

logger = logging.getLogger(__name__)

POSITION_KEY = "__namc_position__"  # an EvenStream item's (reader, units, samples) after it; stripped before collate
STATE_FORMAT = 1


class ReferencePicker(Dataset):
    """Training view of a benchmark: each item keeps one reference caption, drawn from ``(seed, epoch, index)``.

    The draw uses no global RNG, so it does not depend on DataLoader workers or on when Lightning creates the
    iterator, and a resumed run draws what an uninterrupted one does.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> dict[str, Any] | None:
        item = self.dataset[index]
        if item is None:
            return None
        refs = item["captions"]
        pick = random.Random(f"reference-{self.seed}-{self.epoch}-{index}").randrange(len(refs)) if refs else 0
        return {**item, "captions": refs[pick : pick + 1] or refs}


def swap_pair(item: dict[str, Any]) -> dict[str, Any]:
    """The pair with its two images (and everything attached to each) exchanged."""
    out = dict(item)
    for a, b in (
        ("image1", "image2"),
        ("verb1", "verb2"),
        ("desc1", "desc2"),
        ("noise1", "noise2"),
        ("codes1", "codes2"),
        ("grid1", "grid2"),
    ):
        out[a], out[b] = item.get(b), item.get(a)
    return out


class EvenStream(IterableDataset):
    """Yields exactly ``per_reader`` samples from every reader of a :class:`CorpusDataset`, optionally swapped.

    Every rank then runs the same number of steps (DDP would hang otherwise). A reader whose share runs short
    (skipped bad samples, or an uneven split) starts its share again and the repeats are logged. Image-order
    swapping (appendix B.3) is drawn here from ``(seed, epoch, reader)`` instead of the global RNG, so it does not
    depend on workers or on resuming.

    Each item carries its reader's position after it under ``POSITION_KEY`` (``(reader, units, samples)``: raw units
    read, bad ones included, and samples yielded this epoch); :class:`ResumableLoader` strips it before collating
    and keeps the position of every reader whose batch it handed out, and :meth:`start_at` resumes from them.
    """

    def __init__(self, dataset: CorpusDataset, per_reader: int, workers: int, swap_prob: float = 0.0) -> None:
        super().__init__()
        self.dataset = dataset
        self.per_reader = per_reader
        self.workers = max(workers, 1)
        self.swap_prob = swap_prob
        self._start: tuple[int, dict[int, tuple[int, int]]] = (0, {})

    def __len__(self) -> int:
        return self.per_reader * self.workers

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def start_at(self, batches: int, positions: dict[int, tuple[int, int]]) -> None:
        """Make the next iteration continue this epoch after ``batches`` batches (of all workers of this rank).

        Args:
            batches: batches of this rank already consumed this epoch.
            positions: reader id -> ``(units, samples)`` it had consumed, as its last consumed batch reported.
        """
        self._start = (batches, dict(positions))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # read the start now, not in the generator: the loader resets it once the iterator exists
        batches, positions = self._start
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        reader, n_readers = self.dataset.reader(slot=(worker + batches) % n_workers)
        units, samples = positions.get(reader, (0, 0))
        return self._iterate(reader, n_readers, units, samples)

    def _passes(self, reader: int, n_readers: int) -> Iterator[tuple[int, int, str, Any]]:
        """``(pass, index in pass, where, unit)`` of the reader's units, pass after pass (a short share restarts)."""
        n_pass = 0
        while True:
            i = -1
            for i, (where, unit) in enumerate(self.dataset.units(reader, n_readers)):
                yield n_pass, i, where, unit
            if i < 0:
                raise RuntimeError(
                    f"corpus reader {reader} of {n_readers} got no samples: use more shards than ranks x workers "
                    "(or fewer DataLoader workers)"
                )
            n_pass += 1

    def _iterate(self, reader: int, n_readers: int, units: int, samples: int) -> Iterator[dict[str, Any]]:
        rng = random.Random(f"swap-{self.dataset.seed}-{self.dataset.epoch}-{reader}")
        if self.swap_prob > 0:
            for _ in range(samples):  # the draws of the samples already yielded
                rng.random()
        stream = self._passes(reader, n_readers)
        for _ in range(units):  # consumed units: read again (no decoding), which rebuilds the shuffle buffer
            next(stream)
        first_pass, current, whole, good = None, -1, False, 0
        while samples < self.per_reader:
            n_pass, i, where, unit = next(stream)
            units += 1
            if n_pass != current:
                if whole and good == 0:
                    raise RuntimeError(f"corpus reader {reader} of {n_readers}: no sample of its share decodes")
                first_pass = n_pass if first_pass is None else first_pass
                current, whole, good = n_pass, i == 0, 0
            item = self.dataset.decode(where, unit)
            if item is None:
                continue
            good += 1
            samples += 1
            if self.swap_prob > 0 and rng.random() < self.swap_prob:
                item = swap_pair(item)
            yield {**item, POSITION_KEY: (reader, units, samples)}
        if current > (first_pass or 0):
            logger.warning(
                "corpus reader %d restarted its share %d time(s) to even out the ranks",
                reader,
                current - (first_pass or 0),
            )


class EpochSampler(DistributedSampler):
    """A seeded DistributedSampler (reshuffled per epoch by ``set_epoch``) whose next epoch can start at ``start``.

    ``len()`` stays the whole epoch's, as Lightning expects of a resumed loader; :class:`ResumableLoader` sets
    ``start`` (the indices of this rank already consumed) before each iteration, and the iteration uses it once.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int, shuffle: bool = True) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)  # type: ignore[arg-type]
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        start, self.start = self.start, 0
        return iter(list(super().__iter__())[start:])


class _PositionedCollate:
    """Collates EvenStream items without their position and returns ``(batch, position of the last item)``."""

    def __init__(self, collate: Callable[[Sequence[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, items: Sequence[dict[str, Any]]) -> tuple[Any, tuple[int, int, int] | None]:
        position = None
        clean = []
        for item in items:
            if item is not None and POSITION_KEY in item:
                item = dict(item)
                position = item.pop(POSITION_KEY)
            clean.append(item)
        return self.collate(clean), position


def loader_workers(num_workers: int, world_size: int) -> dict[str, Any]:
    """A DataLoader's worker arguments: ``num_workers`` and, under DDP (``world_size > 1``), a fork server to start
    the workers from.

    A DDP rank has threads when its workers start (gloo's, Lightning's child-process observer), and a plain fork
    copies whatever locks they hold: about 1 in 10 resumed 2-rank CPU runs of ``tests/test_resume.py`` had a worker
    stuck inside ``os.fork()`` (no Python frame above it), its rank waiting for the batch and the other in the next
    collective, for ever. A fork server is a single-threaded process started before any of that; workers fork from
    it with ``torch`` and namc's data modules already imported (so they start quickly) and receive the dataset
    pickled (:class:`~namc.data.issues.DataIssues` shares its counters either way). One process keeps ``fork``.
    """
    if num_workers == 0 or world_size == 1:
        return {"num_workers": num_workers}
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "namc.data.views", "namc.lit.datamodules"])
    return {"num_workers": num_workers, "multiprocessing_context": context}


class ResumableLoader(DataLoader):
    """A DataLoader that saves and restores its position in the epoch (``state_dict`` / ``load_state_dict``).

    Lightning calls both (it keeps the state in the checkpoint's ``loops.fit_loop.state_dict.combined_loader``), so
    ``trainer.fit(..., ckpt_path=...)`` from a mid-epoch checkpoint continues with the next batch of the epoch. The
    dataset is an :class:`EvenStream` or a map-style dataset sampled by an :class:`EpochSampler`; the epoch is the
    stream's or the sampler's epoch when an iteration starts (a saved position of another epoch is dropped: that
    epoch is over). The iteration starts lazily, at the first batch, after the epoch hooks have run.

    Under DDP ``state_dict`` gathers every rank's position (a collective: Lightning saves checkpoints on every
    rank) and ``load_state_dict`` takes this rank's. A state saved with another world size, number of workers or
    batch size cannot say where this run is: it is ignored with a warning and the epoch starts again.

    Args:
        dataset: an :class:`EvenStream` or a map-style dataset.
        batch_size: samples per batch.
        sampler: an :class:`EpochSampler` (map-style datasets).
        collate_fn: collates a list of items.
        **kwargs: the other DataLoader arguments.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int = 1,
        sampler: EpochSampler | None = None,
        collate_fn: Callable[[Sequence[Any]], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._stream = isinstance(dataset, EvenStream)
        if not self._stream and not isinstance(sampler, EpochSampler):
            raise TypeError("ResumableLoader needs an EvenStream or a map-style dataset with an EpochSampler")
        if self._stream:
            collate_fn = _PositionedCollate(collate_fn or default_collate)
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn, **kwargs)
        self._pending: dict[str, Any] | None = None
        self._epoch = 0
        self._batches = 0
        self._positions: dict[int, tuple[int, int]] = {}

    @property
    def batches(self) -> int:
        """Batches of the current epoch handed out so far on this rank (those before a resume included)."""
        return self._batches

    def _current_epoch(self) -> int:
        return int(self.dataset.epoch if self._stream else self.sampler.epoch)  # type: ignore[attr-defined]

    def state_dict(self) -> dict[str, Any]:
        """Every rank's position: ``{"format", "ranks": [{"epoch", "batches", "positions", "workers",
        "batch_size"}, ...]}`` (plain ints and lists: checkpoints load with ``weights_only=True``)."""
        local = {
            "epoch": self._epoch,
            "batches": self._batches,
            "positions": [[r, u, n] for r, (u, n) in sorted(self._positions.items())],
            "workers": self.num_workers,
            "batch_size": self.batch_size,
        }
        return {"format": STATE_FORMAT, "ranks": gather_objects(local)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch at the next iteration (see the class docstring for what cannot be resumed)."""
        rank, world_size = world()
        try:
            ranks = state["ranks"]
            mine = ranks[rank] if state["format"] == STATE_FORMAT and len(ranks) == world_size else None
            if mine is not None and (mine["workers"], mine["batch_size"]) != (self.num_workers, self.batch_size):
                mine = None
        except (KeyError, TypeError, IndexError) as err:
            raise ValueError(f"the checkpoint's data loader state is malformed ({err!r}): {state!r:.200}") from None
        if mine is None:
            logger.warning(
                "the checkpoint's data position was saved by another set-up (%s); this run has %d rank(s), %d "
                "worker(s), batch size %d: the epoch starts again from its first batch",
                state.get("ranks"),
                world_size,
                self.num_workers,
                self.batch_size,
            )
            return
        self._pending = mine

    def __iter__(self) -> Iterator[Any]:
        return self._iterate()

    def _iterate(self) -> Iterator[Any]:
        epoch = self._current_epoch()
        start, self._pending = self._pending, None
        if start is not None and int(start["epoch"]) != epoch:
            start = None  # saved at the end of an epoch that is over
        self._epoch = epoch
        self._batches = int(start["batches"]) if start else 0
        self._positions = {int(r): (int(u), int(n)) for r, u, n in start["positions"]} if start else {}
        if self._batches:
            logger.info("resuming epoch %d after its batch %d", epoch, self._batches)
        if self._stream:
            self.dataset.start_at(self._batches, self._positions)  # type: ignore[attr-defined]
        else:
            self.sampler.start = self._batches * (self.batch_size or 1)  # type: ignore[attr-defined]
        it = super().__iter__()
        if self._stream:
            self.dataset.start_at(0, {})  # type: ignore[attr-defined]  # the workers have their copies
        try:
            for out in it:
                if self._stream:
                    out, position = out
                    if position is not None:
                        self._positions[int(position[0])] = (int(position[1]), int(position[2]))
                self._batches += 1
                yield out
        finally:
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
