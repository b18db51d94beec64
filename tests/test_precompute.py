"""``namc data precompute``: VQGAN codes and ResNet grids beside packed shards (Lightning predict), read back by the
corpus, used by pre-training instead of the frozen encoders (same losses), resumable after SIGKILL; corpus subsets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import timm
import torch

from namc.data.collate import PretrainCollator
from namc.data.corpus import CorpusDataset, pack_corpus
from namc.data.corpus.targets import check_targets, read_targets, shard_stamp, targets_path
from namc.data.synthetic import generate_corpus
from namc.models import create_model
from namc.models.io import save_safetensors
from namc.models.registry import model_config
from namc.models.vqgan import VQGANTokenizer
from namc.objectives import pretrain_step

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A packed shapes corpus (namc_tiny's 64 px) and tiny VQGAN / ResNet weights files."""
    root = tmp_path_factory.mktemp("precompute")
    generate_corpus(root / "corpus", 24, 64, 0, 0.2, progress=False)
    pack_corpus(root / "corpus" / "manifest.jsonl", root / "shards", shard_size=4, progress=False)
    c = model_config("namc_tiny")
    torch.manual_seed(0)
    vq, grid = root / "vqgan.safetensors", root / "resnet.safetensors"
    save_safetensors(VQGANTokenizer(c.vqgan_ddconfig, c.vqgan_n_embed, c.vqgan_embed_dim).state_dict(), vq)
    save_safetensors(timm.create_model(c.grid_model, pretrained=False, **c.grid_kwargs).state_dict(), grid)
    return root / "shards", vq, grid


def _args(shards: Path, vq: Path, grid: Path) -> list[str]:
    return [
        "--shards",
        str(shards),
        "--model",
        "namc_tiny",
        "--vqgan-weights",
        str(vq),
        "--grids",
        "--grid-weights",
        str(grid),
        "--batch-size",
        "3",
        "--num-workers",
        "0",
        "--quiet",
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "1",
    ]


def _targets(folder: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(folder.iterdir())
        if ".codes." in p.name or ".grids." in p.name or p.name.endswith(".targets.json")
    }


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        if p.suffix in (".tar", ".json") and ".targets" not in p.name:
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


