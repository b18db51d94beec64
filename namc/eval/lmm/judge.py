"""``namc eval judge``: change-level precision, recall and F1 of captions, judged by an LLM, beside CIDEr-D.

::

    namc eval judge runs/cmp/predictions.json runs/demo/.../captions/test.json --types runs/cmp/types.json \\
        --out runs/cmp/judge --base-url http://gpu-host:8000/v1 --model Qwen/Qwen2.5-7B-Instruct

Each predictions file (any format ``namc eval`` reads; the first one's references are used unless ``--references``
is given) is one system. For every pair, an LLM behind any OpenAI-compatible chat server lists the atomic changes of
the references and of the prediction and matches them (:mod:`namc.eval.lmm.changes`, the prompt
``namc/eval/lmm/prompts/judge.txt`` or ``--prompt-file``); the report gives change precision, recall and F1 overall
and per change type, and on no-change distractors the share of predictions that say nothing changed and of those
that invent a change.

Answers are cached in an append-only JSONL (``--cache``, default ``OUT/judgements.jsonl``; :mod:`namc.llm`'s
store, so a rerun asks nothing twice and a SIGKILL loses only the requests in flight), keyed by the SHA-256 of
(model, prompt SHA-256, pair id, prediction, references): a system with the same caption for a pair shares the
judgement. Requests run at temperature 0. A malformed judgement is counted and asked again, with the answer and what
is wrong with it, up to ``--max-rounds`` requests in all; one still malformed is left out of the scores and counted,
never fatal.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from namc.eval.lmm.changes import Judgement, MalformedJudgement, parse_judgement, score_judgements
from namc.eval.lmm.presets import Prompt, fill_slots, load_prompt

__all__ = ["REPAIR", "build_parser", "judge_items", "judge_key", "main", "run_judge"]

logger = logging.getLogger(__name__)

#: what a repair request says after a malformed answer ({error} is what is wrong with it)
REPAIR = (
    "That answer could not be read: {error}. Answer again with only the JSON object, in the form given, and nothing "
    "else."
)


def judge_key(model: str, prompt: Prompt, pair_id: str, prediction: str, references: Sequence[str]) -> str:
    """The cache key of one judgement: SHA-256 of (model, prompt SHA-256, pair id, prediction, references)."""
    payload = json.dumps([model, prompt.sha256, pair_id, prediction, list(references)], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def judge_items(
    systems: dict[str, dict[str, str]], references: dict[str, list[str]], model: str, prompt: Prompt
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, str]]]:
    """The judgements to have: ``({key: {"pair", "text"}}, {system: {pair id: key}})``, each key once."""
    items: dict[str, dict[str, Any]] = {}
    keys: dict[str, dict[str, str]] = {}
    for name, predictions in systems.items():
        keys[name] = {}
        for pair_id, prediction in predictions.items():
            refs = references[pair_id]
            key = judge_key(model, prompt, pair_id, prediction, refs)
            keys[name][pair_id] = key
            if key not in items:
                listed = "\n".join(f"- {' '.join(r.split())}" for r in refs)
                # an empty prediction says nothing: the judge sees that, not an empty slot
                text = fill_slots(prompt.text, references=listed, prediction=prediction.strip() or "(empty)")
                items[key] = {"pair": pair_id, "text": text}
    return items, keys


def _messages(text: str, repair: tuple[str, str] | None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    if repair is not None:
        answer, error = repair
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": REPAIR.format(error=error)},
        ]
    return messages


def _last_results(path: Path) -> dict[str, dict[str, Any]]:
    from namc.llm.store import iter_results

    out: dict[str, dict[str, Any]] = {}
    if path.exists():
        for _, result in iter_results(path, "key"):
            if result is not None:
                out[result["key"]] = result
    return out


def _todo(
    items: dict[str, dict[str, Any]], answers: dict[str, dict[str, Any]], done: set[str], max_rounds: int
) -> Iterator[tuple[str, int, tuple[str, str] | None]]:
    """``(key, round, repair)`` of the judgements to ask for: not finished in the store (never asked, or failed and
    forgotten by ``--retry-failed``), or answered malformed with rounds left (``repair``: the answer, its error)."""
    for key in items:
        last = answers.get(key)
        if key not in done or last is None:
            yield key, 0, None
        elif last.get("status") == "ok":
            try:
                parse_judgement(str(last.get("text") or ""))
            except MalformedJudgement as err:
                asked = int(last.get("round") or 0) + 1
                if asked < max_rounds:
                    yield key, asked, (str(last.get("text") or ""), str(err))


def run_judge(
    items: dict[str, dict[str, Any]],
    cache: Path,
    config: Any,
    max_rounds: int = 3,
    retry_failed: bool = False,
    progress: bool = True,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Asks for every judgement not in ``cache`` (and repairs malformed ones), round by round.

    Returns:
        ``(answers, totals)``: key -> its last result, and this run's requests, repairs, tokens, failed requests by
        kind and seconds.
    """
    from namc.llm import Job, ResultStore, RunSummary, run_jobs

    totals: dict[str, Any] = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0}
    totals["repairs"] = 0
    failed: Counter[str] = Counter()
    with ResultStore(cache, id_field="key") as store:
        if retry_failed:
            logger.info("asking %d failed judgements again", store.forget_failed())
        for _ in range(max_rounds):
            answers = _last_results(cache)
            todo = list(_todo(items, answers, store.done, max_rounds))
            if not todo:
                break
            summary = RunSummary(lines=len(todo))
            jobs = []
            for key, round_, repair in todo:
                store.done.discard(key)  # a malformed answer's key is asked again; its new line wins
                text = items[key]["text"]
                jobs.append(
                    Job(key, lambda t=text, r=repair: _messages(t, r), {"pair": items[key]["pair"], "round": round_})
                )
            totals["repairs"] += sum(r is not None for _, _, r in todo)
            run_jobs(iter(jobs), store, config, summary, total=len(jobs), progress=progress, desc="judge")
            summary.check()
            totals["requests"] += summary.attempts
            totals["prompt_tokens"] += summary.prompt_tokens
            totals["completion_tokens"] += summary.completion_tokens
            totals["seconds"] += summary.seconds
            failed.update(summary.failed)
    totals["failed"] = dict(failed)
    return _last_results(cache), totals


