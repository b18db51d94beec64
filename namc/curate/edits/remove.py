"""``namc curate remove``: Img-Diff's object removal (``002``, section 19) -> exist-absent pairs and their red-box
multiple-choice questions.

For each image of ``pairs.jsonl`` (``namc curate replace``; its paired image tells where the objects are):

1. segmentation -> boxes; Image Similarity Filter: a box whose crops in this image and in the paired one have a
   similarity ``< object_sim`` (0.9, section 19.2.2) holds an object; the ``max_objects`` most different are kept
   (``no_object_box`` when none);
2. an :class:`~namc.curate.edits.base.Inpainter` (``inpainter:`` section; the paper: SDXL-turbo) repaints the box
   with :data:`~namc.curate.edits.prompts_imgdiff.REMOVAL_PROMPT` (``"background, nothing, 8k"``) -> the
   exist-absent pair (``removals.jsonl``, ``images/STEM_removed.png``; ``generator:KIND`` on a failure);
3. a multimodal LLM describes the object in the box, given its coordinates (``removal_captions.raw.jsonl``);
4. Image-Text Matching Filter: the crop with the object must match the description ``> exists`` (0.35) and the
   crop without it ``< absent`` (0.2) (``exists_mismatch`` / ``absent_match``; answer problems: ``empty_answer``,
   ``refusal``, ``malformed_answer``, ``request_failed``);
5. red boxes are drawn on both images, which are joined left and right with a 20-pixel black bar (section 18.1), the
   side of the original drawn from the item's seed; the question is Figure 10's.

Outputs: ``remove.jsonl`` (one line per item), ``questions.jsonl`` (Figure 10's format: ``{"id", "bbox" (fractions),
"conversations": [human, gpt], "path"}``) and ``choice.jsonl`` (``namc eval choice`` format: the two red-boxed images,
two candidate descriptions, the true one's index).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw
from tqdm.auto import tqdm

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.edits.base import BackendError, GenerationFailed, Inpainter
from namc.curate.edits.imgdiff_common import (
    ImageLoadError,
    StepCounts,
    file_stem,
    item_seed,
    load_image,
    mapping,
    png_data_url,
    write_summary,
)
from namc.curate.edits.prompts_imgdiff import (
    REMOVAL_DESCRIBE_PROMPT,
    REMOVAL_PROMPT,
    AnswerError,
    choice_question,
    clean_phrase,
)
from namc.curate.edits.tools import Matcher, Segmenter, Similarity, crop
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
from namc.paths import contained
from namc.text.template import rebuild

__all__ = ["ABSENT", "build_parser", "main", "make_removals", "red_box_pair", "remove_objects"]

logger = logging.getLogger(__name__)

ABSENT = "nothing in the red box"  # the half of a description for the image whose object was erased
BAR = 20  # section 18.1: "a vertical black dividing line, 20 pixels wide"


def _latest(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if path.exists():
        for _, r in iter_results(path):
            if r is not None:
                out[r["id"]] = r
    return out


def make_removals(
    pairs: Path,
    out: Path,
    similarity: Similarity,
    segmenter: Segmenter,
    inpainter: Inpainter,
    counts: StepCounts,
    object_sim: float = 0.9,
    max_objects: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> None:
    """Phases 1-2 of the module docstring: one line per (pair, image) not yet in ``out``."""
    from namc.curate.edits.shapes import save_png

    base, images_dir = pairs.parent, out.parent / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    summary = RunSummary()
    with ResultStore(out) as store:
        for _, pair in tqdm(
            list(read_jsonl_objects(pairs, summary, "id")), desc="remove (inpaint)", disable=not progress
        ):
            if pair.get("status", "ok") != "ok":
                continue
            for slot, other in (("1", "2"), ("2", "1")):
                iid = f"{pair['id']}_{slot}"
                counts.lines += 1
                if iid in store.done:
                    counts.resumed += 1
                    continue
                try:
                    image = load_image(pair.get("image" + slot), base, "image" + slot)
                    paired = load_image(pair.get("image" + other), base, "image" + other)
                except ImageLoadError as err:
                    store.append({"id": iid, "status": "rejected", "reason": err.kind, "detail": str(err)[:300]})
                    counts.rejected[err.kind] += 1
                    continue
                chosen = _object_boxes(image, paired, segmenter, similarity, object_sim, max_objects, counts)
                if not chosen:
                    store.append({"id": iid, "status": "rejected", "reason": "no_object_box"})
                    counts.rejected["no_object_box"] += 1
                    continue
                results = _erase(image, [b for _, b in chosen], inpainter, iid, seed, counts)
                lines = []
                for k, ((sim, box), result) in enumerate(zip(chosen, results, strict=True)):
                    rid = f"{iid}_{k}"
                    if isinstance(result, GenerationFailed):
                        lines.append({"id": rid, "status": "rejected", "reason": f"generator:{result.kind}"})
                        continue
                    save_png(result, contained(images_dir, f"{file_stem(rid)}_removed.png", f"pair id {rid!r}"))
                    lines.append(
                        {
                            "id": rid,
                            "status": "ok",
                            "pair": pair["id"],
                            "image": _rebase(pair["image" + slot], base, out.parent),
                            "removed": f"images/{file_stem(rid)}_removed.png",
                            "box": list(box),
                            "box_similarity": round(sim, 4),
                            "size": list(image.size),
                        }
                    )
                kept = [x for x in lines if x["status"] == "ok"]
                for x in lines:  # the item's lines are written last, so a kill never leaves half of them
                    store.append(x)
                store.append({"id": iid, "status": "ok", "items": len(kept)})
                if kept:
                    counts.kept += 1
                else:
                    counts.rejected[lines[0]["reason"]] += 1
    counts.skipped.update(summary.skipped)
    counts.lines += sum(summary.skipped.values())


def _object_boxes(
    image: Image.Image,
    paired: Image.Image,
    segmenter: Segmenter,
    similarity: Similarity,
    object_sim: float,
    max_objects: int,
    counts: StepCounts,
) -> list[tuple[float, tuple[int, int, int, int]]]:
    """``(crop similarity, box)`` of the ``max_objects`` boxes that differ most from the paired image (section
    19.2.2: below ``object_sim`` a box holds an object)."""
    started = time.perf_counter()
    boxes = [b for b, _ in segmenter.segment(image)] if image.size == paired.size else []
    counts.timed("segment", started)
    started = time.perf_counter()
    sims = similarity.image_similarity([crop(image, b) for b in boxes], [crop(paired, b) for b in boxes])
    counts.timed("filters", started)
    differ = sorted((s, b) for s, b in zip(sims, boxes, strict=True) if s < object_sim)
    counts.boxes["candidates"] += len(boxes)
    counts.boxes["same"] += len(boxes) - len(differ)
    return differ[:max_objects]


def _erase(
    image: Image.Image, boxes: Sequence[Sequence[int]], inpainter: Inpainter, iid: str, seed: int, counts: StepCounts
) -> list[Any]:
    """The inpainter's results for each box of ``image`` (a crash of the backend fails every box, counted)."""
    masks = []
    for x0, y0, x1, y1 in boxes:
        mask = Image.new("L", image.size, 0)
        ImageDraw.Draw(mask).rectangle([x0, y0, x1 - 1, y1 - 1], fill=255)
        masks.append(mask)
    started = time.perf_counter()
    try:
        seeds = [item_seed(f"{iid}_{k}", seed) for k in range(len(boxes))]
        results = inpainter.inpaint([image] * len(boxes), masks, [REMOVAL_PROMPT] * len(boxes), seeds)
    except BackendError:
        raise
    except Exception as err:  # noqa: BLE001 - a backend crash costs this image, counted
        results = [GenerationFailed("error", f"{type(err).__name__}: {err}")] * len(boxes)
    counts.timed("backend", started)
    return results


