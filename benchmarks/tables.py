"""The tables of figures in README.md and docs/, rendered from the stored reports in benchmarks/results.

    python benchmarks/tables.py          # rewrite every table between its markers
    python benchmarks/tables.py --check  # exit 1, naming the tables, where a committed table is not its rendering

A table lives between ``<!-- generated: NAME -->`` and ``<!-- /generated: NAME -->``; only the text between the two
markers is replaced, so the prose around a table is written by hand. Each results folder is named by the machine
class and what was measured; its README.md, where it has one, says how the files were made.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import statistics
import sys
import textwrap
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from namc.experiment.stats import Paired, Summary

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

XEON_AMX = "2 cores of an Intel Xeon with AMX"
CPU_PRECISIONS = RESULTS / "xeon-amx-precisions"  # runN_{precision}_b{batch}.json
CPU_PEERS = RESULTS / "xeon-amx-peer-precision"  # runN_int8_b{batch}_peer_{precision}.json
CPU_QUALITY = RESULTS / "xeon-amx-quality-w128"  # quality_w128_seed{seed}.json.gz
DEMO = RESULTS / "xeon-amx-demo-seeds" / "demo_seeds.json"
CURATION = RESULTS / "xeon-curation" / "curation.json"
PRESETS = RESULTS / "presets-parameters" / "parameters.json"  # written by --count-parameters
THRESHOLDS = RESULTS / "cpus-thresholds" / "thresholds.json"  # the measurements behind namc/thresholds.py
DEMO_MODEL = {"dim": 32, "heads": 2}  # the width `namc demo` trains namc_tiny at (namc.lit.demo.settings)
GPU = RESULTS / "h100-namc_base-vs-clip4idc"  # what benchmarks/gpu.sh writes
EPYC_AVX2 = "2 cores of an AMD EPYC with AVX2 (no AVX-512, VNNI or AMX)"
BACKENDS_SPEED = RESULTS / "epyc-avx2-backends"  # runN.json, benchmarks/bench_backends.py --out
INT8_DECODER = RESULTS / "epyc-avx2-int8-decoder"  # runN.json, bench_backends.py --runs ... cpu+onnxruntime:int8
BACKENDS_PEER = RESULTS / "epyc-avx2-backends-peer" / "report.json"  # namc benchmark --backend ... --reference clip4idc
BACKENDS_QUALITY = RESULTS / "epyc-avx2-backend-quality" / "demo_seed0.json"  # benchmarks/bench_backend_quality.py
GPU_CAPTIONS = RESULTS / "h100-caption-agreement"
STUDIES = RESULTS / "xeon-shapes-studies"  # {study}.json: a study's aggregated figures as printed, with its settings
EPYC_STUDIES = RESULTS / "epyc-avx2-shapes-studies"  # likewise, the studies measured on the AMD EPYC machines
LMM_SHAPES = RESULTS / "epyc-avx2-shapes-lmm" / "report.json"  # what `namc eval lmm` wrote on the demo's test split
IMGDIFF_SHAPES = RESULTS / "epyc-avx2-imgdiff-shapes" / "run1.json"  # benchmarks/bench_imgdiff_shapes.py --out
MED_SHAPES = RESULTS / "epyc-avx2-med-shapes" / "report.json"  # benchmarks/bench_med_shapes.py --out

RUNS = (1, 2)
CPU_BATCHES = (1, 32)
SPEED_GPU_BATCHES = (1, 64, 1024)  # the headline table's GPU rows: the ends of the range and its middle
CPU_ROWS = {  # a CPU table's row -> (batch size, mode)
    "decode only (from the MIR output), batch 1": (1, "decode"),
    "end to end from pixels, batch 1": (1, "e2e"),
    "decode only, batch 32": (32, "decode"),
    "end to end from pixels, batch 32": (32, "e2e"),
}
QUALITY_ROWS = {  # the quality table's row -> (the results file's precision, what runs in that precision)
    "fp32": ("fp32", "everything"),
    "bf16 as it runs": ("bf16", "the grid and MIR: FDG's largest layer matrix (65,536 entries) is under 2^17"),
    "int8 as it runs": ("int8", "the grid in static int8, MIR in bf16, FDG's matrices in int8"),
    "int8 with MIR in int8, as a CPU without AMX runs it": (
        "int8_noamx",
        "the grid in static int8, MIR's and FDG's matrices in int8",
    ),
}
DEMO_SYSTEMS = {
    "namc": "namc (pre-trained + fine-tuned)",
    "no_pretraining": "same model, no pre-training",
    "frequent_caption": "most frequent training caption",
}
GB = 1e9


@cache
def load(path: Path) -> dict:
    """A stored JSON report or results file (``.json`` or ``.json.gz``)."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    return json.loads(path.read_text(encoding="utf-8"))


def cpu_precision_report(run: int, batch: int, precision: str) -> dict:
    """One AMX Xeon report of namc_base at ``precision`` against the peer at the same precision."""
    report = load(CPU_PRECISIONS / f"run{run}_{precision}_b{batch}.json")
    if report["settings"]["precision"] != precision or report["settings"]["batch_sizes"] != [batch]:
        raise ValueError(f"{CPU_PRECISIONS.name}/run{run}_{precision}_b{batch}.json: other settings than its name")
    return report


def cpu_peer_report(run: int, batch: int, peer_precision: str) -> dict:
    """One AMX Xeon report of namc_base in int8 against the peer at ``peer_precision``."""
    name = f"run{run}_int8_b{batch}_peer_{peer_precision}.json"
    report = load(CPU_PEERS / name)
    settings = report["settings"]
    if (settings["precision"], settings["reference_precision"], settings["batch_sizes"]) != (
        "int8",
        peer_precision,
        [batch],
    ):
        raise ValueError(f"{CPU_PEERS.name}/{name}: other settings than its name")
    return report


def entry(report: dict, mode: str) -> dict:
    """namc's inference entry of ``mode`` (decode, e2e) in a one-batch-size report."""
    return next(e for e in report["inference"] if e["mode"] == mode)


def peer_entry(report: dict, mode: str, batch: int | None = None) -> dict:
    """The peer's entry compared with namc's ``mode``, at ``batch`` where the report has several."""
    return next(
        e
        for e in report["reference"]
        if e["mode"] == f"clip4idc_{mode}" and (batch is None or e["batch_size"] == batch)
    )


def cpu_cell(report: dict, mode: str) -> str:
    """namc's median tokens/s (its speed-up over the peer) in one run."""
    return f"{entry(report, mode)['tokens_per_s']['median']:.1f} ({peer_entry(report, mode)['speedup']:.2f}x)"


