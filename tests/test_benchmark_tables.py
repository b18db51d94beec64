"""The tables of figures in README.md and docs/ (benchmarks/tables.py): the committed tables are what the stored
reports render to, and every cell is recomputed here from the reports and captions themselves, so a cell changed by
hand, a renderer that reads the wrong field and a report replaced without rendering all fail."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
from pathlib import Path

import pytest

from namc.eval.captions.cli import identical_captions
from namc.experiment.report import aggregate, format_report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
_spec = importlib.util.spec_from_file_location("benchmark_tables", ROOT / "benchmarks" / "tables.py")
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)


def _block(where: str, name: str) -> str:
    return tables.blocks((ROOT / where).read_text(encoding="utf-8"))[name]


def _table(where: str, name: str) -> list[list[str]]:
    """The cells of a committed generated table, its header row first, the rule row dropped."""
    rows = tables.cells(_block(where, name))
    assert set(rows[1]) == {"---"}, rows[1]
    return [rows[0], *rows[2:]]


def test_committed_tables_are_the_rendered_ones(capsys):
    # what `python benchmarks/tables.py --check` runs (exit status 1 and the tables' names where one is stale)
    assert tables.main(["--check"]) == 0, capsys.readouterr().err


def test_a_stale_or_missing_table_is_named(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rendered = {name: render() for name, render in tables.TABLES.items()}
    start = readme.index("<!-- generated: speed -->")
    stale = readme[:start] + readme[start:].replace("(3.18x)", "(3.19x)", 1)
    assert stale != readme
    assert tables.fill(stale, tables.FILES["README.md"], rendered, "README.md") == readme
    without = readme.replace("<!-- /generated: demo -->", "", 1)
    with pytest.raises(ValueError, match=r"README.md: no <!-- generated: demo --> \.\.\. <!-- /generated: demo -->"):
        tables.fill(without, tables.FILES["README.md"], rendered, "README.md")
    with pytest.raises(ValueError, match="a block this script does not render: demo"):
        tables.fill(readme, ("models", "speed"), rendered, "README.md")


@pytest.mark.slow
def test_stored_parameter_counts_are_the_presets():
    # the models table reads benchmarks/results/presets-parameters (python benchmarks/tables.py --count-parameters)
    assert json.loads(tables.PRESETS.read_text()) == tables.count_parameters()


# -------------------------------------------------------------------------------------------------------- a CPU

CPU_RUNS = RESULTS / "xeon-amx-precisions"
CPU_PEERS = RESULTS / "xeon-amx-peer-precision"
CPU_ROWS = {  # a CPU table's row -> (batch size, mode)
    "decode only (from the MIR output), batch 1": (1, "decode"),
    "end to end from pixels, batch 1": (1, "e2e"),
    "decode only, batch 32": (32, "decode"),
    "end to end from pixels, batch 32": (32, "e2e"),
}


def _tokens_and_speedup(report: dict, mode: str) -> str:
    """A CPU table's cell for one run: namc's median tokens/s (its speed-up over the peer)."""
    namc_ = next(e for e in report["inference"] if e["mode"] == mode)
    peer = next(e for e in report["reference"] if e["mode"] == f"clip4idc_{mode}")
    return f"{namc_['tokens_per_s']['median']:.1f} ({peer['speedup']:.2f}x)"


def _assert_cpu_table(table: list[list[str]], columns: tuple[str, ...], report_of) -> None:
    """Every cell of a CPU table, "tokens/s (speed-up) / ...", is the median and speed-up of the stored reports,
    run 1 / run 2: ``report_of(run, batch, column)`` loads one and checks its settings."""
    assert table[0][1:] == list(columns)
    assert [r[0] for r in table[1:5]] == list(CPU_ROWS)
    for row in table[1:5]:
        batch, mode = CPU_ROWS[row[0]]
        for column, cell in zip(columns, row[1:], strict=True):
            shown = [_tokens_and_speedup(report_of(run, batch, column), mode) for run in (1, 2)]
            assert cell == " / ".join(shown), (row[0], column)


def _precision_report(run: int, batch: int, precision: str) -> dict:
    report = json.loads((CPU_RUNS / f"run{run}_{precision}_b{batch}.json").read_text())
    assert report["settings"]["precision"] == precision and report["machine"]["cpu_kernels"]
    return report


def _peer_report(run: int, batch: int, column: str) -> dict:
    peer_precision = column.removeprefix("peer in ")
    report = json.loads((CPU_PEERS / f"run{run}_int8_b{batch}_peer_{peer_precision}.json").read_text())
    assert report["settings"]["precision"] == "int8"
    assert report["settings"]["reference_precision"] == peer_precision
    return report


def test_amx_cpu_table_is_the_stored_reports():
    # one report per precision and batch size; the last row: decoding's FLOP/s at batch 32 against the GEMM's
    table = _table("docs/performance.md", "cpu-precisions")
    _assert_cpu_table(table, ("bf16", "int8"), _precision_report)
    assert table[5][0] == "decode at batch 32 vs the 1024^3 GEMM of that precision"
    for precision, cell in zip(("bf16", "int8"), table[5][1:], strict=True):
        shown = []
        for run in (1, 2):
            report = _precision_report(run, 32, precision)
            decode = next(e for e in report["inference"] if e["mode"] == "decode")
            shown.append(f"{100 * decode['flops']['efficiency']:.0f}% of {report['matmul']['flops_per_s'] / 1e9:.0f}")
        assert cell == " / ".join(shown) + " GFLOP/s", precision


def test_amx_peer_precision_table_is_the_stored_reports():
    # namc in int8 against the peer in int8 and in bf16 (--reference-precision)
    _assert_cpu_table(
        _table("docs/performance.md", "cpu-peer-precision"), ("peer in int8", "peer in bf16"), _peer_report
    )


def test_a_cell_changed_by_hand_fails_the_cpu_check():
    table = _table("docs/performance.md", "cpu-peer-precision")
    table[3][2] = table[3][2].replace("(", "(1", 1)
    with pytest.raises(AssertionError):
        _assert_cpu_table(table, ("peer in int8", "peer in bf16"), _peer_report)


QUALITY_ROWS = {  # the quality table's row -> the results file's precision
    "fp32": "fp32",
    "bf16 as it runs": "bf16",
    "int8 as it runs": "int8",
    "int8 with MIR in int8, as a CPU without AMX runs it": "int8_noamx",
}


def _quality_seeds() -> list[dict]:
    packs = [tables.load(RESULTS / "xeon-amx-quality-w128" / f"quality_w128_seed{seed}.json.gz") for seed in (0, 1, 2)]
    assert [p["seed"] for p in packs] == [0, 1, 2]
    return packs


def _identical(pack: dict, precision: str) -> float:
    fp32 = dict(zip(pack["ids"], pack["predictions"]["fp32"], strict=True))
    other = dict(zip(pack["ids"], pack["predictions"][precision], strict=True))
    return identical_captions(other, fp32, "fp32")["fraction"]


def test_amx_quality_table_is_the_stored_captions():
    # every cell: CIDEr-D as `namc test` scored it, the share of captions identical to fp32's counted here from the
    # stored captions, and the mean +- sample sd over the three seeds of both
    table = _table("docs/performance.md", "quality-w128")
    assert [row[0] for row in table[1:]] == list(QUALITY_ROWS)
    packs = _quality_seeds()
    assert all(len(p["ids"]) == 700 for p in packs)
    for label, ciders, change, identical, spread in (row[:1] + row[2:] for row in table[1:]):
        precision = QUALITY_ROWS[label]
        scores = [p["scores"][precision]["CIDEr-D"] for p in packs]
        assert ciders == " / ".join(f"{s:.2f}" for s in scores), label
        if precision == "fp32":
            assert (change, identical, spread) == ("", "100%", ""), label
            continue
        delta = [s - p["scores"]["fp32"]["CIDEr-D"] for s, p in zip(scores, packs, strict=True)]
        assert change == f"{statistics.mean(delta):+.2f} ± {statistics.stdev(delta):.2f}", label
        same = [100 * _identical(p, precision) for p in packs]
        assert identical == " / ".join(f"{s:.1f}%" for s in same), label
        assert spread == f"{statistics.mean(same):.1f} ± {statistics.stdev(same):.1f}%", label


# -------------------------------------------------------------------------------------------------------- a GPU

GPU_RUNS = RESULTS / "h100-namc_base-vs-clip4idc"
GPU_CAPTIONS = RESULTS / "h100-caption-agreement"


def _medians_and_speedups(run: int) -> dict[tuple[int, str], tuple[float, float | None]]:
    """(batch, mode) -> (tokens/s median, speed-up over namc where a peer row) of one stored GPU run."""
    reports = [json.loads((GPU_RUNS / f"run{run}_{part}.json").read_text()) for part in ("small", "large")]
    rows = [e for r in reports for e in r["inference"] + r["reference"]]
    return {(e["batch_size"], e["mode"]): (e["tokens_per_s"]["median"], e.get("speedup")) for e in rows}


def _speedup_shown(text: str, value: float) -> bool:
    """Whether a speed-up cell such as "12.47x" is ``value`` rounded to the digits it shows."""
    digits = len(text.strip().removesuffix("x").split(".")[1])
    return float(text.strip().removesuffix("x")) == round(value, digits)


def test_gpu_table_is_the_stored_reports():
    # every tokens/s of the GPU table is a median in the stored reports (run 1 / run 2)
    runs = [_medians_and_speedups(1), _medians_and_speedups(2)]
    rows = _table("docs/performance.md", "gpu")[1:]
    assert [int(r[0]) for r in rows] == [1, 8, 64, 256, 1024]
    columns = {1: "decode", 2: "e2e", 4: "clip4idc_decode", 5: "clip4idc_e2e"}
    for row in rows:
        for col, mode in columns.items():
            shown = [int(x.replace(",", "")) for x in row[col].split("/")]
            assert shown == [round(run[(int(row[0]), mode)][0]) for run in runs], (row[0], mode)
        for col, mode in ((6, "clip4idc_decode"), (7, "clip4idc_e2e")):
            for text, run in zip(row[col].split("/"), runs, strict=True):
                assert _speedup_shown(text, run[(int(row[0]), mode)][1]), (row[0], mode)


def test_gpu_caption_agreement_is_the_stored_captions():
    cpu = json.loads((GPU_CAPTIONS / "describe_cpu_fp32.json").read_text())
    block = _block("docs/performance.md", "gpu-captions")
    for name, label in (("cuda_fp32", "CUDA fp32"), ("cuda_bf16", "CUDA bf16")):
        other = json.loads((GPU_CAPTIONS / f"describe_{name}.json").read_text())
        same = sum(other[k] == cpu[k] for k in cpu)
        assert len(cpu) == len(other) == 700 and f"| {label} | {same} of 700" in block


# -------------------------------------------------------------------------------------------------------- the README


def _peer_rate(batch: int, precision: str, mode: str) -> float:
    """The peer's median tokens/s at ``precision`` on the AMX Xeon, averaged over the two runs."""
    reports = [_peer_report(run, batch, f"peer in {precision}") for run in (1, 2)]
    return statistics.mean(
        next(e for e in r["reference"] if e["mode"] == f"clip4idc_{mode}")["tokens_per_s"]["median"] for r in reports
    )


