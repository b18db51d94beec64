"""Store a study's figures as ``benchmarks/results/FOLDER/NAME.json``, the reports benchmarks/tables.py renders.

    python benchmarks/store_study.py table11 "Table 11 in miniature on the shapes world: ..." \\
        --folder epyc-avx2-shapes-studies --machine "2 cores of an AMD EPYC (AVX2) shared with other jobs"

Reads ``runs/experiments/NAME`` (what ``namc experiment run configs/experiments/NAME.yaml`` wrote), keeps the seeds
every variant finished, and stores per variant and metric what ``namc experiment report`` prints: n, mean, sample
sd, the 95% t-interval and the paired difference from the reference variant with its p (the per-run rows are not
stored).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from namc.experiment.report import aggregate
from namc.experiment.results import read_results
from namc.experiment.study import load_study

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("name", help="the study's name (configs/experiments/NAME.yaml, runs/experiments/NAME)")
parser.add_argument("what", help="one sentence: what the study measures")
parser.add_argument("--folder", default="epyc-avx2-shapes-studies", help="benchmarks/results/FOLDER")
parser.add_argument("--machine", default="2 cores of an AMD EPYC (AVX2) shared with other jobs, one thread per run")
parser.add_argument("--runs", type=Path, default=None, help="the study's output folder (default runs/experiments/NAME)")
args = parser.parse_args()
name, what = args.name, args.what
out = args.runs or Path(f"runs/experiments/{name}")
study = load_study(out / "study.yaml", recipes=False)
names = [v.name for v in study.variants]
rows = [r for r in read_results(out) if r["variant"] in names and r["seed"] in study.seeds]
done = {s: {r["variant"] for r in rows if r["seed"] == s} for s in study.seeds}
seeds = sorted(s for s, vs in done.items() if vs == set(names))  # whole seeds only
rows = [r for r in rows if r["seed"] in seeds]
agg = aggregate(rows, names, study.metrics, study.reference)


def rounded(d: dict, digits: int = 2) -> dict:
    return {
        k: (v if k == "n" else round(v, 3 if k == "p" else digits))
        for k, v in d.items()
        if k == "n" or (isinstance(v, float) and math.isfinite(v))
    }


variants = {}
for v in names:
    figs = {}
    for m in study.metrics:
        a = agg[v][m]
        s = a["summary"]
        entry = {"summary": rounded({"n": s.n, "mean": s.mean, "sd": s.sd, "low": s.low, "high": s.high})}
        p = a["paired"]
        if p is not None:
            entry["paired"] = rounded({"n": p.n, "mean": p.diff.mean, "low": p.diff.low, "high": p.diff.high, "p": p.p})
        figs[m] = entry
    variants[v] = figs
walls = [r["wall_s"] for r in rows]
stored = {
    "what": what,
    "study": f"configs/experiments/{name}.yaml",
    "command": f"namc experiment run configs/experiments/{name}.yaml --jobs 1"
    + ("" if seeds == study.seeds else " --seeds " + " ".join(map(str, seeds))),
    "seeds": seeds,
    "scale": "a shapes world of 800 corpus pairs (20% of the phrases injected noise), 100 held-out corpus pairs and "
    "500 benchmark scenes (320 train / 40 val / 140 test: 280 test pairs with the distractors); namc_tiny at width 32 "
    "with 2 heads, random initialisation, the demo's settings; pre-training 4 epochs (100 steps of 32), fine-tuning "
    "40 epochs (800 steps of 32), the checkpoint of the last validation tested",
    "machine": args.machine,
    "wall_s_per_run": {"n": len(walls), "mean": round(sum(walls) / len(walls), 1), "max": round(max(walls), 1)},
    "figures": "as `namc experiment report` printed them from the study's results.jsonl (one row per run; not "
    "stored): per variant and metric the number of seeds n, the mean, the sample sd and the 95% t-interval (low, "
    "high); `paired`: the per-seed difference from the reference variant over the seeds both have, its mean, 95% "
    "t-interval and two-sided paired t-test p (namc.experiment.stats). Test scores x100; rounded as printed",
    "reference": study.reference,
    "metrics": study.metrics,
    "variants": variants,
}
dest = Path("benchmarks/results") / args.folder / f"{name}.json"
dest.parent.mkdir(parents=True, exist_ok=True)
dest.write_text(json.dumps(stored, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
print(dest, seeds)
