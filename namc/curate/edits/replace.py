"""``namc curate replace``: Img-Diff's object replacement (``002``, section 3.2) -> image pairs.

Two resumable phases, each with its own results file under ``--workdir``:

1. ``replacements.jsonl``: for every caption of ``--captions`` (``{"key" | "id", "caption"}`` per line, the format
   of ``namc curate caption``), an LLM on any OpenAI-compatible server replaces one object name
   (:data:`~namc.curate.edits.prompts_imgdiff.REPLACE_PROMPT`; ``namc.llm``: retries, rate limit, failures
   recorded by kind);
2. ``pairs.jsonl``: a :class:`~namc.curate.edits.base.PairGenerator` (``generator:`` section: ``backend: diffusers``
   with Prompt-to-Prompt attention sharing, ``openai``, or ``shapes``) renders both captions from one seed; the
   images go to ``images/STEM_1.png`` and ``images/STEM_2.png`` (``STEM``: the id made safe as a file name). A
   line: ``{"id", "status": "ok", "source": "imgdiff", "image1", "image2", "caption1", "caption2", "object1",
   "object2", "seed"}`` (plus ``truth_boxes`` where the generator knows the changed boxes: the shapes world), or
   ``{"id", "status": "rejected", "reason", "detail"}``: ``request_failed``, ``empty_answer``, ``refusal``,
   ``malformed_answer``, ``no_replacement`` or ``generator:KIND`` (a
   :class:`~namc.curate.edits.base.GenerationFailed`).

Next: ``namc curate regions`` (the Image Similarity Filter and the Difference Area Generator).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.edits.base import BackendError, GenerationFailed, PairGenerator
from namc.curate.edits.imgdiff_common import StepCounts, file_stem, item_seed, mapping, write_summary
from namc.curate.edits.prompts_imgdiff import REPLACE_PROMPT, AnswerError, parse_replacement
from namc.jsonl import loads
from namc.llm import Job, ResultStore, RunSummary, add_client_arguments, client_config, configure_logging, run_jobs
from namc.llm.runner import read_jsonl_objects
from namc.llm.store import iter_results
from namc.locks import LockedError, output_lock
from namc.paths import contained

__all__ = ["build_parser", "generate_pairs", "main", "request_replacements"]

logger = logging.getLogger(__name__)


def request_replacements(
    captions: Path, out: Path, config: Any, limit: int | None = None, progress: bool = True, seed: int | None = 0
) -> RunSummary:
    """Phase 1: one replacement request per caption not yet in ``out`` (a results store keyed by ``id``)."""
    summary = RunSummary()
    with ResultStore(out) as store:

        def jobs() -> Iterator[Job]:
            seen: set[str] = set()
            field = _id_field(captions)
            for _, obj in read_jsonl_objects(captions, summary, field, seen):
                cid = obj[field]
                caption = obj.get("caption")
                if cid in store.done:
                    summary.resumed += 1
                elif not isinstance(caption, str) or not caption.strip():
                    summary.skipped["missing_field"] += 1
                else:
                    text = REPLACE_PROMPT.format(caption=caption.strip())
                    msg = [{"role": "user", "content": text}]
                    yield Job(cid, lambda m=msg: m, {"caption": caption.strip()})
                if limit is not None and summary.lines >= limit:
                    return

        run_jobs(jobs(), store, config, summary, progress=progress, desc="replace (LLM)", seed=seed)
    return summary


def _id_field(path: Path) -> str:
    """``key`` (``namc curate caption``'s captions) when the file's first object has one, else ``id``."""
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    first = loads(raw)
                except ValueError:
                    return "id"
                return "key" if isinstance(first, dict) and isinstance(first.get("key"), str) else "id"
    return "id"


class _PairWriter:
    """Renders replacements in batches and appends one line per item to the store (module docstring)."""

    def __init__(self, store: ResultStore, generator: PairGenerator, counts: StepCounts, images: Path, bar: tqdm):
        self.store, self.generator, self.counts, self.images, self.bar = store, generator, counts, images, bar
        self.todo: list[tuple[str, dict[str, Any]]] = []

    def reject(self, rid: str, reason: str, detail: str) -> None:
        self.store.append({"id": rid, "status": "rejected", "reason": reason, "detail": detail[:300]})
        self.counts.rejected[reason] += 1
        self.bar.update(1)

    def flush(self) -> None:
        from namc.curate.edits.shapes import save_png  # writes a shapes scene chunk when an image carries one

        if not self.todo:
            return
        started = time.perf_counter()
        prompts = [(t["caption1"], t["caption2"]) for _, t in self.todo]
        try:
            results = self.generator.generate_pairs(prompts, [t["seed"] for _, t in self.todo])
        except BackendError:
            raise
        except Exception as err:  # noqa: BLE001 - a generator crash costs this batch, counted, not the run
            results = [GenerationFailed("error", f"{type(err).__name__}: {err}")] * len(self.todo)
        self.counts.timed("backend", started)
        truths = getattr(self.generator, "last_boxes", None)
        for k, ((rid, item), result) in enumerate(zip(self.todo, results, strict=True)):
            if isinstance(result, GenerationFailed):
                self.reject(rid, f"generator:{result.kind}", result.message)
                continue
            stem = file_stem(rid)
            for slot, image in zip(("1", "2"), result, strict=True):
                save_png(image, contained(self.images, f"{stem}_{slot}.png", f"pair id {rid!r}"))
            line = {"id": rid, "status": "ok", "source": "imgdiff", **item}
            line["image1"], line["image2"] = f"images/{stem}_1.png", f"images/{stem}_2.png"
            if truths is not None and k < len(truths):
                line["truth_boxes"] = [list(b) for b in truths[k]]
            self.store.append(line)  # the images are on disk before their line: a kill never leaves a line without
            self.counts.kept += 1
            self.bar.update(1)
        self.todo.clear()


def generate_pairs(
    replacements: Path,
    out: Path,
    generator: PairGenerator,
    counts: StepCounts,
    batch_size: int = 4,
    seed: int = 0,
    progress: bool = True,
) -> StepCounts:
    """Phase 2: renders every finished replacement not yet in ``out`` (see the module docstring)."""
    images = out.parent / "images"
    images.mkdir(parents=True, exist_ok=True)
    latest: dict[str, dict[str, Any]] = {}
    for _, r in iter_results(replacements):
        if r is not None:
            latest[r["id"]] = r  # the last line of an id wins
    with ResultStore(out) as store:
        bar = tqdm(total=len(latest), desc="replace (pairs)", unit="pair", disable=not progress, dynamic_ncols=True)
        writer = _PairWriter(store, generator, counts, images, bar)
        for rid, r in latest.items():
            counts.lines += 1
            if rid in store.done:
                counts.resumed += 1
                bar.update(1)
                continue
            if r.get("status") != "ok":
                writer.reject(rid, "request_failed", f"{r.get('error_kind')}: {r.get('error')}")
                continue
            caption = str(r.get("caption") or "")
            try:
                old, new, target = parse_replacement(str(r.get("text") or ""), caption)
            except AnswerError as err:
                writer.reject(rid, err.kind, str(err))
                continue
            item = {"caption1": caption, "caption2": target, "object1": old, "object2": new}
            writer.todo.append((rid, {**item, "seed": item_seed(rid, seed)}))
            if len(writer.todo) >= batch_size:
                writer.flush()
        writer.flush()
        bar.close()
    counts.extra["generator"] = generator.throughput.to_json()
    return counts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="namc curate replace",
        description="Img-Diff object replacement: an LLM swaps one object of each caption, a text-to-image backend "
        "renders both captions as a pair (resumable).",
    )
    add_config_arguments(p)
    p.add_argument(
        "--workdir", type=Path, default=None, help="output folder (replacements.jsonl, pairs.jsonl, images/)"
    )
    p.add_argument("--captions", type=Path, default=None, help="captions JSONL: {key|id, caption} per line")
    p.add_argument("--generator", type=mapping, default=None, help="the pair generator's section (YAML mapping)")
    p.add_argument("--batch-size", type=int, default=4, help="pairs per generator call")
    p.add_argument("--limit", type=int, default=None, help="stop after this many caption lines (a trial run)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_client_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    args = parse_with_config(build_parser(), argv, "replace")
    if args.captions is None or not args.captions.is_file():
        print(f"namc curate replace: error: captions file not found: {args.captions}", file=sys.stderr)
        return 2
    if args.batch_size < 1:
        print("namc curate replace: error: --batch-size must be >= 1", file=sys.stderr)
        return 2
    workdir = args.workdir or args.captions.parent
    section = args.generator if isinstance(args.generator, dict) else {"backend": "diffusers"}
    try:
        from namc.curate.edits.backends import build

        generator = build(section, "pairs")
        with output_lock(workdir, "namc curate replace"):
            llm = request_replacements(
                args.captions,
                workdir / "replacements.jsonl",
                client_config(args),
                args.limit,
                not args.quiet,
                args.seed,
            )
            counts = generate_pairs(
                workdir / "replacements.jsonl",
                workdir / "pairs.jsonl",
                generator,
                StepCounts(),
                args.batch_size,
                args.seed or 0,
                not args.quiet,
            )
            counts.check()
            write_summary(workdir / "pairs.jsonl", counts, llm=llm.to_dict())
    except (BackendError, ValueError, LockedError) as err:
        print(f"namc curate replace: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    print(llm.format())
    print(counts.format("replace"))
    print(f"pairs: {workdir / 'pairs.jsonl'}  (next: namc curate regions --workdir {workdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