def _rebase(ref: str, base: Path, out_dir: Path) -> str:
    from namc.data.refs import rebase_ref

    return rebase_ref(ref, base, out_dir)


def _removal_items(removals: Path) -> Iterator[dict[str, Any]]:
    for rid, r in _latest(removals).items():
        if r.get("status") == "ok" and "box" in r:
            yield {**r, "id": rid}


def _describe_jobs(removals: Path, store: ResultStore, summary: RunSummary) -> Iterator[Job]:
    base = removals.parent
    for item in _removal_items(removals):
        summary.lines += 1
        if item["id"] in store.done:
            summary.resumed += 1
            continue
        w, h = item["size"]
        x0, y0, x1, y1 = item["box"]
        bbox = [round(x0 / w, 2), round(y0 / h, 2), round(x1 / w, 2), round(y1 / h, 2)]  # Figure 10's fractions

        def build(ref: str = item["image"], bbox: list[float] = bbox) -> list[dict[str, Any]]:
            try:
                image = load_image(ref, base, "image")
            except ImageLoadError as err:
                raise BadInput(err.kind, str(err)) from None
            return image_message(REMOVAL_DESCRIBE_PROMPT.format(bbox=bbox), [png_data_url(image)])

        yield Job(item["id"], build, {"bbox": bbox})


