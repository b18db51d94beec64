"""Dynamic int8 linear layers: int8 weights with one scale per output channel, activations quantised per call, on
PyTorch's x86 kernel (``quantized::linear_dynamic``, or oneDNN's int8 linear where PyTorch has no quantised dtypes).
The int8 precision of :mod:`namc.backends.precision` (MIR, FDG's decoding step), the CLIP4IDC peer's int8 copy and the
benchmark's int8 GEMM reference all use :func:`int8_linear` / :func:`quantize_linears`.

**No ``torch.ao.quantization``.** PyTorch deprecated its eager quantization flow (``quantize_dynamic``, its observers
and modules) for torchao and announced its removal; namc calls the kernels themselves (``quantized::linear_prepack``,
``quantized::linear_dynamic``) and quantises the weights as that flow's per-channel symmetric observer does, so the
layers are the same to the bit (tests/test_qlinear.py compares them while the flow exists) and a torch without it
still imports and runs namc.

**No quantised dtypes where PyTorch has none.** PyTorch deprecates ``torch.qint8`` / ``torch.quint8`` too
(pytorch/pytorch#184982), which ``quantized::linear_dynamic`` takes. Where a torch lacks them, every layer runs on
plain int8 / uint8 tensors and oneDNN's int8 linear instead, with the same weight and activation codes
(:func:`int8_kernels`; slower in eager PyTorch, which quantises each activation in several passes).

**8-bit activations where the CPU has VNNI.** PyTorch's dynamic linear module quantises its input to 7 bits
(``reduce_range=True``): without VNNI, x86 multiplies uint8 by int8 with ``vpmaddubsw``, whose int16 sum of two
products can saturate at full range. With VNNI (``vpdpbusd`` accumulates in int32) it cannot, and the 7-bit
rounding only doubles the activations' quantisation error: on namc_base's shapes 8-bit activations halve the error
against fp32 at the same speed, and inputs at the top of the range do not saturate (tests/test_precision.py).
:class:`DynamicLinear` takes the full range where :func:`full_range` says so.

**Small matrices stay fp32.** An int8 copy (:func:`int8_forms`, :meth:`~namc.backends.step.FusedFDG.pack_step`)
keeps a matrix of fewer than :data:`~namc.thresholds.INT8_MIN_WEIGHT` entries in fp32: int8 gains nothing there.
The matrices this leaves in fp32 are those of narrow models: at the demo's width of 32 (and its small word vocabulary)
every matrix of MIR and FDG, so int8 there is the grid's static int8 and fp32 after it; none of namc_base's, whose
smallest has 589,824 entries.
"""

from __future__ import annotations

import copy
import os
import struct
import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from namc import kernels as cpu_kernels
from namc.models.fusion import ConcatFusion, DifferenceFusion
from namc.thresholds import INT8_MIN_WEIGHT  # read at each call: patchable here

__all__ = [
    "INT8_MIN_WEIGHT",
    "DynamicLinear",
    "affine_codes",
    "full_range",
    "int8_forms",
    "int8_kernels",
    "int8_linear",
    "int8_worthwhile",
    "quantize_activations",
    "quantize_linears",
    "quantize_weight",
    "weight_codes",
    "weight_scales",
]


KERNELS_ENV = "NAMC_INT8_KERNELS"
_QUANTIZED_OPS: bool | None = None


def int8_kernels() -> str:
    """Which kernels namc's int8 layers run on: ``"quantized"``, PyTorch's dynamic int8 linear on its quantised
    dtypes (``quantized::linear_dynamic``), where this torch has it; else ``"plain"``, plain int8 / uint8 tensors
    into oneDNN's int8 linear (``onednn::qlinear_pointwise``, the kernel of PyTorch's PT2E x86 flow and torchao).

    PyTorch deprecates the quantised dtypes (pytorch/pytorch#184982, torch >= 2.13 warns) and will remove them; on
    a torch without them namc's int8 keeps running on the plain kernels. These cost more in eager PyTorch, which
    quantises each activation in five passes after finding its range, where the quantised kernel makes one pass (up
    to 1.8x the time of a layer), with the same codes and so the same error against fp32. ``NAMC_INT8_KERNELS=plain``
    (or ``quantized``) chooses; a model's int8 copy (:func:`~namc.backends.precision.inference_copy`) follows it.
    """
    global _QUANTIZED_OPS
    choice = os.environ.get(KERNELS_ENV, "").strip().lower()
    if choice not in ("", "quantized", "plain"):
        raise ValueError(f"{KERNELS_ENV}={choice!r}: expected 'quantized' or 'plain'")
    if _QUANTIZED_OPS is None:
        _QUANTIZED_OPS = cpu_kernels.quantized_ops()
    if choice == "quantized" and not _QUANTIZED_OPS:
        raise RuntimeError(f"{KERNELS_ENV}=quantized: this torch ({torch.__version__}) has no quantised int8 kernels")
    return choice or ("quantized" if _QUANTIZED_OPS else "plain")


