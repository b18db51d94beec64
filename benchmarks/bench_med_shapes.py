"""MED's engine end to end on the shapes world: ``namc curate edit`` -> ``namc curate questions`` -> a few
pre-training steps on the corpus -> ``namc eval choice --format med``, with the throughput of every stage.

The image editor is the shapes world's (:class:`namc.curate.edits.shapes.ShapesEditor`: the difference is known
exactly), the MLLM is :func:`tests.med_helpers.shapes_mllm` served by :mod:`tests.llm_server` in its own process on
127.0.0.1 (``--latency`` seconds per answer imitate a real server), and the pair similarity is the pixel stand-in
(SSIM; ``--similarity clip`` runs open_clip ViT-B/32 with random weights instead: the CLIP stage's real cost on this
CPU, its similarities meaningless). Prints and writes a report JSON: items per second per stage (this run),
rejections per stage and reason, the 11 categories counted, the questions, the pre-training steps and the choice
accuracy (chance 25%)::

    python benchmarks/bench_med_shapes.py --images 200 --out benchmarks/results/epyc-avx2-med-shapes/report.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_SERVER = (
    "import sys; from tests.llm_server import LLMServer; from tests.med_helpers import shapes_mllm; "
    "s = LLMServer(answer=shapes_mllm, latency=float(sys.argv[1])); print(s.port, flush=True); s.httpd.serve_forever()"
)


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(latency)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/v1"


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def random_clip(folder: Path) -> Path:
    """open_clip ViT-B-32 with random weights, saved in its layout (the CLIP stage's cost, not its judgement)."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32")
    path = folder / "open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return path


def pretrain(manifest: Path, steps: int, folder: Path, pairs: int) -> dict:
    import lightning.pytorch as pl

    from namc.lit import PretrainModule
    from namc.lit.datamodules import CorpusDataModule

    pl.seed_everything(0)
    dm = CorpusDataModule(
        train=str(manifest),
        batch_size=max(1, min(8, pairs)),
        num_workers=0,
        image_size=64,
        max_text_len=64,
        max_caption_len=128,
        shuffle_buffer=64,
    )
    overrides = {"dropout": 0.0, "max_caption_len": 128}  # the shapes captions are long
    module = PretrainModule("namc_tiny", tokenizer=dm.caption_tokenizer, overrides=overrides)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(folder),
    )
    started = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    seconds = time.perf_counter() - started
    module.model.save_pretrained(folder / "model")
    loss = trainer.callback_metrics.get("train/loss")
    return {
        "steps": trainer.global_step,
        "seconds": round(seconds, 2),
        "last_loss": float(loss) if loss is not None else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--latency", type=float, default=0.0, help="seconds the server waits before each answer")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--similarity", choices=("pixels", "clip"), default="pixels")
    p.add_argument("--question-min-similarity", type=float, default=0.95, help="section 3.3's 0.95")
    p.add_argument("--fit-steps", type=int, default=4)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/epyc-avx2-med-shapes/report.json")
    args = p.parse_args()

    from namc.curate.edits import med, questions
    from namc.eval.captions.cli import main as eval_main
    from tests.med_helpers import shapes_index

    work = args.workdir or Path(tempfile.mkdtemp(prefix="med-shapes-"))
    started = time.perf_counter()
    index = shapes_index(work / "src", args.images, seed=0)
    index_seconds = time.perf_counter() - started
    proc, url = start_server(args.latency)
    client = ["--base-url", url, "--concurrency", str(args.concurrency), "--quiet"]
    try:
        edit_args = ["--images", str(index), "--out", str(work / "med"), "--editor", "{backend: shapes}"]
        if args.similarity == "clip":
            edit_args += ["--clip-weights", str(random_clip(work)), "--clip-model", "ViT-B-32"]
        else:
            edit_args += ["--similarity", "pixels"]
        t0 = time.perf_counter()
        assert med.main([*edit_args, *client]) == 0
        edit_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        assert (
            questions.main(
                [
                    "--pairs",
                    str(work / "med" / "pairs.jsonl"),
                    "--min-similarity",
                    str(args.question_min_similarity),
                    *client,
                ]
            )
            == 0
        )
        questions_wall = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait()
    edit = json.loads((work / "med" / "edit.summary.json").read_text())
    qs = json.loads((work / "med" / "questions.summary.json").read_text())
    fit = pretrain(work / "med" / "manifest.jsonl", args.fit_steps, work / "fit", edit["pairs"])
    res = work / "choice.json"
    assert (
        eval_main(
            [
                "choice",
                str(work / "med" / "MED_bench.json"),
                "--format",
                "med",
                "--model",
                str(work / "fit" / "model"),
                "--out",
                str(res),
                "--quiet",
            ]
        )
        == 0
    )
    choice = json.loads(res.read_text())

    def per_stage(summary: dict) -> dict:
        return {
            name: {
                "in": s["in"],
                "kept": s["kept"],
                "rejected": s["rejected"],
                "items_per_s": (s.get("run") or {}).get("items_per_s"),
                **{k: v for k, v in (s.get("run") or {}).items() if k.endswith("_per_s") and k != "items_per_s"},
            }
            for name, s in summary["stages"].items()
        }

    report = {
        "what": "med-shapes",
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
        "settings": {
            "images": args.images,
            "latency_s": args.latency,
            "concurrency": args.concurrency,
            "similarity": args.similarity,
            "question_min_similarity": args.question_min_similarity,
        },
        "index_seconds": round(index_seconds, 2),
        "edit": {
            "wall_seconds": round(edit_wall, 2),
            "pairs": edit["pairs"],
            "pairs_per_s": edit["pairs"] / edit_wall,
            "stages": per_stage(edit),
            "categories": edit["categories"],
            "instructed_categories": edit["instructed_categories"],
            "editor": edit["editor"],
        },
        "questions": {
            "wall_seconds": round(questions_wall, 2),
            "questions": qs["questions"],
            "stages": per_stage(qs),
            "categories": qs["categories"],
            "answers": qs["answers"],
        },
        "fit": fit,
        "choice": {"overall": choice["overall"], "per_category": choice["per_category"]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("settings", "edit", "questions", "fit")}, indent=1))
    print(
        f"choice accuracy {choice['overall']['accuracy']:.1f}% (chance {choice['overall']['chance']:.1f}%), "
        f"report: {args.out}"
    )


if __name__ == "__main__":
    main()
