"""Static int8 grid (namc.backends.qconv, namc.backends.grid.grid_int8_peaks / quantize_grid, precision.calibrate_int8).

The kernels are checked against a float convolution of the same int8 codes (the only rounding left is the output's
own quantisation), a whole quantised ResNet against the fp32 one it came from, and the calibration's life cycle on a
model: the ``int8`` copy runs the static grid once calibrated and goes back to fp32 when the grid's weights change;
``save_pretrained`` keeps the calibration, ``from_pretrained`` restores it and refuses a damaged one.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

import namc
from namc.backends import onednn, qconv
from namc.backends.grid import fold_batchnorm, fuse_grid, grid_int8_peaks, quantize_grid
from namc.backends.precision import (
    CALIBRATION_FILE,
    calibrate_int8,
    inference_copy,
    int8_calibration,
    int8_grid,
    set_int8_calibration,
)
from namc.lit.callbacks import _keep_int8_calibration
from namc.models.files import ConfigError, WeightsError
from namc.models.grid import GridEncoder

pytestmark = pytest.mark.skipif(not onednn.conv_available(), reason="this torch build lacks oneDNN's convolutions")
# the int8 kernels themselves; calibrating, saving and loading a calibration run everywhere (a CPU without them runs a
# calibrated grid in fp32)
needs_qconv = pytest.mark.skipif(
    not qconv.qconv_available(), reason="this torch build has no exact oneDNN int8 convolution"
)
# 8-bit codes need VNNI (int32 sums); 7-bit codes run exactly on every x86 CPU, so they are tested everywhere
CEILINGS = [
    pytest.param(255, marks=pytest.mark.skipif(qconv.code_ceiling() < 255, reason="8-bit codes need VNNI")),
    127,
]


def _codes(conv: qconv.QuantConv) -> torch.Tensor:
    return conv.codes.float() * conv.w_scales[:, None, None, None]


@needs_qconv
@pytest.mark.parametrize("ceiling", CEILINGS)
@pytest.mark.parametrize("shape", [(2, 16, 9, 9), (5, 16, 6, 7)])
def test_quant_conv_is_a_float_convolution_of_its_codes(shape, ceiling):
    """Plain (uint8 out, fp32 out) and with a shortcut (uint8 + uint8, fp32 + fp32): every form equals the float
    convolution of the dequantised input and weights, up to one step of a uint8 output's scale, with input codes up
    to ``ceiling``; an output another convolution reads stops at the ceiling, as it would saturate at 255."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)  # the convolution's initialisation
    conv = torch.nn.Conv2d(16, 24, 3, padding=1, stride=1).eval()
    fused = onednn.FusedConv(conv, relu=True)
    x = torch.rand(*shape, generator=g).contiguous(memory_format=torch.channels_last)
    in_scale = 1 / ceiling
    qx = qconv.quantize_u8(x, in_scale, ceiling=ceiling)
    assert qx.dtype == torch.uint8 and qx.is_contiguous(memory_format=torch.channels_last) and qx.max() == ceiling
    dq = qx.float() * in_scale
    with torch.inference_mode():
        raw = F.conv2d(dq, _codes(qconv.QuantConv(fused, in_scale, None)), conv.bias, padding=1)
        out_scale = (2 * raw.abs().max().item() + 1) / ceiling  # room for every sum below: no output saturates
        shortcut = torch.rand(shape[0], 24, *shape[2:], generator=g).contiguous(memory_format=torch.channels_last)
        q_short = qconv.quantize_u8(shortcut, in_scale, ceiling=ceiling)
        cases = [
            (qconv.QuantConv(fused, in_scale, None), (), torch.relu(raw), 1e-4),
            (qconv.QuantConv(fused, in_scale, out_scale, out_max=ceiling), (), torch.relu(raw), out_scale),
            (
                qconv.QuantConv(fused, in_scale, out_scale, out_max=ceiling),
                (q_short.clone(), in_scale),
                torch.relu(raw + q_short.float() * in_scale),
                out_scale,
            ),
            (qconv.QuantConv(fused, in_scale, None), (shortcut.clone(),), torch.relu(raw + shortcut), 1e-4),
        ]
        for module, extra, expected, tol in cases:
            out = module(qx, *extra)
            got = out.float() * out_scale if out.dtype == torch.uint8 else out
            assert out.dtype == (torch.float32 if module.out_scale is None else torch.uint8)
            torch.testing.assert_close(got, expected, rtol=0, atol=tol)
        # a signed output (no ReLU, only ever added): 8 bits, zero point 128; then added as a uint8 shortcut
        signed_scale = raw.abs().max().item() / 127
        signed = qconv.QuantConv(onednn.FusedConv(conv, relu=False), in_scale, signed_scale, 128)(qx)
        torch.testing.assert_close((signed.float() - 128) * signed_scale, raw, rtol=0, atol=signed_scale)
        summed = qconv.QuantConv(fused, in_scale, out_scale, out_max=ceiling)(qx, signed.clone(), signed_scale, 128)
        expected = torch.relu(raw + (signed.float() - 128) * signed_scale)
        torch.testing.assert_close(summed.float() * out_scale, expected, rtol=0, atol=out_scale)
        # a scale too small for the outputs: they stop at the ceiling, alone and after a shortcut
        tight = raw.abs().max().item() / (3 * ceiling)
        for extra, top in [((), torch.relu(raw)), ((q_short.clone(), in_scale), torch.relu(raw + q_short * in_scale))]:
            out = qconv.QuantConv(fused, in_scale, tight, out_max=ceiling)(qx, *extra)
            assert out.max() == ceiling and (top > ceiling * tight).any()
            torch.testing.assert_close(out.float() * tight, top.clamp(max=ceiling * tight), rtol=0, atol=tight)
        with pytest.raises(ValueError, match="uint8 shortcut"):
            qconv.QuantConv(fused, in_scale, None)(qx, q_short, in_scale)
        with pytest.raises(ValueError, match="ceiling below 255"):
            qconv.QuantConv(onednn.FusedConv(conv, relu=False), in_scale, out_scale, out_max=127)


