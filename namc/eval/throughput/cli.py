"""``namc benchmark``: the command line of the throughput harness (``main(argv)`` gets the arguments after
``benchmark``).

CPU threads: OpenMP's default lets idle worker threads spin. On a machine shared with other processes (a CI runner, a
2-core VM) the spinning threads take the cores the main thread needs, and decoding runs several times slower than with
``OMP_WAIT_POLICY=PASSIVE`` (docs/performance.md). ``--omp-wait-policy passive`` re-runs the harness in a child process
with it set (OpenMP reads it only when torch loads; options are parsed and checked without torch, so the parent process
never loads it); every report records the threading variables in ``machine.env``. Under it, namc and the peer alike run
products too small to pay for waking a second thread on one (:mod:`namc.kernels`).

Memory: ``--allocator reuse`` first makes glibc's allocator keep freed memory for reuse
(:func:`namc.runtime.reuse_freed_memory`, measured there); the default, ``system``, leaves it as it is.
``machine.allocator`` records which.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from namc.eval.throughput.report import format_table
from namc.eval.throughput.settings import (
    BACKEND_MODES,
    DTYPES,
    INT8_GRIDS,
    LENGTH_MODES,
    MODES,
    PRECISIONS,
    REFERENCES,
    SHORTLIST_OF_MODEL,
    BenchmarkInputError,
    BenchmarkSettings,
)
from namc.runtime import ALLOCATORS, allocator_settings, reuse_freed_memory

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The options of ``namc benchmark``: the :class:`BenchmarkSettings` fields, ``--omp-wait-policy``,
    ``--allocator``, ``--output`` and ``--verbose``."""
    d = BenchmarkSettings()
    p = argparse.ArgumentParser(
        prog="namc benchmark",
        description="Inference and training throughput of a NAMC model (the paper's Table 5); "
        "prints a table and optionally writes a JSON report (docs/benchmark_schema.md).",
    )
    p.add_argument("--model", default=d.model, help="preset name or save_pretrained folder (default %(default)s)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(d.batch_sizes), help="default: %(default)s")
    p.add_argument("--device", default=d.device, help="cpu, cuda or cuda:N (default %(default)s)")
    p.add_argument("--dtype", default=d.dtype, choices=sorted(DTYPES), help="half precision on CUDA only")
    p.add_argument(
        "--precision",
        default=d.precision,
        choices=PRECISIONS,
        help="CPU inference precision of namc and the CLIP4IDC peer: fp32, bf16 (bf16 weights, oneDNN), int8 "
        "(dynamic int8 linear layers) (default %(default)s)",
    )
    p.add_argument(
        "--int8-grid",
        default=d.int8_grid,
        choices=INT8_GRIDS,
        help="with --precision int8: the ResNet grid's blocks in static int8 (with a model folder's own "
        "int8_calibration.json, else calibrated on the benchmark's synthetic images: timing only), or fp32 as in an "
        "uncalibrated model (default %(default)s)",
    )
    p.add_argument("--threads", type=int, default=d.threads, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="default %(default)s (appendix F)")
    p.add_argument(
        "--length-mode",
        default=d.length_mode,
        choices=LENGTH_MODES,
        help="fixed: ignore [EOS], generate exactly max-new-tokens per pair; eos: stop at [EOS] (default %(default)s)",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        default=None,
        choices=MODES,
        help=f"default: {' '.join(d.modes)}; with --backend {' '.join(BACKEND_MODES)}",
    )
    p.add_argument(
        "--backend",
        dest="backends",
        nargs="+",
        default=[],
        metavar="BACKEND[:PRECISION]",
        help="time namc through namc.compile on each backend (torch, cpu, cuda, onnxruntime, openvino) at its "
        "precision (default --precision), e.g. cpu:fp32 cpu:int8 onnxruntime:int8, beside the CLIP4IDC peer "
        "(--reference clip4idc); default: the cpu copy at --precision",
    )
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--repeats", type=int, default=d.repeats)
    p.add_argument(
        "--reference",
        default=d.reference,
        choices=REFERENCES,
        help="what to compare with: decode (namc's FDG without a cache, from the same memory), clip4idc (the "
        "CLIP4IDC peer, decode-only and end to end, interleaved with namc: slow), all, none (default %(default)s)",
    )
    p.add_argument(
        "--reference-precision",
        default=d.reference_precision,
        choices=PRECISIONS,
        help="the CLIP4IDC peer's CPU precision, where it should differ from --precision (each model at its fastest: "
        "on a CPU with AMX the peer decodes faster in bf16 than in int8) (default: --precision)",
    )
    p.add_argument("--reference-repeats", type=int, default=d.reference_repeats)
    p.add_argument("--gemm-size", type=int, default=d.gemm_size, help="square matmul side (default %(default)s)")
    p.add_argument(
        "--static-decode",
        action="store_true",
        help="decode in fixed-shape steps over a static KV cache (namc.backends.static_decode), on CUDA one CUDA "
        "graph per batch size replayed at every step; on a CPU the same steps run eagerly",
    )
    p.add_argument(
        "--shortlist",
        type=_shortlist,
        default=d.shortlist,
        metavar="N|model",
        help="decode over N tokens instead of the whole vocabulary, namc and the CLIP4IDC peer alike (random ids, "
        "[EOS] among them; namc.models.shortlist); model: namc over the model folder's own list (shortlist.json, "
        "kept by namc fit), the peer over as many random ids; 0: the whole vocabulary (default)",
    )
    p.add_argument("--train-batch-size", type=int, default=d.train_batch_size, help="0 skips training (default)")
    p.add_argument("--train-steps", type=int, default=d.train_steps)
    p.add_argument("--train-warmup", type=int, default=d.train_warmup)
    p.add_argument("--train-vqgan", action="store_true", help="run the VQGAN tokenizer inside each training step")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--omp-wait-policy",
        choices=("passive", "active"),
        default=None,
        help="run with OMP_WAIT_POLICY set (OpenMP reads it when torch loads, so the benchmark re-runs itself in a "
        "child process). passive stops idle OpenMP threads from spinning: on a machine shared with other "
        "processes, spinning threads can slow small-batch decoding several-fold (default: the environment's)",
    )
    p.add_argument(
        "--allocator",
        choices=ALLOCATORS,
        default="system",
        help="reuse: glibc's malloc keeps freed memory for the next tensors instead of mapping fresh pages for each "
        "large one (namc.runtime.reuse_freed_memory; freed memory stays with the process); system: leave malloc "
        "as it is (default %(default)s)",
    )
    p.add_argument("--output", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--verbose", action="store_true", help="log progress")
    return p


def _shortlist(text: str) -> int | str:
    """``--shortlist``: a token count, or ``model``."""
    if text == SHORTLIST_OF_MODEL:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a token count or {SHORTLIST_OF_MODEL!r}, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``namc benchmark ...``: run, print the table, write the JSON report when ``--output`` is given."""
    args = build_parser().parse_args(argv)
    policy = args.omp_wait_policy
    if policy is not None and os.environ.get("OMP_WAIT_POLICY", "").lower() != policy:
        # OpenMP reads OMP_WAIT_POLICY once, when torch is imported: only a fresh process can apply it
        env = dict(os.environ, OMP_WAIT_POLICY=policy.upper())
        child_argv = list(sys.argv[1:] if argv is None else argv)
        return subprocess.run([sys.executable, "-m", "namc.eval.throughput", *child_argv], env=env).returncode
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.allocator == "reuse" and not reuse_freed_memory():
        logging.getLogger(__name__).warning(
            "--allocator reuse: not glibc's malloc here (%s); left as it is", allocator_settings()
        )
    if args.modes is None:
        args.modes = list(BACKEND_MODES) if args.backends else list(BenchmarkSettings().modes)
    fields = {f.name for f in dataclasses.fields(BenchmarkSettings)}
    try:
        settings = BenchmarkSettings(**{k: v for k, v in vars(args).items() if k in fields})
        from namc.eval.throughput.harness import run_benchmark  # torch, the model library: once the options are good

        report = run_benchmark(settings)
    except BenchmarkInputError as err:
        print(f"namc benchmark: {err}", file=sys.stderr)
        return 2
    print(format_table(report))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2))
        print(f"\nJSON report: {args.output}")
    return 0
