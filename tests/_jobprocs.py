"""The processes of a job, found by an environment variable that every process it starts inherits: the way to find
them after they have been orphaned, moved to another session or re-parented."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def processes_with_env(name: str, value: str) -> list[str]:
    """``pid [state] command`` of every live process whose environment holds ``name=value`` (from /proc; zombies,
    whose environment cannot be read, are not listed)."""
    marker = f"{name}={value}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        if state != "Z" and int(proc.name) != os.getpid():
            found.append(f"{proc.name} [{state}] {cmd[:120]}")
    return found


def kill_processes(described: list[str]) -> None:
    """SIGKILL the processes listed by :func:`processes_with_env`."""
    for line in described:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split()[0]), signal.SIGKILL)
