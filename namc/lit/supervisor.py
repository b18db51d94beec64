"""A job's processes end with the job: ``namc fit | validate | test | predict`` run under a small supervisor.

A Lightning job starts processes of its own: the other DDP ranks, DataLoader workers, and multiprocessing's fork
server and resource tracker. When a rank fails, Lightning's child-process observer SIGKILLs the main process, which
then cleans up nothing: the fork server, the resource tracker and the workers are orphaned and exit only when they
notice, which on a loaded machine can take minutes, holding the caller's output pipe open all that time.

So the command, run as a program, forks (or, when it has threads already, runs itself again) and the child runs the
command in a session of its own (the *job*) while the parent, the supervisor, waits:

1. signals the supervisor gets (``SIGINT``, ``SIGTERM``, ``SIGHUP``, ``SIGUSR1``, ``SIGUSR2``) go to every process
   of the job, as a terminal's Ctrl-C would;
2. it is the job's child subreaper (Linux), so processes orphaned by a rank's death are re-parented to it, not to
   ``init``, and it reaps them (no zombie is left for a container's ``init`` that does not reap);
3. when the job's main process has exited, whatever is left of the job's session (and of the supervisor's children)
   gets :data:`LINGER_S` seconds to exit by itself (the resource tracker removes leaked semaphores then), then
   ``SIGTERM``, then after :data:`TERM_GRACE_S` seconds ``SIGKILL``: the command returns within a bound that does
   not depend on the machine's load;
4. it exits as the job did: with its exit code, or by the same signal.

Set ``NAMC_SUPERVISED=1`` to run a command without the supervisor (every process of a job inherits it, so Lightning's
re-run of the command for rank 1 runs unsupervised). Only POSIX systems are supervised.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType

__all__ = [
    "LINGER_S",
    "SUPERVISED_ENV",
    "TERM_GRACE_S",
    "end_session",
    "fork_job",
    "namc_command",
    "session_members",
    "should_supervise",
    "supervise",
]

logger = logging.getLogger(__name__)

SUPERVISED_ENV = "NAMC_SUPERVISED"
# seconds the job's leftovers get to exit by themselves, then after SIGTERM (the resource tracker ignores SIGTERM and
# exits once the last process holding its pipe is gone: it needs the second grace to unlink leaked semaphores)
LINGER_S = 5.0
TERM_GRACE_S = 5.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# the modules that run `namc` as a program (python -m namc, python -m namc.cli, python -m namc.lit.cli)
_ENTRY_MODULES = ("namc", "namc.__main__", "namc.cli", "namc.lit.cli")


def should_supervise() -> bool:
    """Whether this process is ``namc`` run as a program (not ``main()`` called from Python), on POSIX, and not
    already a supervised job or a rank that a launcher (Lightning, torchrun) started."""
    if os.name != "posix" or os.environ.get(SUPERVISED_ENV) or "LOCAL_RANK" in os.environ:
        return False
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return spec.name in _ENTRY_MODULES
    return Path(sys.argv[0]).name == "namc"  # the console script


def namc_command(argv: Sequence[str]) -> list[str]:
    """The command line that runs ``namc *argv`` with this interpreter."""
    return [sys.executable, "-m", "namc", *argv]


def supervise(cmd: Sequence[str], linger_s: float = LINGER_S, term_grace_s: float = TERM_GRACE_S) -> int:
    """Run ``cmd`` as a job in its own session, end what is left of it once its main process has exited (see
    :func:`end_session`), and return its exit code, or end this process by the signal that ended the job's main
    process. Meant to be the last thing a program does: it makes the process a child subreaper."""
    _become_subreaper()
    job = subprocess.Popen(list(cmd), env={**os.environ, SUPERVISED_ENV: "1"}, start_new_session=True)
    return _watch(job.pid, linger_s, term_grace_s)


def fork_job(argv: Sequence[str], linger_s: float = LINGER_S, term_grace_s: float = TERM_GRACE_S) -> int | None:
    """Fork this process: the child becomes the job, in a session of its own, and gets ``None`` (it goes on to run
    the command); the parent supervises it as :func:`supervise` does and gets its exit code. ``argv`` is the
    command's arguments (``fit --config ...``), for the case below.

    Forking spares the job a second start of the interpreter and of Lightning's imports (seconds on a loaded machine);
    it is safe only while this process has one thread (a fork copies the locks other threads hold), so a process with
    more threads (a BLAS pool started without ``OMP_NUM_THREADS=1``) runs ``python -m namc`` again instead.
    """
    if _threads() != 1:
        return supervise(namc_command(argv), linger_s, term_grace_s)
    _become_subreaper()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.environ[SUPERVISED_ENV] = "1"
        return None
    return _watch(pid, linger_s, term_grace_s)


def _threads() -> int:
    """This process's thread count (0 where ``/proc`` cannot tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _watch(pid: int, linger_s: float, term_grace_s: float) -> int:
    """Wait for the job ``pid`` (a child that leads its own session), passing signals on, then end what is left."""
    previous = {sig: signal.signal(sig, _forwarder(pid)) for sig in FORWARDED}
    try:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
    finally:
        left = end_session(pid, linger_s, term_grace_s)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if left:
        logger.warning("ended %d leftover process(es) of the job: %s", len(left), "; ".join(left))
    if code < 0:  # end as the job did, so the caller sees the same signal
        _die_by(-code)
    return code


