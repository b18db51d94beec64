"""Throughput harness: the paper's Table 5 (parameters and generated tokens per second at inference) and more.

``namc benchmark --model namc_base --batch-sizes 1 32 --threads 2 --output bench.json`` measures, in one process:

- **Inference** (:mod:`.inference`) at each batch size and level (``decode`` from E_MIR, ``grid`` from ResNet grid
  features, ``e2e`` from pixels), after warm-up, over several repeats (median and spread): generated tokens/s,
  pairs/s, seconds per pair and peak memory (:mod:`.timing`).
- **The naive decoder** (:mod:`.baselines`) and **the CLIP4IDC peer** (:mod:`.clip4idc`: its published
  architecture, 173.7M parameters, random weights) in the same process, on the same inputs and length, the peer's
  calls interleaved with namc's; the speed-ups, and whether the naive decoder produced the same ids.
- **Precision** (``precision``: fp32, bf16, int8 on a CPU; :mod:`namc.models.precision`), ``torch.compile`` of
  the decoding step, and decoding over a shortlist of tokens (``shortlist``: random ids for namc and the peer
  alike, or a fine-tuned model's own list).
- **Dense matmul throughput** of the machine (:mod:`.machine`) and the **decode FLOP efficiency**: analytic decoder
  FLOPs (:mod:`.flops`) per second at the median time over that matmul FLOP/s.
- **Training throughput** (:mod:`.training`, optional): pre-training steps/s and pairs/s, and the cost of the
  paper's pre-training run on this device.

:func:`run_benchmark` (:mod:`.harness`) returns the report, a JSON-ready dict laid out as :data:`REPORT_SCHEMA`
(:mod:`.schema`; docs/benchmark_schema.md is rendered from it by :mod:`.schema_doc`); :func:`validate_report` and
:func:`format_table` (:mod:`.report`) read it; :func:`main` (:mod:`.cli`) is ``namc benchmark``. Every module here
works with the core install (no Lightning, jsonargparse, pycocoevalcap, TensorBoard or matplotlib).
"""

from namc.eval.throughput.baselines import generate_reference, generate_uncached
from namc.eval.throughput.cli import build_parser, main
from namc.eval.throughput.clip4idc import CLIP4IDCPeer, peer_at
from namc.eval.throughput.flops import decoder_flops
from namc.eval.throughput.harness import load_model, run_benchmark
from namc.eval.throughput.inference import (
    decoding_shortlist,
    generated_lengths,
    length_mode,
    random_shortlist,
    run_inference,
)
from namc.eval.throughput.machine import describe_machine, measure_matmul
from namc.eval.throughput.report import format_table, validate_report
from namc.eval.throughput.schema import REPORT_SCHEMA, SCHEMA_VERSION
from namc.eval.throughput.settings import PAPER_TABLE5, BenchmarkInputError, BenchmarkSettings
from namc.eval.throughput.timing import peak_memory, summarize, time_calls
from namc.eval.throughput.training import run_training, synthetic_pretrain_batch

__all__ = [
    "CLIP4IDCPeer",
    "PAPER_TABLE5",
    "REPORT_SCHEMA",
    "SCHEMA_VERSION",
    "BenchmarkInputError",
    "BenchmarkSettings",
    "build_parser",
    "decoder_flops",
    "decoding_shortlist",
    "describe_machine",
    "format_table",
    "generate_reference",
    "generate_uncached",
    "generated_lengths",
    "length_mode",
    "load_model",
    "main",
    "measure_matmul",
    "peak_memory",
    "peer_at",
    "random_shortlist",
    "run_benchmark",
    "run_inference",
    "run_training",
    "summarize",
    "synthetic_pretrain_batch",
    "time_calls",
    "validate_report",
]
