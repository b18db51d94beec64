"""``namc curate region-captions``: Img-Diff's Difference Captions Generator (``002``, section 3.4 and 18.4) -> a
namc pre-training corpus.

For every pair of ``regions.jsonl`` (``namc curate regions``), boxes most different first (at most ``max_boxes``):

1. a multimodal LLM captions the box's crop in each image (one request per crop, any OpenAI-compatible server;
   :data:`~namc.curate.edits.prompts_imgdiff.REGION_CAPTION_PROMPT`); answers go to ``region_captions.raw.jsonl``
   (resumable, failures recorded by kind);
2. Captions Image-Text Matching Filter: each crop must match its own caption with a score ``> citm`` (0.4);
3. Captions Similarity Filter: the two captions must differ, text similarity ``< cs`` (0.85);
4. the first box that passes gives the pair's description, the implicit-change template filled with the two
   region captions (``"The difference between the two images is that the first image shows CAPTION1, while the
   second image shows CAPTION2."``), so NIM and MIR train on it unchanged.

Per-box drops are counted by reason (``request_failed``, ``empty_answer``, ``refusal``, ``malformed_answer``,
``caption_mismatch``, ``captions_same``, ``bad_template``); a pair without a surviving box is rejected
(``no_caption``). ``region_captions.jsonl`` holds one line per pair; ``manifest.jsonl`` (rewritten atomically,
sorted by id) is the corpus in :mod:`namc.data.corpus.records` format, each line with its ``box`` (pixels of image
1), all ``boxes`` and both ``captions`` as metadata: ``namc data pack`` / ``namc fit`` read it as any corpus.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.edits.base import BackendError
from namc.curate.edits.imgdiff_common import StepCounts, load_image, mapping, png_data_url, write_summary
from namc.curate.edits.prompts_imgdiff import DIFFERENCE_PROMPT, REGION_CAPTION_PROMPT, AnswerError, clean_phrase
from namc.curate.edits.tools import Matcher, Similarity, crop
from namc.data.corpus.records import RecordError, parse_record
from namc.data.refs import rebase_ref
from namc.jsonl import json_line
from namc.llm import (
    BadInput,
    Job,
    ResultStore,
    RunSummary,
    add_client_arguments,
    client_config,
    configure_logging,
    image_message,
    run_jobs,
)
from namc.llm.runner import read_jsonl_objects
from namc.llm.store import iter_results
from namc.locks import LockedError, output_lock
from namc.text.template import TemplateError, rebuild

__all__ = ["CaptionThresholds", "build_parser", "caption_jobs", "choose_captions", "main", "write_corpus"]

logger = logging.getLogger(__name__)

VERB = "shows"  # appendix D.2's first verb: both halves read "the first image shows ..."


@dataclass(frozen=True)
class CaptionThresholds:
    """Stage-1 filters of the Difference Captions Generator; defaults: Table 17's settings (3)."""

    citm: float = 0.4  # a crop matches its caption above this
    cs: float = 0.85  # two captions below this text similarity differ

    def __post_init__(self) -> None:
        if not 0 <= self.citm <= 1 or not -1 <= self.cs <= 1:
            raise ValueError(f"citm must be in [0, 1] and cs in [-1, 1], got {self.citm}, {self.cs}")


def _job_id(pair_id: str, k: int, slot: str) -> str:
    return f"{pair_id}#{k}#{slot}"


def _ok_pairs(regions: Path, summary: RunSummary) -> Iterator[dict[str, Any]]:
    """The kept pairs of a regions file, each once (the last line of an id wins, as in the results store)."""
    latest: dict[str, dict[str, Any]] = {}
    for _, pair in read_jsonl_objects(regions, summary, "id", unique=False):
        latest.pop(pair["id"], None)
        latest[pair["id"]] = pair
    for pair in latest.values():
        if pair.get("status") == "ok" and isinstance(pair.get("boxes"), list) and pair["boxes"]:
            yield pair


def caption_jobs(regions: Path, store: ResultStore, summary: RunSummary, max_boxes: int) -> Iterator[Job]:
    """One request per (pair, box, image) not yet answered in ``store``."""
    base = regions.parent
    for pair in _ok_pairs(regions, summary):
        for k, box in enumerate(pair["boxes"][:max_boxes]):
            for slot in ("1", "2"):
                jid = _job_id(pair["id"], k, slot)
                if jid in store.done:
                    summary.resumed += 1
                    continue
                yield Job(jid, _builder(pair.get("image" + slot), base, box, slot), {"pair": pair["id"], "box": k})


def _builder(ref: Any, base: Path, box: Any, slot: str) -> Any:
    def build() -> list[dict[str, Any]]:
        from namc.curate.edits.imgdiff_common import ImageLoadError

        try:
            image = load_image(ref, base, "image" + slot)
        except ImageLoadError as err:
            raise BadInput(err.kind, str(err)) from None
        return image_message(REGION_CAPTION_PROMPT, [png_data_url(crop(image, box))])

    return build


