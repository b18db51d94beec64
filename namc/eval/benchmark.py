"""Throughput benchmark: the paper's Table 5 (parameters and generated tokens per second at inference) and more.

``namc benchmark --model namc_base --batch-sizes 1 32 --threads 2 --output bench.json`` measures, in one process:

- **Inference** at each batch size and level, after warm-up, over several repeats (median and spread):

  - ``decode``: FDG generation from precomputed MIR memory E_MIR (B, N, D); includes FDG's once-per-pair
    cross-attention key/value projection of the memory;
  - ``grid``: MIR interaction + FDG from precomputed ResNet grid features (the paper pre-extracts them,
    appendix E.2);
  - ``e2e``: from pixels, the ResNet grid included.

  Each reports generated tokens/s, pairs/s, seconds per pair and peak memory (CUDA max allocated on GPU, the peak
  resident-set growth on CPU).
- **The naive reference decoder** in the same process: ``reference="decode"`` runs
  :meth:`namc.models.fdg.FDG.generate_uncached` (no cache, every prefix position re-run and projected onto the
  vocabulary, cross-attention keys/values recomputed at every step) from the same memory; ``"pixels"`` runs
  :meth:`namc.NAMC.generate_reference` (also re-encodes both images at every step, like the CLIP4IDC peer code).
  The speed-up is the ratio of median times, and ``tokens_match`` says whether both decoders produced the same ids.
- **Dense matmul throughput** of the machine (a square GEMM in the run's dtype; on CPU both ``torch.mm`` and the
  oneDNN path the decoder uses, the faster one is the reference) and the **decode FLOP efficiency**: analytic
  decoder FLOPs (:func:`decoder_flops`) per second at the median time over that matmul FLOP/s.
- **Training throughput** (optional): pre-training steps/s and pairs/s (forward + backward + Adam) on a synthetic
  collator-format batch, and the resulting cost of the paper's pre-training run (770K pairs, section 3.1.1, x 20
  epochs, appendix F) on this device.

Length modes: with random weights, generation stops at arbitrary lengths, so ``length_mode="fixed"`` (the default)
disables [EOS] for the run and every row generates exactly ``max_new_tokens`` tokens; ``"eos"`` stops at [EOS] as
in real use and counts the tokens generated up to and including each row's first [EOS]. Every figure says which
mode it used. The JSON report layout is documented in ``docs/benchmark_schema.md`` (:data:`REPORT_SCHEMA`).

CPU threads: OpenMP's default lets idle worker threads spin. On a machine shared with other processes (a CI
runner, a 2-core VM) the spinning threads take the cores the main thread needs, and small-batch decoding ran
3-4x slower in our measurements (namc_base on 2 threads, batch 32: 123 tokens/s spinning vs 430 with
``OMP_WAIT_POLICY=PASSIVE``). ``--omp-wait-policy passive`` re-runs the benchmark in a child process with it set
(OpenMP reads it only when torch loads); every report records the threading variables in ``machine.env``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import datetime
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from namc.models.namc import NAMC

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1

#: Table 5 of the paper (inference on one RTX 3090, appendix F): total parameters and generated tokens per second.
PAPER_TABLE5: tuple[dict[str, Any], ...] = (
    {"model": "CLIP4IDC (2022)", "parameters": 173_700_000, "tokens_per_s": 1789.44},
    {"model": "FINER (2024)", "parameters": 7_900_000_000, "tokens_per_s": 48.51},
    {"model": "BLIP2IDC (2025)", "parameters": 3_800_000_000, "tokens_per_s": 106.17},
    {"model": "NAMC (Ours)", "parameters": 64_200_000, "tokens_per_s": 2248.53},
)
PRETRAIN_PAIRS = 770_000  # section 3.1.1: "approximately 770K synthetic and real image pairs"
PRETRAIN_EPOCHS = 20  # appendix F: "Pre-training is carried out for 20 epochs"

MODES = ("decode", "grid", "e2e")
REFERENCES = ("none", "decode", "pixels", "all")
LENGTH_MODES = ("fixed", "eos")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: environment variables that change CPU threading behaviour; recorded in every report
THREADING_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "KMP_BLOCKTIME")

# words for synthetic descriptions: in the tiny presets' word vocabulary and ordinary English for CLIP's BPE
_SYNTHETIC_WORDS = (
    "a", "small", "large", "red", "blue", "green", "gray", "brown", "purple", "cyan", "yellow", "rubber", "metal",
    "shiny", "matte", "cube", "sphere", "cylinder", "block", "ball", "object", "left", "right", "of", "behind", "in",
    "front", "next", "to", "near", "the", "with", "on",
)  # fmt: skip


# ----------------------------------------------------------------------------------------------- settings


@dataclass
class BenchmarkSettings:
    """What to measure. Field names are the JSON ``settings`` keys (docs/benchmark_schema.md).

    Attributes:
        model: a preset name (``namc_base``, ``namc_tiny``) or a folder written by ``save_pretrained``.
        batch_sizes: image pairs per call.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: ``float32``; ``float16`` / ``bfloat16`` on CUDA only.
        threads: ``torch.set_num_threads`` (None: leave torch's default).
        max_new_tokens: tokens generated per pair (23 in the paper, appendix F).
        length_mode: ``fixed`` (EOS ignored: exactly ``max_new_tokens`` per pair) or ``eos``.
        modes: inference levels among ``decode``, ``grid``, ``e2e``.
        warmup: untimed calls before timing, per measurement.
        repeats: timed calls per measurement.
        reference: naive decoder to compare with: ``none``, ``decode``, ``pixels`` or ``all``.
        reference_repeats: timed calls of the (slow) naive decoder.
        gemm_size: side of the square matmul whose FLOP/s is the efficiency reference.
        compile: ``torch.compile`` FDG's decoding step.
        train_batch_size: pairs per training step; 0 skips the training measurement.
        train_steps: timed training steps.
        train_warmup: untimed training steps.
        train_vqgan: run the VQGAN tokenizer in every pre-training step (default: precomputed codes, as packed
            shards carry them).
        seed: seeds the synthetic inputs.
    """

    model: str = "namc_tiny"
    batch_sizes: tuple[int, ...] = (1, 32)
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    max_new_tokens: int = 23
    length_mode: str = "fixed"
    modes: tuple[str, ...] = MODES
    warmup: int = 1
    repeats: int = 5
    reference: str = "decode"
    reference_repeats: int = 1
    gemm_size: int = 1024
    compile: bool = False
    train_batch_size: int = 0
    train_steps: int = 3
    train_warmup: int = 1
    train_vqgan: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        self.batch_sizes = tuple(int(b) for b in self.batch_sizes)
        self.modes = tuple(self.modes)
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch sizes must be positive, got {self.batch_sizes}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.length_mode not in LENGTH_MODES:
            raise ValueError(f"length_mode must be one of {LENGTH_MODES}, got {self.length_mode!r}")
        if self.reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, got {self.reference!r}")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"modes must be a non-empty subset of {MODES}, got {self.modes}")
        if self.repeats < 1 or self.warmup < 0 or self.reference_repeats < 1:
            raise ValueError("repeats and reference_repeats must be >= 1, warmup >= 0")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.train_batch_size < 0 or self.train_steps < 1 or self.train_warmup < 0:
            raise ValueError("train_batch_size must be >= 0, train_steps >= 1, train_warmup >= 0")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if torch.device(self.device).type != "cuda" and self.dtype != "float32":
            raise ValueError(f"{self.dtype} is measured on CUDA only; use float32 on {self.device}")


# ----------------------------------------------------------------------------------------------- timing


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """Median, min, max, mean and relative spread ``(max - min) / median`` of repeated measurements."""
    med = statistics.median(samples)
    return {
        "median": med,
        "min": min(samples),
        "max": max(samples),
        "mean": statistics.fmean(samples),
        "spread": (max(samples) - min(samples)) / med if med else 0.0,
        "n": len(samples),
        "samples": list(samples),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> tuple[list[float], Any]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls; also the last result."""
    result = None
    for _ in range(warmup):
        result = fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times, result


def _proc_status_kib(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _release_free_heap() -> None:
    """Return freed heap pages to the OS (glibc ``malloc_trim``) so that memory freed by earlier calls does not
    hide a call's own peak; a no-op without glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@contextlib.contextmanager
def peak_memory(device: torch.device) -> Iterator[dict[str, Any]]:
    """Measure the peak memory of the enclosed code; the yielded dict is filled on exit.

    CUDA: ``torch.cuda.max_memory_allocated`` (``peak_bytes``) and its growth over the memory allocated on entry
    (``delta_bytes``). CPU (Linux): freed heap memory is first returned to the OS (glibc ``malloc_trim``), the
    resident-set high-water mark is reset through ``/proc/self/clear_refs``, ``peak_bytes`` is ``VmHWM`` on exit
    and ``delta_bytes`` its growth over ``VmRSS`` on entry. Elsewhere the method is ``unavailable`` and both are
    None.
    """
    out: dict[str, Any] = {"method": "unavailable", "peak_bytes": None, "delta_bytes": None}
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        yield out
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device)
        out.update(method="cuda_max_memory_allocated", peak_bytes=peak, delta_bytes=peak - before)
        return
    _release_free_heap()
    before_kib = _proc_status_kib("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        resettable = before_kib is not None
    except OSError:
        resettable = False
    yield out
    peak_kib = _proc_status_kib("VmHWM") if resettable else None
    if peak_kib is not None and before_kib is not None:
        out.update(method="linux_vmhwm", peak_bytes=peak_kib * 1024, delta_bytes=max(0, peak_kib - before_kib) * 1024)


# ----------------------------------------------------------------------------------------------- machine


def describe_machine(device: torch.device) -> dict[str, Any]:
    """CPU model, cores, threads, load, memory, library versions and the GPU (if the device is one)."""
    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    except OSError:
        pass
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_bytes": int(props.total_memory),
            "count": torch.cuda.device_count(),
            "cuda_version": torch.version.cuda,
        }
    return {
        "env": {name: os.environ.get(name) for name in THREADING_ENV},
        "cpu_model": cpu_model,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "memory_bytes": mem_total,
        "platform": platform.platform(),
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "device": str(device),
        "gpu": gpu,
    }


# ----------------------------------------------------------------------------------------------- FLOPs


def measure_matmul(
    device: torch.device, dtype: torch.dtype, size: int, warmup: int = 2, repeats: int = 5
) -> dict[str, Any]:
    """FLOP/s of a square ``size`` x ``size`` GEMM (2 size^3 FLOPs per call).

    On a CPU in float32 the oneDNN kernel (``torch.ops.mkldnn._linear_pointwise``, the one FDG's decoding step
    uses) is timed besides ``torch.mm`` (MKL or OpenBLAS); ``flops_per_s`` is the faster backend's median, so an
    efficiency never looks better for using a different GEMM than the reference.
    """
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device, dtype)
    b = torch.randn(size, size, generator=gen).to(device, dtype)
    flops = 2.0 * size**3
    backends: dict[str, Callable[[], Any]] = {"torch.mm": lambda: torch.mm(a, b)}
    from namc.models.fdg import onednn_linear_available

    if device.type == "cpu" and dtype == torch.float32 and onednn_linear_available():
        backends["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")
    results = {}
    with torch.inference_mode():
        for name, fn in backends.items():
            times, _ = time_calls(fn, device, warmup, repeats)
            results[name] = summarize([flops / t for t in times])
    best = max(results, key=lambda k: results[k]["median"])
    return {
        "size": size,
        "dtype": str(dtype).removeprefix("torch."),
        "flops_per_call": flops,
        "backends": results,
        "best_backend": best,
        "flops_per_s": results[best]["median"],
    }


def decoder_flops(
    dim: int, heads: int, layers: int, hidden: int, vocab_size: int, memory_len: int, lengths: Sequence[int]
) -> dict[str, float]:
    """Analytic FLOPs (2 per multiply-add) of KV-cached greedy decoding, as FDG performs it.

    Per sequence, once: the cross-attention keys/values of the N memory positions, ``layers * 2 N D (2D)``.
    Per generated token at step t (t = 0, 1, ...; the self-attention cache then holds t + 1 keys), per layer:
    the fused query/key/value projection ``2 D (3D)``, self-attention scores and weighted sum ``4 (t + 1) D``, its
    output projection ``2 D D``, the cross-attention query and output projections ``2 * 2 D D``, cross-attention
    over the memory ``4 N D``, and the FFN ``2 * 2 D F``; then the vocabulary projection of the last position
    only, ``2 D V``. Layer norms, GELU, softmax and residual additions (O(D) per token) are not counted. The head
    count does not change the count (it splits D).

    Args:
        dim: D.
        heads: attention heads (kept for the record).
        layers: decoder layers.
        hidden: FFN hidden width F.
        vocab_size: V.
        memory_len: N memory positions.
        lengths: tokens generated for each row.

    Returns:
        ``total``, ``prefill`` (cross-attention keys/values) and ``per_token_mean`` FLOPs.
    """
    del heads
    D, N = dim, memory_len
    fixed = layers * (2 * D * 3 * D + 2 * D * D + 2 * 2 * D * D + 4 * N * D + 2 * 2 * D * hidden) + 2 * D * vocab_size
    prefill = len(lengths) * layers * 2 * N * D * 2 * D
    steps = 0.0
    for n in lengths:
        # sum over t < n of (fixed + layers * 4 (t + 1) D)
        steps += n * fixed + layers * 4 * D * n * (n + 1) / 2
    tokens = sum(lengths)
    return {
        "total": float(prefill + steps),
        "prefill": float(prefill),
        "per_token_mean": float(steps / tokens) if tokens else 0.0,
    }


def _fdg_shape(model: NAMC) -> dict[str, int]:
    fdg = model.fdg
    block = fdg.blocks[0]
    return {
        "dim": fdg.tok.weight.shape[1],
        "heads": fdg.heads,
        "layers": len(fdg.blocks),
        "hidden": block.ffn[0].out_features,
        "vocab_size": fdg.tok.weight.shape[0],
        "memory_len": model.grid_size**2,
    }


# ----------------------------------------------------------------------------------------------- generation


@contextlib.contextmanager
def length_mode(model: NAMC, mode: str) -> Iterator[None]:
    """``fixed``: [EOS] is disabled for the duration (FDG's and the tokenizer's ``eos_id`` are set to -1, an id
    no token has), so every row generates exactly ``max_new_tokens``; ``eos``: unchanged. Restored on exit."""
    if mode not in LENGTH_MODES:
        raise ValueError(f"length mode must be one of {LENGTH_MODES}, got {mode!r}")
    if mode == "eos":
        yield
        return
    saved = model.fdg.eos_id, model.tokenizer.eos_id
    model.fdg.eos_id = -1
    model.tokenizer.eos_id = -1
    try:
        yield
    finally:
        model.fdg.eos_id, model.tokenizer.eos_id = saved


def generated_lengths(ids: torch.Tensor, eos_id: int, max_new_tokens: int, mode: str) -> list[int]:
    """Tokens each row generated: ``max_new_tokens`` in ``fixed`` mode; in ``eos`` mode up to and including the
    row's first [EOS] (``max_new_tokens`` when it produced none).

    Args:
        ids: (B, T) generated ids.
        eos_id: the real [EOS] id.
        max_new_tokens: the generation limit.
        mode: ``fixed`` or ``eos``.
    """
    if mode == "fixed":
        return [max_new_tokens] * ids.shape[0]
    out = []
    for row in ids.tolist():
        out.append(row.index(eos_id) + 1 if eos_id in row else max_new_tokens)
    return out


def load_model(spec: str, device: torch.device) -> tuple[NAMC, str]:
    """A preset name or a ``save_pretrained`` folder -> (model on ``device`` in eval mode, ``preset``/``directory``)."""
    from namc.models._registry import create_model, list_models

    if Path(spec).is_dir():
        return NAMC.from_pretrained(spec).to(device).eval(), "directory"
    if spec in list_models():
        return create_model(spec).to(device).eval(), "preset"
    raise ValueError(f"--model {spec!r} is neither a folder written by save_pretrained nor a preset {list_models()}")


def _images(model: NAMC, batch: int, gen: torch.Generator, device: torch.device, dtype: torch.dtype):
    size = model.config.image_size
    pair = torch.rand(2, batch, 3, size, size, generator=gen)  # (2, B, 3, H, W) in [0, 1]
    return pair[0].to(device, dtype), pair[1].to(device, dtype)


def _inference_entry(
    batch: int,
    mode: str,
    times: list[float],
    lengths: list[int],
    memory: dict[str, Any],
    settings: BenchmarkSettings,
) -> dict[str, Any]:
    tokens = sum(lengths)
    med = statistics.median(times)
    return {
        "batch_size": batch,
        "mode": mode,
        "length_mode": settings.length_mode,
        "max_new_tokens": settings.max_new_tokens,
        "tokens_per_call": tokens,
        "time_s": summarize(times),
        "tokens_per_s": summarize([tokens / t for t in times]),
        "pairs_per_s": summarize([batch / t for t in times]),
        "latency_s_per_pair": med / batch,
        "peak_memory": memory,
        "flops": None,
    }


def run_inference(
    model: NAMC, settings: BenchmarkSettings, device: torch.device, matmul_flops: float | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Time every (batch size, mode) and the naive reference decoder; returns (inference, reference) entries."""
    inference: list[dict[str, Any]] = []
    reference: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(settings.seed)
    for batch in settings.batch_sizes:
        entries, refs = _run_batch(model, settings, device, batch, gen, matmul_flops)
        inference += entries
        reference += refs
    return inference, reference


def _run_batch(
    model: NAMC,
    settings: BenchmarkSettings,
    device: torch.device,
    batch: int,
    gen: torch.Generator,
    matmul_flops: float | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    dtype = DTYPES[settings.dtype]
    n_new = settings.max_new_tokens
    eos_id = model.tokenizer.eos_id
    img1, img2 = _images(model, batch, gen, device, dtype)
    with torch.inference_mode():
        grid = model.grid(torch.cat([img1, img2]))  # (2B, N, C)
        grid1, grid2 = grid[:batch], grid[batch:]
        memory = model.encode_pair(None, None, grid1, grid2)  # (B, N, D)
    calls = {
        "decode": lambda: model.fdg.generate(memory, n_new),
        "grid": lambda: model.generate_ids(None, None, n_new, grid_1=grid1, grid_2=grid2),
        "e2e": lambda: model.generate_ids(img1, img2, n_new),
    }
    naive = {
        "decode": ("decode", lambda: model.fdg.generate_uncached(memory, n_new)),
        "pixels": ("e2e", lambda: model.generate_reference(img1, img2, n_new)),
    }
    entries: list[dict[str, Any]] = []
    refs: list[dict[str, Any]] = []
    timed: dict[str, tuple[dict[str, Any], torch.Tensor]] = {}
    with length_mode(model, settings.length_mode):
        for mode in settings.modes:
            logger.info("inference: batch %d, %s", batch, mode)
            times, ids = time_calls(calls[mode], device, settings.warmup, settings.repeats)
            with peak_memory(device) as mem:
                calls[mode]()
            lengths = generated_lengths(ids, eos_id, n_new, settings.length_mode)
            entry = _inference_entry(batch, mode, times, lengths, mem, settings)
            if mode == "decode":
                fl = decoder_flops(**_fdg_shape(model), lengths=lengths)
                achieved = fl["total"] / entry["time_s"]["median"]
                entry["flops"] = {
                    "per_call": fl["total"],
                    "prefill_per_call": fl["prefill"],
                    "per_token_mean": fl["per_token_mean"],
                    "achieved_per_s": achieved,
                    "matmul_per_s": matmul_flops,
                    "efficiency": achieved / matmul_flops if matmul_flops else None,
                }
            entries.append(entry)
            timed[mode] = (entry, ids)
        wanted = {"none": [], "decode": ["decode"], "pixels": ["pixels"], "all": ["decode", "pixels"]}
        for ref in wanted[settings.reference]:
            against, fn = naive[ref]
            logger.info("reference decoder: batch %d, %s", batch, ref)
            times, ids = time_calls(fn, device, 0, settings.reference_repeats)
            lengths = generated_lengths(ids, eos_id, n_new, settings.length_mode)
            tokens = sum(lengths)
            opt, opt_ids = timed.get(against, (None, None))
            if opt_ids is None:  # the optimised level was not timed: still compare the tokens
                opt_ids = calls[against]()
            refs.append(
                {
                    "batch_size": batch,
                    "mode": ref,
                    "compared_with": against,
                    "length_mode": settings.length_mode,
                    "max_new_tokens": n_new,
                    "tokens_per_call": tokens,
                    "time_s": summarize(times),
                    "tokens_per_s": summarize([tokens / t for t in times]),
                    "speedup": statistics.median(times) / opt["time_s"]["median"] if opt else None,
                    "tokens_match": bool(opt_ids.shape == ids.shape and torch.equal(opt_ids, ids)),
                }
            )
    return entries, refs


# ----------------------------------------------------------------------------------------------- training


def synthetic_pretrain_batch(
    model: NAMC, batch_size: int, gen: torch.Generator, words_per_half: int = 12, with_codes: bool = True
) -> dict[str, Any]:
    """A pre-training batch built by the real :class:`~namc.data.collate.PretrainCollator` from synthetic items:
    random images in [0, 1], template descriptions of ``words_per_half`` words per half, verbs from the paper's
    list, and (``with_codes``) random VQGAN codes as packed shards carry them."""
    from namc.data.collate import PretrainCollator
    from namc.text.template import VERBS

    cfg = model.config
    n = model.grid_size**2

    def pick(options: Sequence[str]) -> str:
        return options[int(torch.randint(len(options), (), generator=gen))]

    def half() -> str:
        return " ".join(pick(_SYNTHETIC_WORDS) for _ in range(words_per_half))

    items = []
    for i in range(batch_size):
        item = {
            "id": f"synthetic-{i}",
            "image1": torch.rand(3, cfg.image_size, cfg.image_size, generator=gen),
            "image2": torch.rand(3, cfg.image_size, cfg.image_size, generator=gen),
            "verb1": pick(VERBS),
            "desc1": half(),
            "verb2": pick(VERBS),
            "desc2": half(),
        }
        if with_codes:
            item["codes1"] = torch.randint(cfg.vqgan_n_embed, (n,), generator=gen)
            item["codes2"] = torch.randint(cfg.vqgan_n_embed, (n,), generator=gen)
        items.append(item)
    return PretrainCollator(model.tokenizer, max_caption_len=cfg.max_caption_len)(items)


def _to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def run_training(model: NAMC, settings: BenchmarkSettings, device: torch.device) -> dict[str, Any]:
    """Time pre-training steps (forward + backward + Adam); a model without NIM times fine-tuning steps instead.

    Learning rates are the paper's (appendix F: NIM 1e-4, MIR + FDG 3e-4; fine-tuning 2e-4); half precision runs
    under ``torch.autocast`` with fp32 weights (float16 with a gradient scaler).
    """
    from namc.data.collate import CaptionCollator

    dtype = DTYPES[settings.dtype]
    batch_size = settings.train_batch_size
    gen = torch.Generator().manual_seed(settings.seed + 1)
    model.float().train()
    pretrain = model.nim is not None and model.vqgan is not None
    groups = model.param_groups()
    if pretrain:
        batch = synthetic_pretrain_batch(model, batch_size, gen, with_codes=not settings.train_vqgan)
        params = [{"params": groups["nim"], "lr": 1e-4}, {"params": groups["mir_fdg"], "lr": 3e-4}]
    else:
        items = [
            {
                "image1": torch.rand(3, model.config.image_size, model.config.image_size, generator=gen),
                "image2": torch.rand(3, model.config.image_size, model.config.image_size, generator=gen),
                "captions": [" ".join(_SYNTHETIC_WORDS[: 8 + i % 8])],
            }
            for i in range(batch_size)
        ]
        batch = CaptionCollator(model.tokenizer, model.config.max_caption_len)(items)
        params = [{"params": groups["mir_fdg"], "lr": 2e-4}]
    batch = _to_device(batch, device)
    optimizer = torch.optim.Adam([g for g in params if g["params"]])
    use_amp = dtype != torch.float32
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    step_gen = torch.Generator(device=device).manual_seed(settings.seed)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=use_amp):
            out = model.pretrain_step(batch, generator=step_gen) if pretrain else model.finetune_step(batch)
        if scaler is not None:
            scaler.scale(out["loss"]).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            out["loss"].backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    logger.info("training: %s, batch %d", "pretrain" if pretrain else "finetune", batch_size)
    times, _ = time_calls(step, device, settings.train_warmup, settings.train_steps)
    with peak_memory(device) as mem:
        step()
    model.eval()
    pairs = summarize([batch_size / t for t in times])
    estimate = None
    if pretrain:
        total = PRETRAIN_PAIRS * PRETRAIN_EPOCHS
        estimate = {
            "pairs": PRETRAIN_PAIRS,
            "epochs": PRETRAIN_EPOCHS,
            "hours": total / pairs["median"] / 3600,
            "hours_min": total / pairs["max"] / 3600,
            "hours_max": total / pairs["min"] / 3600,
        }
    return {
        "kind": "pretrain" if pretrain else "finetune",
        "batch_size": batch_size,
        "vqgan_in_step": bool(pretrain and settings.train_vqgan),
        "autocast_dtype": settings.dtype if use_amp else None,
        "time_s": summarize(times),
        "steps_per_s": summarize([1 / t for t in times]),
        "pairs_per_s": pairs,
        "peak_memory": mem,
        "pretrain_estimate": estimate,
    }


# ----------------------------------------------------------------------------------------------- driver


def run_benchmark(settings: BenchmarkSettings, model: NAMC | None = None) -> dict[str, Any]:
    """Run everything ``settings`` asks for and return the report (a JSON-ready dict, :data:`REPORT_SCHEMA`).

    Args:
        settings: what to measure.
        model: an already built model (``settings.model`` then only names it in the report); it is moved to the
            device, put in eval mode and, for half precision, converted.

    ``settings.threads`` applies for the run; torch's previous thread count is restored afterwards.
    """
    threads = torch.get_num_threads()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    try:
        return _run(settings, model)
    finally:
        torch.set_num_threads(threads)


def _run(settings: BenchmarkSettings, model: NAMC | None) -> dict[str, Any]:
    from namc import __version__

    device = torch.device(settings.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {settings.device!r} requested but CUDA is not available")
    dtype = DTYPES[settings.dtype]
    machine = describe_machine(device)
    source = "object"
    if model is None:
        model, source = load_model(settings.model, device)
    model = model.to(device).eval()
    params = model.num_parameters()
    if settings.compile:
        model.fdg.compile_step()
    logger.info("matmul reference: %d x %d %s", settings.gemm_size, settings.gemm_size, settings.dtype)
    matmul = measure_matmul(device, dtype, settings.gemm_size)
    if dtype != torch.float32:
        model.to(dtype)
    inference, reference = run_inference(model, settings, device, matmul["flops_per_s"])
    training = run_training(model, settings, device) if settings.train_batch_size else None
    cfg = model.config
    return {
        "schema_version": SCHEMA_VERSION,
        "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "namc_version": __version__,
        "settings": dataclasses.asdict(settings)
        | {"batch_sizes": list(settings.batch_sizes), "modes": list(settings.modes)},
        "machine": machine,
        "model": {
            "name": cfg.name,
            "source": source,
            "image_size": cfg.image_size,
            "dim": cfg.dim,
            "heads": cfg.heads,
            "mir_layers": cfg.mir_layers,
            "fdg_layers": cfg.fdg_layers,
            "vocab_size": cfg.vocab_size,
            "memory_positions": model.grid_size**2,
            "parameters": params,
        },
        "matmul": matmul,
        "inference": inference,
        "reference": reference,
        "training": training,
        "paper_table5": [dict(row) for row in PAPER_TABLE5],
        "load_average_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


# ----------------------------------------------------------------------------------------------- output


def _stat(s: dict[str, Any], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}-{fmt.format(s['max'])}]"


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.0f}"


def format_table(report: dict[str, Any]) -> str:
    """The report as plain-text tables (medians with [min-max] over the repeats)."""
    s, m, mdl = report["settings"], report["machine"], report["model"]
    p = mdl["parameters"]
    lines = [
        f"namc benchmark  model={mdl['name']} ({mdl['source']})  device={m['device']}  dtype={s['dtype']}  "
        f"threads={m['torch_threads']}  length_mode={s['length_mode']}  max_new_tokens={s['max_new_tokens']}",
        f"machine: {m['cpu_model']}, {m['usable_cpus']} usable CPUs, torch {m['torch_version']}"
        + (f", GPU {m['gpu']['name']}" if m["gpu"] else "")
        + (
            f", load average {m['load_average'][0]:.2f} -> {report['load_average_end'][0]:.2f}"
            if m["load_average"]
            else ""
        ),
        f"parameters: total {p['total'] / 1e6:.1f}M, inference {p['inference'] / 1e6:.1f}M "
        f"(grid {p['grid'] / 1e6:.1f}M, MIR {p['mir'] / 1e6:.1f}M, FDG {p['fdg'] / 1e6:.1f}M)",
    ]
    mm = report["matmul"]
    backs = ", ".join(f"{k} {v['median'] / 1e9:.1f}" for k, v in mm["backends"].items())
    lines.append(f"matmul {mm['size']}^3 {mm['dtype']}: GFLOP/s {backs} (reference: {mm['best_backend']})")
    lines.append("")
    header = f"{'batch':>5} {'mode':<7} {'tokens/s':>26} {'pairs/s':>22} {'s/pair':>9} {'peak MiB':>9} {'eff.':>6}"
    lines += [header, "-" * len(header)]
    for e in report["inference"]:
        eff = e["flops"]["efficiency"] if e["flops"] else None
        pairs = _stat(e["pairs_per_s"], "{:.2f}")
        lines.append(
            f"{e['batch_size']:>5} {e['mode']:<7} {_stat(e['tokens_per_s']):>26} {pairs:>22} "
            f"{e['latency_s_per_pair']:>9.4f} {_mib(e['peak_memory']['delta_bytes']):>9} "
            f"{'' if eff is None else f'{eff:.0%}':>6}"
        )
    if report["reference"]:
        lines += ["", f"{'batch':>5} {'naive decoder':<14} {'tokens/s':>26} {'speed-up':>9} {'same ids':>9}"]
        for r in report["reference"]:
            sp = "n/a" if r["speedup"] is None else f"{r['speedup']:.2f}x"
            lines.append(
                f"{r['batch_size']:>5} {r['mode'] + ' vs ' + r['compared_with']:<14} {_stat(r['tokens_per_s']):>26} "
                f"{sp:>9} {str(r['tokens_match']):>9}"
            )
    t = report["training"]
    if t:
        lines += [
            "",
            f"training ({t['kind']}, batch {t['batch_size']}, VQGAN in step: {t['vqgan_in_step']}): "
            f"steps/s {_stat(t['steps_per_s'], '{:.3f}')}, pairs/s {_stat(t['pairs_per_s'], '{:.2f}')}, "
            f"peak +{_mib(t['peak_memory']['delta_bytes'])} MiB",
        ]
        est = t["pretrain_estimate"]
        if est:
            lines.append(
                f"pre-training {est['pairs']:,} pairs x {est['epochs']} epochs on this device: "
                f"{est['hours']:.1f} h [{est['hours_min']:.1f}-{est['hours_max']:.1f}] "
                f"({est['hours'] / 24:.1f} days) at batch {t['batch_size']}"
            )
    paper = "; ".join(
        f"{r['model']} {r['parameters'] / 1e6:,.1f}M, {r['tokens_per_s']}" for r in report["paper_table5"]
    )
    lines += ["", f"paper Table 5 (params, tokens/s on one RTX 3090): {paper}"]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- schema

_STATS = {
    "type": "object",
    "required": ["median", "min", "max", "mean", "spread", "n", "samples"],
    "properties": {
        "median": {"type": "number"},
        "min": {"type": "number"},
        "max": {"type": "number"},
        "mean": {"type": "number"},
        "spread": {"type": "number", "minimum": 0},
        "n": {"type": "integer", "minimum": 1},
        "samples": {"type": "array", "items": {"type": "number"}},
    },
}
_MEMORY = {
    "type": "object",
    "required": ["method", "peak_bytes", "delta_bytes"],
    "properties": {
        "method": {"enum": ["cuda_max_memory_allocated", "linux_vmhwm", "unavailable"]},
        "peak_bytes": {"type": ["integer", "null"]},
        "delta_bytes": {"type": ["integer", "null"]},
    },
}

#: JSON Schema (a subset: type, required, properties, items, enum, minimum, const, $ref) of the report; the same
#: document is printed in docs/benchmark_schema.md and checked by tests/test_benchmark.py.
REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "namc benchmark report",
    "type": "object",
    "required": [
        "schema_version", "created_utc", "namc_version", "settings", "machine", "model", "matmul", "inference",
        "reference", "training", "paper_table5", "load_average_end",
    ],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "created_utc": {"type": "string"},
        "namc_version": {"type": "string"},
        "settings": {
            "type": "object",
            "required": [f.name for f in dataclasses.fields(BenchmarkSettings)],
            "properties": {
                "model": {"type": "string"},
                "batch_sizes": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                "device": {"type": "string"},
                "dtype": {"enum": list(DTYPES)},
                "threads": {"type": ["integer", "null"]},
                "max_new_tokens": {"type": "integer", "minimum": 1},
                "length_mode": {"enum": list(LENGTH_MODES)},
                "modes": {"type": "array", "items": {"enum": list(MODES)}},
                "warmup": {"type": "integer", "minimum": 0},
                "repeats": {"type": "integer", "minimum": 1},
                "reference": {"enum": list(REFERENCES)},
                "reference_repeats": {"type": "integer", "minimum": 1},
                "gemm_size": {"type": "integer", "minimum": 1},
                "compile": {"type": "boolean"},
                "train_batch_size": {"type": "integer", "minimum": 0},
                "train_steps": {"type": "integer", "minimum": 1},
                "train_warmup": {"type": "integer", "minimum": 0},
                "train_vqgan": {"type": "boolean"},
                "seed": {"type": "integer"},
            },
        },
        "machine": {
            "type": "object",
            "required": [
                "env", "cpu_model", "logical_cpus", "usable_cpus", "torch_threads", "torch_interop_threads",
                "load_average", "memory_bytes", "platform", "python_version", "torch_version", "mkl", "mkldnn",
                "device", "gpu",
            ],
            "properties": {
                "env": {
                    "type": "object",
                    "required": list(THREADING_ENV),
                    "additionalProperties": {"type": ["string", "null"]},
                },
                "cpu_model": {"type": "string"},
                "logical_cpus": {"type": ["integer", "null"]},
                "usable_cpus": {"type": ["integer", "null"]},
                "torch_threads": {"type": "integer"},
                "torch_interop_threads": {"type": "integer"},
                "load_average": {"type": ["array", "null"], "items": {"type": "number"}},
                "memory_bytes": {"type": ["integer", "null"]},
                "platform": {"type": "string"},
                "python_version": {"type": "string"},
                "torch_version": {"type": "string"},
                "mkl": {"type": "boolean"},
                "mkldnn": {"type": "boolean"},
                "device": {"type": "string"},
                "gpu": {
                    "type": ["object", "null"],
                    "required": ["name", "capability", "memory_bytes", "count", "cuda_version"],
                    "properties": {
                        "name": {"type": "string"},
                        "capability": {"type": "string"},
                        "memory_bytes": {"type": "integer"},
                        "count": {"type": "integer"},
                        "cuda_version": {"type": ["string", "null"]},
                    },
                },
            },
        },
        "model": {
            "type": "object",
            "required": [
                "name", "source", "image_size", "dim", "heads", "mir_layers", "fdg_layers", "vocab_size",
                "memory_positions", "parameters",
            ],
            "properties": {
                "name": {"type": "string"},
                "source": {"enum": ["preset", "directory", "object"]},
                "image_size": {"type": "integer"},
                "dim": {"type": "integer"},
                "heads": {"type": "integer"},
                "mir_layers": {"type": "integer"},
                "fdg_layers": {"type": "integer"},
                "vocab_size": {"type": "integer"},
                "memory_positions": {"type": "integer"},
                "parameters": {
                    "type": "object",
                    "required": ["total", "inference", "grid", "mir", "fdg", "nim", "vqgan"],
                    "properties": {k: {"type": "integer", "minimum": 0} for k in
                                   ("total", "inference", "grid", "mir", "fdg", "nim", "vqgan")},
                },
            },
        },
        "matmul": {
            "type": "object",
            "required": ["size", "dtype", "flops_per_call", "backends", "best_backend", "flops_per_s"],
            "properties": {
                "size": {"type": "integer"},
                "dtype": {"type": "string"},
                "flops_per_call": {"type": "number"},
                "backends": {"type": "object", "additionalProperties": {"$ref": "#/$defs/stats"}},
                "best_backend": {"type": "string"},
                "flops_per_s": {"type": "number", "minimum": 0},
            },
        },
        "inference": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "batch_size", "mode", "length_mode", "max_new_tokens", "tokens_per_call", "time_s",
                    "tokens_per_s", "pairs_per_s", "latency_s_per_pair", "peak_memory", "flops",
                ],
                "properties": {
                    "batch_size": {"type": "integer", "minimum": 1},
                    "mode": {"enum": list(MODES)},
                    "length_mode": {"enum": list(LENGTH_MODES)},
                    "max_new_tokens": {"type": "integer"},
                    "tokens_per_call": {"type": "integer", "minimum": 0},
                    "time_s": {"$ref": "#/$defs/stats"},
                    "tokens_per_s": {"$ref": "#/$defs/stats"},
                    "pairs_per_s": {"$ref": "#/$defs/stats"},
                    "latency_s_per_pair": {"type": "number"},
                    "peak_memory": {"$ref": "#/$defs/memory"},
                    "flops": {
                        "type": ["object", "null"],
                        "required": [
                            "per_call", "prefill_per_call", "per_token_mean", "achieved_per_s", "matmul_per_s",
                            "efficiency",
                        ],
                        "properties": {
                            "per_call": {"type": "number"},
                            "prefill_per_call": {"type": "number"},
                            "per_token_mean": {"type": "number"},
                            "achieved_per_s": {"type": "number"},
                            "matmul_per_s": {"type": ["number", "null"]},
                            "efficiency": {"type": ["number", "null"]},
                        },
                    },
                },
            },
        },
        "reference": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "batch_size", "mode", "compared_with", "length_mode", "max_new_tokens", "tokens_per_call",
                    "time_s", "tokens_per_s", "speedup", "tokens_match",
                ],
                "properties": {
                    "batch_size": {"type": "integer", "minimum": 1},
                    "mode": {"enum": ["decode", "pixels"]},
                    "compared_with": {"enum": ["decode", "e2e"]},
                    "length_mode": {"enum": list(LENGTH_MODES)},
                    "max_new_tokens": {"type": "integer"},
                    "tokens_per_call": {"type": "integer", "minimum": 0},
                    "time_s": {"$ref": "#/$defs/stats"},
                    "tokens_per_s": {"$ref": "#/$defs/stats"},
                    "speedup": {"type": ["number", "null"]},
                    "tokens_match": {"type": "boolean"},
                },
            },
        },
        "training": {
            "type": ["object", "null"],
            "required": [
                "kind", "batch_size", "vqgan_in_step", "autocast_dtype", "time_s", "steps_per_s", "pairs_per_s",
                "peak_memory", "pretrain_estimate",
            ],
            "properties": {
                "kind": {"enum": ["pretrain", "finetune"]},
                "batch_size": {"type": "integer", "minimum": 1},
                "vqgan_in_step": {"type": "boolean"},
                "autocast_dtype": {"type": ["string", "null"]},
                "time_s": {"$ref": "#/$defs/stats"},
                "steps_per_s": {"$ref": "#/$defs/stats"},
                "pairs_per_s": {"$ref": "#/$defs/stats"},
                "peak_memory": {"$ref": "#/$defs/memory"},
                "pretrain_estimate": {
                    "type": ["object", "null"],
                    "required": ["pairs", "epochs", "hours", "hours_min", "hours_max"],
                    "properties": {
                        "pairs": {"type": "integer"},
                        "epochs": {"type": "integer"},
                        "hours": {"type": "number"},
                        "hours_min": {"type": "number"},
                        "hours_max": {"type": "number"},
                    },
                },
            },
        },
        "paper_table5": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["model", "parameters", "tokens_per_s"],
                "properties": {
                    "model": {"type": "string"},
                    "parameters": {"type": "integer"},
                    "tokens_per_s": {"type": "number"},
                },
            },
        },
        "load_average_end": {"type": ["array", "null"], "items": {"type": "number"}},
    },
    "$defs": {"stats": _STATS, "memory": _MEMORY},
}  # fmt: skip


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def validate_report(report: Any, schema: dict[str, Any] | None = None) -> list[str]:
    """Check a report against :data:`REPORT_SCHEMA`; returns the problems found (empty when valid).

    Implements the subset of JSON Schema the schema uses, so checking needs no extra package.
    """
    root = REPORT_SCHEMA if schema is None else schema
    errors: list[str] = []

    def check(value: Any, node: dict[str, Any], path: str) -> None:
        if "$ref" in node:
            node = root["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        kind = _json_type(value)
        if "type" in node:
            allowed = node["type"] if isinstance(node["type"], list) else [node["type"]]
            ok = kind in allowed or (kind == "integer" and "number" in allowed)
            if not ok:
                errors.append(f"{path}: expected {'/'.join(allowed)}, got {kind}")
                return
        if "const" in node and value != node["const"]:
            errors.append(f"{path}: expected {node['const']!r}, got {value!r}")
        if "enum" in node and value not in node["enum"]:
            errors.append(f"{path}: {value!r} not in {node['enum']}")
        if "minimum" in node and kind in ("integer", "number") and value < node["minimum"]:
            errors.append(f"{path}: {value} < minimum {node['minimum']}")
        if kind == "object":
            for key in node.get("required", []):
                if key not in value:
                    errors.append(f"{path}: missing {key!r}")
            props = node.get("properties", {})
            extra = node.get("additionalProperties")
            for key, sub in value.items():
                if key in props:
                    check(sub, props[key], f"{path}.{key}")
                elif isinstance(extra, dict):
                    check(sub, extra, f"{path}.{key}")
        if kind == "array" and "items" in node:
            for i, sub in enumerate(value):
                check(sub, node["items"], f"{path}[{i}]")

    check(report, root, "$")
    return errors


# ----------------------------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
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
    p.add_argument("--threads", type=int, default=d.threads, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="default %(default)s (appendix F)")
    p.add_argument(
        "--length-mode", default=d.length_mode, choices=LENGTH_MODES,
        help="fixed: ignore [EOS], generate exactly max-new-tokens per pair; eos: stop at [EOS] (default %(default)s)",
    )  # fmt: skip
    p.add_argument("--modes", nargs="+", default=list(d.modes), choices=MODES, help="default: %(default)s")
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--repeats", type=int, default=d.repeats)
    p.add_argument(
        "--reference", default=d.reference, choices=REFERENCES,
        help="naive decoder to compare with: decode (uncached FDG from the same memory), pixels "
        "(NAMC.generate_reference, re-encodes the images every step: slow), all, none (default %(default)s)",
    )  # fmt: skip
    p.add_argument("--reference-repeats", type=int, default=d.reference_repeats)
    p.add_argument("--gemm-size", type=int, default=d.gemm_size, help="square matmul side (default %(default)s)")
    p.add_argument("--compile", action="store_true", help="torch.compile the decoding step")
    p.add_argument("--train-batch-size", type=int, default=d.train_batch_size, help="0 skips training (default)")
    p.add_argument("--train-steps", type=int, default=d.train_steps)
    p.add_argument("--train-warmup", type=int, default=d.train_warmup)
    p.add_argument("--train-vqgan", action="store_true", help="run the VQGAN tokenizer inside each training step")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--omp-wait-policy", choices=("passive", "active"), default=None,
        help="run with OMP_WAIT_POLICY set (OpenMP reads it when torch loads, so the benchmark re-runs itself in a "
        "child process). passive stops idle OpenMP threads from spinning: on a machine shared with other "
        "processes, spinning threads can slow small-batch decoding several-fold (default: the environment's)",
    )  # fmt: skip
    p.add_argument("--output", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--verbose", action="store_true", help="log progress")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``namc benchmark ...``: run, print the table, write the JSON report when ``--output`` is given."""
    args = build_parser().parse_args(argv)
    policy = args.omp_wait_policy
    if policy is not None and os.environ.get("OMP_WAIT_POLICY", "").lower() != policy:
        # OpenMP reads OMP_WAIT_POLICY once, when torch is imported: only a fresh process can apply it
        env = dict(os.environ, OMP_WAIT_POLICY=policy.upper())
        child_argv = list(sys.argv[1:] if argv is None else argv)
        return subprocess.run([sys.executable, "-m", "namc.eval.benchmark", *child_argv], env=env).returncode
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    fields = {f.name for f in dataclasses.fields(BenchmarkSettings)}
    settings = BenchmarkSettings(**{k: v for k, v in vars(args).items() if k in fields})
    report = run_benchmark(settings)
    print(format_table(report))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2))
        print(f"\nJSON report: {args.output}")
    return 0


__all__ = [
    "PAPER_TABLE5",
    "REPORT_SCHEMA",
    "SCHEMA_VERSION",
    "BenchmarkSettings",
    "decoder_flops",
    "describe_machine",
    "format_table",
    "generated_lengths",
    "length_mode",
    "load_model",
    "main",
    "measure_matmul",
    "peak_memory",
    "run_benchmark",
    "run_inference",
    "run_training",
    "summarize",
    "synthetic_pretrain_batch",
    "time_calls",
    "validate_report",
]


if __name__ == "__main__":
    raise SystemExit(main())
