"""Small products on one thread where OpenMP's idle threads sleep.

Under ``OMP_WAIT_POLICY=PASSIVE`` (what a machine shared with other processes wants, and ``namc benchmark
--omp-wait-policy passive``) an OpenMP thread sleeps as soon as a parallel region ends, and the next region waits for
it to be woken: on two AMD EPYC threads of a VM that costs about 55 us, more than a decoding step's small products
take on one thread. There, the 768 x 2304 dynamic int8 product of one row took 95-106 us on two threads and 45 us on
one, namc_base's whole int8 decoding at batch 1 gained nothing from its second thread (its 253 products of one row
61 ms on two, 62 ms on one), and of those only the 49,409-column vocabulary projection was faster on two (0.9-1.3 vs
1.9-2.1 ms). Where threads spin between regions (OpenMP's default) two threads win at every size, so nothing changes
there; and spinning threads slow a shared machine several-fold (namc_base's int8 decoding at batch 1 beside one busy
process: 107-109 ms passive, 158-507 ms spinning), which is why namc benchmarks passive.

:func:`serial` says whether a product of ``flops`` runs faster on one thread: under a passive wait policy, below
``SERIAL_FLOPS`` of its kind, the crossing points measured there (two threads under ``OMP_WAIT_POLICY=PASSIVE``,
rows 1-32 of namc_base's 768 x 768, 768 x 2304, 768 x 3072 and 3072 x 768 matrices, where one thread stops winning
depends on the matrix: int8 between 38 and 113 MFLOP, bf16 between 28 and 38, fp32 on ``F.linear`` between 9 and 28;
attention of one query per row and head over 12-196 keys, fp32's fused kernel between 1 and 2.4 MFLOP, bf16 as two
batched products between 5 and 10; bf16's fused kernel wins on one thread over 12 keys up to 0.6 MFLOP but loses over
196 keys at 0.6, so it keeps two from 0.13). The thresholds sit at or below them: a product near its crossing point
gains or loses little either way (docs/throughput.md, session 32). :class:`one_thread` runs a block on one intra-op
thread and gives the caller's count back after; switching costs about 0.2 us. Results do not depend on it (the
kernels split the output columns or heads between threads).

The same holds for kernels that pass once over a small input (``SERIAL_ELEMENTS``, by its number of elements):
a LayerNorm of 32 x 768 took 48-56 us on two threads and 10-13 us on one, of 128 x 768 64-70 / 32-44, of 512 x 768
110-139 / 117-167; oneDNN's GELU of 8 x 3072 65 / 18-21 us, 32 x 3072 81-91 / 50-62, 128 x 3072 150-169 / 177-211
(fp32 and bf16); the greedy pick's blocked reduction over fp32 logits of 64 x 49,409 498 / 322 us, of 128 x 49,409
756 / 821.

OpenMP reads ``OMP_WAIT_POLICY`` when torch loads; this module reads it on first use, so set it before the process
starts, as ``namc benchmark`` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")

__all__ = ["SERIAL_ELEMENTS", "SERIAL_FLOPS", "idle_threads_sleep", "one_thread", "run", "serial"]

SERIAL_FLOPS = {
    "int8": 1 << 25,  # dynamic int8 products (namc.models.qlinear)
    "bf16": 1 << 24,  # oneDNN's bf16 linear kernel
    "fp32": 1 << 23,  # F.linear or oneDNN's fp32 kernel
    # attention, 4 B H Q S E FLOPs (Q queries over S keys of E channels per head)
    "sdpa_fp32": 1 << 20,  # F.scaled_dot_product_attention in fp32
    "sdpa_bf16": 1 << 17,  # ... in bf16 (its fused kernel is slow on one thread)
    "attend_one": 1 << 23,  # namc.models.layers.attend_one: two batched products
}

SERIAL_ELEMENTS = {  # kernels that pass over their input once, by its number of elements
    "layer_norm": 1 << 17,  # namc.models.layers.LayerNorm
    "gelu": 1 << 17,  # namc.models.layers.GELU, above the size where ATen's kernel stays on one thread anyway
    "argmax": 1 << 22,  # namc.models.shortlist.first_max_index (fp32)
}

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
