"""The Img-Diff engine end to end on the shapes world, where every changed box is known exactly.

The shapes stand-ins play the image models (:mod:`namc.curate.edits.shapes`: the pair generator and the inpainter),
the model-free region tools play CLIP / BLIP / SAM (``similarity: pixels``, ``matcher: shapes``, ``segmenter:
foreground``), and the local chat server of ``tests/llm_server.py`` answers as a careful MLLM would
(``tests/imgdiff_helpers.py``: an object replacement, a crop's colour). The four steps run through their
command-line entry points (``namc curate replace | regions | region-captions | remove``), then namc_tiny pre-trains
a few steps on the corpus they wrote. Reported, never asserted:

- items per second of each stage on this CPU (the generator's and the steps' own time, the LLM phases apart);
- the rejections of every filter, by reason (pairs and boxes);
- the precision of ``regions`` against the known boxes (a found box is right when its IoU with a changed object's
  box is at least 0.5) and its recall over the pairs it kept;
- the corpus and question counts and the pre-training loss::

    python benchmarks/bench_imgdiff_shapes.py --captions 200 \\
        --out benchmarks/results/epyc-avx2-imgdiff-shapes/run1.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from imgdiff_helpers import shapes_answer  # noqa: E402
from llm_server import LLMServer  # noqa: E402

from namc.curate.edits import region_captions, regions, remove, replace, shapes  # noqa: E402
from namc.curate.edits.tools import box_iou  # noqa: E402

TOOLS = "{similarity: pixels, matcher: shapes, segmenter: foreground}"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _summary(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def region_precision(work: Path) -> dict[str, Any]:
    """Precision of the kept boxes against the known changed boxes, and recall over the kept pairs."""
    found = right = truths = hit = 0
    for line in _lines(work / "regions.jsonl"):
        if line.get("status") != "ok":
            continue
        boxes, truth = line["boxes"], line["truth_boxes"]
        found += len(boxes)
        right += sum(any(box_iou(b, t) >= 0.5 for t in truth) for b in boxes)
        truths += len(truth)
        hit += sum(any(box_iou(b, t) >= 0.5 for b in boxes) for t in truth)
    return {
        "boxes_found": found,
        "boxes_right": right,
        "precision": right / found if found else None,
        "truth_boxes": truths,
        "recall": hit / truths if truths else None,
    }


def pretrain(manifest: Path, steps: int, work: Path) -> dict[str, Any]:
    import lightning.pytorch as pl

    from namc.lit import PretrainModule
    from namc.lit.datamodules import CorpusDataModule

    pl.seed_everything(0)
    dm = CorpusDataModule(
        train=str(manifest),
        batch_size=8,
        num_workers=0,
        image_size=64,
        max_text_len=48,
        max_caption_len=64,
        shuffle_buffer=16,
    )
    module = PretrainModule("namc_tiny", tokenizer=dm.caption_tokenizer, overrides={"dim": 32, "heads": 2})
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(work / "run"),
    )
    started = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    loss = trainer.callback_metrics.get("train/loss")
    return {
        "steps": int(trainer.global_step),
        "seconds": round(time.perf_counter() - started, 2),
        "train_loss": float(loss) if loss is not None else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--captions", type=int, default=200, help="source captions (shapes scenes of 2-4 objects)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--fit-steps", type=int, default=5, help="pre-training steps on the corpus (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=None, help="keep the outputs here (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=None, help="write the report JSON here")
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="imgdiff-shapes-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    captions = work / "captions.jsonl"
    with open(captions, "w", encoding="utf-8") as f:
        for i in range(args.captions):
            f.write(json.dumps({"key": f"s{i:05d}", "caption": shapes.random_caption(rng, 2, 4)}) + "\n")
    generator = f"{{backend: shapes, image_size: {args.image_size}}}"
    wall: dict[str, float] = {}
    with LLMServer(answer=shapes_answer) as server:
        common = ["--base-url", server.url, "--quiet", "--concurrency", "8", "--model", "shapes-mllm"]
        steps = [
            (
                "replace",
                replace.main,
                [
                    "--captions",
                    str(captions),
                    "--workdir",
                    str(work),
                    "--generator",
                    generator,
                    "--batch-size",
                    "8",
                    *common,
                ],
            ),
            ("regions", regions.main, ["--workdir", str(work), "--tools", TOOLS, "--quiet"]),
            ("region-captions", region_captions.main, ["--workdir", str(work), "--tools", TOOLS, *common]),
            ("remove", remove.main, ["--workdir", str(work), "--tools", TOOLS, "--inpainter", generator, *common]),
        ]
        for name, entry, argv in steps:
            started = time.perf_counter()
            if entry(argv) != 0:
                raise SystemExit(f"{name} failed")
            wall[name] = time.perf_counter() - started
    summaries = {
        "replace": _summary(work / "pairs.summary.json"),
        "regions": _summary(work / "regions.summary.json"),
        "region-captions": _summary(work / "region_captions.summary.json"),
        "remove": _summary(work / "remove.summary.json"),
    }
    report: dict[str, Any] = {
        "what": "Img-Diff engine on the shapes world (shapes stand-ins, model-free region tools, local chat server)",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "settings": {
            "captions": args.captions,
            "image_size": args.image_size,
            "seed": args.seed,
            "tools": TOOLS,
            "fit_steps": args.fit_steps,
        },
        "stages": {},
        "regions_vs_truth": region_precision(work),
    }
    for name, s in summaries.items():
        items = s["lines"] - s["resumed"] - sum(s["skipped"].values())
        report["stages"][name] = {
            "items": items,
            "kept": s["kept"],
            "rejected": s["rejected"],
            "boxes": s["boxes"],
            "wall_seconds": round(wall[name], 3),
            "items_per_s": round(items / wall[name], 2),
            "stage_seconds": s["seconds"],
            **({"llm": {k: s["llm"][k] for k in ("ok", "failed", "seconds")}} if "llm" in s else {}),
            **{k: s[k] for k in ("generator", "inpainter", "corpus", "differences", "questions") if k in s},
        }
    corpus = work / "manifest.jsonl"
    report["corpus_pairs"] = len(_lines(corpus))
    report["questions"] = len(_lines(work / "questions.jsonl"))
    if args.fit_steps and report["corpus_pairs"]:
        report["pretrain"] = pretrain(corpus, args.fit_steps, work)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
