"""Timing and memory: repeated timed calls, their summary statistics, and the peak memory of a block of code."""

from __future__ import annotations

import contextlib
import ctypes
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["peak_memory", "summarize", "synchronize", "time_calls"]


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


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> tuple[list[float], Any]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls; also the last result."""
    result = None
    for _ in range(warmup):
        result = fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        synchronize(device)
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
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        yield out
        synchronize(device)
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
