"""Dynamic int8 linear layers (namc.backends.qlinear): 8-bit activations where the CPU has VNNI, no saturation at the
top of the range, every ``nn.Linear`` of a module replaced, the same layers as PyTorch's deprecated flow without it."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import namc
from namc.backends import qlinear
from namc.backends.precision import inference_copy
from namc.backends.qlinear import (
    KERNELS_ENV,
    DynamicLinear,
    full_range,
    int8_kernels,
    int8_linear,
    quantize_activations,
    quantize_linears,
    quantize_weight,
    weight_codes,
)
from namc.models.fusion import ConcatFusion

QUANTIZED = hasattr(torch.ops.quantized, "linear_dynamic")
KERNELS = ["quantized", "plain"] if QUANTIZED else ["plain"]


def _error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y - ref).norm() / ref.norm()).item()


@pytest.fixture(autouse=True)
def _int8_at_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests' layers are small; int8 copies leave matrices under INT8_MIN_WEIGHT entries in fp32 (tested
    below, with the threshold as shipped), so here every size is quantised."""
    monkeypatch.setattr(qlinear, "INT8_MIN_WEIGHT", 0)


def test_small_matrices_stay_fp32(monkeypatch: pytest.MonkeyPatch):
    """With the shipped threshold (8,192 entries) an int8 copy quantises 64 x 128 (8,192) and leaves 128 x 32 in fp32.
    namc_tiny at the demo's width of 32 (and its 81-word vocabulary) keeps every matrix of MIR and FDG in fp32, so its
    int8 decoding gives fp32's ids to the bit; at its own width of 128 every one is int8."""
    monkeypatch.undo()
    assert qlinear.INT8_MIN_WEIGHT == 8192
    net = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()
    q = quantize_linears(net)
    assert [type(m) for m in q] == [DynamicLinear, nn.GELU, nn.Linear] and torch.equal(q[2].weight, net[2].weight)

    for dim, int8_layers in ((32, False), (128, True)):
        torch.manual_seed(0)
        model = namc.create_model("namc_tiny", pretraining=False, dim=dim, heads=2 if dim == 32 else 4).eval()
        int8 = inference_copy(model, "int8")
        entries = [getattr(w, n)[0] for w in int8.fdg.step_weights() for n in w.NAMES]
        dynamic = [m for m in [*int8.mir.modules(), *entries] if isinstance(m, DynamicLinear)]
        assert all(isinstance(e, nn.Module) == int8_layers for e in entries)
        assert all(m.in_features * m.out_features >= 8192 for m in dynamic) and bool(dynamic) == int8_layers
        size = model.config.image_size
        images = torch.rand(2, 3, 3, size, size, generator=torch.Generator().manual_seed(dim))
        with torch.inference_mode():
            memory = model.encode_pair(images[0], images[1])
            same = torch.equal(int8.fdg.generate(memory, 8), model.fdg.generate(memory, 8))
        assert same or int8_layers


@pytest.mark.skipif(not full_range(), reason="this CPU has no VNNI: activations stay at 7 bits")
@pytest.mark.skipif(not QUANTIZED, reason="this torch has no quantised int8 kernels")
def test_activations_use_8_bits_with_vnni():
    g = torch.Generator().manual_seed(0)
    weight, bias = 0.02 * torch.randn(256, 768, generator=g), 0.01 * torch.randn(256, generator=g)
    x = torch.randn(32, 768, generator=g)
    x[:, :4] *= 8  # a few large features widen the range, as after LayerNorm in trained models
    layer = DynamicLinear(weight, bias, kernels="quantized")
    ref = x @ weight.T + bias
    with torch.inference_mode():
        y = layer(x)
        packed = layer.packed
        assert torch.equal(y, torch.ops.quantized.linear_dynamic(x, packed, reduce_range=False))
        seven_bit = torch.ops.quantized.linear_dynamic(x, packed, reduce_range=True)  # PyTorch's module
    assert _error(y, ref) < 0.6 * _error(seven_bit, ref)  # measured 0.50x: one more bit halves the error


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("width", [768, 3072])
def test_no_saturation_at_the_top_of_the_range(width, kernels):
    """Rows of maximal weight codes times inputs at the top of the uint8 range: a kernel that summed two products in
    int16 (x86 without VNNI) would saturate here; the layer must not (measured 0.5% error, rounding alone)."""
    weight = torch.full((64, width), 0.02)
    weight[1::2] *= -1
    x = torch.full((4, width), 3.0)
    x[:, ::7] = -0.5
    with torch.inference_mode():
        assert _error(DynamicLinear(weight, None, kernels)(x), x @ weight.T) < 0.01


