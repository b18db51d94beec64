"""``namc curate caption``: one fine-grained paragraph per image from a multimodal LLM server, stored by image key.

The instructions of appendix D.2 quote a fine-grained ``{caption}`` of each image. The paper takes CC3M's from
LLaVA-ReCap and has LLaVA write them for Spot-the-Diff and InstructPix2Pix images; for a source without them this
step asks the server (:data:`namc.curate.prompts.CAPTION_PROMPT`, ours) for one paragraph per image::

    namc curate caption --images work/corpus/images.jsonl --out work/corpus/captions.jsonl --base-url ...
    namc curate caption --pairs my_pairs.jsonl --out captions.jsonl      # the images of a pairs JSONL

Input: an image index (``{"key", "source", "image", "caption"?}`` per line, ``namc curate index``) or a pairs JSONL
(``key1``/``image1`` and ``key2``/``image2``; an image without a key is keyed by its reference). Images that already
have a caption are skipped (``--overwrite`` captions them anyway), and a key is captioned once.

Output: the results store ``captions.results.jsonl`` (resumable exactly like ``namc curate describe``'s: appended
per answer, a rerun skips finished keys, a torn last line is dropped) and, at the end of every run, ``--out``
rewritten atomically with the answered keys as ``{"key", "caption"}`` (the join format of the index step and of
``namc curate describe --captions``). Every image of the input is accounted for in the printed summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.describe import count_lines, image_key, summary_path
from namc.curate.prompts import CAPTION_PROMPT
from namc.data.refs import rebase_ref
from namc.jsonl import json_line
from namc.llm import (
    BadInput,
    Job,
    ResultStore,
    RunSummary,
    add_client_arguments,
    client_config,
    data_url,
    image_message,
    run_jobs,
)
from namc.llm.runner import read_jsonl_objects
from namc.llm.store import atomic_write_text, last_results, read_at
from namc.locks import LockedError, output_lock

__all__ = ["caption_jobs", "main", "write_captions"]

logger = logging.getLogger(__name__)


def _images(path: Path, summary: RunSummary, from_pairs: bool) -> Iterator[tuple[str, Any, str | None]]:
    """``(key, ref, existing caption)`` per image entry of the input (two per pairs line)."""
    id_field = "id" if from_pairs else "key"
    for _, obj in read_jsonl_objects(path, summary, id_field):
        if not from_pairs:
            yield obj["key"], obj.get("image"), obj.get("caption")
            continue
        summary.lines += 1  # a pairs line holds two images: count both
        for slot in ("1", "2"):
            yield image_key(obj, slot), obj.get("image" + slot), obj.get("caption" + slot)


def caption_jobs(
    path: Path,
    out_dir: Path,
    store: ResultStore,
    summary: RunSummary,
    from_pairs: bool = False,
    overwrite: bool = False,
    max_side: int | None = None,
) -> Iterator[Job]:
    """The images of ``path`` still to caption, as jobs; counts the others into ``summary``
    (``resumed``, ``skipped["has_caption"]``, ``skipped["repeated_key"]``: an image already listed)."""
    base = path.parent
    seen: set[str] = set()
    for key, ref, caption in _images(path, summary, from_pairs):
        if key in seen:
            summary.skipped["repeated_key"] += 1  # an image shared by several pairs
        elif not overwrite and isinstance(caption, str) and caption.strip():
            summary.skipped["has_caption"] += 1
        elif key in store.done:
            summary.resumed += 1
        else:
            fields = {"image": rebase_ref(ref, base, out_dir) if isinstance(ref, str) and ref.strip() else None}
            yield Job(key, _builder(ref, base, max_side), fields)
        seen.add(key)


def _builder(ref: Any, base: Path, max_side: int | None) -> Any:
    def build() -> list[dict[str, Any]]:
        if not isinstance(ref, str) or not ref.strip():
            raise BadInput("missing_field", "no image reference")
        return image_message(CAPTION_PROMPT, [data_url(ref, base, max_side)])

    return build


def write_captions(results: Path, out: Path) -> int:
    """Writes ``{"key", "caption"}`` for every answered, non-empty result (last line per key wins), atomically.
    Returns the number written."""
    where, _ = last_results(results, "key")
    n = 0
    partial = out.with_name(f".{out.name}.partial")
    with open(results, "rb") as f, open(partial, "w", encoding="utf-8") as dst:
        for key in where:
            r = read_at(f, where[key], "key")
            text = r.get("text")
            if r.get("status") == "ok" and isinstance(text, str) and text.strip():
                dst.write(json_line({"key": key, "caption": " ".join(text.split())}))
                n += 1
    os.replace(partial, out)
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="namc curate caption",
        description="One fine-grained caption paragraph per image from an OpenAI-compatible multimodal LLM server.",
    )
    add_config_arguments(p)
    p.add_argument("--workdir", type=Path, default=None, help="default folder of the files below")
    p.add_argument("--images", type=Path, default=None, help="image index JSONL (default WORKDIR/images.jsonl)")
    p.add_argument("--pairs", type=Path, default=None, help="caption the images of a pairs JSONL instead")
    p.add_argument(
        "--out", type=Path, default=None, help="captions JSONL {key, caption} (default WORKDIR/captions.jsonl)"
    )
    p.add_argument("--overwrite", action="store_true", help="caption images that already have a caption too")
    p.add_argument("--max-side", type=int, default=None, help="resize images whose longer side exceeds this")
    p.add_argument("--retry-failed", action="store_true", help="request the images recorded as failed again")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_client_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = parse_with_config(build_parser(), argv, "caption")
    source = args.pairs or args.images or (args.workdir / "images.jsonl" if args.workdir else None)
    if source is None or not source.is_file():
        print(f"namc curate caption: input not found: {source} (give --images or --pairs)", file=sys.stderr)
        return 2
    out = args.out or (args.workdir or source.parent) / "captions.jsonl"
    results = out.with_name(out.stem + ".results.jsonl")
    summary = RunSummary()
    try:
        # one run per output folder: two runs on one results file would send every request twice
        with output_lock(out.parent, "namc curate caption"):
            with ResultStore(results, id_field="key") as store:
                if args.retry_failed:
                    logger.info("retrying %d failed images", store.forget_failed())
                pairs = args.pairs is not None
                jobs = caption_jobs(source, out.parent, store, summary, pairs, args.overwrite, args.max_side)
                todo = max(0, count_lines(source, None) * (2 if pairs else 1) - len(store.done))  # ETA
                run_jobs(jobs, store, client_config(args), summary, todo, not args.quiet, "caption", args.seed)
            summary.check()
            n = write_captions(results, out)
            atomic_write_text(summary_path(out), json.dumps(summary.to_dict(), indent=2) + "\n")
    except LockedError as err:
        print(f"namc curate caption: error: {err}", file=sys.stderr)
        return 2
    print(summary.format())
    print(f"captions: {n} written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
