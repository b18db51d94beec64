"""Callbacks: export the trained network as a ``from_pretrained`` folder, and write predicted captions; and
:class:`AtomicCheckpointIO`, the checkpoint writer that a kill cannot leave half-written."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from namc.backends.precision import int8_calibration, set_int8_calibration
from namc.models import load_model
from namc.ops.distributed import gather_objects

__all__ = ["AtomicCheckpointIO", "CaptionWriter", "ExportModel"]

PARTIAL_SUFFIX = ".partial"

logger = logging.getLogger(__name__)


def _run_dir(trainer: pl.Trainer) -> Path:
    return Path(trainer.log_dir) if trainer.log_dir is not None else Path(trainer.default_root_dir)


class ExportModel(pl.Callback):
    """At the end of ``fit``, save the model as ``config.json`` + ``model.safetensors`` + tokenizer files.

    Args:
        dirpath: the folder to write (default: ``<log dir>/model``).
        use_best: export the best checkpoint of the first monitoring ``ModelCheckpoint`` (e.g. best val CIDEr-D)
            when there is one; otherwise (or when False) the final weights.
    """

    def __init__(self, dirpath: str | None = None, use_best: bool = True) -> None:
        self.dirpath = dirpath
        self.use_best = use_best
        self.path: Path | None = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run:
            return
        directory = Path(self.dirpath) if self.dirpath else _run_dir(trainer) / "model"
        self.path = directory
        if trainer.global_rank != 0:
            return
        best = None
        if self.use_best:
            for cb in trainer.checkpoint_callbacks:
                if isinstance(cb, ModelCheckpoint) and cb.monitor and cb.best_model_path:
                    best = cb.best_model_path
                    break
        if best:
            model = load_model(best)
            _keep_int8_calibration(pl_module.model, model)  # type: ignore[arg-type]
            model.save_pretrained(directory)
            logger.info("exported the best checkpoint %s to %s", best, directory)
        else:
            pl_module.export(directory)  # type: ignore[operator]
            logger.info("exported the final model to %s", directory)


def _keep_int8_calibration(trained: torch.nn.Module, exported: torch.nn.Module) -> None:
    """Give the exported best checkpoint the static int8 grid calibration the trained module made (validation at
    ``inference_precision="int8"``) when both have the same grid weights (the grid is frozen: they do)."""
    peaks = int8_calibration(trained)
    if peaks is None:
        return
    mine, theirs = trained.grid.state_dict(), exported.grid.state_dict()
    if mine.keys() == theirs.keys() and all(torch.equal(mine[k].cpu(), theirs[k]) for k in mine):
        set_int8_calibration(exported, peaks)


class CaptionWriter(BasePredictionWriter):
    """Write ``namc predict``'s captions as one JSON object ``{pair id: caption}``.

    Args:
        output: the JSON file (default: ``<log dir>/predictions.json``).
    """

    def __init__(self, output: str | None = None) -> None:
        super().__init__(write_interval="epoch")
        self.output = output
        self.path: Path | None = None

    def write_on_epoch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        predictions: Sequence[Any],
        batch_indices: Sequence[Any] | None,
    ) -> None:
        rows = [row for batch in predictions for row in batch]
        merged: dict[str, str] = {}
        for part in gather_objects(rows):
            for row in part:
                merged.setdefault(row["id"], row["caption"])
        self.path = Path(self.output) if self.output else _run_dir(trainer) / "predictions.json"
        if trainer.global_rank == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(merged, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            logger.info("wrote %d captions to %s", len(merged), self.path)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes every checkpoint atomically: a kill during a save leaves the previous file (``last.ckpt``) whole.

    The checkpoint goes to a hidden temporary file in the same folder (``.last.ckpt.<pid>.partial``), which is
    fsynced and then renamed over the target (``os.replace``, atomic on one file system), and the folder is fsynced
    so the rename survives a power cut. A save killed half way leaves only its ``.partial`` file, which no
    ``ckpt_path`` pattern matches and the next save of the same target removes. Lightning's own writer stages the
    file in ``$TMPDIR`` and moves it, which is a copy, not a rename, when ``$TMPDIR`` is on another file system than
    the checkpoints (a kill then truncates ``last.ckpt``), never fsyncs, and leaves killed saves in ``$TMPDIR``.
    Remote paths (``s3://`` ...) are written by Lightning's writer.

    In a config::

        trainer:
          plugins:
            - class_path: namc.lit.callbacks.AtomicCheckpointIO
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = Path(str(path).removeprefix("file://"))
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(f".{target.name}.*{PARTIAL_SUFFIX}"):  # left by a killed save
            stale.unlink(missing_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}{PARTIAL_SUFFIX}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(target.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
