"""Callbacks: export the trained network as a ``from_pretrained`` folder, and write predicted captions."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint

from namc.models import load_model
from namc.ops.distributed import gather_objects

__all__ = ["CaptionWriter", "ExportModel"]

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
            load_model(best).save_pretrained(directory)
            logger.info("exported the best checkpoint %s to %s", best, directory)
        else:
            pl_module.export(directory)  # type: ignore[operator]
            logger.info("exported the final model to %s", directory)


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
