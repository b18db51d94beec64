"""PyTorch's private CPU kernels and the per-call thread count: the one module of namc that touches them.

The ``cpu`` backend keeps hand-written paths where no maintained runtime reaches them on a CPU (docs/performance.md,
"Backends: speed and quality" and "Thresholds"): the int8 copy's static int8 grid and dynamic int8 layers, and the
bf16 copy's fused convolutions and prepacked products. They call operators PyTorch keeps private
(``torch.ops.mkldnn``, ``torch.ops.onednn``, ``torch.ops.quantized``, ``torch.cpu._is_*``): the kernels inductor and
PyTorch's PT2E x86 flow emit, which any release may change. Each is called here and nowhere else in namc
(tests/test_architecture.py), behind a function named for what it computes, so a release that changes one changes
this file, and tests/test_kernels.py checks each against the public operator it stands for. Callers probe once
(:func:`namc.backends.onednn.conv_available`, :func:`~namc.backends.qlinear.int8_kernels`) and take the public path
where a kernel is missing.

**One thread for small products.** Under ``OMP_WAIT_POLICY=PASSIVE`` (what a machine shared with other processes
wants, and ``namc benchmark --omp-wait-policy passive``) an OpenMP thread sleeps as soon as a parallel region ends,
and the next region waits for it to be woken, which costs more than a decoding step's small products take on one
thread. Where threads spin between regions (OpenMP's default) two threads win at every size, so nothing changes
there; but spinning threads slow a shared machine several-fold, which is why namc benchmarks passive.
:func:`serial` says whether a product of ``flops`` runs faster on one thread: under a passive wait policy, below
:data:`~namc.thresholds.SERIAL_FLOPS` of its kind, which sit at or below the measured crossing points. The same
holds for kernels that pass once over a small input (:data:`~namc.thresholds.SERIAL_ELEMENTS`, by its number of
elements): LayerNorm, GELU and the greedy pick. :class:`one_thread` runs a block on one intra-op thread and gives
the caller's count back after. Results do not depend on it (the kernels split the output columns or heads between
threads). The thread count is process-wide: two Python threads captioning at once may each run a small product on
one thread or a large one on the other's count, which changes their speed, never their results. OpenMP reads
``OMP_WAIT_POLICY`` when torch loads; this module reads it on first use, so set it before the process starts, as
``namc benchmark`` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from namc.thresholds import SERIAL_ELEMENTS, SERIAL_FLOPS

T = TypeVar("T")

__all__ = [
    "SERIAL_ELEMENTS",
    "SERIAL_FLOPS",
    "amx_tiles",
    "conv",
    "conv_add",
    "dynamic_int8_linear",
    "idle_threads_sleep",
    "int8_conv",
    "int8_linear",
    "linear",
    "onednn_bf16",
    "one_thread",
    "pack_dynamic_int8",
    "pack_int8_conv",
    "pack_int8_linear",
    "quantized_ops",
    "reorder_conv_weight",
    "reorder_linear_weight",
    "run",
    "serial",
    "unpack_dynamic_int8",
    "vnni",
]

Geometry = tuple[Sequence[int], Sequence[int], Sequence[int], int]  # padding, stride, dilation, groups


# ------------------------------------------------------------------------------ what the CPU has


def onednn_bf16() -> bool:
    """oneDNN's own check that it runs bf16 on this CPU (AVX-512 BW/VL/DQ or AVX-NE-CONVERT); False where this torch
    build lacks the check."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def amx_tiles() -> bool:
    """Whether this CPU has AMX tiles (Intel Xeon since Sapphire Rapids); False where this torch lacks the check."""
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return check is not None and bool(check())


def vnni() -> bool:
    """Whether this CPU has VNNI (int8 products accumulated in int32); False where this torch lacks the check."""
    check = getattr(torch.cpu, "_is_vnni_supported", None)
    return check is not None and bool(check())


# ------------------------------------------------------------------------------ oneDNN float kernels


