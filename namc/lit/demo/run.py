"""``namc demo``: the whole method end to end on a CPU, with no downloads.

The stages (shapes world, pre-training, fine-tuning, the baseline without pre-training, evaluation) run in the
order :mod:`namc.lit.demo` describes; :func:`run_demo` runs them and :func:`main` is the command line.

Unless told to be quiet, the demo says where it is on stderr: first how long it takes on a 2-core CPU, then a line
per stage, a bar over the pairs of the shapes world written, and a line per training epoch with its rate and the
ETA of the stage (:class:`~namc.lit.demo.progress.EpochProgress`). Progress output changes nothing computed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
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
from namc.lit.demo.settings import EXPECTED_S, FAST, FULL, DemoSettings, clock, demo_configs, expected_total

__all__ = ["main", "run_demo"]

logger = logging.getLogger(__name__)


# stage -> its name in progress lines (the keys of the report's timings)
_TITLES = {
    "data": "data",
    "pretrain": "pre-training",
    "finetune": "fine-tuning",
    "scratch": "baseline",
    "evaluation": "evaluation",
}


def _speaker(progress: bool) -> Callable[[str], None]:
    """Where stage lines go: stderr when showing progress, else the log (INFO)."""

    def say(text: str) -> None:
        if progress:
            print(text, file=sys.stderr, flush=True)
        else:
            logger.info("%s", text)

    return say


def _expected(s: DemoSettings) -> dict[str, float] | None:
    """The measured 2-core wall time of each stage of :data:`FULL` or :data:`FAST` (``None`` for other settings)."""
    return EXPECTED_S["full"] if s == FULL else EXPECTED_S["fast"] if s == FAST else None


def _announce(say: Callable[[str], None], expected: dict[str, float] | None) -> None:
    """The first line: how long the demo takes on a 2-core CPU, stage by stage."""
    cores = os.cpu_count() or 1
    if expected is None:
        say(f"namc demo: 5 stages with custom settings (no time estimate); this machine has {cores} CPU cores")
        return
    stages = ", ".join(f"{_TITLES[k]} {clock(v)}" for k, v in expected.items())
    say(
        f"namc demo: 5 stages, {expected_total(expected)} of wall time on a 2-core CPU ({stages}); this machine has "
        f"{cores} CPU cores"
    )


@contextlib.contextmanager
def _stage(
    timings: dict[str, float], stage: str, line: str, say: Callable[[str], None], expected: dict[str, float] | None
) -> Iterator[None]:
    """Announce a stage (with its expected time), then record its wall time as ``timings[stage]`` (seconds).

    ``line`` may end with a parenthesis of details; the expected time joins it.
    """
    if expected:
        hint = f"about {clock(expected[stage])} on 2 cores"
        line = f"{line[:-1]}; {hint})" if line.endswith(")") else f"{line} ({hint})"
    say(line)
    start = time.perf_counter()
    yield
    timings[stage] = time.perf_counter() - start
    say(f"      {_TITLES[stage]} done in {clock(timings[stage])}")


def _epochs(n: int) -> str:
    return f"{n} epoch{'s' * (n != 1)}"


def _generate_data(out: Path, s: DemoSettings, seed: int, workers: int, progress: bool) -> dict[str, Any]:
    """The shapes world under ``out/data`` (replaced): corpus, held-out corpus and benchmark."""
    from namc.data.synthetic import generate_benchmark, generate_corpus

    data = out / "data"
    if data.exists():
        shutil.rmtree(data)
    corpus = generate_corpus(
        data / "corpus", s.corpus_pairs, s.image_size, seed, s.noise_rate, workers=workers, progress=progress
    )
    held_out = generate_corpus(
        data / "corpus_val",
        s.corpus_val_pairs,
        s.image_size,
        seed + 1,
        s.noise_rate,
        workers=workers,
        progress=progress,
    )
    bench = generate_benchmark(
        data / "clevr_change",
        s.benchmark_pairs,
        s.image_size,
        seed,
        s.captions_per_pair,
        splits=s.benchmark_splits,
        workers=workers,
        progress=progress,
    )
    return {"corpus": corpus, "corpus_val": held_out, "benchmark": bench}


def _write_config(path: Path, config: dict[str, Any]) -> Path:
    """Write one config as YAML, keys in the order of the dict."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _prepare_runs(out: Path, s: DemoSettings, seed: int, bars: bool) -> dict[str, Path]:
    """Write the three configs to ``out/configs`` and clear what earlier runs left; returns name -> config file."""
    configs = demo_configs(out, s, seed, bars)
    paths = {name: _write_config(out / "configs" / f"{name}.yaml", cfg) for name, cfg in configs.items()}
    runs = out / "runs"
    for name in configs:
        shutil.rmtree(runs / name, ignore_errors=True)
    shutil.rmtree(runs / "tensorboard", ignore_errors=True)
    return paths


