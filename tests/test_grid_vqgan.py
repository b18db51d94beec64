"""Frozen pretrained parts: the ResNet grid encoder and the VQGAN tokenizer, loaded from official-layout checkpoints."""

from __future__ import annotations

import copy

import pytest
import timm
import torch
import torchvision
from taming.modules.diffusionmodules.model import Decoder, Encoder
from taming.modules.discriminator.model import NLayerDiscriminator
from taming.modules.vqvae.quantize import VectorQuantizer2
from torch import nn

import namc.models.vqgan as vqgan_module
from namc.models.grid import IMAGENET_MEAN, IMAGENET_STD, GridEncoder
from namc.models.io import WeightsError, save_safetensors
from namc.models.vqgan import VQGAN_F16_1024, VQGAN_F16_16384, VQGAN_TINY_F8_64, VQGANTokenizer

# ------------------------------------------------------------------------------------------------------ grid encoder


# A ResNet with one BasicBlock per stage keeps the tests fast; key layout and code paths are those of any ResNet.
_LAYERS = [1, 1, 1, 1]


def _torchvision_resnet() -> nn.Module:
    """A torchvision ResNet with random weights AND non-trivial BatchNorm statistics (so loading them matters)."""
    torch.manual_seed(0)
    model = torchvision.models.ResNet(torchvision.models.resnet.BasicBlock, _LAYERS).eval()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.uniform_(0.5, 1.5)
    return model


def _torchvision_stage(model: nn.Module, images: torch.Tensor, stage: int) -> torch.Tensor:
    """Reference: torchvision's own forward up to layer{stage}, with ImageNet normalisation. (B, C, h, w)."""
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    x = model.maxpool(model.relu(model.bn1(model.conv1((images - mean) / std))))
    for i in range(1, stage + 1):
        x = getattr(model, f"layer{i}")(x)
    return x


