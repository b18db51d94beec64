"""The supervisor of ``namc fit``: when the job's main process dies the way Lightning's child-process observer ends it
(SIGKILL, leaving a process that ignores SIGTERM and an orphan behind, both holding the output pipe), the command
still returns within its grace periods, with the job's signal, and leaves no process of the job alive.

The jobs here are small Python scripts, not Lightning runs (those are in ``test_resume.py``); the supervisor module
is loaded from its file, without the Lightning stack that ``namc.lit`` imports. They start process trees, so they run
in the full tier.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from _jobprocs import kill_processes, processes_with_env

SUPERVISOR = Path(__file__).resolve().parents[1] / "namc" / "lit" / "supervisor.py"
TOKEN_ENV = "NAMC_TEST_JOB"
LINGER_S, TERM_GRACE_S = 0.5, 1.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sessions and /proc")

# The job (one script, its role in argv[1]): main starts a process that ignores SIGTERM (as multiprocessing's resource
# tracker does) and one whose child it orphans (as a dead rank orphans its fork server), waits until they are up,
# then ends as $JOB_END says
JOB = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time

    def start(role):
        kid = subprocess.Popen([sys.executable, __file__, role], stdout=subprocess.PIPE)
        kid.stdout.readline()  # it is up
        return kid

    role = sys.argv[1]
    if role == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if role == "orphaning":
        start("sleeper")
    if role != "main":
        print("up", flush=True)
        time.sleep(600)
    start("stubborn")
    os.kill(start("orphaning").pid, signal.SIGKILL)  # its sleeper is an orphan now
    print("job ready", flush=True)
    end = os.environ["JOB_END"]
    if end == "sigkill":  # as Lightning's observer ends the main process when a rank fails
        os.kill(os.getpid(), signal.SIGKILL)
    elif end == "wait":
        time.sleep(600)
    sys.exit(int(end))
    """
)

DRIVER = textwrap.dedent(
    """
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("supervisor", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    linger, grace = float(sys.argv[3]), float(sys.argv[4])
    if sys.argv[5] == "exec":
        sys.exit(mod.supervise([sys.executable, sys.argv[2], "main"], linger, grace))
    code = mod.fork_job([], linger, grace)  # this driver has one thread: the job is a fork of it
    if code is None:
        import runpy
        sys.argv = [sys.argv[2], "main"]
        runpy.run_path(sys.argv[0], run_name="__main__")
    sys.exit(code)
    """
)


def _supervised(tmp_path: Path, end: str, how: str = "exec") -> tuple[subprocess.Popen, str]:
    """The driver running the job under the supervisor, and the token its processes carry."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    token = uuid.uuid4().hex
    env = {**os.environ, TOKEN_ENV: token, "JOB_END": end}
    env.pop("NAMC_SUPERVISED", None)
    cmd = [sys.executable, "-c", DRIVER, str(SUPERVISOR), str(job), str(LINGER_S), str(TERM_GRACE_S), how]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, token


def _finish(proc: subprocess.Popen, token: str, timeout: float = 30) -> tuple[str, float, list[str]]:
    """The driver's output and how long it took from now to close its pipe and exit; the job's live processes then
    (killed, so a failing test leaves nothing behind)."""
    start = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        left = processes_with_env(TOKEN_ENV, token)
        kill_processes(left)
        proc.kill()
    return out, time.monotonic() - start, left


@pytest.mark.slow  # starts process trees: the full tier
@pytest.mark.parametrize("how", ["exec", "fork"])
@pytest.mark.parametrize(("end", "code"), [("sigkill", -signal.SIGKILL), ("3", 3), ("0", 0)])
def test_a_job_whose_main_process_ends_leaves_nothing_behind(tmp_path: Path, end: str, code: int, how: str) -> None:
    proc, token = _supervised(tmp_path, end, how)
    out, took, left = _finish(proc, token)
    assert "job ready" in out
    assert proc.returncode == code, out
    assert not left, f"processes of the job alive after the supervisor returned: {left}"
    # linger, SIGTERM, grace, SIGKILL (the slack is for the job's own start and the reaping)
    assert took < LINGER_S + TERM_GRACE_S + 10, took
    assert "leftover process(es) of the job" in out  # both the stubborn process and the orphan had to be ended


@pytest.mark.slow  # starts process trees: the full tier
@pytest.mark.parametrize("how", ["exec", "fork"])
def test_a_signal_to_the_supervisor_reaches_the_job(tmp_path: Path, how: str) -> None:
    proc, token = _supervised(tmp_path, "wait", how)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "job ready", line
    proc.send_signal(signal.SIGTERM)  # as a terminal's Ctrl-C or a batch system's time limit would
    out, took, left = _finish(proc, token)
    assert proc.returncode == -signal.SIGTERM, out
    assert not left, left
    assert took < LINGER_S + TERM_GRACE_S + 10, took


def test_only_namc_run_as_a_program_is_supervised(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main()`` called from Python (here, from pytest) runs in-process; a supervised job or a launched rank is not
    supervised again."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("supervisor_under_test", SUPERVISOR)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.delenv(mod.SUPERVISED_ENV, raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert not mod.should_supervise()  # __main__ is pytest
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", importlib.util.find_spec("namc"), raising=False)
    assert mod.should_supervise()
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not mod.should_supervise()
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv(mod.SUPERVISED_ENV, "1")
    assert not mod.should_supervise()
