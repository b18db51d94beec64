"""Running a study: every (variant, seed) is a chain of ordinary ``namc`` commands in subprocesses,

::

    namc fit  --config OUT/stages/pretrain-<hash>/config.yaml                 (skipped by variants without one;
                                                                              shared by runs with equal configs)
    namc fit  --config OUT/runs/<variant>/seed<k>/finetune.yaml              (from the pre-trained export)
    namc test --config OUT/runs/<variant>/seed<k>/test.yaml --ckpt_path <best val/cider checkpoint>

so each one can as well be sent to a cluster scheduler as its own job. ``--jobs N`` runs N chains side by side,
every process with one thread (``OMP_NUM_THREADS=1``). A run is finished when its row is in ``results.jsonl``
(rewritten atomically by this process only); a rerun skips finished runs and reruns a run whose configs changed
(its config hash differs). Pre-training stages are keyed by the hash of their config (seed included), so the
variants of Table 10 that differ only in fine-tuning share one pre-training per seed.

The runner owns where outputs go: it sets ``seed_everything``, the data shuffle seeds, a CSV logger, the export and
checkpoint folders and (for fine-tuning after pre-training) ``model.init_args.pretrained``; the study owns every
hyper-parameter.
"""

from __future__ import annotations

import copy
import csv
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from namc.experiment.results import read_results, write_results
from namc.experiment.study import Study, Variant, apply_overrides, config_hash
from namc.jsonl import loads
from namc.models.files import atomic_write_text, read_json

__all__ = ["RunError", "prepare_data", "run_study"]

logger = logging.getLogger(__name__)


class RunError(RuntimeError):
    """A ``namc`` subprocess of a run failed (the message names its log file)."""


def _dump(path: Path, cfg: dict[str, Any]) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(cfg, sort_keys=False))
    return path


def prepare_data(study: Study, out: Path, progress: bool = True) -> dict[str, dict[str, Any]]:
    """Generate the study's shapes world once under ``out/data`` (kept while its parameters are unchanged) and return
    the data overrides of each stage that point at it; ``{}`` per stage when the study brings its own data."""
    if study.shapes is None:
        return {"pretrain": {}, "finetune": {}}
    from namc.data.synthetic import generate_benchmark, generate_corpus

    s = {
        "corpus_pairs": 2000,
        "corpus_val_pairs": 200,
        "benchmark_pairs": 1250,
        "image_size": 64,
        "noise_rate": 0.2,
        "captions_per_pair": 3,
        "splits": [0.64, 0.08, 0.28],
        "seed": 0,
        **study.shapes,
    }
    data = (out / "data").resolve()
    marker = data / "shapes.json"
    if not _same_json(marker, s):
        logger.info("generating the shapes world in %s", data)
        generate_corpus(
            data / "corpus", s["corpus_pairs"], s["image_size"], s["seed"], s["noise_rate"], progress=progress
        )
        generate_corpus(
            data / "corpus_val",
            s["corpus_val_pairs"],
            s["image_size"],
            s["seed"] + 1,
            s["noise_rate"],
            progress=progress,
        )
        generate_benchmark(
            data / "clevr_change",
            s["benchmark_pairs"],
            s["image_size"],
            s["seed"],
            s["captions_per_pair"],
            splits=tuple(s["splits"]),
            progress=progress,
        )
        atomic_write_text(marker, json.dumps(s, indent=1))
    bench = str(data / "clevr_change")
    return {
        "pretrain": {
            "data.init_args.train": str(data / "corpus" / "manifest.jsonl"),
            "data.init_args.val": str(data / "corpus_val" / "manifest.jsonl"),
            "data.init_args.vocab_benchmarks": {"clevr_change": bench},
        },
        "finetune": {"data.init_args.name": "clevr_change", "data.init_args.root": bench},
    }


def _expand_shapes(value: Any, folder: Path) -> Any:
    """``value`` with ``{shapes}`` in its strings replaced by the generated shapes world's folder, so a variant can
    name one of its files (Table 11: ``{shapes}/corpus/conventional.jsonl``)."""
    if isinstance(value, str):
        return value.replace("{shapes}", str(folder))
    if isinstance(value, dict):
        return {k: _expand_shapes(v, folder) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_shapes(v, folder) for v in value]
    return value


