"""The change-level judge's answers, read and scored: change precision, recall and F1, and the distractor rates.

For each pair a judge LLM lists the atomic changes the references describe and those the prediction states, and
matches each predicted change to a reference change or to none (the prompt: ``namc/eval/lmm/prompts/judge.txt``).
The answer is one JSON object::

    {"reference_changes": ["the red cube was added", ...],
     "prediction_changes": [{"change": "a red cube appeared", "match": 0}, {"change": "...", "match": null}]}

:func:`parse_judgement` accepts it inside a Markdown code fence or after a sentence of preamble, and refuses with
:class:`MalformedJudgement` (one line saying what is wrong) anything else: no JSON object, a missing or mistyped
field, a ``match`` that is not an index of ``reference_changes``. A reference change matched by an earlier
predicted change counts once: the later predicted change is unmatched (a duplicate is not a second correct change).

Scores (:func:`score_judgements`), micro-averaged over pairs: on pairs with a change, precision = matched predicted
changes / predicted changes, recall = reference changes matched / reference changes, F1 their harmonic mean,
overall and per change type. On no-change distractors (a distractor change type, or, without types, no reference
change), the share of predictions that name no change (correct) and of those that invent one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from namc.eval.lmm.pairs import is_distractor
from namc.jsonl import JSONError, loads

__all__ = ["Judgement", "MalformedJudgement", "parse_judgement", "prf", "score_judgements"]

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)


class MalformedJudgement(ValueError):
    """A judge answer that is not the JSON object asked for (the message says what is wrong, in one line)."""


@dataclass(frozen=True)
class Judgement:
    """One pair's judgement: the reference changes, the predicted changes, and each predicted change's match (an
    index of ``reference_changes``, or None)."""

    reference_changes: tuple[str, ...]
    prediction_changes: tuple[str, ...]
    matches: tuple[int | None, ...]

    def counts(self) -> tuple[int, int, int, int]:
        """``(predicted, predicted and matched, reference, reference and found)``, each reference matched once."""
        found: set[int] = set()
        correct = 0
        for match in self.matches:
            if match is not None and match not in found:
                found.add(match)
                correct += 1
        return len(self.prediction_changes), correct, len(self.reference_changes), len(found)


def _object_text(text: str) -> str:
    fenced = _FENCE.search(text)
    if fenced:
        text = fenced.group(1)
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise MalformedJudgement("no JSON object in the answer")
    return text[start : end + 1]


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise MalformedJudgement(f"{what!r} is not a list of non-empty strings")
    return tuple(" ".join(v.split()) for v in value)


def parse_judgement(text: str) -> Judgement:
    """The :class:`Judgement` of a judge answer (module docstring).

    Raises:
        MalformedJudgement: the answer is not the JSON object asked for.
    """
    try:
        data = loads(_object_text(text))
    except JSONError as err:
        raise MalformedJudgement(f"not JSON: {' '.join(str(err).split())[:200]}") from None
    if not isinstance(data, dict):
        raise MalformedJudgement("the answer is not a JSON object")
    references = _strings(data.get("reference_changes"), "reference_changes")
    items = data.get("prediction_changes")
    if not isinstance(items, list):
        raise MalformedJudgement("'prediction_changes' is not a list")
    changes: list[str] = []
    matches: list[int | None] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("change"), str) or not item["change"].strip():
            raise MalformedJudgement(f"prediction_changes[{i}] is not {{'change': text, 'match': index or null}}")
        match = item.get("match")
        if match is not None and (isinstance(match, bool) or not isinstance(match, int)):
            raise MalformedJudgement(f"prediction_changes[{i}].match is {match!r}, not an index or null")
        if match is not None and not 0 <= match < len(references):
            raise MalformedJudgement(
                f"prediction_changes[{i}].match {match} is not an index of the {len(references)} reference changes"
            )
        changes.append(" ".join(item["change"].split()))
        matches.append(match)
    return Judgement(references, tuple(changes), tuple(matches))


def prf(predicted: int, correct: int, reference: int, found: int) -> dict[str, float | None]:
    """Precision, recall and F1 of summed counts (None where a denominator is 0)."""
    precision = correct / predicted if predicted else None
    recall = found / reference if reference else None
    f1 = None
    if precision is not None and recall is not None:
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "F1": f1}


def _block(counts: list[tuple[int, int, int, int]]) -> dict[str, Any]:
    predicted, correct, reference, found = (sum(c[i] for c in counts) for i in range(4))
    return {
        "pairs": len(counts),
        **prf(predicted, correct, reference, found),
        "predicted_changes": predicted,
        "matched_predicted_changes": correct,
        "reference_changes": reference,
        "found_reference_changes": found,
    }


def score_judgements(
    judgements: Mapping[str, Judgement], change_types: Mapping[str, str | tuple[str, ...]] | None = None
) -> dict[str, Any]:
    """Change precision, recall and F1 overall and per change type, and the distractor rates.

    Args:
        judgements: pair id -> its judgement (pairs without a usable judgement left out).
        change_types: pair id -> change type (or several); a distractor type marks a no-change pair. Without it,
            a pair whose references hold no change is a distractor.

    Returns:
        ``{"changes": {pairs, precision, recall, F1, counts}, "per_type": {type: ...}, "distractors": {"pairs",
        "said_no_change", "invented_change", "invented_changes"}}``; rates are fractions (None without pairs).
    """
    changed: list[tuple[int, int, int, int]] = []
    per_type: dict[str, list[tuple[int, int, int, int]]] = {}
    distractor_predictions: list[int] = []
    for key, judgement in judgements.items():
        ctype = change_types.get(key) if change_types is not None else None
        counts = judgement.counts()
        no_change = is_distractor(ctype) if change_types is not None else not judgement.reference_changes
        if no_change:
            distractor_predictions.append(counts[0])
            continue
        changed.append(counts)
        for t in ctype if isinstance(ctype, tuple) else (ctype,) if ctype is not None else ():
            per_type.setdefault(str(t), []).append(counts)
    n = len(distractor_predictions)
    silent = sum(p == 0 for p in distractor_predictions)
    return {
        "changes": _block(changed),
        "per_type": {t: _block(c) for t, c in sorted(per_type.items())},
        "distractors": {
            "pairs": n,
            "said_no_change": silent / n if n else None,
            "invented_change": (n - silent) / n if n else None,
            "invented_changes": sum(distractor_predictions),
        },
    }
