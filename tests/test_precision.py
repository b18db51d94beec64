"""Inference precision (namc.backends.precision), BatchNorm folding (namc.backends.grid.fold_batchnorm), the
compile-safe decoding step and ``namc describe --precision``.

The ``trained`` fixture fits namc_tiny (MIR + FDG; the grid stays frozen) for a few dozen Adam steps on one fixed
batch of 16 pairs, each with its own 6-word caption, so greedy decoding writes varied words; agreement with fp32 is
measured on those pairs and on 32 pairs it never saw, whose logits have smaller margins.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import namc
from namc.backends import onednn
from namc.backends import precision as precision_module
from namc.backends import step as fdg_module
from namc.backends.grid import fold_batchnorm, fuse_grid
from namc.backends.precision import (
    CALIBRATION_FILE,
    PARTS,
    PRECISIONS,
    calibrate_int8,
    check_precision,
    inference_copy,
    int8_calibration,
    int8_grid,
    mir_in_bf16,
    part_precisions,
)
from namc.backends.qconv import QuantStem, qconv_available
from namc.backends.qlinear import KERNELS_ENV, DynamicLinear, int8_kernels
from namc.backends.step import fuse_decoder
from namc.data.collate import pad_sequences
from namc.describe_cli import main as describe_main
from namc.models.calibration import GridCalibration
from namc.models.grid import GridEncoder

PAIRS = 16
# Share of identical captions each precision must reach against fp32 on the 48 pairs. bf16 keeps 8 mantissa bits
# (relative error 2^-9 per rounding) and int8 256 levels per weight row: a greedy step flips only where fp32's two
# best logits are closer than that error, which on this model happens on the unseen pairs (smaller margins) and
# changes the rest of that caption. Measured: 48/48 identical for both (bf16 and int8); 0.9 leaves room for the
# few near-ties another CPU's kernels may round differently, while a broken conversion (wrong scale, wrong dtype,
# stale or unfolded weights) changes nearly every caption. (A model trained on paraphrases has many more near-ties:
# on the demo's test split bf16 and int8 keep 88% of the captions identical; namc.backends.precision.)
MIN_IDENTICAL = 0.9
# oneDNN's bf16 kernels: a CPU without them (AVX2 only) keeps a bf16 copy in fp32
# (test_bf16_on_a_cpu_without_onednn_bf16), so the tests of bf16 kernels skip there
needs_bf16 = pytest.mark.skipif(not onednn.bf16_supported(), reason="oneDNN has no bf16 on this CPU (AVX2 only)")


@pytest.fixture(autouse=True)
def bf16_everywhere(monkeypatch):
    """The bf16 copy of namc_tiny in bf16 throughout: the rules that keep a narrow model's small parts in fp32,
    where bf16 is slower (``test_bf16_keeps_small_parts_in_fp32``), would leave these tests little bf16 to check."""
    monkeypatch.setattr(onednn, "BF16_MIN_WEIGHT", 0)
    monkeypatch.setattr(precision_module, "MIR_BF16_MIN_WEIGHT", 0)


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(one_thread):
    """(model, images_1, images_2): namc_tiny fitted to write caption i for pair i; the images hold the 16 trained
    pairs, the same 16 with fresh pixel noise, then 16 unseen pairs.

    Each image is a random colour plus pixel noise, so that the pairs' grids differ clearly and about 50 Adam steps
    (MIR + FDG from the grids, computed once: the grid is frozen) fit the 16 captions.
    """
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", pretraining=False, dropout=0.0)
    tok = model.tokenizer
    gen = torch.Generator().manual_seed(0)

    def pairs(colours: torch.Tensor) -> torch.Tensor:  # (2, P, 3, 1, 1) -> (2, P, 3, 64, 64)
        noise = 0.05 * torch.randn(2, colours.shape[1], 3, 64, 64, generator=gen)
        return (colours + noise).clamp(0, 1)

    colours = torch.rand(2, PAIRS, 3, 1, 1, generator=gen)
    train = pairs(colours)
    words = torch.randint(5, tok.vocab_size, (PAIRS, 6), generator=gen).tolist()  # varied words per pair
    ids = pad_sequences([[tok.bos_id, *w, tok.eos_id] for w in words], tok.pad_id)  # (P, 8)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    with torch.no_grad():
        grid = model.grid(torch.cat([train[0], train[1]]))  # (2P, N, C)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    model.train()
    for _ in range(150):
        logits = model.fdg(inputs, model.encode_pair(None, None, grid[:PAIRS], grid[PAIRS:]))  # (P, 7, V)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        if loss.item() < 0.05 and bool((logits.argmax(-1) == targets).all()):
            break
        loss.backward()
        opt.step()
        opt.zero_grad()
    images = torch.cat([train, pairs(colours), pairs(torch.rand(2, PAIRS, 3, 1, 1, generator=gen))], dim=1)
    return model.eval(), images[0], images[1]


def int8_layer_kernels(twin: torch.nn.Module) -> set[str]:
    """The kernels of an int8 copy's dynamic int8 layers, its decoding step's (not modules of the copy) included."""
    step = [getattr(w, name)[0] for w in twin.fdg._packed_step for name in w.NAMES]
    return {m.kernels for m in [*twin.modules(), *step] if isinstance(m, DynamicLinear)}


@pytest.mark.slow  # the module's fixture trains a model
@pytest.mark.parametrize("precision", ["bf16", "int8", "int8 static grid", "int8 static grid, plain kernels"])
def test_low_precision_captions_agree_with_fp32(trained, precision, monkeypatch):
    """bf16 and int8 against fp32; int8 also with the grid in static int8, and on the plain int8 kernels that take
    over where PyTorch no longer has its quantised dtypes (namc.backends.qlinear.int8_kernels)."""
    model, images_1, images_2 = trained
    fp32 = model.generate(images_1, images_2)
    assert len(set(fp32[:PAIRS])) == PAIRS  # the fixture's model writes a different caption for every trained pair
    if precision.startswith("int8 static grid"):  # the grid's blocks in int8 too, calibrated on the trained pairs
        if precision.endswith("plain kernels"):
            monkeypatch.setenv(KERNELS_ENV, "plain")
        model = copy.deepcopy(model)  # its own int8 copy, built on the kernels chosen now
        calibrate_int8(model, [images_1[:PAIRS], images_2[:PAIRS]])
        precision = "int8"
        assert int8_layer_kernels(inference_copy(model, "int8")) == {int8_kernels()}
        stem = inference_copy(model, "int8").grid.backbone.conv1
        if int8_grid(model) == "int8":
            assert isinstance(stem, QuantStem) and stem.plain is (int8_kernels() == "plain")
        else:  # no exact int8 convolution in this torch build: the calibrated grid runs fused in fp32
            assert type(stem) is onednn.FusedConv and not qconv_available()
    low = namc.compile(model, "cpu", precision).generate(images_1, images_2)
    same = [a == b for a, b in zip(fp32, low)]
    assert all(same[:PAIRS])  # the trained pairs have wide margins
    assert sum(same) / len(same) >= MIN_IDENTICAL, list(zip(fp32, low))


@pytest.mark.slow  # the trained fixture
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_pairs_caption_alone_and_in_a_batch(trained, precision):
    """fp32 captions a pair the same alone as among 47 others (its logits move by float rounding only: 3e-6 on
    namc_base). bf16 and int8 may not: the decoding step's one-query attention switches kernels with the number of
    rows, and int8's dynamic layers quantise each call's activations with one scale for all its rows, so a near-tie
    can fall the other way (on the demo's width-32 models 2-8% of the captions differ between batch 1 and 100)."""
    model, images_1, images_2 = trained
    captioner = namc.compile(model, "cpu", precision)
    together = captioner.generate(images_1, images_2)
    alone = [captioner.generate(images_1[i : i + 1], images_2[i : i + 1])[0] for i in range(len(together))]
    same = [a == b for a, b in zip(together, alone)]
    if precision == "fp32":
        assert all(same), list(zip(together, alone))
    assert all(same[:PAIRS])  # the trained pairs' wide margins hold at any batch size
    assert sum(same) / len(same) >= MIN_IDENTICAL, list(zip(together, alone))


@pytest.mark.slow  # the trained fixture
def test_fp32_is_the_model_itself(trained):
    """fp32 copies nothing and runs the model core: namc keeps no hand-written fp32 path."""
    model, images_1, images_2 = trained
    assert inference_copy(model, "fp32") is model
    cpu = namc.compile(model, "cpu")
    assert torch.equal(model.generate_ids(images_1, images_2), cpu.generate_ids(images_1, images_2))


@pytest.mark.slow  # the trained fixture
def test_copies_are_reused_and_rebuilt_after_training(trained, monkeypatch):
    model = copy.deepcopy(trained[0])
    first = inference_copy(model, "bf16")
    bf16 = torch.bfloat16 if onednn.bf16_supported() else torch.float32
    assert inference_copy(model, "bf16") is first  # built once
    assert first.nim is None and first.fdg.tok.weight.dtype == bf16
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in first.grid.modules())  # folded
    with torch.no_grad():
        model.fdg.tok.weight.mul_(-1.0)  # an in-place update, as an optimiser step makes
    second = inference_copy(model, "bf16")
    assert second is not first
    assert torch.equal(second.fdg.tok.weight, model.fdg.tok.weight.to(bf16))
    (vocab,) = inference_copy(model, "int8").fdg._packed_step[0].vocab  # built after the update: follows it
    x = torch.randn(4, model.config.dim)
    expected = x @ model.fdg.tok.weight.T
    assert ((vocab(x) - expected).norm() / expected.norm()).item() < 0.03  # int8 rounding (1-1.5%), not the old sign
    int8 = inference_copy(model, "int8")
    other = "quantized" if vocab.kernels == "plain" else "plain"
    monkeypatch.setenv(KERNELS_ENV, other)  # another choice of int8 kernels: a new copy on them
    assert int8_layer_kernels(inference_copy(model, "int8")) == {other}
    monkeypatch.delenv(KERNELS_ENV)
    assert inference_copy(model, "int8") is not int8 and inference_copy(model, "bf16") is second


