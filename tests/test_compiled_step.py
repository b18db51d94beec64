"""FusedFDG.compile_step's frozen step (namc.backends.compiled_step) without inductor: what the compiled module
holds, when it is compiled again, and how many graphs dynamo traces for it (through a backend that counts them and
runs each graph as traced). Inductor's compiled generations are checked in test_decoding.py and test_precision.py
(slow)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx

from namc.backends import qlinear
from namc.backends.compiled_step import CompiledStep, FrozenStep, int8_layers
from namc.backends.step import FusedFDG as FDG
from namc.backends.step import StepWeights as _StepWeights
from namc.models.fdg import FDGConfig


def _fdg() -> FDG:
    torch.manual_seed(3)
    return FDG(FDGConfig(vocab_size=40, dim=32, heads=4, layers=2, max_len=16, eos_id=-1, dropout=0.0)).eval()


@torch.inference_mode()
def test_frozen_step_runs_the_eager_step_on_the_same_weights():
    fdg = _fdg()
    frozen = FrozenStep(fdg, fdg.step_weights())
    assert set(frozen.state_dict()) == {f"fdg.{k}" for k in fdg.state_dict()}  # its own buffers are not saved
    for mine, live in zip(frozen.step_weights(), fdg.step_weights()):
        for name in _StepWeights.NAMES:
            for a, b in zip(getattr(mine, name), getattr(live, name)):
                assert (a is None and b is None) or torch.equal(a, b)
    memory = torch.randn(3, 5, 32)
    caches, cross_kv, fused = fdg._start(memory, 4)
    twin_caches, _, _ = fdg._start(memory, 4)
    tokens = torch.tensor([1, 2, 3])
    for t in range(3):  # the caches grow alike
        expected = fdg._fused_step(tokens, t, caches, cross_kv, None, fused)
        torch.testing.assert_close(frozen(tokens, t, twin_caches, cross_kv, None), expected, rtol=0, atol=0)
        tokens = expected.argmax(-1)


def test_an_int8_step_does_not_compile(monkeypatch: pytest.MonkeyPatch):
    """An int8 copy's step is refused with what to do, when compiling is asked for and when the step became int8
    after it (nothing is compiled: the refusal comes first); an int8 copy whose matrices all stay fp32 (under
    ``INT8_MIN_WEIGHT``) compiles as fp32 does. 2048 entries here, so that this width-32 step has both kinds: q/k/v
    (3072) and the FFN's two (4096) int8, the rest fp32."""
    monkeypatch.setattr(qlinear, "INT8_MIN_WEIGHT", 2048)
    fdg = _fdg()
    large = {id(m) for w in fdg.step_weights() for n in _StepWeights.NAMES if (m := getattr(w, n)[0]).numel() >= 2048}
    fdg.pack_step("int8")
    assert int8_layers(fdg.step_weights()) == len(large) == 6
    with pytest.raises(ValueError, match="int8 copy's decoding step does not compile: .* its 6 int8 layers"):
        fdg.compile_step()
    assert "_compiled_step" not in fdg.__dict__

    late = _fdg()
    late.compile_step()
    late.pack_step("int8")
    with pytest.raises(ValueError, match="eagerly"):
        late.generate(torch.randn(2, 5, 32), 3)

    monkeypatch.setattr(qlinear, "INT8_MIN_WEIGHT", 1 << 30)
    small = _fdg()
    small.pack_step("int8")
    assert int8_layers(small.step_weights()) == 0
    small.compile_step()
    assert isinstance(small.__dict__["_compiled_step"], CompiledStep)


@pytest.mark.slow  # torch.compile
def test_frozen_step_is_compiled_again_only_after_its_weights_change():
    """``torch.compile`` compiles at the first call, so building the compiled module costs nothing here."""
    fdg = _fdg()
    step = CompiledStep(fdg)
    step.for_generation(fdg.step_weights())
    first = step._compiled
    step.for_generation(fdg.step_weights())
    assert step._compiled is first  # unchanged weights: the same compiled code
    with torch.no_grad():
        fdg.blocks[1].ffn[0].bias.add_(1.0)  # in place: an optimiser step, load_state_dict
    step.for_generation(fdg.step_weights())
    second = step._compiled
    assert second is not first
    fdg.ln_f.weight = torch.nn.Parameter(fdg.ln_f.weight.detach().clone())  # replaced
    step.for_generation(fdg.step_weights())
    assert step._compiled is not second
    third = step._compiled
    fdg.pack_step("int8")  # new packed weights, the parameters untouched
    step.for_generation(fdg.step_weights())
    assert step._compiled is not third


