"""What the throughput harness measures (:class:`BenchmarkSettings`) and the constants it reports against.

Table 5 of the paper, the size of the paper's pre-training run, the inference levels, naive decoders and length modes
the harness knows, and the environment variables that change CPU threading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BACKEND_MODES",
    "DTYPES",
    "LENGTH_MODES",
    "MODES",
    "PAPER_TABLE5",
    "PRECISIONS",
    "PRETRAIN_DEVICES",
    "PRETRAIN_EPOCHS",
    "PRETRAIN_PAIRS",
    "INT8_GRIDS",
    "REFERENCES",
    "SHORTLIST_OF_MODEL",
    "THREADING_ENV",
    "BenchmarkInputError",
    "BenchmarkSettings",
    "backend_run",
]

#: Table 5 of the paper (inference on one RTX 3090, appendix F): total parameters and generated tokens per second.
PAPER_TABLE5: tuple[dict[str, Any], ...] = (
    {"model": "CLIP4IDC (2022)", "parameters": 173_700_000, "tokens_per_s": 1789.44},
    {"model": "FINER (2024)", "parameters": 7_900_000_000, "tokens_per_s": 48.51},
    {"model": "BLIP2IDC (2025)", "parameters": 3_800_000_000, "tokens_per_s": 106.17},
    {"model": "NAMC (Ours)", "parameters": 64_200_000, "tokens_per_s": 2248.53},
)
PRETRAIN_PAIRS = 770_000  # section 3.1.1: "approximately 770K synthetic and real image pairs"
PRETRAIN_EPOCHS = 20  # appendix F: "Pre-training is carried out for 20 epochs"
PRETRAIN_DEVICES = 8  # appendix F: "a batch size of 512, distributed across 8 AMD MI250x GPUs"

MODES = ("decode", "grid", "e2e")
REFERENCES = ("none", "decode", "clip4idc", "all")
# what the CLIP4IDC peer's linear maps run as (clip4idc.linear_form)
LINEAR_FORMS = ("fp32", "bf16", "onednn_fp32", "onednn_fp32_prepacked", "onednn_bf16_prepacked", "int8_dynamic")
PRECISIONS = ("fp32", "bf16", "int8")  # namc.backends.precision.PRECISIONS (models may not import eval)
INT8_GRIDS = ("static", "fp32")
LENGTH_MODES = ("fixed", "eos")
SHORTLIST_OF_MODEL = "model"  # settings.shortlist: the model's own training_shortlist
# namc.backends.BACKENDS (kept here too: this module imports nothing that loads torch)
BACKENDS = ("torch", "cpu", "cuda", "onnxruntime", "openvino")
BACKEND_MODES = ("decode", "e2e")  # the levels a compiled captioner runs (it takes no pre-extracted grids)


def backend_run(spec: str, precision: str) -> tuple[str, str]:
    """``backend`` or ``backend:precision`` (``settings.backends``) -> (backend, precision), ``precision`` where the
    spec names none; BenchmarkInputError for an unknown backend or precision."""
    backend, _, named = spec.partition(":")
    if backend not in BACKENDS or (named and named not in PRECISIONS):
        raise BenchmarkInputError(
            f"--backend {spec!r}: want BACKEND or BACKEND:PRECISION, BACKEND one of {', '.join(BACKENDS)}, PRECISION "
            f"one of {', '.join(PRECISIONS)}"
        )
    return backend, named or precision


class BenchmarkInputError(ValueError):
    """What the benchmark was asked to run cannot run (no such model, a damaged folder, no list of its own): the
    command line prints it as one line, where an error inside a run keeps its traceback."""


# Names, not torch objects: this module imports no torch, so `namc benchmark` parses its options (and re-runs itself
# under --omp-wait-policy) before torch loads
DTYPES = ("float32", "float16", "bfloat16")  # torch.float32, ...
DEVICE = re.compile(r"(cpu|cuda)(:\d+)?")  # what settings.device may say
#: environment variables that change CPU threading behaviour; recorded in every report
THREADING_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "KMP_BLOCKTIME")


@dataclass
class BenchmarkSettings:
    """What to measure. Field names are the JSON ``settings`` keys (docs/benchmark_schema.md).

    Attributes:
        model: a preset name (``namc_base``, ``namc_tiny``) or a folder written by ``save_pretrained``.
        batch_sizes: image pairs per call.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: ``float32``; ``float16`` / ``bfloat16`` on CUDA only (the whole model converted).
        precision: ``fp32``, ``bf16`` or ``int8``: on a CPU, namc runs its inference copy at that precision
            (:mod:`namc.backends.precision`) and the CLIP4IDC peer a copy converted the same way.
        reference_precision: the peer's precision where it differs (None: ``precision``), to compare each model at
            its fastest in one interleaved run (on a CPU with AMX the peer decodes faster in bf16 than in int8).
        int8_grid: with ``precision="int8"``, the grid's ResNet blocks in ``static`` int8 (with the model's own
            calibration where it has one, e.g. from a saved folder; else :func:`namc.backends.precision.calibrate_int8`
            on the benchmark's own synthetic images: the scales change no timing, and no caption here means
            anything) or in ``fp32`` (what an uncalibrated model runs). A model passed in keeps its calibration.
        threads: ``torch.set_num_threads`` (None: leave torch's default).
        max_new_tokens: tokens generated per pair (23 in the paper, appendix F).
        length_mode: ``fixed`` (EOS ignored: exactly ``max_new_tokens`` per pair) or ``eos``.
        modes: inference levels among ``decode``, ``grid``, ``e2e``.
        warmup: untimed calls before timing, per measurement.
        repeats: timed calls per measurement.
        reference: what to compare with: ``none``, ``decode`` (namc's decoder without a cache), ``clip4idc`` (the
            CLIP4IDC peer, :mod:`.clip4idc`: decode-only and end to end, interleaved with namc) or ``all``.
        reference_repeats: timed calls of the naive decoder, and timed rounds of each peer comparison.
        gemm_size: side of the square matmul whose FLOP/s is the efficiency reference.
        static_decode: decode with :class:`~namc.backends.static_decode.StaticDecoder` (fixed-shape steps over a
            static KV cache; on CUDA one CUDA graph per batch size, replayed at every step) in every level.
        shortlist: decode over this many tokens instead of the whole vocabulary (:mod:`namc.models.shortlist`):
            namc and the CLIP4IDC peer alike project onto that many ids of their vocabularies, drawn with ``seed``
            ([EOS] among them); ``"model"``: namc over the model's own list (``training_shortlist``, what a folder
            fine-tuned by ``namc fit`` keeps in ``shortlist.json``), the peer over as many random ids; 0 (default):
            the whole vocabulary.
        train_batch_size: pairs per training step; 0 skips the training measurement.
        train_steps: timed training steps.
        train_warmup: untimed training steps.
        train_vqgan: run the VQGAN tokenizer in every pre-training step (default: precomputed codes, as packed
            shards carry them).
        seed: seeds the synthetic inputs.
        backends: ``backend`` or ``backend:precision`` runs (:func:`backend_run`; the precision defaults to
            ``precision``): the inference rows come from ``namc.compile(model, backend, precision)`` for each, at
            the levels in ``modes`` a captioner runs (:data:`BACKEND_MODES`), beside the CLIP4IDC peer; empty
            (default): one run of :mod:`namc.backends.precision`'s copy at ``precision``, every level.
    """

    model: str = "namc_tiny"
    batch_sizes: tuple[int, ...] = (1, 32)
    device: str = "cpu"
    dtype: str = "float32"
    precision: str = "fp32"
    reference_precision: str | None = None
    int8_grid: str = "static"
    threads: int | None = None
    max_new_tokens: int = 23
    length_mode: str = "fixed"
    modes: tuple[str, ...] = MODES
    warmup: int = 1
    repeats: int = 5
    reference: str = "decode"
    reference_repeats: int = 1
    gemm_size: int = 1024
    static_decode: bool = False
    shortlist: int | str = 0
    train_batch_size: int = 0
    train_steps: int = 3
    train_warmup: int = 1
    train_vqgan: bool = False
    seed: int = 0
    backends: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.device = str(self.device)  # a torch.device too
        self.batch_sizes = tuple(int(b) for b in self.batch_sizes)
        self.modes = tuple(self.modes)
        self.backends = tuple(self.backends)
        self._check_choices()
        self._check_counts()
        self._check_combinations()

    def _check_choices(self) -> None:
        """Batch sizes are positive, and each option that names one of a fixed set of values names one of them."""
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise BenchmarkInputError(f"batch sizes must be positive, got {self.batch_sizes}")
        if self.dtype not in DTYPES:
            raise BenchmarkInputError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.length_mode not in LENGTH_MODES:
            raise BenchmarkInputError(f"length_mode must be one of {LENGTH_MODES}, got {self.length_mode!r}")
        if self.reference not in REFERENCES:
            raise BenchmarkInputError(f"reference must be one of {REFERENCES}, got {self.reference!r}")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise BenchmarkInputError(f"modes must be a non-empty subset of {MODES}, got {self.modes}")

    def _check_counts(self) -> None:
        """Repeats, steps, tokens and threads are in range."""
        if self.repeats < 1 or self.warmup < 0 or self.reference_repeats < 1:
            raise BenchmarkInputError("repeats and reference_repeats must be >= 1, warmup >= 0")
        if self.max_new_tokens < 1:
            raise BenchmarkInputError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.train_batch_size < 0 or self.train_steps < 1 or self.train_warmup < 0:
            raise BenchmarkInputError("train_batch_size must be >= 0, train_steps >= 1, train_warmup >= 0")
        if self.threads is not None and self.threads < 1:
            raise BenchmarkInputError(f"threads must be >= 1, got {self.threads}")

    def _check_combinations(self) -> None:
        """The precisions, the device and the decoding options are valid and fit together."""
        if self.precision not in PRECISIONS:
            raise BenchmarkInputError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.reference_precision not in (None, *PRECISIONS):
            raise BenchmarkInputError(
                f"reference_precision must be one of {PRECISIONS}, not {self.reference_precision!r}"
            )
        if self.reference_precision is not None and self.reference not in ("clip4idc", "all"):
            raise BenchmarkInputError("reference_precision is the CLIP4IDC peer's: use it with reference clip4idc/all")
        if self.int8_grid not in INT8_GRIDS:
            raise BenchmarkInputError(f"int8_grid must be one of {INT8_GRIDS}, got {self.int8_grid!r}")
        if not DEVICE.fullmatch(self.device):
            raise BenchmarkInputError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        device_type = self.device.split(":", 1)[0]
        if self.reference_precision not in (None, "fp32") and (device_type != "cpu" or self.dtype != "float32"):
            raise BenchmarkInputError(f"reference_precision {self.reference_precision} is for CPU runs in float32")
        if self.precision != "fp32" and (device_type != "cpu" or self.dtype != "float32"):
            raise BenchmarkInputError(f"precision {self.precision} is for CPU runs in float32; on CUDA use --dtype")
        if self.shortlist != SHORTLIST_OF_MODEL and (
            isinstance(self.shortlist, bool) or not isinstance(self.shortlist, int) or self.shortlist < 0
        ):
            raise BenchmarkInputError(
                f"shortlist must be a token count >= 0 (0: the whole vocabulary) or {SHORTLIST_OF_MODEL!r} (the "
                f"model's own list), got {self.shortlist!r}"
            )
        runs = [backend_run(spec, self.precision) for spec in self.backends]
        if len(set(runs)) != len(runs):
            raise BenchmarkInputError(f"backends names a run twice: {self.backends}")
        if runs and not set(self.modes) <= set(BACKEND_MODES):
            raise BenchmarkInputError(
                f"with backends the levels are {' and '.join(BACKEND_MODES)} (a compiled captioner takes pixels or "
                f"E_MIR, not grids), got modes {self.modes}"
            )
        if runs and (self.static_decode or self.dtype != "float32"):
            raise BenchmarkInputError("backends run as namc.compile builds them: no static_decode or dtype")
        if device_type != "cuda" and self.dtype != "float32":
            raise BenchmarkInputError(f"{self.dtype} is measured on CUDA only; use float32 on {self.device}")
