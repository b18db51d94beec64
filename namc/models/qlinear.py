"""Dynamic int8 linear layers: int8 weights with one scale per output channel, activations quantised per call, on
PyTorch's x86 kernel (``quantized::linear_dynamic``). The int8 precision of :mod:`namc.models.precision` (MIR, FDG's
decoding step), the CLIP4IDC peer's int8 copy and the benchmark's int8 GEMM reference all use :func:`int8_linear` /
:func:`quantize_linears`.

**No ``torch.ao.quantization``.** PyTorch deprecated its eager quantization flow (``quantize_dynamic``, its observers
and modules) for torchao and announced its removal; namc calls the kernels themselves (``quantized::linear_prepack``,
``quantized::linear_dynamic``) and quantises the weights as that flow's per-channel symmetric observer does, so the
layers are the same to the bit (tests/test_qlinear.py compares them while the flow exists) and a torch without it
still imports and runs namc.

**8-bit activations where the CPU has VNNI.** PyTorch's dynamic linear module quantises its input to 7 bits
(``reduce_range=True``): without VNNI, x86 multiplies uint8 by int8 with ``vpmaddubsw``, whose int16 sum of two
products can saturate at full range. With VNNI (``vpdpbusd`` accumulates in int32) it cannot, and the 7-bit
rounding only doubles the activations' quantisation error: on namc_base's shapes (two AMD EPYC threads) 8-bit
activations halve the error against fp32 (vocabulary projection at batch 32: 9.4% -> 4.7% relative L2 on inputs with a
few large features) at the same speed (7.79 vs 7.74 ms), and inputs at the top of the range do not saturate
(tests/test_precision.py). :class:`DynamicLinear` takes the full range where :func:`full_range` says so.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

__all__ = ["DynamicLinear", "full_range", "int8_forms", "int8_linear", "quantize_linears", "quantize_weight"]


def full_range() -> bool:
    """Whether dynamic int8 layers quantise activations to 8 bits: on a CPU with VNNI (int32 accumulation). A torch
    build without the (private) check keeps PyTorch's 7 bits."""
    check = getattr(torch.cpu, "_is_vnni_supported", None)
    return bool(check()) if check is not None else False


def quantize_weight(weight: torch.Tensor) -> torch.Tensor:
    """A (out, in) weight as a qint8 tensor with one symmetric scale per output channel: ``max |w_row| / 127.5``
    (at least float32's eps), zero point 0; the scales of PyTorch's per-channel weight observer, to the bit."""
    w = weight.detach().float()
    peak = torch.maximum(-w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0))
    scale = torch.clamp(peak / 127.5, min=torch.finfo(torch.float32).eps)
    zero = torch.zeros(w.shape[0], dtype=torch.int64)
    with warnings.catch_warnings():  # the kernel takes a quantised tensor; nothing else sees it
        warnings.filterwarnings("ignore", message=".*quantize_per.*", category=UserWarning)
        return torch.quantize_per_channel(w, scale.double(), zero, 0, torch.qint8)


class DynamicLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` in int8 (:func:`quantize_weight`) packed once for the kernel, ``x`` quantised per
    call (8 bits where :func:`full_range`, else 7 as PyTorch's module); fp32 bias and output, cast to ``x``'s dtype.
    Built from fp32 weights at inference; not part of any state dict (namc saves the fp32 model)."""

    _full_range = None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        bias = None if bias is None else bias.detach().float().clone()
        self.packed = torch.ops.quantized.linear_prepack(quantize_weight(weight), bias)

    @classmethod
    def from_linear(cls, layer: nn.Linear) -> DynamicLinear:
        return cls(layer.weight, layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if DynamicLinear._full_range is None:
            DynamicLinear._full_range = full_range()
        y = torch.ops.quantized.linear_dynamic(x, self.packed, reduce_range=not DynamicLinear._full_range)
        return y.to(x.dtype)

    def weight(self) -> torch.Tensor:
        """The qint8 weight (``.dequantize()`` gives its fp32 values)."""
        return torch.ops.quantized.linear_unpack(self.packed)[0]

    def bias(self) -> torch.Tensor | None:
        return torch.ops.quantized.linear_unpack(self.packed)[1]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias() is not None}"

    def _get_name(self) -> str:
        return "DynamicInt8Linear"


def quantize_linears(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose ``nn.Linear`` layers are :class:`DynamicLinear` (per-channel weight scales); the
    original is untouched, and the copy never holds the replaced layers' fp32 weights."""
    with torch.no_grad():
        return copy.deepcopy(module, int8_forms(module))  # the forms stand in for the layers (a layer: its form)


def int8_forms(module: nn.Module) -> dict[int, nn.Module]:
    """The dynamic int8 form of each ``nn.Linear`` layer in ``module``, keyed by ``id(layer)``: a ``copy.deepcopy``
    memo that builds an int8 copy without copying the layers' fp32 weights first (:func:`quantize_linears`).

    An ``nn.Linear`` subclass with its own forward (MIR's concat fusion, ``forward(x1, x2)``) names its int8 form
    with a ``to_dynamic_int8()`` method, called here; any other subclass raises, rather than stay fp32 unnoticed in an
    int8 copy. The exception is PyTorch's ``NonDynamicallyQuantizableLinear`` (``nn.MultiheadAttention``'s output
    projection, whose weight the attention reads directly), which stays fp32, as in PyTorch's own flow.
    """
    forms: dict[int, nn.Module] = {}
    for name, child in module.named_modules():
        if not isinstance(child, nn.Linear) or isinstance(child, NonDynamicallyQuantizableLinear):
            continue
        if type(child) is nn.Linear:
            forms[id(child)] = DynamicLinear.from_linear(child)
        elif callable(getattr(child, "to_dynamic_int8", None)):
            forms[id(child)] = child.to_dynamic_int8()
        else:
            raise TypeError(f"{name}: {type(child).__name__} subclasses nn.Linear without a to_dynamic_int8() method")
    return forms


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> DynamicLinear:
    """A :class:`DynamicLinear` of a (out, in) ``weight`` and optional ``bias``."""
    return DynamicLinear(weight, bias)