def test_speed_table_is_each_model_at_its_fastest():
    table = _table("README.md", "speed")
    assert _block("README.md", "speed") == _block("docs/performance.md", "speed")
    cpu, gpu = table[1:3], table[3:]
    for row, batch in zip(cpu, (1, 32), strict=True):
        assert row[0].endswith(f"with AMX, batch {batch}")
        peer = row[1].removeprefix("int8 / ")
        other = {"int8": "bf16", "bf16": "int8"}[peer]
        assert all(_peer_rate(batch, peer, m) > _peer_rate(batch, other, m) for m in ("decode", "e2e")), batch
        for mode, cell in zip(("decode", "e2e"), row[2:], strict=True):
            shown = [_tokens_and_speedup(_peer_report(run, batch, f"peer in {peer}"), mode) for run in (1, 2)]
            assert cell == " / ".join(shown), (batch, mode)
    runs = [_medians_and_speedups(1), _medians_and_speedups(2)]
    assert [int(row[0].rsplit(" ", 1)[1]) for row in gpu] == [1, 64, 1024]
    for row in gpu:
        batch = int(row[0].rsplit(" ", 1)[1])
        assert row[0].startswith("one NVIDIA H100") and row[1] == "bf16 / bf16"
        for mode, cell in zip(("decode", "e2e"), row[2:], strict=True):
            for text, run in zip(cell.split(" / "), runs, strict=True):
                tokens, speedup = text.removesuffix(")").split(" (")
                assert int(tokens.replace(",", "")) == round(run[batch, mode][0]), (batch, mode)
                assert _speedup_shown(speedup, run[batch, f"clip4idc_{mode}"][1]), (batch, mode)


