"""Golden artefacts kept fixed in the repository (tests/data/golden, written once by make_golden.py): a namc_tiny
saved by ``save_pretrained`` and a Lightning pre-training checkpoint must still load strictly, decode the same ids,
give the same E_MIR and the same pre-training losses on the same batch and masks, so that files saved by earlier
versions of namc keep working."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import namc
from namc.lit import PretrainModule
from namc.models import load_model
from namc.objectives import pretrain_step

GOLDEN = Path(__file__).parent / "data" / "golden"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(123)
    return torch.rand(3, 3, 64, 64, generator=g), torch.rand(3, 3, 64, 64, generator=g)


def test_saved_model_loads_strictly_and_decodes_the_recorded_ids() -> None:
    model = namc.from_pretrained(GOLDEN / "namc_tiny")
    x1, x2 = _inputs()
    assert model.generate_ids(x1, x2).tolist() == EXPECTED["ids"]
    assert model.generate(x1, x2) == EXPECTED["captions"]
    batch = load_file(str(GOLDEN / "pretrain_batch.safetensors"))
    assert model.generate_ids(batch["image1"], batch["image2"]).tolist() == EXPECTED["batch_ids"]
    assert model.num_parameters() == EXPECTED["num_parameters"]
    with torch.no_grad():
        memory = model.encode_pair(x1, x2).double()
    assert float(memory.sum()) == pytest.approx(EXPECTED["memory_sum"], rel=1e-5)
    assert float(memory.abs().sum()) == pytest.approx(EXPECTED["memory_abs_sum"], rel=1e-5)


def test_lightning_checkpoint_loads_strictly_and_decodes_the_recorded_ids() -> None:
    model = load_model(GOLDEN / "pretrain.ckpt").eval()
    x1, x2 = _inputs()
    assert model.generate_ids(x1, x2).tolist() == EXPECTED["ckpt_ids"]
    with torch.no_grad():
        memory = model.encode_pair(x1, x2).double()
    assert float(memory.sum()) == pytest.approx(EXPECTED["ckpt_memory_sum"], rel=1e-5)
    # the LightningModule itself restores from the checkpoint too (hyper-parameters + strict state dict)
    module = PretrainModule.load_from_checkpoint(GOLDEN / "pretrain.ckpt", weights_only=True)
    assert module.model.config == model.config


def test_pretraining_step_gives_the_recorded_losses() -> None:
    model = load_model(GOLDEN / "pretrain.ckpt").train()
    batch = load_file(str(GOLDEN / "pretrain_batch.safetensors"))
    torch.manual_seed(0)
    with torch.no_grad():
        losses = pretrain_step(model, batch, generator=torch.Generator().manual_seed(7))
    for key, value in EXPECTED["losses"].items():
        assert float(losses[key]) == pytest.approx(value, rel=1e-5), key
