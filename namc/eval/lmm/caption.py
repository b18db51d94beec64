"""``namc eval lmm``: caption a benchmark split through a multimodal LLM server and score it beside namc.

Every pair of a registered benchmark's split (``--dataset NAME --root DIR``) or of a pair list (``--pairs FILE``,
:mod:`namc.eval.lmm.pairs`) is sent to any OpenAI-compatible chat server (vLLM, SGLang, llama.cpp's server, a
hosted API) with both images as ``image_url`` parts and a prompt (a preset of :mod:`namc.eval.lmm.presets`, or
``--prompt-file``). Answers go through the client, store and runner of ``namc curate describe``
(:mod:`namc.llm`): retries and failures counted by kind, a rate limit, token counters, and an append-only
``answers.jsonl`` that a rerun resumes and a SIGKILL cannot tear. The key comes from the environment variable
``--api-key-env`` names, never from a flag.

The folder ``--out`` holds:

- ``answers.jsonl``: one result line per pair (the last line of an id wins; ``--retry-failed`` asks the failed ones
  again); ``run.json``: the model and the prompt's SHA-256 the answers belong to (another model or prompt in the
  same folder is refused); ``runs.jsonl``: each finished run's counts and wall time;
- ``predictions.json``: the LMM's captions in namc's results format (:func:`namc.eval.captions.write_results`, what
  ``namc test`` writes and ``namc eval`` reads), ``references.json`` and ``types.json`` beside it;
- ``report.json``: the metrics (:mod:`namc.eval.captions`) of the LMM and, with ``--namc`` (a ``namc test``
  predictions file) or ``--namc-model`` (a model folder captioned here), of namc on the same pairs, overall and per
  change type; the LMM's requests, tokens in and out, wall time and pairs/s beside namc's; the judge-free
  diagnostic (:func:`~namc.eval.captions.metrics.trivial_baselines`). The table is printed.

A pair whose request failed is scored with an empty caption, so leaving hard pairs out never raises a score; the
report counts them by kind.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from namc.eval.lmm.pairs import EvalPair, benchmark_pairs, read_pair_list
from namc.eval.lmm.presets import CAPTION_PRESETS, Prompt, SlotError, fill_slots, load_prompt
from namc.jsonl import loads

__all__ = ["build_parser", "caption_jobs", "caption_with_namc", "lmm_predictions", "main"]

logger = logging.getLogger(__name__)

ANSWERS = "answers.jsonl"


def caption_jobs(
    pairs: Sequence[EvalPair], prompt: Prompt, store: Any, summary: Any, max_side: int | None = None
) -> Iterator[Any]:
    """The pairs not finished in ``store`` as :class:`~namc.llm.Job` s (finished ones counted as resumed).

    Args:
        pairs: the pairs to caption.
        prompt: the captioning prompt.
        store: the opened :class:`~namc.llm.ResultStore`.
        summary: the run's :class:`~namc.llm.RunSummary`.
        max_side: resize images whose longer side exceeds this (None: as they are).
    """
    from namc.llm import BadInput, Job, data_url, image_message

    def builder(pair: EvalPair) -> Any:
        def build() -> list[dict[str, Any]]:
            try:
                text = fill_slots(prompt.text, (pair.caption1, pair.caption2))
            except SlotError as err:
                raise BadInput("missing_field", f"pair {pair.id}: {err}") from None
            urls = [data_url(ref, pair.base, max_side) for ref in (pair.image1, pair.image2)]
            return image_message(text, urls)

        return build

    for pair in pairs:
        if pair.id in store.done:
            summary.resumed += 1
            continue
        yield Job(pair.id, builder(pair), {"prompt_sha256": prompt.sha256})


def read_answers(path: Path) -> dict[str, dict[str, Any]]:
    """``{id: its last result}`` of an answers file (corrupt lines are left out: their pairs were asked again)."""
    from namc.llm.store import iter_results

    out: dict[str, dict[str, Any]] = {}
    if path.exists():
        for _, result in iter_results(path):
            if result is not None:
                out[result["id"]] = result
    return out


def lmm_predictions(
    pairs: Sequence[EvalPair], answers: dict[str, dict[str, Any]]
) -> tuple[dict[str, str], Counter[str]]:
    """The LMM's caption of every pair (whitespace joined into one line) and the pairs without one, by kind.

    A failed pair, or one with no answer (a run stopped early), gets the empty caption.
    """
    predictions: dict[str, str] = {}
    missing: Counter[str] = Counter()
    for pair in pairs:
        result = answers.get(pair.id)
        if result is None:
            missing["not_asked"] += 1
            predictions[pair.id] = ""
        elif result.get("status") != "ok":
            missing[str(result.get("error_kind") or "failed")] += 1
            predictions[pair.id] = ""
        else:
            text = " ".join(str(result.get("text") or "").split())
            missing["empty"] += not text
            predictions[pair.id] = text
    return predictions, +missing


def caption_with_namc(
    model_path: str | Path, pairs: Sequence[EvalPair], batch_size: int = 32, device: str = "cpu", progress: bool = True
) -> tuple[dict[str, str], float, Counter[str]]:
    """Caption ``pairs`` with a namc model (a ``save_pretrained`` folder, ``hf-hub:`` id or ``.ckpt``), greedy and
    in fp32 eager PyTorch, timing the captioning (images read and decoded, not the model load).

    Returns:
        ``(predictions, seconds, unreadable)``: id -> caption (``""`` for a pair whose image cannot be read), the
        wall time, and the unreadable pairs by kind.
    """
    import torch
    from tqdm.auto import tqdm

    from namc.data.refs import read_ref
    from namc.data.transforms import ImageTransform
    from namc.models.registry import load_model

    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--namc-device {device}: no CUDA device is available here; use --namc-device cpu")
    model = load_model(model_path, pretraining=False).to(device).eval()
    transform = ImageTransform(model.config.image_size)
    predictions: dict[str, str] = {}
    unreadable: Counter[str] = Counter()
    start = time.perf_counter()
    with torch.inference_mode(), tqdm(total=len(pairs), desc="namc", unit="pair", disable=not progress) as bar:
        for first in range(0, len(pairs), batch_size):
            batch, a, b = [], [], []
            for pair in pairs[first : first + batch_size]:
                try:
                    x = transform.load(read_ref(pair.image1, pair.base))
                    y = transform.load(read_ref(pair.image2, pair.base))
                except FileNotFoundError:
                    unreadable["missing_image"] += 1
                    predictions[pair.id] = ""
                    continue
                except (OSError, SyntaxError, ValueError):
                    unreadable["corrupt_image"] += 1
                    predictions[pair.id] = ""
                    continue
                batch.append(pair.id)
                a.append(x)
                b.append(y)
            if batch:
                captions = model.generate(torch.stack(a).to(device), torch.stack(b).to(device))
                predictions.update(zip(batch, captions, strict=True))
            bar.update(len(pairs[first : first + batch_size]))
    seconds = time.perf_counter() - start
    return {p.id: predictions[p.id] for p in pairs}, seconds, unreadable


def build_parser() -> argparse.ArgumentParser:
    from namc.llm import add_client_arguments

    p = argparse.ArgumentParser(
        prog="namc eval lmm",
        description="Caption a benchmark split through an OpenAI-compatible multimodal LLM server (resumable) and "
        "score it beside namc on the same pairs.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="a registered benchmark (clevr_change, spot_the_diff, ier, ...)")
    src.add_argument("--pairs", type=Path, help="a pair list JSONL (id, image1, image2, references[, change_type])")
    p.add_argument("--root", type=Path, help="the benchmark's folder in its official layout (with --dataset)")
    p.add_argument("--split", default="test", help="train, val or test (default test)")
    p.add_argument("--out", type=Path, required=True, help="the comparison's folder (answers, predictions, report)")
    p.add_argument(
        "--prompt", default="table13", choices=sorted(CAPTION_PRESETS), help="a prompt preset (default table13)"
    )
    p.add_argument("--prompt-file", type=Path, help="a prompt file of one's own (wins over --prompt)")
    namc_src = p.add_mutually_exclusive_group()
    namc_src.add_argument("--namc", type=Path, help="namc's predictions on the same pairs (`namc test` captions)")
    namc_src.add_argument("--namc-model", help="a namc model folder (or hf-hub: id) to caption the same pairs with")
    p.add_argument("--namc-device", default="cpu", help="where --namc-model runs (default cpu)")
    p.add_argument("--namc-batch-size", type=int, default=32, help="pairs per forward pass of --namc-model")
    p.add_argument("--max-side", type=int, default=None, help="resize images whose longer side exceeds this")
    p.add_argument("--retry-failed", action="store_true", help="ask the pairs recorded as failed again")
    p.add_argument("--limit", type=int, default=None, help="only the first N pairs (a trial run)")
    p.add_argument("--no-score", action="store_true", help="caption only: no metrics, no report")
    p.add_argument("--no-spice", action="store_true", help="do not try SPICE")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_client_arguments(p)
    return p


def _load_pairs(args: argparse.Namespace) -> tuple[list[EvalPair], Counter[str], str]:
    """The pairs, the ones skipped by kind, and what they are (for the report)."""
    if args.dataset:
        if args.root is None:
            raise ValueError("--dataset needs --root, the benchmark's folder")
        pairs, skipped = benchmark_pairs(args.dataset, args.root, args.split)
        source = f"{args.dataset} {args.split} ({args.root})"
    else:
        pairs, skipped, _ = read_pair_list(args.pairs)
        source = str(args.pairs)
    if args.max_side is not None and args.max_side < 1:
        raise ValueError(f"--max-side must be at least 1, got {args.max_side}")
    if args.limit is not None:
        if args.limit < 1:
            raise ValueError(f"--limit must be at least 1, got {args.limit}")
        pairs = pairs[: args.limit]
    if not pairs:
        raise ValueError(f"{source}: no pairs to caption")
    return pairs, skipped, source


def _check_run(out: Path, model: str, prompt: Prompt) -> None:
    """Refuses a folder whose answers belong to another model or prompt; records them in a new one."""
    from namc.llm.store import atomic_write_text

    path = out / "run.json"
    mine = {"model": model, "prompt": prompt.name, "prompt_sha256": prompt.sha256}
    if path.exists():
        try:
            theirs = loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: unreadable ({err}); remove it only if {out / ANSWERS} is empty") from None
        if (theirs.get("model"), theirs.get("prompt_sha256")) != (model, prompt.sha256):
            raise ValueError(
                f"{out} holds answers of model {theirs.get('model')!r} with prompt {theirs.get('prompt')!r}; "
                f"use another --out for {model!r} with prompt {prompt.name!r}"
            )
        return
    atomic_write_text(path, json.dumps(mine, indent=2) + "\n")


def _run_totals(out: Path) -> dict[str, Any]:
    """Requests and wall time summed over the finished runs of ``runs.jsonl``."""
    totals: dict[str, Any] = {"requests": 0, "seconds": 0.0}
    path = out / "runs.jsonl"
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                run = loads(line)
                totals["requests"] += int(run["attempts"])
                totals["seconds"] += float(run["seconds"])
            except (ValueError, KeyError, TypeError):
                logger.warning("%s: an unreadable line, left out of the totals", path)
    return totals


def _caption(args: argparse.Namespace, pairs: list[EvalPair], skipped: Counter[str], prompt: Prompt) -> Any:
    """Runs the requests still to make; returns the run's :class:`~namc.llm.RunSummary`."""
    from namc.llm import ResultStore, RunSummary, client_config, run_jobs

    config = client_config(args)
    summary = RunSummary(lines=len(pairs) + sum(skipped.values()), skipped=Counter(skipped))
    with ResultStore(args.out / ANSWERS) as store:
        if args.retry_failed:
            logger.info("asking %d failed pairs again", store.forget_failed())
        todo = sum(p.id not in store.done for p in pairs)
        jobs = caption_jobs(pairs, prompt, store, summary, args.max_side)
        run_jobs(jobs, store, config, summary, total=todo, progress=not args.quiet, desc="lmm", seed=args.seed)
    summary.check()
    with open(args.out / "runs.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(summary.to_dict()) + "\n")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """``namc eval lmm``; returns 0, or 2 with a one-line error on bad input or a folder held by another run."""
    from namc.llm import configure_logging
    from namc.locks import LockedError, output_lock

    configure_logging()
    args = build_parser().parse_args(argv)
    try:
        prompt = load_prompt(args.prompt, args.prompt_file)
        pairs, skipped, source = _load_pairs(args)
        # a predictions file that cannot be used fails before any request is made
        namc_side = _namc_side(args, pairs) if args.namc is not None and not args.no_score else None
        # one run per folder: two runs on one answers file would send every request twice
        with output_lock(args.out, "namc eval lmm"):
            _check_run(args.out, args.model, prompt)
            summary = _caption(args, pairs, skipped, prompt)
            print(summary.format())
            if args.no_score:
                print(f"answers: {args.out / ANSWERS}")
                return 0
            from namc.eval.lmm.report import build_report, format_report, write_inputs

            lmm, missing = lmm_predictions(pairs, read_answers(args.out / ANSWERS))
            if args.namc_model is not None:
                namc_side = _namc_side(args, pairs)
            report = build_report(
                pairs=pairs,
                source=source,
                lmm=lmm,
                lmm_run={
                    "model": args.model,
                    "prompt": prompt.name,
                    "prompt_sha256": prompt.sha256,
                    "without_caption": dict(missing),
                    **_token_totals(args.out / ANSWERS, pairs),
                    **_run_totals(args.out),
                },
                namc=namc_side,
                spice=not args.no_spice,
            )
            write_inputs(args.out, pairs, lmm, report)
    except LockedError as err:
        print(f"namc eval lmm: error: {err}", file=sys.stderr)
        return 2
    except (ValueError, OSError, ModuleNotFoundError) as err:
        print(f"namc eval lmm: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(format_report(report))
    print(f"report: {args.out / 'report.json'}; captions: {args.out / 'predictions.json'}")
    return 0


def _token_totals(path: Path, pairs: Sequence[EvalPair]) -> dict[str, int]:
    """Tokens in and out summed over the answered pairs' final results."""
    ids = {p.id for p in pairs}
    totals = {"prompt_tokens": 0, "completion_tokens": 0}
    for key, result in read_answers(path).items():
        usage = result.get("usage") if key in ids else None
        if isinstance(usage, dict):
            for name in totals:
                value = usage.get(name)
                totals[name] += value if isinstance(value, int) else 0
    return totals


def _namc_side(args: argparse.Namespace, pairs: list[EvalPair]) -> dict[str, Any] | None:
    """namc's captions of the same pairs and how they were made, or None without ``--namc``/``--namc-model``."""
    from namc.eval.captions.files import load_predictions
    from namc.eval.captions.metrics import few_ids

    if args.namc is not None:
        predictions = load_predictions(str(args.namc))
        missing = [p.id for p in pairs if p.id not in predictions]
        if missing:
            raise ValueError(f"{args.namc}: no prediction for {len(missing)} of the pairs: {few_ids(missing)}")
        return {"source": str(args.namc), "predictions": {p.id: str(predictions[p.id]) for p in pairs}}
    if args.namc_model is not None:
        if args.namc_batch_size < 1:
            raise ValueError(f"--namc-batch-size must be at least 1, got {args.namc_batch_size}")
        predictions, seconds, unreadable = caption_with_namc(
            args.namc_model, pairs, args.namc_batch_size, args.namc_device, progress=not args.quiet
        )
        return {
            "source": str(args.namc_model),
            "predictions": predictions,
            "seconds": seconds,
            "device": args.namc_device,
            "without_caption": dict(unreadable),
        }
    return None


if __name__ == "__main__":
    sys.exit(main())
