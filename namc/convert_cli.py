"""``namc convert-clip``: OpenAI's CLIP checkpoint as the open_clip ``.safetensors`` file namc loads
(:mod:`namc.models.openai_clip`; ``main(argv)`` gets the arguments after ``convert-clip``).

Parsing imports neither torch nor open_clip, so ``--help`` and a usage error answer at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["build_parser", "main"]

DEFAULT_MODEL = "ViT-B-16-quickgelu"  # namc.models.openai_clip.DEFAULT_MODEL, whose module imports torch


def build_parser() -> argparse.ArgumentParser:
    """The options of ``namc convert-clip``."""
    parser = argparse.ArgumentParser(
        prog="namc convert-clip",
        description="Convert OpenAI's CLIP checkpoint (a TorchScript ViT-B-16.pt, or a state dict in OpenAI's "
        "layout) into an open_clip-layout .safetensors file, the clip_pretrained weights of a namc model. "
        "A TorchScript archive is deserialised: convert only the file you downloaded from OpenAI's CLIP release.",
        epilog="exit status: 0 written; 1 the checkpoint is missing or does not fit the open_clip config; "
        "2 usage error",
    )
    parser.add_argument("src", type=Path, help="OpenAI CLIP checkpoint, e.g. ViT-B-16.pt")
    parser.add_argument("dst", type=Path, help="output .safetensors file")
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"open_clip config the result must load into ({DEFAULT_MODEL})"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Convert, then print a one-line report; errors are one line on stderr."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.dst.suffix != ".safetensors":
        parser.error(f"the output must end in .safetensors, got {args.dst}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from namc.models.io import WeightsError
    from namc.models.openai_clip import convert

    try:
        state_dict = convert(args.src, args.dst, args.model)
    except (FileNotFoundError, WeightsError) as exc:
        print(f"namc convert-clip: {exc}", file=sys.stderr)
        return 1
    n_params = sum(v.numel() for v in state_dict.values())
    print(f"wrote {args.dst}: {len(state_dict)} tensors, {n_params / 1e6:.1f}M values, loads into {args.model!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
