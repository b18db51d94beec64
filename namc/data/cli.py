"""``namc data ...`` subcommands: ``shapes`` (generate the shapes world), ``minimal-pairs`` (a choice set for
``namc eval choice``) and ``pack`` (manifest -> tar shards).

``main(argv)`` takes the arguments after ``namc data`` and returns an exit status; the ``namc`` console script
forwards to it. Both show progress bars on stderr over the pairs written (``--quiet``: none). Examples::

    namc data shapes --out data/shapes --pairs 1000 --image-size 64 --noise-rate 0.2
    namc data minimal-pairs --out data/minimal_pairs --items 400
    namc data pack data/shapes/corpus/manifest.jsonl data/shapes/corpus/shards --shard-size 1000
    namc data precompute --shards data/shapes/corpus/shards --model namc_tiny --vqgan-weights vqgan.safetensors
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from namc.data.transforms import MAX_IMAGE_PIXELS, pixel_cap_arg
from namc.locks import LockedError, output_lock

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``namc data``."""
    parser = argparse.ArgumentParser(prog="namc data", description="Data tools for namc.")
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("shapes", help="generate the shapes world (CLEVR-Change-layout benchmark + corpus)")
    s.add_argument("--out", type=Path, required=True, help="output folder (gets clevr_change/ and corpus/)")
    s.add_argument("--pairs", type=int, default=1000, help="benchmark pairs (each also gives a distractor pair)")
    s.add_argument("--corpus-pairs", type=int, default=None, help="pre-training pairs (default: --pairs; 0: none)")
    s.add_argument("--image-size", type=int, default=64)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--noise-rate", type=float, default=0.2, help="fraction of injected noise phrases, in [0, 0.5]")
    s.add_argument("--captions", type=int, default=3, help="paraphrases per benchmark pair")
    s.add_argument("--splits", type=float, nargs=3, default=(0.8, 0.1, 0.1), metavar=("TRAIN", "VAL", "TEST"))
    s.add_argument("--min-objects", type=int, default=2)
    s.add_argument("--max-objects", type=int, default=6)
    s.add_argument("--workers", type=int, default=1, help="processes (the output does not depend on it)")
    s.add_argument("--shards", action="store_true", help="also pack the corpus into tar shards (corpus/shards/)")
    s.add_argument("--shard-size", type=int, default=1000)
    s.add_argument("--quiet", action="store_true", help="no progress bars (the summary is still printed)")

    m = sub.add_parser("minimal-pairs", help="write a minimal-pair choice set from the shapes world (namc eval choice)")
    m.add_argument("--out", type=Path, required=True, help="output folder (gets choices.jsonl and images/)")
    m.add_argument("--items", type=int, default=400, help="image pairs (the 8 categories in turn)")
    m.add_argument("--image-size", type=int, default=64)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--min-objects", type=int, default=2)
    m.add_argument("--max-objects", type=int, default=6)
    m.add_argument("--quiet", action="store_true", help="no progress bar")

    p = sub.add_parser("pack", help="pack a JSONL manifest into tar shards (resumable)")
    p.add_argument("manifest", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--shard-size", type=int, default=1000)
    p.add_argument("--no-verify-images", action="store_true", help="copy images without decoding them")
    p.add_argument("--quiet", "--no-progress", dest="quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--max-image-pixels",
        type=pixel_cap_arg,
        default=MAX_IMAGE_PIXELS,
        help="reject images with more pixels, read from the header before decoding (default %(default)s, PIL's "
        "limit; 0: no cap)",
    )

    sub.add_parser(
        "precompute",
        help="VQGAN codes (+ ResNet grids) of a packed corpus beside its shards, Lightning predict over devices "
        "(needs the [train] extra; namc data precompute --help)",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs a ``namc data`` subcommand; prints its report; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["precompute"]:  # Lightning's: its own parser, loaded only here (the core install lacks it)
        if importlib.util.find_spec("lightning") is None:
            print('namc data precompute: needs the [train] extra: pip install "namc[train]"', file=sys.stderr)
            return 2
        return int(importlib.import_module("namc.lit.precompute").main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["namc", "data", *argv])
    try:
        return _run(args)
    except (OSError, ValueError, LockedError) as err:  # a missing or unreadable input, an impossible setting, a
        # folder another run writes: one line
        print(f"namc data {args.command}: error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "shapes":
        from namc.data.corpus import pack_corpus
        from namc.data.synthetic import generate_benchmark, generate_corpus

        t0 = time.perf_counter()
        bench = generate_benchmark(
            args.out / "clevr_change",
            args.pairs,
            args.image_size,
            args.seed,
            args.captions,
            args.splits,
            args.workers,
            args.min_objects,
            args.max_objects,
            progress=not args.quiet,
        )
        t1 = time.perf_counter()
        print(f"benchmark: {json.dumps(bench)} ({t1 - t0:.1f} s)")
        n_corpus = args.pairs if args.corpus_pairs is None else args.corpus_pairs
        if n_corpus > 0:
            meta = generate_corpus(
                args.out / "corpus",
                n_corpus,
                args.image_size,
                args.seed,
                args.noise_rate,
                args.workers,
                args.min_objects,
                args.max_objects,
                progress=not args.quiet,
            )
            t2 = time.perf_counter()
            print(
                f"corpus: {n_corpus} pairs, phrase noise {meta['phrase_noise_fraction']:.3f}, "
                f"word noise {meta['word_noise_fraction']:.3f} ({t2 - t1:.1f} s)"
            )
            if args.shards:
                with output_lock(args.out / "corpus" / "shards", args.command_line):
                    report = pack_corpus(
                        args.out / "corpus" / "manifest.jsonl",
                        args.out / "corpus" / "shards",
                        args.shard_size,
                        progress=not args.quiet,
                    )
                print(report.summary())
        return 0
    if args.command == "minimal-pairs":
        from namc.data.synthetic.minimal_pairs import generate_minimal_pairs

        summary = generate_minimal_pairs(
            args.out,
            args.items,
            args.image_size,
            args.seed,
            args.min_objects,
            args.max_objects,
            progress=not args.quiet,
        )
        print(f"minimal pairs: {json.dumps(summary)}")
        return 0
    if args.command == "pack":
        from namc.data.corpus import pack_corpus

        with output_lock(args.out, args.command_line):  # two packs into one folder interleave their shards
            report = pack_corpus(
                args.manifest,
                args.out,
                args.shard_size,
                verify_images=not args.no_verify_images,
                progress=not args.quiet,
                max_image_pixels=args.max_image_pixels,
            )
        print(report.summary())
        return 0
    raise AssertionError(args.command)  # argparse enforces the choices


if __name__ == "__main__":
    raise SystemExit(main())
