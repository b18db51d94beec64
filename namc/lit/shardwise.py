"""Shard-by-shard inference with Lightning ``Trainer.predict``: what ``namc curate embed`` and ``namc data
precompute`` share.

The work is cut into numbered *shards* (a range of ``images.jsonl`` lines, or one packed ``.tar``), each written as
one output unit whose last file, renamed into place, marks it complete. So:

- **Resuming**: rank 0 lists the shards whose completion mark is absent and broadcasts the list, so every rank
  works from the same list even while others are already writing; a killed run redoes at most the shards it had
  started.
- **Spreading over devices and nodes**: the pending shards are dealt round-robin to the ranks
  (``pending[rank::world]``) and, within a rank, to its DataLoader workers. A batch never spans two shards (the
  last batch of a shard is short, or empty when every image of its tail was skipped), so the batches, and with them
  the outputs, do not depend on how many processes ran them.
- **Writing**: :class:`ShardWriter`, a ``BasePredictionWriter``, collects the predictions of each shard on the rank
  that computed them and hands them to the job's ``finish(shard, parts)`` when the shard's last batch arrives.

A *batch* is a dict with ``shard`` (int), ``last`` (bool: the shard's final batch), ``n_lines`` (input lines it
accounts for, for the progress bar) and whatever the job puts beside them (tensors under ``inputs``; keys, skipped
records). The job's :class:`ShardSource` yields them from a shard number.
"""

from __future__ import annotations

import argparse
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BasePredictionWriter
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from namc.data.views import loader_workers

__all__ = [
    "ShardDataModule",
    "ShardSource",
    "ShardStream",
    "ShardWriter",
    "add_trainer_arguments",
    "clean_temporaries",
    "make_trainer",
]

logger = logging.getLogger(__name__)


class ShardSource(Protocol):
    """A job's input: the batches of one shard, and how many input lines each shard has."""

    def batches(self, shard: int) -> Iterator[dict[str, Any]]: ...

    def lines(self, shard: int) -> int: ...


class ShardStream(IterableDataset):
    """The batches of ``shards``, the shards dealt round-robin to the DataLoader workers."""

    def __init__(self, source: ShardSource, shards: Sequence[int]) -> None:
        super().__init__()
        self.source = source
        self.shards = list(shards)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for shard in self.shards[worker::workers]:
            yield from self.source.batches(shard)


class ShardDataModule(pl.LightningDataModule):
    """Deals the pending shards to this rank (see the module docstring).

    Args:
        source: the job's batches.
        pending: called on rank 0 only, once the processes are up: prepares the output (meta files, stale temporary
            files) and returns the shard numbers still to do; the list is broadcast to every rank.
        num_workers: DataLoader workers per rank.
    """

    def __init__(self, source: ShardSource, pending: Callable[[], list[int]], num_workers: int = 0) -> None:
        super().__init__()
        self.source = source
        self.pending = pending
        self.num_workers = num_workers
        self.assigned: list[int] = []
        self.n_pending = 0

    def predict_dataloader(self) -> DataLoader:
        trainer = self.trainer
        todo = self.pending() if trainer.global_rank == 0 else None
        todo = trainer.strategy.broadcast(todo, src=0)
        self.n_pending = len(todo)
        self.assigned = todo[trainer.global_rank :: trainer.world_size]
        workers = min(self.num_workers, len(self.assigned))
        # in every process (ddp_spawn's too): batches are dicts the job builds itself (batch_size=None), whose
        # indices Lightning cannot and need not infer; one pass over the data needs no persistent workers
        warnings.filterwarnings("ignore", message=".*Couldn't infer the batch indices.*")
        warnings.filterwarnings("ignore", message=".*Consider setting `persistent_workers=True`.*")
        stream = ShardStream(self.source, self.assigned)
        return DataLoader(stream, batch_size=None, **loader_workers(workers, trainer.world_size))


