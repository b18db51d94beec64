"""``namc curate audit``: how noisy is a corpus? NIM's word-level irrelevance over every description (ours).

NAMC's NIM computes, for every word of a description, how well the image supports it: ``R_T`` of Eq. 1, the best
cosine similarity of the word with any image patch. This step runs a pre-trained NAMC over a corpus manifest and
reports ``1 - R_T`` per word (:mod:`~namc.curate.audit.score`)::

    namc curate audit --model runs/pretrain/model --manifest work/corpus/manifest.jsonl --out work/corpus/audit

Outputs in ``--out``:

- ``audit.jsonl``: per pair ``{"id", "source", "words1", "scores1", "spans1", "words2", "scores2", "spans2",
  "flagged_fraction", "max_score"}`` (``spans``: runs of flagged words);
- ``report.html``: a static page a person can skim: the ``--html-pairs`` most flagged pairs with both images side by
  side and the flagged words highlighted;
- ``manifest.filtered.jsonl``: the pairs whose ``flagged_fraction`` is at most ``--max-flagged`` (references rewritten
  for the new folder), ready for ``namc data pack``;
- ``summary.json``: counts, the threshold, the irrelevance distribution and, when the manifest labels its noise
  (``noise1``/``noise2``, as the shapes world does), the precision and recall of the flags at several thresholds
  and the AUROC.

The threshold is ``--threshold`` (absolute irrelevance) or, by default, the ``--flag-quantile`` of all word scores of
this run (0.9: the 10% least supported words), because the scale of ``1 - cos`` depends on the model. Scoring runs
once; the scores go to a temporary JSONL and flagging is a second, model-free pass over it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from namc.curate.audit.report import render_html, thumbnail_url
from namc.curate.audit.score import flag_spans, score_manifest
from namc.curate.config import add_config_arguments, parse_with_config
from namc.data.issues import DataIssues
from namc.data.refs import read_ref, rebase_ref
from namc.eval.noise import auroc
from namc.jsonl import json_line, loads
from namc.locks import LockedError, output_lock
from namc.models.files import atomic_write_text
from namc.models.namc import NAMC

__all__ = ["main", "precision_recall", "run_audit"]

logger = logging.getLogger(__name__)

_BINS = 4000  # histogram of irrelevance over [0, 2] for the quantile threshold (resolution 0.0005)


def precision_recall(scores: np.ndarray, labels: np.ndarray, thresholds: Sequence[float]) -> list[dict[str, float]]:
    """Precision and recall of ``score >= t`` as a noise flag against word labels, per threshold; None where
    undefined (nothing flagged, no noise word), which ``summary.json`` writes as ``null`` (strict JSON has no NaN)."""
    rows = []
    for t in thresholds:
        flag = scores >= t
        tp = int((flag & labels).sum())
        fp = int((flag & ~labels).sum())
        fn = int((~flag & labels).sum())
        rows.append(
            {
                "threshold": round(float(t), 4),
                "flagged": tp + fp,
                "precision": tp / (tp + fp) if tp + fp else None,
                "recall": tp / (tp + fn) if tp + fn else None,
            }
        )
    return rows


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(float(value)) else None


def _quantile(hist: np.ndarray, q: float) -> float:
    cdf = np.cumsum(hist)
    if cdf[-1] == 0:
        return 1.0
    k = int(np.searchsorted(cdf, q * cdf[-1]))
    return 2.0 * (k + 1) / _BINS  # the bin's upper edge


def run_audit(
    model: NAMC,
    manifest: str | Path,
    out_dir: str | Path,
    threshold: float | None = None,
    flag_quantile: float = 0.9,
    max_flagged: float = 0.2,
    pr_thresholds: Sequence[float] | None = None,
    html_pairs: int = 200,
    batch_size: int = 32,
    limit: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Scores, flags and reports (see the module docstring); returns the summary that ``summary.json`` holds."""
    manifest, out = Path(manifest), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    issues = DataIssues("audit")
    hist = np.zeros(_BINS, dtype=np.int64)
    scores_tmp = out / ".scores.jsonl.partial"
    n_pairs = n_unscored = 0
    with open(scores_tmp, "w", encoding="utf-8") as f:
        for scored, _, _ in tqdm(
            score_manifest(model, manifest, issues, batch_size, limit), disable=not progress, desc="audit", unit="pair"
        ):
            r = scored.record
            for s in (scored.scores1, scored.scores2):
                vals = np.array([x for x in s if x is not None], dtype=np.float64)
                hist += np.histogram(np.clip(vals, 0, 2 - 1e-9), bins=_BINS, range=(0.0, 2.0))[0]
                n_unscored += sum(x is None for x in s)
            f.write(json.dumps({"record": r.to_json(), "scores1": scored.scores1, "scores2": scored.scores2}) + "\n")
            n_pairs += 1
    t = float(threshold) if threshold is not None else _quantile(hist, flag_quantile)

    labelled_s: list[float] = []
    labelled_y: list[bool] = []
    top: list[tuple[float, int, dict[str, Any]]] = []  # min-heap of the most flagged pairs for the report
    kept = 0
    with (
        open(scores_tmp, encoding="utf-8") as src,
        open(out / ".audit.jsonl.partial", "w", encoding="utf-8") as dst,
        open(out / ".manifest.filtered.jsonl.partial", "w", encoding="utf-8") as filt,
    ):
        for i, line in enumerate(src):
            row = loads(line)  # our own temporary file, read through the one bounded reader all the same
            rec, s1, s2 = row["record"], row["scores1"], row["scores2"]
            w1, w2 = rec["desc1"].split(), rec["desc2"].split()
            scored = [x for x in s1 + s2 if x is not None]
            flagged = sum(x >= t for x in scored)
            frac = flagged / len(scored) if scored else 0.0
            item = {
                "id": rec["id"],
                "source": rec["source"],
                "words1": w1,
                "scores1": _round(s1),
                "spans1": flag_spans(w1, s1, t),
                "words2": w2,
                "scores2": _round(s2),
                "spans2": flag_spans(w2, s2, t),
                "flagged_fraction": round(frac, 4),
                "max_score": round(max(scored), 4) if scored else None,
            }
            dst.write(json_line(item))
            for k, s in (("noise1", s1), ("noise2", s2)):
                if rec.get(k) is not None:
                    for x, y in zip(s, rec[k]):
                        if x is not None:
                            labelled_s.append(x)
                            labelled_y.append(bool(y))
            if frac <= max_flagged:
                moved = dict(rec)  # rec keeps its references relative to the manifest (the report reads them)
                for key in ("image1", "image2", "codes"):
                    if rec.get(key):
                        moved[key] = rebase_ref(rec[key], manifest.parent, out)
                filt.write(json_line(moved))
                kept += 1
            entry = (frac, -i, {**item, "verb1": rec["verb1"], "verb2": rec["verb2"], "refs": rec})
            if len(top) < html_pairs:
                heapq.heappush(top, entry)
            elif html_pairs and entry > top[0]:
                heapq.heapreplace(top, entry)
    os.replace(out / ".audit.jsonl.partial", out / "audit.jsonl")
    os.replace(out / ".manifest.filtered.jsonl.partial", out / "manifest.filtered.jsonl")
    scores_tmp.unlink()

    summary: dict[str, Any] = {
        "manifest": str(manifest),
        "pairs": n_pairs,
        "skipped": issues.counts,
        "threshold": round(t, 4),
        "threshold_from": "given" if threshold is not None else f"quantile {flag_quantile} of the word scores",
        "kept": kept,
        "dropped": n_pairs - kept,
        "max_flagged": max_flagged,
        "unscored_words": n_unscored,
        "irrelevance_quantiles": {str(q): round(_quantile(hist, q), 4) for q in (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)},
    }
    if labelled_y:
        s, y = np.asarray(labelled_s), np.asarray(labelled_y)
        grid = pr_thresholds or sorted({round(_quantile(hist, q), 4) for q in (0.5, 0.7, 0.8, 0.9, 0.95)} | {t})
        summary["noise_labels"] = {
            "words": int(y.size),
            "noise_words": int(y.sum()),
            "auroc": _finite(auroc(torch.from_numpy(s), torch.from_numpy(y))),  # None with one class only
            "precision_recall": precision_recall(s, y, grid),
        }
    pairs = []
    for _, _, p in sorted(top, reverse=True):
        refs = p.pop("refs")
        p["thumb1"], p["thumb2"] = (_thumb(refs[k], manifest.parent) for k in ("image1", "image2"))
        pairs.append(p)
    shown = {k: v for k, v in summary.items() if k not in ("noise_labels", "irrelevance_quantiles")}
    page = render_html(f"namc noise audit: {manifest.name}", shown, pairs, t, n_pairs)
    atomic_write_text(out / "report.html", page)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def _round(scores: list[float | None]) -> list[float | None]:
    return [None if x is None else round(x, 4) for x in scores]