@pytest.mark.parametrize("out_index", [2, 3])
def test_grid_from_torchvision_checkpoint_matches_torchvision_features(tmp_path, out_index):
    source = _torchvision_resnet()
    path = tmp_path / "resnet18-tv.pth"
    torch.save(source.state_dict(), path)  # torchvision layout, includes layer4.* and fc.* (pruned: ignored)

    grid = GridEncoder("resnet18", out_index=out_index, pretrained=str(path), model_kwargs=dict(layers=_LAYERS))
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        expected = _torchvision_stage(source, images, out_index)  # (B, C, h, w)
    B, C, h, w = expected.shape
    out = grid(images)
    assert out.shape == (B, h * w, C) == (2, (64 // grid.stride) ** 2, grid.out_channels)
    torch.testing.assert_close(out, expected.permute(0, 2, 3, 1).reshape(B, h * w, C))  # row-major cells


def test_grid_from_timm_safetensors_without_batchnorm_counters(tmp_path):
    # timm layout (same key names), as safetensors, without the num_batches_tracked counters that pre-0.4
    # checkpoints (torchvision's original ResNet-101 file, timm's tv_in1k copy) lack.
    torch.manual_seed(1)
    source = timm.create_model("resnet18", pretrained=False, layers=_LAYERS).eval()
    sd = {k: v for k, v in source.state_dict().items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "model.safetensors"
    save_safetensors(sd, path)
    grid = GridEncoder("resnet18", out_index=2, pretrained=path, model_kwargs=dict(layers=_LAYERS))
    for name, tensor in grid.backbone.state_dict().items():
        if not name.endswith("num_batches_tracked"):
            assert torch.equal(tensor, sd[name]), name


def test_grid_checkpoint_errors_name_the_key(tmp_path):
    sd = _torchvision_resnet().state_dict()
    cases = {
        "missing": (
            {k: v for k, v in sd.items() if k != "layer1.0.conv1.weight"},
            "missing 1 key: layer1.0.conv1.weight",
        ),
        "shape": (sd | {"bn1.weight": torch.ones(3)}, r"bn1.weight \(checkpoint \(3,\), model \(64,\)\)"),
        "unknown": (sd | {"layer2.0.extra.weight": torch.ones(1)}, "unexpected 1 key: layer2.0.extra.weight"),
    }
    for name, (broken, message) in cases.items():
        path = tmp_path / f"{name}.pth"
        torch.save(broken, path)
        with pytest.raises(WeightsError, match=message) as err:
            GridEncoder("resnet18", out_index=2, pretrained=path, model_kwargs=dict(layers=_LAYERS))
        assert str(path) in str(err.value)
    with pytest.raises(FileNotFoundError, match="ImageNet weights for the resnet18 grid encoder"):
        GridEncoder("resnet18", out_index=2, pretrained=tmp_path / "absent.pth")


def test_frozen_grid_gets_no_gradient_and_stays_in_eval():
    parent = nn.ModuleDict({"grid": GridEncoder("resnet18", out_index=2), "head": nn.Linear(128, 1)})
    parent.train()
    grid = parent["grid"]
    assert not grid.training and not any(m.training for m in grid.modules())
    assert parent["head"].training
    assert not any(p.requires_grad for p in grid.parameters())
    stats = grid.backbone.bn1.running_mean.clone()
    images = torch.rand(2, 3, 64, 64, requires_grad=True)
    out = grid(images)
    assert not out.requires_grad  # computed under no_grad: no graph, no gradient to the images either
    parent["head"](out).sum().backward()
    assert images.grad is None and all(p.grad is None for p in grid.parameters())
    assert torch.equal(grid.backbone.bn1.running_mean, stats)  # BatchNorm statistics untouched


def test_unfrozen_grid_trains():
    grid = GridEncoder("resnet18", out_index=1, frozen=False)
    grid.train()
    assert grid.training and all(p.requires_grad for p in grid.parameters())
    grid(torch.rand(2, 3, 32, 32)).sum().backward()
    assert grid.backbone.conv1.weight.grad is not None


def test_grid_shapes_and_input_checks():
    grid = GridEncoder("resnet18", out_index=2)
    assert (grid.out_channels, grid.stride, grid.grid_size(64)) == (128, 8, 8)
    assert grid.backbone.conv1.weight.is_contiguous(memory_format=torch.channels_last)  # oneDNN's fast layout
    assert state_keys_have_no_constants(grid)
    with pytest.raises(ValueError, match="multiple of the grid stride 8"):
        grid(torch.rand(1, 3, 60, 64))
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        grid(torch.rand(1, 1, 64, 64))
    with pytest.raises(ValueError, match="multiple"):
        grid.grid_size(100)


def state_keys_have_no_constants(module: nn.Module) -> bool:
    """The normalisation constants are non-persistent buffers: not weights, not in checkpoints."""
    return not any(k in ("mean", "std") for k in module.state_dict())


def test_paper_grid_is_14x14x1024_at_224():
    # DESIGN section 1: ResNet-101 layer3 at 224 px gives the 14 x 14 x 1024 grid. Shapes only: on the meta device.
    with torch.device("meta"):
        grid = GridEncoder("resnet101", out_index=3)
        out = grid(torch.empty(2, 3, 224, 224))
    assert out.shape == (2, 196, 1024) and grid.grid_size(224) == 14


# ----------------------------------------------------------------------------------------------------- VQGAN


def _taming_last_ckpt(config: dict) -> dict:
    """A random checkpoint with the structure of taming-transformers' official `last.ckpt` (Lightning 1.0)."""
    torch.manual_seed(0)
    ddconfig = config["ddconfig"]
    parts = {
        "encoder": Encoder(**ddconfig),
        "decoder": Decoder(**ddconfig),
        "quantize": VectorQuantizer2(config["n_embed"], config["embed_dim"], beta=0.25),
        "quant_conv": nn.Conv2d(ddconfig["z_channels"], config["embed_dim"], 1),
        "post_quant_conv": nn.Conv2d(config["embed_dim"], ddconfig["z_channels"], 1),
        "loss.discriminator": NLayerDiscriminator(input_nc=3, n_layers=1, ndf=8),
    }
    # random codebook of the latent's scale, so that many different codes are in use
    parts["quantize"].embedding.weight.data.normal_()
    state_dict = {f"{prefix}.{k}": v for prefix, module in parts.items() for k, v in module.state_dict().items()}
    return {
        "epoch": 7,
        "global_step": 0,
        "pytorch-lightning_version": "1.0.8",
        "state_dict": state_dict,
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 4.5e-6, "betas": (0.5, 0.9), "params": [0, 1]}]}],
        "lr_schedulers": [],
        "callbacks": {},
    }


@pytest.fixture(scope="module")
def tiny_ckpt() -> dict:
    return _taming_last_ckpt(VQGAN_TINY_F8_64)