def red_box_pair(
    with_object: Image.Image, without: Image.Image, box: Sequence[int], left_has_object: bool
) -> Image.Image:
    """Both images with the red box, side by side with the 20-pixel black bar between them (section 18.1)."""
    width = max(2, round(max(with_object.size) / 100))
    drawn = []
    for im in (with_object, without):
        im = im.convert("RGB").copy()
        ImageDraw.Draw(im).rectangle([box[0], box[1], box[2] - 1, box[3] - 1], outline=(255, 0, 0), width=width)
        drawn.append(im)
    left, right = drawn if left_has_object else drawn[::-1]
    canvas = Image.new("RGB", (left.width + BAR + right.width, max(left.height, right.height)), (0, 0, 0))
    canvas.paste(left, (0, 0))
    canvas.paste(right, (left.width + BAR, 0))
    return canvas


def remove_objects(
    workdir: Path,
    matcher: Matcher,
    counts: StepCounts,
    exists: float = 0.35,
    absent: float = 0.2,
    seed: int = 0,
) -> int:
    """Phase 4-5: filters each described removal, writes ``remove.jsonl``, then the two question files; returns the
    number of questions."""
    removals, raw, results = (
        workdir / "removals.jsonl",
        workdir / "removal_captions.raw.jsonl",
        workdir / "remove.jsonl",
    )
    answers = _latest(raw)
    with ResultStore(results) as store:
        for item in _removal_items(removals):
            if item["id"] in store.done:
                continue
            r = answers.get(item["id"])
            try:
                if r is None or r.get("status") != "ok":
                    raise AnswerError("request_failed", str(r.get("error_kind") if r else "not requested"))
                description = clean_phrase(str(r.get("text") or ""))
            except AnswerError as err:
                store.append({"id": item["id"], "status": "rejected", "reason": err.kind})
                counts.boxes[err.kind] += 1
                continue
            try:
                image = load_image(item["image"], workdir, "image")
                removed = load_image(item["removed"], workdir, "removed")
            except ImageLoadError as err:  # a file removed between the phases
                store.append({"id": item["id"], "status": "rejected", "reason": err.kind, "detail": str(err)[:300]})
                counts.boxes[err.kind] += 1
                continue
            started = time.perf_counter()
            m_with, m_without = matcher.match([crop(image, item["box"]), crop(removed, item["box"])], [description] * 2)
            counts.timed("filters", started)
            reason = "exists_mismatch" if m_with <= exists else "absent_match" if m_without >= absent else None
            if reason is not None:
                store.append({"id": item["id"], "status": "rejected", "reason": reason, "match": [m_with, m_without]})
                counts.boxes[reason] += 1
                continue
            left = random.Random(item_seed(item["id"], seed)).random() < 0.5
            stem = file_stem(item["id"])
            path = f"images/{stem}_choice.png"
            red_box_pair(image, removed, item["box"], left).save(workdir / path)
            boxed = []
            for name, im in (("with", image), ("without", removed)):
                boxed_path = f"images/{stem}_{name}_box.png"
                red_box_pair(im, im, item["box"], True).crop((0, 0, *im.size)).save(workdir / boxed_path)
                boxed.append(boxed_path)
            store.append(
                {
                    "id": item["id"],
                    "status": "ok",
                    "description": description,
                    "box": item["box"],
                    "bbox": answers[item["id"]].get("bbox"),
                    "path": path,
                    "answer": "A" if left else "B",
                    "boxed": boxed,
                    "match": [round(m_with, 4), round(m_without, 4)],
                }
            )
            counts.boxes["kept"] += 1
    return _write_questions(results, workdir)