def test_quantize_linears_replaces_every_linear():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Sequential(nn.Linear(128, 32))).eval()
    q = quantize_linears(net)
    kinds = [type(m) for m in q.modules()]
    assert kinds.count(DynamicLinear) == 2 and nn.Linear not in kinds
    assert all(type(m) is nn.Linear for m in net.modules() if isinstance(m, nn.Linear))  # the original is untouched
    assert type(quantize_linears(net[0])) is DynamicLinear  # a layer itself
    x = torch.randn(8, 64)
    with torch.inference_mode():
        assert _error(q(x), net(x)) < 0.03


def test_linear_subclasses_take_their_own_int8_form_or_raise():
    """PyTorch's flow swaps exact nn.Linear layers only: MIR's concat fusion (an nn.Linear with a two-stream
    forward) becomes two int8 halves summed; an unknown subclass raises instead of staying fp32 unnoticed;
    nn.MultiheadAttention's output projection stays fp32, as in PyTorch's flow."""
    torch.manual_seed(0)
    fusion = ConcatFusion(64).eval()
    x1, x2 = torch.randn(2, 10, 64), 3 * torch.randn(2, 10, 64)  # streams of different ranges: one scale each
    q = quantize_linears(fusion)
    assert not isinstance(q, nn.Linear) and [type(m) for m in q.children()] == [DynamicLinear, DynamicLinear]
    with torch.inference_mode():  # activations at 8 bits with VNNI; 7 bits without (measured 1.7%), twice the error
        assert _error(q(x1, x2), fusion(x1, x2)) < (0.01 if full_range() else 0.02)

    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    with pytest.raises(TypeError, match=r"^1: Scaled subclasses nn.Linear without an int8 form"):
        quantize_linears(nn.Sequential(nn.Linear(4, 4), Scaled(4, 4)))
    attention = quantize_linears(nn.Sequential(nn.MultiheadAttention(16, 2)))[0]
    assert type(attention.out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear


def test_the_same_layers_as_pytorchs_flow_without_it(monkeypatch):
    """namc quantises the weights itself (torch.ao.quantization is deprecated, to be removed): the codes, scales and
    zero points of PyTorch's per-channel dynamic flow to the bit, rows of zeros and of one sign included, so the
    outputs are the same; building a copy warns of no deprecation; the copy keeps none of the replaced fp32 weights."""
    flow = pytest.importorskip("torch.ao.quantization")
    monkeypatch.setenv(KERNELS_ENV, "quantized")  # PyTorch's flow runs on the quantised kernels
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32, bias=False)).eval()
    with torch.no_grad():
        net[0].weight[3] = 0
        net[0].weight[5] = torch.rand(64)
        net[2].weight[7] = -torch.rand(128)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = quantize_linears(net)
    assert sum(p.numel() for p in q.parameters()) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = flow.quantize_dynamic(net, {nn.Linear: flow.per_channel_dynamic_qconfig})
    for mine, theirs in ((q[0], ref[0]), (q[2], ref[2])):
        a, b = mine.weight(), theirs.weight()
        assert torch.equal(a.int_repr(), b.int_repr())
        assert torch.equal(a.q_per_channel_scales(), b.q_per_channel_scales())
        assert torch.equal(a.q_per_channel_zero_points(), b.q_per_channel_zero_points())
        assert mine.has_bias == (theirs.bias() is not None)
    x = torch.randn(5, 64)
    with torch.inference_mode():
        theirs = [m._packed_params._packed_params for m in (ref[0], ref[2])]
        h = torch.ops.quantized.linear_dynamic(x, theirs[0], reduce_range=not full_range())
        y = torch.ops.quantized.linear_dynamic(net[1](h), theirs[1], reduce_range=not full_range())
        assert torch.equal(q(x), y)
        assert torch.equal(copy.deepcopy(q)(x), y)  # the packed weights survive a copy


