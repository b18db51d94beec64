"""oneDNN's kernels where PyTorch's default path leaves speed behind on a CPU: fused convolutions for the frozen
ResNet grid of an inference copy (:mod:`namc.backends.precision`), and the skinny matrix products of FDG's decoding
step (:func:`dense`, with matrices prepacked by :func:`pack_linear`). These are private ``torch.ops.mkldnn`` ops, the
ones inductor emits, called through :mod:`namc.kernels`: each is probed once against the public op
(:func:`conv_available`, :func:`linear_available`) and the public path is taken where the probe fails.

**Convolutions.**

Once BatchNorm is folded (:meth:`~namc.backends.grid.fold_batchnorm`), a ResNet block is conv -> ReLU ->
conv -> ReLU -> conv -> + shortcut -> ReLU. Run module by module, every ReLU and every residual addition is a pass of
its own over the activations, together about as long as the convolutions themselves (docs/performance.md).
:func:`fuse_resnet` replaces the stem and every block with modules that call oneDNN's fused kernels
(:func:`namc.kernels.conv`, the kernels inductor's freezing pass emits): convolution + ReLU, and
convolution + shortcut addition + ReLU, with weights laid out once per input shape in oneDNN's blocked format (see
:class:`FusedConv`). The output is the same up to rounding.

The fused modules compute in their weights' dtype (bf16 or fp32) and cast their input to it. They hold opaque
oneDNN tensors, so a fused encoder is for inference only: it cannot be saved, trained, moved or copied.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from namc import kernels
from namc.thresholds import BF16_MIN_WEIGHT

__all__ = [
    "FusedBlock",
    "FusedConv",
    "OneDNNLinear",
    "ShapeCache",
    "amx_bf16",
    "bf16_supported",
    "bf16_worthwhile",
    "conv_available",
    "dense",
    "fuse_resnet",
    "is_packed",
    "linear",
    "linear_available",
    "pack_linear",
]

_CONV_OK: bool | None = None
LAYOUTS = 4  # input shapes whose weight layouts a FusedConv keeps


def _fp32() -> torch.autocast:
    """The probes compare in float32 even when first asked under ``torch.autocast`` (where the public reference
    op would run in bf16, miss the fp32 kernel's result and disable the fused path for the whole process)."""
    return torch.autocast("cpu", enabled=False)


def conv_available() -> bool:
    """Whether this torch build has oneDNN's fused convolution kernels and they give ``F.conv2d``'s results.

    Checked once on tiny tensors (convolution + ReLU, and convolution + addition + ReLU); without them
    :func:`fuse_resnet` leaves the encoder as it is.
    """
    global _CONV_OK
    if _CONV_OK is None:
        try:
            g = torch.Generator().manual_seed(0)
            x, other = (
                torch.randn(2, 4, 5, 5, generator=g).contiguous(memory_format=torch.channels_last) for _ in "xo"
            )
            conv = nn.Conv2d(4, 4, 3, padding=1).eval()
            with torch.inference_mode(), _fp32():
                ref = F.relu(conv(x) + other)
                fused = FusedConv(conv, relu=True)
                _CONV_OK = bool(
                    torch.backends.mkldnn.is_available()
                    and torch.allclose(fused(x), F.relu(conv(x)), atol=1e-5)
                    and torch.allclose(fused(x, other), ref, atol=1e-5)
                )
        except (AttributeError, RuntimeError):
            _CONV_OK = False
    return _CONV_OK


class ShapeCache(OrderedDict):
    """Weights laid out for each input shape met, made by ``make(shape)`` on first use; the :data:`LAYOUTS` most
    recently used are kept (oldest first)."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make = make

    def for_shape(self, shape: tuple[int, ...]) -> torch.Tensor:
        # pop and re-insert (each atomic): threads sharing an inference copy never see a half-moved entry
        weight = self.pop(shape, None)
        if weight is None:
            weight = self.make(shape)
        self[shape] = weight  # the most recently used last
        while len(self) > LAYOUTS:
            self.popitem(last=False)
        return weight


class FusedConv(nn.Module):
    """``conv`` (bias or not), then optionally ``+ shortcut``, then optionally ReLU, as one oneDNN call.

    The weights are laid out in oneDNN's blocked format for each input shape met, from the shape itself
    (:data:`LAYOUTS` shapes are kept, the least recently used dropped): a layout chosen without the shape, or for
    another batch, can differ from the one the kernel then picks, and every call then reorders the weights again,
    which can cost more than the convolution itself (docs/performance.md).

    Args:
        conv: a 2-d convolution with zero padding; its weights are kept (in their dtype) to lay out per input shape.
        relu: apply ReLU to the result.
    """

    def __init__(self, conv: nn.Conv2d, relu: bool) -> None:
        super().__init__()
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError(f"oneDNN fusion needs explicit zero padding, got {conv.padding!r} / {conv.padding_mode}")
        self.geometry = (list(conv.padding), list(conv.stride), list(conv.dilation), conv.groups)
        # plain attributes, not parameters or buffers: the fused encoder is for inference only, and the layouts are
        # opaque oneDNN tensors without storage to save or copy
        self.plain = conv.weight.detach()
        self.dtype = self.plain.dtype
        self.layouts = ShapeCache(self._layout)  # input shape -> laid-out weights
        self.bias = None if conv.bias is None else conv.bias.detach().to(self.dtype)
        self.relu = relu

    def _layout(self, shape: tuple[int, ...]) -> torch.Tensor:
        return kernels.reorder_conv_weight(self.plain, self.geometry, shape)

    def weight_for(self, x: torch.Tensor) -> torch.Tensor:
        """The weights laid out for inputs of ``x``'s shape (made on the first call with that shape)."""
        return self.layouts.for_shape(tuple(x.shape))

    def forward(self, x: torch.Tensor, shortcut: torch.Tensor | None = None) -> torch.Tensor:
        x = x.to(self.dtype)
        weight = self.weight_for(x)
        if shortcut is None:
            return kernels.conv(x, weight, self.bias, self.geometry, self.relu)
        return kernels.conv_add(x, shortcut.to(self.dtype), weight, self.bias, self.geometry, self.relu)

    def extra_repr(self) -> str:
        padding, stride, dilation, groups = self.geometry
        return (
            f"{self.dtype}, padding={padding}, stride={stride}, dilation={dilation}, groups={groups}, relu={self.relu}"
        )


class FusedBlock(nn.Module):
    """A folded timm ResNet block (``BasicBlock`` or ``Bottleneck``) as fused convolutions: every convolution but the
    last with its ReLU, the last with the shortcut addition and the final ReLU, the downsampling convolution alone."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        convs = [getattr(block, name) for name in ("conv1", "conv2", "conv3") if hasattr(block, name)]
        self.inner = nn.ModuleList(FusedConv(conv, relu=True) for conv in convs[:-1])
        self.last = FusedConv(convs[-1], relu=True)
        self.downsample = None if block.downsample is None else FusedConv(block.downsample[0], relu=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        for conv in self.inner:
            x = conv(x)
        return self.last(x, shortcut)


def _identity(module: nn.Module | None) -> bool:
    return module is None or isinstance(module, nn.Identity)


def _relu(module: nn.Module | None) -> bool:
    return isinstance(module, nn.ReLU)


def _fusable(block: nn.Module) -> bool:
    """A timm BasicBlock / Bottleneck whose BatchNorms are folded, with plain ReLUs and nothing else in the path
    (no squeeze-excitation, drop-path, anti-aliasing or drop-block) and a conv-only downsampling."""
    from timm.models.resnet import BasicBlock, Bottleneck

    if not isinstance(block, (BasicBlock, Bottleneck)):
        return False
    n = 3 if isinstance(block, Bottleneck) else 2
    convs_ok = all(isinstance(getattr(block, f"conv{i}"), nn.Conv2d) for i in range(1, n + 1))
    norms_ok = all(_identity(getattr(block, f"bn{i}")) for i in range(1, n + 1))
    acts_ok = all(_relu(getattr(block, f"act{i}")) for i in range(1, n + 1))
    extras_ok = all(_identity(getattr(block, name, None)) for name in ("drop_block", "aa", "se", "drop_path"))
    ds = block.downsample
    ds_ok = ds is None or (
        isinstance(ds, nn.Sequential) and len(ds) == 2 and isinstance(ds[0], nn.Conv2d) and _identity(ds[1])
    )
    return convs_ok and norms_ok and acts_ok and extras_ok and ds_ok


def fuse_resnet(backbone: nn.Module) -> int:
    """Replace, in place, a folded timm ResNet's stem convolution + ReLU and every fusable block (see
    :class:`FusedBlock`) with oneDNN-fused modules. Blocks that do not qualify stay as they are.

    Returns:
        how many convolutions now run fused (0 where oneDNN's kernels are unavailable).
    """
    if not conv_available():
        return 0
    fused = 0
    stem = getattr(backbone, "conv1", None)
    if (
        isinstance(stem, nn.Conv2d)
        and _identity(getattr(backbone, "bn1", None))
        and _relu(getattr(backbone, "act1", None))
    ):
        backbone.conv1, backbone.act1 = FusedConv(stem, relu=True), nn.Identity()
        fused += 1
    for layer in backbone.children():
        if not isinstance(layer, nn.Sequential):
            continue
        for i, block in enumerate(layer):
            if _fusable(block):
                layer[i] = FusedBlock(block)
                fused += len(layer[i].inner) + 1 + (layer[i].downsample is not None)
    return fused


# ------------------------------------------------------------------------------ linear layers of decoding


def is_packed(weight: torch.Tensor | nn.Module) -> bool:
    """Whether ``weight`` is a matrix :func:`pack_linear` reordered (an opaque oneDNN tensor)."""
    return isinstance(weight, torch.Tensor) and weight.is_mkldnn


def pack_linear(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (out, in) reordered into oneDNN's blocked layout for :func:`dense` (an opaque mkldnn tensor)."""
    return kernels.reorder_linear_weight(weight)


class OneDNNLinear(nn.Module):
    """A linear layer on oneDNN's kernel (:func:`linear`), its weight reordered once (:func:`pack_linear`) in
    ``dtype``; takes any float input (cast to ``dtype``) and returns ``dtype``. Not part of any state dict."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.weight = pack_linear(weight.detach().to(dtype).contiguous())
        self.bias = None if bias is None else bias.detach().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x.reshape(-1, x.shape[-1]), self.weight, self.bias).view(*x.shape[:-1], -1)


def bf16_worthwhile(weight: torch.Tensor) -> bool:
    """Whether a bf16 inference copy (:mod:`namc.backends.precision`) gains from keeping ``weight`` (out, in) of FDG's
    decoding step in bf16 rather than fp32: a matrix of at least :data:`~namc.thresholds.BF16_MIN_WEIGHT` entries
    (read at each call), since oneDNN's bf16 call has a fixed cost that small products do not earn back.
    """
    return weight.numel() >= BF16_MIN_WEIGHT


def bf16_supported() -> bool:
    """Whether oneDNN runs bf16 on this CPU at all: AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT, natively where the CPU
    has AVX-512 BF16 or AMX (oneDNN's own check, a private op; False where this torch build lacks it).

    Without it (an AVX2-only CPU: AMD Zen 2-3, Intel's desktop and laptop chips since Alder Lake) oneDNN refuses bf16
    reorders, and PyTorch's fallback kernels run bf16 several times slower than fp32 (docs/performance.md), so a
    bf16 copy keeps every part in fp32 there (:mod:`namc.backends.precision`).
    """
    global _BF16_OK
    if _BF16_OK is None:
        _BF16_OK = kernels.onednn_bf16()
    return _BF16_OK


_BF16_OK: bool | None = None


def amx_bf16() -> bool:
    """Whether this CPU multiplies bf16 on AMX tiles (Intel Xeon since Sapphire Rapids), where oneDNN runs bf16 at
    all (:func:`bf16_supported`). There, large bf16 products run faster than PyTorch's dynamic int8 kernel (which
    has no AMX path) and PyTorch's fused CPU attention runs its bf16 products on the tiles too, so a bf16 or
    int8 copy picks other kernels (:func:`namc.backends.step.attend_step`, :mod:`namc.backends.precision`). False where
    this torch build lacks the (private) check."""
    global _AMX_OK
    if _AMX_OK is None:
        _AMX_OK = kernels.amx_tiles() and bf16_supported()
    return _AMX_OK


_AMX_OK: bool | None = None


def linear_available() -> bool:
    """Whether this torch build has oneDNN's linear kernel (:func:`namc.kernels.linear`) and it works.

    Checked once, on tiny tensors against ``F.linear``; a build without oneDNN, or one where the private op changed,
    makes :func:`dense` fall back to ``F.linear``.
    """
    global _LINEAR_OK
    if _LINEAR_OK is None:
        try:
            x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
            with torch.inference_mode(), _fp32():
                y = kernels.linear(x, w, b)
                _LINEAR_OK = bool(
                    torch.backends.mkldnn.is_available() and torch.allclose(y, F.linear(x, w, b), atol=1e-5)
                )
        except (AttributeError, RuntimeError):
            _LINEAR_OK = False
    return _LINEAR_OK


_LINEAR_OK: bool | None = None


def dense(x: torch.Tensor, weight: torch.Tensor | nn.Module, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` of (b, D_in) inputs during generation (``weight`` a packed int8 layer: that layer's call; a
    prepacked oneDNN bf16 matrix: oneDNN's kernel on it). A product too small to gain from a second thread that
    would have to be woken runs on one (:func:`namc.kernels.run`)."""
    if isinstance(weight, nn.Module):
        return weight(x.float()).to(x.dtype)
    if is_packed(weight):  # prepacked by FusedFDG.pack_step("bf16"); outside autocast's reach, so cast here
        return linear(x, weight, bias)
    if x.device.type != "cpu":
        return F.linear(x, weight, bias)
    x = x.to(weight.dtype)  # a bf16 copy mixes bf16 and fp32 matrices (bf16_worthwhile) and runs without autocast
    return kernels.run(_kind(weight), 2.0 * x.numel() * weight.shape[0], F.linear, x, weight, bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """oneDNN's linear kernel on a CPU ``weight`` (fp32 as it is, or bf16 prepacked by :func:`pack_linear`), ``x``
    cast to its dtype; on one thread where the product is too small to pay for waking a second
    (:func:`namc.kernels.run`)."""
    return kernels.run(
        _kind(weight), 2.0 * x.numel() * weight.shape[0], kernels.linear, x.to(weight.dtype), weight, bias
    )


def _kind(weight: torch.Tensor) -> str:
    return "bf16" if weight.dtype == torch.bfloat16 else "fp32"