def test_demo_table_is_the_stored_seeds():
    results = json.loads((RESULTS / "xeon-amx-demo-seeds" / "demo_seeds.json").read_text())
    seeds, measured = results["per_seed"], results["mean_and_sd"]
    table = _table("README.md", "demo")
    labels = {
        "namc (pre-trained + fine-tuned)": "namc",
        "same model, no pre-training": "no_pretraining",
        "most frequent training caption": "frequent_caption",
    }
    assert [row[0] for row in table[1:4]] == list(labels)
    for label, cider, bleu, per_seed in table[1:4]:
        values = seeds[labels[label]]["CIDEr-D"]
        assert per_seed == ", ".join(f"{v:.2f}" for v in values), label
        mean, sd = (float(x) for x in cider.split(" ± "))
        # the mean and sd were taken over unrounded scores: the rounded ones above agree to within their rounding
        assert abs(mean - statistics.mean(values)) <= 0.006 and abs(sd - statistics.stdev(values)) <= 0.011, label
        assert bleu == " ± ".join(f"{v:.2f}" for v in measured[labels[label]].get("BLEU-4", ())), label
    gain = [a - b for a, b in zip(seeds["namc"]["CIDEr-D"], seeds["no_pretraining"]["CIDEr-D"], strict=True)]
    assert table[4] == [
        "pre-training's gain, paired by seed",
        f"{statistics.mean(gain):+.2f} ± {statistics.stdev(gain):.2f}",
        "",
        ", ".join(f"{v:+.2f}" for v in gain),
    ]
    auroc = seeds["namc"]["noise_auroc"]
    mean, sd = measured["namc"]["noise_auroc"]
    assert abs(mean - statistics.mean(auroc)) <= 0.001 and abs(sd - statistics.stdev(auroc)) <= 0.001
    assert f"AUROC: {mean:.3f} ± {sd:.3f} ({', '.join(f'{v:.3f}' for v in auroc)})" in _block("README.md", "demo")