@pytest.mark.skipif(not QUANTIZED, reason="this torch has no quantised int8 kernels to compare with")
def test_plain_kernels_give_the_quantised_kernels_outputs(monkeypatch):
    """Where PyTorch drops its quantised dtypes (pytorch/pytorch#184982), namc's int8 layers run on oneDNN's int8
    linear over plain int8 / uint8 tensors: the same weight codes and scales, the activations' scale and zero point
    that PyTorch's dynamic kernel chooses, so the same outputs up to float rounding (measured 6e-8 apart); a copy
    of such a layer works (oneDNN's packed weight cannot be copied, so copies share it); the environment chooses,
    and a value it does not know is an error."""
    g = torch.Generator().manual_seed(0)
    weight, bias = 0.02 * torch.randn(300, 96, generator=g), 0.01 * torch.randn(300, generator=g)
    weight[3] = 0  # a row of zeros: the smallest scale
    weight[5] = torch.rand(96, generator=g)  # a row of one sign
    codes, scales = weight_codes(weight)
    reference = quantize_weight(weight)
    assert torch.equal(codes, reference.int_repr()) and torch.equal(scales.double(), reference.q_per_channel_scales())
    x = torch.randn(2, 7, 96, generator=g)
    x[..., :3] *= 8  # a few large features
    levels = 256 if full_range() else 128
    q, scale, zero = quantize_activations(x, levels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.quantize_per_tensor_dynamic(x, torch.quint8, levels == 128)
    assert abs(scale - theirs.q_scale()) < 1e-6 * theirs.q_scale() and zero == theirs.q_zero_point()
    assert torch.equal(q, theirs.int_repr())  # the same scale to the bit (computed in double), so the same codes
    quantised, plain = DynamicLinear(weight, bias, "quantized"), DynamicLinear(weight, bias, "plain")
    with torch.inference_mode():
        expected = quantised(x)
        for inputs in (x, x[0], x.reshape(-1, 96)):
            torch.testing.assert_close(plain(inputs), quantised(inputs), rtol=0, atol=1e-5)
        torch.testing.assert_close(plain(torch.zeros(3, 96)), bias.expand(3, -1), rtol=0, atol=1e-6)
        assert plain(x.bfloat16()).dtype == torch.bfloat16
        assert torch.equal(copy.deepcopy(plain)(x), plain(x))
        # measured 3.1%: the large features widen the range (5.9% at 7 bits, without VNNI)
        limit = 0.05 if full_range() else 0.1
        assert _error(plain(x), x @ weight.T + bias) < limit
    assert _error(expected, x @ weight.T + bias) < limit
    monkeypatch.setenv(KERNELS_ENV, "plain")
    assert int8_kernels() == "plain" and int8_linear(weight, bias).kernels == "plain"
    net = quantize_linears(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)))
    assert [m.kernels for m in net.modules() if isinstance(m, DynamicLinear)] == ["plain", "plain"]
    monkeypatch.setenv(KERNELS_ENV, "int4")
    with pytest.raises(ValueError, match="NAMC_INT8_KERNELS='int4': expected 'quantized' or 'plain'"):
        int8_linear(weight, bias)