def markdown(header: list[str], rows: list[list[str]], compact: bool = False) -> str:
    """A markdown table; ``compact``: the rule row as ``namc experiment report`` writes it (``|---|---|``)."""
    rule = "|" + "|".join("---" for _ in header) + "|" if compact else "| " + " | ".join("---" for _ in header) + " |"
    lines = ["| " + " | ".join(header) + " |", rule]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


# ----------------------------------------------------------------------------------------------- reproducing commands


def benchmark_command(report: dict) -> str:
    """The ``namc benchmark`` command line whose settings a report records (``--output`` left out)."""
    from namc.eval.throughput.cli import build_parser

    parser = build_parser()
    defaults = vars(parser.parse_args([]))
    words = ["namc benchmark"]
    for action in parser._actions:
        dest, value = action.dest, report["settings"].get(action.dest)
        default = defaults.get(dest)
        if dest not in report["settings"] or value == (list(default) if isinstance(default, tuple) else default):
            continue
        flag = action.option_strings[-1]
        if isinstance(value, bool):
            words.append(flag)
        else:
            words.append(f"{flag} {' '.join(map(str, value)) if isinstance(value, list) else value}")
    if report["machine"]["env"].get("OMP_WAIT_POLICY"):
        words.append(f"--omp-wait-policy {report['machine']['env']['OMP_WAIT_POLICY'].lower()}")
    if report["machine"].get("allocator", {}).get("reuse_freed_memory"):
        words.append("--allocator reuse")
    return " ".join(words)


def commands(reports: list[dict]) -> str:
    """A fenced block of the distinct commands behind ``reports``, in order."""
    lines = list(dict.fromkeys(benchmark_command(r) for r in reports))
    return "```bash\n" + "\n".join(lines) + "\n```"


# --------------------------------------------------------------------------------------------------------- the tables


def fastest_peer_precision(batch: int) -> str:
    """The precision in which the peer runs faster on the AMX Xeon at ``batch``: the higher median tokens/s in both
    modes, over both runs (an error where the two modes disagree)."""
    faster = set()
    for mode in ("decode", "e2e"):
        rate = {
            p: statistics.mean(
                peer_entry(cpu_peer_report(run, batch, p), mode)["tokens_per_s"]["median"] for run in RUNS
            )
            for p in ("int8", "bf16")
        }
        faster.add(max(rate, key=rate.get))
    if len(faster) != 1:
        raise ValueError(f"the peer is fastest in {sorted(faster)} at batch {batch}, depending on the mode")
    return faster.pop()


def gpu_reports(run: int) -> list[dict]:
    return [load(GPU / f"run{run}_{part}.json") for part in ("small", "large")]


def gpu_figures(run: int) -> dict[tuple[int, str], tuple[float, float | None]]:
    """(batch, mode) -> (tokens/s median, the speed-up over namc where a peer entry) of one GPU run."""
    rows = [e for r in gpu_reports(run) for e in r["inference"] + r["reference"]]
    return {(e["batch_size"], e["mode"]): (e["tokens_per_s"]["median"], e.get("speedup")) for e in rows}


def gpu_batches() -> list[int]:
    return sorted({b for r in gpu_reports(1) for b in r["settings"]["batch_sizes"]})


def speedup(value: float) -> str:
    return f"{value:.2f}x"


def speed() -> str:
    """README: namc_base at its fastest precision against the peer at its fastest, on one CPU and one GPU."""
    rows = []
    for batch in CPU_BATCHES:
        peer = fastest_peer_precision(batch)
        reports = [cpu_peer_report(run, batch, peer) for run in RUNS]
        cells = [" / ".join(cpu_cell(r, mode) for r in reports) for mode in ("decode", "e2e")]
        rows.append([f"{XEON_AMX}, batch {batch}", f"int8 / {peer}", *cells])
    gpu = gpu_reports(1)[0]
    name, dtype = gpu["machine"]["gpu"]["name"], {"bfloat16": "bf16", "float32": "fp32"}[gpu["settings"]["dtype"]]
    runs = [gpu_figures(run) for run in RUNS]
    for batch in (b for b in gpu_batches() if b in SPEED_GPU_BATCHES):
        cells = [
            " / ".join(f"{run[batch, m][0]:,.0f} ({speedup(run[batch, f'clip4idc_{m}'][1])})" for run in runs)
            for m in ("decode", "e2e")
        ]
        rows.append([f"one {name}, batch {batch}", f"{dtype} / {dtype}", *cells])
    header = [
        "where, batch",
        "precision: namc_base / peer",
        "decode only: namc_base tokens/s (speed-up), run 1 / run 2",
        "end to end: namc_base tokens/s (speed-up), run 1 / run 2",
    ]
    return markdown(header, rows)


def demo() -> str:
    """README: the demo over five seeds, mean ± sample sd."""
    results = load(DEMO)
    per_seed, measured = results["per_seed"], results["mean_and_sd"]

    def mean_sd(system: str, metric: str, digits: int) -> str:
        if metric in measured.get(system, {}):
            mean, sd = measured[system][metric]
        elif metric in per_seed[system]:
            values = per_seed[system][metric]
            mean, sd = statistics.mean(values), statistics.stdev(values)
        else:
            return ""
        return f"{mean:.{digits}f} ± {sd:.{digits}f}"

    rows = [
        [
            label,
            mean_sd(system, "CIDEr-D", 2),
            mean_sd(system, "BLEU-4", 2),
            ", ".join(f"{v:.2f}" for v in per_seed[system]["CIDEr-D"]),
        ]
        for system, label in DEMO_SYSTEMS.items()
    ]
    gain = [a - b for a, b in zip(per_seed["namc"]["CIDEr-D"], per_seed["no_pretraining"]["CIDEr-D"], strict=True)]
    rows.append(
        [
            "pre-training's gain, paired by seed",
            f"{statistics.mean(gain):+.2f} ± {statistics.stdev(gain):.2f}",
            "",
            ", ".join(f"{v:+.2f}" for v in gain),
        ]
    )
    seeds = results["seeds"]
    header = ["system", "CIDEr-D", "BLEU-4", f"CIDEr-D, seeds {seeds[0]} to {seeds[-1]}"]
    auroc = ", ".join(f"{v:.3f}" for v in per_seed["namc"]["noise_auroc"])
    settings = f"`{results['command']}` for N = {seeds[0]}-{seeds[-1]}, {results['machine']}"
    auroc = f"NIM's held-out noise AUROC: {mean_sd('namc', 'noise_auroc', 3)} ({auroc})"
    return f"{markdown(header, rows)}\n\n{textwrap.fill(f'{auroc}. {settings}.', 120, break_on_hyphens=False)}"


