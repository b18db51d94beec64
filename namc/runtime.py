"""Process-wide settings for fast CPU inference: how the C allocator treats the large tensors of batched inference
(and how a command exits when the reader of its output has gone).

PyTorch allocates CPU tensors with the C library's ``malloc``. glibc serves every block above its mmap threshold
(at most 32 MiB) with a fresh ``mmap`` and unmaps it on ``free``, so each such tensor starts on pages the kernel has
to fault in and zero, one 4 KiB page at a time. Batched inference makes those tensors at every layer: namc_base at
batch 32 has (64, 196, 3072) FFN activations in MIR (154 MB) and ResNet-101 feature maps of 40-100 MB, and an
elementwise pass over one of them on fresh pages takes several times as long as on reused ones.

:func:`reuse_freed_memory` makes glibc keep freed blocks for the next allocation instead (``mallopt``: no mmap for
large blocks, no trimming of the heap's top), as the jemalloc / tcmalloc settings often recommended for PyTorch CPU
inference do. It makes namc_base's int8 captioning at batch 32 about 1.3x faster end to end, for a few hundred MB
more peak memory, and gains nothing in fp32 (docs/performance.md). What a process allocated before matters as much
(after building the CLIP4IDC peer, namc's int8 run is as fast either way), which is why ``namc benchmark`` leaves
the allocator alone unless ``--allocator reuse``. It is a setting of the whole process, and freed memory is not
given back to the system while it runs, so namc never applies it on import: call it at the start of a process
that captions large batches in int8. Elsewhere (another C library, or an allocator preloaded with ``LD_PRELOAD``,
whose own settings then rule) it changes nothing and says so.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

__all__ = ["ALLOCATORS", "allocator_settings", "reuse_freed_memory", "stdout_closed"]

ALLOCATORS = ("reuse", "system")  # namc benchmark --allocator

# glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1

_state = {"reuse_freed_memory": False}


def _glibc_version() -> str | None:
    name, version = platform.libc_ver()
    return version if name == "glibc" else None


def _preloaded() -> str | None:
    return os.environ.get("LD_PRELOAD") or None


def reuse_freed_memory() -> bool:
    """Make this process's glibc ``malloc`` keep freed memory for reuse: large blocks come from the heap instead of
    fresh ``mmap`` calls (``M_MMAP_MAX`` 0) and the heap is never trimmed (``M_TRIM_THRESHOLD`` at its maximum).

    Returns True when applied (now or before), False where glibc's allocator is not the one in use (another C
    library, or an allocator preloaded with ``LD_PRELOAD``): then nothing changed.
    """
    if _state["reuse_freed_memory"]:
        return True
    if _glibc_version() is None or _preloaded() is not None:
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, _INT_MAX) != 1:
        raise OSError("glibc's mallopt refused M_MMAP_MAX=0 or M_TRIM_THRESHOLD=INT_MAX")
    _state["reuse_freed_memory"] = True
    return True


def allocator_settings() -> dict[str, str | bool | None]:
    """What the process allocates with, for reports: the glibc version (None without glibc), ``LD_PRELOAD`` and
    whether :func:`reuse_freed_memory` applied."""
    return {
        "glibc": _glibc_version(),
        "ld_preload": _preloaded(),
        "reuse_freed_memory": _state["reuse_freed_memory"],
    }


def stdout_closed() -> int:
    """The exit status of a command whose reader of stdout went away (``namc describe --pairs LIST | head``): 141,
    as a shell reports a process that SIGPIPE ended, after pointing stdout at /dev/null so that Python's flush at
    exit does not fail on the closed pipe once more. The caller returns it, printing nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE (13)