@needs_qconv
@pytest.mark.parametrize("ceiling", CEILINGS)
def test_quant_stem_is_the_fp32_stem_and_max_pool(ceiling):
    """From normalised pixels (signed: zero point 128, the scale from the normalisation) to the first block's uint8
    input: the fp32 stem convolution + ReLU and max-pool, up to the rounding of the pixels and of the output."""
    g = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 7, stride=2, padding=3).eval()
    fused, pool = onednn.FusedConv(conv, relu=True), torch.nn.MaxPool2d(3, stride=2, padding=1)
    grid = GridEncoder("resnet18", 3)
    pixels = grid.normalize(torch.rand(2, 3, 32, 40, generator=g))
    peak = float(torch.maximum(-grid.mean / grid.std, (1 - grid.mean) / grid.std).abs().max())
    with torch.inference_mode():
        expected = pool(fused(pixels))
        stem = qconv.QuantStem(fused, pool, peak, float(expected.max()), ceiling)
        out = stem(pixels)
    assert stem.conv.in_zero == (ceiling + 1) // 2 and out.max() <= ceiling
    assert out.dtype == torch.uint8 and out.shape == expected.shape and qconv._stem_available(False)
    assert out.is_contiguous(memory_format=torch.channels_last)
    error = ((out.float() * stem.conv.out_scale - expected).norm() / expected.norm()).item()
    assert error < 0.01, error


@pytest.mark.skipif(not qconv._stem_available(False), reason="this torch cannot pool quantised tensors")
def test_plain_quantisation_and_pooling_give_the_same_codes():
    """The plain forms that take over where PyTorch no longer has quantised dtypes: the pixels' codes (zero point
    0 and 128) and the max-pool of uint8 codes (its plain uint8 kernel fails on these channels-last shapes) are the
    quantised forms' to the bit, layout kept."""
    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(2, 64, 28, 30, generator=g)).contiguous(memory_format=torch.channels_last)
    for zero, ceiling in [(0, 255), (128, 255), (0, 127), (64, 127)]:
        plain = qconv.quantize_u8(x, 0.02, zero, plain=True, ceiling=ceiling)
        quantised = qconv.quantize_u8(x, 0.02, zero, ceiling=ceiling)
        assert torch.equal(plain, quantised) and plain.is_contiguous(memory_format=torch.channels_last)
        assert plain.max() == ceiling and plain.min() == 0
    codes = qconv.quantize_u8(x, 0.02, 128)
    pooled = qconv.max_pool_u8(codes, 3, 2, 1, plain=True)
    assert torch.equal(pooled, qconv.max_pool_u8(codes, 3, 2, 1))
    assert pooled.dtype == torch.uint8 and pooled.is_contiguous(memory_format=torch.channels_last)


