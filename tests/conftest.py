"""Every test starts from the same random state, and a test that is not marked ``slow`` stays fast.

This torch build seeds its default generator differently in every process, so a test that initialises a layer or
draws data without its own generator would see different numbers in every run: a failure that cannot be replayed.
Seeding before each test makes the suite deterministic in any order (tests still seed their own generators where
the numbers matter).

``python -m pytest -q`` is the fast tier: the default options deselect ``slow``. ``python -m pytest -q -m ""`` is the
full tier. A test that takes longer than ``--slow-limit`` seconds (setup and call together, so an expensive
module-scoped fixture is charged to the first test that uses it) fails unless it is marked ``slow``: the fast tier
stays fast because nothing slips into it unnoticed. A test is charged its wall time less the time the test's thread
stood ready to run while other work held the CPUs (the kernel's run delay): on a loaded machine the wall time of a
5 s test stretches three- or fourfold, which would fail tests for what runs beside the suite, while a test that
sleeps or waits is still charged in full.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import sys

import numpy as np
import pytest
import torch

SLOW_LIMIT_S = 5.0  # the fast tier's budget per test; the ``slow`` marker's description in pyproject.toml names it
_SETUP_S = pytest.StashKey[float]()
_DELAY_AT_START = pytest.StashKey[float]()
_METEOR: list = []  # the started evaluator, once a collected module imports namc.lit


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow-limit",
        type=float,
        default=SLOW_LIMIT_S,
        metavar="SECONDS",
        help=f"fail a test not marked slow whose setup and call take longer than this (default {SLOW_LIMIT_S:g}; "
        "0 turns the check off, e.g. under a debugger or coverage)",
    )


def run_delay_s() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux schedstat; 0 where the kernel has none)."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def over_the_limit(
    setup_s: float, call_s: float, limit_s: float, marked_slow: bool, waited_s: float = 0.0
) -> str | None:
    """The failure message for a test that took ``setup_s + call_s`` seconds, ``waited_s`` of them waiting for a CPU
    held by other work, or None when the test may take that."""
    took = setup_s + call_s
    charged = took - waited_s
    if marked_slow or limit_s <= 0 or charged <= limit_s:
        return None
    waited = f"; {waited_s:.1f} s of it waiting for a CPU" if waited_s >= 0.05 else ""
    return (
        f"took {took:.1f} s (setup {setup_s:.1f} s + call {call_s:.1f} s{waited}), over the fast tier's {limit_s:g} s: "
        "mark it `slow` (and add a fast test of the same logic)"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_DELAY_AT_START] = run_delay_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201 (a hook wrapper)
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "setup":
        item.stash[_SETUP_S] = report.duration
    elif report.when == "call" and report.passed:
        start = item.stash.get(_DELAY_AT_START, None)
        message = over_the_limit(
            item.stash.get(_SETUP_S, 0.0),
            report.duration,
            item.config.getoption("--slow-limit"),
            item.get_closest_marker("slow") is not None,
            0.0 if start is None else run_delay_s() - start,
        )
        if message is not None:
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid} {message}"


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """Start the METEOR JVM that caption scoring shares across the process (namc.lit's evaluator) as soon as a
    collected module imports namc.lit: it loads its paraphrase table for seconds while collection goes on."""
    if _METEOR or "namc.lit.modules" not in sys.modules or shutil.which("java") is None:
        return
    from namc.lit.modules import caption_evaluator

    evaluator = caption_evaluator()
    with contextlib.suppress(ImportError, OSError, RuntimeError):  # no pycocoevalcap: those tests say so themselves
        evaluator._meteor_scorer()  # starts the JVM without waiting for it
        _METEOR.append(evaluator)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Wait until that JVM answers before the first test, so that no test is charged for its start."""
    if _METEOR and session.items and not session.config.option.collectonly:
        with contextlib.suppress(OSError, RuntimeError):
            _METEOR[0]._meteor_score({"0": ["a"]}, {"0": ["a"]})


@pytest.fixture(autouse=True)
def _same_random_state() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
