"""The strict weights loader (namc.models.io); the OpenAI CLIP conversion is tests/test_convert_clip.py."""

from __future__ import annotations

import argparse

import pytest
import torch
from torch import nn

from namc.models.io import WeightsError, clean_state_dict, load_state_dict, load_strict, save_safetensors


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))


# ---------------------------------------------------------------------------------------------------------- cleaning


def test_clean_state_dict_unwraps_lightning_and_strips_prefixes():
    a, b = torch.zeros(1), torch.ones(2)
    assert clean_state_dict({"state_dict": {"module.x.weight": a, "module.y": b}, "epoch": 3}) == {
        "x.weight": a,
        "y": b,
    }
    # stacked wrappers: torch.compile around DDP
    assert set(clean_state_dict({"_orig_mod.module.x": a, "_orig_mod.module.y": b})) == {"x", "y"}
    # a prefix on only some keys is a real submodule name and stays
    assert set(clean_state_dict({"model.x": a, "head.y": b})) == {"model.x", "head.y"}


def test_clean_state_dict_rejects_non_tensor_entries():
    with pytest.raises(WeightsError, match="non-tensor entries: 1 key: lr"):
        clean_state_dict({"w": torch.zeros(1), "lr": 0.1}, source="opt.pt")
    with pytest.raises(WeightsError, match="holds a list"):
        clean_state_dict([torch.zeros(1)], source="list.pt")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------- reading files


def test_safetensors_round_trip_with_shared_and_strided_tensors(tmp_path):
    w = torch.randn(4, 4)
    path = tmp_path / "tied.safetensors"
    save_safetensors({"a": w, "tied": w, "slice": w[1:], "transposed": w.t()}, path, metadata={"k": "v"})
    loaded = load_state_dict(path)
    assert torch.equal(loaded["a"], w) and torch.equal(loaded["tied"], w)
    assert torch.equal(loaded["slice"], w[1:]) and torch.equal(loaded["transposed"], w.t())


def test_torch_save_state_dict_under_ddp_prefix(tmp_path):
    net = _net()
    path = tmp_path / "ddp.pth"
    torch.save({f"module.{k}": v for k, v in net.state_dict().items()}, path)
    target = _net()
    target[0].weight.data.zero_()
    load_strict(target, load_state_dict(path), what="net")
    assert torch.equal(target[0].weight, net[0].weight)


def test_legacy_lightning_checkpoint_with_callback_class_key_loads_safely(tmp_path):
    # Lightning 1.0 (taming's official VQGAN checkpoints) keyed callback states by the callback *class*; the safe
    # unpickler refuses such a GLOBAL unless allow-listed. Build that exact structure with the real class.
    pl_callbacks = pytest.importorskip("pytorch_lightning.callbacks")
    net = _net()
    ckpt = {
        "epoch": 4,
        "global_step": 1000,
        "pytorch-lightning_version": "1.0.8",
        "callbacks": {pl_callbacks.ModelCheckpoint: {"best_model_score": torch.tensor(0.1), "best_model_path": "x"}},
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 1e-4, "betas": (0.5, 0.9), "params": [0]}]}],
        "lr_schedulers": [],
        "state_dict": net.state_dict(),
    }
    path = tmp_path / "last.ckpt"
    torch.save(ckpt, path)
    with pytest.raises(Exception, match="ModelCheckpoint"):  # plain weights_only really refuses it
        torch.load(path, weights_only=True)
    assert load_state_dict(path).keys() == net.state_dict().keys()


def test_pickle_needing_other_objects_names_file_object_and_extraction(tmp_path):
    path = tmp_path / "with_hparams.ckpt"
    torch.save({"state_dict": _net().state_dict(), "hparams": argparse.Namespace(lr=1)}, path)
    with pytest.raises(WeightsError) as err:
        load_state_dict(path)
    message = str(err.value)
    assert str(path) in message and "argparse.Namespace" in message
    assert "save_safetensors" in message and str(tmp_path / "with_hparams.safetensors") in message