@pytest.mark.slow  # the trained fixture
@pytest.mark.parametrize("amx", [False, True])
def test_int8_copy_packs_every_step_matrix(trained, amx, monkeypatch):
    """Every decoding matrix of the int8 copy is dynamic int8; so is every MIR layer, but on a CPU with AMX (set here
    both ways), where MIR runs in bf16 throughout and hands the decoder an fp32 memory."""
    monkeypatch.setattr(onednn, "_AMX_OK", amx)
    twin = inference_copy(trained[0], "int8")
    packed = twin.fdg._packed_step
    assert len(packed) == len(twin.fdg.blocks)
    assert packed[0].vocab is packed[-1].vocab  # the shared vocabulary matrix is packed once
    for name in fdg_module.StepWeights.NAMES:
        (layer,) = getattr(packed[0], name)
        assert isinstance(layer, DynamicLinear)
    bf16_mir = amx and onednn.bf16_supported()
    assert mir_in_bf16(trained[0].mir, int8=True) == bf16_mir
    assert part_precisions(trained[0], "int8")["mir"] == ("bf16" if bf16_mir else "int8")
    if bf16_mir:
        assert {p.dtype for p in twin.mir.parameters()} == {torch.bfloat16}
        grid = torch.randn(2, *twin.mir.pos.shape[:1], twin.mir.proj.in_features)
        with torch.inference_mode():
            memory = twin.encode_pair(None, None, grid, grid.flip(0))
        assert memory.dtype == torch.float32  # as FDG's int8 layers take it
        assert twin.fdg.generate(memory, 6).shape == (2, 6)
    else:
        assert not any(isinstance(m, torch.nn.Linear) for m in twin.mir.modules())  # the concat fusion's FC too
        assert any(isinstance(m, DynamicLinear) for m in twin.mir.modules())
    for block in twin.fdg.blocks:  # the once-per-generation cross-attention keys / values too (bf16 with AMX, as MIR)
        kv = block.cross_attn.kv
        if bf16_mir and onednn.linear_available():
            assert isinstance(kv, onednn.OneDNNLinear) and kv.weight.dtype == torch.bfloat16
        else:
            assert isinstance(kv, DynamicLinear)
    if onednn.bf16_supported():  # the keys / values it writes are read in bf16 from a memory of 2^20 elements up
        rows = fdg_module.CROSS_KV_BF16_MIN // (64 * twin.config.dim)  # (with AMX at any size)
        small = torch.bfloat16 if isinstance(twin.fdg.blocks[0].cross_attn.kv, onednn.OneDNNLinear) else torch.float32
        for batch, dtype in ((rows, torch.bfloat16), (rows - 1, small)):
            _, cross_kv, _ = twin.fdg._start(torch.randn(batch, 64, twin.config.dim), 8)
            assert all(t.dtype == dtype and t.is_contiguous() for kv in cross_kv for t in kv)