def _forwarder(pgid: int) -> Callable[[int, FrameType | None], None]:
    """A signal handler that sends the signal it gets to the job's process group."""

    def forward(signum: int, frame: FrameType | None) -> None:
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:  # a forked job that has not called setsid yet
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pgid, signum)
        except PermissionError:
            pass

    return forward


def _become_subreaper() -> None:
    """Orphans of the job are re-parented to this process instead of ``init`` (Linux; elsewhere nothing happens)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _die_by(signum: int) -> None:
    """End this process by ``signum`` (its default action), without a core dump of the supervisor."""
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP take no handler
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    time.sleep(1)  # a signal whose default action is to ignore it (SIGCHLD, SIGURG ...): exit with its number
    sys.exit(128 + signum)


# ------------------------------------------------------------------------------------------------ ending a session


def _proc_stats() -> Iterator[tuple[int, str, int, int, int]]:
    """``(pid, state, ppid, pgrp, session)`` of every process in ``/proc``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command: state, ppid, pgrp, session
            yield int(stat.parent.name), fields[0], int(fields[1]), int(fields[2]), int(fields[3])
        except (OSError, IndexError, ValueError):
            continue


def session_members(sid: int, include_children_of: int | None = None) -> list[int]:
    """The live (not zombie) processes of session ``sid``, and the children of ``include_children_of``."""
    return [
        pid
        for pid, state, ppid, _, session in _proc_stats()
        if state != "Z" and (session == sid or (include_children_of is not None and ppid == include_children_of))
    ]


def _describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"{pid} {cmd[:100]}"


def _reap() -> None:
    """Collect the exit status of every child that has exited (orphans re-parented here, among them)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wait_empty(sid: int, seconds: float) -> list[int]:
    """Reap and poll until no live process of session ``sid`` (or child of this process) is left, or ``seconds``
    pass; returns those left."""
    deadline = time.monotonic() + seconds
    while True:
        _reap()
        left = session_members(sid, os.getpid())
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def _signal_all(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def end_session(sid: int, linger_s: float = LINGER_S, term_grace_s: float = TERM_GRACE_S) -> list[str]:
    """End what is left of session ``sid`` (a job started with ``start_new_session``) and of this process's children.

    Waits ``linger_s`` seconds for them to exit by themselves, sends ``SIGTERM``, waits ``term_grace_s`` seconds,
    then ``SIGKILL`` s what remains and reaps it. Returns ``pid command`` of each process that had to be signalled.
    """
    if not Path("/proc/self/stat").exists():  # no /proc: the job's process group is what can be reached
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signal.SIGKILL)
        return []
    left = _wait_empty(sid, linger_s)
    if not left:
        return []
    described = [_describe(pid) for pid in left]
    _signal_all(left, signal.SIGTERM)
    left = _wait_empty(sid, term_grace_s)
    if left:
        _signal_all(left, signal.SIGKILL)
        _wait_empty(sid, 1.0)
    return described
