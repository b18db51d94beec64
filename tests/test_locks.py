"""namc.locks.output_lock: one owner per output folder, released on success, error, Ctrl-C and SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from namc.locks import LOCK_NAME, LockedError, output_lock


def _write_lock(folder: Path, pid: int, host: str | None = None, command: str = "namc data pack") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    record = {"host": host or socket.gethostname(), "pid": pid, "command": command, "started": "2000-01-01T00:00:00"}
    path.write_text(json.dumps(record))
    return path


def _dead_pid() -> int:
    """A PID with no process behind it on this host."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text()) if Path("/proc/sys/kernel/pid_max").exists() else 32768
    for pid in range(pid_max - 1, 1, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    pytest.skip("no free PID found")


def test_lock_held_then_removed(tmp_path: Path) -> None:
    out = tmp_path / "shards"
    with output_lock(out, "namc data pack") as lock:
        assert lock == out / LOCK_NAME
        holder = json.loads(lock.read_text())
        assert holder["pid"] == os.getpid()
        assert holder["host"] == socket.gethostname()
        assert holder["command"] == "namc data pack"
        assert holder["started"]
    assert not lock.exists()


def test_lock_removed_after_error_and_ctrl_c(tmp_path: Path) -> None:
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)), output_lock(tmp_path, "namc data pack"):
            raise exc
        assert not (tmp_path / LOCK_NAME).exists()


def test_second_holder_in_one_process_is_refused(tmp_path: Path) -> None:
    with output_lock(tmp_path, "namc data pack --shard-size 10"):
        with pytest.raises(LockedError) as err, output_lock(tmp_path, "namc data pack --shard-size 20"):
            pass
        assert (tmp_path / LOCK_NAME).exists()  # the refused run leaves the holder's lock alone
    message = str(err.value)
    assert "\n" not in message
    assert str(tmp_path) in message and f"PID {os.getpid()}" in message and "--shard-size 10" in message
    assert not (tmp_path / LOCK_NAME).exists()


def test_live_pid_refused(tmp_path: Path) -> None:
    lock = _write_lock(tmp_path, os.getppid(), command="namc data precompute")
    with pytest.raises(LockedError, match=rf"PID {os.getppid()}.*namc data precompute"), output_lock(tmp_path, "x"):
        pass
    assert json.loads(lock.read_text())["pid"] == os.getppid()


def test_other_host_refused(tmp_path: Path) -> None:
    _write_lock(tmp_path, _dead_pid(), host="some-other-host.invalid")
    with pytest.raises(LockedError, match="host some-other-host.invalid"), output_lock(tmp_path, "x"):
        pass


def test_stale_lock_taken_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dead = _dead_pid()
    _write_lock(tmp_path, dead)
    with caplog.at_level("WARNING", logger="namc.locks"), output_lock(tmp_path, "namc data pack") as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert any("stale" in r.getMessage() and f"PID {dead}" in r.getMessage() for r in caplog.records)
    assert not lock.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no leftover of the takeover


def test_unreadable_lock_refused_with_one_line(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).write_text("[[[")
    with pytest.raises(LockedError, match="not a namc lock record") as err, output_lock(tmp_path, "x"):
        pass
    assert "\n" not in str(err.value)


def test_release_leaves_another_runs_lock(tmp_path: Path) -> None:
    """A run whose lock was replaced (taken over by mistake) never removes the new holder's file."""
    with output_lock(tmp_path, "x") as lock:
        lock.unlink()
        _write_lock(tmp_path, os.getppid())
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getppid()


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from namc.locks import output_lock
    with output_lock(sys.argv[1], "holder"):
        print("held", flush=True)
        time.sleep(60)
    """
)


@pytest.mark.slow
def test_second_process_refused_and_sigterm_releases(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(LockedError, match=rf"PID {proc.pid}, command 'holder'"), output_lock(tmp_path, "x"):
            pass
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (tmp_path / LOCK_NAME).exists()
    with output_lock(tmp_path, "after") as lock:  # free again
        assert lock.exists()


def test_a_folder_the_lock_created_is_removed_when_left_empty(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), output_lock(tmp_path / "new", "x"):
        raise RuntimeError("failed before writing")
    assert not (tmp_path / "new").exists()
    with output_lock(tmp_path / "kept", "x") as lock:
        (lock.parent / "shard-000000.tar").write_bytes(b"")
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["shard-000000.tar"]