def _fit(config_path: Path, test: bool, title: str, progress: bool) -> Any:
    """Build the LightningCLI from a config file, fit, and optionally test the best checkpoint.

    With ``progress``, an :class:`~namc.lit.demo.progress.EpochProgress` titled ``title`` joins the trainer's
    callbacks (it is not in the config files: ``namc fit --config`` reruns a stage as it was).
    """
    from namc.lit.cli import run_lightning
    from namc.lit.demo.progress import EpochProgress

    cli = run_lightning(["--config", str(config_path)], run=False)
    if progress:
        cli.trainer.callbacks.append(EpochProgress(title))
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    if test:
        cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best", verbose=False)
    return cli


def _pretrain(config_path: Path, progress: bool) -> tuple[int, dict[str, float]]:
    """Pre-train; returns the model's parameter count and its last ``val/*`` metrics (the run itself is freed)."""
    pre = _fit(config_path, test=False, title=_TITLES["pretrain"], progress=progress)
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
    out: str | Path = "runs/demo",
    *,
    fast: bool = False,
    seed: int = 0,
    workers: int | None = None,
    settings: DemoSettings | None = None,
    progress: bool = True,
    bars: bool = False,
) -> dict[str, Any]:
    """Run the demo and return its report (also written to ``<out>/report.json``).

    Args:
        out: output folder (replaced data; runs and logs are overwritten).
        fast: the one-minute smoke version.
        seed: seed of the data and of training.
        workers: processes for generating the shapes world (default: the CPU count, at most 4).
        settings: override the sizes and hyper-parameters (default :data:`FULL` or :data:`FAST`).
        progress: say where the run is on stderr: the expected wall time, a line per stage, bars over the data
            written and a line per training epoch with its rate and ETA (else the stage lines go to the log).
        bars: also show Lightning's progress bars.

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
    say, expected = _speaker(progress), _expected(s)
    _announce(say, expected)

    with _stage(timings, "data", f"[1/5] generating the shapes world in {out / 'data'}", say, expected):
        data = _generate_data(out, s, seed, workers, progress)
    paths = _prepare_runs(out, s, seed, bars)
    line = f"[2/5] pre-training namc_tiny on {s.corpus_pairs} pairs ({_epochs(s.pretrain_epochs)})"
    with _stage(timings, "pretrain", line, say, expected):
        parameters, pretrain_val = _pretrain(paths["pretrain"], progress)
    line = f"[3/5] fine-tuning the pre-trained model ({_epochs(s.finetune_epochs)})"
    with _stage(timings, "finetune", line, say, expected):
        fine = _fit(paths["finetune"], test=True, title=_TITLES["finetune"], progress=progress)
    line = f"[4/5] fine-tuning the same model without pre-training, the baseline ({_epochs(s.finetune_epochs)})"
    with _stage(timings, "scratch", line, say, expected):
        scratch = _fit(paths["scratch"], test=True, title=_TITLES["scratch"], progress=progress)
    line = "[5/5] evaluation: the frequent-caption baseline, noise identification and relevance maps"
    with _stage(timings, "evaluation", line, say, expected):
        caption, frequent, _ = frequent_caption_baseline(out / "data" / "clevr_change", s.image_size)
        png = out / "relevance_maps.png"
        noise = noise_identification(
            runs / "pretrain" / "model", out / "data" / "corpus_val" / "manifest.jsonl", png, batch_size=64
        )
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
    """``namc demo [--fast] [--out DIR] [--seed N] [--quiet | --verbose]``."""
    parser = argparse.ArgumentParser(prog="namc demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    parser.add_argument("--fast", action="store_true", help="a one-minute smoke run (meaningless numbers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="processes for data generation")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr (the report is still printed)")
    parser.add_argument("--verbose", action="store_true", help="also show Lightning's progress bars and logs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if not args.verbose:
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logging.getLogger(name).setLevel(logging.WARNING)
    report = run_demo(
        args.out, fast=args.fast, seed=args.seed, workers=args.workers, progress=not args.quiet, bars=args.verbose
    )
    print(format_report(report))
    return 0