class ShardWriter(BasePredictionWriter):
    """Collects each shard's predictions and calls ``finish(shard, parts)`` when its last batch is in.

    ``parts`` is the list of ``(batch, prediction)`` of the shard in the order its batches came (one worker reads a
    shard, so in the shard's order). A progress bar on rank 0 counts the input lines of the rank's shards.

    Args:
        finish: writes one shard's outputs (the job's atomic writer).
        desc: progress bar label.
        progress: show the bar.
        unit: what an input line is, for the bar.
    """

    def __init__(
        self,
        finish: Callable[[int, list[tuple[dict[str, Any], Any]]], None],
        desc: str,
        progress: bool = True,
        unit: str = "img",
    ) -> None:
        super().__init__(write_interval="batch")
        self.finish = finish
        self.desc = desc
        self.unit = unit
        self.progress = progress
        self.written: list[int] = []
        self._parts: dict[int, list[tuple[dict[str, Any], Any]]] = {}
        self._bar: Any = None

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dm = trainer.datamodule
        if self.progress and trainer.global_rank == 0 and isinstance(dm, ShardDataModule):
            from tqdm import tqdm

            total = sum(dm.source.lines(s) for s in dm.assigned)
            world = f" (rank 0 of {trainer.world_size})" if trainer.world_size > 1 else ""
            self._bar = tqdm(total=total, desc=f"{self.desc}{world}", unit=self.unit, dynamic_ncols=True)

    def write_on_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: dict[str, Any],
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        shard = int(batch["shard"])
        meta = {k: v for k, v in batch.items() if k != "inputs"}  # keys, skipped records: no device tensors kept
        self._parts.setdefault(shard, []).append((meta, prediction))
        if self._bar is not None:
            self._bar.update(int(batch["n_lines"]))
        if batch["last"]:
            self.finish(shard, self._parts.pop(shard))
            self.written.append(shard)

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._parts:  # a shard whose last batch never came: its stream ended early
            raise RuntimeError(f"shards {sorted(self._parts)} ended without their last batch; nothing written for them")


def clean_temporaries(folder: Path) -> None:
    """Removes the temporary files a killed writer left (``.NAME.*.tmp``, as the atomic writers name them)."""
    for tmp in folder.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


def _devices(text: str) -> int | str:
    """``--trainer.devices``: a count, ``auto``, ``-1`` (all) or a list such as ``0,1``, as Lightning takes it."""
    text = str(text).strip()
    return int(text) if text.lstrip("-").isdigit() else text


def add_trainer_arguments(parser: argparse.ArgumentParser) -> None:
    """``--trainer.devices``, ``--trainer.num_nodes``, ``--trainer.accelerator``, ``--trainer.strategy``,
    ``--trainer.precision``: Lightning's Trainer arguments, under the names LightningCLI gives them (the pipeline
    YAML takes the same dotted keys, e.g. ``trainer.devices: 8``)."""
    group = parser.add_argument_group("Lightning Trainer (spreads the shards over devices and nodes)")
    group.add_argument("--trainer.devices", type=_devices, default="auto", help="devices per node (default: auto)")
    group.add_argument("--trainer.num_nodes", type=int, default=1, help="nodes (default: 1)")
    group.add_argument("--trainer.accelerator", default="auto", help="cpu, gpu, ... (default: auto)")
    group.add_argument("--trainer.strategy", default="auto", help="auto, ddp, ddp_spawn, ... (default: auto)")
    group.add_argument(
        "--trainer.precision", default="32-true", help="32-true, bf16-mixed, 16-mixed (default: 32-true)"
    )


def make_trainer(args: argparse.Namespace, writer: ShardWriter) -> pl.Trainer:
    """A predict-only Trainer: the ``--trainer.*`` options, the writer, nothing logged or checkpointed."""
    option = vars(args)
    return pl.Trainer(
        accelerator=option["trainer.accelerator"],
        devices=option["trainer.devices"],
        num_nodes=option["trainer.num_nodes"],
        strategy=option["trainer.strategy"],
        precision=option["trainer.precision"],
        callbacks=[writer],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,  # the writer's bar counts images, Lightning's would count batches
        enable_model_summary=False,
        use_distributed_sampler=False,  # the datamodule deals shards to ranks itself
    )
