"""namc.kernels: small products on one thread where OpenMP's idle threads sleep, the same results either way.

OpenMP reads ``OMP_WAIT_POLICY`` when torch loads, so each policy runs in a fresh interpreter (slow); the same
probes also run in this process with the module's reading of the policy set by hand."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from namc import kernels

PROBE = """
import torch
from namc import kernels
torch.set_num_threads(2)
calls = [("int8", 1e6), ("int8", 1e9), ("bf16", 1e6), ("fp32", 1e6), ("sdpa_fp32", 1e8), ("layer_norm", 24576),
         ("gelu", 98304), ("layer_norm", 1e6), ("argmax", 32 * 49409), ("argmax", 128 * 49409)]
seen = [kernels.run(kind, flops, torch.get_num_threads) for kind, flops in calls]
try:
    with kernels.one_thread():
        raise KeyError("inside")
except KeyError:
    pass
print(kernels.idle_threads_sleep(), seen, torch.get_num_threads())
"""

SAME = """
import copy
import torch
from namc import kernels
from namc.backends import onednn
from namc.backends.step import FusedFDG as FDG
from namc.models.fdg import FDGConfig
from namc.backends.step import InplaceGELU as GELU
from namc.backends.step import ThreadedLayerNorm as LayerNorm
from namc.backends.qlinear import DynamicLinear
from namc.backends.step import first_max_index
torch.set_num_threads(2)
torch.manual_seed(0)
layer, w = DynamicLinear(torch.randn(96, 64), torch.randn(96)), torch.randn(4096, 64)
x = torch.randn(3, 64)
norm, h = LayerNorm(64), torch.randn(32, 3072)  # h: above GELU's own one-thread size, below the rule's
fdg = FDG(FDGConfig(vocab_size=300, dim=64, heads=4, layers=2, max_len=16, eos_id=-1, dropout=0.0)).eval()
memory = torch.randn(3, 7, 64)
logits = torch.randint(0, 50, (32, 49409)).float()  # ties in every row
int8 = copy.deepcopy(fdg)
int8.pack_step("int8")
out = {}
for sleep in (True, False):
    kernels._SLEEP[:] = [sleep]
    out[sleep] = (layer(x), onednn.dense(x, w), fdg.generate(memory, 8), int8.generate(memory, 8), norm(x),
                  GELU()(h.clone()), first_max_index(logits))
print(kernels.serial(2.0 * 3 * 96, "int8"), all(torch.equal(a, b) for a, b in zip(out[True], out[False])))
"""


def _python(code: str, policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow  # a fresh interpreter per policy
@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("PASSIVE", "True [1, 2, 1, 1, 2, 1, 1, 2, 1, 2] 2"),
        ("passive", "True [1, 2, 1, 1, 2, 1, 1, 2, 1, 2] 2"),
        (None, "False [2, 2, 2, 2, 2, 2, 2, 2, 2, 2] 2"),
    ],
)
def test_small_products_run_on_one_thread_only_where_idle_threads_sleep(policy, expected):
    """Under a passive wait policy a product below its kind's threshold runs on one thread and the caller's two come
    back after (after an exception too); above it, or where threads spin, nothing changes."""
    assert _python(PROBE, policy) == expected


@pytest.mark.slow  # a fresh interpreter
def test_one_thread_gives_the_same_results():
    """Dynamic int8 and fp32 products, LayerNorm, GELU, the greedy pick and whole greedy decodings in fp32 and int8,
    equal to the bit with small products on one thread and on two."""
    assert _python(SAME, "PASSIVE") == "False True"


@pytest.mark.parametrize(
    ("sleep", "expected"),
    [(True, "True [1, 2, 1, 1, 2, 1, 1, 2, 1, 2] 2"), (False, "False [2, 2, 2, 2, 2, 2, 2, 2, 2, 2] 2")],
)
def test_the_thread_rule_in_this_process(sleep: bool, expected: str, capsys: pytest.CaptureFixture) -> None:
    """The probe above, run here with the policy this module read from the environment set either way: the same
    choices per kind and size, and the caller's thread count back after an exception."""
    saved, count = list(kernels._SLEEP), torch.get_num_threads()
    kernels._SLEEP[:] = [sleep]
    try:
        exec(PROBE, {})
    finally:
        kernels._SLEEP[:] = saved
        torch.set_num_threads(count)
    assert capsys.readouterr().out.strip() == expected


def test_the_policy_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = list(kernels._SLEEP)
    try:
        for value, sleeps in (("PASSIVE", True), (" passive ", True), ("ACTIVE", False), ("", False)):
            kernels._SLEEP.clear()
            monkeypatch.setenv("OMP_WAIT_POLICY", value)
            assert kernels.idle_threads_sleep() is sleeps, value
            monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE" if not sleeps else "ACTIVE")
            assert kernels.idle_threads_sleep() is sleeps  # read once: OpenMP does not look again either
    finally:
        kernels._SLEEP[:] = saved


def test_one_thread_gives_the_same_results_in_this_process(capsys: pytest.CaptureFixture) -> None:
    """The comparison above without the fresh interpreter (both settings of the rule are set by hand there too)."""
    saved, count = list(kernels._SLEEP), torch.get_num_threads()
    try:
        exec(SAME, {})
    finally:
        kernels._SLEEP[:] = saved
        torch.set_num_threads(count)
    assert capsys.readouterr().out.strip() == "False True"