def _cpu_table(corner: str, columns: dict[str, Callable[[int, int], dict]], efficiency: bool) -> str:
    rows = []
    for label, (batch, mode) in CPU_ROWS.items():
        rows.append([label, *(" / ".join(cpu_cell(c(run, batch), mode) for run in RUNS) for c in columns.values())])
    if efficiency:
        cells = []
        for report_of in columns.values():
            shown = []
            for run in RUNS:
                report = report_of(run, 32)
                shown.append(
                    f"{100 * entry(report, 'decode')['flops']['efficiency']:.0f}% of "
                    f"{report['matmul']['flops_per_s'] / 1e9:.0f}"
                )
            cells.append(" / ".join(shown) + " GFLOP/s")
        rows.append(["decode at batch 32 vs the 1024^3 GEMM of that precision", *cells])
    reports = [c(run, batch) for c in columns.values() for batch in CPU_BATCHES for run in RUNS[:1]]
    return markdown([corner, *columns], rows) + "\n\n" + commands(reports)


def cpu_precisions() -> str:
    """performance.md: namc_base in bf16 and int8 against the peer converted the same way, on the AMX Xeon (the fp32
    reports stored beside them were taken on a hand-written fp32 path namc no longer has)."""
    columns = {p: (lambda run, batch, p=p: cpu_precision_report(run, batch, p)) for p in ("bf16", "int8")}
    corner = f"namc_base tokens/s (speed-up over the CLIP4IDC peer), {XEON_AMX}, run 1 / run 2"
    return _cpu_table(corner, columns, efficiency=True)


def cpu_peer_precision() -> str:
    """performance.md: namc_base in int8 against the peer in int8 and in bf16 (``--reference-precision``)."""
    columns = {f"peer in {p}": (lambda run, batch, p=p: cpu_peer_report(run, batch, p)) for p in ("int8", "bf16")}
    corner = f"namc_base int8 tokens/s (speed-up over the CLIP4IDC peer), {XEON_AMX}, run 1 / run 2"
    return _cpu_table(corner, columns, efficiency=False)


def gpu() -> str:
    """performance.md: namc_base in bf16 against the peer on one GPU, every stored batch size, with peak memory."""
    runs = [gpu_figures(run) for run in RUNS]
    memory: dict[int, set[str]] = {}  # batch -> peak memory end to end, as shown, over the runs
    for e in (e for run in RUNS for r in gpu_reports(run) for e in r["inference"] if e["mode"] == "e2e"):
        memory.setdefault(e["batch_size"], set()).add(f"{e['peak_memory']['peak_bytes'] / GB:.1f} GB")
    rows = []
    for batch in gpu_batches():
        row = [str(batch)]
        for mode in ("decode", "e2e"):
            row.append(" / ".join(f"{run[batch, mode][0]:,.0f}" for run in runs))
        row.append(" / ".join(sorted(memory[batch])))
        for mode in ("clip4idc_decode", "clip4idc_e2e"):
            row.append(" / ".join(f"{run[batch, mode][0]:,.0f}" for run in runs))
        for mode in ("clip4idc_decode", "clip4idc_e2e"):
            row.append(" / ".join(speedup(run[batch, mode][1]) for run in runs))
        rows.append(row)
    header = [
        "batch",
        "decode tokens/s",
        "end to end tokens/s",
        "peak memory, e2e",
        "peer decode",
        "peer e2e",
        "decode speed-up",
        "e2e speed-up",
    ]
    return markdown(header, rows) + "\n\n" + commands(gpu_reports(1))


def gpu_training() -> str:
    """performance.md: pre-training steps per second on one GPU."""
    rows = []
    groups = [[load(GPU / f"run{run}_train.json") for run in RUNS], [load(GPU / "train128.json")]]
    for reports in groups:
        batch = reports[0]["training"]["batch_size"]
        pairs = [r["training"]["pairs_per_s"] for r in reports]
        estimates = [r["training"]["pretrain_estimate"] for r in reports]
        memory = {f"{r['training']['peak_memory']['peak_bytes'] / GB:.1f} GB" for r in reports}
        rows.append(
            [
                str(batch),
                ", ".join(f"{p['median']:.1f} [{p['min']:.1f}-{p['max']:.1f}]" for p in pairs),
                " / ".join(sorted(memory)),
                ", ".join(f"{e['hours']:.1f} h" for e in estimates),
                ", ".join(f"{e['hours_on_devices']:.1f} h" for e in estimates),
            ]
        )
    e = groups[0][0]["training"]["pretrain_estimate"]
    header = [
        "pairs per GPU",
        "pairs/s, median [min-max], per run",
        "peak memory",
        f"{e['pairs'] // 1000}K pairs x {e['epochs']} epochs, one GPU",
        f"on {e['devices']} at linear scaling",
    ]
    return markdown(header, rows) + "\n\n" + commands([g[0] for g in groups])


def gpu_static_decode() -> str:
    """performance.md: StaticDecoder's CUDA graphs against FDG.generate's eager loop, one process each."""
    static, eager = load(GPU / "static.json"), load(GPU / "eager.json")
    rows = []
    for batch in static["settings"]["batch_sizes"]:
        rate = {
            (name, mode): next(
                e["tokens_per_s"]["median"] for e in r["inference"] if (e["batch_size"], e["mode"]) == (batch, mode)
            )
            for name, r in (("static", static), ("eager", eager))
            for mode in ("decode", "e2e")
        }
        rows.append(
            [
                str(batch),
                f"{rate['static', 'decode']:,.0f} / {rate['eager', 'decode']:,.0f}",
                speedup(rate["static", "decode"] / rate["eager", "decode"]),
                f"{rate['static', 'e2e']:,.0f} / {rate['eager', 'e2e']:,.0f}",
            ]
        )
    header = ["batch", "decode tokens/s, CUDA graphs / eager", "speed-up", "end to end tokens/s, CUDA graphs / eager"]
    return markdown(header, rows) + "\n\n" + commands([static, eager])


