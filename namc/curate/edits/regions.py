"""``namc curate regions``: Img-Diff's Difference Area Generator (``002``, section 3.3 and section 18.4).

For every pair of ``pairs.jsonl`` (``namc curate replace``'s output, or any pairs JSONL with ``image1``/``image2``
and optionally the replaced object names ``object1``/``object2``):

1. Image Similarity Filter: the pair's similarity must lie in ``[is_min, is_max]`` (default [0.9, 0.98], Table 17's
   settings (3)): highly similar but not identical (``pair_too_different`` / ``pair_too_similar``);
2. segmentation of both images (``segmenter: sam``, conf 0.05 and IoU 0.5) -> candidate boxes;
3. Difference Detector: a box whose two crops have similarity ``>= box_sim`` (0.85) shows no difference
   (``boxes: same``);
4. Image-Text Matching Filter: a box holds a valid object when a crop matches its image's object name with a
   score ``> bitm`` (0.35) (``boxes: no_object``; skipped for pairs without object names);
5. IoU de-duplication: of boxes overlapping with IoU ``> iou`` (0.5), the most different (lowest crop similarity)
   is kept.

A line: ``{"id", "status": "ok", ...the pair's fields, "boxes": [[x0, y0, x1, y1], ...], "box_similarity": [...],
"box_match": [...], "pair_similarity"}`` (boxes most different first; pixels of image 1, ends exclusive) or
``{"id", "status": "rejected", "reason"}`` with the reasons above, ``no_region``, or the image's
``missing_image`` / ``corrupt_image`` / ``oversized_image`` / ``size_mismatch``.

Tools (:mod:`namc.curate.edits.tools`): ``similarity: clip | pixels``, ``matcher: blip | shapes``,
``segmenter: sam | foreground``. Next: ``namc curate region-captions``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.edits.base import BackendError
from namc.curate.edits.imgdiff_common import ImageLoadError, StepCounts, load_image, mapping, write_summary
from namc.curate.edits.tools import Box, Matcher, Segmenter, Similarity, crop, nms
from namc.data.refs import rebase_ref
from namc.llm import ResultStore, RunSummary
from namc.llm.runner import read_jsonl_objects
from namc.locks import LockedError, output_lock

__all__ = ["RegionThresholds", "build_parser", "difference_boxes", "find_regions", "main"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegionThresholds:
    """The Difference Area Generator's thresholds; defaults: Table 17's settings (3), section 18.4."""

    is_min: float = 0.9  # pair similarity band (IS 0.9-0.98)
    is_max: float = 0.98
    conf: float = 0.05  # segmentation confidence
    iou: float = 0.5  # segmentation NMS and box de-duplication
    box_sim: float = 0.85  # crops with similarity below this differ
    bitm: float = 0.35  # a crop matching its object name above this holds a valid object

    def __post_init__(self) -> None:
        if not -1 <= self.is_min <= self.is_max <= 1:
            raise ValueError(f"need -1 <= is_min <= is_max <= 1, got {self.is_min}, {self.is_max}")
        for name in ("conf", "iou", "box_sim", "bitm"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


def difference_boxes(
    image1: Any,
    image2: Any,
    candidates: Sequence[Box],
    similarity: Similarity,
    matcher: Matcher | None,
    names: tuple[str, str] | None,
    th: RegionThresholds,
    counts: StepCounts,
) -> list[tuple[Box, float, float]]:
    """Steps 3-5 of the module docstring: ``(box, crop similarity, match score)`` of the kept boxes, most
    different first; drops are counted in ``counts.boxes`` by reason."""
    if not candidates:
        return []
    crops1 = [crop(image1, b) for b in candidates]
    crops2 = [crop(image2, b) for b in candidates]
    sims = similarity.image_similarity(crops1, crops2)
    differ = [i for i, s in enumerate(sims) if s < th.box_sim]
    counts.boxes["same"] += len(candidates) - len(differ)
    scores = [1.0] * len(candidates)
    if matcher is not None and names is not None and differ:
        m1 = matcher.match([crops1[i] for i in differ], [names[0]] * len(differ))
        m2 = matcher.match([crops2[i] for i in differ], [names[1]] * len(differ))
        for i, a, b in zip(differ, m1, m2, strict=True):
            scores[i] = max(a, b)
        valid = [i for i in differ if scores[i] > th.bitm]
        counts.boxes["no_object"] += len(differ) - len(valid)
        differ = valid
    kept = nms([candidates[i] for i in differ], [1.0 - sims[i] for i in differ], th.iou)
    counts.boxes["duplicate"] += len(differ) - len(kept)
    counts.boxes["kept"] += len(kept)
    return [(candidates[differ[k]], float(sims[differ[k]]), float(scores[differ[k]])) for k in kept]


def find_regions(
    pairs: Path,
    out: Path,
    similarity: Similarity,
    segmenter: Segmenter,
    matcher: Matcher | None,
    th: RegionThresholds,
    counts: StepCounts,
    progress: bool = True,
    limit: int | None = None,
) -> StepCounts:
    """Runs the Difference Area Generator over every pair of ``pairs`` not yet in ``out``."""
    base, out_dir = pairs.parent, out.parent
    summary = RunSummary()
    with ResultStore(out) as store:
        bar = tqdm(desc="regions", unit="pair", disable=not progress, dynamic_ncols=True)
        for _, pair in read_jsonl_objects(pairs, summary, "id"):
            bar.update(1)
            if limit is not None and summary.lines > limit:
                break
            pid = pair["id"]
            if pair.get("status", "ok") != "ok":
                continue  # a rejected line of an earlier step is no pair: not counted here
            counts.lines += 1
            if pid in store.done:
                counts.resumed += 1
                continue
            reason, line = _one(pair, base, out_dir, similarity, segmenter, matcher, th, counts)
            if reason is not None:
                store.append({"id": pid, "status": "rejected", "reason": reason, **line})
                counts.rejected[reason] += 1
            else:
                store.append({**pair, **line, "id": pid, "status": "ok"})
                counts.kept += 1
        bar.close()
    counts.skipped.update(summary.skipped)
    counts.lines += sum(summary.skipped.values())
    return counts


def _one(
    pair: dict[str, Any],
    base: Path,
    out_dir: Path,
    similarity: Similarity,
    segmenter: Segmenter,
    matcher: Matcher | None,
    th: RegionThresholds,
    counts: StepCounts,
) -> tuple[str | None, dict[str, Any]]:
    try:
        image1 = load_image(pair.get("image1"), base, "image1")
        image2 = load_image(pair.get("image2"), base, "image2")
    except ImageLoadError as err:
        return err.kind, {"detail": str(err)[:300]}
    if image1.size != image2.size:
        return "size_mismatch", {"detail": f"{image1.size} vs {image2.size}"}
    started = time.perf_counter()
    (pair_sim,) = similarity.image_similarity([image1], [image2])
    counts.timed("similarity", started)
    if pair_sim < th.is_min:
        return "pair_too_different", {"pair_similarity": pair_sim}
    if pair_sim > th.is_max:
        return "pair_too_similar", {"pair_similarity": pair_sim}
    started = time.perf_counter()
    candidates = [b for b, _ in segmenter.segment(image1)] + [b for b, _ in segmenter.segment(image2)]
    counts.timed("segment", started)
    counts.boxes["candidates"] += len(candidates)
    names = None
    if isinstance(pair.get("object1"), str) and isinstance(pair.get("object2"), str):
        names = (pair["object1"], pair["object2"])
    started = time.perf_counter()
    kept = difference_boxes(image1, image2, candidates, similarity, matcher, names, th, counts)
    counts.timed("filters", started)
    line: dict[str, Any] = {"pair_similarity": pair_sim}
    if not kept:
        return "no_region", line
    line["boxes"] = [list(b) for b, _, _ in kept]
    line["box_similarity"] = [round(s, 4) for _, s, _ in kept]
    line["box_match"] = [round(m, 4) for _, _, m in kept]
    line["image1"], line["image2"] = (rebase_ref(pair[k], base, out_dir) for k in ("image1", "image2"))
    return None, line


def build_parser() -> argparse.ArgumentParser:
    d = RegionThresholds()
    p = argparse.ArgumentParser(
        prog="namc curate regions",
        description="Img-Diff's Difference Area Generator: the boxes where each pair differs (resumable).",
    )
    add_config_arguments(p)
    p.add_argument("--workdir", type=Path, default=None, help="folder of pairs.jsonl and of the output")
    p.add_argument("--pairs", type=Path, default=None, help="pairs JSONL (default WORKDIR/pairs.jsonl)")
    p.add_argument("--out", type=Path, default=None, help="results JSONL (default WORKDIR/regions.jsonl)")
    p.add_argument("--tools", type=mapping, default={}, help="similarity / matcher / segmenter section (YAML mapping)")
    p.add_argument("--is-min", type=float, default=d.is_min, help="pair similarity band, low end (IS, Table 17)")
    p.add_argument("--is-max", type=float, default=d.is_max, help="pair similarity band, high end")
    p.add_argument("--conf", type=float, default=d.conf, help="segmentation confidence (section 18.4)")
    p.add_argument("--iou", type=float, default=d.iou, help="segmentation NMS and box de-duplication IoU")
    p.add_argument("--box-sim", type=float, default=d.box_sim, help="crops below this similarity differ")
    p.add_argument("--bitm", type=float, default=d.bitm, help="box image-text matching above this = valid object")
    p.add_argument("--limit", type=int, default=None, help="stop after this many pairs lines")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from namc.curate.edits.tools import build_matcher, build_segmenter, build_similarity, check_tools

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_with_config(build_parser(), argv, "regions")
    pairs = args.pairs or (args.workdir / "pairs.jsonl" if args.workdir else None)
    if pairs is None or not pairs.is_file():
        print(f"namc curate regions: error: pairs file not found: {pairs}", file=sys.stderr)
        return 2
    out = args.out or (args.workdir or pairs.parent) / "regions.jsonl"
    try:
        th = RegionThresholds(args.is_min, args.is_max, args.conf, args.iou, args.box_sim, args.bitm)
        tools = dict(args.tools)
        check_tools(tools)
        similarity = build_similarity(tools)
        segmenter = build_segmenter(tools, th.conf, th.iou)
        matcher = build_matcher(tools) if tools.get("matcher", "blip") != "none" else None
        with output_lock(out.parent, "namc curate regions"):
            counts = find_regions(
                pairs, out, similarity, segmenter, matcher, th, StepCounts(), not args.quiet, args.limit
            )
            counts.check()
            write_summary(out, counts, thresholds=vars(th))
    except (BackendError, ValueError, LockedError) as err:
        print(f"namc curate regions: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    print(counts.format("regions"))
    print(f"regions: {out}  (next: namc curate region-captions --workdir {out.parent})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
