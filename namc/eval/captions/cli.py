"""``namc eval PREDICTIONS.json REFERENCES.json [--types TYPES.json] [--compare OTHER.json] [--out RESULTS.json]
[--no-spice]``.

``namc eval choice CHOICES.jsonl --model DIR`` is the minimal-pair choice evaluation (:mod:`namc.eval.choice`);
``namc eval lmm`` captions a benchmark split through a multimodal LLM server beside namc, and ``namc eval judge``
scores captions change by change with an LLM judge (:mod:`namc.eval.lmm`).

Scores a predictions file against a references file with :func:`~namc.eval.captions.evaluate_captions` and prints
the table; the file formats are those of :mod:`namc.eval.captions.files`. ``--compare`` also counts the captions
identical to another predictions file of the same pairs (a precision against fp32, a change against the run before
it), e.g. the ``captions/test.json`` of two ``namc test`` runs.

Every report also prints a judge-free diagnostic: the CIDEr-D of the constant caption "no change" and of the set's
most frequent reference caption, predicted for every pair (:func:`~namc.eval.captions.metrics.trivial_baselines`),
beside the model's. A model near them may be rewarded for saying little (CIDEr-D rewards "no change" on distractors).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any

from namc.eval.captions.files import load_predictions, load_references, load_types, write_results
from namc.eval.captions.metrics import METRIC_KEYS, evaluate_captions, few_ids, trivial_baselines

__all__ = ["main"]


def _format(value: float | str) -> str:
    """A score as the table prints it; SPICE's "unavailable (...)" as is."""
    return f"{value:7.2f}" if isinstance(value, float) and not math.isnan(value) else f"{value}"


def identical_captions(predictions: dict[str, str], other: dict[str, str], name: str) -> dict[str, Any]:
    """How many captions of ``predictions`` equal those of ``other`` (the same ids, exact strings)."""
    if set(predictions) != set(other):
        missing, extra = set(predictions) - set(other), set(other) - set(predictions)
        raise ValueError(
            f"{name}: not the same pairs ({len(missing)} missing: {few_ids(missing)}; {len(extra)} extra: "
            f"{few_ids(extra)})"
        )
    same = sum(predictions[k] == other[k] for k in predictions)
    return {"file": name, "identical": same, "pairs": len(predictions), "fraction": same / len(predictions)}


def main(argv: Sequence[str] | None = None) -> int:
    """Score a predictions file against a references file and print the table (``namc eval``).

    Args:
        argv: arguments after ``eval`` (default ``sys.argv[1:]``).

    Returns:
        Exit status: 0 on success, 2 on bad input or without pycocoevalcap (``pip install "namc[train]"``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "choice":  # `namc eval choice ...`: minimal-pair choice accuracy (namc.eval.choice)
        from namc.eval.choice import main as choice_main

        return choice_main(argv[1:])
    if argv and argv[0] == "lmm":  # `namc eval lmm ...`: a multimodal LLM server beside namc (namc.eval.lmm)
        from namc.eval.lmm.caption import main as lmm_main

        return lmm_main(argv[1:])
    if argv and argv[0] == "judge":  # `namc eval judge ...`: change-level precision and recall (namc.eval.lmm)
        from namc.eval.lmm.judge import main as judge_main

        return judge_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="namc eval",
        description="Caption metrics x100 (PTB tokenizer; BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE).",
    )
    parser.add_argument(
        "predictions", help='{"id": "caption"}, [{"image_id": ..., "caption": ...}] or a results file (--out, test)'
    )
    parser.add_argument("references", help='{"id": ["reference", ...]} or a results file (its references)')
    parser.add_argument("--types", help='per-type scores: {"id": "type"} or {"type": ["id", ...]}')
    parser.add_argument("--compare", metavar="OTHER", help="also count the captions identical to this predictions file")
    parser.add_argument("--out", help="write scores and captions to this JSON file")
    parser.add_argument("--no-spice", action="store_true", help="do not try SPICE")
    args = parser.parse_args(argv)

    try:
        predictions = load_predictions(args.predictions)
        references = load_references(args.references)
        change_types = load_types(args.types) if args.types else None
        compare = None
        if args.compare:  # checked before the (slow) metrics run
            compare = identical_captions(predictions, load_predictions(args.compare), args.compare)
        scores = evaluate_captions(predictions, references, change_types=change_types, spice=not args.no_spice)
        scores = {**scores, "diagnostic": trivial_baselines(references, change_types)}
        if compare is not None:
            scores = {**scores, "compare": compare}
    except (ValueError, ModuleNotFoundError) as err:  # bad input, or pycocoevalcap (an optional extra) missing
        print(f"namc eval: error: {err}", file=sys.stderr)
        return 2

    rows = [("overall", scores["num_pairs"], scores["overall"])]
    rows += [(t, scores["per_type_num_pairs"][t], s) for t, s in scores.get("per_type", {}).items()]
    print(f"{'set':<12} {'n':>6}  " + "  ".join(f"{k:>7}" for k in METRIC_KEYS[:-1]) + "  SPICE")
    for name, n, metrics in rows:
        print(f"{name:<12} {n:>6}  " + "  ".join(_format(metrics[k]) for k in METRIC_KEYS))
    print(f"scores x100; tokenizer PTB; CIDEr-D = pycocoevalcap Cider ({scores['num_pairs']} pairs)")
    for name, entry in scores["diagnostic"].items():
        per_type = ", ".join(f"{t} {v:.2f}" for t, v in entry.get("per_type", {}).items())
        what = "the constant" if name == "no_change" else "the most frequent reference"
        print(
            f"diagnostic: CIDEr-D of {what} {entry['caption']!r} for every pair: {entry['CIDEr-D']:.2f}"
            + (f" ({per_type})" if per_type else "")
            + f"; the model's: {scores['overall']['CIDEr-D']:.2f}"
        )
    if args.compare:
        c = scores["compare"]
        print(f"identical to {c['file']}: {c['identical']} of {c['pairs']} captions ({100 * c['fraction']:.1f}%)")
    if args.out:
        print(f"wrote {write_results(args.out, predictions, references, scores)}")
    return 0