def gpu_captions() -> str:
    """performance.md: a trained namc_tiny's captions on the GPU against the CPU's."""
    scores = load(GPU_CAPTIONS / "scores.json")
    cpu = load(GPU_CAPTIONS / "describe_cpu_fp32.json")
    rows = []
    for name, run in scores["runs"].items():
        captions = load(GPU_CAPTIONS / f"describe_{name}.json")
        if set(captions) != set(cpu):
            raise ValueError(f"describe_{name}.json: not the pairs of describe_cpu_fp32.json")
        same = sum(captions[k] == cpu[k] for k in cpu)
        share = (
            "-"
            if name == "cpu_fp32"
            else f"{same} of {len(cpu)}" + ("" if same == len(cpu) else f" ({100 * same / len(cpu):.1f}%)")
        )
        label = f"{run['device'].upper() if run['device'] == 'cpu' else 'CUDA'} {run['precision']}"
        rows.append([label, share, f"{run['CIDEr-D']:.2f}", f"{run['BLEU-4']:.2f}", f"{run['pairs_per_s']:.0f}"])
    header = ["device, precision", "identical to CPU fp32", "CIDEr-D", "BLEU-4", "pairs/s (the whole list)"]
    return markdown(header, rows)


def quality_seeds() -> list[dict]:
    packs = [load(CPU_QUALITY / f"quality_w128_seed{seed}.json.gz") for seed in (0, 1, 2)]
    if [p["seed"] for p in packs] != [0, 1, 2]:
        raise ValueError(f"{CPU_QUALITY.name}: a file holds another seed than its name")
    return packs


def identical_share(pack: dict, precision: str) -> float:
    """The share of ``precision``'s captions identical to fp32's in one seed's pack."""
    return sum(a == b for a, b in zip(pack["predictions"][precision], pack["predictions"]["fp32"], strict=True)) / len(
        pack["ids"]
    )


def quality_w128() -> str:
    """performance.md: CIDEr-D and captions identical to fp32's at each precision, three width-128 models."""
    packs = quality_seeds()
    rows = []
    for label, (precision, what) in QUALITY_ROWS.items():
        scores = [p["scores"][precision]["CIDEr-D"] for p in packs]
        row = [label, what, " / ".join(f"{s:.2f}" for s in scores)]
        if precision == "fp32":
            rows.append([*row, "", "100%", ""])
            continue
        delta = [s - p["scores"]["fp32"]["CIDEr-D"] for s, p in zip(scores, packs, strict=True)]
        same = [100 * identical_share(p, precision) for p in packs]
        row.append(f"{statistics.mean(delta):+.2f} ± {statistics.stdev(delta):.2f}")
        row.append(" / ".join(f"{s:.1f}%" for s in same))
        row.append(f"{statistics.mean(same):.1f} ± {statistics.stdev(same):.1f}%")
        rows.append(row)
    header = [
        "width 128, Xeon with AMX",
        "what runs in that precision",
        "CIDEr-D, seeds 0 / 1 / 2",
        "change vs fp32, mean ± sd",
        "captions identical to fp32, seeds 0 / 1 / 2",
        "mean ± sd",
    ]
    return markdown(header, rows)


def count_parameters() -> dict:
    """Every registered preset's parameter counts (``NAMC.num_parameters``, built on the meta device) and the first
    paragraph of its docstring: what ``--count-parameters`` stores for the models table."""
    import torch

    import namc
    from namc.models.registry import _PRESETS

    presets = {}
    for name in namc.list_models():
        with torch.device("meta"):  # shapes only: no memory, no initialisation
            counts = namc.create_model(name).num_parameters()
        about = " ".join(_PRESETS[name].__doc__.split("\n\n")[0].split())
        presets[name] = {"about": about, **counts}
    with torch.device("meta"):
        demo_counts = namc.create_model("namc_tiny", **DEMO_MODEL).num_parameters()
    return {
        "demo_model": {"preset": "namc_tiny", "overrides": DEMO_MODEL, **demo_counts},
        "what": "parameter counts of the registered presets, as NAMC.num_parameters counts them",
        "presets": presets,
    }


PARTS = {  # a row of the parts table -> (when it runs, how its count comes from NAMC.num_parameters)
    "NIM: CLIP dual encoder": ("pre-training", lambda c: c["nim"]),
    "VQGAN encoder and codebook (MIR's targets)": ("pre-training", lambda c: c["vqgan"]),
    "ResNet grid": ("always", lambda c: c["grid"]),
    "MIR": ("always", lambda c: c["mir"] - c["mir_pretrain_heads"]),
    "MIR's reconstruction head and text projection": ("pre-training", lambda c: c["mir_pretrain_heads"]),
    "FDG": ("always", lambda c: c["fdg"]),
    "of which FDG's tied token embedding and positions": ("always", lambda c: c["fdg_embeddings"]),
    "**at inference** (grid + MIR + FDG)": ("", lambda c: c["inference"]),
    "**in pre-training** (everything)": ("", lambda c: c["total"]),
}


def preset_parts() -> str:
    """architecture.md: every preset's parameters by part, and the demo's model."""
    stored = load(PRESETS)
    columns = {f"`{name}`": counts for name, counts in stored["presets"].items()}
    demo = stored["demo_model"]
    overrides = ", ".join(f"{k}={v}" for k, v in demo["overrides"].items())
    columns[f"the demo's model (`{demo['preset']}`, {overrides})"] = demo

    def size(n: int) -> str:
        return f"{n / 1e6:.2f}M" if n >= 10_000 else f"{n / 1e3:.1f}K"

    rows = [[part, runs, *(size(count(c)) for c in columns.values())] for part, (runs, count) in PARTS.items()]
    return markdown(["part", "runs at", *columns], rows)


def models() -> str:
    """README: the presets, what each is, and their parameter counts."""
    rows = []
    for name, preset in load(PRESETS)["presets"].items():
        about = re.sub(r":\w+:`~?(?:[\w.]+\.)?(\w+)`", r"`\1`", preset["about"]).replace("``", "`")
        rows.append([f"`{name}`", f"{preset['inference'] / 1e6:.1f}M", f"{preset['total'] / 1e6:.1f}M", about])
    return markdown(["model", "parameters at inference", "with the pre-training parts", "what it is"], rows)