@pytest.mark.slow  # the trained fixture
@pytest.mark.skipif(not onednn.linear_available(), reason="this torch build has no oneDNN linear kernel")
@needs_bf16
def test_bf16_copy_prepacks_every_step_matrix(trained):
    """The bf16 copy keeps the decoding step's matrices in oneDNN's blocked layout, reordered once; decoding with
    them writes the same ids as with the plain bf16 weights (which oneDNN reorders at every call), and a compiled
    step, which cannot take oneDNN's opaque tensors, gets the plain weights."""
    model, images_1, images_2 = trained
    twin = inference_copy(model, "bf16")
    packed = twin.fdg._packed_step
    assert packed[0].vocab is packed[-1].vocab  # the shared vocabulary matrix is packed once
    for name in fdg_module.StepWeights.NAMES:
        weight, bias = getattr(packed[0], name)
        assert weight.is_mkldnn and weight.dtype == torch.bfloat16
        assert bias is None or bias.dtype == torch.bfloat16
    with torch.inference_mode():  # a CPU copy runs without autocast: each part casts to its own dtype
        grid = twin.grid(torch.cat([images_1, images_2]))
        memory = twin.encode_pair(None, None, grid[: len(images_1)], grid[len(images_1) :])
        with_packed = twin.fdg.generate(memory, 8)
        del twin.fdg._packed_step
        try:
            plain = twin.fdg.generate(memory, 8)
        finally:
            twin.fdg._packed_step = packed
    assert torch.equal(with_packed, plain)


