"""The fast tier's guard (tests/conftest.py): a test that takes longer than the limit fails unless marked ``slow``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import over_the_limit, run_delay_s

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")

INNER = """
import time

import pytest


@pytest.fixture(scope="module")
def expensive():
    time.sleep(0.3)


def test_unmarked_and_slow():
    time.sleep(0.3)


@pytest.mark.slow
def test_marked_and_slow():
    time.sleep(0.3)


def test_quick():
    pass


def test_first_user_of_an_expensive_fixture(expensive):
    pass


def test_second_user_of_an_expensive_fixture(expensive):
    pass


def test_slow_and_failing_on_its_own():
    time.sleep(0.3)
    assert 1 == 2
"""


def test_the_limit_counts_setup_and_call_and_spares_slow_tests() -> None:
    assert over_the_limit(0.0, 4.9, 5.0, marked_slow=False) is None
    assert over_the_limit(3.0, 2.5, 5.0, marked_slow=True) is None
    assert over_the_limit(3.0, 2.5, 0.0, marked_slow=False) is None  # 0 turns the check off
    message = over_the_limit(3.0, 2.5, 5.0, marked_slow=False)
    assert message is not None and "\n" not in message
    assert message.startswith("took 5.5 s (setup 3.0 s + call 2.5 s), over the fast tier's 5 s: mark it `slow`")


def test_time_spent_waiting_for_a_cpu_held_by_other_work_is_not_charged() -> None:
    assert over_the_limit(3.0, 15.0, 5.0, marked_slow=False, waited_s=14.0) is None  # 4 s of its own
    message = over_the_limit(3.0, 15.0, 5.0, marked_slow=False, waited_s=10.0)  # 8 s of its own
    assert message is not None
    assert message.startswith("took 18.0 s (setup 3.0 s + call 15.0 s; 10.0 s of it waiting for a CPU), over")


@pytest.mark.slow  # starts a spinning process
@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="the kernel keeps no schedstat")
def test_the_run_delay_grows_when_another_process_shares_the_cpu() -> None:
    cpu = min(os.sched_getaffinity(0))
    spin = (
        f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\nprint(flush=True)\n"
        "end = time.time() + 5\nwhile time.time() < end: pass"
    )
    spinner = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
    before_affinity = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})
        spinner.stdout.readline()  # it spins on that CPU from now on
        start, waited = time.perf_counter(), run_delay_s()
        while time.perf_counter() - start < 0.6:
            pass
        waited, elapsed = run_delay_s() - waited, time.perf_counter() - start
    finally:
        os.sched_setaffinity(0, before_affinity)
        spinner.kill()
        spinner.wait()
    assert 0.1 < waited < elapsed  # about half of the time went to the spinner


def test_an_unmarked_slow_test_fails_with_a_one_line_reason(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest("--slow-limit=0.2", "-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(passed=3, failed=3)
    result.stdout.fnmatch_lines(
        [
            "*test_inner.py::test_unmarked_and_slow took * s (setup * s + call * s*), over the fast tier's 0.2 s: "
            "mark it `slow` (and add a fast test of the same logic)",
            "*test_inner.py::test_first_user_of_an_expensive_fixture took * s (setup * s + call *",
        ]
    )
    output = result.stdout.str()
    assert "test_second_user_of_an_expensive_fixture took" not in output  # the fixture is charged once
    assert "test_marked_and_slow took" not in output and "test_quick took" not in output
    assert "test_slow_and_failing_on_its_own took" not in output and "assert 1 == 2" in output  # its own failure
