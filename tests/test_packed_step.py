"""An fp32 decoding step on matrices reordered once for oneDNN (namc.backends.packed_step): from which batch, which
matrices, the same logits and ids as the plain weights, kept until a parameter changes, and copies of the model."""

from __future__ import annotations

import copy

import pytest
import torch

from namc.backends import onednn
from namc.backends import step as packed_step
from namc.backends.static_decode import StaticDecoder
from namc.backends.step import FusedFDG as FDG
from namc.models.fdg import FDGConfig

pytestmark = pytest.mark.skipif(not onednn.linear_available(), reason="oneDNN's linear kernel is not available")


@pytest.fixture
def fdg(monkeypatch: pytest.MonkeyPatch) -> FDG:
    """Width 32, with the reordering threshold at 2048 entries: q/k/v (3072), the FFN's two (4096) and the
    vocabulary (3200) reordered, the 32 x 32 ones not (which dense runs on ``F.linear``, as the plain step does)."""
    monkeypatch.setattr(packed_step, "MIN_WEIGHT", 2048)
    torch.manual_seed(4)
    return FDG(FDGConfig(vocab_size=100, dim=32, heads=4, layers=2, max_len=16, eos_id=-1, dropout=0.0)).eval()


def _reordered(weights: list) -> set[str]:
    return {n for w in weights for n in w.NAMES if onednn.is_packed(getattr(w, n)[0])}


@torch.inference_mode()
def test_reordered_from_min_rows_with_the_plain_weights_results(fdg: FDG, monkeypatch: pytest.MonkeyPatch):
    assert _reordered(fdg.step_weights(packed_step.MIN_ROWS - 1)) == set()
    assert _reordered(fdg.step_weights(packed_step.MIN_ROWS)) == {"qkv", "ffn_in", "ffn_out", "vocab"}
    memory = torch.randn(5, 7, 32, generator=torch.Generator().manual_seed(0))
    ids = fdg.generate(memory, 10)
    # the same call on the plain weights
    monkeypatch.setattr(packed_step, "MIN_ROWS", 1 << 30)
    assert _reordered(fdg.step_weights(5)) == set()
    assert torch.equal(fdg.generate(memory, 10), ids)
    for rows in (1, 5):  # one step's logits, plain against reordered
        caches, cross_kv, plain = fdg._start(memory[:rows], 3)
        twin_caches, _, _ = fdg._start(memory[:rows], 3)
        monkeypatch.setattr(packed_step, "MIN_ROWS", 1)
        reordered = fdg.step_weights(rows)
        tokens = torch.full((rows,), fdg.bos_id)
        want = fdg._fused_step(tokens, 0, caches, cross_kv, None, plain)
        got = fdg._fused_step(tokens, 0, twin_caches, cross_kv, None, reordered)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        monkeypatch.setattr(packed_step, "MIN_ROWS", 1 << 30)


@torch.inference_mode()
def test_kept_until_a_parameter_changes(fdg: FDG):
    first = fdg.step_weights(packed_step.MIN_ROWS)
    assert fdg.step_weights(32)[0].vocab[0] is first[0].vocab[0]  # made once, for every batch from MIN_ROWS
    memory = torch.randn(packed_step.MIN_ROWS, 7, 32, generator=torch.Generator().manual_seed(1))
    before = fdg.generate(memory, 8)
    with torch.inference_mode(False), torch.no_grad():
        fdg.tok.weight.mul_(-1.0)  # the tied vocabulary projection, changed in place
    again = fdg.step_weights(packed_step.MIN_ROWS)
    assert again[0].vocab[0] is not first[0].vocab[0]
    after = fdg.generate(memory, 8)
    assert not torch.equal(after, before)
    changed = FDG(fdg.config).eval()
    changed.load_state_dict(fdg.state_dict())
    assert torch.equal(changed.generate(memory[:1], 8), after[:1])  # batch 1: the plain weights


@torch.inference_mode()
def test_copies_and_the_other_ways_of_decoding(fdg: FDG):
    memory = torch.randn(packed_step.MIN_ROWS, 7, 32, generator=torch.Generator().manual_seed(2))
    ids = fdg.generate(memory, 9)
    assert "_packed_fp32" in fdg.__dict__
    twin = copy.deepcopy(fdg)  # oneDNN's opaque tensors cannot be copied: the copy starts without them
    assert twin.__dict__["_packed_fp32"] is not fdg.__dict__["_packed_fp32"]
    assert torch.equal(twin.generate(memory, 9), ids)
    assert torch.equal(StaticDecoder(fdg, max_new_tokens=9)(memory), ids)  # eager fixed-shape steps on a CPU
    with torch.inference_mode(False), torch.no_grad():
        fdg.train()
        assert fdg._start(memory.clone(), 3)[2] is None  # training steps run the modules
