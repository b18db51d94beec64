"""Where a long demo run is: one line per training epoch.

:class:`EpochProgress` is a Lightning callback that writes plain lines (not a redrawn bar), so a terminal and a log
file read the same::

      pre-training  epoch 3/10  63 steps in 24.1 s (2.6 it/s)  loss 4.213  elapsed 1:12  ETA 2:49

It only reads clocks, step counters and the loss each training step returned (and, after a validation, the
``val/*`` metrics Lightning has already computed for the checkpoint callback), so it changes nothing a run computes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from namc.lit.demo.settings import clock

__all__ = ["EpochProgress"]

# the val/* metrics an epoch line shows when a validation ran in that epoch, in this order
_SHOWN_VAL = ("val/cider", "val/noise_auroc", "val/loss")


class EpochProgress(Callback):
    """One line per training epoch (rank 0 only): epoch i/N, steps and rate, mean training loss, elapsed, ETA.

    Args:
        title: the stage's name, at the start of every line (e.g. ``"pre-training"``).
        stream: where lines go (default: ``sys.stderr`` at the time of writing).
        interval_s: an epoch that runs longer than this also gets a line with its step count every ``interval_s``.
    """

    def __init__(self, title: str, stream: TextIO | None = None, interval_s: float = 30.0) -> None:
        self.title = title
        self.stream = stream
        self.interval_s = interval_s
        self._start = self._epoch_start = self._last_line = self._val_start = self._test_start = 0.0
        self._epoch_times: list[float] = []
        self._steps = 0
        self._val_s = 0.0
        self._loss_sum: torch.Tensor | None = None
        self._val: dict[str, float] = {}

    # -------------------------------------------------------------------------------------------- output

    def _write(self, trainer: Trainer, text: str) -> None:
        if trainer.is_global_zero:
            stream = self.stream or sys.stderr
            stream.write(f"  {self.title}  {text}\n")
            stream.flush()

    def _eta(self, trainer: Trainer) -> str:
        """Time left from the mean epoch time (the first epoch, which fills the caches, only while it is alone)."""
        done, total = len(self._epoch_times), trainer.max_epochs or -1
        if done == 0 or done >= total:  # nothing measured yet, the last epoch, or no epoch limit (-1)
            return ""
        steady = self._epoch_times[1:] or self._epoch_times
        return f"  ETA {clock(sum(steady) / len(steady) * (total - done))}"

    # -------------------------------------------------------------------------------------------- training

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start = time.perf_counter()
        self._epoch_times = []

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch_start = self._last_line = time.perf_counter()
        self._steps, self._val_s, self._loss_sum, self._val = 0, 0.0, None, {}

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._steps += 1
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().float()
            self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        now = time.perf_counter()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            of = trainer.num_training_batches
            rate = self._steps / max(now - self._epoch_start - self._val_s, 1e-9)
            if isinstance(of, int):  # a sized loader: the epoch's own ETA
                where = f"step {self._steps}/{of} ({rate:.1f} it/s, epoch ETA {clock((of - self._steps) / rate)})"
            else:
                where = f"step {self._steps} ({rate:.1f} it/s)"
            self._write(trainer, f"epoch {trainer.current_epoch + 1}: {where}")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._val_s += time.perf_counter() - self._val_start
        metrics = trainer.callback_metrics  # computed by now; the checkpoint callback reads them here too
        self._val = {k: float(metrics[k]) for k in _SHOWN_VAL if k in metrics}

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        now = time.perf_counter()
        seconds = now - self._epoch_start
        self._epoch_times.append(seconds)
        total = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        train_s = max(seconds - self._val_s, 1e-9)
        parts = [
            f"epoch {trainer.current_epoch + 1}{total}",
            f"{self._steps} steps in {train_s:.1f} s ({self._steps / train_s:.1f} it/s)",
        ]
        if self._loss_sum is not None:
            parts.append(f"loss {float(self._loss_sum) / self._steps:.3f}")
        if self._val_s:
            shown = "".join(f" {k} {v:.3f}" for k, v in self._val.items())
            parts.append(f"validation {self._val_s:.1f} s{shown}")
        parts.append(f"elapsed {clock(now - self._start)}{self._eta(trainer)}")
        self._write(trainer, "  ".join(parts))

    # -------------------------------------------------------------------------------------------- test

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._test_start = time.perf_counter()
        batches = sum(b for b in trainer.num_test_batches if isinstance(b, int))
        self._write(trainer, f"testing on the test split ({batches} batch{'es' * (batches != 1)})")

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write(trainer, f"test done in {clock(time.perf_counter() - self._test_start)}")