def test_unfrozen_step_is_compiled_once():
    fdg = _fdg()
    step = CompiledStep(fdg, freeze=False)
    fn = step.for_generation(fdg.step_weights())
    with torch.no_grad():
        fdg.ln_f.weight.add_(1.0)  # the weights are the graph's inputs: nothing to compile again
    assert step.for_generation(fdg.step_weights()) is fn
    assert step.options == {"dynamic": True}
    assert CompiledStep(fdg, options={"dynamic": False, "mode": "max-autotune"}).options["dynamic"] is False


def _counting(graphs: list[fx.GraphModule]):
    """A dynamo backend that keeps every graph it is given and runs it as traced."""

    def backend(gm: fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    return backend


@pytest.mark.slow  # torch.compile, two graphs
def test_a_compiled_step_traces_batch_1_and_one_larger_batch():
    """The graphs traced for batch 2 serve every larger batch: none is guarded to a size that a test in the step
    took one side of (the GELU's size and parity tests had made odd batches, and batches over 32 rows of this
    512-wide FFN, graphs of their own). The tokens are eager decoding's."""
    torch.manual_seed(4)
    fdg = FDG(FDGConfig(vocab_size=50, dim=128, heads=4, layers=1, max_len=16, eos_id=-1, dropout=0.0)).eval()
    memory = torch.randn(40, 5, 128)
    eager = {b: fdg.generate(memory[:b], 4) for b in (1, 2, 3, 8, 33, 40)}
    graphs: list[fx.GraphModule] = []
    fdg.compile_step(backend=_counting(graphs))
    traced = []
    try:
        for b, expected in eager.items():
            assert torch.equal(fdg.generate(memory[:b], 4), expected), b
            traced.append(len(graphs))
    finally:
        fdg.uncompile_step()
    assert 0 < traced[0] < traced[1] == traced[-1]  # batch 1, then batch 2 for every larger batch


@pytest.mark.slow  # torch.compile, several graphs
def test_a_frozen_step_compiles_again_for_every_version_of_its_weights():
    """Dynamo counts graphs against its recompile limit per code object, dead ones included: each frozen step has a
    ``forward`` of its own, so a new version of the weights is compiled however many came before it, rather than
    run eagerly (with dynamo's limit of 8 and inductor's two graphs a version, the third version was eager; here the
    limit is 2 and this backend traces one graph a version), and every version decodes as an uncompiled twin does."""
    fdg = _fdg()
    twin = copy.deepcopy(fdg)
    memory = torch.randn(2, 5, 32)
    graphs: list[fx.GraphModule] = []
    fdg.compile_step(backend=_counting(graphs))
    try:
        with torch._dynamo.config.patch(recompile_limit=2):
            for version in range(3):
                before = len(graphs)
                assert torch.equal(fdg.generate(memory, 3), twin.generate(memory, 3)), version
                assert len(graphs) > before, version
                with torch.no_grad():
                    for model in (fdg, twin):
                        model.blocks[0].ffn[3].weight.mul_(-1.0)
    finally:
        fdg.uncompile_step()


@pytest.mark.slow  # torch.compile
def test_unfrozen_steps_of_like_fdgs_share_their_graphs():
    """With the weights as inputs, one traced graph serves every FDG of the same shape (their steps share
    ``FusedFDG._fused_step``'s code object), each decoding with its own weights."""
    memory = torch.randn(2, 5, 32)
    graphs: list[fx.GraphModule] = []
    backend = _counting(graphs)  # one backend, as inductor's wrappers of the same options compare equal
    for seed in range(3):
        torch.manual_seed(seed)
        fdg = FDG(FDGConfig(vocab_size=40, dim=32, heads=4, layers=2, max_len=16, eos_id=-1, dropout=0.0)).eval()
        eager = fdg.generate(memory, 3)
        fdg.compile_step(freeze=False, backend=backend)
        try:
            assert torch.equal(fdg.generate(memory, 3), eager), seed
        finally:
            fdg.uncompile_step()
    assert len(graphs) == 1
