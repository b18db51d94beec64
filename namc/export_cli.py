"""``namc export``: a saved model as files a maintained runtime runs (``main(argv)`` gets the arguments after
``export``). It sits above :mod:`namc.deploy`, whose export reads no image files: ``--calibration`` pairs are read
here (:mod:`namc.data`).

::

    namc export onnx MODEL_DIR OUT_DIR [--opset 17] [--precision fp32|int8 --calibration PAIRS]

Parsing imports neither torch nor the model library, so ``--help`` and a usage error answer at once; a run then
imports :mod:`namc.deploy.export`. Exit status: 0 exported; 1 the model or an exported graph could not be used
(damaged weights, an unreadable config, a graph that disagrees with PyTorch, an unreadable calibration image); 2 a
usage error (a missing model or calibration, int8 without --calibration, an output path that is a file).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

from namc.deploy import DEFAULT_OPSET

_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
MAX_CALIBRATION_PAIRS = 512  # activation ranges settle within a few hundred pairs; more only costs time

__all__ = ["build_parser", "calibration_images", "main"]

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
        help="fp32 (default); int8: ONNX Runtime's quantisation, static on the encoder (calibrated on --calibration), "
        "dynamic on the decoder, with settings namc pins for this CPU (manifest.json records them)",
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        default=None,
        metavar="PAIRS",
        help="with --precision int8: a pair list file or a folder of images (consecutive files make a pair) like "
        "the ones to caption; a few hundred pairs",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``namc export onnx MODEL_DIR OUT_DIR``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.precision == "int8" and args.calibration is None:
        return _error("--precision int8 needs --calibration PAIR_LIST_OR_IMAGE_FOLDER (images like yours)", 2)
    if args.calibration is not None and not args.calibration.exists():
        return _error(f"--calibration {args.calibration}: no such pair list or folder", 2)
    if args.out.exists() and not args.out.is_dir():
        return _error(f"{args.out} is a file: name a folder to export into", 2)
    if not args.model.startswith("hf-hub:") and not Path(args.model).exists():
        return _error(f"model not found: {args.model}", 2)
    from namc.deploy.export import ExportError, export_onnx  # torch, timm, open_clip: seconds, so only now
    from namc.models.files import WeightsError

    try:
        calibration = None
        if args.calibration is not None:
            calibration = functools.partial(calibration_images, args.calibration)  # at the model's image size
        out = export_onnx(args.model, args.out, args.opset, args.precision, calibration)
    except FileNotFoundError as err:
        return _error(str(err), 2)
    except (OSError, ValueError, WeightsError, ExportError) as err:
        return _error(str(err), 1)
    print(out)
    return 0


def calibration_images(source: str | Path, image_size: int) -> list:
    """(B, 3, S, S) pair batches from ``source``: a pair list file (:func:`namc.data.pairs.read_pair_list`) or a
    folder of images (consecutive files in name order make a pair), at most :data:`MAX_CALIBRATION_PAIRS` pairs.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        ValueError: it holds no pair, or an image cannot be read (the message names the file).
    """
    import torch

    from namc.data.pairs import read_pair_list
    from namc.data.transforms import ImageTransform

    source = Path(source)
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES)
        pairs = list(zip(files[0::2], files[1::2]))
        if not pairs:
            raise ValueError(f"--calibration {source}: no pair of images ({', '.join(_IMAGE_SUFFIXES)}) in the folder")
    elif source.is_file():
        pairs = [(p.first, p.second) for p in read_pair_list(source)]
    else:
        raise FileNotFoundError(f"--calibration {source}: no such folder or pair list")
    transform = ImageTransform(image_size, None)
    loaded = []
    for first, second in pairs[:MAX_CALIBRATION_PAIRS]:
        try:
            loaded.append((transform.load(first), transform.load(second)))
        except (OSError, SyntaxError, ValueError) as err:
            raise ValueError(f"--calibration: cannot read {first} / {second}: {err}") from None
    return [
        (torch.stack([a for a, _ in loaded[i : i + 16]]), torch.stack([b for _, b in loaded[i : i + 16]]))
        for i in range(0, len(loaded), 16)
    ]


def _error(message: str, code: int) -> int:
    print(f"namc export: error: {' '.join(str(message).split())}", file=sys.stderr)
    return code