def reorder_conv_weight(weight: torch.Tensor, geometry: Geometry, shape: Sequence[int]) -> torch.Tensor:
    """A convolution's weight laid out in oneDNN's blocked format for inputs of ``shape`` (an opaque tensor)."""
    padding, stride, dilation, groups = geometry
    return torch.ops.mkldnn._reorder_convolution_weight(weight, padding, stride, dilation, groups, list(shape))


def conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry: Geometry, relu: bool):
    """``F.conv2d`` (then ReLU where ``relu``) as one oneDNN call, ``weight`` from :func:`reorder_conv_weight`."""
    padding, stride, dilation, groups = geometry
    attr = "relu" if relu else "none"
    return torch.ops.mkldnn._convolution_pointwise(x, weight, bias, padding, stride, dilation, groups, attr, [], "")


def conv_add(
    x: torch.Tensor,
    other: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    geometry: Geometry,
    relu: bool,
) -> torch.Tensor:
    """``F.conv2d(x) + other`` (then ReLU where ``relu``) as one oneDNN call."""
    padding, stride, dilation, groups = geometry
    unary = "relu" if relu else None
    return torch.ops.mkldnn._convolution_pointwise.binary(
        x, other, weight, bias, padding, stride, dilation, groups, "add", None, unary, [], ""
    )