def full_range() -> bool:
    """Whether dynamic int8 layers quantise activations to 8 bits: on a CPU with VNNI (int32 accumulation). A torch
    build without the (private) check keeps PyTorch's 7 bits."""
    return cpu_kernels.vnni()


def weight_scales(weight: torch.Tensor) -> torch.Tensor:
    """One symmetric scale per output channel of a (out, in) weight: ``max |w_row| / 127.5``, at least float32's
    eps; the scales of PyTorch's per-channel weight observer, to the bit."""
    w = weight.detach().float()
    peak = torch.maximum(-w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0))
    return torch.clamp(peak / 127.5, min=torch.finfo(torch.float32).eps)


def weight_codes(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (out, in) weight as plain int8 codes and their float32 per-channel scales (:func:`weight_scales`); the
    codes :func:`quantize_weight` gives, to the bit (rounded to nearest even after multiplying by ``1 / scale``)."""
    scale = weight_scales(weight)
    codes = torch.round(weight.detach().float() * (1 / scale)[:, None]).clamp_(-128, 127).to(torch.int8)
    return codes, scale


def quantize_weight(weight: torch.Tensor) -> torch.Tensor:
    """A (out, in) weight as a qint8 tensor with one symmetric scale per output channel (:func:`weight_scales`),
    zero point 0, for PyTorch's quantised kernel."""
    scale = weight_scales(weight)
    zero = torch.zeros(weight.shape[0], dtype=torch.int64)
    with warnings.catch_warnings():  # the kernel takes a quantised tensor; nothing else sees it
        warnings.filterwarnings("ignore", message=".*quantize_per.*", category=UserWarning)
        return torch.quantize_per_channel(weight.detach().float(), scale.double(), zero, 0, torch.qint8)


def quantize_activations(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, float, int]:
    """``x`` as uint8 codes with one scale and zero point over the whole tensor, as PyTorch's dynamic kernel
    chooses them (the range of ``x`` widened to hold 0, ``levels - 1`` steps, the scale computed in double and
    rounded to float, the zero point rounded), in plain operations: ``(codes, scale, zero_point)``. The scale and
    zero point are worked out on the host from the range (two numbers): on a CPU reading them back costs nothing,
    and a layer of one row makes six tensor operations instead of twenty."""
    lo, hi = (float(v) for v in torch.aminmax(x.detach()))  # no gradient passes an int8 layer
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = _to_float32((hi - lo) / (levels - 1)) or 1.0  # an all-zero input: any scale, codes at zero
    zero = min(max(round(-lo / scale), 0), levels - 1)
    return affine_codes(x, scale, zero, levels), scale, zero


def affine_codes(x: torch.Tensor, scale: float, zero_point: int, levels: int = 256) -> torch.Tensor:
    """``x`` as uint8 codes of ``scale`` and ``zero_point`` in plain operations, layout kept: multiplied by the float32
    ``1 / scale``, rounded half to even, shifted, saturated at 0 and ``levels - 1``; PyTorch's quantisation, to the
    bit (:func:`quantize_activations` and the plain form of :func:`namc.backends.qconv.quantize_u8`)."""
    return (x.float() * _to_float32(1 / scale)).round_().add_(zero_point).clamp_(0, levels - 1).to(torch.uint8)


def _to_float32(value: float) -> float:
    """``value`` rounded to the nearest float32, as a Python float."""
    return struct.unpack("f", struct.pack("f", value))[0]


class _Packed:
    """oneDNN's packed int8 weight: an opaque tensor that PyTorch cannot copy, and never changes, so copies of a
    layer share it."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __deepcopy__(self, memo: dict) -> _Packed:
        return self


class DynamicLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` in int8 (per-channel symmetric scales) packed once for the kernel, ``x``
    quantised per call (8 bits where :func:`full_range`, else 7 as PyTorch's module); fp32 bias and output, cast to
    ``x``'s dtype. On the kernels :func:`int8_kernels` names. Built from fp32 weights at inference; not part of any
    state dict (namc saves the fp32 model)."""

    _full_range = None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, kernels: str | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.kernels = kernels or int8_kernels()
        bias = None if bias is None else bias.detach().float().clone()
        self.has_bias = bias is not None
        if self.kernels == "quantized":
            self.packed = cpu_kernels.pack_dynamic_int8(quantize_weight(weight), bias)
        else:
            codes, self.w_scales = weight_codes(weight)
            self.onednn_weight = _Packed(cpu_kernels.pack_int8_linear(codes))
            self.w_zero = torch.zeros(self.out_features, dtype=torch.int64)
            self.plain_bias = bias

    @classmethod
    def from_linear(cls, layer: nn.Linear) -> DynamicLinear:
        return cls(layer.weight, layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_kernels.run("int8", 2.0 * x.numel() * self.out_features, self._forward, x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if DynamicLinear._full_range is None:
            DynamicLinear._full_range = full_range()
        if self.kernels == "quantized":
            y = cpu_kernels.dynamic_int8_linear(x, self.packed, reduce_range=not DynamicLinear._full_range)
            return y.to(x.dtype)
        rows = x.reshape(-1, self.in_features).float()
        codes, scale, zero = quantize_activations(rows, 256 if DynamicLinear._full_range else 128)
        weight = self.onednn_weight.tensor
        y = cpu_kernels.int8_linear(codes, scale, zero, weight, self.w_scales, self.w_zero, self.plain_bias)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def weight(self) -> torch.Tensor:
        """The qint8 weight (``.dequantize()`` gives its fp32 values); the quantised kernels only."""
        if self.kernels != "quantized":
            raise RuntimeError("the plain kernels keep their weight packed for oneDNN only")
        return cpu_kernels.unpack_dynamic_int8(self.packed)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}, {self.kernels}"

    def _get_name(self) -> str:
        return "DynamicInt8Linear"


def int8_worthwhile(weight: torch.Tensor) -> bool:
    """Whether an int8 copy runs ``weight`` in int8: from :data:`INT8_MIN_WEIGHT` entries (read at each call)."""
    return weight.numel() >= INT8_MIN_WEIGHT


def quantize_linears(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose ``nn.Linear`` layers are :class:`DynamicLinear` (per-channel weight scales), those
    under :data:`INT8_MIN_WEIGHT` entries excepted; the original is untouched, and the copy never holds the replaced
    layers' fp32 weights."""
    with torch.no_grad():
        return copy.deepcopy(module, int8_forms(module))  # the forms stand in for the layers (a layer: its form)


def int8_forms(module: nn.Module) -> dict[int, nn.Module]:
    """The dynamic int8 form of each ``nn.Linear`` layer in ``module`` with at least :data:`INT8_MIN_WEIGHT` weight
    entries, keyed by ``id(layer)``: a ``copy.deepcopy`` memo that builds an int8 copy without copying the layers'
    fp32 weights first (:func:`quantize_linears`). Smaller layers are left out, and so copied as they are.

    An ``nn.Linear`` subclass with its own forward (MIR's concat fusion, ``forward(x1, x2)``) has its int8 form in
    :data:`INT8_FORMS`; any other subclass raises, rather than stay fp32 unnoticed in an
    int8 copy. The exception is PyTorch's ``NonDynamicallyQuantizableLinear`` (``nn.MultiheadAttention``'s output
    projection, whose weight the attention reads directly), which stays fp32, as in PyTorch's own flow.
    """
    forms: dict[int, nn.Module] = {}
    for name, child in module.named_modules():
        if not isinstance(child, nn.Linear) or isinstance(child, NonDynamicallyQuantizableLinear):
            continue
        if not int8_worthwhile(child.weight):
            continue
        if type(child) is nn.Linear:
            forms[id(child)] = DynamicLinear.from_linear(child)
        elif type(child) in INT8_FORMS:
            forms[id(child)] = INT8_FORMS[type(child)](child)
        else:
            raise TypeError(
                f"{name}: {type(child).__name__} subclasses nn.Linear without an int8 form "
                "(add one to namc.backends.qlinear.INT8_FORMS)"
            )
    return forms


class Int8ConcatFusion(nn.Module):
    """:class:`ConcatFusion` in dynamic int8 as the sum of its two halves, ``W1 x1 + W2 x2 + b``: no (B, N, 2D)
    concatenation, and each stream's activations get their own int8 scale."""

    def __init__(self, fc: nn.Linear) -> None:
        super().__init__()
        w1, w2 = fc.weight.detach().chunk(2, dim=1)  # (D, D) each: the columns that read x1, then x2
        self.first, self.second = int8_linear(w1, fc.bias), int8_linear(w2, None)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return self.first(x1) + self.second(x2)


class Int8DifferenceFusion(nn.Module):
    """:class:`~namc.models.fusion.DifferenceFusion` in dynamic int8: ``FC(x1 - x2)``."""

    def __init__(self, fc: nn.Linear) -> None:
        super().__init__()
        self.fc = int8_linear(fc.weight.detach(), fc.bias)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return self.fc(x1 - x2)


#: the int8 form of each nn.Linear subclass with a forward of its own (MIR's fusions take ``(x1, x2)``)
INT8_FORMS: dict[type, Callable[[nn.Linear], nn.Module]] = {
    ConcatFusion: Int8ConcatFusion,
    DifferenceFusion: Int8DifferenceFusion,
}


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> DynamicLinear:
    """A :class:`DynamicLinear` of a (out, in) ``weight`` and optional ``bias``."""
    return DynamicLinear(weight, bias)
