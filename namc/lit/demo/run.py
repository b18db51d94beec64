"""``namc demo``: the whole method end to end on a CPU, with no downloads.

The stages (shapes world, pre-training, fine-tuning, the baseline without pre-training, evaluation) run in the
order :mod:`namc.lit.demo` describes; :func:`run_demo` runs them and :func:`main` is the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from namc.lit.demo.report import (
    build_report,
    format_report,
    frequent_caption_baseline,
    noise_identification,
    pick_examples,
)
from namc.lit.demo.settings import FAST, FULL, DemoSettings, demo_configs

__all__ = ["main", "run_demo"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    """Record the wall time of the block as ``timings[stage]`` (seconds)."""
    start = time.perf_counter()
    yield
    timings[stage] = time.perf_counter() - start


def _generate_data(out: Path, s: DemoSettings, seed: int, workers: int) -> dict[str, Any]:
    """The shapes world under ``out/data`` (replaced): corpus, held-out corpus and benchmark."""
    from namc.data.synthetic import generate_benchmark, generate_corpus

    data = out / "data"
    if data.exists():
        shutil.rmtree(data)
    corpus = generate_corpus(data / "corpus", s.corpus_pairs, s.image_size, seed, s.noise_rate, workers=workers)
    held_out = generate_corpus(data / "corpus_val", s.corpus_val_pairs, s.image_size, seed + 1, s.noise_rate,
                               workers=workers)  # fmt: skip
    bench = generate_benchmark(data / "clevr_change", s.benchmark_pairs, s.image_size, seed, s.captions_per_pair,
                               splits=s.benchmark_splits, workers=workers)  # fmt: skip
    return {"corpus": corpus, "corpus_val": held_out, "benchmark": bench}


def _write_config(path: Path, config: dict[str, Any]) -> Path:
    """Write one config as YAML, keys in the order of the dict."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _prepare_runs(out: Path, s: DemoSettings, seed: int, progress: bool) -> dict[str, Path]:
    """Write the three configs to ``out/configs`` and clear what earlier runs left; returns name -> config file."""
    configs = demo_configs(out, s, seed, progress)
    paths = {name: _write_config(out / "configs" / f"{name}.yaml", cfg) for name, cfg in configs.items()}
    runs = out / "runs"
    for name in configs:
        shutil.rmtree(runs / name, ignore_errors=True)
    shutil.rmtree(runs / "tensorboard", ignore_errors=True)
    return paths


def _fit(config_path: Path, test: bool) -> Any:
    """Build the LightningCLI from a config file, fit, and optionally test the best checkpoint."""
    from namc.lit.cli import run_lightning

    cli = run_lightning(["--config", str(config_path)], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    if test:
        cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best", verbose=False)
    return cli


def _pretrain(config_path: Path) -> tuple[int, dict[str, float]]:
    """Pre-train; returns the model's parameter count and its last ``val/*`` metrics (the run itself is freed)."""
    pre = _fit(config_path, test=False)
    parameters = pre.model.model.num_parameters()
    val = {k: float(v) for k, v in pre.trainer.callback_metrics.items() if k.startswith("val/")}
    return parameters, val


def _quiet() -> None:
    """Silence the warnings a small CPU run triggers, and keep Hugging Face offline."""
    from namc.lit.cli import quiet_warnings

    quiet_warnings()
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*smaller than the logging interval.*")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def run_demo(
    out: str | Path = "runs/demo", *, fast: bool = False, seed: int = 0, workers: int | None = None,
    settings: DemoSettings | None = None, progress: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Run the demo and return its report (also written to ``<out>/report.json``).

    Args:
        out: output folder (replaced data; runs and logs are overwritten).
        fast: the one-minute smoke version.
        seed: seed of the data and of training.
        workers: processes for generating the shapes world (default: the CPU count, at most 4).
        settings: override the sizes and hyper-parameters (default :data:`FULL` or :data:`FAST`).
        progress: show Lightning's progress bars.

    Returns:
        the report dict.
    """
    import torch

    _quiet()
    s = settings or (FAST if fast else FULL)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    workers = workers or min(os.cpu_count() or 1, 4)
    runs = out / "runs"
    timings: dict[str, float] = {}
    start = time.perf_counter()

    with _timed(timings, "data"):
        logger.info("[1/5] generating the shapes world in %s", out / "data")
        data = _generate_data(out, s, seed, workers)
    paths = _prepare_runs(out, s, seed, progress)
    with _timed(timings, "pretrain"):
        logger.info("[2/5] pre-training namc_tiny on %d pairs (%d epochs)", s.corpus_pairs, s.pretrain_epochs)
        parameters, pretrain_val = _pretrain(paths["pretrain"])
    with _timed(timings, "finetune"):
        logger.info("[3/5] fine-tuning the pre-trained model (%d epochs)", s.finetune_epochs)
        fine = _fit(paths["finetune"], test=True)
    with _timed(timings, "scratch"):
        logger.info("[4/5] fine-tuning the same model without pre-training (baseline)")
        scratch = _fit(paths["scratch"], test=True)
    with _timed(timings, "evaluation"):
        logger.info("[5/5] baselines, noise identification and relevance maps")
        caption, frequent, _ = frequent_caption_baseline(out / "data" / "clevr_change", s.image_size)
        png = out / "relevance_maps.png"
        noise = noise_identification(runs / "pretrain" / "model", out / "data" / "corpus_val" / "manifest.jsonl",
                                     png, batch_size=64)  # fmt: skip
    timings["total"] = time.perf_counter() - start

    test_path = Path(fine.trainer.log_dir) / "captions" / "test.json"
    report = build_report(
        settings={**asdict(s), "fast": fast, "seed": seed, "torch_threads": torch.get_num_threads()},
        data=data,
        test_scores={
            "namc": fine.model.scores["test"],
            "no_pretraining": scratch.model.scores["test"],
            "frequent_caption": frequent,
        },
        frequent_caption=caption,
        noise=noise,
        pretrain_val=pretrain_val,
        parameters=parameters,
        examples=pick_examples(test_path, s.examples),
        paths={
            "model": str(runs / "finetune" / "model"),
            "pretrained_model": str(runs / "pretrain" / "model"),
            "tensorboard": str(runs / "tensorboard"),
            "relevance_maps": noise.get("figure", str(png)),
            "configs": str(out / "configs"),
            "test_captions": str(test_path),
        },
        timings=timings,
    )
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``namc demo [--fast] [--out DIR] [--seed N]``."""
    parser = argparse.ArgumentParser(prog="namc demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    parser.add_argument("--fast", action="store_true", help="a one-minute smoke run (meaningless numbers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="processes for data generation")
    parser.add_argument("--verbose", action="store_true", help="show Lightning's progress bars and logs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if not args.verbose:
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logging.getLogger(name).setLevel(logging.WARNING)
    logger.setLevel(logging.INFO)
    report = run_demo(args.out, fast=args.fast, seed=args.seed, workers=args.workers, progress=args.verbose)
    print(format_report(report))
    return 0