def outcomes(keys: dict[str, str], answers: dict[str, dict[str, Any]]) -> tuple[dict[str, Judgement], Counter[str]]:
    """One system's usable judgements (pair id -> judgement) and its pairs without one, by reason
    (``malformed_judgement``, a request failure's kind, ``not_judged``)."""
    judged: dict[str, Judgement] = {}
    left_out: Counter[str] = Counter()
    for pair_id, key in keys.items():
        last = answers.get(key)
        if last is None:
            left_out["not_judged"] += 1
        elif last.get("status") != "ok":
            left_out[str(last.get("error_kind") or "failed")] += 1
        else:
            try:
                judged[pair_id] = parse_judgement(str(last.get("text") or ""))
            except MalformedJudgement:
                left_out["malformed_judgement"] += 1
    return judged, left_out


def build_parser() -> argparse.ArgumentParser:
    from namc.llm import add_client_arguments

    p = argparse.ArgumentParser(
        prog="namc eval judge",
        description="Change-level precision, recall and F1 of captions, judged by an LLM behind an OpenAI-compatible "
        "chat server (cached, resumable), and the no-change distractor rates.",
    )
    p.add_argument("predictions", type=Path, nargs="+", help="predictions files, one per system")
    p.add_argument("--references", type=Path, help="references (default: those of the first predictions file)")
    p.add_argument("--types", type=Path, help='change types {"id": "type"} (distractor/no_change: no change)')
    p.add_argument("--out", type=Path, required=True, help="folder of the report (judge.json) and the default cache")
    p.add_argument("--cache", type=Path, help="the judgements cache JSONL (default OUT/judgements.jsonl)")
    p.add_argument("--prompt-file", type=Path, help="a judge prompt of one's own ({references}, {prediction})")
    p.add_argument("--max-rounds", type=int, default=3, help="requests per judgement while answers are malformed")
    p.add_argument("--retry-failed", action="store_true", help="ask the judgements whose requests failed again")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_client_arguments(p)
    return p


