"""The machine a run measured: what it is (:func:`describe_machine`), how fast it multiplies (:func:`measure_matmul`).

The dense matmul throughput is the reference of the decoder's FLOP efficiency (:mod:`.flops`).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from namc import kernels
from namc.backends import onednn
from namc.backends.qlinear import full_range, int8_kernels
from namc.eval.throughput.settings import THREADING_ENV
from namc.eval.throughput.timing import summarize, time_calls
from namc.runtime import allocator_settings

__all__ = ["describe_machine", "measure_matmul"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _gpu(device: torch.device) -> dict[str, Any] | None:
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_bytes": int(props.total_memory),
        "count": torch.cuda.device_count(),
        "cuda_version": torch.version.cuda,
    }


def describe_machine(device: torch.device) -> dict[str, Any]:
    """CPU model, cores, threads, load, memory, library versions and the GPU (if the device is one)."""
    return {
        "env": {name: os.environ.get(name) for name in THREADING_ENV},
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "memory_bytes": _memory_bytes(),
        "platform": platform.platform(),
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "int8_kernels": int8_kernels(),
        "cpu_kernels": {
            "capability": torch.backends.cpu.get_cpu_capability(),
            "onednn_bf16": onednn.bf16_supported(),
            "int8_activation_bits": 8 if full_range() else 7,
        },
        "device": str(device),
        "gpu": _gpu(device),
        "allocator": allocator_settings(),
    }


def measure_matmul(
    device: torch.device, dtype: torch.dtype, size: int, warmup: int = 2, repeats: int = 5, precision: str = "fp32"
) -> dict[str, Any]:
    """FLOP/s of a square ``size`` x ``size`` GEMM (2 size^3 FLOPs per call), in the precision the decoder runs.

    On a CPU in float32 the oneDNN kernel (:func:`namc.kernels.linear`, the one a bf16 copy's decoding step
    uses), on the plain and on the reordered matrix, is timed besides ``torch.mm`` (MKL or OpenBLAS);
    ``flops_per_s`` is the fastest backend's median, so an efficiency never looks better for using a different GEMM
    than the reference. ``precision="bf16"`` times both
    in bfloat16; ``"int8"`` times the dynamic int8 linear layer the int8 decoder uses (activations quantised per
    call, as in decoding). Where oneDNN has no bf16 on this CPU, bf16 copies run in fp32
    (:func:`~namc.backends.onednn.bf16_supported`), and so does this reference.
    """
    if precision == "bf16" and (device.type != "cpu" or onednn.bf16_supported()):
        dtype = torch.bfloat16
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device, dtype)
    b = torch.randn(size, size, generator=gen).to(device, dtype)
    flops = 2.0 * size**3
    backends: dict[str, Callable[[], Any]] = {"torch.mm": lambda: torch.mm(a, b)}
    if precision == "int8":
        from namc.backends.qlinear import int8_linear

        layer = int8_linear(b, None)
        backends = {"int8_dynamic_linear": lambda: layer(a)}
    elif device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and onednn.linear_available():
        packed = kernels.reorder_linear_weight(b)
        backends["onednn"] = lambda: kernels.linear(a, b)
        backends["onednn_prepacked"] = lambda: kernels.linear(a, packed)
    results = {}
    with torch.inference_mode():
        for name, fn in backends.items():
            times, _ = time_calls(fn, device, warmup, repeats)
            results[name] = summarize([flops / t for t in times])
    best = max(results, key=lambda k: results[k]["median"])
    return {
        "size": size,
        "dtype": "int8" if precision == "int8" else str(dtype).removeprefix("torch."),
        "flops_per_call": flops,
        "backends": results,
        "best_backend": best,
        "flops_per_s": results[best]["median"],
    }