# -------------------------------------------------------------------------------------------------------- the studies

STUDIES = RESULTS / "xeon-shapes-studies"
EXPERIMENTS = "docs/experiments.md"


def _study(name: str) -> dict:
    return json.loads((STUDIES / f"{name}.json").read_text(encoding="utf-8"))


def _summary_cell(stored: dict) -> str:
    """A study report's cell: mean ± sd [95% t-interval], or a dash where nothing was measured."""
    if stored["n"] == 0:
        return "—"
    return f"{stored['mean']:.2f} ± {stored['sd']:.2f} [{stored['low']:.2f}, {stored['high']:.2f}]"


def _shown_difference(cell: str) -> float:
    """The signed mean at the start of a paired-difference cell such as "-0.66 [-5.15, 3.83], p=0.704"."""
    assert cell[0] in "+-", cell
    return float(cell.split(" ", 1)[0])


def _all_differences() -> list[tuple[str, dict]]:
    """Every stored paired difference of the studies, named."""
    out = []
    for name in ("table6", "table10"):
        for variant, figures in _study(name)["variants"].items():
            out += [(f"{name} {variant} {m}", f["paired"]) for m, f in figures.items() if "paired" in f]
    for shift, diff in _study("table10")["namc_minus_no_nim_mir"]["shifts"].items():
        out.append((f"table10 {shift}", diff))
    for ratio, diffs in _study("figure3")["noise_minus_random"].items():
        out += [(f"figure3 {ratio} {m}", d) for m, d in diffs.items()]
    return out


def test_study_tables_format_as_the_study_report():
    # the renderers, given the figures aggregate() computes, write the tables `namc experiment report` writes
    metrics, variants = ["test/CIDEr-D", "pretrain/noise_auroc"], ["namc", "no_mir", "no_pretraining"]
    rows = []
    for seed in range(3):
        scores = {
            "namc": {"test/CIDEr-D": 140 + 1.7 * seed, "pretrain/noise_auroc": 0.7 + 0.013 * seed},
            "no_mir": {"test/CIDEr-D": 150 - 2.3 * seed + (seed == 1), "pretrain/noise_auroc": 0.7 + 0.013 * seed},
            "no_pretraining": {"test/CIDEr-D": 120.0 + 9 * seed * seed},
        }
        rows += [{"variant": v, "seed": seed, "wall_s": 1.0, "metrics": scores[v]} for v in variants]
    agg = aggregate(rows, variants, metrics, "namc")

    def finite(obj, keys) -> dict:
        return {k: getattr(obj, k) for k in keys if math.isfinite(getattr(obj, k))}

    stored = {"reference": "namc", "metrics": metrics, "variants": {}}
    for v in variants:
        stored["variants"][v] = {}
        for m in metrics:
            s, p = agg[v][m]["summary"], agg[v][m]["paired"]
            stored["variants"][v][m] = {"summary": {"n": s.n, **finite(s, ("mean", "sd", "low", "high"))}}
            if p is not None:
                stored["variants"][v][m]["paired"] = {"n": p.n, **finite(p.diff, ("mean", "low", "high"))}
                stored["variants"][v][m]["paired"].update(finite(p, ("p",)))
    report = [t for t in format_report("a study", rows, variants, metrics, "namc").strip().split("\n\n") if t[0] == "|"]
    assert report == [tables.study_summaries(stored), tables.study_paired(stored)]
    assert "| no_pretraining | 3 | " in report[0] and report[1].endswith("| n=0 |")


