"""``namc export``: a saved model as files a maintained runtime runs (``main(argv)`` gets the arguments after
``export``).

::

    namc export onnx MODEL_DIR OUT_DIR [--opset 17] [--precision fp32]

Parsing imports neither torch nor the model library, so ``--help`` and a usage error answer at once; a run then
imports :mod:`namc.deploy.export`. Exit status: 0 exported; 1 the model or an exported graph could not be used
(damaged weights, an unreadable config, a graph that disagrees with PyTorch); 2 a usage error (a missing model, a
precision not available yet, an output path that is a file).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from namc.deploy import DEFAULT_OPSET

__all__ = ["build_parser", "main"]

FORMATS = ("onnx",)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``namc export``."""
    parser = argparse.ArgumentParser(
        prog="namc export",
        description="Export a saved model for an inference runtime: `namc export onnx MODEL_DIR OUT_DIR` writes the "
        "encoder (pixels -> E_MIR), the cross-attention keys/values of the memory and FDG's decoding step with an "
        "explicit key/value cache as ONNX files, the tokenizer, and manifest.json (shapes, opset, SHA-256 of the "
        "weights and of every file); `namc describe --backend onnxruntime|openvino --model OUT_DIR` captions with them",
        epilog="exit status: 0 exported; 1 the model or an exported graph could not be used; 2 usage error",
    )
    parser.add_argument("format", choices=FORMATS, help="onnx (ONNX Runtime and OpenVINO run it)")
    parser.add_argument("model", help="a save_pretrained folder, hf-hub:org/name, or a namc .ckpt")
    parser.add_argument("out", type=Path, help="the folder to write (its earlier export files are replaced)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset (default {DEFAULT_OPSET})")
    parser.add_argument(
        "--precision",
        choices=("fp32", "int8"),
        default="fp32",
        help="fp32 (default); int8 is not available yet",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``namc export onnx MODEL_DIR OUT_DIR``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.precision != "fp32":
        return _error(f"--precision {args.precision}: not available yet for ONNX export (fp32 only)", 2)
    if args.out.exists() and not args.out.is_dir():
        return _error(f"{args.out} is a file: name a folder to export into", 2)
    if not args.model.startswith("hf-hub:") and not Path(args.model).exists():
        return _error(f"model not found: {args.model}", 2)
    from namc.deploy.export import ExportError, export_onnx  # torch, timm, open_clip: seconds, so only now
    from namc.models.files import WeightsError

    try:
        out = export_onnx(args.model, args.out, opset=args.opset, precision=args.precision)
    except FileNotFoundError as err:
        return _error(str(err), 2)
    except (OSError, ValueError, WeightsError, ExportError) as err:
        return _error(str(err), 1)
    print(out)
    return 0


def _error(message: str, code: int) -> int:
    print(f"namc export: error: {' '.join(str(message).split())}", file=sys.stderr)
    return code