def _grid(arch: str) -> GridEncoder:
    torch.manual_seed(0)
    grid = GridEncoder(arch, 3).eval()
    for m in grid.modules():  # BatchNorm statistics of a trained net: timm's init zeroes every residual branch
        if isinstance(m, torch.nn.BatchNorm2d):
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
    return grid


@needs_qconv
@pytest.mark.parametrize("ceiling", CEILINGS)
@pytest.mark.parametrize("arch", ["resnet18", "resnet26"])  # BasicBlock; Bottleneck with strided downsampling
def test_static_int8_grid_is_close_to_the_fp32_grid(arch, ceiling):
    grid = _grid(arch)
    g = torch.Generator().manual_seed(1)
    calibration = [torch.rand(4, 3, 64, 64, generator=g) for _ in range(2)]
    peaks = grid_int8_peaks(grid, calibration)

    def fused() -> GridEncoder:  # a fused encoder cannot be copied: fold and fuse a fresh copy each time
        out = copy.deepcopy(grid)
        fold_batchnorm(out)
        fuse_grid(out)
        return out

    fp32, int8, clipped = fused(), fused(), fused()
    convs = sum(len(b.inner) + 1 + (b.downsample is not None) for b in qconv._blocks(fp32.backbone))
    assert quantize_grid(int8, peaks, ceiling) == convs + 1  # the stem too
    assert not any(isinstance(m, (onednn.FusedBlock, onednn.FusedConv)) for m in int8.modules())
    assert isinstance(int8.backbone.conv1, qconv.QuantStem) and isinstance(int8.backbone.maxpool, torch.nn.Identity)
    quantize_grid(clipped, [[p / 20 for p in block] for block in peaks], ceiling)  # scales far too small: saturation
    assert all(b.ceiling == ceiling for b in int8.modules() if isinstance(b, (qconv.QuantBlock, qconv.QuantStem)))
    with torch.inference_mode():
        for images in (torch.rand(3, 3, 64, 64, generator=g), torch.rand(1, 3, 96, 128, generator=g)):
            expected, got = fp32(images), int8(images)
            assert got.dtype == torch.float32 and got.shape == expected.shape
            error = ((got - expected).norm() / expected.norm()).item()
            assert error < 0.05, error  # 8 bits: 0.02-0.03 (0.031 on ResNet-101 at 224 px); 7 bits: 0.033-0.046 (0.045)
            assert ((clipped(images) - expected).norm() / expected.norm()).item() > 4 * error


def test_calibration_needs_images_and_a_fused_fp32_grid():
    grid = _grid("resnet18")
    with pytest.raises(ValueError, match="at least one batch"):
        grid_int8_peaks(grid, [])
    with pytest.raises(ValueError, match=r"must be \(B, 3, H, W\), got \(3, 64, 64\)"):
        grid_int8_peaks(grid, [torch.rand(3, 64, 64)])
    with pytest.raises(ValueError, match="fused ResNet"):
        quantize_grid(grid, [[1.0]])  # not folded and fused
    fold_batchnorm(grid)
    fuse_grid(grid)
    with pytest.raises(ValueError, match="calibrated blocks"):
        quantize_grid(grid, [[1.0, 1.0, 1.0]])


def test_calibrate_int8_switches_the_copy_grid_until_the_grid_changes():
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", pretraining=False).eval()
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(2, 4, 3, 64, 64, generator=g)
    assert int8_grid(model) == "fp32" and int8_calibration(model) is None
    before = inference_copy(model, "int8")
    assert not any(isinstance(m, qconv.QuantBlock) for m in before.modules())
    calibrate_int8(model, [a, b])
    static = qconv.qconv_available()  # else (no oneDNN int8 convolution) the calibrated grid runs fused in fp32
    assert int8_calibration(model) is not None and int8_grid(model) == ("int8" if static else "fp32")
    twin = inference_copy(model, "int8")
    assert twin is not before and any(isinstance(m, qconv.QuantBlock) for m in twin.grid.modules()) is static
    ids = namc.compile(model, "cpu", "int8").generate_ids(a, b, max_new_tokens=5)
    assert ids.shape[0] == 4
    with torch.no_grad():
        next(model.grid.parameters()).mul_(1.5)  # new grid weights: the peaks no longer describe them
    assert int8_grid(model) == "fp32" and int8_calibration(model) is None
    assert not any(isinstance(m, qconv.QuantBlock) for m in inference_copy(model, "int8").modules())