def _thumb(ref: str, base: Path) -> str:
    try:
        return thumbnail_url(read_ref(ref, base))
    except OSError:
        return ""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="namc curate audit",
        description="Score every description word by NIM's irrelevance 1 - R_T (Eq. 1): JSONL, HTML report, "
        "filtered manifest; precision/recall where the manifest labels its noise.",
    )
    add_config_arguments(p)
    p.add_argument("--workdir", type=Path, default=None, help="default folder of --manifest and --out")
    p.add_argument("--model", type=str, default=None, help="pre-trained NAMC: save_pretrained folder, .ckpt or hf-hub:")
    p.add_argument("--manifest", type=Path, default=None, help="corpus manifest (default WORKDIR/manifest.jsonl)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default WORKDIR/audit)")
    p.add_argument("--threshold", type=float, default=None, help="flag words with irrelevance >= this")
    p.add_argument("--flag-quantile", type=float, default=0.9, help="without --threshold: flag above this quantile")
    p.add_argument("--max-flagged", type=float, default=0.2, help="filtered manifest keeps pairs flagged at most this")
    p.add_argument("--pr-thresholds", type=float, nargs="+", default=None, help="thresholds for precision/recall")
    p.add_argument("--html-pairs", type=int, default=200, help="pairs shown in report.html (most flagged first)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--limit", type=int, default=None, help="audit only the first N valid pairs")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_with_config(build_parser(), argv, "audit")
    manifest = args.manifest or (args.workdir / "manifest.jsonl" if args.workdir else None)
    if args.model is None or manifest is None or not manifest.is_file():
        print(f"namc curate audit: give --model and an existing --manifest (got {manifest})", file=sys.stderr)
        return 2
    from namc.models.registry import load_model

    model = load_model(args.model).to(args.device)
    out = args.out or (args.workdir or manifest.parent) / "audit"
    try:
        with output_lock(out, "namc curate audit"):
            summary = run_audit(
                model,
                manifest,
                out,
                args.threshold,
                args.flag_quantile,
                args.max_flagged,
                args.pr_thresholds,
                args.html_pairs,
                args.batch_size,
                args.limit,
                not args.quiet,
            )
    except LockedError as err:
        print(f"namc curate audit: error: {err}", file=sys.stderr)
        return 2
    print(
        f"audited {summary['pairs']} pairs (skipped {summary['skipped'] or 0}); threshold {summary['threshold']} "
        f"({summary['threshold_from']}); kept {summary['kept']}, dropped {summary['dropped']}"
    )
    noise = summary.get("noise_labels")
    if noise:
        print(f"labelled noise: {noise['noise_words']} of {noise['words']} words, AUROC {noise['auroc']:.3f}")
        print(f"{'threshold':>10}{'flagged':>9}{'precision':>11}{'recall':>8}")
        for row in noise["precision_recall"]:
            print(f"{row['threshold']:>10.4f}{row['flagged']:>9}{row['precision']:>11.3f}{row['recall']:>8.3f}")
    print(f"outputs: {out}/audit.jsonl, report.html, manifest.filtered.jsonl, summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