BF16_RULES = (onednn.BF16_MIN_WEIGHT, precision_module.MIR_BF16_MIN_WEIGHT)  # as shipped, before the fixture


@needs_bf16
@pytest.mark.parametrize("dim", [32, 128])
def test_bf16_keeps_small_parts_in_fp32(dim, monkeypatch, one_thread):
    """Where bf16 is slower (a narrow model's small matrices: oneDNN's bf16 call costs about 15 us however small)
    the bf16 copy keeps the part in fp32 and computes exactly fp32's values there, casting at the boundaries: at
    width 32 MIR and FDG, at 128 FDG (its MIR in bf16, its decoder reading the bf16 memory). The grid is bf16 at
    every width where oneDNN's fused convolutions run it."""
    monkeypatch.setattr(onednn, "BF16_MIN_WEIGHT", BF16_RULES[0])
    monkeypatch.setattr(precision_module, "MIR_BF16_MIN_WEIGHT", BF16_RULES[1])
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", dim=dim, heads=dim // 32, pretraining=False).eval()
    model.fdg.eos_id = -1  # full-length captions
    twin = inference_copy(model, "bf16")
    mir_bf16 = dim >= 128  # largest MIR matrix 65,536 entries >= 2^15; FDG's 65,536 < 2^17
    grid = "bf16" if onednn.conv_available() else "fp32"
    want = {"grid": grid, "mir": "bf16" if mir_bf16 else "fp32", "decoder": "fp32", "vocabulary": "fp32"}
    assert part_precisions(model, "bf16") == want
    assert {p.dtype for p in twin.mir.parameters()} == {torch.bfloat16 if mir_bf16 else torch.float32}
    assert {p.dtype for p in twin.fdg.parameters()} == {torch.float32}
    assert not any(onednn.is_packed(w[0]) for s in twin.fdg._packed_step for w in map(s.__getattribute__, s.NAMES))
    if onednn.conv_available():
        assert twin.grid.backbone.conv1.dtype == torch.bfloat16
    images = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        grid = twin.grid(images)
        memory = twin.encode_pair(None, None, grid[:2], grid[2:])
        assert memory.dtype == (torch.bfloat16 if mir_bf16 else torch.float32)
        if not mir_bf16:  # MIR in fp32: fp32's memory to the bit from the bf16 grid's features
            assert torch.equal(memory, model.encode_pair(None, None, grid[:2].float(), grid[2:].float()))
        ids = twin.fdg.generate(memory, 12)
        assert torch.equal(ids, model.fdg.generate(memory.float(), 12))  # FDG in fp32: fp32's ids to the bit
        assert twin.generate_ids(images[:2], images[2:], 12).shape == (2, 12)
    # a lower threshold puts FDG's layers in bf16 (packed for oneDNN) while the small vocabulary stays fp32
    monkeypatch.setattr(onednn, "BF16_MIN_WEIGHT", 4 * dim * dim)
    mixed = inference_copy(model, "bf16")
    assert mixed is not twin and mixed.fdg.tok.weight.dtype == torch.float32
    assert part_precisions(model, "bf16") == want | {"decoder": "bf16"}
    step = mixed.fdg._packed_step[0]
    assert onednn.is_packed(step.qkv[0]) == onednn.linear_available() and not onednn.is_packed(step.vocab[0])
    with torch.inference_mode():
        assert mixed.fdg.generate(memory, 12).shape == (2, 12)


