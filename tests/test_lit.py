"""namc.lit: LightningModules on shapes-world data (fast_dev_run), checkpoints, resume, the AUROC and the schedule."""

from __future__ import annotations

import json
import logging
import math
import tempfile
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from namc.backends import onednn, precision
from namc.backends.compile import compile  # noqa: A004 - namc.compile
from namc.backends.qconv import qconv_available
from namc.data.pairs import PairListDataset, read_pair_list
from namc.data.synthetic import generate_benchmark, generate_corpus, render_scene
from namc.eval.noise import auroc, noise_auroc
from namc.eval.plots import plot_relevance
from namc.lit import ExportModel, FinetuneModule, PretrainModule
from namc.lit.datamodules import BenchmarkDataModule, CorpusDataModule
from namc.models import load_model
from namc.models.io import read_config, read_tokenizer
from namc.models.namc import NAMC
from namc.objectives import CosineSchedule, pretrain_step
from namc.ops.distributed import all_gather_with_grad, gather_objects
from namc.text.tokenizer import same_tokenizer

warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

TINY = {"dropout": 0.0, "dim": 32, "heads": 2}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("shapes")
    generate_corpus(root / "corpus", 24, image_size=64, seed=0, noise_rate=0.3)
    generate_benchmark(root / "bench", 15, image_size=64, seed=0, n_captions=2)
    return {"corpus": str(root / "corpus" / "manifest.jsonl"), "bench": str(root / "bench"), "root": root}


def _corpus_dm(shapes: dict, **kw) -> CorpusDataModule:
    args = dict(
        train=shapes["corpus"],
        val=shapes["corpus"],
        batch_size=8,
        num_workers=0,
        image_size=64,
        max_text_len=48,
        max_caption_len=64,
        shuffle_buffer=8,
        vocab_benchmarks={"clevr_change": shapes["bench"]},
    )
    return CorpusDataModule(**{**args, **kw})


_ROOTS: list[Path] = []  # where this module's trainers write (pytest's temporary directory, cleaned by pytest)


@pytest.fixture(scope="module", autouse=True)
def _trainer_roots(tmp_path_factory: pytest.TempPathFactory) -> None:
    _ROOTS[:] = [tmp_path_factory.mktemp("trainers")]


def _trainer(**kw) -> pl.Trainer:
    # a fresh root, so nothing (captions, checkpoints) is written into the working directory or left in /tmp
    args = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(dir=_ROOTS[0]),
    )
    return pl.Trainer(**{**args, **kw})


# ------------------------------------------------------------------------------------------------ AUROC, schedule


def test_auroc_hand_values() -> None:
    assert auroc([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == 1.0
    assert auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auroc([0.5, 0.5, 0.5], [1, 0, 0]) == 0.5  # ties count one half
    # positives 0.35, 0.8 against negatives 0.1, 0.4: 3 of 4 pairs ordered correctly
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert math.isnan(auroc([0.1, 0.2], [1, 1]))


def test_auroc_is_the_pairwise_probability_with_ties() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 6, (80,), generator=g).float()  # many ties
    labels = torch.rand(80, generator=g) < 0.3
    pos, neg = scores[labels], scores[~labels]
    brute = ((pos[:, None] > neg[None]).double() + 0.5 * (pos[:, None] == neg[None]).double()).mean()
    assert auroc(scores, labels) == pytest.approx(float(brute), abs=1e-12)


def test_cosine_schedule_ends_at_the_minimum_ratio() -> None:
    sched = CosineSchedule(total_steps=100, warmup_steps=10, min_ratio=0.1)  # NIM: 1e-4 -> 1e-5 (appendix F)
    assert sched(0) == pytest.approx(0.1)  # first warm-up step
    assert sched(9) == pytest.approx(1.0)
    assert sched(10) == pytest.approx(1.0)
    assert sched(55) == pytest.approx(0.55)  # half way down the cosine: (1 + 0.1) / 2
    assert sched(100) == pytest.approx(0.1)
    assert sched(1000) == pytest.approx(0.1)
    assert CosineSchedule(10, 0, 1 / 3)(0) == 1.0  # MIR/FDG: 3e-4 -> 1e-4


def test_collectives_without_distributed_are_identities() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    assert all_gather_with_grad(x) is x
    assert gather_objects({"a": 1}) == [{"a": 1}]


# ------------------------------------------------------------------------------------------------ pre-training


def test_cached_codes_are_kept_per_split(shapes: dict) -> None:
    """The shapes world numbers its training and held-out corpora from 0: a validation pair must get its own images'
    codes, not those a training pair of the same id left in the memo (nor the other way round)."""
    held_out = shapes["root"] / "held_out"
    generate_corpus(held_out, 8, image_size=64, seed=1, noise_rate=0.3)  # ids shapes-0000000.. as the training ones
    dm = _corpus_dm(shapes, val=str(held_out / "manifest.jsonl"), shuffle_buffer=0)
    module = PretrainModule("namc_tiny", tokenizer=dm.caption_tokenizer, overrides=TINY, cache_codes=True)
    trainer = _trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=dm)
    val = next(iter(dm.val_dataloader()))
    splits = {key.split("\x00")[0] for key in module._codes}
    assert splits == {"train", "validate"}
    with torch.no_grad():
        own = module.model.vqgan(val["image1"])
    cached = torch.stack([module._codes[f"validate\x00{i}\x001"] for i in val["ids"]])
    trained_ids = {key.split("\x00")[1] for key in module._codes if key.startswith("train")}
    assert set(val["ids"]) & trained_ids  # the ids collide
    assert torch.equal(cached, own.to(cached.dtype))  # the codes do not


