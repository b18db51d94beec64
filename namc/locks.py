"""One owner per output folder: :func:`output_lock`, an exclusive lock file inside the folder.

Two runs writing into one folder interleave their files (two ``namc data pack`` runs with different shard sizes
leave shards whose index and contents disagree), and nothing in the files shows it afterwards. So a command that
writes a folder holds ``<folder>/.namc.lock`` while it runs:

- the file is created with ``O_CREAT | O_EXCL``, so of two runs starting together exactly one gets it;
- it holds JSON ``{"host", "pid", "command", "started"}``, so the refusal names who holds the folder;
- it is removed when the ``with`` block ends, also on an exception, on Ctrl-C and on SIGTERM (turned into
  ``SystemExit`` while the lock is held, where no other SIGTERM handler is installed);
- a lock left by a run that was killed (same host, PID no longer alive) is taken over with a warning; a lock held by
  a live process, or by another host (whose PIDs cannot be checked from here), refuses with :class:`LockedError`.

Example::

    with output_lock(out, "namc data pack"):
        write_shards(out)
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from namc.jsonl import loads

__all__ = ["LOCK_NAME", "LockedError", "is_launching_process", "output_lock"]

logger = logging.getLogger(__name__)

LOCK_NAME = ".namc.lock"
_READ_TRIES = 20  # a lock file is written just after it is created; wait up to ~1 s for its content
_READ_PAUSE_S = 0.05
_TAKEOVER_TRIES = 5  # stale-lock takeovers raced by other runs before giving up
_MAX_LOCK_CHARS = 64 * 1024  # a lock record is ~150 characters; anything far larger is not one


_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")  # torchrun, Lightning's launcher, SLURM


class LockedError(RuntimeError):
    """The output folder is held by another run (message: one line naming the folder and the holder)."""


def _pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists on this host (one owned by another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: an existence check that delivers nothing
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_holder(path: Path) -> dict[str, Any] | None:
    """The lock file's JSON (None when it vanished); waits briefly while its creator is still writing it.

    Raises:
        LockedError: the file stays empty or is not a lock record (then only a person can tell whether it is in use).
    """
    text = ""
    for _ in range(_READ_TRIES):
        try:
            text = path.read_text(encoding="utf-8-sig", errors="replace")
        except FileNotFoundError:
            return None
        try:
            holder = loads(text, max_chars=_MAX_LOCK_CHARS)
        except ValueError:
            time.sleep(_READ_PAUSE_S)
            continue
        if isinstance(holder, dict) and isinstance(holder.get("pid"), int):
            return holder
        break
    raise LockedError(
        f"{path.parent}: lock file {path} is not a namc lock record ({text[:60]!r}); remove it if no namc run is "
        "writing to this folder"
    )


def _describe(holder: dict[str, Any]) -> str:
    return (
        f"host {holder.get('host', '?')}, PID {holder.get('pid', '?')}, command {holder.get('command', '?')!r}"
        f" (since {holder.get('started', '?')})"
    )


def _is_stale(holder: dict[str, Any]) -> bool:
    return holder.get("host") == socket.gethostname() and not _pid_alive(int(holder["pid"]))


def _create(path: Path, record: dict[str, Any]) -> bool:
    """Creates the lock file holding ``record``; False when it already exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return True


def _take_over(path: Path, stale: dict[str, Any]) -> None:
    """Removes the stale lock ``stale`` unless another run replaced it meanwhile.

    Renaming is atomic, so of two runs taking over one stale lock only one moves it; if the file moved is not the
    stale one (a run took over and wrote its own lock between our read and our rename), it is put back.
    """
    aside = path.with_name(f"{LOCK_NAME}.stale.{os.getpid()}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return  # another run moved it first
    try:
        moved = loads(aside.read_text(encoding="utf-8", errors="replace"), max_chars=_MAX_LOCK_CHARS)
    except ValueError:
        moved = None
    if moved != stale:
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)  # put the live lock back, unless yet another run holds the name already
    else:
        logger.warning("%s: taking over a stale lock (%s no longer runs)", path.parent, _describe(stale))
    aside.unlink(missing_ok=True)


def _acquire(path: Path, record: dict[str, Any]) -> None:
    for _ in range(_TAKEOVER_TRIES):
        if _create(path, record):
            return
        holder = _read_holder(path)
        if holder is None:
            continue  # released between our create and our read
        if not _is_stale(holder):
            raise LockedError(f"{path.parent} is in use by another namc run: {_describe(holder)}")
        _take_over(path, holder)
    raise LockedError(f"{path.parent}: could not take the lock {path} (other runs keep taking it)")


def _release(path: Path, record: dict[str, Any]) -> None:
    """Removes the lock file if it is still ours (a forked child or a takeover never removes another's lock)."""
    if os.getpid() != record["pid"]:
        return
    try:
        holder = loads(path.read_text(encoding="utf-8", errors="replace"), max_chars=_MAX_LOCK_CHARS)
    except (FileNotFoundError, ValueError):
        return
    if holder == record:
        path.unlink(missing_ok=True)


def _sigterm_to_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds the with-block, so the lock file is removed


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While inside, SIGTERM raises ``SystemExit`` in the main thread (only where SIGTERM has its default action, so
    a framework's own handler is kept)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _sigterm_to_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def is_launching_process() -> bool:
    """Whether this process is the one a distributed run starts from (global rank 0, or no distributed run), read
    from the launchers' environment variables before any process group exists.

    Of a multi-process command only this process takes the folder's lock: the other ranks (started by torchrun, by
    Lightning's launcher with ``LOCAL_RANK`` set, or by SLURM) write under its lock.
    """
    return all(os.environ.get(name, "0") == "0" for name in _RANK_VARIABLES)


@contextlib.contextmanager
def output_lock(folder: str | os.PathLike, command: str) -> Iterator[Path]:
    """Holds an exclusive lock on ``folder`` (created if missing, and removed again if the block leaves it empty) for
    the body of a ``with`` block.

    Args:
        folder: the output folder.
        command: what holds it, shown to a run that is refused (e.g. ``"namc data pack"``).

    Yields:
        The lock file's path, ``<folder>/.namc.lock``.

    Raises:
        LockedError: a live process (or a process on another host) holds the folder.
    """
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "command": command,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    with _sigterm_unwinds():
        _acquire(path, record)
        try:
            yield path
        finally:
            _release(path, record)
            if created:
                with contextlib.suppress(OSError):  # a run that failed before writing leaves no empty folder behind
                    folder.rmdir()
