"""``namc describe``: the command line of :func:`namc.describe` (``main(argv)`` gets the arguments after
``describe``).

Parsing imports neither torch nor the model library, so ``namc describe --help`` and a usage error (a missing
argument, a bad option value) answer at once, where they took the 6-8 s of importing torch, timm and open_clip; a run
then imports :mod:`namc.inference`, whose :func:`~namc.inference.run` checks the device, loads the model and
captions (exit status and error lines: :mod:`namc.inference`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from namc.backends import BACKENDS
from namc.data.transforms import MAX_IMAGE_PIXELS, pixel_cap_arg

__all__ = ["build_parser", "main"]

PRECISIONS = ("fp32", "bf16", "int8")  # namc.backends.precision.PRECISIONS, which imports torch


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The options of ``namc describe``."""
    parser = argparse.ArgumentParser(
        prog="namc describe",
        description="Caption the change between two image files, or between the pairs a list file names (--pairs).",
        epilog="exit status: 0 captioned; 1 a file could not be used (corrupt or oversized image, damaged weights, "
        "unreadable config; with --pairs: a malformed list, or any pair skipped); 2 usage error (bad option, "
        "missing path, no such device)",
    )
    parser.add_argument("image1", nargs="?", help="the first ('before') image")
    parser.add_argument("image2", nargs="?", help="the second ('after') image")
    parser.add_argument(
        "--pairs",
        metavar="LIST",
        help="caption every pair this file lists instead (one per line: the first image, a tab or spaces, the "
        "second; paths relative to the file's folder; # comments): one JSON line per pair, in order, a pair whose "
        "image cannot be used written with its error and skipped",
    )
    parser.add_argument(
        "--output", metavar="FILE.jsonl", type=Path, help="with --pairs: write the JSON lines here (default: stdout)"
    )
    parser.add_argument(
        "--batch-size", type=_positive_int, default=32, help="with --pairs: pairs per forward pass (default 32)"
    )
    parser.add_argument(
        "--model",
        required=True,
        help="a save_pretrained folder, hf-hub:org/name, or a namc .ckpt; with --backend onnxruntime or openvino, "
        "also a folder written by `namc export onnx`",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="where the model runs (namc.compile): cpu (default on --device cpu: namc's CPU path, fp32 / bf16 / "
        "int8), cuda (default on a GPU: CUDA graphs), torch (eager PyTorch, any device), onnxruntime or openvino "
        "(CPU, fp32, greedy: an exported folder, or a model folder exported on the fly; needs pip install "
        '"namc[deploy]")',
    )
    parser.add_argument("--beams", type=_positive_int, default=1, help="beam width (1: greedy, as the paper)")
    parser.add_argument(
        "--max-new-tokens", type=_positive_int, default=None, help="longest caption (default: the model's, 23)"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps (default: cpu)")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="fp32 (default); bf16 (CPU: bf16 weights where bf16 pays, about 2x faster on namc_base with AVX-512 "
        "BF16 / AMX; a narrow model's small layers stay fp32, and every layer on a CPU without AVX-512; CUDA: "
        "autocast); "
        "int8 (CPU only: dynamic int8 linear layers; the ResNet grid in static int8 where the model folder has an "
        "int8_calibration.json, written by save_pretrained after a calibrate_int8)",
    )
    words = parser.add_mutually_exclusive_group()
    words.add_argument(
        "--vocabulary",
        metavar="CAPTIONS.txt",
        help="write only the tokens of these captions (a UTF-8 file, one per line: say, the captions the model was "
        "fine-tuned on); decoding then projects onto those tokens only, faster (namc.models.shortlist); words "
        "outside a word vocabulary are listed as [UNK], and named on stderr",
    )
    words.add_argument(
        "--shortlist",
        action="store_true",
        help="write only the tokens of the captions the model was fine-tuned on (its shortlist.json, which `namc "
        "fit` with FinetuneModule saves); faster decoding, as --vocabulary",
    )
    parser.add_argument(
        "--max-image-pixels",
        type=pixel_cap_arg,
        default=MAX_IMAGE_PIXELS,
        help=f"refuse images over this many pixels, before decoding them (default {MAX_IMAGE_PIXELS:,}, PIL's "
        "limit; 0: no cap)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``namc describe A.png B.png --model DIR``: caption what changed from the first image to the second."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.pairs is None and (args.image1 is None or args.image2 is None):
        parser.error("two image files are needed (or --pairs LIST)")
    if args.pairs is not None and args.image1 is not None:
        parser.error("give two image files or --pairs LIST, not both")
    if args.pairs is None and args.output is not None:
        parser.error("--output is for --pairs; one pair's caption is printed")
    if args.output is not None and args.output.is_dir():
        parser.error(f"--output {args.output} is a folder: name the JSON lines file to write")
    missing = _missing_input(args)
    if missing is not None:  # a path on the command line that is not there: before seconds of imports
        print(f"namc describe: error: {missing}", file=sys.stderr)
        return 2
    from namc.inference import run  # torch, timm, open_clip: seconds, so only once the arguments are good

    return run(args, parser)


def _missing_input(args: argparse.Namespace) -> str | None:
    """What is wrong with the input files the command line names (the model is checked when it loads), or None."""
    for path in (args.image1, args.image2):
        if path is not None and not Path(path).exists():
            return f"image not found: {path}"
    for what, path in (("pair list", args.pairs), ("captions file", args.vocabulary)):
        if path is not None and not Path(path).is_file():
            return f"{what} not found: {path}" + (" (a folder)" if Path(path).is_dir() else "")
    return None