def parameters() -> str:
    """performance.md: namc_base's and the peer's parameter counts, as a benchmark report counts them."""
    report = cpu_precision_report(1, 1, "int8")
    p, paper, peer = report["model"]["parameters"], report["model"]["parameters_paper_style"], report["peer"]

    def m(n: int) -> str:
        return f"{n / 1e6:.1f}M"

    mir = p["mir"] - p["mir_pretrain_heads"]
    rows = [
        [
            "namc_base",
            m(p["inference"]),
            f"ResNet-101 grid to layer3 {m(p['grid'])}, MIR {m(mir)}, FDG {m(p['fdg'])} (of which the tied "
            f"{report['model']['vocab_size']:,} x {report['model']['dim']} BPE embedding / vocabulary projection "
            f"{paper['vocab_embedding'] / 1e6:.2f}M)",
            f"{m(p['total'])} (with NIM's CLIP {m(p['nim'])}, the VQGAN {m(p['vqgan'])}, MIR's pre-training heads "
            f"{m(p['mir_pretrain_heads'])})",
            f"{m(paper['paper'])}; namc_base without the BPE embedding {m(paper['inference_without_vocab_embedding'])}",
        ],
        [
            "CLIP4IDC peer",
            m(peer["parameters"]["inference"]),
            "CLIP ViT-B/32 image tower, cross encoder, decoder",
            f"{m(peer['parameters']['total'])} (with CLIP's text tower)",
            m(peer["paper_parameters"]),
        ],
    ]
    return markdown(["model", "run at inference", "of which", "total", "the paper's Table 5"], rows)


def curation() -> str:
    """performance.md: the curation steps' throughput on a CPU."""
    results = load(CURATION)
    rows = [[r["step"], r["figure"], f"`{r['command']}`"] for r in results["rows"]]
    return markdown(["step", "figure", "measured with"], rows) + f"\n\nOn {results['machine']}."


# -------------------------------------------------------------------------------------------------------- the studies


def study(name: str) -> dict:
    """A study's stored figures (``xeon-shapes-studies/{name}.json``)."""
    return load(STUDIES / f"{name}.json")


def summary_of(stored: dict) -> Summary:
    """A stored summary as :class:`namc.experiment.stats.Summary`; a figure not stored is nan."""
    from namc.experiment.stats import Summary

    return Summary(stored["n"], *(stored.get(k, math.nan) for k in ("mean", "sd", "low", "high")))


def paired_of(stored: dict) -> Paired:
    """A stored paired difference (n, mean, low, high, p) as :class:`namc.experiment.stats.Paired`."""
    from namc.experiment.stats import Paired

    return Paired(stored["n"], summary_of(stored), math.nan, stored.get("p", math.nan))


def mean_sd(s: Summary, digits: int = 2) -> str:
    """``mean ± sd`` in the study report's number format; the mean alone where there is no sd (one run, or none
    stored)."""
    from namc.experiment.report import _fmt

    return f"{_fmt(s.mean, digits)} ± {_fmt(s.sd, digits)}" if math.isfinite(s.sd) else _fmt(s.mean, digits)


def difference(p: Paired, digits: int, p_digits: int = 3, signed: bool = False) -> str:
    """A paired difference as the study report writes it (its ``_diff``) at ``digits`` decimals: the signed mean,
    its 95% t-interval (``signed``: the bounds signed too) and the paired t-test p."""
    from namc.experiment.report import _fmt

    d, sign = p.diff, "+" if signed else ""
    return f"{d.mean:+.{digits}f} [{d.low:{sign}.{digits}f}, {d.high:{sign}.{digits}f}], p={_fmt(p.p, p_digits)}"


def study_summaries(stored: dict) -> str:
    """experiments.md: a study's mean ± sd [95% t-interval] per variant and metric, as its report.md has it."""
    from namc.experiment.report import _cell

    rows = []
    for variant, figures in stored["variants"].items():
        summaries = [summary_of(figures[m]["summary"]) for m in stored["metrics"]]
        rows.append([variant, str(max(s.n for s in summaries)), *map(_cell, summaries)])
    return markdown(["variant", "n", *stored["metrics"]], rows, compact=True)


def study_paired(stored: dict) -> str:
    """experiments.md: each variant's paired difference from the study's reference, as its report.md has it."""
    from namc.experiment.report import _diff

    rows = [
        [variant, *(_diff(paired_of(figures[m]["paired"])) for m in stored["metrics"])]
        for variant, figures in stored["variants"].items()
        if variant != stored["reference"]
    ]
    return markdown(["variant", *stored["metrics"]], rows, compact=True)


def study_shifts(stored: dict) -> str:
    """experiments.md: Table 10's NAMC against the model pre-trained without NIM and MIR, shift by shift."""
    comparison, variants = stored["namc_minus_no_nim_mir"], stored["variants"]
    metric, rows = comparison["metric"], []
    for shift, diff in comparison["shifts"].items():
        arms = [variants[f"{arm}_{shift}"] for arm in ("namc", "no_nim_mir")]
        scores = [mean_sd(summary_of(a[metric]["summary"])) for a in arms]
        distinct = " / ".join(f"{a['test/distinct_captions']['summary']['mean']:.1f}" for a in arms)
        rows.append([shift, *scores, difference(paired_of(diff), 1), distinct])
    header = [
        "shift",
        f"NAMC {metric.removeprefix('test/')}",
        "w/o NIM and MIR",
        "NAMC minus w/o, paired over seeds [95% t-interval], p",
        "distinct captions NAMC / w/o",
    ]
    return markdown(header, rows, compact=True)


def study_masking(stored: dict) -> str:
    """experiments.md: Figure 3's noise against random masking at each text and image masking ratio."""
    rows = []
    for key, diffs in stored["noise_minus_random"].items():  # key: pt0.05 (p_T = 0.05, p_I = 0), pi0.05 likewise
        arms = [stored["variants"][f"{arm}_{key}"] for arm in ("noise", "random")]
        row = [{"pt": "text (p_T)", "pi": "image (p_I)"}[key[:2]], f"{float(key[2:]):.2f}"]
        for metric, digits in (("test/CIDEr-D", 2), ("pretrain/noise_auroc", 3)):
            means = [summary_of(a[metric]["summary"]) for a in arms]
            row += [mean_sd(s, digits) for s in means]
            p = paired_of(diffs[metric])
            # p as the study printed it: two decimals, three below 0.1
            row.append(difference(p, digits, p_digits=2 if p.p >= 0.1 else 3, signed=True))
        rows.append(row)
    header = ["masked", "ratio", "CIDEr-D, noise", "CIDEr-D, random", "noise - random"]
    return markdown([*header, "AUROC noise", "AUROC random", "noise - random"], rows, compact=True)