def test_vqgan_from_taming_last_ckpt_equals_direct_computation(tmp_path, tiny_ckpt, monkeypatch):
    path = tmp_path / "last.ckpt"
    torch.save(tiny_ckpt, path)
    tokenizer = VQGANTokenizer(**VQGAN_TINY_F8_64, pretrained=str(path))
    images = torch.rand(3, 3, 64, 64)
    codes = tokenizer(images)

    # direct computation from the checkpoint tensors: taming Encoder -> quant_conv -> nearest codebook entry
    sd = tiny_ckpt["state_dict"]
    encoder = Encoder(**VQGAN_TINY_F8_64["ddconfig"]).eval()
    encoder.load_state_dict({k[len("encoder.") :]: v for k, v in sd.items() if k.startswith("encoder.")})
    with torch.no_grad():
        h = encoder(images * 2 - 1)  # taming VQGANs take [-1, 1]
        z = nn.functional.conv2d(h, sd["quant_conv.weight"], sd["quant_conv.bias"])  # (B, D, h, w)
    B, D, gh, gw = z.shape
    z = z.permute(0, 2, 3, 1).reshape(B, gh * gw, D)  # row-major cells
    codebook = sd["quantize.embedding.weight"]  # (V, D)
    expected = torch.cdist(z, codebook.expand(B, -1, -1)).argmin(-1)  # (B, N)

    assert codes.dtype == torch.int64 and codes.shape == (3, 64)
    assert torch.equal(codes, expected)
    assert codes.unique().numel() > 5  # a meaningful comparison, not one constant code
    monkeypatch.setattr(vqgan_module, "_MAX_SEARCH_VECTORS", 100)  # search one image (64 codes) at a time
    assert torch.equal(tokenizer(images), expected)


def test_vqgan_checkpoint_errors(tmp_path, tiny_ckpt):
    sd = tiny_ckpt["state_dict"]
    cases = {
        "missing": ({k: v for k, v in sd.items() if k != "quantize.embedding.weight"}, "missing 1 key: quantize"),
        "unknown": (sd | {"quantize.used": torch.arange(4)}, "unexpected 1 key: quantize.used"),
    }
    for name, (broken, message) in cases.items():
        path = tmp_path / f"{name}.ckpt"
        torch.save({**tiny_ckpt, "state_dict": broken}, path)
        with pytest.raises(WeightsError, match=message):
            VQGANTokenizer(**VQGAN_TINY_F8_64, pretrained=path)
    path = tmp_path / "ok.ckpt"
    torch.save(tiny_ckpt, path)
    wrong = copy.deepcopy(VQGAN_TINY_F8_64) | {"n_embed": 32}
    with pytest.raises(WeightsError, match=r"quantize.embedding.weight \(checkpoint \(64, 32\), model \(32, 32\)\)"):
        VQGANTokenizer(**wrong, pretrained=path)


def test_vqgan_is_frozen_and_in_eval():
    parent = nn.ModuleDict({"vq": VQGANTokenizer(**VQGAN_TINY_F8_64)})
    parent.train()
    vq = parent["vq"]
    assert not any(m.training for m in vq.modules())
    assert not any(p.requires_grad for p in vq.parameters())
    images = torch.rand(1, 3, 64, 64, requires_grad=True)
    assert not vq(images).requires_grad


def test_vqgan_config_checks():
    assert (VQGANTokenizer(**VQGAN_TINY_F8_64).downsample, VQGANTokenizer(**VQGAN_TINY_F8_64).grid_size(64)) == (8, 8)
    bad = copy.deepcopy(VQGAN_TINY_F8_64)
    bad["ddconfig"]["ch"] = 48  # taming's GroupNorm(32)
    with pytest.raises(ValueError, match="multiples of 32"):
        VQGANTokenizer(**bad)
    with pytest.raises(ValueError, match="multiple of the VQGAN factor 8"):
        VQGANTokenizer(**VQGAN_TINY_F8_64)(torch.rand(1, 3, 60, 64))


@pytest.mark.parametrize("config, codes", [(VQGAN_F16_16384, 16384), (VQGAN_F16_1024, 1024)])
def test_paper_vqgan_gives_196_codes_at_224(config, codes):
    # DESIGN section 1: VQGAN f16 at 224 px -> 14 x 14 = 196 codes. Shapes only: on the meta device.
    with torch.device("meta"):
        tokenizer = VQGANTokenizer(**config)
        out = tokenizer(torch.empty(2, 3, 224, 224))
    assert out.shape == (2, 196) and tokenizer.downsample == 16 and tokenizer.codebook_size == codes
    # the official checkpoint's encoder keys: attention at the 16 x 16 level (attn_resolutions [16])
    assert "encoder.down.4.attn.1.q.weight" in tokenizer.state_dict()


def test_vqgan_codes_ignore_a_callers_autocast(tmp_path, tiny_ckpt):
    # MIR's targets: bf16-mixed training tokenizes images inside autocast, where a bf16 encoder and bf16 distances
    # would pick other codes than the fp32 ones `namc data precompute` stores (6 of these 1,024)
    path = tmp_path / "last.ckpt"
    torch.save(tiny_ckpt, path)
    tokenizer = VQGANTokenizer(**VQGAN_TINY_F8_64, pretrained=str(path))
    images = torch.rand(16, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", torch.bfloat16):
        mixed = tokenizer(images)
    assert torch.equal(mixed, tokenizer(images))
    assert torch.equal(tokenizer(images.double()), tokenizer(images))  # images in any float dtype
