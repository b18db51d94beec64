"""namc.eval.analysis: the VQGAN decoder half loaded from a taming-layout checkpoint, PSNR / SSIM of masked patches
on constructed images, Table 9's code path on namc_tiny, and the relevance / co-attention figure."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from namc.eval.analysis import VQGANDecoder, mir_codes, pair_batch, pair_maps, patch_metrics, plot_pair
from namc.eval.analysis import cli as analysis_cli
from namc.eval.analysis.reconstruction import reconstruction_table
from namc.models import create_model
from namc.models.files import WeightsError
from namc.models.vqgan import VQGAN_TINY_F8_64, VQGANTokenizer

DESCRIPTION = (
    "The difference between the two images is that the first image shows a small red metal cube, while the second "
    "image shows a large blue rubber sphere."
)


@pytest.fixture(scope="module")
def taming_ckpt(tmp_path_factory):
    """A random tiny VQGAN in taming's ``last.ckpt`` layout: encoder and decoder halves, plus a loss entry."""
    torch.manual_seed(0)
    enc = VQGANTokenizer(**VQGAN_TINY_F8_64)
    dec = VQGANDecoder(**VQGAN_TINY_F8_64)
    state = {**enc.state_dict(), **dec.state_dict(), "loss.logvar": torch.zeros(())}
    path = tmp_path_factory.mktemp("vqgan") / "last.ckpt"
    torch.save({"state_dict": state, "global_step": 1}, path)
    return path, state


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return create_model("namc_tiny").eval()


def test_decoder_loads_the_decoder_half_strictly(taming_ckpt, tmp_path):
    path, state = taming_ckpt
    dec = VQGANDecoder(**VQGAN_TINY_F8_64, pretrained=path)
    assert torch.equal(dec.quantize.embedding.weight, state["quantize.embedding.weight"])
    images = dec(torch.randint(0, 64, (2, 64)))
    assert images.shape == (2, 3, 64, 64) and 0 <= images.min() and images.max() <= 1
    broken = {k: v for k, v in state.items() if k != "post_quant_conv.weight"}
    torch.save({"state_dict": broken}, tmp_path / "broken.ckpt")
    with pytest.raises(WeightsError, match="post_quant_conv.weight"):
        VQGANDecoder(**VQGAN_TINY_F8_64, pretrained=tmp_path / "broken.ckpt")


def test_patch_metrics_on_constructed_images():
    g = torch.Generator().manual_seed(0)
    ref = 0.2 + 0.6 * torch.rand(1, 3, 16, 16, generator=g)
    mask = torch.tensor([[True, False, False, True]])  # 2 x 2 cells of 8 x 8 pixels
    same = patch_metrics(ref, ref, mask, 8)
    assert same == {"psnr": 100.0, "ssim": pytest.approx(1.0), "patches": 2, "identical": 2}
    shifted = patch_metrics(ref + 0.1, ref, mask, 8)  # MSE 0.01 -> PSNR 10 log10(1 / 0.01) = 20 dB
    assert shifted["psnr"] == pytest.approx(20.0, abs=1e-4) and shifted["ssim"] < 1.0 and shifted["identical"] == 0
    # only masked patches count: a change in an unmasked cell changes nothing
    other = ref.clone()
    other[..., :8, 8:] = 0.0
    assert patch_metrics(other, ref, mask, 8)["psnr"] == 100.0
    assert math.isnan(patch_metrics(ref, ref, torch.zeros(1, 4, dtype=torch.bool), 8)["psnr"])


def _pair(tmp_path):
    rng = np.random.default_rng(0)
    paths = []
    for k in range(2):
        p = tmp_path / f"{k}.png"
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(p)
        paths.append(p)
    return paths


def test_table9_code_path_on_namc_tiny(tiny, tmp_path):
    a, b = _pair(tmp_path)
    batch = pair_batch(tiny, a, b, DESCRIPTION, tiny.nim.context_length)
    out = mir_codes(tiny, batch, torch.Generator().manual_seed(0))
    assert out["mir"].shape == out["vqgan"].shape == out["mask"].shape == (2, 64)
    assert torch.equal(out["mir"][~out["mask"]], out["vqgan"][~out["mask"]])  # MIR only fills the masked cells
    c = tiny.config
    decoder = VQGANDecoder(c.vqgan_ddconfig, c.vqgan_n_embed, c.vqgan_embed_dim)
    table = reconstruction_table(decoder, out["images"], out["vqgan"], out["mir"], out["mask"])
    assert list(table) == ["mir_vs_vqgan", "vqgan_vs_raw", "mir_vs_raw"]
    assert all(m["patches"] == int(out["mask"].sum()) for m in table.values())


def test_relevance_figure_and_coattention(tiny, tmp_path):
    a, b = _pair(tmp_path)
    batch = pair_batch(tiny, a, b, DESCRIPTION, tiny.nim.context_length)
    maps = pair_maps(tiny, batch)
    assert [h.shape for h in maps["heat"]] == [(8, 8), (8, 8)]
    assert maps["words"][0] == ["a", "small", "red", "metal", "cube"] and len(maps["relevance"][0]) == 5
    for m in maps["coattention"]:  # the mean of softmax rows: a distribution over the other image's cells
        assert float(m.sum()) == pytest.approx(1.0, abs=1e-4)
    png = plot_pair(maps, [batch["image1"][0], batch["image2"][0]], tmp_path / "fig.png")
    assert png.stat().st_size > 10_000


def test_cli_errors_are_one_line(tiny, tmp_path, capsys):
    tiny.save_pretrained(tmp_path / "model")
    a, b = _pair(tmp_path)
    code = analysis_cli.main(
        [
            "relevance",
            "--model",
            str(tmp_path / "model"),
            str(a),
            str(b),
            "--description",
            "two cubes",
            "--out",
            str(tmp_path / "x.png"),
        ]
    )
    assert code == 2 and "namc analyze relevance: error:" in capsys.readouterr().err
    code = analysis_cli.main(["reconstruction", "--model", str(tmp_path / "model"), "--corpus", str(tmp_path)])
    assert code == 2 and "--vqgan" in capsys.readouterr().err
