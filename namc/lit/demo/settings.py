"""Sizes and hyper-parameters of the demo, how long it takes, and the LightningCLI configs of its three training runs.

:class:`DemoSettings` with :data:`FULL` (the demo) and :data:`FAST` (``--fast``); :func:`demo_configs` builds the
configs the demo writes to ``<out>/configs`` (``configs/demo/*.yaml`` are those of :data:`FULL` with
``out=runs/demo``, and a test checks that they stay equal).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = ["EXPECTED_S", "FAST", "FULL", "DemoSettings", "clock", "demo_configs", "expected_total"]


@dataclass(frozen=True)
class DemoSettings:
    """Sizes and hyper-parameters of a demo run (see :data:`FULL` and :data:`FAST`).

    They differ from the paper's (appendix F) on purpose: the tiny model starts from random weights (no CLIP,
    ImageNet or VQGAN weights can be had here) and must learn in minutes, so the learning rates are higher (1e-3,
    decaying gently), the model narrower (D 32, 2 heads; the 2 + 2 layer structure is kept) and dropout off.

    The ResNet grid encoder has no ImageNet weights here, so pre-training trains it (``pretrain_grid_trainable``):
    the corpus teaches the visual features that ImageNet gives the paper's model, and fine-tuning then keeps it
    frozen, as the paper does. The no-pre-training baseline fine-tunes the same way on the random, frozen ResNet.
    Measured (seed 0, fine-tuning 50 epochs, 200 test pairs): pre-training 16 epochs with the random ResNet frozen
    gave test CIDEr-D 164 against 137 without pre-training; 10 epochs with it trained, 214 against 144. Training it
    costs about 0.4 s per pre-training step (channels-last convolutions) against 0.26 with frozen, cached grids.
    More fine-tuning helps the baseline more than namc (seed 2, 700 test pairs: 8 pre-training and 60 fine-tuning
    epochs, 193.6 against 171.7; 10 and 50, 198.1 against about 146).
    Fine-tuning length matters most for the captions of both systems (same pre-trained model, frozen ResNet, 12 /
    40 / 60 fine-tuning epochs: 116 / 149 / 185; without pre-training 45 / 134 / 175).

    NIM adds a token-level alignment term (``nim_token_loss``, :func:`namc.ops.token_sigmoid_loss`) to the paper's
    SDM loss: Eq. 1 relies on the word-patch alignment a pre-trained CLIP brings, and SDM alone (a loss on [EOS]
    and [CLS] only) leaves a random NIM's per-word outputs untrained (noise AUROC 0.48, chance). Its word labels
    are bigram presence in the image's own description (``nim_token_ngram = 2``). Measured with NIM alone on the
    demo corpus (batch 32, lr 1e-3): pair labels reach AUROC 0.65 after 1,250 steps, since words true of most
    images ("a", "small") are pushed down with the noise; word (unigram) labels 0.73, since the "a" of "near a"
    is then as relevant as every other "a"; bigram labels 0.93 after 250 steps.
    ``finetune_grid_trainable`` trains the ResNet during fine-tuning too (off: the paper freezes it, and without
    the grid cache fine-tuning is about 7 times slower). It makes a much stronger baseline: without pre-training,
    50 epochs, seed 0, final weights, 188.7 with the ResNet trained against 157.7 frozen (namc: 202.6 frozen,
    226.4 trained); in a 12-epoch run both systems collapsed onto one caption (35 and 44).
    The benchmark has 1,250 scenes: 800 for training, 100 for validation and 350 (700 pairs with the distractors)
    for the test split, large enough that one run's score is not mostly sampling noise.
    """

    corpus_pairs: int = 2000
    corpus_val_pairs: int = 200
    benchmark_pairs: int = 1250
    benchmark_splits: tuple[float, float, float] = (0.64, 0.08, 0.28)
    image_size: int = 64
    noise_rate: float = 0.2
    captions_per_pair: int = 3
    model_overrides: dict[str, Any] = field(default_factory=lambda: {"dim": 32, "heads": 2, "dropout": 0.0})
    pretrain_epochs: int = 10
    pretrain_grid_trainable: bool = True
    pretrain_batch: int = 32
    pretrain_lr_nim: float = 1e-3
    pretrain_min_lr_nim: float = 1e-4
    pretrain_lr: float = 1e-3
    pretrain_min_lr: float = 5e-4
    nim_loss: str = "sdm"
    nim_token_loss: float = 50.0
    nim_token_ngram: int | None = 2
    finetune_epochs: int = 50
    finetune_batch: int = 32
    finetune_lr: float = 1e-3
    finetune_min_lr: float = 5e-4
    finetune_grid_trainable: bool = False
    val_every: int = 10
    examples: int = 5


#: The demo: under 10 minutes on 2 CPU cores.
FULL = DemoSettings()
#: The smoke test (``--fast``): about a minute; the numbers mean nothing.
FAST = replace(
    FULL,
    corpus_pairs=48,
    corpus_val_pairs=16,
    benchmark_pairs=30,
    pretrain_epochs=1,
    pretrain_batch=16,
    finetune_epochs=1,
    finetune_batch=16,
    val_every=1,
    examples=3,
)


#: Wall time (s) of each demo stage on a 2-core CPU machine (seed 0, 2 torch threads), what ``namc demo`` announces
#: when it starts: ``full`` is the demo, measured with nothing else running (about 9 minutes; process start adds
#: about 6 s); ``fast`` is ``--fast``, the best of five runs with other jobs on the machine (load average 3 to 6: the
#: runs took 49 to 87 s in all, 43 s of CPU time; with ``OMP_NUM_THREADS=1`` 20 to 27 s).
EXPECTED_S: dict[str, dict[str, float]] = {
    "full": {"data": 4, "pretrain": 250, "finetune": 134, "scratch": 135, "evaluation": 2},
    "fast": {"data": 1, "pretrain": 14, "finetune": 18, "scratch": 9, "evaluation": 2},
}


def clock(seconds: float) -> str:
    """``42 s``, ``4:10`` (minutes:seconds) or ``1:02:03``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def expected_total(expected: Mapping[str, float]) -> str:
    """``about 9 min`` (whole minutes from 90 s on) or ``about 45 s``."""
    total = sum(expected.values())
    return f"about {round(total / 60)} min" if total >= 90 else f"about {round(total)} s"


