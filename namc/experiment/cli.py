"""``namc experiment``: run a study and report it.

::

    namc experiment run configs/experiments/table6.yaml [--out DIR] [--jobs N] [--fast]
    namc experiment report DIR

``run`` writes ``DIR/results.jsonl``, ``DIR/report.md``, PNG plots and ``DIR/study.yaml`` (a copy of the study, which
``report`` reads to know the variants, the reference and the metrics). Default ``DIR``: ``runs/experiments/<name>``
(``<name>-fast`` with ``--fast``). ``run`` holds ``DIR/.namc.lock`` (:func:`namc.locks.output_lock`) while it runs;
a second ``run`` into the same folder stops with one line naming the holder.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from namc.experiment.report import write_report
from namc.experiment.results import read_results
from namc.experiment.runner import run_study
from namc.experiment.study import Study, StudyError, load_study
from namc.locks import LockedError, output_lock

__all__ = ["main", "report_dir"]

logger = logging.getLogger(__name__)


def report_dir(out: str | Path, fast: bool = False, plots: bool = True) -> Path:
    """Rebuild ``report.md`` and the plots of a study folder from its ``results.jsonl`` and ``study.yaml``."""
    out = Path(out)
    study_file = out / "study.yaml"
    if not study_file.exists():
        raise StudyError(f"{out} is not a study folder ({study_file} is missing; `namc experiment run` writes it)")
    study = load_study(study_file, fast=fast, recipes=False)
    names = {v.name for v in study.variants}
    rows = [r for r in read_results(out) if r["variant"] in names and r["seed"] in study.seeds]
    tags = {v.name: v.tags for v in study.variants}
    title = study.title + (" (--fast scale: the numbers mean nothing)" if fast else "")
    return write_report(
        out, title, rows, [v.name for v in study.variants], study.metrics, study.reference, tags, study.plot, plots
    )


def _select(study: Study, seeds: list[int] | None, variants: list[str] | None) -> Study:
    """The study restricted to some seeds / variants (the report still covers every finished run of the study)."""
    names = {v.name for v in study.variants}
    unknown = sorted(set(variants or ()) - names)
    if unknown:
        raise StudyError(f"{study.path}: no variant(s) {unknown}; the study has {sorted(names)}")
    if variants:
        study.variants = [v for v in study.variants if v.name in variants]
    if seeds:
        outside = sorted(set(seeds) - set(study.seeds))
        if outside:
            raise StudyError(f"{study.path}: no seed(s) {outside}; the study has {study.seeds}")
        study.seeds = list(dict.fromkeys(seeds))
    return study


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``namc experiment``."""
    parser = argparse.ArgumentParser(prog="namc experiment", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run every unfinished (variant, seed) of a study, then report it")
    run.add_argument("study", help="a study YAML file (configs/experiments/*.yaml)")
    run.add_argument("--out", default=None, help="output folder (default: runs/experiments/<name>[-fast])")
    run.add_argument("--jobs", type=int, default=1, help="runs side by side, one thread each (default 1)")
    run.add_argument("--fast", action="store_true", help="the study's smoke scale (tiny data, few steps)")
    run.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    run.add_argument("--seeds", type=int, nargs="+", default=None, help="run only these of the study's seeds")
    run.add_argument("--variants", nargs="+", default=None, help="run only these variants")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    rep = sub.add_parser("report", help="rebuild report.md and the plots from results.jsonl")
    rep.add_argument("dir", help="a study folder written by `namc experiment run`")
    rep.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "report":
            fast = (Path(args.dir) / ".fast").exists()
            print(report_dir(args.dir, fast, plots=not args.no_plots).read_text(encoding="utf-8"))
            return 0
        study = load_study(args.study, fast=args.fast)
        run_only = _select(load_study(args.study, fast=args.fast), args.seeds, args.variants)
        out = Path(args.out or f"runs/experiments/{study.name}{'-fast' if args.fast else ''}")
        with output_lock(out, "namc experiment run"):  # two runs into one folder would interleave their results
            if Path(args.study).resolve() != (out / "study.yaml").resolve():
                shutil.copyfile(args.study, out / "study.yaml")
            (out / ".fast").unlink(missing_ok=True)
            if args.fast:
                (out / ".fast").touch()
            _, failures = run_study(run_only, out, jobs=args.jobs, progress=not args.quiet)
            path = report_dir(out, args.fast, plots=not args.no_plots)
    except (StudyError, LockedError, ValueError, OSError) as err:  # each names its file (or the lock's holder)
        print(f"namc experiment: error: {err}", file=sys.stderr)
        return 2
    print(path.read_text(encoding="utf-8"))
    if failures:
        print(f"namc experiment: {len(failures)} run(s) failed:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0
