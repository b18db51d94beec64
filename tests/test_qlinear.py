"""Dynamic int8 linear layers (namc.models.qlinear): 8-bit activations where the CPU has VNNI, no saturation at the
top of the range, every ``nn.Linear`` of a module replaced, the same layers as PyTorch's deprecated flow without it."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from namc.models.fusion import ConcatFusion
from namc.models.qlinear import DynamicLinear, full_range, int8_linear, quantize_linears


def _error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y - ref).norm() / ref.norm()).item()


@pytest.mark.skipif(not full_range(), reason="this CPU has no VNNI: activations stay at 7 bits")
def test_activations_use_8_bits_with_vnni():
    g = torch.Generator().manual_seed(0)
    weight, bias = 0.02 * torch.randn(256, 768, generator=g), 0.01 * torch.randn(256, generator=g)
    x = torch.randn(32, 768, generator=g)
    x[:, :4] *= 8  # a few large features widen the range, as after LayerNorm in trained models
    layer = int8_linear(weight, bias)
    ref = x @ weight.T + bias
    with torch.inference_mode():
        y = layer(x)
        packed = layer.packed
        assert torch.equal(y, torch.ops.quantized.linear_dynamic(x, packed, reduce_range=False))
        seven_bit = torch.ops.quantized.linear_dynamic(x, packed, reduce_range=True)  # PyTorch's module
    assert _error(y, ref) < 0.6 * _error(seven_bit, ref)  # measured 0.50x: one more bit halves the error


@pytest.mark.parametrize("width", [768, 3072])
def test_no_saturation_at_the_top_of_the_range(width):
    """Rows of maximal weight codes times inputs at the top of the uint8 range: a kernel that summed two products in
    int16 (x86 without VNNI) would saturate here; the layer must not (measured 0.5% error, rounding alone)."""
    weight = torch.full((64, width), 0.02)
    weight[1::2] *= -1
    x = torch.full((4, width), 3.0)
    x[:, ::7] = -0.5
    with torch.inference_mode():
        assert _error(int8_linear(weight, None)(x), x @ weight.T) < 0.01


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
    with torch.inference_mode():
        assert _error(q(x1, x2), fusion(x1, x2)) < 0.01

    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    with pytest.raises(TypeError, match=r"^1: Scaled subclasses nn.Linear without a to_dynamic_int8\(\)"):
        quantize_linears(nn.Sequential(nn.Linear(4, 4), Scaled(4, 4)))
    attention = quantize_linears(nn.Sequential(nn.MultiheadAttention(16, 2)))[0]
    assert type(attention.out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear


def test_the_same_layers_as_pytorchs_flow_without_it():
    """namc quantises the weights itself (torch.ao.quantization is deprecated, to be removed): the codes, scales and
    zero points of PyTorch's per-channel dynamic flow to the bit, rows of zeros and of one sign included, so the
    outputs are the same; building a copy warns of no deprecation; the copy keeps none of the replaced fp32 weights."""
    flow = pytest.importorskip("torch.ao.quantization")
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
        assert (mine.bias() is None) == (theirs.bias() is None)
    x = torch.randn(5, 64)
    with torch.inference_mode():
        theirs = [m._packed_params._packed_params for m in (ref[0], ref[2])]
        h = torch.ops.quantized.linear_dynamic(x, theirs[0], reduce_range=not full_range())
        y = torch.ops.quantized.linear_dynamic(net[1](h), theirs[1], reduce_range=not full_range())
        assert torch.equal(q(x), y)
        assert torch.equal(copy.deepcopy(q)(x), y)  # the packed weights survive a copy
