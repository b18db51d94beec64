"""M3Diff's MDP block as a MIR fusion (``fusion: mdp``): its equations (OmniDiff paper, Eqs. 1-8), forward and
backward inside NAMC (fine-tuning and pre-training), a strict save/load round trip, and the default that stays the
paper's concat + FC."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from test_extensions import TINY, _pair_batch  # the same tiny model and fine-tuning batch as the fusion registry's

import namc
from namc.data.collate import PretrainCollator
from namc.models import create_fusion, list_fusions
from namc.models.fusion import ConcatFusion, MDPFusion
from namc.models.io import WeightsError
from namc.models.mir import MIR, MIRConfig
from namc.objectives import finetune_step, pretrain_step


def test_the_default_stays_concat_and_the_preset_uses_mdp() -> None:
    assert "mdp" in list_fusions()
    assert namc.model_config("namc_base").fusion == "concat"
    assert namc.model_config("namc_base_mdp").fusion == "mdp"
    assert isinstance(namc.create_model("namc_tiny", **TINY).mir.fuse, ConcatFusion)
    assert isinstance(namc.create_model("namc_tiny", fusion="mdp", **TINY).mir.fuse, MDPFusion)


def test_one_scale_follows_eqs_1_to_6() -> None:
    torch.manual_seed(0)
    D = 16
    mdp = create_fusion("mdp", D).eval()
    f1, f2 = torch.randn(2, 5, D), torch.randn(2, 5, D)
    t1, t2, delta = mdp.perceive(f1, f2)
    lam1 = torch.sigmoid(F.linear(torch.cat([f1, f2], -1), mdp.gate.weight, mdp.gate.bias))  # Eq. 1
    lam2 = torch.sigmoid(F.linear(torch.cat([f2, f1], -1), mdp.gate.weight, mdp.gate.bias))
    g1, g2 = f1 * lam1, f2 * lam2  # Eq. 2
    expected = F.linear(torch.cat([g1, g2, g1 - g2], -1), mdp.diff.weight, mdp.diff.bias)  # Eq. 3
    torch.testing.assert_close(delta, expected)
    # Eq. 5's keys/values are the token set [F_1 ; F_2 ; dF_sa]: a pair only sees its own tokens
    other = torch.randn(2, 5, D)
    s1, s2, _ = mdp.perceive(torch.cat([f1[:1], other[:1]]), torch.cat([f2[:1], other[1:]]))
    torch.testing.assert_close(s1[:1], t1[:1])
    torch.testing.assert_close(s2[:1], t2[:1])
    # identical streams: the gates agree, so the difference term of Eq. 3 vanishes
    _, _, same = mdp.perceive(f1, f1)
    g = f1 * torch.sigmoid(F.linear(torch.cat([f1, f1], -1), mdp.gate.weight, mdp.gate.bias))
    torch.testing.assert_close(
        same, F.linear(torch.cat([g, g, torch.zeros_like(g)], -1), mdp.diff.weight, mdp.diff.bias)
    )


@torch.no_grad()
def test_scales_are_summed_with_sigmoid_scores_eqs_7_8() -> None:
    torch.manual_seed(0)
    D = 16
    mdp = create_fusion("mdp", D).eval()
    layers = [(torch.randn(2, 5, D), torch.randn(2, 5, D)) for _ in range(3)]
    x1, x2 = torch.randn(2, 5, D), torch.randn(2, 5, D)
    out = mdp(x1, x2, layers=layers)
    assert out.shape == (2, 5, D)
    scales = [(mdp.ln_scale(a), mdp.ln_scale(b)) for a, b in layers[:-1]] + [(x1, x2)]  # the last scale is MIR's out
    s1 = s2 = 0
    for f1, f2 in scales:
        t1, t2, delta = mdp.perceive(f1, f2)
        score = torch.sigmoid(mdp.score(torch.cat([t1, t2, delta], -1).mean(1))).unsqueeze(1)  # (B, 1, D), Eq. 7
        assert 0 < float(score.min()) and float(score.max()) < 1
        s1, s2 = s1 + score * t1, s2 + score * t2  # Eq. 8
    torch.testing.assert_close(out, F.linear(torch.cat([s1, s2], -1), mdp.out.weight, mdp.out.bias))
    # a shallower scale changes the output; the last layer's pre-LN state is not used (MIR's output stands for it)
    assert not torch.allclose(mdp(x1, x2, layers=[(layers[1][0] + 1, layers[1][1]), *layers[1:]]), out)
    torch.testing.assert_close(mdp(x1, x2, layers=[*layers[:2], (layers[2][0] + 1, layers[2][1])]), out)
    # one MIR layer: MIR's output is the only scale
    assert mdp(x1, x2, layers=[layers[0]]).shape == (2, 5, D)


@pytest.mark.parametrize("mir_layers", [1, 3])
def test_mdp_trains_inside_namc_and_every_parameter_gets_a_gradient(mir_layers: int) -> None:
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", fusion="mdp", mir_layers=mir_layers, **TINY)
    loss = finetune_step(model, _pair_batch(model, 3))["loss"]
    assert torch.isfinite(loss)
    loss.backward()
    unused = {"ln_scale.weight", "ln_scale.bias"} if mir_layers == 1 else set()  # no shallower scale to normalise
    for name, p in model.mir.fuse.named_parameters():
        if name in unused:
            assert p.grad is None, name
        else:
            assert p.grad is not None and p.grad.abs().sum() > 0, name  # DDP needs every parameter used


def test_mdp_pretraining_step_runs_with_masked_mir() -> None:
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", fusion="mdp", dim=32, heads=2)
    items = [
        {
            "id": str(i),
            "image1": torch.rand(3, 64, 64),
            "image2": torch.rand(3, 64, 64),
            "verb1": "shows",
            "desc1": "a small red metal cube",
            "verb2": "shows",
            "desc2": "a large blue rubber sphere",
            "noise1": [0] * 5,
            "noise2": [0] * 5,
        }
        for i in range(2)
    ]
    batch = PretrainCollator(model.tokenizer, max_text_len=48, max_caption_len=64)(items)
    out = pretrain_step(model, batch, generator=torch.Generator().manual_seed(0))
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and model.mir.fuse.gate.weight.grad.abs().sum() > 0


def test_mdp_saves_and_loads_strictly(tmp_path) -> None:
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", fusion="mdp", **TINY).eval()
    batch = _pair_batch(model, 3)
    ids = model.generate_ids(batch["image1"], batch["image2"], max_new_tokens=6)
    folder = model.save_pretrained(tmp_path / "m")
    again = namc.from_pretrained(folder)
    assert again.config.fusion == "mdp" and isinstance(again.mir.fuse, MDPFusion)
    assert torch.equal(again.generate_ids(batch["image1"], batch["image2"], max_new_tokens=6), ids)
    assert {"mir.fuse.gate.weight", "mir.fuse.diff.weight", "mir.fuse.out.weight"} <= set(again.state_dict())
    # the same weights under a concat config are refused, naming the keys
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "fusion": "concat"}))
    with pytest.raises(WeightsError, match=r"unexpected .*mir\.fuse\.(gate|diff|diff_layer|fuse_back|ln_scale|score)"):
        namc.from_pretrained(folder)


def test_namc_base_mdp_mir_builds_at_the_papers_size() -> None:
    config = MIRConfig(in_channels=1024, num_positions=196, dim=768, heads=12, layers=2, fusion="mdp")
    mir = MIR(config)
    heads = mir.fuse.diff_layer.self_attn.heads
    assert heads == 12 and mir.fuse.fuse_back.attn.heads == 12  # 64-wide heads, like MIR's