def _calibrated(seed: int = 0) -> tuple[namc.NAMC, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = namc.create_model("namc_tiny", pretraining=False).eval()
    a, b = torch.rand(2, 4, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
    calibrate_int8(model, [a, b])
    return model, a, b


def test_saved_model_keeps_its_int8_calibration(tmp_path):
    model, a, b = _calibrated()
    peaks = int8_calibration(model)
    assert qconv.peak_layout(model.grid.backbone) == [len(p) for p in peaks]  # the unfused grid's layout
    folder = model.save_pretrained(tmp_path / "m")
    assert CALIBRATION_FILE in json.loads((folder / "config.json").read_text())["files"]  # vouched for by digest
    loaded = namc.NAMC.from_pretrained(folder)
    assert int8_calibration(loaded) == peaks
    int8 = namc.compile(model, "cpu", "int8")
    assert torch.equal(namc.compile(loaded, "cpu", "int8").generate_ids(a, b, 5), int8.generate_ids(a, b, 5))
    assert namc.compile(namc.load_model(folder), "cpu", "int8").generate(a, b) == int8.generate(a, b)
    plain = namc.create_model("namc_tiny", pretraining=False)
    plain.save_pretrained(folder)  # an uncalibrated model saved over it: the old calibration goes
    assert not (folder / CALIBRATION_FILE).exists()
    assert int8_calibration(namc.NAMC.from_pretrained(folder)) is None


def test_a_damaged_or_foreign_int8_calibration_is_refused(tmp_path, caplog):
    model, _, _ = _calibrated()
    folder = model.save_pretrained(tmp_path / "m")
    path = folder / CALIBRATION_FILE
    good = json.loads(path.read_text())
    path.write_text(json.dumps({**good, "peaks": good["peaks"][:-1]}))
    with pytest.raises(WeightsError, match=CALIBRATION_FILE):  # the digest config.json records
        namc.NAMC.from_pretrained(folder)
    with pytest.raises(ConfigError, match=rf"{CALIBRATION_FILE}: int8 peaks must be 4 lists .* lengths \[3, 3, 4, 3\]"):
        namc.NAMC.from_pretrained(folder, verify=False)
    path.write_bytes(b'{"format": "namc-int8-calibration/1", "peaks": [\xff]}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        namc.NAMC.from_pretrained(folder, verify=False)
    path.write_text('{"peaks": []}')
    with pytest.raises(ConfigError, match="not a namc int8 calibration"):
        namc.NAMC.from_pretrained(folder, verify=False)
    for bad in ([[float("nan")] * 3, *good["peaks"][1:]], [[-1.0] * 3, *good["peaks"][1:]], "peaks"):
        with pytest.raises(ValueError, match="finite numbers >= 0"):
            set_int8_calibration(model, bad)
    namc.create_model("namc_tiny", pretraining=False).save_pretrained(folder)
    path.write_text(json.dumps(good))  # a calibration config.json does not record: from elsewhere
    with caplog.at_level("WARNING"):
        assert int8_calibration(namc.NAMC.from_pretrained(folder)) is None
    assert "not recorded in config.json: ignored" in caplog.text


def test_exported_best_checkpoint_keeps_the_calibration_of_the_same_grid():
    model, _, _ = _calibrated()
    exported = copy.deepcopy(model)  # a checkpoint's weights: the same frozen grid
    assert int8_calibration(exported) is None  # a calibration belongs to one model object
    _keep_int8_calibration(model, exported)
    assert int8_calibration(exported) == int8_calibration(model)
    other = namc.create_model("namc_tiny", pretraining=False)  # another grid: its peaks would be wrong
    _keep_int8_calibration(model, other)
    assert int8_calibration(other) is None