def test_check_precision():
    for precision in PRECISIONS:
        check_precision(precision, "cpu")
    with pytest.raises(ValueError, match="one of"):
        check_precision("fp8")
    with pytest.raises(ValueError, match="CPU only"):
        check_precision("int8", "cuda")


def test_folded_batchnorm_gives_the_same_grid(one_thread):
    torch.manual_seed(0)
    grid = GridEncoder("resnet18", 3).eval()
    bns = [m for m in grid.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for bn in bns:  # non-trivial statistics, as trained weights have
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-0.2, 0.2)
    images = torch.rand(2, 3, 64, 64)
    with torch.inference_mode():
        before = grid(images)
    folded = copy.deepcopy(grid)
    assert fold_batchnorm(folded) == len(bns)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    with torch.inference_mode():
        after = folded(images)
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4 * before.abs().max().item())
    conv = next(m for m in folded.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.skipif(not onednn.conv_available(), reason="this torch build has no oneDNN fused convolution kernels")
@pytest.mark.parametrize("arch", ["resnet18", "resnet26"])  # BasicBlock; Bottleneck with strided downsampling
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_bf16)])
def test_fused_grid_equals_the_folded_grid(one_thread, arch, dtype):
    """Every convolution of the folded grid runs fused (stem, blocks, downsampling) and the features are the
    module path's up to rounding, at a batch and an image size the weights were not reordered for."""
    torch.manual_seed(0)
    grid = GridEncoder(arch, 3).eval()
    fold_batchnorm(grid)
    for conv in (m for m in grid.modules() if isinstance(m, torch.nn.Conv2d)):
        conv.weight.data.mul_(3.0)  # timm's init keeps activations tiny; larger ones make errors visible
        conv.to(dtype)
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in grid.modules())
    fused = copy.deepcopy(grid)
    assert fuse_grid(fused) == convs
    assert not any(isinstance(m, (torch.nn.Conv2d, torch.nn.ReLU)) for m in fused.backbone.modules())
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=dtype == torch.bfloat16):
        for images in (torch.rand(3, 3, 64, 64), torch.rand(1, 3, 96, 128)):
            expected, got = grid(images), fused(images)
            assert got.dtype == expected.dtype and got.shape == expected.shape
            scale = expected.float().abs().max().item()
            assert scale > 1e-2
            tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: a rounding here and there, not a different net
            torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=tol * scale)


