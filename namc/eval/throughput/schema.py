"""The layout of the throughput report, stated once: :data:`REPORT_SCHEMA`, a JSON Schema with every field described.

:func:`~namc.eval.throughput.report.validate_report` checks reports against it, and docs/benchmark_schema.md is
rendered from it (:mod:`namc.eval.throughput.schema_doc`). Changes that remove or rename a field, or change a unit
or meaning, bump :data:`SCHEMA_VERSION`; new optional fields may be added without a bump.

The schema uses a subset of JSON Schema (``type``, ``required``, ``properties``, ``additionalProperties``,
``items``, ``enum``, ``minimum``, ``const``, ``$ref`` and ``description``), so checking needs no extra package.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from namc.eval.throughput.settings import (
    BACKENDS,
    DTYPES,
    INT8_GRIDS,
    LENGTH_MODES,
    LINEAR_FORMS,
    MODES,
    PRECISIONS,
    REFERENCES,
    SHORTLIST_OF_MODEL,
    THREADING_ENV,
    BenchmarkSettings,
)

__all__ = ["REPORT_SCHEMA", "SCHEMA_VERSION"]

SCHEMA_VERSION = 13  # 2: the CLIP4IDC peer replaced the `pixels` naive decoder; precision. 3: required
# machine.allocator, settings.static_decode, training.pretrain_estimate.devices / hours_on_devices. 4: required
# settings.shortlist. 5: settings.shortlist may be "model"; required model.shortlist. 6: required machine.int8_kernels.
# 7: required peer.linear_maps (the peer converted as namc). 8: required model.part_precisions in place of
# model.grid_precision. 9: peer.linear_maps onednn_fp32_prepacked. 10: required machine.cpu_kernels (two CPUs of one
# model name can run bf16 and int8 on different kernels). 11: required peer.encoder_linear_maps (AMX: see there).
# 12: required settings.backends, backend and precision of every inference and reference row. 13: no settings.compile
# (the compiled decoding step was removed: no faster than eager)


def _field(kind: str | list[str], description: str, **keywords: Any) -> dict[str, Any]:
    """A node of JSON type ``kind`` (a list: any of them) with further ``keywords`` (``minimum``, ``items``, ...)."""
    return {"type": kind, **keywords, "description": description}


def _enum(values: Any, description: str) -> dict[str, Any]:
    return {"enum": list(values), "description": description}


def _ref(name: str, description: str) -> dict[str, Any]:
    """A node laid out as the shared definition ``name`` (``stats``, ``memory``)."""
    return {"$ref": f"#/$defs/{name}", "description": description}


def _object(properties: dict[str, Any], description: str | None = None, nullable: bool = False) -> dict[str, Any]:
    """An object whose ``properties`` are all required (``nullable``: or null)."""
    kind = ["object", "null"] if nullable else "object"
    node = {"type": kind, "required": list(properties), "properties": properties}
    return node if description is None else node | {"description": description}


_STATS = _object(
    {
        "median": _field("number", "median over the calls (the figure to quote)"),
        "min": _field("number", "smallest value"),
        "max": _field("number", "largest value"),
        "mean": _field("number", "arithmetic mean"),
        "spread": _field("number", "`(max - min) / median` (0 for one call)", minimum=0),
        "n": _field("integer", "number of timed calls", minimum=1),
        "samples": _field("array", "the per-call values, in call order", items={"type": "number"}),
    },
    "summary of per-call values over the timed calls of one measurement",
)
_MEMORY = _object(
    {
        "method": _enum(
            ["cuda_max_memory_allocated", "linux_vmhwm", "unavailable"],
            "how it was measured: `cuda_max_memory_allocated` on a GPU, `linux_vmhwm` on a CPU under Linux",
        ),
        "peak_bytes": _field(
            ["integer", "null"],
            "GPU: `torch.cuda.max_memory_allocated` during the call (weights included). CPU: the process's peak "
            "resident set (`VmHWM`, reset through `/proc/self/clear_refs` before the call)",
        ),
        "delta_bytes": _field(
            ["integer", "null"],
            "GPU: peak minus the memory allocated before the call. CPU: peak RSS minus the RSS before the call, after "
            "freed heap memory was returned to the OS (`malloc_trim`); memory the allocator keeps from earlier calls "
            "is not counted again",
        ),
    },
    "peak memory of one extra call after the timed ones",
)

_LENGTH_MODE = "`fixed`: [EOS] disabled, every pair generates `max_new_tokens`; `eos`: generation stops at [EOS]"
_SETTINGS = {
    "model": _field("string", "preset name or `save_pretrained` folder"),
    "batch_sizes": _field("array", "image pairs per call", items={"type": "integer", "minimum": 1}),
    "device": _field("string", "`cpu`, `cuda`, `cuda:N`"),
    "dtype": _enum(DTYPES, "half precision on CUDA only"),
    "precision": _enum(
        PRECISIONS, "CPU inference precision of namc and the peer (`namc.backends.precision`); `fp32` on CUDA"
    ),
    "reference_precision": _enum([*PRECISIONS, None], "the CLIP4IDC peer's CPU precision (null: `precision`)"),
    "int8_grid": _enum(
        INT8_GRIDS, "with `precision` int8: the grid blocks in static int8 (calibrated on the synthetic inputs) or fp32"
    ),
    "threads": _field(["integer", "null"], "`torch.set_num_threads` for the run (null: torch's default)"),
    "max_new_tokens": _field("integer", "generation limit (23 in the paper, appendix F)", minimum=1),
    "length_mode": _enum(LENGTH_MODES, _LENGTH_MODE),
    "modes": _field("array", "levels measured", items={"enum": list(MODES)}),
    "warmup": _field("integer", "untimed calls before each measurement", minimum=0),
    "repeats": _field("integer", "timed calls per measurement", minimum=1),
    "reference": _enum(REFERENCES, "what namc is compared with: the naive decoder, the CLIP4IDC peer (`all`: both)"),
    "reference_repeats": _field(
        "integer", "timed calls of the naive decoder (no warm-up); timed rounds of each peer comparison", minimum=1
    ),
    "gemm_size": _field("integer", "side of the square matmul", minimum=1),
    "static_decode": _field(
        "boolean", "decoding ran in fixed-shape steps over a static KV cache (a CUDA graph per batch size on CUDA)"
    ),
    "shortlist": {
        "anyOf": [{"type": "integer", "minimum": 0}, {"const": SHORTLIST_OF_MODEL}],
        "description": "what decoding projected onto (`namc.models.shortlist`): a count, that many random ids drawn "
        "with `seed` ([EOS] among them) for namc and the peer alike, 0 the whole vocabulary; `model`: namc over the "
        "model's own list (`model.shortlist`), the peer over as many random ids",
    },
    "train_batch_size": _field("integer", "pairs per training step (0: no training measurement)", minimum=0),
    "train_steps": _field("integer", "timed training steps", minimum=1),
    "train_warmup": _field("integer", "untimed training steps", minimum=0),
    "train_vqgan": _field("boolean", "the VQGAN tokenizer ran in each pre-training step (false: precomputed codes)"),
    "seed": _field("integer", "seed of the synthetic inputs"),
    "backends": _field(
        "array",
        "`backend` or `backend:precision` runs through `namc.compile` (precision default: `precision`), each timed at "
        "`decode` and `e2e`; empty: the run of `precision`'s copy at every level",
        items={"type": "string"},
    ),
}

_GPU = {
    "name": _field("string", "`torch.cuda.get_device_properties(device).name`"),
    "capability": _field("string", 'compute capability, e.g. `"8.6"`'),
    "memory_bytes": _field("integer", "GPU memory"),
    "count": _field("integer", "`torch.cuda.device_count()`"),
    "cuda_version": _field(["string", "null"], "`torch.version.cuda`"),
}
_CPU_KERNELS = {
    "capability": _field("string", "`torch.backends.cpu.get_cpu_capability()`: `AVX2`, `AVX512`, ..."),
    "onednn_bf16": _field("boolean", "oneDNN runs bf16 (`namc.backends.onednn.bf16_supported`), else bf16 runs fp32"),
    "int8_activation_bits": _enum([7, 8], "8 with VNNI (`namc.backends.qlinear.full_range`), else 7"),
}
_MACHINE = {
    "env": {
        "type": "object",
        "required": list(THREADING_ENV),
        "additionalProperties": {"type": ["string", "null"]},
        "description": "the threading environment variables "
        + ", ".join(f"`{name}`" for name in THREADING_ENV)
        + " (null when unset): on a shared machine `OMP_WAIT_POLICY` alone can change CPU figures several-fold "
        "(`namc benchmark --omp-wait-policy passive`)",
    },
    "cpu_model": _field("string", "`/proc/cpuinfo` model name (or `platform.processor()`)"),
    "logical_cpus": _field(["integer", "null"], "`os.cpu_count()`"),
    "usable_cpus": _field(["integer", "null"], "CPUs this process may run on (`os.sched_getaffinity`)"),
    "torch_threads": _field("integer", "`torch.get_num_threads()` during the run"),
    "torch_interop_threads": _field("integer", "`torch.get_num_interop_threads()`"),
    "load_average": _field(
        ["array", "null"],
        "1, 5, 15-minute load averages when the run started: a shared machine's timings are only as good as this",
        items={"type": "number"},
    ),
    "memory_bytes": _field(["integer", "null"], "total RAM"),
    "platform": _field("string", "`platform.platform()`"),
    "python_version": _field("string", "`platform.python_version()`"),
    "torch_version": _field("string", "`torch.__version__`"),
    "mkl": _field("boolean", "torch's MKL is available"),
    "mkldnn": _field("boolean", "torch's oneDNN (MKL-DNN) is available"),
    "int8_kernels": _enum(
        ["quantized", "plain"],
        "the kernels int8 layers run on here (`namc.backends.qlinear.int8_kernels`): PyTorch's quantised dtypes, or "
        "plain int8 / uint8 tensors into oneDNN's int8 linear (a torch without quantised dtypes, or "
        "`NAMC_INT8_KERNELS=plain`)",
    ),
    "cpu_kernels": _object(_CPU_KERNELS, "what this CPU's kernels can do, which decides what bf16 and int8 run"),
    "device": _field("string", "the measured device"),
    "gpu": _object(_GPU, "the GPU of CUDA runs, else null", nullable=True),
    "allocator": _object(
        {
            "glibc": _field(["string", "null"], "the glibc version (`platform.libc_ver()`), null without glibc"),
            "ld_preload": _field(["string", "null"], "`LD_PRELOAD` (an allocator preloaded there rules instead)"),
            "reuse_freed_memory": _field(
                "boolean",
                "glibc's malloc kept freed memory for reuse (`namc.runtime.reuse_freed_memory`, `--allocator reuse`): "
                "namc_base's batch-32 int8 captioning ran up to 1.3x faster with it alone in a process",
            ),
        },
        "the C allocator the run's tensors came from",
    ),
}

_PARAMETER_COUNTS = {
    "total": "every module built, NIM and VQGAN included",
    "inference": "grid + MIR + FDG, pre-training heads excluded: what captioning uses",
    "grid": "the ResNet grid encoder",
    "mir": "MIR, its pre-training heads included",
    "fdg": "FDG",
    "nim": "NIM (0 without the pre-training modules)",
    "vqgan": "the VQGAN tokenizer (0 without the pre-training modules)",
}
_MODEL = {
    "name": _field("string", "`config.name`"),
    "source": _enum(["preset", "directory", "object"], "`object`: a model passed to `run_benchmark`"),
    "image_size": _field("integer", "pixels per side"),
    "dim": _field("integer", "width D"),
    "heads": _field("integer", "attention heads"),
    "mir_layers": _field("integer", "encoder (MIR) layers"),
    "fdg_layers": _field("integer", "decoder (FDG) layers"),
    "vocab_size": _field("integer", "V"),
    "memory_positions": _field("integer", "N, grid positions per image (196 at 224 px)"),
    "part_precisions": _object(
        {part: _enum(PRECISIONS, f"what {part} ran in") for part in ("grid", "mir", "decoder", "vocabulary")},
        "`namc.backends.precision.part_precisions`: `decoder` FDG's largest layer matrices, `vocabulary` its "
        "projection; a bf16 or int8 copy keeps a narrow model's small matrices in fp32, int8 an uncalibrated grid",
    ),
    "shortlist": _object(
        {
            "source": _enum(["random", "model"], "random ids, or the model's own `training_shortlist`"),
            "size": _field("integer", "tokens listed, [EOS] among them", minimum=1),
        },
        "what namc decoded over (`settings.shortlist`); null: the whole vocabulary",
        nullable=True,
    ),
    "parameters": _object(
        {name: _field("integer", meaning, minimum=0) for name, meaning in _PARAMETER_COUNTS.items()},
        "`NAMC.num_parameters()`; the other counts that method returns are kept too",
    ),
    "parameters_paper_style": _object(
        {
            "paper": _field("integer", "Table 5's count for NAMC (64.2M)"),
            "vocab_embedding": _field("integer", "FDG's tied BPE embedding / vocabulary projection (V x D)"),
            "inference_without_vocab_embedding": _field("integer", "`parameters.inference` minus that embedding"),
            "inference_without_grid": _field("integer", "`parameters.inference` minus the ResNet grid encoder"),
            "mir_fdg_without_vocab_embedding": _field("integer", "MIR + FDG without the embedding"),
        },
        "counts to set beside the paper's, which leaves parts of what runs at inference out",
    ),
}

_MATMUL = {
    "size": _field(
        "integer",
        "side n of the square GEMM (default 1024: about the decoder's per-step work at batch 32 for namc_base)",
    ),
    "dtype": _field("string", "the run's dtype"),
    "flops_per_call": _field("number", "`2 n^3`"),
    "backends": _field(
        "object",
        "backend name -> stats of FLOP/s: `torch.mm`; on CPU in float32 and bf16 `onednn` and `onednn_prepacked` "
        "(FDG's kernel for large matrices, on the plain and the reordered matrix); int8 `int8_dynamic_linear`",
        additionalProperties={"$ref": "#/$defs/stats"},
    ),
    "best_backend": _field("string", "the backend with the highest median"),
    "flops_per_s": _field("number", "that median, the larger of `runs`: the reference of `efficiency`", minimum=0),
    "runs": _field(
        "array",
        "the best backend's median FLOP/s measured before and after the timed calls",
        items={"type": "number", "minimum": 0},
    ),
}

_FLOPS = {
    "per_call": _field("number", "analytic FLOPs of the call (`namc.eval.throughput.decoder_flops`)"),
    "prefill_per_call": _field("number", "the part spent on the memory's cross-attention K/V (once per pair)"),
    "per_token_mean": _field("number", "mean FLOPs of one generated token"),
    "achieved_per_s": _field("number", "`per_call / time_s.median`"),
    "matmul_per_s": _field(["number", "null"], "`matmul.flops_per_s`"),
    "efficiency": _field(["number", "null"], "`achieved_per_s / matmul_per_s` (a fraction, 0.3 = 30 %)"),
}
_ROW_RUN = {
    "backend": _enum(BACKENDS, "the `namc.compile` backend namc ran on (`cpu`: the copy of `precision` on a CPU)"),
    "precision": _enum(PRECISIONS, "the precision namc ran at on that backend"),
}
_INFERENCE = {
    **_ROW_RUN,
    "batch_size": _field("integer", "B", minimum=1),
    "mode": _enum(MODES, "the level: `decode` from E_MIR, `grid` from ResNet grids, `e2e` from pixels"),
    "length_mode": _enum(LENGTH_MODES, _LENGTH_MODE),
    "max_new_tokens": _field("integer", "generation limit"),
    "tokens_per_call": _field("integer", "generated tokens per call, summed over the B pairs", minimum=0),
    "time_s": _ref("stats", "seconds per call"),
    "tokens_per_s": _ref("stats", "generated tokens per second"),
    "pairs_per_s": _ref("stats", "image pairs per second"),
    "latency_s_per_pair": _field("number", "`time_s.median / B`; at B = 1 the latency of one pair"),
    "peak_memory": _ref("memory", "peak memory of one call"),
    "flops": _object(_FLOPS, "decode FLOP efficiency: `decode` entries only, else null", nullable=True),
}

_REFERENCE = {
    **_ROW_RUN,
    "batch_size": _field("integer", "B", minimum=1),
    "mode": _enum(
        ["decode", "clip4idc_decode", "clip4idc_e2e"],
        "`decode`: FDG without a cache from the same memory; `clip4idc_decode`: the CLIP4IDC peer decoding from its "
        "visual memory; `clip4idc_e2e`: the peer from the same pixels",
    ),
    "compared_with": _enum(["decode", "e2e"], "the optimised level it is compared with"),
    "length_mode": _enum(LENGTH_MODES, _LENGTH_MODE),
    "max_new_tokens": _field("integer", "generation limit"),
    "tokens_per_call": _field("integer", "generated tokens per call", minimum=0),
    "time_s": _ref("stats", "seconds per call"),
    "tokens_per_s": _ref("stats", "generated tokens per second"),
    "speedup": _field(
        ["number", "null"],
        "`time_s.median` / namc's median time at the compared level (for the peer: namc's calls interleaved with "
        "it, `namc_time_s`); null when that level was not timed",
    ),
    "tokens_match": _field(["boolean", "null"], "both decoders produced identical ids (null for the peer)"),
    "namc_time_s": _STATS
    | {
        "type": ["object", "null"],
        "description": "peer entries: seconds per call of namc's calls interleaved with the peer's (a `stats` "
        "object); null for the naive decoder",
    },
}

_PEER = {
    "name": _field("string", "`CLIP4IDC`"),
    "parameters": _object(
        {
            "total": _field("integer", "every parameter (the full CLIP model, cross encoder, decoder)", minimum=0),
            "inference": _field("integer", "what captioning runs (CLIP's text transformer excluded)", minimum=0),
        },
        "`CLIP4IDCPeer.num_parameters()`",
    ),
    "paper_parameters": _field("integer", "Table 5's count (173.7M)"),
    "linear_maps": _enum(
        LINEAR_FORMS,
        (
            "what every linear map of the peer's decoding (cross encoder, decoder, vocabulary head), attention "
            "projections included, ran as (`clip4idc.peer_at`; until schema 10 every linear map of the peer): plain "
            "`F.linear` in fp32 or bf16 (off the CPU, or without oneDNN), oneDNN's kernel on prepacked fp32 (plain "
            "until schema 8) or bf16 weights, or dynamic int8 layers; schema 6 and before timed a peer whose attention "
            "stayed fp32 in int8, whose bf16 weights were not prepacked and whose fp32 products ran on `F.linear`"
        ),
    ),
    "encoder_linear_maps": _enum(
        LINEAR_FORMS,
        (
            "what the linear maps of the peer's ViT ran as: as `linear_maps`, but `onednn_bf16_prepacked` for int8 on "
            "a CPU with AMX, with its cross encoder and keys / values of the memory, as namc's int8 MIR and prefill "
            "there"
        ),
    ),
}

_ESTIMATE = {
    "pairs": _field("integer", "770,000 (section 3.1.1)"),
    "epochs": _field("integer", "20 (appendix F)"),
    "devices": _field("integer", "8, the paper's pre-training devices (appendix F: 8 AMD MI250x, batch 512 in all)"),
    "hours_on_devices": _field(
        "number", "`hours` / `devices`: data parallel at this per-device batch, linear scaling assumed (a lower bound)"
    ),
    "hours": _field("number", "pairs x epochs / `pairs_per_s.median` / 3600, on this device at this batch size"),
    "hours_min": _field("number", "the same at the fastest step"),
    "hours_max": _field("number", "the same at the slowest step"),
}
_TRAINING = {
    "kind": _enum(
        ["pretrain", "finetune"],
        "`pretrain` (`namc.objectives.pretrain_step`: NIM + MIR + FDG) or `finetune` (`finetune_step`, for models "
        "built without the pre-training modules)",
    ),
    "batch_size": _field("integer", "pairs per step", minimum=1),
    "vqgan_in_step": _field("boolean", "the VQGAN tokenizer ran in the step (false: precomputed codes)"),
    "autocast_dtype": _field(
        ["string", "null"], "`float16` / `bfloat16` under `torch.autocast` (fp32 weights, Adam), null in float32"
    ),
    "time_s": _ref("stats", "seconds per step: forward + backward + Adam step + zeroing gradients"),
    "steps_per_s": _ref("stats", "steps per second"),
    "pairs_per_s": _ref("stats", "image pairs per second"),
    "peak_memory": _ref("memory", "peak memory of one step"),
    "pretrain_estimate": _object(_ESTIMATE, "`pretrain` only: the paper's pre-training on this device", nullable=True),
}

_PAPER_ROW = {
    "model": _field("string", "the method (and its year)"),
    "parameters": _field("integer", "total parameters"),
    "tokens_per_s": _field("number", "generated tokens per second at inference on one RTX 3090"),
}

#: JSON Schema of the report (see the module docstring for the subset it uses); docs/benchmark_schema.md renders it.
REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "namc benchmark report",
    **_object(
        {
            "schema_version": {"const": SCHEMA_VERSION, "description": "version of this layout"},
            "created_utc": _field("string", "end of the run, `YYYY-MM-DDTHH:MM:SSZ`"),
            "namc_version": _field("string", "`namc.__version__`"),
            "settings": {
                **_object(_SETTINGS, "the run's `BenchmarkSettings`"),
                "required": [f.name for f in dataclasses.fields(BenchmarkSettings)],
            },
            "machine": _object(_MACHINE, "the machine"),
            "model": _object(_MODEL, "the model"),
            "matmul": _object(_MATMUL, "dense matmul throughput of the machine"),
            "inference": _field("array", "one entry per (batch size, mode), in run order", items=_object(_INFERENCE)),
            "reference": _field(
                "array",
                'one entry per (batch size, naive decoder); empty with `reference="none"`',
                items=_object(_REFERENCE),
            ),
            "peer": _object(_PEER, "the CLIP4IDC peer; null unless `reference` is `clip4idc` or `all`", nullable=True),
            "training": _object(_TRAINING, "training throughput; null when `train_batch_size` is 0", nullable=True),
            "paper_table5": _field("array", "the paper's Table 5, for comparison", items=_object(_PAPER_ROW)),
            "load_average_end": _field(
                ["array", "null"],
                "1, 5 and 15-minute load averages when the run ended (compare with `machine.load_average`)",
                items={"type": "number"},
            ),
        },
        "the report of one `namc benchmark` run",
    ),
    "$defs": {"stats": _STATS, "memory": _MEMORY},
}