@pytest.mark.parametrize(
    "name, content",
    [
        ("garbage.pth", b"not a checkpoint at all" * 4),
        ("garbage.safetensors", b"\xff" * 64),
        ("empty.bin", b""),
    ],
)
def test_corrupt_file_raises_weights_error_naming_it(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(WeightsError, match="cannot read checkpoint") as err:
        load_state_dict(path)
    assert str(path) in str(err.value)
    assert "weights_only=False" not in str(err.value)  # never advise unsafe loading of a corrupt file


def test_truncated_checkpoint_raises_weights_error(tmp_path):
    good = tmp_path / "good.pth"
    torch.save(_net().state_dict(), good)
    bad = tmp_path / "truncated.pth"
    bad.write_bytes(good.read_bytes()[:200])
    with pytest.raises(WeightsError, match="truncated.pth"):
        load_state_dict(bad)


@pytest.mark.filterwarnings("ignore:.*torch.jit.*:FutureWarning")
def test_torchscript_archive_points_to_the_converter(tmp_path):
    path = tmp_path / "scripted.pt"
    torch.jit.trace(nn.Linear(2, 2), torch.zeros(1, 2)).save(str(path))
    with pytest.raises(WeightsError, match="TorchScript") as err:
        load_state_dict(path)
    assert "namc convert-clip" in str(err.value) and str(path) in str(err.value)


def test_missing_file_message_has_hint_and_location(tmp_path):
    path = tmp_path / "nowhere" / "resnet101.pth"
    with pytest.raises(FileNotFoundError) as err:
        load_state_dict(path, hint="ImageNet ResNet-101 weights (torchvision resnet101-63fe2227.pth)")
    assert "resnet101-63fe2227.pth" in str(err.value) and str(path) in str(err.value)


# ------------------------------------------------------------------------------------------------------ load_strict


def test_load_strict_names_missing_key_and_leaves_module_untouched():
    sd = _net().state_dict()
    del sd["0.weight"]
    target = _net()
    before = target[0].bias.clone()
    target[0].bias.data.zero_()
    with pytest.raises(WeightsError, match=r"cannot load toy net from x\.pth: missing 1 key: 0\.weight"):
        load_strict(target, sd, what="toy net from x.pth")
    assert torch.count_nonzero(target[0].bias) == 0 and torch.count_nonzero(before) > 0  # nothing was loaded


def test_load_strict_names_unexpected_and_mis_shaped_keys():
    sd = _net().state_dict()
    sd["3.weight"] = torch.zeros(5, 4)
    sd["extra.weight"] = torch.zeros(1)
    with pytest.raises(WeightsError) as err:
        load_strict(_net(), sd, what="toy")
    message = str(err.value)
    assert "unexpected 1 key: extra.weight" in message
    assert "3.weight (checkpoint (5, 4), model (2, 4))" in message
    load_strict(
        _net(),
        {k: v for k, v in sd.items() if k != "3.weight"} | {"3.weight": torch.zeros(2, 4)},
        what="x",
        ignore_unexpected=lambda k: k.startswith("extra."),
    )


def test_load_strict_lists_first_keys_and_the_count():
    with pytest.raises(WeightsError, match=r"missing 20 keys: .* and 12 more"):
        load_strict(nn.Sequential(*[nn.Linear(1, 1) for _ in range(10)]), {}, what="stack")


def test_load_strict_accepts_pre_0_4_batchnorm_without_counter():
    sd = {k: v for k, v in _net().state_dict().items() if not k.endswith("num_batches_tracked")}
    load_strict(_net(), sd, what="old torchvision-style checkpoint")
    with pytest.raises(WeightsError, match="1.running_var"):  # but a real BatchNorm buffer is still required
        load_strict(_net(), {k: v for k, v in sd.items() if k != "1.running_var"}, what="x")