def _systems(args: argparse.Namespace) -> tuple[dict[str, dict[str, str]], dict[str, list[str]], dict[str, Any]]:
    from namc.eval.captions.files import load_predictions, load_references, load_types
    from namc.eval.captions.metrics import few_ids

    references = load_references(str(args.references or args.predictions[0]))
    systems: dict[str, dict[str, str]] = {}
    for path in args.predictions:
        predictions = load_predictions(str(path))
        missing, extra = set(references) - set(predictions), set(predictions) - set(references)
        if missing or extra:
            raise ValueError(
                f"{path}: not the pairs of the references ({len(missing)} missing: {few_ids(missing)}; "
                f"{len(extra)} without references: {few_ids(extra)})"
            )
        if any(not isinstance(v, str) for v in predictions.values()):
            raise ValueError(f"{path}: predictions must be strings")
        bad = [k for k, v in references.items() if not isinstance(v, list) or not all(isinstance(r, str) for r in v)]
        if bad:
            raise ValueError(f"references: not lists of strings for {few_ids(bad)}")
        systems[str(path) if str(path) not in systems else f"{path} ({len(systems)})"] = predictions
    types = load_types(str(args.types)) if args.types else None
    return systems, references, types


def format_judge(report: dict[str, Any]) -> str:
    """The table ``namc eval judge`` prints."""

    def cell(v: Any) -> str:
        return f"{100 * v:6.1f}" if isinstance(v, float) else f"{'-':>6}"

    lines = [
        f"change-level judge {report['model']} (prompt {report['prompt']}); precision, recall, F1 and distractor "
        "rates in %",
        f"  {'system':<44} {'pairs':>6} {'P':>6} {'R':>6} {'F1':>6}  {'distr.':>6} {'silent':>6} {'invent':>6}  "
        "left out",
    ]
    for name, s in report["systems"].items():
        c, d = s["changes"], s["distractors"]
        left = ", ".join(f"{k}={v}" for k, v in sorted(s["left_out"].items())) or "-"
        lines.append(
            f"  {name[-44:]:<44} {c['pairs']:>6} {cell(c['precision'])} {cell(c['recall'])} {cell(c['F1'])}  "
            f"{d['pairs']:>6} {cell(d['said_no_change'])} {cell(d['invented_change'])}  {left}"
        )
        for t, b in s["per_type"].items():
            lines.append(f"    {t:<42} {b['pairs']:>6} {cell(b['precision'])} {cell(b['recall'])} {cell(b['F1'])}")
    r = report["run"]
    lines.append(
        f"this run: {r['requests']} requests ({r['repairs']} repairs of malformed answers), tokens "
        f"{r['prompt_tokens']} in + {r['completion_tokens']} out, {r['seconds']:.1f} s; cache {report['cache']}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``namc eval judge``; returns 0, or 2 with a one-line error on bad input or a folder held by another run."""
    from namc.llm import client_config, configure_logging
    from namc.llm.store import atomic_write_text
    from namc.locks import LockedError, output_lock

    configure_logging()
    args = build_parser().parse_args(argv)
    try:
        if args.temperature != 0:
            raise ValueError(
                f"the judge runs at temperature 0 (cached answers must be reproducible), not {args.temperature}"
            )
        if args.max_rounds < 1:
            raise ValueError(f"--max-rounds must be at least 1, got {args.max_rounds}")
        prompt = load_prompt(file=args.prompt_file, judge=True)
        if not {"references", "prediction"} <= prompt.slots():
            raise ValueError(f"judge prompt {prompt.name}: needs the slots {{references}} and {{prediction}}")
        systems, references, types = _systems(args)
        cache = args.cache or args.out / "judgements.jsonl"
        items, keys = judge_items(systems, references, args.model, prompt)
        with contextlib.ExitStack() as locks:
            # one run per folder: two runs on one cache would ask every judgement twice
            for folder in dict.fromkeys([args.out.resolve(), cache.parent.resolve()]):
                locks.enter_context(output_lock(folder, "namc eval judge"))
            answers, totals = run_judge(
                items, cache, client_config(args), args.max_rounds, args.retry_failed, not args.quiet
            )
            report: dict[str, Any] = {
                "model": args.model,
                "prompt": prompt.name,
                "prompt_sha256": prompt.sha256,
                "cache": str(cache),
                "run": totals,
                "systems": {},
            }
            for name, system_keys in keys.items():
                judged, left_out = outcomes(system_keys, answers)
                report["systems"][name] = {**score_judgements(judged, types), "judged": len(judged)}
                report["systems"][name]["left_out"] = dict(left_out)
            atomic_write_text(args.out / "judge.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    except LockedError as err:
        print(f"namc eval judge: error: {err}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as err:
        print(f"namc eval judge: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(format_judge(report))
    print(f"report: {args.out / 'judge.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