def _same_json(path: Path, expected: Any) -> bool:
    """Whether ``path`` holds ``expected`` as JSON (missing or unreadable: no, so the data is generated again)."""
    try:
        return path.is_file() and read_json(path, error=ValueError) == expected
    except (OSError, ValueError):
        return False


def _with_outputs(cfg: dict[str, Any], root: Path, version: str, seed: int) -> dict[str, Any]:
    """The config with the runner's seed, CSV logger and output folders under ``root``."""
    cfg = copy.deepcopy(cfg)
    cfg["seed_everything"] = seed
    trainer = cfg.setdefault("trainer", {})
    trainer["default_root_dir"] = str(root)
    trainer["enable_progress_bar"] = False
    trainer["logger"] = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": str(root), "name": "logs", "version": version},
    }
    callbacks = []
    for cb in trainer.get("callbacks") or []:
        cb = copy.deepcopy(cb)
        name = str(cb.get("class_path", ""))
        if name.endswith("ExportModel"):
            cb.setdefault("init_args", {})["dirpath"] = str(root / "model")
        elif name.endswith("ModelCheckpoint"):
            cb.setdefault("init_args", {})["dirpath"] = str(root / "checkpoints")
        elif name.endswith("LearningRateMonitor"):
            continue  # nothing to read it in a study
        callbacks.append(cb)
    trainer["callbacks"] = callbacks
    apply_overrides(cfg, {"data.init_args.shuffle_seed": seed})
    return cfg


def _last_csv_values(path: Path) -> dict[str, float]:
    """The last logged value of every column of a Lightning ``metrics.csv`` (and ``<col>@max`` of ``val/*``)."""
    if not path.exists():
        return {}
    last: dict[str, float] = {}
    best: dict[str, float] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            for k, v in row.items():
                if k and v not in (None, ""):
                    x = float(v)
                    last[k] = x
                    if k.startswith("val/"):
                        best[k] = max(best.get(k, -math.inf), x)
    return {**last, **{f"{k}@max": v for k, v in best.items()}}


