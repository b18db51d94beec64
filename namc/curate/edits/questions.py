"""``namc curate questions``: MED's multiple-choice benchmark from edited pairs (seed paper ``004``, section 3.3,
Figures 15-17), in the release format that ``namc eval choice --format med`` reads.

Input: the ``pairs.jsonl`` of ``namc curate edit`` (each pair with its category and Figure 11 difference). Stages,
each a resumable store under ``OUT_FOLDER/stages/`` (:mod:`namc.curate.edits.med_stages`)::

    similarity   section 3.3 selects "image pairs with high semantic similarity (CLIP cosine similarity > 0.95)"
                 (``--min-similarity``; the edit step stored the similarity)
    balance      at most ``--per-category`` questions per category, in input order (the paper: 165 questions
                 "evenly distributed across all edit types", 15 each); a pair rejected later frees its place for the
                 next one on a rerun
    answer       Figure 16: the right answer ("ANSWER: In the second image, ...") from the difference description
    distractors  Figure 17: three subtly wrong statements; three distinct ones, none equal to the right answer

Output, ``--out`` (default ``MED_bench.json`` beside the pairs): a JSON list of ``{"image_name",
"edited_image_name", "type", "question", "options": ["A. ...", "B. ...", "C. ...", "D. ..."], "answer": "C"}`` (plus
``id`` and ``difference``), image paths relative to the file's folder (an original image stored inside a tar or
parquet file is written out under ``originals/``). The question is one of Figure 15's nine variations and the right
answer's position is drawn per pair from ``--question-seed``, so a rerun writes the same file.
``questions.summary.json`` counts the 11 categories, the rejections per stage and reason, and this run's items per
second; rejected pairs are listed in ``questions.rejects.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.edits.med import _counts
from namc.curate.edits.med_edit import edited_name
from namc.curate.edits.med_prompts import (
    CATEGORIES,
    FIG15_QUESTIONS,
    FIG16_INPUT,
    FIG16_RIGHT_ANSWER,
    FIG17_WRONG_ANSWERS,
    category_of,
    fill,
    parse_right_answer,
    parse_wrong_answers,
)
from namc.curate.edits.med_stages import InputItems, Outcome, Stage, StageBook, StageRun, funnel, run_llm_stage, trace
from namc.data.refs import parse_ref, read_ref, rebase_ref, ref_ext
from namc.jsonl import json_line
from namc.llm import add_client_arguments, client_config, configure_logging
from namc.llm.store import atomic_write_text
from namc.locks import LockedError, output_lock

__all__ = ["LETTERS", "MIN_SIMILARITY", "build_parser", "main", "question_stages", "run_questions"]

logger = logging.getLogger(__name__)

#: Section 3.3: benchmark pairs have "CLIP cosine similarity > 0.95".
MIN_SIMILARITY = 0.95
LETTERS = "ABCD"
State = dict[str, Any]


def question_stages() -> list[Stage]:
    """The two LLM stages: Figure 16 (right answer) and Figure 17 (three distractors)."""

    def answer_messages(s: State) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": FIG16_RIGHT_ANSWER},
            {"role": "user", "content": fill(FIG16_INPUT, difference_description=s["difference"])},
        ]

    def distractor_messages(s: State) -> list[dict[str, Any]]:
        text = fill(FIG17_WRONG_ANSWERS, difference_description=s["difference"], right_answer=s["right"])
        return [{"role": "user", "content": text}]

    return [
        Stage("answer", lambda s, r: {"right": parse_right_answer(r.get("text") or "")}, answer_messages),
        Stage(
            "distractors",
            lambda s, r: {"wrong": parse_wrong_answers(r.get("text") or "", s["right"])},
            distractor_messages,
        ),
    ]


def _eligible(state: State, min_similarity: float) -> tuple[str, str] | None:
    """``(reason, detail)`` for a pair that cannot become a question, else None."""
    for key in ("image1", "image2", "difference"):
        if not isinstance(state.get(key), str) or not state[key].strip():
            return "missing_field", f"the pair needs a string {key!r}"
    if category_of(str(state.get("category") or "")) is None:
        return "unknown_category", f"category {state.get('category')!r} is none of the 11"
    sim = state.get("similarity")
    if not isinstance(sim, int | float):
        return "missing_field", "the pair has no CLIP similarity (namc curate edit stores it)"
    if sim < min_similarity:
        return "low_similarity", f"CLIP similarity {sim:.4f} < {min_similarity}"
    return None


def _plain_file(ref: str, base: Path, out_dir: Path, key: str, slot: str) -> str:
    """A reference the benchmark file can name: a plain path rebased to ``out_dir``, or the bytes of a tar member
    or parquet cell written under ``originals/``."""
    if parse_ref(ref).kind == "path":
        return rebase_ref(ref, base, out_dir)
    data = read_ref(ref, base)
    name = f"originals/{edited_name(key)[:-4]}-{slot}.{ref_ext(ref, data)}"
    path = out_dir / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_bytes(path, data)
    return name


def atomic_bytes(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    partial.replace(path)


def question_item(key: str, state: State, seed: int) -> dict[str, Any]:
    """One benchmark entry: a Figure 15 question and the four options in an order drawn from ``seed`` and ``key``."""
    rng = random.Random(f"{seed}:{key}")
    question = rng.choice(FIG15_QUESTIONS)
    options = [state["right"], *state["wrong"]]
    rng.shuffle(options)
    answer = LETTERS[options.index(state["right"])]
    return {
        "question": question,
        "options": [f"{letter}. {text}" for letter, text in zip(LETTERS, options)],
        "answer": answer,
    }


def run_questions(
    pairs: Path,
    out: Path,
    config: Any,
    min_similarity: float = MIN_SIMILARITY,
    per_category: int | None = None,
    seed: int = 0,
    retry_failed: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Runs both stages over ``pairs`` and writes ``out`` (the benchmark JSON) and its summary; returns it."""
    base, out_dir = pairs.parent, out.parent
    stages = question_stages()
    all_items = InputItems(
        pairs, "id", lambda key, obj: {**obj, "category": category_of(str(obj.get("category") or ""))}
    )

    def selected(book: StageBook) -> Callable[[], Iterator[tuple[str, State]]]:
        def items() -> Iterator[tuple[str, State]]:
            taken: Counter[str] = Counter()
            for key, state in all_items():
                if _eligible(state, min_similarity) is not None:
                    continue
                if trace(state, key, stages, book).status == "rejected":
                    continue
                if per_category is not None and taken[state["category"]] >= per_category:
                    continue
                taken[state["category"]] += 1
                yield key, state

        return items

    runs: dict[str, StageRun] = {}
    started = time.perf_counter()
    (out_dir / "stages").mkdir(parents=True, exist_ok=True)
    with StageBook(out_dir / "stages", [s.name for s in stages]) as book:
        for i, stage in enumerate(stages):
            runs[stage.name] = run_llm_stage(
                selected(book), stages, i, book, config, retry_failed, progress, config.seed
            )
        chosen = {key for key, _ in selected(book)()}
        outcomes: list[Outcome] = []
        bench, rejects = [], []
        for key, state in all_items():
            bad = _eligible(state, min_similarity)
            if bad is not None:
                o = Outcome("rejected", "similarity", state, *bad)
            else:
                o = trace(state, key, stages, book)
                if o.status != "rejected" and key not in chosen:
                    o = Outcome("rejected", "balance", state, "category_full", f"{per_category} taken")
            outcomes.append(Outcome(o.status, o.stage, {"category": state.get("category")}, o.reason))
            if o.status == "rejected":
                rejects.append(json_line({"id": key, "stage": o.stage, "reason": o.reason, "detail": o.detail[:300]}))
            if o.status != "done":
                continue
            s = o.state
            bench.append(
                {
                    "id": key,
                    "image_name": _plain_file(s["image1"], base, out_dir, key, "1"),
                    "edited_image_name": _plain_file(s["image2"], base, out_dir, key, "2"),
                    "type": s["category"],
                    **question_item(key, s, seed),
                    "difference": s["difference"],
                }
            )
    atomic_write_text(out, json.dumps(bench, indent=1, ensure_ascii=False) + "\n")
    atomic_write_text(out.with_name("questions.rejects.jsonl"), "".join(rejects))
    stats = funnel(outcomes, ["similarity", "balance", *[s.name for s in stages]])
    for name, run in runs.items():
        stats[name]["run"] = run.to_json()
    done = [o for o in outcomes if o.status == "done"]
    summary = {
        "input": {"file": str(pairs), "items": len(outcomes), "skipped": dict(all_items.skipped)},
        "questions": len(bench),
        "categories": _counts([o.state["category"] for o in done]),
        "answers": dict(sorted(Counter(b["answer"] for b in bench).items())),
        "rejected": sum(o.status == "rejected" for o in outcomes),
        "pending": sum(o.status == "pending" for o in outcomes),
        "stages": stats,
        "seconds": round(time.perf_counter() - started, 3),
    }
    atomic_write_text(out.with_name("questions.summary.json"), json.dumps(summary, indent=2) + "\n")
    return summary


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="namc curate questions",
        description="MED's benchmark questions (004, Figures 15-17): four options per edited pair, the right one "
        "known, per category; read by `namc eval choice --format med`. Resumable.",
    )
    add_config_arguments(p)
    p.add_argument("--workdir", type=Path, default=None, help="default folder: WORKDIR/med/pairs.jsonl")
    p.add_argument("--pairs", type=Path, default=None, help="pairs.jsonl of namc curate edit")
    p.add_argument("--out", type=Path, default=None, help="the benchmark JSON (default MED_bench.json beside --pairs)")
    p.add_argument("--min-similarity", type=float, default=MIN_SIMILARITY, help="CLIP cosine kept (section 3.3: 0.95)")
    p.add_argument("--per-category", type=int, default=None, help="at most this many questions per category")
    p.add_argument("--question-seed", type=int, default=0, help="draws each pair's question and option order")
    p.add_argument("--retry-failed", action="store_true", help="redo the pairs recorded as failed")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_client_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    parser = build_parser()
    args = parse_with_config(parser, argv, "questions")
    pairs = args.pairs or (args.workdir / "med" / "pairs.jsonl" if args.workdir else None)
    if pairs is None:
        parser.error("give --pairs (or --workdir holding med/pairs.jsonl)")
    if not pairs.is_file():
        parser.error(f"pairs file not found: {pairs} (namc curate edit writes OUT/pairs.jsonl)")
    if not 0.0 <= args.min_similarity <= 1.0:
        parser.error(f"--min-similarity must be in [0, 1], got {args.min_similarity}")
    if args.per_category is not None and args.per_category < 1:
        parser.error(f"--per-category must be >= 1, got {args.per_category}")
    out = args.out or pairs.with_name("MED_bench.json")
    try:
        with output_lock(out.parent, "namc curate questions"):
            summary = run_questions(
                pairs,
                out,
                client_config(args),
                args.min_similarity,
                args.per_category,
                args.question_seed,
                args.retry_failed,
                not args.quiet,
            )
    except (LockedError, OSError) as err:
        print(f"namc curate questions: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(
        f"{summary['input']['items']} pairs -> {summary['questions']} questions ({summary['rejected']} rejected, "
        f"{summary['pending']} pending); per stage:"
    )
    for name, s in summary["stages"].items():
        print(f"  {name:<12} in {s['in']:>6}  kept {s['kept']:>6}  rejected {s['rejected']}")
    print("categories: " + ", ".join(f"{c} {summary['categories'][c]}" for c in CATEGORIES))
    print(f"benchmark: {out}  (next: namc eval choice {out} --format med --model MODEL)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
