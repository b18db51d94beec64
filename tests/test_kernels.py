"""namc.kernels: each private PyTorch kernel namc calls gives what the public operator it stands for gives.

A PyTorch release that changes one of them fails here, by name, before any model test does. The int8 checks use
codes of at most 7 bits, which every x86 int8 kernel multiplies exactly (a CPU without VNNI saturates above)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from namc import kernels
from namc.backends.onednn import conv_available, linear_available
from namc.backends.qlinear import quantize_weight

GEOMETRY = ([1, 1], [2, 2], [1, 1], 1)  # padding, stride, dilation, groups


def _conv_inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 9, 9, generator=g).to(dtype).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(16, 8, 3, 3, generator=g).to(dtype), torch.randn(16, generator=g).to(dtype)
    return x, w, b


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    padding, stride, dilation, groups = GEOMETRY
    return F.conv2d(x, w, b, stride, padding, dilation, groups)


@pytest.mark.skipif(not conv_available(), reason="this torch build has no oneDNN convolution kernels")
def test_fused_convolutions_are_conv2d() -> None:
    x, w, b = _conv_inputs()
    ref = _reference(x, w, b)
    other = torch.randn_like(ref).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        packed = kernels.reorder_conv_weight(w, GEOMETRY, x.shape)
        for weight in (w, packed):
            torch.testing.assert_close(kernels.conv(x, weight, b, GEOMETRY, relu=False), ref, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(kernels.conv(x, weight, b, GEOMETRY, relu=True), F.relu(ref), atol=1e-4, rtol=0)
            added = kernels.conv_add(x, other, weight, b, GEOMETRY, relu=True)
            torch.testing.assert_close(added, F.relu(ref + other), atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not linear_available(), reason="this torch build has no oneDNN linear kernel")
def test_onednn_linear_is_f_linear() -> None:
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(5, 24, generator=g), torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    with torch.inference_mode():
        for weight in (w, kernels.reorder_linear_weight(w)):
            torch.testing.assert_close(kernels.linear(x, weight, b), F.linear(x, w, b), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(kernels.linear(x, weight), F.linear(x, w), atol=1e-5, rtol=1e-5)


def _codes(shape: tuple[int, ...], low: int, high: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _int8_conv_case() -> dict:
    qx = _codes((2, 8, 9, 9), 0, 128, torch.uint8, 2).contiguous(memory_format=torch.channels_last)
    codes = _codes((16, 8, 3, 3), -64, 64, torch.int8, 3)
    w_scales = torch.rand(16, generator=torch.Generator().manual_seed(4)) / 50 + 1e-3
    bias = torch.randn(16, generator=torch.Generator().manual_seed(5))
    x_scale, x_zero = 0.05, 3
    x = (qx.float() - x_zero) * x_scale
    ref = _reference(x, codes.float() * w_scales[:, None, None, None], bias)
    packed = kernels.pack_int8_conv(codes, w_scales, x_scale, x_zero, GEOMETRY, list(qx.shape))
    w_zero = torch.zeros(16, dtype=torch.int64)
    return {"qx": qx, "x": (qx, x_scale, x_zero), "w": (packed, w_scales, w_zero, bias, GEOMETRY), "ref": ref}


@pytest.mark.skipif(not conv_available(), reason="this torch build has no oneDNN convolution kernels")
def test_int8_convolutions_are_conv2d_of_the_codes() -> None:
    case = _int8_conv_case()
    ref, fp32 = case["ref"], (1.0, 0, torch.float32)
    with torch.inference_mode():
        y = kernels.int8_conv(*case["x"], *case["w"], fp32)
        torch.testing.assert_close(y, ref, atol=1e-3, rtol=1e-4)
        torch.testing.assert_close(kernels.int8_conv(*case["x"], *case["w"], fp32, relu=True), F.relu(ref))
        clamped = kernels.int8_conv(*case["x"], *case["w"], fp32, clamp=(0.0, 1.0))
        torch.testing.assert_close(clamped, ref.clamp(0.0, 1.0), atol=1e-3, rtol=1e-4)
        scale = float(ref.abs().max()) / 100
        codes = kernels.int8_conv(*case["x"], *case["w"], (scale, 128, None))
        assert codes.dtype == torch.uint8
        torch.testing.assert_close((codes.float() - 128) * scale, ref, atol=scale, rtol=0)  # within one code
        accum = torch.randn_like(ref).contiguous(memory_format=torch.channels_last)
        expected = F.relu(ref + accum)  # before the call: oneDNN's sum writes into the shortcut's buffer
        added = kernels.int8_conv(*case["x"], *case["w"], fp32, relu=True, shortcut=(accum, 1.0, 0))
        torch.testing.assert_close(added, expected, atol=1e-3, rtol=1e-4)
        with pytest.raises(ValueError, match="no clamp"):
            kernels.int8_conv(*case["x"], *case["w"], fp32, clamp=(0.0, 1.0), shortcut=(accum, 1.0, 0))


def test_int8_linear_is_the_product_of_the_codes() -> None:
    codes = _codes((3, 32), 0, 128, torch.uint8, 6)
    weight = _codes((20, 32), -64, 64, torch.int8, 7)
    w_scales, bias = torch.full((20,), 0.02), torch.randn(20, generator=torch.Generator().manual_seed(8))
    scale, zero = 0.1, 5
    ref = F.linear((codes.float() - zero) * scale, weight.float() * w_scales[:, None], bias)
    packed = kernels.pack_int8_linear(weight)
    with torch.inference_mode():
        y = kernels.int8_linear(codes, scale, zero, packed, w_scales, torch.zeros(20, dtype=torch.int64), bias)
    torch.testing.assert_close(y, ref, atol=1e-4, rtol=1e-5)


@pytest.mark.skipif(not kernels.quantized_ops(), reason="this torch has no quantised int8 kernels")
def test_dynamic_int8_linear_is_within_a_code_of_f_linear() -> None:
    g = torch.Generator().manual_seed(9)
    x, w, b = torch.randn(4, 32, generator=g), torch.randn(12, 32, generator=g), torch.randn(12, generator=g)
    qweight = quantize_weight(w)
    packed = kernels.pack_dynamic_int8(qweight, b)
    assert torch.equal(kernels.unpack_dynamic_int8(packed).int_repr(), qweight.int_repr())
    with torch.inference_mode():
        y = kernels.dynamic_int8_linear(x, packed, reduce_range=True)
    ref = F.linear(x, qweight.dequantize(), b)
    assert (y - ref).abs().max() < 0.05 * ref.abs().max()  # activations at 7 bits: about 1% here


def test_cpu_checks_answer_a_bool() -> None:
    assert {type(kernels.onednn_bf16()), type(kernels.amx_tiles()), type(kernels.vnni())} == {bool}
    if kernels.amx_tiles():
        assert kernels.vnni()  # every AMX CPU has VNNI