def preference(part: str, scores: str) -> str:
    """experiments.md: minimal-pair accuracy per category (``scores="minimal_pairs"``, under the chance of each) or
    CIDEr-D per change type (``"CIDEr-D"``) of the fine-tuned, DPO and ADPO models, mean ± sd over the runs."""
    stored = study("preference")
    models = stored[part]["models"]
    columns = list(next(iter(models.values()))[scores])
    rows = [["chance", "", *(f"{c:.1f}" for c in stored["chance"].values())]] if scores == "minimal_pairs" else []
    for name, model in models.items():
        runs = model["runs"]
        rows.append([name, str(runs), *(mean_sd(summary_of({"n": runs, **model[scores][c]}), 1) for c in columns)])
    header = ["model", "runs", *("CIDEr-D" if c == "all" else c for c in columns)]
    return markdown(header, rows, compact=True)


def backend_speed(folder: Path = BACKENDS_SPEED) -> str:
    """performance.md: namc_base through namc.compile on every backend x precision, each run's median tokens/s and
    its time against the first run's, interleaved in one process (bench_backends.py; its reports in ``folder``)."""
    reports = [load(path) for path in sorted(folder.glob("run*.json"))]
    first = reports[0]
    n = first["max_new_tokens"]
    rows = []
    for i, entry in enumerate(first["runs"]):
        batch, name = entry["batch"], entry["run"]
        cells = []
        for part in ("e2e", "decode"):
            figures = []
            for report in reports:
                mine = report["runs"][i]
                base = next(r for r in report["runs"] if r["batch"] == batch)  # the first run of this batch
                med, ref = statistics.median(mine["seconds"][part]), statistics.median(base["seconds"][part])
                figures.append(f"{batch * n / med:,.0f} ({med / ref:.2f}x)")
            cells.append(" / ".join(figures))
        same = all(report["runs"][i]["ids_equal_first"] for report in reports)
        rows.append([str(batch), name, *cells, "yes" if same else "no"])
    runs = " / ".join(f"run {k + 1}" for k in range(len(reports)))
    header = [
        "batch",
        "backend, precision",
        f"end to end: tokens/s (time vs first), {runs}",
        f"decoding: tokens/s (time vs first), {runs}",
        "ids = first's",
    ]
    return markdown(header, rows) + f"\n\n{first['model']}, random weights, {first['threads']} threads on {EPYC_AVX2}."


def backend_peer() -> str:
    """performance.md: namc_base through every backend x precision beside the CLIP4IDC peer, from one
    ``namc benchmark --backend`` report: median tokens/s and the speed-up over the peer's interleaved calls."""
    report = load(BACKENDS_PEER)
    rows = []
    for batch in report["settings"]["batch_sizes"]:
        for run in report["settings"]["backends"]:
            backend, precision = run.split(":")
            cells = []
            for mode in ("decode", "e2e"):
                mine = next(
                    e
                    for e in report["inference"]
                    if (e["batch_size"], e["mode"], e["backend"], e["precision"]) == (batch, mode, backend, precision)
                )
                peer = next(
                    e
                    for e in report["reference"]
                    if (e["batch_size"], e["compared_with"], e["backend"], e["precision"])
                    == (batch, mode, backend, precision)
                )
                cells.append(f"{mine['tokens_per_s']['median']:,.1f} ({speedup(peer['speedup'])})")
            rows.append([str(batch), f"{backend} {precision}", *cells])
    header = ["batch", "backend, precision", "decoding tokens/s (vs peer)", "end to end tokens/s (vs peer)"]
    return markdown(header, rows) + "\n\n" + commands([report])


def backend_quality() -> str:
    """performance.md: the demo's fine-tuned model on its test split through every backend x precision: CIDEr-D,
    its difference to the first run's, and the share of identical captions (bench_backend_quality.py)."""
    report = load(BACKENDS_QUALITY)
    rows = [
        [
            f"{run['backend']}, {run['precision']}",
            f"{run['cider_d']:.2f}",
            f"{run['cider_d_vs_reference']:+.2f}",
            f"{run['identical_captions']:.1%}",
            "yes" if run["identical_ids"] else "no",
        ]
        for run in report["runs"]
    ]
    header = ["backend, precision", "CIDEr-D", "vs the first", "captions identical to the first's", "ids equal"]
    return markdown(header, rows) + f"\n\n{report['pairs']} test pairs, {report['threads']} threads on {EPYC_AVX2}."


def _stated_value(cell: str) -> int:
    """The first number a thresholds row states: ``2^15 entries`` -> 32768, ``16,384 elements`` -> 16384."""
    if power := re.search(r"2\^(\d+)", cell):
        return 2 ** int(power.group(1))
    return int(re.search(r"\d[\d,]*", cell).group().replace(",", ""))


def thresholds() -> str:
    """performance.md: each cut-off of namc/thresholds.py, what it chooses and the measurement that chose it; a
    value the code no longer has is an error (change a threshold with its new measurement)."""
    sys.path.insert(0, str(ROOT))
    from namc import thresholds as code  # imports nothing: no torch

    rows = []
    for row in load(THRESHOLDS)["thresholds"]:
        name = row["threshold"].strip("`")
        value = getattr(code, name, None)
        if isinstance(value, int) and value != _stated_value(row["value"]):
            raise ValueError(f"{THRESHOLDS.name}: {name} is {value} in namc/thresholds.py, {row['value']} measured")
        rows.append([row["threshold"], row["value"], row["chooses"], row["measured"]])
    return markdown(["threshold", "value", "what it chooses", "measured (EPYC AVX-512 unless marked)"], rows)


def measured_choices() -> str:
    """performance.md: the figures behind the choices in the code that are not a cut-off."""
    rows = [[row["choice"], row["measured"]] for row in load(THRESHOLDS)["choices"]]
    return markdown(["choice (where)", "measured"], rows)


