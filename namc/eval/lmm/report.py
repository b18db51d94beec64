"""The report of ``namc eval lmm``: the LMM and namc scored on the same pairs, their cost, and the diagnostic.

:func:`build_report` scores every system with one :class:`~namc.eval.captions.CaptionEvaluator` (overall and per
change type, CIDEr-D's IDF from each subset's references) and adds the judge-free diagnostic
(:func:`~namc.eval.captions.metrics.trivial_baselines`); :func:`format_report` is the table the command prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from namc.eval.lmm.pairs import EvalPair

__all__ = ["SHOWN_METRICS", "build_report", "format_report", "write_inputs"]

#: the metrics of the printed table (the report holds all of them); Table 13 prints B(LEU-4), M, C and R
SHOWN_METRICS = ("BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D", "SPICE")


def _types(pairs: Sequence[EvalPair]) -> dict[str, Any] | None:
    """id -> change type, or None when no pair has one (pairs without one count as ``"none"``)."""
    if all(p.change_type is None for p in pairs):
        return None
    return {p.id: p.change_type if p.change_type is not None else "none" for p in pairs}


def _rate(pairs: int, seconds: float | None) -> float | None:
    return pairs / seconds if seconds else None


def build_report(
    *,
    pairs: Sequence[EvalPair],
    source: str,
    lmm: Mapping[str, str],
    lmm_run: Mapping[str, Any],
    namc: Mapping[str, Any] | None,
    spice: bool = True,
) -> dict[str, Any]:
    """Score the systems on ``pairs`` and lay the comparison out.

    Args:
        pairs: the pairs, with their references and change types.
        source: what the pairs are (a dataset split, a pair list).
        lmm: id -> the LMM's caption (``""`` where it has none).
        lmm_run: the LMM's model, prompt, ``without_caption`` counts, ``requests``, ``prompt_tokens``,
            ``completion_tokens`` and ``seconds``.
        namc: namc's ``predictions`` (id -> caption), their ``source`` and, when captioned here, ``seconds`` and
            ``device``; None: the LMM alone.
        spice: try SPICE.

    Returns:
        ``{"pairs", "source", "systems": {"lmm": ..., "namc": ...}, "diagnostic", "per_type_num_pairs"}``; each system
        has ``scores`` (what :meth:`~namc.eval.captions.CaptionEvaluator.evaluate` returns) and its cost.
    """
    from namc.eval.captions.metrics import CaptionEvaluator, trivial_baselines

    references = {p.id: list(p.references) for p in pairs}
    types = _types(pairs)
    systems: dict[str, Any] = {}
    with CaptionEvaluator(spice=spice) as evaluator:
        scores = evaluator.evaluate(dict(lmm), references, change_types=types)
        answered = sum(bool(c) for c in lmm.values())
        systems["lmm"] = {
            "label": f"{lmm_run['model']} (prompt {lmm_run['prompt']})",
            **dict(lmm_run),
            "answered": answered,
            "pairs_per_s": _rate(answered, lmm_run.get("seconds")),
            "scores": scores,
        }
        if namc is not None:
            seconds = namc.get("seconds")
            systems["namc"] = {
                "label": f"namc ({'/'.join(Path(str(namc['source'])).parts[-2:])})",
                **{k: v for k, v in namc.items() if k != "predictions"},
                "pairs_per_s": _rate(len(pairs), seconds),
                "scores": evaluator.evaluate(dict(namc["predictions"]), references, change_types=types),
            }
    return {
        "pairs": len(pairs),
        "source": source,
        "systems": systems,
        "per_type_num_pairs": scores.get("per_type_num_pairs", {}),
        "diagnostic": trivial_baselines(references, types),
        "scale": "x100",
        "metrics": "PTB tokenizer; CIDEr-D is pycocoevalcap's Cider",
    }


def write_inputs(out: Path, pairs: Sequence[EvalPair], lmm: Mapping[str, str], report: Mapping[str, Any]) -> None:
    """Writes ``predictions.json`` (namc's results format), ``references.json``, ``types.json`` and ``report.json``."""
    from namc.eval.captions.files import write_results
    from namc.llm.store import atomic_write_text

    references = {p.id: list(p.references) for p in pairs}
    write_results(out / "predictions.json", lmm, references, report["systems"]["lmm"]["scores"])
    atomic_write_text(out / "references.json", json.dumps(references, indent=2, ensure_ascii=False) + "\n")
    types = _types(pairs)
    if types is not None:
        atomic_write_text(out / "types.json", json.dumps(types, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(out / "report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")


def _cell(value: Any, digits: int = 2) -> str:
    if isinstance(value, float) and not math.isnan(value):
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "-" if value is None or isinstance(value, str) else str(value)


def format_report(report: Mapping[str, Any]) -> str:
    """The comparison as the command prints it: one row per system and diagnostic, then CIDEr-D per change type."""
    systems = report["systems"]
    head = f"{'system':<44} {'n':>6} " + " ".join(f"{m:>8}" for m in SHOWN_METRICS)
    head += f" {'requests':>9} {'tok in':>10} {'tok out':>9} {'wall s':>8} {'pairs/s':>8}"
    lines = [f"{report['source']}: {report['pairs']} pairs; scores x100 ({report['metrics']})", head]
    for system in systems.values():
        overall = system["scores"]["overall"]
        row = f"{system['label'][:44]:<44} {report['pairs']:>6} " + " ".join(
            f"{_cell(overall[m]):>8}" for m in SHOWN_METRICS
        )
        row += f" {_cell(system.get('requests')):>9} {_cell(system.get('prompt_tokens')):>10}"
        row += f" {_cell(system.get('completion_tokens')):>9} {_cell(system.get('seconds'), 1):>8}"
        row += f" {_cell(system.get('pairs_per_s')):>8}"
        lines.append(row)
    diagnostic = report["diagnostic"]
    for name, entry in diagnostic.items():
        what = "constant" if name == "no_change" else "most frequent reference"
        label = f"{what} {entry['caption']!r}"[:44]
        lines.append(f"{label:<44} {report['pairs']:>6} " + f"{'':>8} " * 3 + f"{_cell(entry['CIDEr-D']):>8}")
    lmm = systems["lmm"]
    if lmm.get("without_caption"):
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(lmm["without_caption"].items()))
        lines.append(f"LMM pairs without a caption, scored as empty: {kinds}")
    per_type = report.get("per_type_num_pairs") or {}
    if per_type:
        names = [*systems, *diagnostic]
        labels = [*(("namc" if k == "namc" else "LMM") for k in systems), "'no change'", "most frequent"]
        lines.append("CIDEr-D per change type:")
        lines.append(f"  {'type':<14} {'n':>6} " + " ".join(f"{label:>13}" for label in labels))
        for change_type, n in per_type.items():
            cells = []
            for name in names:
                entry = systems[name]["scores"]["per_type"] if name in systems else diagnostic[name]["per_type"]
                value = entry[change_type]["CIDEr-D"] if name in systems else entry[change_type]
                cells.append(f"{_cell(value):>13}")
            lines.append(f"  {change_type:<14} {n:>6} " + " ".join(cells))
    return "\n".join(lines)
