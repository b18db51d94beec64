"""namc.runtime.reuse_freed_memory: glibc's malloc stops mapping fresh pages for large tensors. Each check runs in its
own interpreter, since the setting is the whole process's and this one's stays as it was."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")

# A 64 MiB tensor is allocated and freed before and after reuse_freed_memory(); glibc's mallinfo2() says how many
# bytes were in mmap-ed blocks while it was alive, over those before it.
_PROBE = textwrap.dedent(
    """
    import ctypes, json
    import torch
    from namc.runtime import allocator_settings, reuse_freed_memory

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Info

    def mapped_for_a_tensor():
        base = libc.mallinfo2().hblkhd
        x = torch.empty(64 << 20, dtype=torch.uint8)
        x.fill_(1)
        mapped = libc.mallinfo2().hblkhd - base
        del x
        return mapped

    before = mapped_for_a_tensor()
    applied = reuse_freed_memory()
    again = reuse_freed_memory()
    after = [mapped_for_a_tensor() for _ in range(3)]
    print(json.dumps({"before": before, "after": after, "applied": applied, "again": again,
                      "settings": allocator_settings()}))
    """
)


def _probe(env_extra: dict[str, str] | None = None) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"} | (env_extra or {})
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a fresh interpreter
def test_large_tensors_come_from_the_heap_once_applied():
    out = _probe()
    assert out["before"] >= 64 << 20  # glibc's default: a fresh mapping for the tensor
    assert out["applied"] is True and out["again"] is True
    assert out["after"] == [0, 0, 0]  # then none, freed and allocated again
    assert out["settings"] == {"glibc": platform.libc_ver()[1], "ld_preload": None, "reuse_freed_memory": True}


@pytest.mark.slow  # a fresh interpreter
def test_a_preloaded_allocator_is_left_alone():
    out = _probe({"LD_PRELOAD": "libc.so.6"})  # harmless to preload; stands for jemalloc / tcmalloc
    assert out["applied"] is False and out["again"] is False
    assert all(mapped >= 64 << 20 for mapped in out["after"])  # nothing changed
    assert out["settings"]["ld_preload"] == "libc.so.6" and out["settings"]["reuse_freed_memory"] is False