def _answers(raw: Path) -> dict[str, dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for _, r in iter_results(raw):
        if r is not None:
            latest[r["id"]] = r
    return latest


def choose_captions(
    pair: dict[str, Any],
    answers: dict[str, dict[str, Any]],
    base: Path,
    similarity: Similarity,
    matcher: Matcher,
    th: CaptionThresholds,
    counts: StepCounts,
    max_boxes: int,
) -> dict[str, Any] | None:
    """The first box of ``pair`` whose two captions pass both filters, as the fields of a corpus line; None when no
    box does (drops counted in ``counts.boxes``)."""
    image1 = image2 = None
    for k, box in enumerate(pair["boxes"][:max_boxes]):
        captions = []
        for slot in ("1", "2"):
            r = answers.get(_job_id(pair["id"], k, slot))
            if r is None or r.get("status") != "ok":
                captions.append(AnswerError("request_failed", str(r.get("error_kind") if r else "not requested")))
                continue
            try:
                captions.append(clean_phrase(str(r.get("text") or "")))
            except AnswerError as err:
                captions.append(err)
        bad = next((c for c in captions if isinstance(c, AnswerError)), None)
        if bad is not None:
            counts.boxes[bad.kind] += 1
            continue
        c1, c2 = captions  # type: ignore[misc]
        if image1 is None:
            image1 = load_image(pair["image1"], base, "image1")
            image2 = load_image(pair["image2"], base, "image2")
        started = time.perf_counter()
        m1, m2 = matcher.match([crop(image1, box), crop(image2, box)], [c1, c2])
        (sim,) = similarity.text_similarity([c1], [c2])
        counts.timed("filters", started)
        if not (m1 > th.citm and m2 > th.citm):
            counts.boxes["caption_mismatch"] += 1
            continue
        if sim >= th.cs:
            counts.boxes["captions_same"] += 1
            continue
        try:
            description = rebuild(VERB, c1, VERB, c2)
        except (TemplateError, ValueError):
            counts.boxes["bad_template"] += 1
            continue
        counts.boxes["kept"] += 1
        return {
            "description": description,
            "box": list(box),
            "captions": [c1, c2],
            "caption_match": [round(m1, 4), round(m2, 4)],
            "caption_similarity": round(sim, 4),
        }
    return None


def write_corpus(results: Path, manifest: Path, differences: dict[str, str] | None = None) -> int:
    """Rewrites ``manifest`` (atomically, sorted by id) from the kept lines of ``results``, with each pair's
    ``difference`` sentence where ``differences`` has one; returns the number of lines."""
    differences = differences or {}
    latest: dict[str, dict[str, Any]] = {}
    for _, r in iter_results(results):
        if r is not None:
            latest[r["id"]] = r
    partial = manifest.with_name(f".{manifest.name}.partial")
    n = 0
    with open(partial, "w", encoding="utf-8") as f:
        for pid in sorted(latest):
            r = latest[pid]
            if r.get("status") != "ok":
                continue
            try:
                record = parse_record(r)
            except RecordError as err:
                logger.warning("%s: %s: %s (left out)", results, pid, err)
                continue
            meta = {k: r[k] for k in ("box", "boxes", "captions", "caption1", "caption2") if k in r}
            if pid in differences:
                meta["difference"] = differences[pid]
            f.write(json_line({**record.to_json(), **meta}))
            n += 1
    os.replace(partial, manifest)
    return n


def caption_regions(
    regions: Path,
    workdir: Path,
    config: Any,
    similarity: Similarity,
    matcher: Matcher,
    th: CaptionThresholds,
    max_boxes: int = 3,
    progress: bool = True,
    seed: int | None = 0,
    difference_captions: bool = True,
) -> tuple[StepCounts, RunSummary]:
    """Both phases and the corpus (module docstring); returns the step's counts and the requests' summary."""
    raw, results = workdir / "region_captions.raw.jsonl", workdir / "region_captions.jsonl"
    llm = RunSummary()
    with ResultStore(raw) as store:
        run_jobs(
            caption_jobs(regions, store, llm, max_boxes),
            store,
            config,
            llm,
            progress=progress,
            desc="region-captions (MLLM)",
            seed=seed,
        )
    answers = _answers(raw)
    counts = StepCounts()
    base, out_dir = regions.parent, results.parent
    seen = RunSummary()
    with ResultStore(results) as store:
        for pair in tqdm(list(_ok_pairs(regions, seen)), desc="region-captions (filters)", disable=not progress):
            counts.lines += 1
            if pair["id"] in store.done:
                counts.resumed += 1
                continue
            try:
                chosen = choose_captions(pair, answers, base, similarity, matcher, th, counts, max_boxes)
            except Exception as err:  # noqa: BLE001 - an unreadable image costs this pair, counted
                kind = getattr(err, "kind", "bad_input")
                store.append({"id": pair["id"], "status": "rejected", "reason": kind, "detail": str(err)[:300]})
                counts.rejected[kind] += 1
                continue
            if chosen is None:
                store.append({"id": pair["id"], "status": "rejected", "reason": "no_caption"})
                counts.rejected["no_caption"] += 1
                continue
            line = {"id": pair["id"], "status": "ok", "source": str(pair.get("source") or "imgdiff"), **chosen}
            line["image1"], line["image2"] = (rebase_ref(pair[k], base, out_dir) for k in ("image1", "image2"))
            line["boxes"] = pair["boxes"]
            store.append(line)
            counts.kept += 1
    differences: dict[str, str] = {}
    if difference_captions:
        differences = _differences(results, workdir, config, counts, progress, seed)
    counts.extra["corpus"] = write_corpus(results, workdir / "manifest.jsonl", differences)
    return counts, llm


def _differences(
    results: Path, workdir: Path, config: Any, counts: StepCounts, progress: bool, seed: int | None
) -> dict[str, str]:
    """Stage 2: one difference sentence per kept pair (module docstring); ``{pair id: sentence}``."""
    raw = workdir / "region_differences.raw.jsonl"
    llm = RunSummary()
    kept = {pid: r for pid, r in _answers(results).items() if r.get("status") == "ok"}
    with ResultStore(raw) as store:

        def jobs() -> Iterator[Job]:
            for pid, r in kept.items():
                llm.lines += 1
                if pid in store.done:
                    llm.resumed += 1
                    continue
                yield Job(pid, _difference_builder(r, workdir), {})

        run_jobs(jobs(), store, config, llm, progress=progress, desc="region-captions (differences)", seed=seed)
    out: dict[str, str] = {}
    for pid, r in _answers(raw).items():
        if pid not in kept:
            continue
        if r.get("status") != "ok":
            counts.boxes["difference_failed"] += 1
            continue
        try:
            out[pid] = clean_phrase(str(r.get("text") or ""), max_words=80)
        except AnswerError as err:
            counts.boxes["difference_" + err.kind] += 1
    counts.extra["differences"] = len(out)
    counts.extra["llm_differences"] = llm.to_dict()
    return out


def _difference_builder(line: dict[str, Any], base: Path) -> Any:
    def build() -> list[dict[str, Any]]:
        from namc.curate.edits.imgdiff_common import ImageLoadError

        try:
            images = [load_image(line[k], base, k) for k in ("image1", "image2")]
        except ImageLoadError as err:
            raise BadInput(err.kind, str(err)) from None
        w, h = images[0].size
        x0, y0, x1, y1 = line["box"]
        bbox = [round(x0 / w, 2), round(y0 / h, 2), round(x1 / w, 2), round(y1 / h, 2)]
        c1, c2 = line["captions"]
        text = DIFFERENCE_PROMPT.format(bbox=bbox, caption1=c1, caption2=c2)
        return image_message(text, [png_data_url(im) for im in images])

    return build


def build_parser() -> argparse.ArgumentParser:
    d = CaptionThresholds()
    p = argparse.ArgumentParser(
        prog="namc curate region-captions",
        description="Img-Diff's Difference Captions Generator: caption each difference box in both images, filter, "
        "and write the corpus manifest (resumable).",
    )
    add_config_arguments(p)
    p.add_argument("--workdir", type=Path, default=None, help="folder of regions.jsonl and of the outputs")
    p.add_argument("--regions", type=Path, default=None, help="regions JSONL (default WORKDIR/regions.jsonl)")
    p.add_argument("--tools", type=mapping, default={}, help="similarity / matcher section (YAML mapping)")
    p.add_argument("--citm", type=float, default=d.citm, help="caption image-text matching above this keeps a box")
    p.add_argument("--cs", type=float, default=d.cs, help="caption text similarity below this: the captions differ")
    p.add_argument("--max-boxes", type=int, default=3, help="boxes captioned per pair, most different first")
    p.add_argument(
        "--difference-captions",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stage 2: one difference sentence per kept pair from the MLLM (the manifest's 'difference')",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_client_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from namc.curate.edits.tools import build_matcher, build_similarity, check_tools

    configure_logging()
    args = parse_with_config(build_parser(), argv, "region-captions")
    regions = args.regions or (args.workdir / "regions.jsonl" if args.workdir else None)
    if regions is None or not regions.is_file():
        print(f"namc curate region-captions: error: regions file not found: {regions}", file=sys.stderr)
        return 2
    workdir = args.workdir or regions.parent
    try:
        if args.max_boxes < 1:
            raise ValueError("--max-boxes must be >= 1")
        th = CaptionThresholds(args.citm, args.cs)
        check_tools(args.tools)
        similarity, matcher = build_similarity(args.tools), build_matcher(args.tools)
        with output_lock(workdir, "namc curate region-captions"):
            counts, llm = caption_regions(
                regions,
                workdir,
                client_config(args),
                similarity,
                matcher,
                th,
                args.max_boxes,
                not args.quiet,
                args.seed,
                args.difference_captions,
            )
            counts.check()
            write_summary(workdir / "region_captions.jsonl", counts, llm=llm.to_dict(), thresholds=vars(th))
    except (BackendError, ValueError, LockedError) as err:
        print(f"namc curate region-captions: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    print(llm.format())
    print(counts.format("region-captions"))
    print(f"corpus: {workdir / 'manifest.jsonl'} ({counts.extra['corpus']} pairs; next: namc data pack / namc fit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