def _write_questions(results: Path, workdir: Path) -> int:
    latest = _latest(results)
    questions, choice = workdir / "questions.jsonl", workdir / "choice.jsonl"
    n = 0
    with (
        open(questions.with_name(".questions.jsonl.partial"), "w", encoding="utf-8") as q,
        open(choice.with_name(".choice.jsonl.partial"), "w", encoding="utf-8") as c,
    ):
        for rid in sorted(latest):
            r = latest[rid]
            if r.get("status") != "ok":
                continue
            conversation = [
                {"from": "human", "value": choice_question(r["description"] + ".")},
                {"from": "gpt", "value": r["answer"]},
            ]
            q.write(json_line({"id": rid, "bbox": r["bbox"], "conversations": conversation, "path": r["path"]}))
            true = rebuild("shows", r["description"], "shows", ABSENT)
            swapped = rebuild("shows", ABSENT, "shows", r["description"])
            c.write(
                json_line(
                    {
                        "id": rid,
                        "image1": r["boxed"][0],
                        "image2": r["boxed"][1],
                        "candidates": [true, swapped],
                        "answer": 0,
                        "category": "object_removal",
                    }
                )
            )
            n += 1
    os.replace(questions.with_name(".questions.jsonl.partial"), questions)
    os.replace(choice.with_name(".choice.jsonl.partial"), choice)
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="namc curate remove",
        description="Img-Diff object removal: erase an object by inpainting, describe it, filter, and write red-box "
        "multiple-choice questions (resumable).",
    )
    add_config_arguments(p)
    p.add_argument("--workdir", type=Path, default=None, help="folder of pairs.jsonl and of the outputs")
    p.add_argument("--pairs", type=Path, default=None, help="pairs JSONL (default WORKDIR/pairs.jsonl)")
    p.add_argument("--tools", type=mapping, default={}, help="similarity / matcher / segmenter section (YAML mapping)")
    p.add_argument("--inpainter", type=mapping, default=None, help="the inpainting backend's section (YAML mapping)")
    p.add_argument("--object-sim", type=float, default=0.9, help="crops below this similarity hold an object (19.2.2)")
    p.add_argument("--exists", type=float, default=0.35, help="the crop with the object must match above this")
    p.add_argument("--absent", type=float, default=0.2, help="the crop without it must match below this")
    p.add_argument("--max-objects", type=int, default=1, help="objects erased per image, most different first")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_client_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from namc.curate.edits.backends import build
    from namc.curate.edits.tools import build_matcher, build_segmenter, build_similarity, check_tools

    configure_logging()
    args = parse_with_config(build_parser(), argv, "remove")
    pairs = args.pairs or (args.workdir / "pairs.jsonl" if args.workdir else None)
    if pairs is None or not pairs.is_file():
        print(f"namc curate remove: error: pairs file not found: {pairs}", file=sys.stderr)
        return 2
    workdir = args.workdir or pairs.parent
    try:
        for name in ("object_sim", "exists", "absent"):
            if not 0 <= getattr(args, name) <= 1:
                raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")
        if args.max_objects < 1:
            raise ValueError("--max-objects must be >= 1")
        tools = dict(args.tools)
        check_tools(tools)
        similarity, matcher = build_similarity(tools), build_matcher(tools)
        segmenter = build_segmenter(tools)
        inpainter = build(args.inpainter or {"backend": "diffusers"}, "inpaint")
        counts = StepCounts()
        llm = RunSummary()
        with output_lock(workdir, "namc curate remove"):
            make_removals(
                pairs,
                workdir / "removals.jsonl",
                similarity,
                segmenter,
                inpainter,
                counts,
                args.object_sim,
                args.max_objects,
                args.seed or 0,
                not args.quiet,
            )
            with ResultStore(workdir / "removal_captions.raw.jsonl") as store:
                run_jobs(
                    _describe_jobs(workdir / "removals.jsonl", store, llm),
                    store,
                    client_config(args),
                    llm,
                    progress=not args.quiet,
                    desc="remove (MLLM)",
                    seed=args.seed,
                )
            n = remove_objects(workdir, matcher, counts, args.exists, args.absent, args.seed or 0)
            counts.check()
            counts.extra["questions"] = n
            counts.extra["inpainter"] = inpainter.throughput.to_json()
            write_summary(workdir / "remove.jsonl", counts, llm=llm.to_dict())
    except (BackendError, ValueError, LockedError) as err:
        print(f"namc curate remove: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    print(llm.format())
    print(counts.format("remove"))
    print(f"questions: {workdir / 'questions.jsonl'} and {workdir / 'choice.jsonl'} ({n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