@pytest.mark.slow
def test_precomputed_targets_equal_the_frozen_encoders_and_give_the_same_losses(
    corpus: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    from namc.lit.precompute import main

    shards = _copy(corpus[0], tmp_path / "shards")
    assert main(_args(shards, corpus[1], corpus[2])) == 0
    assert targets_path(shards / "shard-000000.tar", "codes.npy").exists()
    model = create_model("namc_tiny", vqgan_pretrained=str(corpus[1]), grid_pretrained=str(corpus[2])).eval()
    pre = list(CorpusDataset(shards, 64, rank=0, world_size=1))
    raw = list(CorpusDataset(shards, 64, rank=0, world_size=1, precomputed=False))
    assert len(pre) == len(raw) == 24
    assert all(it["grid1"] is not None and it["codes2"] is not None for it in pre)
    assert all(it["grid1"] is None and it["codes1"] is None for it in raw)
    collate = PretrainCollator(model.tokenizer, max_text_len=48, max_caption_len=model.config.max_caption_len)
    b_pre, b_raw = collate(pre[:6]), collate(raw[:6])
    images = torch.cat([b_raw["image1"], b_raw["image2"]])
    with torch.no_grad():
        codes, grids = model.vqgan(images), model.grid(images)
    assert torch.equal(torch.cat([b_pre["codes1"], b_pre["codes2"]]), codes)
    assert torch.equal(torch.cat([b_pre["grid1"], b_pre["grid2"]]), grids.half().float())  # stored as float16

    def losses(batch: dict) -> dict[str, float]:
        torch.manual_seed(1)  # dropout
        g = torch.Generator().manual_seed(7)  # the same masks
        out = pretrain_step(model.train(), batch, g)
        return {k: float(torch.as_tensor(v).detach()) for k, v in out.items() if k != "img_mask_frac"}

    codes_only = {k: v for k, v in b_pre.items() if not k.startswith("grid")}
    assert losses(codes_only) == losses(b_raw)  # the VQGAN never ran: identical targets, identical losses
    B = b_raw["image1"].shape[0]
    rounded = {**b_raw, "grid1": grids[:B].half().float(), "grid2": grids[B:].half().float()}
    assert losses(b_pre) == losses(rounded)  # grids: the float16 copy of the on-the-fly grid, nothing else
    got, ref = losses(b_pre), losses(b_raw)
    assert all(abs(got[k] - ref[k]) < 1e-3 * max(1.0, abs(ref[k])) for k in ref)


def test_precompute_rerun_redoes_only_unfinished_shards(corpus: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """Targets cut before their json (arrays written, json not), stale (another shard size, or another shard's
    digest) or absent are redone; finished ones are kept; the result is the bytes of an uninterrupted run."""
    from namc.lit.precompute import main

    reference = _copy(corpus[0], tmp_path / "reference")
    args = _args(reference, corpus[1], corpus[2])
    args[args.index("--grids") : args.index("--grids") + 3] = []  # codes only: quicker
    assert main(args) == 0
    cut = _copy(corpus[0], tmp_path / "cut")
    args[1] = str(cut)
    assert main(args) == 0
    targets_path(cut / "shard-000001.tar", "targets.json").unlink()  # killed between the arrays and the json
    for p in cut.glob("shard-000003.*"):
        if ".codes." in p.name or ".targets." in p.name:
            p.unlink()
    meta = targets_path(cut / "shard-000004.tar", "targets.json")
    meta.write_text(meta.read_text().replace('"shard_bytes": ', '"shard_bytes": 1'))  # made from another shard
    meta = targets_path(cut / "shard-000002.tar", "targets.json")
    digest = json.loads(meta.read_text())["shard_digest"]
    assert len(digest) == 32
    meta.write_text(meta.read_text().replace(digest, "0" * 32))  # another shard of the same size
    assert read_targets(cut / "shard-000002.tar", 64) is None
    stamp = targets_path(cut / "shard-000000.tar", "codes.npy").stat().st_mtime_ns
    assert main(args) == 0
    assert _targets(cut) == _targets(reference)
    assert targets_path(cut / "shard-000000.tar", "codes.npy").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_precompute_killed_and_resumed_matches_an_uninterrupted_run(
    corpus: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    from namc.lit.precompute import main

    reference = _copy(corpus[0], tmp_path / "reference")
    assert main(_args(reference, corpus[1], corpus[2])) == 0
    killed = _copy(corpus[0], tmp_path / "killed")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "namc", "data", "precompute", *_args(killed, corpus[1], corpus[2])],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    first = targets_path(killed / "shard-000000.tar", "targets.json")
    deadline = time.time() + 120
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    out = proc.communicate()[0].decode(errors="replace")
    assert first.exists(), out[-2000:]
    n_done = sum(1 for p in killed.glob("*.targets.json"))
    assert n_done < 6, "the run finished before it was killed: nothing was resumed"
    assert main(_args(killed, corpus[1], corpus[2])) == 0
    assert _targets(killed) == _targets(reference)


def test_corpus_subsets_by_source_and_fraction_nest(corpus: tuple[Path, Path, Path]) -> None:
    ids = [it["id"] for it in CorpusDataset(corpus[0], None, rank=0, world_size=1, load_images=False)]
    half = [it["id"] for it in CorpusDataset(corpus[0], None, rank=0, world_size=1, load_images=False, fraction=0.5)]
    most = [it["id"] for it in CorpusDataset(corpus[0], None, rank=0, world_size=1, load_images=False, fraction=0.8)]
    assert set(half) < set(most) < set(ids) and 0 < len(half) < len(ids)
    sources = {it["source"] for it in CorpusDataset(corpus[0], None, rank=0, world_size=1, load_images=False)}
    none = list(CorpusDataset(corpus[0], None, rank=0, world_size=1, load_images=False, sources=["elsewhere"]))
    kept = list(CorpusDataset(corpus[0], None, rank=0, world_size=1, load_images=False, sources=sorted(sources)))
    assert none == [] and len(kept) == len(ids)
    with pytest.raises(ValueError, match="fraction"):
        CorpusDataset(corpus[0], None, fraction=0.0)


def test_precompute_names_a_missing_weights_file(
    corpus: tuple[Path, Path, Path], capsys: pytest.CaptureFixture
) -> None:
    from namc.data.cli import main

    assert main(["precompute", "--shards", str(corpus[0]), "--vqgan-weights", str(corpus[0] / "no.ckpt")]) == 2
    assert "--vqgan-weights" in capsys.readouterr().err and np.iinfo(np.int16).max >= 16383


def test_corpus_datamodule_feeds_precomputed_targets_so_the_frozen_encoders_never_run(
    corpus: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    import lightning.pytorch as pl

    from namc.lit import PretrainModule
    from namc.lit.datamodules import CorpusDataModule
    from namc.lit.precompute import main

    shards = _copy(corpus[0], tmp_path / "shards")
    assert main(_args(shards, corpus[1], corpus[2])) == 0
    kw = dict(
        train=str(shards),
        batch_size=4,
        num_workers=0,
        image_size=64,
        max_text_len=48,
        max_caption_len=64,
        shuffle_buffer=0,
    )
    dm = CorpusDataModule(**kw)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["codes1"].shape == (4, 64) and batch["grid2"].shape[:2] == (4, 64)
    overrides = {
        "dropout": 0.0,
        "dim": 32,
        "heads": 2,
        "vqgan_pretrained": str(corpus[1]),
        "grid_pretrained": str(corpus[2]),
    }
    module = PretrainModule("namc_tiny", tokenizer=dm.caption_tokenizer, overrides=overrides)

    def never(*_: object) -> None:
        raise AssertionError("a frozen encoder ran although its outputs were precomputed")

    module.model.vqgan.forward = never
    module.model.grid.forward = never
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        fast_dev_run=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, datamodule=dm)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    # the subset options: half the pairs give fewer steps; an unknown source leaves none
    full = dm.train_dataloader().dataset.per_reader
    half = CorpusDataModule(**kw, fraction=0.5)
    half.setup("fit")
    assert 0 < half.train_dataloader().dataset.per_reader < full
    with pytest.raises(ValueError, match="after sources/fraction"):
        CorpusDataModule(**kw, sources=["elsewhere"]).train_dataloader()


@pytest.mark.slow
def test_pretraining_refuses_targets_of_other_frozen_encoders(corpus: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """Targets made with other VQGAN weights, another codebook size, another ResNet or at another image size are
    named before training."""
    import lightning.pytorch as pl

    from namc.lit import PretrainModule
    from namc.lit.datamodules import CorpusDataModule
    from namc.lit.precompute import main

    shards = _copy(corpus[0], tmp_path / "shards")
    assert main(_args(shards, corpus[1], corpus[2])) == 0
    c = model_config("namc_tiny")
    torch.manual_seed(1)
    other_vq, other_grid = tmp_path / "other_vqgan.safetensors", tmp_path / "other_resnet.safetensors"
    save_safetensors(VQGANTokenizer(c.vqgan_ddconfig, c.vqgan_n_embed, c.vqgan_embed_dim).state_dict(), other_vq)
    save_safetensors(timm.create_model(c.grid_model, pretrained=False, **c.grid_kwargs).state_dict(), other_grid)
    same = {"vqgan_pretrained": str(corpus[1]), "grid_pretrained": str(corpus[2])}
    cases = [
        ({**same, "vqgan_pretrained": str(other_vq)}, "codes made with VQGAN weights"),
        ({**same, "grid_pretrained": str(other_grid)}, "grids made with weights"),
        # a random VQGAN (a weights file of another size is the strict loader's error): the codebook size counts
        ({"vqgan_n_embed": c.vqgan_n_embed // 2}, f"{c.vqgan_n_embed} codes, the model's has"),
    ]
    for overrides, message in cases:
        dm = CorpusDataModule(
            train=str(shards),
            batch_size=4,
            num_workers=0,
            image_size=64,
            max_text_len=48,
            max_caption_len=64,
            shuffle_buffer=0,
        )
        module = PretrainModule("namc_tiny", overrides={"dim": 32, "heads": 2, **overrides})
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            fast_dev_run=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path),
        )
        with pytest.raises(ValueError, match=r"shard-000000\.targets\.json: .*" + message) as err:
            trainer.fit(module, datamodule=dm)
        assert "namc data precompute" in str(err.value)
    meta = targets_path(shards / "shard-000000.tar", "targets.json")  # targets made at another image size
    meta.write_text(meta.read_text().replace('"image_size": 64', '"image_size": 48'))
    with pytest.raises(ValueError, match=r"shard-000000\.targets\.json: targets precomputed at 48 px, the model reads"):
        check_targets(shards, c.vqgan_n_embed, None, image_size=64)
    meta.write_text(meta.read_text().replace('"image_size": 48', '"image_size": 64'))
    # a random VQGAN of the same size and the same ResNet weights: the targets are used
    dm = CorpusDataModule(
        train=str(shards),
        batch_size=4,
        num_workers=0,
        image_size=64,
        max_text_len=48,
        max_caption_len=64,
        shuffle_buffer=0,
    )
    module = PretrainModule("namc_tiny", overrides={"dim": 32, "heads": 2, "grid_pretrained": str(corpus[2])})
    pl.Trainer(
        accelerator="cpu",
        devices=1,
        fast_dev_run=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    ).fit(module, datamodule=dm)


def test_repacking_a_shard_drops_its_targets_even_at_the_same_size(tmp_path: Path) -> None:
    """Tar pads to 10,240-byte records, so a shard repacked from other images often keeps its size: its targets,
    joined by key, would give each pair another pair's codes. Pack deletes them; targets of another shard of the same
    size are ignored by their digest."""
    from PIL import Image

    desc = (
        "The difference between the two images is that the first image shows a red cube, while the second image "
        "shows a blue cube."
    )
    Image.new("RGB", (8, 8), "red").save(tmp_path / "red.png")
    Image.new("RGB", (8, 8), "blue").save(tmp_path / "blue.png")

    def pack(first: str, second: str) -> Path:
        rows = [
            {"id": "p0", "source": "s", "image1": first, "image2": second, "description": desc},
            {"id": "p1", "source": "s", "image1": second, "image2": first, "description": desc},
        ]
        (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        pack_corpus(tmp_path / "m.jsonl", tmp_path / "shards", progress=False)
        return tmp_path / "shards" / "shard-000000.tar"

    def precompute(shard: Path) -> None:  # what `namc data precompute` writes, codes 0 for red and 1 for blue
        np.save(targets_path(shard, "codes.npy"), np.array([[[0] * 4, [1] * 4], [[1] * 4, [0] * 4]], np.int16))
        meta = {"keys": ["000000000", "000000001"], "skipped": [], "image_size": 8, "codes": {}, "grids": None}
        targets_path(shard, "targets.json").write_text(json.dumps({**meta, **shard_stamp(shard)}))

    shard = pack("red.png", "blue.png")
    precompute(shard)
    assert [it["codes1"].tolist() for it in CorpusDataset(tmp_path / "shards", 8)] == [[0] * 4, [1] * 4]
    size, digest = shard.stat().st_size, shard_stamp(shard)["shard_digest"]
    shard = pack("blue.png", "red.png")  # the pairs' images exchanged
    assert shard.stat().st_size == size and shard_stamp(shard)["shard_digest"] != digest
    assert not any(targets_path(shard, what).exists() for what in ("codes.npy", "targets.json"))
    assert all(it["codes1"] is None for it in CorpusDataset(tmp_path / "shards", 8))

    precompute(shard)  # over the new shard: used
    assert [it["codes1"].tolist() for it in CorpusDataset(tmp_path / "shards", 8)] == [[0] * 4, [1] * 4]
    side = shard.with_suffix(".json")  # another shard of the same size put in its place (its sidecar's digest)
    side.write_text(side.read_text().replace(shard_stamp(shard)["shard_digest"], "f" * 32))
    assert all(it["codes1"] is None for it in CorpusDataset(tmp_path / "shards", 8))
