"""Small products on one thread where OpenMP's idle threads sleep.

Under ``OMP_WAIT_POLICY=PASSIVE`` (what a machine shared with other processes wants, and ``namc benchmark
--omp-wait-policy passive``) an OpenMP thread sleeps as soon as a parallel region ends, and the next region waits for
it to be woken, which costs more than a decoding step's small products take on one thread. Where threads spin
between regions (OpenMP's default) two threads win at every size, so nothing changes there; but spinning threads slow
a shared machine several-fold, which is why namc benchmarks passive (docs/performance.md).

:func:`serial` says whether a product of ``flops`` runs faster on one thread: under a passive wait policy, below
:data:`~namc.thresholds.SERIAL_FLOPS` of its kind, which sit at or below the measured crossing points (a product near
its crossing point gains or loses little either way). :class:`one_thread` runs a block on one intra-op thread and
gives the caller's count back after, at a negligible cost. Results do not depend on it (the kernels split the output
columns or heads between threads). The same holds for kernels that pass once over a small input
(:data:`~namc.thresholds.SERIAL_ELEMENTS`, by its number of elements): LayerNorm, GELU and the greedy pick.

OpenMP reads ``OMP_WAIT_POLICY`` when torch loads; this module reads it on first use, so set it before the process
starts, as ``namc benchmark`` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from namc.thresholds import SERIAL_ELEMENTS, SERIAL_FLOPS

T = TypeVar("T")

__all__ = ["SERIAL_ELEMENTS", "SERIAL_FLOPS", "idle_threads_sleep", "one_thread", "run", "serial"]

_SLEEP: list[bool] = []  # filled on first use: the environment does not change OpenMP's policy after torch loads


def idle_threads_sleep() -> bool:
    """Whether OpenMP's idle threads sleep at the end of each parallel region (``OMP_WAIT_POLICY=passive``)."""
    if not _SLEEP:
        _SLEEP.append(os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive")
    return _SLEEP[0]


def serial(flops: float, kind: str) -> bool:
    """Whether a CPU product of ``flops`` of ``kind`` (a key of ``SERIAL_FLOPS``; for a key of ``SERIAL_ELEMENTS``,
    ``flops`` is the input's number of elements) should run on one thread: only where idle threads sleep, more than
    one thread is set, and no graph is being compiled."""
    return (
        not torch.compiler.is_compiling()  # first: a graph being traced never reaches the thread count
        and flops < (SERIAL_FLOPS[kind] if kind in SERIAL_FLOPS else SERIAL_ELEMENTS[kind])
        and idle_threads_sleep()
        and torch.get_num_threads() > 1
    )


def run(kind: str, flops: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, on one thread where :func:`serial` says so for a product of ``flops`` of ``kind``."""
    if serial(flops, kind):
        with one_thread():
            return fn(*args, **kwargs)
    return fn(*args, **kwargs)


class one_thread:  # noqa: N801 - used as a context manager, like torch.no_grad
    """``with one_thread(): ...`` runs the block on one intra-op thread, then restores the caller's count."""

    __slots__ = ("_threads",)

    def __enter__(self) -> None:
        self._threads = torch.get_num_threads()
        if self._threads > 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        if self._threads > 1:
            torch.set_num_threads(self._threads)
