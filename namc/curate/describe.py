"""``namc curate describe``: one implicit-change description per image pair from a multimodal LLM (appendix D.2).

Each pair of a pairs JSONL (the format of ``namc curate pairs``; :mod:`namc.curate` docs) gets the instruction of
its source (:mod:`namc.curate.prompts`: Spot-the-Diff with its ``difference``, InstructPix2Pix with its
``instruction``, anything else with captions only), both images attached as ``data:`` URLs, sent to any
OpenAI-compatible chat server (the paper: Qwen2-VL-7B-Instruct; ``vllm serve Qwen/Qwen2-VL-7B-Instruct``)::

    namc curate describe --pairs work/corpus/pairs.jsonl --out work/corpus/descriptions.jsonl \\
        --base-url http://gpu-host:8000/v1 --concurrency 64
    namc curate filter --results work/corpus/descriptions.jsonl     # -> manifest.jsonl, rejects, Table 14

Results are appended to ``--out`` one line per pair as they arrive (:class:`~namc.llm.ResultStore`): a rerun
skips finished pairs, a run killed at any moment loses only its requests in flight, and a pair that keeps failing is
recorded with its last error after ``--max-attempts`` (``--retry-failed`` tries those again). Every pair is
accounted for in the summary printed at the end and saved beside ``--out`` (``*.summary.json``).

A result line: ``{"id", "source", "image1", "image2", "prompt", "status": "ok", "text", "model", "attempts",
"finish_reason", "usage"}`` or ``{..., "status": "failed", "error_kind", "error", "attempts"}``. Image references are
rewritten relative to the results file's folder (absolute ones stay absolute).

Captions: a pair's ``caption1``/``caption2``, else the captions JSONL of ``namc curate caption`` (``--captions``,
``{"key", "caption"}`` joined on ``key1``/``key2``; held in memory). A pair without them fails as ``missing_field``.

``--prompt conventional`` sends appendix B.2's conventional request instead (:data:`~namc.curate.prompts.
CONVENTIONAL_PROMPT`: the change in free text, no template, no captions needed), for Table 11's baseline corpus;
its results say ``"prompt": "conventional"`` and ``namc curate filter`` keeps their text as written (free-text
records). One results file holds one kind: a run whose ``--prompt`` differs from the file's results stops with one
line, since resuming would silently mix the two corpora.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.prompts import CONVENTIONAL, PromptError, conventional_prompt, describe_prompt, prompt_kind
from namc.data.refs import rebase_ref
from namc.jsonl import loads
from namc.llm import (
    BadInput,
    Job,
    ResultStore,
    RunSummary,
    add_client_arguments,
    client_config,
    configure_logging,
    data_url,
    image_message,
    run_jobs,
)
from namc.llm.runner import read_jsonl_objects
from namc.llm.store import atomic_write_text
from namc.locks import LockedError, output_lock

__all__ = ["PROMPT_STYLES", "build_parser", "describe_jobs", "load_captions", "main"]

#: ``--prompt``: appendix D.2's template prompts (chosen per source) or appendix B.2's conventional one.
PROMPT_STYLES = ("template", CONVENTIONAL)

logger = logging.getLogger(__name__)


def load_captions(path: str | Path) -> dict[str, str]:
    """``{key: caption}`` of a captions JSONL (``{"key", "caption"}`` per line; the last line of a key wins;
    malformed lines and empty captions are skipped and logged)."""
    out: dict[str, str] = {}
    summary = RunSummary()
    for _, obj in read_jsonl_objects(path, summary, "key", unique=False):  # a corrected caption appended later wins
        caption = obj.get("caption")
        if isinstance(caption, str) and caption.strip():
            out[obj["key"]] = caption
    bad = sum(summary.skipped.values())
    if bad:
        logger.warning("%s: %d lines skipped (%s)", path, bad, dict(summary.skipped))
    return out


def image_key(pair: dict[str, Any], slot: str) -> str:
    """The key of a pairs line's image ``slot`` (``"1"``, ``"2"``) in a captions JSONL: its ``key1``/``key2``, else
    its reference ``image1``/``image2``, else ``ID/image1``; ``namc curate caption --pairs`` keys it the same."""
    for key in (pair.get("key" + slot), pair.get("image" + slot)):
        if isinstance(key, str):
            return key
    return f"{pair.get('id')}/image{slot}"


def _caption(pair: dict[str, Any], slot: str, captions: dict[str, str]) -> str | None:
    own = pair.get("caption" + slot)
    if isinstance(own, str) and own.strip():
        return own
    return captions.get(image_key(pair, slot))


def describe_jobs(
    pairs_path: Path | Sequence[Path],
    out_dir: Path,
    store: ResultStore,
    summary: RunSummary,
    captions: dict[str, str],
    max_side: int | None = None,
    limit: int | None = None,
    prompt: str = "template",
) -> Iterator[Job]:
    """The pairs of one or more pairs JSONL files not finished in ``store``, as jobs (counts resumed / skipped lines
    into ``summary``; an id is unique across all the files). ``limit`` stops after that many input lines;
    ``prompt`` is one of :data:`PROMPT_STYLES`."""
    if prompt not in PROMPT_STYLES:
        raise ValueError(f"prompt must be one of {PROMPT_STYLES}, got {prompt!r}")
    seen: set[str] = set()
    for path in [pairs_path] if isinstance(pairs_path, Path) else pairs_path:
        yield from _file_jobs(Path(path), out_dir, store, summary, captions, max_side, limit, seen, prompt)
        if limit is not None and summary.lines >= limit:
            return


def _file_jobs(
    pairs_path: Path,
    out_dir: Path,
    store: ResultStore,
    summary: RunSummary,
    captions: dict[str, str],
    max_side: int | None,
    limit: int | None,
    seen: set[str],
    prompt: str,
) -> Iterator[Job]:
    base = pairs_path.parent
    for _, pair in read_jsonl_objects(pairs_path, summary, "id", seen):
        if pair["id"] in store.done:
            summary.resumed += 1
        else:
            source = str(pair.get("source") or "").strip() or "unknown"
            kind = (
                CONVENTIONAL
                if prompt == CONVENTIONAL
                else prompt_kind(source, pair.get("instruction"), pair.get("difference"))
            )
            fields: dict[str, Any] = {"source": source, "prompt": kind}
            refs = [pair.get("image1"), pair.get("image2")]
            for slot, ref in zip(("image1", "image2"), refs):
                fields[slot] = rebase_ref(ref, base, out_dir) if isinstance(ref, str) and ref.strip() else None
            yield Job(pair["id"], _builder(pair, fields, refs, base, captions, max_side), fields)
        if limit is not None and summary.lines >= limit:
            return


def _builder(
    pair: dict[str, Any],
    fields: dict[str, Any],
    refs: list[Any],
    base: Path,
    captions: dict[str, str],
    max_side: int | None,
) -> Any:
    def build() -> list[dict[str, Any]]:
        if not all(isinstance(r, str) and r.strip() for r in refs):
            raise BadInput("missing_field", "the pair needs string 'image1' and 'image2' references")
        if fields["prompt"] == CONVENTIONAL:  # the same request for every pair: the images say it all
            return image_message(conventional_prompt()[1], [data_url(r, base, max_side) for r in refs])
        try:
            _, text = describe_prompt(
                fields["source"],
                _caption(pair, "1", captions),
                _caption(pair, "2", captions),
                instruction=pair.get("instruction"),
                difference=pair.get("difference"),
            )
        except PromptError as err:
            raise BadInput("missing_field", str(err)) from None
        return image_message(text, [data_url(r, base, max_side) for r in refs])

    return build


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="namc curate describe",
        description="One implicit-change description per image pair from an OpenAI-compatible multimodal LLM server "
        "(appendix D.2 prompts), resumable.",
    )
    add_config_arguments(p)
    p.add_argument("--workdir", type=Path, default=None, help="default folder of --pairs and --out")
    p.add_argument(
        "--pairs",
        type=Path,
        nargs="+",
        default=None,
        help="pairs JSONL file(s) (default: WORKDIR/source_pairs.jsonl and WORKDIR/pairs.jsonl, those that exist)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="results JSONL, appended (default WORKDIR/descriptions.jsonl)"
    )
    p.add_argument("--captions", type=Path, default=None, help="captions JSONL {key, caption} joined on key1/key2")
    p.add_argument(
        "--prompt",
        choices=PROMPT_STYLES,
        default="template",
        help="template: appendix D.2's prompt of each pair's source (default); conventional: appendix B.2's free-text "
        "prompt (Table 11's baseline corpus)",
    )
    p.add_argument("--max-side", type=int, default=None, help="resize images whose longer side exceeds this")
    p.add_argument("--retry-failed", action="store_true", help="request the pairs recorded as failed again")
    p.add_argument("--limit", type=int, default=None, help="stop after this many pairs lines (a trial run)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_client_arguments(p)
    return p


def _paths(args: argparse.Namespace) -> tuple[list[Path], Path]:
    if args.pairs:
        pairs = list(args.pairs)
    elif args.workdir is not None:  # what `namc curate index` (pair sources) and `namc curate pairs` (mined) write
        pairs = [p for p in (args.workdir / "source_pairs.jsonl", args.workdir / "pairs.jsonl") if p.is_file()]
        if not pairs:
            raise SystemExit(f"namc curate describe: no source_pairs.jsonl or pairs.jsonl in {args.workdir}")
    else:
        raise SystemExit("namc curate describe: give --pairs (or --workdir holding pairs.jsonl)")
    for p in pairs:
        if not p.is_file():
            raise SystemExit(f"namc curate describe: pairs file not found: {p}")
    out = args.out or (args.workdir or pairs[0].parent) / "descriptions.jsonl"
    return pairs, out


def summary_path(out: Path) -> Path:
    """Where a run's summary JSON goes: ``descriptions.jsonl`` -> ``descriptions.summary.json``."""
    return out.with_name(out.stem + ".summary.json")


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    args = parse_with_config(build_parser(), argv, "describe")
    pairs, out = _paths(args)
    config = client_config(args)
    captions = load_captions(args.captions) if args.captions else {}
    summary = RunSummary()
    try:
        # one run per output folder: two runs on one results file would send every request twice
        with output_lock(out.parent, "namc curate describe"), ResultStore(out) as store:
            _check_style(out, args.prompt)
            if args.retry_failed:
                logger.info("retrying %d failed pairs", store.forget_failed())
            todo = max(0, sum(count_lines(p, args.limit) for p in pairs) - len(store.done))
            jobs = describe_jobs(pairs, out.parent, store, summary, captions, args.max_side, args.limit, args.prompt)
            run_jobs(jobs, store, config, summary, total=todo, progress=not args.quiet, desc="describe", seed=args.seed)
            summary.check()
            atomic_write_text(summary_path(out), json.dumps(summary.to_dict(), indent=2) + "\n")
    except (LockedError, StyleError) as err:
        print(f"namc curate describe: error: {err}", file=sys.stderr)
        return 2
    print(summary.format())
    print(f"results: {out}  (next: namc curate filter --results {out})")
    return 0


class StyleError(ValueError):
    """A results file holds results of the other ``--prompt`` style."""


def _check_style(out: Path, prompt: str) -> None:
    """Refuse to append ``prompt`` results to a results file whose first result was asked the other way.

    Raises:
        StyleError: naming the file, both styles and the way out.
    """
    if not out.is_file():
        return
    with open(out, "rb") as f:
        for raw in f:
            try:
                first = loads(raw.decode("utf-8"))
            except ValueError:  # a torn, corrupt, non-UTF-8 or too deeply nested line: the store counts it
                continue
            if isinstance(first, dict) and isinstance(first.get("prompt"), str):
                found = CONVENTIONAL if first["prompt"] == CONVENTIONAL else "template"
                if found != prompt:
                    raise StyleError(
                        f"{out} holds --prompt {found} results; write the --prompt {prompt} ones to another --out"
                    )
                return


def count_lines(path: Path, limit: int | None) -> int:
    """Non-blank lines of a file (at most ``limit``), for the progress bar's ETA."""
    n = 0
    with open(path, "rb") as f:
        for raw in f:
            n += bool(raw.strip())
            if limit is not None and n >= limit:
                break
    return n


if __name__ == "__main__":
    sys.exit(main())