def _trainer(root: Path, name: str, epochs: int, val_every: int, monitor: str | None, progress: bool) -> dict[str, Any]:
    """The ``trainer`` section of a run: CPU, TensorBoard logs, the exported model and checkpoints under ``root``."""
    callbacks: list[dict[str, Any]] = [
        {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor", "init_args": {"logging_interval": "step"}},
        {"class_path": "namc.lit.ExportModel", "init_args": {"dirpath": str(root / name / "model")}},
    ]
    checkpoints = str(root / name / "checkpoints")
    if monitor:  # the best so far; with save_last, Lightning would write last.ckpt only when the best improves
        best = {
            "dirpath": checkpoints,
            "monitor": monitor,
            "mode": "max",
            "save_top_k": 1,
            "filename": "best-epoch{epoch:02d}",
            "auto_insert_metric_name": False,
        }
        callbacks.append({"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": best})
    last = {"dirpath": checkpoints, "save_last": True}  # last.ckpt after every validation (or epoch): to resume
    callbacks.append({"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": last})
    return {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": epochs,
        "check_val_every_n_epoch": val_every,
        "num_sanity_val_steps": 0,
        "log_every_n_steps": 5,
        "enable_model_summary": False,
        "enable_progress_bar": progress,
        "default_root_dir": str(root),
        "logger": {
            "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            "init_args": {"save_dir": str(root / "tensorboard"), "name": name, "version": ""},
        },
        "callbacks": callbacks,
    }


def _pretrain_config(data: Path, runs: Path, s: DemoSettings, seed: int, progress: bool) -> dict[str, Any]:
    """Pre-training ``namc_tiny`` on the noisy corpus, validated once, at the end, on the held-out corpus."""
    return {
        "seed_everything": seed,
        "trainer": _trainer(runs, "pretrain", s.pretrain_epochs, s.pretrain_epochs, None, progress),
        "model": {
            "class_path": "namc.lit.PretrainModule",
            "init_args": {
                "model": "namc_tiny",
                "nim_loss": s.nim_loss,
                "nim_token_loss": s.nim_token_loss,
                "nim_token_ngram": s.nim_token_ngram,
                "overrides": {**s.model_overrides, **({"grid_trainable": True} if s.pretrain_grid_trainable else {})},
                "lr_nim": s.pretrain_lr_nim,
                "min_lr_nim": s.pretrain_min_lr_nim,
                "lr": s.pretrain_lr,
                "min_lr": s.pretrain_min_lr,
                "cache_codes": True,
                "cache_grids": not s.pretrain_grid_trainable,
            },
        },
        "data": {
            "class_path": "namc.lit.datamodules.CorpusDataModule",
            "init_args": {
                "train": str(data / "corpus" / "manifest.jsonl"),
                "val": str(data / "corpus_val" / "manifest.jsonl"),
                "batch_size": s.pretrain_batch,
                "num_workers": 0,
                "vocab_benchmarks": {"clevr_change": str(data / "clevr_change")},
                "shuffle_buffer": 256,
            },
        },
    }


def _finetune_config(data: Path, runs: Path, s: DemoSettings, seed: int, progress: bool) -> dict[str, Any]:
    """Fine-tuning the pre-trained model on the benchmark, keeping the checkpoint of the best ``val/cider``."""
    return {
        "seed_everything": seed,
        "trainer": _trainer(runs, "finetune", s.finetune_epochs, s.val_every, "val/cider", progress),
        "model": {
            "class_path": "namc.lit.FinetuneModule",
            "init_args": {
                "model": "namc_tiny",
                "pretrained": str(runs / "pretrain" / "model"),
                "lr": s.finetune_lr,
                "min_lr": s.finetune_min_lr,
                "grid_trainable": s.finetune_grid_trainable,
                "cache_grids": not s.finetune_grid_trainable,
            },
        },
        "data": {
            "class_path": "namc.lit.datamodules.BenchmarkDataModule",
            "init_args": {
                "name": "clevr_change",
                "root": str(data / "clevr_change"),
                "batch_size": s.finetune_batch,
                "eval_batch_size": 100,
                "num_workers": 0,
                "cache_images": True,
            },
        },
    }


def demo_configs(
    out: str | Path, settings: DemoSettings = FULL, seed: int = 0, progress: bool = True
) -> dict[str, dict[str, Any]]:
    """The LightningCLI configs of the demo's three training runs (``pretrain``, ``finetune``, ``scratch``).

    Args:
        out: the demo folder (data under ``out/data``, runs under ``out/runs``).
        settings: sizes and hyper-parameters.
        seed: ``seed_everything``.
        progress: show Lightning's progress bars.

    Returns:
        name -> config dict (what ``namc fit --config`` reads, without the subcommand).
    """
    out = Path(out)
    data, runs = out / "data", out / "runs"
    s = settings
    pretrain = _pretrain_config(data, runs, s, seed, progress)
    finetune = _finetune_config(data, runs, s, seed, progress)
    # The no-pre-training baseline: the same fine-tuning from random weights, with the same model overrides.
    scratch = json.loads(json.dumps(finetune))
    scratch["trainer"] = _trainer(runs, "scratch", s.finetune_epochs, s.val_every, "val/cider", progress)
    scratch["model"]["init_args"].update(pretrained=None, overrides=dict(s.model_overrides))
    return {"pretrain": pretrain, "finetune": finetune, "scratch": scratch}