def test_stored_study_differences_agree_with_their_intervals():
    # a two-sided paired t-test has p < 0.05 exactly where the 95% t-interval leaves out zero (a rounded -0.00 is
    # below it), and the interval holds the mean
    differences = _all_differences()
    assert len(differences) == 24 + 7 + 20
    for name, d in differences:
        if d["n"] == 0:
            continue
        assert d["low"] <= d["mean"] <= d["high"], name
        below, above = math.copysign(1, d["high"]) < 0, math.copysign(1, d["low"]) > 0
        assert (below or above) == (d["p"] < 0.05), name


def _assert_table6(summary: list[list[str]], paired: list[list[str]]) -> None:
    stored = _study("table6")
    metrics, variants, reference = stored["metrics"], stored["variants"], stored["reference"]
    assert summary[0] == ["variant", "n", *metrics] and paired[0] == ["variant", *metrics]
    assert [r[0] for r in summary[1:]] == list(variants)
    assert [r[0] for r in paired[1:]] == [v for v in variants if v != reference]
    for variant, n, *cells in summary[1:]:
        assert n == "5", variant
        for metric, cell in zip(metrics, cells, strict=True):
            assert cell == _summary_cell(variants[variant][metric]["summary"]), (variant, metric)
    for variant, *cells in paired[1:]:
        for metric, cell in zip(metrics, cells, strict=True):
            d, figures = variants[variant][metric]["paired"], variants[variant][metric]["summary"]
            if d["n"] == 0:
                assert cell == "n=0" and figures["n"] == 0, (variant, metric)
                continue
            assert cell == f"{d['mean']:+.2f} [{d['low']:.2f}, {d['high']:.2f}], p={d['p']:.3f}", (variant, metric)
            # over the same five seeds the mean difference is the difference of the means, to the digits shown
            gap = figures["mean"] - variants[reference][metric]["summary"]["mean"]
            assert abs(_shown_difference(cell) - gap) <= 0.015, (variant, metric)


def test_table6_is_the_stored_study():
    _assert_table6(_table(EXPERIMENTS, "study-table6"), _table(EXPERIMENTS, "study-table6-paired"))


def test_a_cell_changed_by_hand_fails_the_study_check():
    paired = _table(EXPERIMENTS, "study-table6-paired")
    paired[1][1] = paired[1][1].replace("-0.66", "+0.66")
    with pytest.raises(AssertionError):
        _assert_table6(_table(EXPERIMENTS, "study-table6"), paired)


def test_table10_is_the_stored_study():
    stored, table6 = _study("table10"), _study("table6")
    variants, metrics = stored["variants"], stored["metrics"]
    summary = _table(EXPERIMENTS, "study-table10")
    assert summary[0] == ["variant", "n", *metrics] and [r[0] for r in summary[1:]] == list(variants)
    for variant, n, *cells in summary[1:]:
        assert [n, *cells] == ["5", *(_summary_cell(variants[variant][m]["summary"]) for m in metrics)], variant
    # the clean fine-tunings are Table 6's runs of the same two models, to the last digit
    for clean, same in (("namc_clean", "namc"), ("no_nim_mir_clean", "no_nim_mir")):
        for m in metrics:
            assert variants[clean][m]["summary"] == table6["variants"][same][m]["summary"], (clean, m)
    shifts = stored["namc_minus_no_nim_mir"]["shifts"]
    rows = _table(EXPERIMENTS, "study-table10-shifts")
    assert [r[0] for r in rows[1:]] == list(shifts)
    for shift, namc, without, cell, distinct in rows[1:]:
        arms = [variants[f"{arm}_{shift}"] for arm in ("namc", "no_nim_mir")]
        cider = [a["test/CIDEr-D"]["summary"] for a in arms]
        assert [namc, without] == [f"{s['mean']:.2f} ± {s['sd']:.2f}" for s in cider], shift
        d = shifts[shift]
        assert cell == f"{d['mean']:+.1f} [{d['low']:.1f}, {d['high']:.1f}], p={d['p']:.3f}", shift
        assert abs(_shown_difference(cell) - (cider[0]["mean"] - cider[1]["mean"])) <= 0.06, shift
        assert distinct == " / ".join(f"{a['test/distinct_captions']['summary']['mean']:.1f}" for a in arms), shift
    # clean: Table 6's difference of the model without NIM and MIR from NAMC, the other way round
    clean = table6["variants"]["no_nim_mir"]["test/CIDEr-D"]["paired"]
    assert shifts["clean"] == {
        "n": 5,
        "mean": round(-clean["mean"], 1),
        "low": round(-clean["high"], 1),
        "high": round(-clean["low"], 1),
        "p": clean["p"],
    }