@pytest.mark.skipif(not onednn.conv_available(), reason="this torch build has no oneDNN fused convolution kernels")
def test_fused_conv_lays_out_its_weights_per_input_shape():
    """A layout per input shape met, the least recently used dropped past LAYOUTS; every one gives conv2d's result."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 16, 3, padding=1, bias=True).eval()
    fused = onednn.FusedConv(conv, relu=True)
    shapes = [(n, 8, 12, 12) for n in range(1, onednn.LAYOUTS + 2)]
    with torch.inference_mode():
        for shape in [shapes[0], *shapes[1:], shapes[0]]:
            x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(fused(x), torch.relu(conv(x)), rtol=1e-5, atol=1e-5)
        kept = list(fused.layouts)
        assert len(kept) == onednn.LAYOUTS and kept[-1] == shapes[0] and shapes[1] not in kept  # LRU order
        first = fused.layouts[shapes[0]]
        fused(torch.randn(shapes[0]).contiguous(memory_format=torch.channels_last))
        assert fused.layouts[shapes[0]] is first  # reused, not laid out again


@pytest.mark.skipif(
    not (onednn.conv_available() and onednn.linear_available()), reason="this torch build lacks oneDNN's kernels"
)
@needs_bf16
def test_first_bf16_call_builds_the_fused_copy(monkeypatch):
    """The oneDNN probes answer the same under autocast: a bf16 captioner's ``generate`` as a process's first
    low-precision call (probes not yet run, perhaps under a caller's autocast) gets the fused grid and the prepacked
    decoding step. (The probes once ran under the call's autocast, compared a bf16 reference with the fp32 kernel,
    and turned both paths off for the process.)"""
    monkeypatch.setattr(onednn, "_CONV_OK", None)
    monkeypatch.setattr(onednn, "_LINEAR_OK", None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert onednn.conv_available() and onednn.linear_available()
    monkeypatch.setattr(onednn, "_CONV_OK", None)
    monkeypatch.setattr(onednn, "_LINEAR_OK", None)
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", pretraining=False).eval()
    images = torch.rand(2, 3, 64, 64)
    namc.compile(model, "cpu", "bf16").generate_ids(images, images, max_new_tokens=2)
    twin = inference_copy(model, "bf16")
    assert any(isinstance(m, onednn.FusedBlock) for m in twin.grid.modules())
    assert twin.fdg._packed_step[0].vocab[0].is_mkldnn


@pytest.mark.slow  # the trained fixture
@needs_bf16
def test_bf16_without_onednn(trained, monkeypatch):
    """A torch build without oneDNN's kernels: the bf16 copy keeps the grid in fp32 (bf16 convolutions pay only
    through the fused kernels) and decodes with plain bf16 matrices, each part casting what it takes."""
    monkeypatch.setattr(onednn, "_CONV_OK", False)
    monkeypatch.setattr(onednn, "_LINEAR_OK", False)
    model, images_1, images_2 = trained
    model = copy.deepcopy(model)  # its own copy, built without the kernels
    assert part_precisions(model, "bf16") == {"grid": "fp32", "mir": "bf16", "decoder": "bf16", "vocabulary": "bf16"}
    twin = inference_copy(model, "bf16")
    assert not any(isinstance(m, onednn.FusedConv) for m in twin.grid.modules())
    assert not onednn.is_packed(twin.fdg.step_weights()[0].vocab[0])
    fp32 = model.generate(images_1, images_2)
    same = [a == b for a, b in zip(fp32, namc.compile(model, "cpu", "bf16").generate(images_1, images_2))]
    assert all(same[:PAIRS]) and sum(same) / len(same) >= MIN_IDENTICAL


@pytest.mark.slow  # the trained fixture
def test_bf16_on_a_cpu_without_onednn_bf16(trained, monkeypatch):
    """Where oneDNN has no bf16 (an AVX2-only CPU, where PyTorch's fallback kernels run bf16 several times slower
    than fp32, and oneDNN refuses bf16 reorders), the bf16 copy keeps every part in fp32, its grid folded and fused
    as int8's, says so once in a warning and in part_precisions, and writes fp32's captions; FusedFDG.pack_step("bf16")
    leaves bf16 matrices plain there. Run for real on such a CPU; elsewhere oneDNN's answer is overridden."""
    monkeypatch.setattr(onednn, "_BF16_OK", False)
    model, images_1, images_2 = trained
    model = copy.deepcopy(model)  # its own copy, built as on such a CPU
    with pytest.warns(RuntimeWarning, match="oneDNN has no bf16 on this CPU"):
        assert part_precisions(model, "bf16") == dict.fromkeys(PARTS, "fp32")
    twin = inference_copy(model, "bf16")
    assert {p.dtype for p in twin.parameters()} == {torch.float32}
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in twin.grid.modules())
    assert onednn.conv_available() is any(isinstance(m, onednn.FusedConv) for m in twin.grid.modules())
    fp32 = model.generate(images_1, images_2)
    same = [a == b for a, b in zip(fp32, namc.compile(model, "cpu", "bf16").generate(images_1, images_2))]
    assert all(same[:PAIRS]) and sum(same) / len(same) >= MIN_IDENTICAL
    fdg = fuse_decoder(copy.deepcopy(model.fdg).eval().to(torch.bfloat16))
    fdg.pack_step("bf16")
    assert not onednn.is_packed(fdg.step_weights()[0].vocab[0])