def lmm_shapes() -> str:
    """comparison.md: ``namc eval lmm``'s systems and judge-free diagnostic on the shapes world's test split."""
    report = load(LMM_SHAPES)
    header = ["system", "CIDEr-D", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D on distractors", "requests", "tokens in/out"]
    rows = []
    for system in report["systems"].values():
        overall, distractors = system["scores"]["overall"], system["scores"]["per_type"]["no_change"]
        tokens = f"{system['prompt_tokens']:,} / {system['completion_tokens']:,}" if "prompt_tokens" in system else ""
        rows.append(
            [system["label"]]
            + [f"{overall[m]:.2f}" for m in ("CIDEr-D", "BLEU-4", "METEOR", "ROUGE-L")]
            + [f"{distractors['CIDEr-D']:.2f}", f"{system.get('requests', '')}", tokens]
        )
    for name, entry in report["diagnostic"].items():
        what = "constant" if name == "no_change" else "most frequent reference"
        rows.append(
            [
                f"{what} {entry['caption']!r}",
                f"{entry['CIDEr-D']:.2f}",
                "",
                "",
                "",
                f"{entry['per_type']['no_change']:.2f}",
            ]
            + ["", ""]
        )
    return markdown(header, rows)


IMGDIFF_STEPS = {  # a step of bench_imgdiff_shapes.py's report -> (what its items are, what it keeps)
    "replace": ("captions", lambda s: f"{s['kept']} pairs"),
    "regions": ("pairs", lambda s: f"{s['kept']} pairs ({s['boxes']['kept']} boxes)"),
    "region-captions": ("pairs", lambda s: f"{s['corpus']} corpus lines ({s['differences']} with a difference)"),
    "remove": ("images", lambda s: f"{s['questions']} questions"),
}
TOOL_SECONDS = {"segment": "segmentation", "similarity": "similarity", "filters": "filters"}  # stage_seconds keys


def _reasons(counts: dict[str, int]) -> str:
    """``{"same": 614, "duplicate": 166}`` -> ``same 614, duplicate 166`` (largest first); empty: none."""
    return ", ".join(f"`{k}` {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


def imgdiff_shapes() -> str:
    """edit-pairs.md: the Img-Diff steps on the shapes world (bench_imgdiff_shapes.py): items/s, where the time went,
    the rejections of pairs and of boxes by reason, and ``regions``' boxes against the known changed boxes."""
    report = load(IMGDIFF_SHAPES)
    rows = []
    for step, (unit, kept) in IMGDIFF_STEPS.items():
        s = report["stages"][step]
        times = []
        for name in ("generator", "inpainter"):
            if name in s:
                backend = s[name]
                times.append(f"{name} {backend['seconds']:.2f} ({backend['images_per_s']:.0f} images/s)")
        times += [
            f"{label} {s['stage_seconds'][k]:.2f}" for k, label in TOOL_SECONDS.items() if k in s["stage_seconds"]
        ]
        if "llm" in s:
            times.append(f"LLM {s['llm']['seconds']:.2f} ({s['llm']['ok']} answers)")
        boxes = dict(s["boxes"])
        candidates, kept_boxes = boxes.pop("candidates", None), boxes.pop("kept", None)
        box_cell = "" if kept_boxes is None else _reasons(boxes) + f"; {kept_boxes} kept"
        if candidates is not None:
            box_cell = f"{candidates} candidates: {box_cell}"
        rows.append(
            [
                f"`{step}`",
                f"{s['items']} {unit}",
                kept(s),
                f"{s['items_per_s']:.1f}",
                ", ".join(times),
                _reasons(s["rejected"]),
                box_cell,
            ]
        )
    header = [
        "step",
        "in",
        "kept",
        "items/s (wall, LLM included)",
        "seconds inside: backend, tools, LLM",
        "pairs rejected",
        "boxes rejected",
    ]
    truth, settings = report["regions_vs_truth"], report["settings"]
    lines = [
        f"`regions` against the known boxes: {truth['boxes_found']} boxes found, {truth['boxes_right']} right (IoU >= "
        f"0.5 with a changed object's box): precision {truth['precision']:.3f}; of the {truth['truth_boxes']} changed "
        f"boxes of the kept pairs, {truth['recall']:.3f} found.",
        f"{settings['captions']} shapes captions, {settings['image_size']} px images, seed {settings['seed']}, tools "
        f"`{settings['tools']}`; {EPYC_AVX2}.",
    ]
    if "pretrain" in report:
        fit = report["pretrain"]
        finite = "finite" if math.isfinite(fit["train_loss"]) else "not finite"
        lines.append(
            f"namc_tiny pre-trained on the {report['corpus_pairs']}-pair corpus: {fit['steps']} steps in "
            f"{fit['seconds']:.1f} s, loss {finite}."
        )
    return markdown(header, rows) + "\n\n" + textwrap.fill(" ".join(lines), 120, break_on_hyphens=False)


MED_STAGES = {  # a stage of bench_med_shapes.py's report -> its prompt or what it checks
    ("edit", "filter"): "Figure 7",
    ("edit", "instruction"): "Figure 8",
    ("edit", "edit"): "the editor, then the pair similarity",
    ("edit", "similarity"): "section 3.1",
    ("edit", "caption1"): "Figure 9",
    ("edit", "caption2"): "Figure 10",
    ("edit", "difference"): "Figure 11",
    ("edit", "judge"): "Figure 12",
    ("edit", "judge2"): "Figure 13",
    ("edit", "template"): "namc's template check",
    ("questions", "similarity"): "section 3.3",
    ("questions", "balance"): "per category",
    ("questions", "answer"): "Figure 16",
    ("questions", "distractors"): "Figure 17",
}


def med_shapes() -> str:
    """edit-pairs.md: MED's stages on the shapes world (bench_med_shapes.py): in, kept, rejected by reason and items/s
    per stage of ``namc curate edit`` and ``namc curate questions``, with the runs' totals."""
    report = load(MED_SHAPES)
    rows = []
    for (command, stage), label in MED_STAGES.items():
        s = report[command]["stages"][stage]
        rate = "" if s["items_per_s"] is None else f"{s['items_per_s']:.1f}"
        if "editor_images_per_s" in s:
            editor, similarity = s["editor_images_per_s"], s["similarity_pairs_per_s"]
            rate += f" (editor {editor:.0f} images/s, similarity {similarity:.0f} pairs/s)"
        rows.append(
            [f"`{command}`", f"`{stage}` ({label})", str(s["in"]), str(s["kept"]), _reasons(s["rejected"]), rate]
        )
    header = ["command", "stage", "in", "kept", "rejected", "items/s"]
    edit, questions, settings = report["edit"], report["questions"], report["settings"]
    lines = [
        f"`edit`: {edit['pairs']} pairs from {settings['images']} images in {edit['wall_seconds']:.1f} s of wall time "
        f"({edit['pairs_per_s']:.1f} pairs/s, every stage included); `questions`: {questions['questions']} questions "
        f"in {questions['wall_seconds']:.1f} s.",
        f"Pair similarity `{settings['similarity']}`, questions at similarity >= "
        f"{settings['question_min_similarity']}, concurrency {settings['concurrency']}, server latency "
        f"{settings['latency_s']:g} s; {EPYC_AVX2}.",
    ]
    if "fit" in report:
        fit = report["fit"]
        finite = "finite" if math.isfinite(fit["last_loss"]) else "not finite"
        lines.append(
            f"namc_tiny pre-trained on the manifest: {fit['steps']} steps in {fit['seconds']:.1f} s, loss {finite}."
        )
    if "choice" in report:
        overall = report["choice"]["overall"]
        lines.append(
            f"That model on the {overall['n']} questions (`namc eval choice --format med`): {overall['accuracy']:.1f}% "
            f"(chance {overall['chance']:.0f}%)."
        )
    return markdown(header, rows) + "\n\n" + textwrap.fill(" ".join(lines), 120, break_on_hyphens=False)


def med_shapes_categories() -> str:
    """edit-pairs.md: MED's 11 categories on the shapes world, one column each: the instructions written, the pairs
    kept, the questions."""
    report = load(MED_SHAPES)
    counts = {
        "instructions (Figure 8)": report["edit"]["instructed_categories"],
        "kept pairs": report["edit"]["categories"],
        "questions": report["questions"]["categories"],
    }
    names = list(report["edit"]["categories"])
    rows = [[what, *(str(c.get(name, 0)) for name in names), str(sum(c.values()))] for what, c in counts.items()]
    return markdown(["", *names, "all"], rows)


TABLES: dict[str, Callable[[], str]] = {
    "models": models,
    "speed": speed,
    "demo": demo,
    "cpu-precisions": cpu_precisions,
    "cpu-peer-precision": cpu_peer_precision,
    "quality-w128": quality_w128,
    "gpu": gpu,
    "gpu-static-decode": gpu_static_decode,
    "gpu-training": gpu_training,
    "gpu-captions": gpu_captions,
    "parameters": parameters,
    "curation": curation,
    "backend-speed": backend_speed,
    "int8-decoder": lambda: backend_speed(INT8_DECODER),
    "backend-peer": backend_peer,
    "backend-quality": backend_quality,
    "thresholds": thresholds,
    "measured-choices": measured_choices,
    "preset-parts": preset_parts,
    "study-table6": lambda: study_summaries(study("table6")),
    "study-table6-paired": lambda: study_paired(study("table6")),
    "study-table10": lambda: study_summaries(study("table10")),
    "study-table10-shifts": lambda: study_shifts(study("table10")),
    "study-figure3": lambda: study_masking(study("figure3")),
    "study-table11": lambda: study_summaries(load(EPYC_STUDIES / "table11.json")),
    "study-table11-paired": lambda: study_paired(load(EPYC_STUDIES / "table11.json")),
    "study-table12": lambda: study_summaries(load(EPYC_STUDIES / "table12.json")),
    "study-table12-paired": lambda: study_paired(load(EPYC_STUDIES / "table12.json")),
    "study-preference-one-model-choice": lambda: preference("one_model", "minimal_pairs"),
    "study-preference-one-model-cider": lambda: preference("one_model", "CIDEr-D"),
    "study-preference-demo-seeds-choice": lambda: preference("demo_seeds", "minimal_pairs"),
    "study-preference-demo-seeds-cider": lambda: preference("demo_seeds", "CIDEr-D"),
    "lmm-shapes": lmm_shapes,
    "imgdiff-shapes": imgdiff_shapes,
    "med-shapes": med_shapes,
    "med-shapes-categories": med_shapes_categories,
}
FILES = {  # which tables each file holds
    "README.md": ("models", "demo", "speed"),
    "docs/architecture.md": ("preset-parts",),
    "docs/comparison.md": ("lmm-shapes",),
    "docs/edit-pairs.md": ("imgdiff-shapes", "med-shapes", "med-shapes-categories"),
    "docs/experiments.md": (
        "study-table6",
        "study-table6-paired",
        "study-table10",
        "study-table10-shifts",
        "study-figure3",
        "study-table11",
        "study-table11-paired",
        "study-table12",
        "study-table12-paired",
        "study-preference-one-model-choice",
        "study-preference-one-model-cider",
        "study-preference-demo-seeds-choice",
        "study-preference-demo-seeds-cider",
    ),
    "docs/performance.md": (
        "speed",
        "cpu-precisions",
        "cpu-peer-precision",
        "quality-w128",
        "gpu",
        "gpu-static-decode",
        "gpu-training",
        "gpu-captions",
        "parameters",
        "curation",
        "backend-speed",
        "int8-decoder",
        "backend-peer",
        "backend-quality",
        "thresholds",
        "measured-choices",
    ),
}
BLOCK = re.compile(r"<!-- generated: ([\w-]+) -->\n(.*?)<!-- /generated: \1 -->", re.S)


def blocks(text: str) -> dict[str, str]:
    """NAME -> the text between a file's markers of that name."""
    return {m.group(1): m.group(2) for m in BLOCK.finditer(text)}


def cells(block: str) -> list[list[str]]:
    """The stripped cells of every row of the first table in a block, its header and rule rows included."""
    rows, started = [], False
    for line in block.splitlines():
        if line.startswith("|"):
            started = True
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif started:
            break
    return rows


def fill(text: str, names: tuple[str, ...], rendered: dict[str, str], where: str) -> str:
    """``text`` with the blocks ``names`` replaced by their renderings; an error names a missing or unknown block."""
    found = blocks(text)
    if missing := [n for n in names if n not in found]:
        raise ValueError(f"{where}: no <!-- generated: {missing[0]} --> ... <!-- /generated: {missing[0]} --> block")
    if unknown := [n for n in found if n not in names]:
        raise ValueError(f"{where}: a block this script does not render: {unknown[0]}")
    return BLOCK.sub(
        lambda m: f"<!-- generated: {m.group(1)} -->\n{rendered[m.group(1)]}\n<!-- /generated: {m.group(1)} -->",
        text,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a table is out of date")
    parser.add_argument(
        "--count-parameters", action="store_true", help=f"first count every preset's parameters into {PRESETS.name}"
    )
    args = parser.parse_args(argv)
    if args.count_parameters:
        PRESETS.parent.mkdir(parents=True, exist_ok=True)
        PRESETS.write_text(json.dumps(count_parameters(), indent=2) + "\n", encoding="utf-8")
        load.cache_clear()
    rendered = {name: render() for name, render in TABLES.items()}
    stale = []
    for where, names in FILES.items():
        path = ROOT / where
        text = path.read_text(encoding="utf-8")
        new = fill(text, names, rendered, where)
        if new != text:
            stale += [f"{where}: {n}" for n in names if blocks(new)[n] != blocks(text)[n]]
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if stale:
        print(("out of date: " if args.check else "rewrote: ") + "; ".join(stale), file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