def test_figure3_is_the_stored_study():
    stored = _study("figure3")
    rows = _table(EXPERIMENTS, "study-figure3")
    diffs = stored["noise_minus_random"]
    assert len(rows) == 1 + len(diffs) == 11
    for row, (ratio, diff) in zip(rows[1:], diffs.items(), strict=True):
        assert row[:2] == [{"pt": "text (p_T)", "pi": "image (p_I)"}[ratio[:2]], f"{float(ratio[2:]):.2f}"]
        noise, random = (stored["variants"][f"{arm}_{ratio}"] for arm in ("noise", "random"))
        for metric, digits, (arm_cells, cell) in (
            ("test/CIDEr-D", 2, (row[2:4], row[4])),
            ("pretrain/noise_auroc", 3, (row[5:7], row[7])),
        ):
            means = [a[metric]["summary"] for a in (noise, random)]
            shown = [f"{s['mean']:.{digits}f}" + (f" ± {s['sd']:.{digits}f}" if "sd" in s else "") for s in means]
            assert arm_cells == shown, (ratio, metric)
            d = diff[metric]
            assert cell.endswith(f"p={d['p']:.{2 if d['p'] >= 0.1 else 3}f}"), (ratio, metric)
            assert _shown_difference(cell) == round(d["mean"], digits), (ratio, metric)
            gap = means[0]["mean"] - means[1]["mean"]
            assert abs(_shown_difference(cell) - gap) <= 1.5 * 10**-digits, (ratio, metric)


def test_preference_tables_are_the_stored_runs():
    stored = _study("preference")
    chance = stored["chance"]
    # 400 items, 50 per category: overall accuracy is the mean over the categories (to the rounding of each)
    assert abs(chance["overall"] - statistics.mean(v for k, v in chance.items() if k != "overall")) <= 0.05
    for part in ("one_model", "demo_seeds"):
        models = stored[part]["models"]
        for scores, block in (("minimal_pairs", "choice"), ("CIDEr-D", "cider")):
            table = _table(EXPERIMENTS, f"study-preference-{part.replace('_', '-')}-{block}")
            columns = list(next(iter(models.values()))[scores])
            assert table[0] == ["model", "runs", *("CIDEr-D" if c == "all" else c for c in columns)]
            body = table[1:]
            if scores == "minimal_pairs":
                assert body[0] == ["chance", "", *(f"{chance[c]:.1f}" for c in columns)]
                body = body[1:]
            assert [r[0] for r in body] == list(models)
            for name, runs, *cells in body:
                model = models[name]
                assert runs == str(model["runs"]), (part, name)
                for column, cell in zip(columns, cells, strict=True):
                    f = model[scores][column]
                    assert ("sd" in f) == (model["runs"] > 1), (part, name, column)
                    assert cell == f"{f['mean']:.1f}" + (f" ± {f['sd']:.1f}" if "sd" in f else ""), (part, name, column)
                if scores == "minimal_pairs":
                    categories = [f["mean"] for c, f in model[scores].items() if c != "overall"]
                    assert abs(model[scores]["overall"]["mean"] - statistics.mean(categories)) <= 0.1, (part, name)


def test_a_threshold_changed_without_its_measurement_is_refused(monkeypatch) -> None:
    """The thresholds table states each cut-off's value; code that moved one alone fails the rendering."""
    from namc import thresholds as code

    assert tables.thresholds().count("\n") == len(tables.load(tables.THRESHOLDS)["thresholds"]) + 1
    monkeypatch.setattr(code, "INT8_MIN_WEIGHT", code.INT8_MIN_WEIGHT * 2)
    with pytest.raises(ValueError, match="INT8_MIN_WEIGHT is 16384 in namc/thresholds.py"):
        tables.thresholds()