def _namc(args: list[str], log: Path, cwd: Path) -> float:
    """Run ``namc ARGS`` (this interpreter) with one thread, output to ``log``; returns its wall time."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "TQDM_DISABLE": "1",
    }
    start = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as f:
        rc = subprocess.run(
            [sys.executable, "-m", "namc.cli", *args], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, check=False
        ).returncode
    if rc != 0:
        tail = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
        raise RunError(f"namc {' '.join(args[:1])} failed (exit {rc}); see {log}: {tail[-1] if tail else ''}")
    return time.perf_counter() - start


def _best_checkpoint(folder: Path) -> Path:
    """The newest ``best*.ckpt`` (``filename: best`` of the benchmark recipes, ``best-epoch07`` of the demo's: by
    time, not name, since "epoch9" > "epoch39"), else ``last.ckpt``."""
    best = sorted(folder.glob("best*.ckpt"), key=lambda p: p.stat().st_mtime)
    if best:
        return best[-1]
    last = folder / "last.ckpt"
    if last.exists():
        return last
    raise RunError(f"no checkpoint in {folder} (the fine-tuning config needs a ModelCheckpoint)")


class _Runner:
    """One study in one output folder: builds each run's configs and runs them (thread-safe)."""

    def __init__(self, study: Study, out: Path, data: dict[str, dict[str, Any]]) -> None:
        self.study, self.out, self.data = study, out.resolve(), data
        self.cwd = Path.cwd()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _stage_cfg(self, variant: Variant, stage: str, seed: int) -> dict[str, Any] | None:
        cfg = self.study.stage_config(variant, stage, self.data[stage])
        if cfg is not None:
            cfg["seed_everything"] = seed
            if self.study.shapes is not None:
                cfg = _expand_shapes(cfg, self.out / "data")
        return cfg

    def _key(self, cfg: dict[str, Any] | None) -> Any:
        """The config as hashed: the output folder spelled ``$OUT`` (a moved study keeps its hashes)."""
        return (
            None if cfg is None else loads(json.dumps(cfg, default=str).replace(str(self.out), "$OUT"), max_chars=None)
        )

    def plan(self, variant: Variant, seed: int) -> dict[str, Any]:
        pre = self._stage_cfg(variant, "pretrain", seed)
        fine = self._stage_cfg(variant, "finetune", seed)
        assert fine is not None
        pre_hash = None if pre is None else config_hash(self._key(pre))
        return {"pre": pre, "fine": fine, "pre_hash": pre_hash, "hash": config_hash(self._key(pre), self._key(fine))}

    def _pretrain(self, cfg: dict[str, Any], key: str, seed: int) -> dict[str, Any]:
        root = self.out / "stages" / f"pretrain-{key}"
        done = root / "done.json"
        with self._lock(key):
            if done.exists():  # its model where the study folder is now (the folder may have moved since)
                return {**_read_object(done), "model": str(root / "model"), "reused": True}
            path = _dump(root / "config.yaml", _with_outputs(cfg, root, "fit", seed))
            wall = _namc(["fit", "--config", str(path)], root / "log.txt", self.cwd)
            logged = _last_csv_values(root / "logs" / "fit" / "metrics.csv")
            metrics = {f"pretrain/{k[4:]}": v for k, v in logged.items() if k.startswith("val/") and "@" not in k}
            info = {"hash": key, "wall_s": wall, "model": str(root / "model"), "metrics": metrics}
            atomic_write_text(done, json.dumps(info, indent=1))
            return {**info, "reused": False}

    def run(self, variant: Variant, seed: int, plan: dict[str, Any]) -> dict[str, Any]:
        start = time.perf_counter()
        root = self.out / "runs" / variant.name / f"seed{seed}"
        stages: dict[str, Any] = {}
        metrics: dict[str, float] = {}
        fine = copy.deepcopy(plan["fine"])
        if plan["pre"] is not None:
            info = self._pretrain(plan["pre"], plan["pre_hash"], seed)
            stages["pretrain"] = {k: info[k] for k in ("hash", "wall_s", "reused")}
            metrics.update(info["metrics"])
            apply_overrides(fine, {"model.init_args.pretrained": info["model"]})
        ft_root = root / "finetune"
        for stale in (ft_root, root / "test"):  # an earlier attempt of this run (other configs, or killed): its
            shutil.rmtree(stale, ignore_errors=True)  # checkpoints must not be taken for this one's
        path = _dump(root / "finetune.yaml", _with_outputs(fine, ft_root, "fit", seed))
        stages["finetune"] = {"wall_s": _namc(["fit", "--config", str(path)], root / "finetune.log", self.cwd)}
        fit_csv = _last_csv_values(ft_root / "logs" / "fit" / "metrics.csv")
        metrics.update({k: v for k, v in fit_csv.items() if k == "val/cider@max"})
        ckpt = _best_checkpoint(ft_root / "checkpoints")
        test_root = root / "test"
        path = _dump(root / "test.yaml", _with_outputs(fine, test_root, "test", seed))
        args = ["test", "--config", str(path), "--ckpt_path", str(ckpt)]
        stages["test"] = {"wall_s": _namc(args, root / "test.log", self.cwd), "checkpoint": ckpt.name}
        metrics.update(_test_scores(test_root / "logs" / "test" / "captions" / "test.json"))
        return {
            "variant": variant.name,
            "seed": seed,
            "config_hash": plan["hash"],
            "wall_s": round(time.perf_counter() - start, 2),
            "metrics": metrics,
            "stages": stages,
            "tags": variant.tags,
            "finished": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


def _read_object(path: Path) -> dict[str, Any]:
    """A JSON object written by a run (through the bounded reader); anything else is a :class:`RunError` naming it."""
    data = read_json(path, error=RunError)
    if not isinstance(data, dict):
        raise RunError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _test_scores(path: Path) -> dict[str, float]:
    """``test/<metric>`` (x100, as logged) and ``test/CIDEr-D_<type>`` from the test captions file."""
    if not path.exists():
        raise RunError(f"the test run wrote no scores ({path} is missing)")
    data = _read_object(path)
    scores = data.get("scores")
    if not isinstance(scores, dict):
        raise RunError(f"{path}: no 'scores' object")
    out = {f"test/{k}": float(v) for k, v in scores.get("overall", {}).items() if isinstance(v, (int, float))}
    for ctype, per in (scores.get("per_type") or {}).items():
        if isinstance(per.get("CIDEr-D"), (int, float)):
            out[f"test/CIDEr-D_{ctype}"] = float(per["CIDEr-D"])
    return {**out, **caption_spread(data)}


def caption_spread(data: dict[str, Any]) -> dict[str, float]:
    """``test/distinct_captions`` and ``test/top_caption_share`` (the most frequent caption's share of the pairs) of
    a test captions file: a model that writes one caption for every pair scores whatever that caption happens to
    match, so a miniature table needs these beside its CIDEr-D. Empty when the file lists no captions."""
    captions = [
        str(item.get("prediction"))
        for key, items in data.items()
        if key != "scores" and isinstance(items, list)
        for item in items
        if isinstance(item, dict) and "prediction" in item
    ]
    if not captions:
        return {}
    top = Counter(captions).most_common(1)[0][1]
    return {"test/distinct_captions": float(len(set(captions))), "test/top_caption_share": top / len(captions)}


def run_study(study: Study, out: str | Path, jobs: int = 1, progress: bool = True) -> tuple[list[dict], list[str]]:
    """Run every unfinished (variant, seed) of ``study`` into ``out``; returns (all rows, failure messages).

    Rows of runs whose config hash changed are dropped before the runs start (a run that then fails leaves no row,
    not the old config's); rows of variants or seeds no longer in the study are kept (the report shows only the
    study's own).
    """
    from tqdm.auto import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = prepare_data(study, out, progress)
    runner = _Runner(study, out, data)
    rows = {(r["variant"], r["seed"]): r for r in read_results(out)}
    todo, stale = [], []
    for seed in study.seeds:  # seed-major: a study stopped early has whole seeds of every variant
        for variant in study.variants:
            plan = runner.plan(variant, seed)
            row = rows.get((variant.name, seed))
            if row is not None and row["config_hash"] == plan["hash"]:
                continue
            if row is not None:  # made with another config: no longer a result of this study
                stale.append(rows.pop((variant.name, seed)))
            todo.append((variant, seed, plan))
    logger.info(
        "%s: %d runs to do, %d finished", study.name, len(todo), len(study.variants) * len(study.seeds) - len(todo)
    )
    failures: list[str] = []
    write_lock = threading.Lock()
    order = {v.name: i for i, v in enumerate(study.variants)}
    if stale:
        logger.info("%s: %d results of an earlier config dropped", study.name, len(stale))
        write_results(out, sorted(rows.values(), key=lambda r: (order.get(r["variant"], len(order)), r["seed"])))

    def save(row: dict[str, Any]) -> None:
        with write_lock:
            rows[(row["variant"], row["seed"])] = row
            ordered = sorted(rows.values(), key=lambda r: (order.get(r["variant"], len(order)), r["seed"]))
            write_results(out, ordered)

    bar = tqdm(total=len(todo), desc=study.name, unit="run", disable=not progress or not todo)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(runner.run, v, s, p): (v.name, s) for v, s, p in todo}
        for future in as_completed(futures):
            name, seed = futures[future]
            try:
                save(future.result())
            except (RunError, OSError, ValueError, KeyError) as err:
                failures.append(f"{name} seed {seed}: {err}")
                logger.error("%s seed %d failed: %s", name, seed, err)
            bar.update(1)
    bar.close()
    return sorted(rows.values(), key=lambda r: (order.get(r["variant"], len(order)), r["seed"])), failures