def test_fuse_grid_needs_a_folded_grid():
    with pytest.raises(ValueError, match="fold_batchnorm"):
        fuse_grid(GridEncoder("resnet18", 3).eval())


def test_fold_batchnorm_refuses_a_trainable_grid():
    grid = GridEncoder("resnet18", 3, frozen=False)
    with pytest.raises(ValueError, match="frozen"):
        fold_batchnorm(grid)


def _png(path, seed: int) -> str:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
    return str(path)


@pytest.mark.slow  # the trained fixture
@pytest.mark.parametrize("precision", ["bf16", "int8", "int8 static grid"])
def test_describe_precision_flag(trained, tmp_path, capsys, precision):
    model = trained[0]
    if precision == "int8 static grid":  # the folder carries the calibration: describe runs the static grid
        model = copy.deepcopy(model)
        calibrate_int8(model, [trained[1][:PAIRS], trained[2][:PAIRS]])
        precision = "int8"
    model.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / CALIBRATION_FILE).exists() == (int8_calibration(model) is not None)
    a, b = _png(tmp_path / "a.png", 1), _png(tmp_path / "b.png", 2)
    assert describe_main([a, b, "--model", str(tmp_path / "m")]) == 0
    fp32 = capsys.readouterr().out
    assert describe_main([a, b, "--model", str(tmp_path / "m"), "--precision", precision]) == 0
    assert capsys.readouterr().out == fp32 != ""


def test_the_torch_free_parsers_know_every_precision():
    """namc describe's and namc benchmark's options are parsed before torch loads, from their own copies of the list."""
    from namc import describe_cli
    from namc.eval.throughput import settings

    assert describe_cli.PRECISIONS == settings.PRECISIONS == PRECISIONS


def test_describe_rejects_an_unknown_precision(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        describe_main(["a.png", "b.png", "--model", str(tmp_path), "--precision", "fp8"])
    assert exit_info.value.code == 2
    assert "--precision" in capsys.readouterr().err


def test_the_int8_calibration_is_model_data(tmp_path):
    """The grid's int8 calibration is data the model carries (namc.models.calibration): the runtime sets it, the model
    saves and restores it as its weights, and it stops counting once the grid's weights change."""
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", pretraining=False).eval()
    assert model.grid_calibration is None and int8_calibration(model) is None
    calibrate_int8(model, [torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))])
    assert isinstance(model.grid_calibration, GridCalibration)
    peaks = model.grid_calibration.current(model.grid)
    assert peaks is not None and int8_calibration(model) == peaks
    loaded = namc.NAMC.from_pretrained(model.save_pretrained(tmp_path / "m"))
    assert loaded.grid_calibration.current(loaded.grid) == peaks
    assert "grid_calibration" not in "".join(loaded.state_dict())  # not a weight: checkpoints load as they did
    with torch.no_grad():
        next(loaded.grid.parameters()).add_(1.0)
    assert loaded.grid_calibration.current(loaded.grid) is None and int8_calibration(loaded) is None
    loaded.save_pretrained(tmp_path / "m")  # a stale calibration is not saved
    assert not (tmp_path / "m" / CALIBRATION_FILE).exists()
