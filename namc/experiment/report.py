"""The report of a study, rebuilt from ``results.jsonl`` alone: a markdown table of mean +- sd and the 95%
t-interval per variant and metric, paired differences against the reference variant (paired t-test across seeds),
and PNG plots (matplotlib, imported inside :func:`plot_study`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from namc.experiment.stats import Paired, Summary, paired, summarise

__all__ = ["aggregate", "format_report", "plot_study", "write_report"]


def _fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def aggregate(
    rows: Sequence[dict[str, Any]], variants: Sequence[str], metrics: Sequence[str], reference: str
) -> dict[str, dict[str, dict[str, Any]]]:
    """variant -> metric -> ``{"summary": Summary, "paired": Paired | None, "values": {seed: value}}``."""
    by: dict[str, dict[int, dict[str, float]]] = {}
    for r in rows:
        by.setdefault(r["variant"], {})[int(r["seed"])] = r["metrics"]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for v in variants:
        out[v] = {}
        for m in metrics:
            values = {s: float(ms[m]) for s, ms in by.get(v, {}).items() if isinstance(ms.get(m), (int, float))}
            ref = {s: float(ms[m]) for s, ms in by.get(reference, {}).items() if isinstance(ms.get(m), (int, float))}
            out[v][m] = {
                "values": values,
                "summary": summarise(list(values.values())),
                "paired": None if v == reference else paired(values, ref),
            }
    return out


def _cell(s: Summary) -> str:
    if s.n == 0:
        return "—"
    if s.n == 1:
        return f"{_fmt(s.mean)} (n=1)"
    return f"{_fmt(s.mean)} ± {_fmt(s.sd)} [{_fmt(s.low)}, {_fmt(s.high)}]"


def _diff(p: Paired | None) -> str:
    if p is None:
        return "reference"
    if p.n < 2:
        return f"n={p.n}"
    d = p.diff
    return f"{d.mean:+.2f} [{_fmt(d.low)}, {_fmt(d.high)}], p={_fmt(p.p, 3)}"


def format_report(
    title: str,
    rows: Sequence[dict[str, Any]],
    variants: Sequence[str],
    metrics: Sequence[str],
    reference: str,
    plots: Sequence[str] = (),
) -> str:
    """The markdown report (see the module docstring)."""
    agg = aggregate(rows, variants, metrics, reference)
    seeds = sorted({int(r["seed"]) for r in rows if r["variant"] in variants})
    lines = [f"# {title}", ""]
    walls = [float(r["wall_s"]) for r in rows if r["variant"] in variants]
    mean_wall = _fmt(sum(walls) / max(len(walls), 1), 0)
    lines.append(
        f"{len(walls)} runs, seeds {seeds}; run wall time {_fmt(sum(walls) / 60, 1)} min in all (mean "
        f"{mean_wall} s per run)."
    )
    lines += ["", "Mean ± sample sd [95% t-interval] over seeds.", ""]
    lines.append("| variant | n | " + " | ".join(metrics) + " |")
    lines.append("|---|---|" + "---|" * len(metrics))
    for v in variants:
        n = max((agg[v][m]["summary"].n for m in metrics), default=0)
        lines.append(f"| {v} | {n} | " + " | ".join(_cell(agg[v][m]["summary"]) for m in metrics) + " |")
    lines += ["", f"Paired difference against `{reference}` (same seeds): mean [95% t-interval], paired t-test p.", ""]
    lines.append("| variant | " + " | ".join(metrics) + " |")
    lines.append("|---|" + "---|" * len(metrics))
    for v in variants:
        if v != reference:
            lines.append(f"| {v} | " + " | ".join(_diff(agg[v][m]["paired"]) for m in metrics) + " |")
    for p in plots:
        lines += ["", f"![{Path(p).stem}]({Path(p).name})"]
    return "\n".join(lines) + "\n"


def _slug(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", metric).strip("_")


def plot_study(
    out: str | Path,
    rows: Sequence[dict[str, Any]],
    variants: Sequence[str],
    metrics: Sequence[str],
    reference: str,
    tags: dict[str, dict[str, Any]] | None = None,
    plot: dict[str, str] | None = None,
) -> list[Path]:
    """One PNG per metric: each variant's mean with its 95% interval and every seed as a dot; with ``plot: {x,
    series}`` and numeric ``x`` tags, lines over x per series instead (Figure 3's masking ratios)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = aggregate(rows, variants, metrics, reference)
    out = Path(out)
    paths = []
    for m in metrics:
        size = (6.0, 3.6) if plot and tags else (max(4.0, 0.9 * len(variants) + 1.5), 3.2)
        fig, ax = plt.subplots(figsize=size, dpi=120)
        if plot and tags:
            series: dict[str, list[tuple[float, Summary]]] = {}
            for v in variants:
                t = tags.get(v, {})
                if plot["x"] in t:
                    series.setdefault(str(t.get(plot.get("series", ""), "")), []).append(
                        (float(t[plot["x"]]), agg[v][m]["summary"])
                    )
            for name, pts in series.items():
                pts.sort(key=lambda p: p[0])
                xs = [p[0] for p in pts]
                ys = [p[1].mean for p in pts]
                lo = [p[1].mean - p[1].low if math.isfinite(p[1].low) else 0 for p in pts]
                hi = [p[1].high - p[1].mean if math.isfinite(p[1].high) else 0 for p in pts]
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=name or None)
            ax.set_xlabel(plot["x"])
            if len(series) > 1:
                ax.legend(fontsize=8)
        else:
            shown = [v for v in variants if agg[v][m]["values"]] or list(variants)  # variants not run yet: no slot
            for i, v in enumerate(shown):
                s = agg[v][m]["summary"]
                vals = list(agg[v][m]["values"].values())
                ax.scatter([i] * len(vals), vals, s=10, color="0.6", zorder=2)
                if s.n:
                    err = [[s.mean - s.low], [s.high - s.mean]] if s.n > 1 else None
                    ax.errorbar(
                        [i], [s.mean], yerr=err, fmt="o", color="C3" if v == reference else "C0", capsize=4, zorder=3
                    )
            ax.set_xticks(range(len(shown)), shown, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(m)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / f"{_slug(m)}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def write_report(
    out: str | Path,
    title: str,
    rows: Sequence[dict[str, Any]],
    variants: Sequence[str],
    metrics: Sequence[str],
    reference: str,
    tags: dict[str, dict[str, Any]] | None = None,
    plot: dict[str, str] | None = None,
    plots: bool = True,
) -> Path:
    """Write ``report.md`` (and the PNGs) into ``out``; returns the report's path."""
    out = Path(out)
    pngs = plot_study(out, rows, variants, metrics, reference, tags, plot) if plots else []
    path = out / "report.md"
    path.write_text(format_report(title, rows, variants, metrics, reference, [str(p) for p in pngs]), encoding="utf-8")
    return path
