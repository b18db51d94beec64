"""FDG.compile_step's frozen step (namc.models.compiled_step) without compiling: what the compiled module holds, and
when it is compiled again. Compiled generations are checked in test_decoding.py and test_precision.py (slow)."""

from __future__ import annotations

import pytest
import torch

from namc.models import qlinear
from namc.models.compiled_step import CompiledStep, FrozenStep, int8_layers
from namc.models.fdg import FDG, FDGConfig, _StepWeights


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
