"""Static int8 convolutions for the frozen ResNet grid of an ``int8`` inference copy (:mod:`namc.backends.precision`).

The grid is more than half of the end-to-end time (namc_base in bf16 at batch 32), and on a CPU with VNNI an int8
convolution runs about twice as fast as the same one in bf16; on an AVX2 CPU without VNNI or bf16, up to three times
as fast as fp32 (docs/performance.md). This is the scheme PyTorch's x86 static flow (PT2E with
``X86InductorQuantizer``) lowers to, without ``torch.export`` or inductor: the same oneDNN kernels
(``onednn::qconv2d_pointwise``, through :mod:`namc.kernels`), called from modules.

- Weights: int8, symmetric, one scale per output channel (BatchNorm folded first).
- Activations: uint8 (every quantised activation follows a ReLU), one static scale per tensor, ``max / 255`` of what
  :func:`calibrate_resnet` observed on calibration images; ``max / 127`` on a CPU without VNNI (:func:`code_ceiling`),
  whose int8 kernels add pairs of uint8 x int8 products in int16 (``vpmaddubsw``), which saturates once the codes
  pass 127: there every code a convolution reads stays at 7 bits (its producer clamps it, as a VNNI CPU's uint8
  saturates at 255), and oneDNN's kernel is then exact. Between blocks the activations stay uint8; the residual
  addition and the ReLU are fused into the block's last convolution.
- The downsampling shortcuts' outputs are signed: uint8 with zero point 128, scale ``max |x| / 127`` (only added,
  never multiplied: 8 bits on every CPU).
- The stem (:class:`QuantStem`): its input, the normalised pixels, is signed: uint8 with zero point 128 and a scale
  from the normalisation itself (the largest ``|(0 - mean) / std|``, ``|(1 - mean) / std|``: no calibration, images
  outside [0, 1] saturate; zero point 64 and ``/ 63`` at 7 bits); its output and the max-pool's share the first
  block's input scale (the max-pool keeps the maximum), so the stem's convolution and max-pool run on int8 codes
  too, for one quantisation of the pixels instead of the max-pool's output.
- Stays in floating point: the grid's output (its last block returns fp32 for MIR).

A scale comes from calibration images, not from the input of each call, so the copy's output for an image does not
depend on what else was encoded before it; activations above any seen in calibration saturate at the top code.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from namc import kernels
from namc.backends.onednn import FusedBlock, FusedConv, ShapeCache
from namc.backends.qlinear import affine_codes, full_range, int8_kernels
from namc.models.calibration import block_peaks

__all__ = [
    "QuantBlock",
    "QuantConv",
    "QuantStem",
    "calibrate_resnet",
    "code_ceiling",
    "peak_layout",
    "qconv_available",
    "quantize_resnet",
]

_QCONV_OK: bool | None = None
_QPOOL_OK: bool | None = None


def code_ceiling() -> int:
    """The largest uint8 code a static int8 convolution of this CPU may read: 255 with VNNI (int32 sums); 127
    without (AVX2, AVX-512 before Cascade Lake), where oneDNN's kernel adds pairs of uint8 x int8 products in int16 and
    saturates past it (on an AVX2 CPU 8-bit codes land many output steps off the float convolution of the same codes,
    7-bit codes within half a step, in oneDNN's, FBGEMM's and the x86 engine's kernels alike)."""
    return 255 if full_range() else 127


def _ceiling(ceiling: int | None) -> int:
    """``ceiling``, or :func:`code_ceiling` for None; 255 or 127 only."""
    ceiling = code_ceiling() if ceiling is None else ceiling
    if ceiling not in (127, 255):
        raise ValueError(f"ceiling {ceiling}: 255 (8-bit codes, VNNI) or 127 (7-bit)")
    return ceiling


def quantize_u8(
    x: torch.Tensor, scale: float, zero_point: int = 0, plain: bool = False, ceiling: int = 255
) -> torch.Tensor:
    """``x`` as uint8 codes of ``scale`` and ``zero_point`` (0 for non-negative ``x``, 128 for signed, 64 for signed
    7-bit; round to nearest, saturating at 0 and ``ceiling``), layout kept.

    ``torch.quantize_per_tensor`` + ``int_repr`` (one pass each): 5.6x faster than the decomposed op PT2E graphs use
    when run eagerly. Its quantised-tensor deprecation warning does not apply here: the result is a plain uint8
    tensor. ``plain`` (the :func:`~namc.backends.qlinear.int8_kernels` of a torch without quantised dtypes): the same
    codes from plain operations, in five passes."""
    if plain:
        return affine_codes(x, scale, zero_point, ceiling + 1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*", category=UserWarning)
        codes = torch.quantize_per_tensor(x.float(), scale, zero_point, torch.quint8).int_repr()
    return codes if ceiling >= 255 else codes.clamp_(max=ceiling)


class QuantConv(nn.Module):
    """A fused convolution (:class:`~namc.backends.onednn.FusedConv`, fp32 weights) in static int8: uint8 input of
    scale ``in_scale``, per-channel int8 weights, uint8 output of scale ``out_scale`` and zero point ``out_zero``
    (128 for a signed output) or, with ``out_scale=None``, an fp32 output.

    Called with ``accum`` (the shortcut), adds it before the ReLU: a uint8 ``accum`` (of ``accum_scale`` and
    ``accum_zero``) with a uint8 output, or an fp32 ``accum`` and an fp32 output, the two forms oneDNN's kernel
    accepts. The kernel adds into ``accum`` in place (and, in torch 2.15, returns a copy of it).

    ``out_max``: the largest uint8 output code, below 255 where another convolution reads the output on a CPU without
    VNNI (:func:`code_ceiling`): the ReLU becomes a clamp to ``[0, out_max * out_scale]`` (oneDNN's hardtanh post-op),
    or, after a shortcut (the kernel's sum takes no other post-op than ReLU), the codes are clamped after.
    """

    def __init__(
        self,
        conv: FusedConv,
        in_scale: float,
        out_scale: float | None,
        out_zero: int = 0,
        in_zero: int = 0,
        out_max: int = 255,
    ) -> None:
        super().__init__()
        weight = conv.plain.float()
        self.w_scales = (weight.abs().amax(dim=(1, 2, 3)) / 127).clamp_min(1e-12)
        self.codes = torch.round(weight / self.w_scales[:, None, None, None]).clamp(-128, 127).to(torch.int8)
        self.w_zero = torch.zeros(weight.shape[0], dtype=torch.int64)
        self.bias = None if conv.bias is None else conv.bias.float()
        self.geometry = conv.geometry  # padding, stride, dilation, groups
        self.in_scale, self.out_scale, self.out_zero, self.relu = float(in_scale), out_scale, out_zero, conv.relu
        self.in_zero = in_zero
        if out_max < 255 and (out_scale is None or out_zero or not conv.relu):
            raise ValueError("only a uint8 output after a ReLU (zero point 0) takes a ceiling below 255")
        self.out_max = out_max
        self.layouts = ShapeCache(self._layout)

    def _layout(self, shape: tuple[int, ...]) -> torch.Tensor:
        w, scales = self.codes, self.w_scales
        return kernels.pack_int8_conv(w, scales, self.in_scale, self.in_zero, self.geometry, list(shape))

    def forward(
        self, qx: torch.Tensor, accum: torch.Tensor | None = None, accum_scale: float = 1.0, accum_zero: int = 0
    ) -> torch.Tensor:
        weight = self.layouts.for_shape(tuple(qx.shape))
        x = (qx, self.in_scale, self.in_zero)
        w = (weight, self.w_scales, self.w_zero, self.bias, self.geometry)
        out = (1.0, 0, torch.float32) if self.out_scale is None else (self.out_scale, self.out_zero, None)
        if accum is None:
            if self.out_max < 255:  # a ReLU clamped at the top code (oneDNN's hardtanh)
                return kernels.int8_conv(*x, *w, out, clamp=(0.0, self.out_max * self.out_scale))
            return kernels.int8_conv(*x, *w, out, relu=self.relu)
        if (accum.dtype == torch.uint8) != (self.out_scale is not None):
            raise ValueError("a uint8 shortcut needs a uint8 output and an fp32 one an fp32 output")
        y = kernels.int8_conv(*x, *w, out, relu=self.relu, shortcut=(accum, accum_scale, accum_zero))
        return y if self.out_max >= 255 else y.clamp_(max=self.out_max)

    def extra_repr(self) -> str:
        out = "fp32" if self.out_scale is None else f"uint8 x {self.out_scale:.3g}"
        zero = f" - {self.out_zero}" if self.out_zero else ""
        in_zero = f" - {self.in_zero}" if self.in_zero else ""
        top = f" (max {self.out_max})" if self.out_max < 255 else ""
        return f"uint8{in_zero} x {self.in_scale:.3g} -> {out}{zero}{top}, relu={self.relu}"


class QuantStem(nn.Module):
    """A ResNet's fused stem (convolution + ReLU) and its max-pool in static int8, from the normalised pixels (fp32,
    signed) to the first block's uint8 input (see the module docstring).

    Args:
        conv: the fused fp32 stem convolution (with its ReLU).
        pool: the max-pool after it.
        in_peak: the largest magnitude of a normalised pixel (scale ``in_peak / 127``, zero point 128; at a
            ``ceiling`` of 127, ``in_peak / 63`` and 64).
        out_peak: the largest value of the stem's output, which is the first block's input peak.
        ceiling: the largest code a convolution reads (:func:`code_ceiling` by default).
    """

    def __init__(
        self, conv: FusedConv, pool: nn.MaxPool2d, in_peak: float, out_peak: float, ceiling: int | None = None
    ) -> None:
        super().__init__()
        self.ceiling = _ceiling(ceiling)
        half = (self.ceiling + 1) // 2  # the signed pixels' zero point
        in_scale, out_scale = max(in_peak, 1e-6) / (half - 1), max(out_peak, 1e-6) / self.ceiling
        self.conv = QuantConv(conv, in_scale, out_scale, in_zero=half, out_max=self.ceiling)
        self.pool = (pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)
        self.plain = int8_kernels() == "plain"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes = quantize_u8(x, self.conv.in_scale, self.conv.in_zero, self.plain, self.ceiling)
        y = self.conv(codes)  # (B, C, H/2, W/2), at the first block's scale
        return max_pool_u8(y, *self.pool, plain=self.plain)


def max_pool_u8(codes: torch.Tensor, *pool, plain: bool = False) -> torch.Tensor:
    """``F.max_pool2d(codes, *pool)`` of uint8 codes, layout kept: PyTorch's max-pool takes them as a quantised tensor
    (the scale does not matter to a maximum; its plain uint8 kernel fails on channels-last inputs of 64 channels,
    1 x 64 x 56 x 56 already, in torch 2.14.1). ``plain``: the max-pool of the codes as int16, exact, at about 2.4x
    the time."""
    if plain:
        return F.max_pool2d(codes.to(torch.int16), *pool).to(torch.uint8)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantize.*", category=UserWarning)
        return F.max_pool2d(torch._make_per_tensor_quantized_tensor(codes, 1.0, 0), *pool).int_repr()


def _stem_available(plain: bool) -> bool:
    """Whether this torch build pools uint8 codes as :func:`max_pool_u8` does (quantised tensors, a private
    constructor; the plain form always can): checked once on a tiny tensor against the float max-pool of the same
    codes."""
    global _QPOOL_OK
    if plain:
        return True
    if _QPOOL_OK is None:
        try:
            codes = torch.randint(0, 256, (1, 4, 6, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
            codes = codes.contiguous(memory_format=torch.channels_last)
            expected = F.max_pool2d(codes.float(), 3, 2, 1)
            _QPOOL_OK = bool(torch.equal(max_pool_u8(codes, 3, 2, 1).float(), expected))
        except (AttributeError, RuntimeError):
            _QPOOL_OK = False
    return _QPOOL_OK


class QuantBlock(nn.Module):
    """A :class:`~namc.backends.onednn.FusedBlock` in static int8 (see the module docstring).

    Args:
        block: the fused fp32 block.
        peaks: what :func:`calibrate_resnet` saw for it: the largest input, output of each inner convolution and
            block output (uint8 scales ``peak / ceiling``), then, with a downsampling shortcut, its largest magnitude
            (a signed uint8 of zero point 128, scale ``peak / 127``).
        final: return fp32 (the grid's last block) instead of uint8.
        ceiling: the largest code a convolution reads (:func:`code_ceiling` by default).
    """

    def __init__(self, block: FusedBlock, peaks: list[float], final: bool = False, ceiling: int | None = None) -> None:
        super().__init__()
        n = len(block.inner)
        expected = n + 2 + (block.downsample is not None)
        if len(peaks) != expected:
            raise ValueError(f"expected {expected} peaks for this block, got {len(peaks)}")
        self.ceiling = _ceiling(ceiling)
        chain = [max(p, 1e-6) / self.ceiling for p in peaks[: n + 2]]  # input, inner outputs, block output
        self.in_scale = chain[0]
        top = self.ceiling  # every uint8 output here is read by a convolution
        self.inner = nn.ModuleList(QuantConv(c, chain[i], chain[i + 1], out_max=top) for i, c in enumerate(block.inner))
        out = {"out_scale": None} if final else {"out_scale": chain[n + 1], "out_max": top}
        self.last = QuantConv(block.last, chain[n], **out)
        self.downsample = None
        if block.downsample is not None:  # signed: zero point 128, or fp32 where the block sums in fp32
            short = None if final else max(peaks[n + 2], 1e-6) / 127
            self.downsample = QuantConv(block.downsample, self.in_scale, short, 0 if final else 128)
        self.plain = int8_kernels() == "plain"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: the previous block's uint8 output, or fp32; the kernel adds into its accumulator in place, so a
        uint8 ``x`` is consumed (a block's input is used by nothing after it)."""
        qx = x if x.dtype == torch.uint8 else quantize_u8(x, self.in_scale, plain=self.plain, ceiling=self.ceiling)
        h = qx
        for conv in self.inner:
            h = conv(h)
        if self.downsample is not None:
            accum = self.downsample(qx)
            short = (self.downsample.out_scale or 1.0, self.downsample.out_zero)
        elif self.last.out_scale is not None:
            accum, short = qx, (self.in_scale, 0)  # the input is consumed: no copy (about 5% of the int8 grid)
        else:  # the grid's output block: an fp32 sum
            accum = x.float() * self.in_scale if x.dtype == torch.uint8 else x.float().clone()
            short = (1.0, 0)
        return self.last(h, accum, *short)


def _blocks(backbone: nn.Module) -> list[FusedBlock]:
    blocks = [b for layer in backbone.children() if isinstance(layer, nn.Sequential) for b in layer]
    if not blocks or not all(isinstance(b, FusedBlock) for b in blocks):
        raise ValueError("static int8 needs a fused ResNet: every block a FusedBlock (fuse_resnet first, fp32)")
    if any(c.dtype != torch.float32 for b in blocks for c in (*b.inner, b.last)):
        raise ValueError("static int8 quantises a fused fp32 ResNet")
    return blocks


def peak_layout(backbone: nn.Module) -> list[int]:
    """How many peaks :func:`calibrate_resnet` records for each block of this ResNet, fused or not (a saved
    calibration is checked against it): input, one per convolution but the last, output, and the shortcut's."""
    out = []
    for block in (b for layer in backbone.children() if isinstance(layer, nn.Sequential) for b in layer):
        if isinstance(block, FusedBlock):
            out.append(len(block.inner) + 2 + (getattr(block, "downsample", None) is not None))
        else:
            out.append(block_peaks(block))  # the model's own layout (namc.models.calibration)
    return out


@torch.no_grad()
def calibrate_resnet(backbone: nn.Module, batches) -> list[list[float]]:
    """Run ``batches`` (normalised, channels-last images) through a fused fp32 ResNet ``backbone`` and return, per
    block, the largest value seen at its input, after each inner convolution and at its output, then the largest
    magnitude out of its downsampling shortcut if it has one."""
    blocks = _blocks(backbone)
    peaks = [[0.0] * n for n in peak_layout(backbone)]
    hooks = []
    for i, block in enumerate(blocks):

        def seen(slot: int, i: int = i):
            def hook(module, args, out=None):
                value = (args[0] if out is None else out).detach()
                peaks[i][slot] = max(peaks[i][slot], float(value.abs().amax()))

            return hook

        hooks.append(block.register_forward_pre_hook(seen(0)))
        hooks += [conv.register_forward_hook(seen(1 + j)) for j, conv in enumerate(block.inner)]
        hooks.append(block.register_forward_hook(seen(len(block.inner) + 1)))
        if block.downsample is not None:
            hooks.append(block.downsample.register_forward_hook(seen(len(block.inner) + 2)))
    try:
        seen_any = False
        for images in batches:
            backbone(images)
            seen_any = True
        if not seen_any:
            raise ValueError("calibration needs at least one batch of images")
    finally:
        for hook in hooks:
            hook.remove()
    return peaks


def quantize_resnet(
    backbone: nn.Module, peaks: list[list[float]], pixel_peak: float | None = None, ceiling: int | None = None
) -> int:
    """Replace, in place, every block of a fused fp32 ResNet with its static int8 :class:`QuantBlock`, from the
    activation peaks :func:`calibrate_resnet` returned. The last block returns fp32. With ``pixel_peak`` (the
    largest magnitude of a normalised pixel), the fused stem and its max-pool too (:class:`QuantStem`). ``ceiling``:
    the largest code a convolution reads, :func:`code_ceiling` by default (127 runs on every CPU; 255 needs VNNI).

    Returns:
        how many convolutions now run in int8 (0 where this torch build lacks the kernels: nothing changes).
    """
    blocks = _blocks(backbone)
    if len(peaks) != len(blocks):
        raise ValueError(f"{len(peaks)} calibrated blocks for a ResNet of {len(blocks)}")
    if not qconv_available():
        return 0
    ceiling = _ceiling(ceiling)
    quantised = 0
    stem, pool = getattr(backbone, "conv1", None), getattr(backbone, "maxpool", None)
    stem_ok = isinstance(stem, FusedConv) and stem.relu and isinstance(pool, nn.MaxPool2d)
    if pixel_peak is not None and stem_ok and _stem_available(int8_kernels() == "plain"):
        backbone.conv1, backbone.maxpool = QuantStem(stem, pool, pixel_peak, peaks[0][0], ceiling), nn.Identity()
        quantised += 1
    index = 0
    for layer in backbone.children():
        if not isinstance(layer, nn.Sequential):
            continue
        for j, block in enumerate(layer):
            layer[j] = QuantBlock(block, peaks[index], final=index == len(blocks) - 1, ceiling=ceiling)
            quantised += len(block.inner) + 1 + (block.downsample is not None)
            index += 1
    return quantised


def qconv_available() -> bool:
    """Whether this torch build has oneDNN's quantised convolution kernels and they match a float convolution of
    the same int8 codes, at most :func:`code_ceiling` (checked once on tiny tensors)."""
    global _QCONV_OK
    if _QCONV_OK is None:
        try:
            g = torch.Generator().manual_seed(0)
            conv = nn.Conv2d(8, 8, 3, padding=1).eval()
            fused = FusedConv(conv, relu=True)
            x = torch.rand(2, 8, 5, 5, generator=g).contiguous(memory_format=torch.channels_last)
            ceiling = code_ceiling()
            scale = 1 / ceiling
            q = QuantConv(fused, scale, None)
            with torch.inference_mode(), torch.autocast("cpu", enabled=False):
                dequant_w = q.codes.float() * q.w_scales[:, None, None, None]
                codes = quantize_u8(x, scale, plain=True, ceiling=ceiling)  # the convolution is checked
                ref = torch.relu(nn.functional.conv2d(codes.float() * scale, dequant_w, conv.bias, padding=1))
                _QCONV_OK = bool(torch.allclose(q(codes), ref, atol=1e-4))
        except (AttributeError, RuntimeError):
            _QCONV_OK = False
    return _QCONV_OK
