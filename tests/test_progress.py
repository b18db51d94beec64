"""Long jobs say where they are: bars over the shapes world written, one line per training epoch, ``--quiet``.

Progress output must change nothing: the shapes world's bytes and a trained model's weights are compared with and
without it. (The demo's own progress is checked in tests/test_demo.py, on the one fast demo run.)
"""

from __future__ import annotations

import filecmp
import io
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from namc.data.cli import main as data_main
from namc.lit.demo.progress import EpochProgress
from namc.lit.demo.settings import EXPECTED_S, clock, expected_total


def _same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return not mismatch and not errors and all(_same_tree(a / d, b / d) for d in cmp.common_dirs)


def test_shapes_cli_shows_bars_over_pairs_unless_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--pairs", "70", "--image-size", "32", "--shards", "--shard-size", "40"]
    world = tmp_path / "world"
    assert data_main(["shapes", "--out", str(world), "--workers", "1", *args]) == 0
    shown = capsys.readouterr()
    assert "benchmark:" in shown.out and "corpus: 70 pairs" in shown.out
    assert re.search(r"writing clevr_change: 100%.*\| 70/70 \[.*pair/s\]", shown.err)
    assert re.search(r"writing corpus: 100%.*\| 70/70 \[.*pair/s\]", shown.err)

    world.rename(tmp_path / "first")  # the same folder again: the shard index records the manifest's path
    assert data_main(["shapes", "--out", str(world), "--workers", "2", "--quiet", *args]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""
    assert quiet.out.count("\n") == shown.out.count("\n")  # the summary is still printed
    assert _same_tree(tmp_path / "first", world)  # progress, workers and chunking change no byte


class _Toy(pl.LightningModule):
    """A linear regression trained with SGD; it remembers every training loss it returned."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.losses: list[list[float]] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        if batch_idx == 0:
            self.losses.append([])
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.losses[-1].append(float(loss.detach()))
        return {"loss": loss}

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _train(callbacks: list[pl.Callback]) -> _Toy:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    torch.manual_seed(0)
    model = _Toy()
    trainer = pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        check_val_every_n_epoch=2,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    trainer.fit(model, DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=16))
    return model


def test_epoch_progress_prints_epochs_rate_loss_and_eta() -> None:
    stream = io.StringIO()
    model = _train([EpochProgress("toy", stream=stream, interval_s=0.0)])
    lines = stream.getvalue().splitlines()
    epochs = [line for line in lines if re.match(r"  toy  epoch \d/3  ", line)]
    assert len(epochs) == 3
    for i, line in enumerate(epochs):
        assert re.search(r"epoch \d/3  4 steps in \d+\.\d s \(\d+\.\d it/s\)", line), line
        assert f"loss {sum(model.losses[i]) / 4:.3f}" in line  # the mean of the epoch's training losses
        assert re.search(r"elapsed \d+ s", line)
        assert ("ETA" in line) == (i < 2)  # no ETA on the last epoch
        assert ("validation" in line and "val/loss" in line) == (i == 1)  # validated every 2 epochs
    # interval_s=0: a line after every step too, with the epoch's own ETA
    steps = [line for line in lines if re.match(r"  toy  epoch \d: step \d/4 \(", line)]
    assert len(steps) == 12 and "epoch ETA" in steps[0]


def test_epoch_progress_changes_nothing_trained() -> None:
    quiet = _train([])
    shown = _train([EpochProgress("toy", stream=io.StringIO(), interval_s=0.0)])
    assert quiet.losses == shown.losses
    for a, b in zip(quiet.state_dict().values(), shown.state_dict().values()):
        assert torch.equal(a, b)


def test_clock_and_the_expected_demo_time() -> None:
    assert [clock(s) for s in (4.4, 59.6, 250, 3725)] == ["4 s", "1:00", "4:10", "1:02:05"]
    assert expected_total(EXPECTED_S["full"]) == "about 9 min"  # the demo on 2 cores: 525 s
    assert expected_total({"a": 30, "b": 16}) == "about 46 s"
