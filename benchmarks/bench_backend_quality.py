"""Quality is part of the figure: one trained model's test split captioned on every backend x precision, each scored
by CIDEr-D and compared with the first run's captions (share identical, ids equal). Writes a JSON report; asserts
nothing.

    namc demo                                                      # trains runs/demo/runs/finetune/model
    python benchmarks/bench_backend_quality.py --model runs/demo/runs/finetune/model \\
        --dataset clevr_change --root runs/demo/data/clevr_change --out report.json

Every run captions the same pairs in the same batches, greedily, at the model's ``max_new_tokens``: ``torch:fp32``
(the model core, eager; the reference), namc's ``cpu`` path in fp32 / bf16 / int8, and the ONNX Runtime and OpenVINO
graphs (exported once from the model folder; their int8 graphs once more, calibrated on the first
``--calibration-pairs`` pairs of the training split). fp32 backends should give the reference's ids; bf16 and int8
change a few near-tie captions, which CIDEr-D shows. docs/performance.md shows the stored reports (``python
benchmarks/tables.py``).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

RUNS = [
    "torch:fp32",
    "cpu:fp32",
    "cpu:bf16",
    "cpu:int8",
    "onnxruntime:fp32",
    "openvino:fp32",
    "onnxruntime:int8",
    "openvino:int8",
]


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a save_pretrained folder (namc demo's finetune/model)")
    parser.add_argument("--dataset", default="clevr_change", help="a registered benchmark (default clevr_change)")
    parser.add_argument("--root", required=True, help="the benchmark folder in its official layout")
    parser.add_argument("--split", default="test", help="the split to caption (default test)")
    parser.add_argument("--runs", nargs="+", default=RUNS, help=f"backend:precision, the first the reference ({RUNS})")
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per call (default 32)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument(
        "--calibration-pairs", type=int, default=64, help="training pairs the int8 graphs calibrate on (default 64)"
    )
    parser.add_argument("--out", type=Path, required=True, help="the JSON report to write")
    return parser.parse_args()


def _commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def _calibration(args: argparse.Namespace, image_size: int) -> list:
    """The first ``--calibration-pairs`` readable pairs of the training split, in batches of 16."""
    import torch

    from namc.data.idc import build_benchmark

    train = build_benchmark(args.dataset, args.root, "train", image_size)
    items = [item for item in (train[i] for i in range(min(len(train), 2 * args.calibration_pairs))) if item]
    items = items[: args.calibration_pairs]
    return [
        (
            torch.stack([it["image1"] for it in items[i : i + 16]]),
            torch.stack([it["image2"] for it in items[i : i + 16]]),
        )
        for i in range(0, len(items), 16)
    ]


def main() -> None:
    args = _parse()
    import torch

    import namc
    from namc.data.idc import build_benchmark
    from namc.deploy import load_captioner
    from namc.deploy.export import export_onnx
    from namc.eval.captions.metrics import CaptionEvaluator

    torch.set_num_threads(args.threads)
    model = namc.load_model(args.model, pretraining=False).eval()
    data = build_benchmark(args.dataset, args.root, args.split, model.config.image_size)
    items = [data[i] for i in range(len(data))]
    items = [item for item in items if item is not None]
    references = {item["id"]: item["captions"] for item in items}
    work = Path(tempfile.mkdtemp(prefix="namc-quality-"))
    exports = {"fp32": work / "export", "int8": work / "export-int8"}
    runs: list[dict[str, Any]] = []
    reference: dict[str, Any] | None = None
    with CaptionEvaluator(spice=False) as evaluator:
        for run in args.runs:
            backend, precision = run.split(":", 1)
            if backend in ("onnxruntime", "openvino"):
                export = exports[precision]
                if not export.exists():
                    pairs = _calibration(args, model.config.image_size) if precision == "int8" else None
                    export_onnx(args.model, export, precision=precision, calibration=pairs)
                captioner = load_captioner(export, backend, threads=args.threads)
            else:
                captioner = namc.compile(model, backend, precision)
            start = time.perf_counter()
            ids: dict[str, list[int]] = {}
            for lo in range(0, len(items), args.batch_size):
                batch = items[lo : lo + args.batch_size]
                a = torch.stack([item["image1"] for item in batch])
                b = torch.stack([item["image2"] for item in batch])
                for item, row in zip(batch, captioner.generate_ids(a, b), strict=True):
                    ids[item["id"]] = [t for t in row.tolist() if t != model.tokenizer.pad_id]
            seconds = time.perf_counter() - start
            captions = {k: model.tokenizer.decode(v) for k, v in ids.items()}
            scores = evaluator.evaluate(captions, references)["overall"]
            entry = {
                "backend": backend,
                "precision": precision,
                "cider_d": scores["CIDEr-D"],
                "bleu_4": scores["BLEU-4"],
                "seconds": seconds,
            }
            if reference is None:
                reference = {"ids": ids, "captions": captions, "cider_d": scores["CIDEr-D"]}
            entry["identical_captions"] = sum(captions[k] == reference["captions"][k] for k in captions) / len(items)
            entry["identical_ids"] = all(ids[k] == reference["ids"][k] for k in ids)
            entry["cider_d_vs_reference"] = scores["CIDEr-D"] - reference["cider_d"]
            runs.append(entry)
            print(
                f"{backend:12s} {precision}: CIDEr-D {scores['CIDEr-D']:7.2f} ({entry['cider_d_vs_reference']:+.2f}), "
                f"identical captions {entry['identical_captions']:.1%}, ids equal {entry['identical_ids']}, "
                f"{seconds:.1f} s"
            )
    report = {
        "what": "backend-quality",
        "model": str(args.model),
        "dataset": args.dataset,
        "split": args.split,
        "pairs": len(items),
        "threads": args.threads,
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        "torch": torch.__version__,
        "commit": _commit(),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
