"""Throughput harness: the paper's Table 5 (parameters and generated tokens per second at inference) and more.

``namc benchmark --model namc_base --batch-sizes 1 32 --threads 2 --output bench.json`` measures, in one process:

- **Inference** (:mod:`.inference`) at each batch size and level (``decode`` from E_MIR, ``grid`` from ResNet grid
  features, ``e2e`` from pixels), after warm-up, over several repeats (median and spread): generated tokens/s,
  pairs/s, seconds per pair and peak memory (:mod:`.timing`).
- **The naive decoder** (:mod:`.baselines`) and **the CLIP4IDC peer** (:mod:`.clip4idc`: its published
  architecture, 173.7M parameters, random weights) in the same process, on the same inputs and length, the peer's
  calls interleaved with namc's; the speed-ups, and whether the naive decoder produced the same ids.
- **Precision** (``precision``: fp32, bf16, int8 on a CPU; :mod:`namc.backends.precision`) and decoding over a
  shortlist of tokens (``shortlist``: random ids for namc and the peer alike, or a fine-tuned model's own list).
- **Dense matmul throughput** of the machine (:mod:`.machine`) and the **decode FLOP efficiency**: analytic decoder
  FLOPs (:mod:`.flops`) per second at the median time over that matmul FLOP/s.
- **Training throughput** (:mod:`.training`, optional): pre-training steps/s and pairs/s, and the cost of the
  paper's pre-training run on this device.

:func:`run_benchmark` (:mod:`.harness`) returns the report, a JSON-ready dict laid out as :data:`REPORT_SCHEMA`
(:mod:`.schema`; docs/benchmark_schema.md is rendered from it by :mod:`.schema_doc`); :func:`validate_report` and
:func:`format_table` (:mod:`.report`) read it; :func:`main` (:mod:`.cli`) is ``namc benchmark``. Every module here
works with the core install (no Lightning, jsonargparse, pycocoevalcap, TensorBoard or matplotlib).

The names below load on first use (PEP 562): ``namc benchmark`` parses its options, and re-runs itself under
``--omp-wait-policy``, before torch loads (:mod:`.cli` and :mod:`.settings` import no torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from namc.eval.throughput.baselines import generate_reference, generate_uncached  # noqa: F401
    from namc.eval.throughput.cli import build_parser, main  # noqa: F401
    from namc.eval.throughput.clip4idc import CLIP4IDCPeer, peer_at  # noqa: F401
    from namc.eval.throughput.flops import decoder_flops  # noqa: F401
    from namc.eval.throughput.harness import load_model, run_benchmark  # noqa: F401
    from namc.eval.throughput.inference import (  # noqa: F401
        decoding_shortlist,
        generated_lengths,
        length_mode,
        random_shortlist,
        run_inference,
    )
    from namc.eval.throughput.machine import describe_machine, measure_matmul  # noqa: F401
    from namc.eval.throughput.report import format_table, validate_report  # noqa: F401
    from namc.eval.throughput.schema import REPORT_SCHEMA, SCHEMA_VERSION  # noqa: F401
    from namc.eval.throughput.settings import PAPER_TABLE5, BenchmarkInputError, BenchmarkSettings  # noqa: F401
    from namc.eval.throughput.timing import peak_memory, summarize, time_calls  # noqa: F401
    from namc.eval.throughput.training import run_training, synthetic_pretrain_batch  # noqa: F401

# module (under namc.eval.throughput) -> the public names it defines
_MODULES = {
    "baselines": ("generate_reference", "generate_uncached"),
    "cli": ("build_parser", "main"),
    "clip4idc": ("CLIP4IDCPeer", "peer_at"),
    "flops": ("decoder_flops",),
    "harness": ("load_model", "run_benchmark"),
    "inference": ("decoding_shortlist", "generated_lengths", "length_mode", "random_shortlist", "run_inference"),
    "machine": ("describe_machine", "measure_matmul"),
    "report": ("format_table", "validate_report"),
    "schema": ("REPORT_SCHEMA", "SCHEMA_VERSION"),
    "settings": ("PAPER_TABLE5", "BenchmarkInputError", "BenchmarkSettings"),
    "timing": ("peak_memory", "summarize", "time_calls"),
    "training": ("run_training", "synthetic_pretrain_batch"),
}
_EXPORTS = {name: f"{__name__}.{module}" for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