def reorder_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """A (out, in) matrix laid out in oneDNN's blocked format for :func:`linear` (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` of (rows, in) ``x`` on oneDNN's kernel (``weight`` plain or from :func:`reorder_linear_weight`,
    ``x`` in its dtype)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


# ------------------------------------------------------------------------------ oneDNN int8 kernels


def pack_int8_conv(
    codes: torch.Tensor,
    scales: torch.Tensor,
    in_scale: float,
    in_zero: int,
    geometry: Geometry,
    shape: Sequence[int],
) -> torch.Tensor:
    """An int8 convolution weight (codes, one scale per output channel) packed for :func:`int8_conv` on uint8 inputs
    of ``shape``, ``in_scale`` and ``in_zero``."""
    padding, stride, dilation, groups = geometry
    return torch.ops.onednn.qconv_prepack(codes, scales, in_scale, in_zero, stride, padding, dilation, groups, shape)


def int8_conv(
    qx: torch.Tensor,
    x_scale: float,
    x_zero: int,
    packed: torch.Tensor,
    w_scales: torch.Tensor,
    w_zero: torch.Tensor,
    bias: torch.Tensor | None,
    geometry: Geometry,
    out: tuple[float, int, torch.dtype | None],
    relu: bool = False,
    clamp: tuple[float, float] | None = None,
    shortcut: tuple[torch.Tensor, float, int] | None = None,
) -> torch.Tensor:
    """A uint8 convolution as one call: ``qx`` (codes of ``x_scale``, ``x_zero``) with ``packed``
    (:func:`pack_int8_conv`, its per-channel ``w_scales`` and int64 ``w_zero`` zero points), plus ``shortcut =
    (accum, scale, zero_point)`` where given (uint8 codes, or floats where the output is float; oneDNN sums into
    ``accum``'s buffer), then ReLU where ``relu`` or a clamp to ``clamp`` (float bounds; not with a shortcut); into
    ``out = (scale, zero_point, None)`` uint8 codes or ``(1.0, 0, torch.float32)`` floats."""
    padding, stride, dilation, groups = geometry
    w = (packed, w_scales, w_zero)
    g = (stride, padding, dilation, groups)
    if shortcut is not None:
        if clamp is not None:
            raise ValueError("oneDNN's int8 convolution with a shortcut takes no clamp")
        accum, accum_scale, accum_zero = shortcut
        post = (accum_scale, accum_zero, "sum", 1.0, "relu" if relu else None)
        return torch.ops.onednn.qconv2d_pointwise.binary(qx, x_scale, x_zero, *w, accum, bias, *g, *out, *post, [], "")
    if clamp is not None:
        return torch.ops.onednn.qconv2d_pointwise(qx, x_scale, x_zero, *w, bias, *g, *out, "hardtanh", list(clamp), "")
    return torch.ops.onednn.qconv2d_pointwise(
        qx, x_scale, x_zero, *w, bias, *g, *out, "relu" if relu else "none", [], ""
    )


def pack_int8_linear(codes: torch.Tensor) -> torch.Tensor:
    """An int8 (out, in) weight's codes packed for :func:`int8_linear`."""
    return torch.ops.onednn.qlinear_prepack(codes, None)


def int8_linear(
    codes: torch.Tensor,
    scale: float,
    zero: int,
    packed: torch.Tensor,
    w_scales: torch.Tensor,
    w_zero: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """fp32 ``x W^T + b`` of uint8 (rows, in) activation ``codes`` (``scale``, ``zero``) and a packed int8 weight
    (:func:`pack_int8_linear`, per-channel ``w_scales``, int64 ``w_zero`` zero points)."""
    return torch.ops.onednn.qlinear_pointwise(
        codes, scale, zero, packed, w_scales, w_zero, bias, 1.0, 0, torch.float32, "none", [], ""
    )


# ------------------------------------------------------------------------------ PyTorch's quantised int8 kernels


def quantized_ops() -> bool:
    """Whether this torch has the dynamic int8 linear kernel on quantised dtypes (deprecated upstream)."""
    names = ("linear_prepack", "linear_dynamic", "linear_unpack")
    return all(hasattr(torch.ops.quantized, name) for name in names) and hasattr(torch, "quantize_per_channel")


def pack_dynamic_int8(qweight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    """A qint8 (out, in) weight and an fp32 bias packed for :func:`dynamic_int8_linear`."""
    return torch.ops.quantized.linear_prepack(qweight, bias)


def dynamic_int8_linear(x: torch.Tensor, packed: Any, reduce_range: bool) -> torch.Tensor:
    """fp32 ``x W^T + b``, ``x`` quantised to uint8 in the call (7 bits where ``reduce_range``)."""
    return torch.ops.quantized.linear_dynamic(x, packed, reduce_range=reduce_range)


def unpack_dynamic_int8(packed: Any) -> torch.Tensor:
    """The qint8 weight of :func:`pack_dynamic_int8`."""
    return torch.ops.quantized.linear_unpack(packed)[0]


# ------------------------------------------------------------------------------ one thread for small products

_SLEEP: list[bool] = []  # filled on first use: the environment does not change OpenMP's policy after torch loads


def idle_threads_sleep() -> bool:
    """Whether OpenMP's idle threads sleep at the end of each parallel region (``OMP_WAIT_POLICY=passive``)."""
    if not _SLEEP:
        _SLEEP.append(os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive")
    return _SLEEP[0]


def serial(flops: float, kind: str) -> bool:
    """Whether a CPU product of ``flops`` of ``kind`` (a key of ``SERIAL_FLOPS``; for a key of ``SERIAL_ELEMENTS``,
    ``flops`` is the input's number of elements) should run on one thread: only where idle threads sleep, more than
    one thread is set, and no graph is being compiled."""
    return (
        not torch.compiler.is_compiling()  # first: a graph being traced never reaches the thread count
        and flops < (SERIAL_FLOPS[kind] if kind in SERIAL_FLOPS else SERIAL_ELEMENTS[kind])
        and idle_threads_sleep()
        and torch.get_num_threads() > 1
    )


def run(kind: str, flops: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, on one thread where :func:`serial` says so for a product of ``flops`` of ``kind``."""
    if serial(flops, kind):
        with one_thread():
            return fn(*args, **kwargs)
    return fn(*args, **kwargs)


class one_thread:  # noqa: N801 - used as a context manager, like torch.no_grad
    """``with one_thread(): ...`` runs the block on one intra-op thread, then restores the caller's count."""

    __slots__ = ("_threads",)

    def __enter__(self) -> None:
        self._threads = torch.get_num_threads()
        if self._threads > 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        if self._threads > 1:
            torch.set_num_threads(self._threads)
