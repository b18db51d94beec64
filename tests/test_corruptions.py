"""namc.data.corruptions: ImageNet-C Gaussian noise and fog at their published parameters, seeded; caption word
replacement at a rate; the datamodule options of Table 10."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from namc.data.corruptions import (
    CaptionNoiseView,
    CorruptedView,
    corrupt,
    fog,
    gaussian_noise,
    plasma_fractal,
    replace_words,
)


def test_gaussian_noise_has_the_severity_5_sigma():
    x = np.full((128, 128, 3), 0.5)
    y = gaussian_noise(x, 5, np.random.default_rng(0))
    # sigma 0.38 (ImageNet-C severity 5); clipping at 0 and 1 (1.3 sigma away) shrinks the sd a little
    clipped = np.clip(0.5 + np.random.default_rng(1).normal(size=(200_000,), scale=0.38), 0, 1).std()
    assert y.std() == pytest.approx(clipped, rel=0.02) and y.min() >= 0 and y.max() <= 1
    assert gaussian_noise(x, 1, np.random.default_rng(0)).std() == pytest.approx(0.08, rel=0.02)
    with pytest.raises(ValueError, match="severity must be 1..5"):
        gaussian_noise(x, 6, np.random.default_rng(0))


def test_plasma_and_fog_follow_the_definition():
    p = plasma_fractal(64, 1.4, np.random.default_rng(0))
    assert p.shape == (64, 64) and p.min() == 0.0 and p.max() == 1.0
    x = np.random.default_rng(2).uniform(0.1, 0.6, (48, 40, 3))
    y = fog(x, 5, np.random.default_rng(0))
    # fog(x) = (x + 3 plasma) * max(x) / (max(x) + 3) with the same plasma (64 x 64 cropped to 48 x 40)
    plasma = plasma_fractal(64, 1.4, np.random.default_rng(0))[:48, :40, None]
    expected = np.clip((x + 3.0 * plasma) * x.max() / (x.max() + 3.0), 0, 1)
    np.testing.assert_allclose(y, expected)
    with pytest.raises(ValueError, match="power of two"):
        plasma_fractal(48, 2.0, np.random.default_rng(0))


def test_corrupt_is_seeded_and_8_bit():
    img = torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0))
    a, b = corrupt(img, "fog", 5, "s-1"), corrupt(img, "fog", 5, "s-1")
    assert torch.equal(a, b) and not torch.equal(a, corrupt(img, "fog", 5, "s-2"))
    assert torch.equal(torch.round(a * 255) / 255, a) and a.dtype == img.dtype and a.shape == img.shape
    with pytest.raises(ValueError, match="unknown corruption 'snow'"):
        corrupt(img, "snow")


def test_replace_words_rate_and_views():
    vocab = ["red", "blue", "cube", "sphere", "the", "has", "changed"]
    caption = "the red cube has changed to blue now x y"  # 10 words
    out = replace_words(caption, 0.4, vocab, random.Random(0)).split()
    assert len(out) == 10 and sum(a != b for a, b in zip(out, caption.split())) == 4
    assert replace_words(caption, 0.0, vocab, random.Random(0)) == caption
    items = [{"id": "7", "captions": [caption], "image1": torch.rand(3, 16, 16), "image2": torch.rand(3, 16, 16)}, None]
    noisy = CaptionNoiseView(items, 0.8, vocab, seed=3)
    assert noisy[0]["captions"] == CaptionNoiseView(items, 0.8, vocab, seed=3)[0]["captions"] != [caption]
    assert noisy[1] is None and len(noisy) == 2
    fogged = CorruptedView(items, "gaussian_noise", 5, seed=1)[0]
    assert not torch.equal(fogged["image1"], items[0]["image1"]) and fogged["captions"] == [caption]
    with pytest.raises(ValueError, match="rate must be in"):
        CaptionNoiseView(items, 1.5, vocab)


def test_benchmark_datamodule_applies_the_shifts(tmp_path):
    from namc.data.synthetic import generate_benchmark
    from namc.lit.datamodules import BenchmarkDataModule

    root = tmp_path / "clevr"
    generate_benchmark(root, 10, 64, 0, 2, splits=(0.6, 0.2, 0.2), progress=False)
    clean = BenchmarkDataModule("clevr_change", str(root), batch_size=2, num_workers=0, image_size=64)
    shifted = BenchmarkDataModule(
        "clevr_change", str(root), batch_size=2, num_workers=0, image_size=64, corruption="fog", caption_noise=0.6
    )
    a, b = clean._shifted("train")[0], shifted._shifted("train")[0]
    assert a["id"] == b["id"] and a["captions"] != b["captions"] and not torch.equal(a["image1"], b["image1"])
    t_clean, t_shift = clean._shifted("test")[0], shifted._shifted("test")[0]
    assert t_clean["captions"] == t_shift["captions"]  # references stay clean
    assert not torch.equal(t_clean["image2"], t_shift["image2"])
    with pytest.raises(ValueError, match="unknown corruption"):
        BenchmarkDataModule("clevr_change", str(root), corruption="snow")