@pytest.fixture(scope="module")
def pretrained_ckpt(shapes: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A fast_dev_run of the pre-training module; its checkpoint and metrics."""
    pl.seed_everything(0)
    dm = _corpus_dm(shapes)
    module = PretrainModule("namc_tiny", tokenizer=dm.caption_tokenizer, overrides=TINY, cache_codes=True)
    trainer = _trainer(fast_dev_run=True)
    trainer.fit(module, datamodule=dm)
    path = tmp_path_factory.mktemp("pretrain") / "pretrain.ckpt"
    trainer.save_checkpoint(path)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return {"path": path, "metrics": metrics, "module": module, "dm": dm}


def test_pretrain_fast_dev_run_logs_every_loss(pretrained_ckpt: dict) -> None:
    m = pretrained_ckpt["metrics"]
    for key in (
        "train/loss",
        "train/nim",
        "train/mir",
        "train/fdg",
        "train/img_mask_frac",
        "train/txt_mask_frac",
        "val/loss",
        "val/noise_auroc",
    ):
        assert key in m and math.isfinite(m[key]), key
    assert m["train/loss"] == pytest.approx(m["train/nim"] + m["train/mir"] + m["train/fdg"], rel=1e-5)
    assert 0.0 < m["train/img_mask_frac"] < 1.0
    assert 0.0 <= m["val/noise_auroc"] <= 1.0


def test_pretrain_switches_reach_the_model_config(shapes: dict) -> None:
    dm = _corpus_dm(shapes)
    module = PretrainModule(
        "namc_tiny",
        tokenizer=dm.caption_tokenizer,
        use_nim=False,
        masking="random",
        p_img=0.3,
        p_txt=0.1,
        nim_loss="infonce",
        rec_loss="l2",
        denoised_image=False,
        denoised_text=False,
        overrides=TINY,
    )
    c = module.model.config
    assert (c.use_nim, c.masking, c.p_img, c.p_txt, c.nim_loss, c.rec_loss) == (
        False,
        "random",
        0.3,
        0.1,
        "infonce",
        "l2",
    )
    assert (c.denoised_image, c.denoised_text, c.dim) == (False, False, 32)
    assert module.hparams.p_img == 0.3 and "tokenizer" not in module.hparams
    token = PretrainModule(
        "namc_tiny", tokenizer=dm.caption_tokenizer, nim_token_loss=3.0, nim_token_ngram=None, overrides=TINY
    )
    assert token.model.config.nim_token_loss == 3.0 and token.model.nim.token_logit is not None
    assert token.model.config.nim_token_ngram is None
    with pytest.raises(ValueError, match="init arguments"):
        PretrainModule("namc_tiny", tokenizer=dm.caption_tokenizer, overrides={"p_img": 0.5})


def test_word_vocabulary_covers_corpus_and_benchmark(shapes: dict, pretrained_ckpt: dict) -> None:
    tok = pretrained_ckpt["dm"].caption_tokenizer
    bench = BenchmarkDataModule("clevr_change", shapes["bench"], num_workers=0, image_size=64)
    words = {w for text in bench.vocabulary_texts() for w in tok.split(text)}
    assert words and all(w in tok.index for w in words)  # every training caption word
    assert "difference" in tok.index and tok.unk_id not in tok.encode("the first image shows a cube")
    lines = Path(shapes["corpus"]).read_text().splitlines()
    corpus = {w for line in lines for w in tok.split(json.loads(line)["description"])}
    held_out = {w for e in bench.split("val").entries + bench.split("test").entries for c in e[3] for w in tok.split(c)}
    only_held_out = held_out - words - corpus
    assert only_held_out and not only_held_out & set(tok.index)  # val/test captions never build the vocabulary


def test_optimizer_groups_and_cosine_minimums(pretrained_ckpt: dict) -> None:
    module = pretrained_ckpt["module"]
    config = module.configure_optimizers()
    opt, sched = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert [g["name"] for g in opt.param_groups] == ["nim", "mir_fdg"]
    assert [g["lr"] for g in opt.param_groups] == [1e-4, 3e-4]  # appendix F
    nim_ids = {id(p) for p in module.model.nim.parameters()}
    assert all(id(p) in nim_ids for p in opt.param_groups[0]["params"])
    assert [f(10**9) for f in sched.lr_lambdas] == pytest.approx([0.1, 1 / 3])  # 1e-5 and 1e-4 at the end


@pytest.mark.slow
def test_checkpoint_round_trip_and_export(pretrained_ckpt: dict, tmp_path) -> None:
    module, path = pretrained_ckpt["module"], pretrained_ckpt["path"]
    net = load_model(path)
    assert net.config == module.model.config
    ref = module.model.state_dict()
    for k, v in net.state_dict().items():
        assert torch.equal(v, ref[k]), k
    assert same_tokenizer(read_tokenizer(path), module.tokenizer)
    assert read_config(path).dim == 32
    small = load_model(path, pretraining=False)
    assert small.nim is None and small.vqgan is None and small.mir.head is None
    out = module.export(tmp_path / "model")
    again = NAMC.from_pretrained(out)
    assert read_config(out) == again.config
    assert torch.equal(again.state_dict()["fdg.tok.weight"], ref["fdg.tok.weight"])


def test_noise_auroc_and_relevance_figure(pretrained_ckpt: dict, tmp_path) -> None:
    module, dm = pretrained_ckpt["module"], pretrained_ckpt["dm"]
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    result = noise_auroc(module.model, [batch])
    assert result["noise_tokens"] > 0 and result["tokens"] > result["noise_tokens"]
    assert 0.0 <= result["auroc"] <= 1.0
    png = plot_relevance(module.model, batch, tmp_path / "rel.png", pairs=(0, 1))
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------------------------ fine-tuning


def test_finetune_from_pretraining_checkpoint_fast_dev_run(shapes: dict, pretrained_ckpt: dict) -> None:
    path = pretrained_ckpt["path"]
    dm = BenchmarkDataModule(
        "clevr_change",
        shapes["bench"],
        batch_size=8,
        num_workers=0,
        image_size=64,
        tokenizer=str(path),
        max_caption_len=64,
    )
    module = FinetuneModule(pretrained=str(path), tokenizer=dm.caption_tokenizer, cache_grids=True)
    assert module.model.nim is None and module.model.vqgan is None  # NIM dropped for fine-tuning
    pre = pretrained_ckpt["module"].model.state_dict()
    assert torch.equal(module.model.state_dict()["mir.fuse.weight"], pre["mir.fuse.weight"])
    trainer = _trainer(fast_dev_run=True)
    trainer.fit(module, datamodule=dm)
    groups = trainer.optimizers[0].param_groups
    assert [(g["name"], g["initial_lr"]) for g in groups] == [("mir_fdg", 2e-4)]  # appendix F
    trainer.test(module, datamodule=dm, verbose=False)
    scores = module.scores["test"]
    assert scores["scale"] == "x100" and isinstance(scores["overall"]["CIDEr-D"], float)
    assert "test/cider" in trainer.callback_metrics and "test/bleu4" in trainer.callback_metrics
    assert set(scores["per_type"]) <= {"color", "material", "add", "drop", "move", "no_change"}
    assert len(module._grids) > 0  # the frozen grids were memoised

    pairs = shapes["root"] / "pairs.txt"
    render_scene([], 64).save(shapes["root"] / "a.png")
    pairs.write_text("# first second\na.png a.png\n")
    assert len(PairListDataset(pairs, 64)) == 1
    dm = BenchmarkDataModule(
        "clevr_change", shapes["bench"], num_workers=0, image_size=64, tokenizer=str(path), predict_pairs=str(pairs)
    )
    predictions = trainer.predict(module, datamodule=dm)
    assert predictions[0][0]["id"] == "a.png|a.png" and isinstance(predictions[0][0]["caption"], str)


@pytest.mark.slow
def test_finetune_generates_at_the_inference_precision(shapes: dict, pretrained_ckpt: dict, tmp_path: Path) -> None:
    path = str(pretrained_ckpt["path"])
    dm = BenchmarkDataModule(
        "clevr_change", shapes["bench"], batch_size=8, num_workers=0, image_size=64, tokenizer=path, max_caption_len=64
    )
    with pytest.raises(ValueError, match="precision must be one of"):
        FinetuneModule(pretrained=path, tokenizer=dm.caption_tokenizer, inference_precision="fp16")
    module = FinetuneModule(
        pretrained=path, tokenizer=dm.caption_tokenizer, cache_grids=True, inference_precision="bf16"
    )
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    ids = module._generate_ids(batch)
    assert torch.equal(ids, compile(module.model, "cpu", "bf16").generate_ids(batch["image1"], batch["image2"], 23))
    assert not module._grids  # from the pixels through the bf16 copy, not from the fp32 grid cache
    assert set(precision._COPIES[module.model]) == {"bf16"}  # generation built (only) the bf16 copy
    trainer = _trainer(fast_dev_run=True)
    trainer.test(module, datamodule=dm, verbose=False)
    assert isinstance(module.scores["test"]["overall"]["CIDEr-D"], float)

    # int8: the static grid is calibrated on the training split before the first captions (not without pairs)
    with pytest.raises(ValueError, match="int8_calibration_pairs"):
        FinetuneModule(pretrained=path, tokenizer=dm.caption_tokenizer, int8_calibration_pairs=-1)
    static = "int8" if onednn.conv_available() and qconv_available() else "fp32"  # fp32: no oneDNN int8 convolution
    for pairs, grid in ((0, "fp32"), (12, static)):
        module = FinetuneModule(
            pretrained=path, tokenizer=dm.caption_tokenizer, inference_precision="int8", int8_calibration_pairs=pairs
        )
        _trainer(fast_dev_run=True).test(module, datamodule=dm, verbose=False)
        assert precision.int8_grid(module.model) == grid
        assert (precision.int8_calibration(module.model) is None) is (pairs == 0)
        assert isinstance(module.scores["test"]["overall"]["CIDEr-D"], float)
    ids = module._generate_ids(batch)
    assert torch.equal(ids, compile(module.model, "cpu", "int8").generate_ids(batch["image1"], batch["image2"], 23))

    # a pretrained folder's calibration: replaced by the run's own (training pairs), dropped with 0 pairs
    model = load_model(path, pretraining=False)
    dim = [0.1 * torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))]  # dim images
    precision.calibrate_int8(model, dim)
    folder = model.save_pretrained(tmp_path / "calibrated")
    saved = precision.int8_calibration(model)
    for pairs in (0, 12):
        module = FinetuneModule(
            pretrained=str(folder),
            tokenizer=dm.caption_tokenizer,
            inference_precision="int8",
            int8_calibration_pairs=pairs,
        )
        assert precision.int8_calibration(module.model) == saved  # carried by the folder
        _trainer(fast_dev_run=True).test(module, datamodule=dm, verbose=False)
        own = precision.int8_calibration(module.model)
        assert own is None if pairs == 0 else own not in (None, saved)


@pytest.mark.slow
def test_a_fine_tuned_model_keeps_its_training_shortlist(shapes: dict, pretrained_ckpt: dict, tmp_path) -> None:
    path = str(pretrained_ckpt["path"])
    dm = BenchmarkDataModule(
        "clevr_change", shapes["bench"], batch_size=8, num_workers=0, image_size=64, tokenizer=path, max_caption_len=64
    )
    stale = load_model(path, pretraining=False)
    stale.training_shortlist = stale.shortlist(["a b c"])  # a folder fine-tuned on other data brings its own list
    folder = stale.save_pretrained(tmp_path / "stale")
    module = FinetuneModule(pretrained=str(folder), tokenizer=dm.caption_tokenizer, cache_grids=True)
    assert module.model.training_shortlist is not None
    best = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/cider", mode="max")
    trainer = _trainer(
        max_epochs=1,
        limit_train_batches=1,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        callbacks=[best, ExportModel(dirpath=str(tmp_path / "model"))],
    )
    trainer.fit(module, datamodule=dm)
    want = module.model.shortlist(dm.vocabulary_texts()).ids.tolist()  # this data's training captions
    assert module.model.training_shortlist.ids.tolist() == want and len(want) > 10
    assert best.best_model_path  # the export below went through the best checkpoint
    for saved in (load_model(best.best_model_path), NAMC.from_pretrained(tmp_path / "model")):
        assert saved.training_shortlist.ids.tolist() == want
    files = json.loads((tmp_path / "model" / "config.json").read_text())["files"]
    assert "shortlist.json" in files  # recorded with its digest

    # generation over it when asked; a model without one (a pre-training checkpoint) builds it from the training
    # captions
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    for folder in (tmp_path / "model", path):
        module = FinetuneModule(pretrained=str(folder), tokenizer=dm.caption_tokenizer, inference_shortlist=True)
        _trainer(fast_dev_run=True).test(module, datamodule=dm, verbose=False)
        short = module.model.training_shortlist
        assert short.ids.tolist() == want
        ids = module._generate_ids(batch)
        assert torch.equal(ids, module.model.generate_ids(batch["image1"], batch["image2"], 23, vocabulary=short))
        assert set(ids.flatten().tolist()) <= set(want) | {module.model.fdg.pad_id}
    module = FinetuneModule(pretrained=path, tokenizer=dm.caption_tokenizer, inference_shortlist=True)
    with pytest.raises(ValueError, match="no training_shortlist and the datamodule no training captions"):
        module.setup("test")  # no trainer, so no datamodule


@pytest.mark.slow
def test_finetune_can_train_the_grid_encoder(shapes: dict, pretrained_ckpt: dict) -> None:
    path = str(pretrained_ckpt["path"])
    dm = BenchmarkDataModule(
        "clevr_change", shapes["bench"], batch_size=8, num_workers=0, image_size=64, tokenizer=path, max_caption_len=64
    )
    module = FinetuneModule(pretrained=path, tokenizer=dm.caption_tokenizer, grid_trainable=True)
    assert module.model.config.grid_trainable and not module.model.grid.frozen
    before = {k: v.clone() for k, v in module.model.grid.state_dict().items()}
    trainer = _trainer(fast_dev_run=True)
    trainer.fit(module, datamodule=dm)
    grid_ids = {id(p) for p in module.model.grid.parameters()}
    assert grid_ids <= {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    after = module.model.grid.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the grid encoder learned
    with pytest.raises(ValueError, match="cache_grids"):
        FinetuneModule(pretrained=path, tokenizer=dm.caption_tokenizer, grid_trainable=True, cache_grids=True)
    frozen = FinetuneModule(pretrained=path, tokenizer=dm.caption_tokenizer)
    assert frozen.model.grid.frozen and not any(p.requires_grad for p in frozen.model.grid.parameters())


def test_finetune_refuses_a_foreign_tokenizer(shapes: dict, pretrained_ckpt: dict) -> None:
    dm = BenchmarkDataModule("clevr_change", shapes["bench"], num_workers=0, image_size=64)
    with pytest.raises(ValueError, match="tokenizer"):
        FinetuneModule(pretrained=str(pretrained_ckpt["path"]), tokenizer=dm.caption_tokenizer)


def test_the_tokenizer_kind_can_be_an_override(shapes: dict) -> None:
    # `overrides: {tokenizer: clip_bpe}` is how a config picks CLIP's BPE for a word preset (the CLI links the
    # datamodule's tokenizer to it); the datamodule's tokenizer must then be of that kind
    bpe = BenchmarkDataModule("clevr_change", shapes["bench"], num_workers=0, image_size=64, tokenizer="clip_bpe")
    word = BenchmarkDataModule("clevr_change", shapes["bench"], num_workers=0, image_size=64)
    for tokenizer in (bpe.caption_tokenizer, None):
        for module in (
            FinetuneModule(tokenizer=tokenizer, overrides={**TINY, "tokenizer": "clip_bpe"}),
            PretrainModule(tokenizer=tokenizer, overrides={**TINY, "tokenizer": "clip_bpe"}),
        ):
            assert module.model.config.tokenizer == "clip_bpe" and module.model.config.vocab_size == 49409
    with pytest.raises(ValueError, match="overrides.tokenizer is 'clip_bpe', but the tokenizer given is a 'word' one"):
        FinetuneModule(tokenizer=word.caption_tokenizer, overrides={"tokenizer": "clip_bpe"})


def test_pair_list_errors_name_file_and_line(tmp_path) -> None:
    render_scene([], 64).save(tmp_path / "a.png")
    bad = tmp_path / "bad.txt"
    bad.write_text("a.png a.png\na.png\n")
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        PairListDataset(bad)
    missing = tmp_path / "missing.txt"
    missing.write_text("a.png nope.png\n")
    with pytest.raises(FileNotFoundError, match=r"missing.txt:1.*nope.png"):
        PairListDataset(missing)
    render_scene([], 64).save(tmp_path / "shot#1.png")  # a "#" inside a name is part of it; after a blank, a comment
    listed = tmp_path / "listed.txt"
    listed.write_text("# before after\nshot#1.png\ta.png  # note\n  # indented\na.png shot#1.png#x\n")
    assert [p.written for p in read_pair_list(listed)] == [("shot#1.png", "a.png"), ("a.png", "shot#1.png#x")]


# ------------------------------------------------------------------------------------------------ resume


class _StopAfterFirstEpoch(pl.Callback):
    """Simulates an interruption after the first epoch (its checkpoint is written)."""

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.should_stop = True


def _pretrain_run(shapes: dict, ckpt_dir, stop: bool, ckpt_path=None, batches: int = 2) -> PretrainModule:
    pl.seed_everything(0)
    dm = _corpus_dm(shapes, val=None, batch_size=4)
    module = PretrainModule(
        "namc_tiny",
        tokenizer=dm.caption_tokenizer,
        overrides={**TINY, "dropout": 0.1},
        cache_codes=True,
        warmup_steps=1,
    )
    callbacks = [ModelCheckpoint(dirpath=ckpt_dir, save_last=True), ExportModel(dirpath=str(ckpt_dir / "model"))]
    if stop:
        callbacks.append(_StopAfterFirstEpoch())
    trainer = _trainer(max_epochs=2, limit_train_batches=batches, callbacks=callbacks, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module


@pytest.mark.parametrize("batches", [1, pytest.param(2, marks=pytest.mark.slow)])  # steps per epoch
def test_resume_matches_an_uninterrupted_run(shapes: dict, tmp_path, batches: int) -> None:
    full = _pretrain_run(shapes, tmp_path / "full", stop=False, batches=batches)
    first = _pretrain_run(shapes, tmp_path / "part", stop=True, batches=batches)
    assert first.current_epoch == 1  # stopped after epoch 0
    resumed = _pretrain_run(
        shapes, tmp_path / "resumed", stop=False, ckpt_path=tmp_path / "part" / "last.ckpt", batches=batches
    )
    want = full.model.state_dict()
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, want[k]), k
    diffs = [k for k, v in first.model.state_dict().items() if not torch.equal(v, want[k])]
    assert diffs, "the second epoch must change the weights, or the comparison proves nothing"
    exported = NAMC.from_pretrained(tmp_path / "resumed" / "model")
    assert torch.equal(exported.state_dict()["mir.fuse.weight"], want["mir.fuse.weight"])


def test_resume_with_a_different_vocabulary_fails(shapes: dict, pretrained_ckpt: dict) -> None:
    dm = _corpus_dm(shapes, vocab_benchmarks={})  # a smaller vocabulary than the checkpoint's
    module = PretrainModule("namc_tiny", tokenizer=dm.caption_tokenizer, overrides=TINY)
    ckpt = torch.load(pretrained_ckpt["path"], map_location="cpu", weights_only=True)
    with pytest.raises(ValueError, match="tokenizer differs"):
        module.on_load_checkpoint(ckpt)


def test_pretrain_caches_give_the_uncached_step(shapes: dict) -> None:
    dm = _corpus_dm(shapes)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    torch.manual_seed(0)
    module = PretrainModule(
        "namc_tiny", tokenizer=dm.caption_tokenizer, overrides=TINY, cache_codes=True, cache_grids=True
    )
    model = module.model.eval()
    cached = module._with_cache(batch)
    assert len(module._grids) == len(module._codes) == 2 * len(batch["ids"])
    with torch.no_grad():
        assert torch.equal(cached["grid1"], model.grid(batch["image1"]))
        assert torch.equal(cached["codes2"], model.vqgan(batch["image2"]))
        key = module._slot_keys(batch, "1")[0]
        module._grids[key] += 1.0  # a second call reads the cache, not the encoder
        again = module._with_cache(batch)
        assert torch.equal(again["grid1"][0], cached["grid1"][0] + 1.0)
        module._grids[key] -= 1.0
        with_cache = pretrain_step(model, module._with_cache(batch), torch.Generator().manual_seed(3))
        without = pretrain_step(model, batch, torch.Generator().manual_seed(3))
    for key in ("nim", "mir", "fdg"):
        assert float(with_cache[key]) == pytest.approx(float(without[key]), rel=1e-5), key
    with pytest.raises(ValueError, match="cache_grids"):
        PretrainModule(
            "namc_tiny", tokenizer=dm.caption_tokenizer, overrides={**TINY, "grid_trainable": True}, cache_grids=True
        )


def test_every_shipped_config_keeps_last_ckpt_current(tmp_path) -> None:
    """Lightning (2.6) writes a monitored ModelCheckpoint's last.ckpt only when the best improves, so a resume from
    last.ckpt would restart at the best epoch, maybe many back. Every shipped config with a monitored checkpoint keeps
    last.ckpt in an unmonitored one; and with those two callbacks last.ckpt follows every validation."""
    import yaml
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel

    root = Path(__file__).resolve().parents[1] / "configs"
    for path in sorted(root.rglob("*.yaml")):
        trainer = (yaml.safe_load(path.read_text()) or {}).get("trainer") or {}
        ckpts = [c["init_args"] for c in trainer.get("callbacks") or [] if c["class_path"].endswith(".ModelCheckpoint")]
        if any(c.get("monitor") for c in ckpts):
            assert not any(c.get("monitor") and c.get("save_last") for c in ckpts), path
            assert any(not c.get("monitor") and c.get("save_last") for c in ckpts), path

    class NeverImproves(BoringModel):
        def validation_step(self, batch, batch_idx):
            self.log("val/cider", -float(self.current_epoch))  # best at epoch 0

    best = ModelCheckpoint(dirpath=tmp_path, filename="best", monitor="val/cider", mode="max", save_top_k=1)
    last = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = _trainer(max_epochs=3, limit_train_batches=2, limit_val_batches=1, callbacks=[best, last])
    trainer.fit(NeverImproves())
    epochs = {name: torch.load(tmp_path / name, weights_only=True)["epoch"] for name in ("best.ckpt", "last.ckpt")}
    assert epochs == {"best.ckpt": 0, "last.ckpt": 2}
