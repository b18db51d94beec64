"""The conventional corpus of appendix B.2 (Table 11) and the image-order exchange of appendix B.3 (Table 12):
free-text records from ``namc curate describe --prompt conventional`` through filter, pack and streaming to
pre-training of FDG alone; the one-line refusals when NIM, MIR or the exchange is on; the shapes world's free-text
twin corpus; the two shipped studies."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
import warnings
from itertools import islice
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from namc.curate import describe as describe_cli
from namc.curate import filtering as filter_cli
from namc.curate.prompts import CONVENTIONAL_PROMPT, conventional_prompt
from namc.data.collate import PretrainCollator, encode_caption
from namc.data.corpus import CorpusDataset, RecordError, parse_record
from namc.data.issues import IssueKind
from namc.data.synthetic import generate_benchmark, generate_corpus
from namc.data.synthetic.writers import CONVENTIONAL_MANIFEST
from namc.experiment.runner import _expand_shapes, _Runner
from namc.experiment.study import load_study
from namc.lit import PretrainModule
from namc.lit.datamodules import CorpusDataModule
from namc.models import create_model
from namc.objectives import pretrain_step
from namc.text.template import RejectReason, TemplateStats, validate

sys.path.insert(0, str(Path(__file__).parent))
from llm_server import LLMServer  # noqa: E402

warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

ROOT = Path(__file__).resolve().parents[1]
TINY = {"dropout": 0.0, "dim": 32, "heads": 2}
FAST = ["--timeout", "2", "--backoff-base", "0.01", "--backoff-max", "0.03", "--max-attempts", "2", "--quiet"]
FDG_ONLY = {"use_nim": False, "use_mir": False, "masking": "none"}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("shapes")
    generate_corpus(root / "corpus", 16, image_size=64, seed=0, noise_rate=0.3)
    generate_benchmark(root / "bench", 8, image_size=64, seed=0, n_captions=2)
    corpus = root / "corpus"
    lines = (corpus / "manifest.jsonl").read_text(encoding="utf-8").splitlines()
    free = (corpus / CONVENTIONAL_MANIFEST).read_text(encoding="utf-8").splitlines()
    return {
        "root": root,
        "manifest": corpus / "manifest.jsonl",
        "conventional": corpus / CONVENTIONAL_MANIFEST,
        "records": [json.loads(x) for x in lines],
        "free": [json.loads(x) for x in free],
        "bench": str(root / "bench"),
    }


def _dm(train: Path, **kw) -> CorpusDataModule:
    args = dict(
        train=str(train),
        batch_size=8,
        num_workers=0,
        image_size=64,
        max_text_len=48,
        max_caption_len=64,
        shuffle_buffer=8,
    )
    return CorpusDataModule(**{**args, **kw})


def _fit(module: PretrainModule, dm: CorpusDataModule, tmp_path: Path, steps: int = 2, **kw) -> pl.Trainer:
    trainer = pl.Trainer(
        **kw,
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=tempfile.mkdtemp(dir=tmp_path),
    )
    trainer.fit(module, datamodule=dm)
    return trainer


# ------------------------------------------------------------------------------------------------ records


def test_a_free_text_record_round_trips_and_refuses_halves() -> None:
    line = {
        "id": "std-256",
        "source": "std",
        "image1": "a.png",
        "image2": "b.png",
        "free_text": True,
        "description": "The word hunger is no longer  there, the keys are different.",  # Figure 10's conventional
    }
    rec = parse_record(line)
    assert rec.free_text and rec.description == "The word hunger is no longer there, the keys are different."
    assert (rec.verb1, rec.desc1, rec.noise1) == ("", "", None)
    back = rec.to_json()
    assert back["free_text"] is True and "verb1" not in back and "desc1" not in back
    assert parse_record(back) == rec
    assert parse_record(rec.to_json(with_paths=False), with_paths=False).free_text  # the shard's json member

    with pytest.raises(RecordError, match="no template halves, but it gives desc1, noise1") as err:
        parse_record({**line, "desc1": "a cube", "noise1": [0, 0]})
    assert err.value.kind == IssueKind.MALFORMED_LINE
    with pytest.raises(RecordError, match="'free_text' must be true or false"):
        parse_record({**line, "free_text": "yes"})
    with pytest.raises(RecordError) as err:  # without the flag the template still rules
        parse_record({k: v for k, v in line.items() if k != "free_text"})
    assert err.value.kind == IssueKind.OFF_TEMPLATE


def test_free_text_validation_counts_only_empty_and_too_long() -> None:
    assert validate("The cube turned blue.", free_text=True) is None
    assert validate("The cube turned blue.") == RejectReason.OFF_TEMPLATE
    assert validate("  ", free_text=True) == RejectReason.EMPTY
    assert validate("x" * 9000, free_text=True) == RejectReason.TOO_LONG
    stats = TemplateStats()
    for text in ("The cube turned blue.", "The cube turned blue.", "A sphere appeared.", ""):
        stats.add(text, "std", free_text=True)
    row = stats.rows()["std"]
    assert (row.total, row.unique, row.repetition, dict(row.rejected)) == (3, 2, 1, {"empty": 1})


# ------------------------------------------------------------------------------------------------ shapes world


def test_the_shapes_corpus_has_a_free_text_twin(shapes: dict) -> None:
    records, free = shapes["records"], shapes["free"]
    assert [f["id"] for f in free] == [r["id"] for r in records]
    for r, f in zip(records, free):
        assert (f["image1"], f["image2"], f["change_type"]) == (r["image1"], r["image2"], r["change_type"])
        rec = parse_record(f)
        assert rec.free_text and rec.description[0].isupper() and rec.description.endswith(".")
        words = set(rec.description.lower().rstrip(".").split())
        # the sentence names the changed object, whose words the template's halves hold too
        assert words & set(r["desc1"].split() + r["desc2"].split())
    assert len({f["description"] for f in free}) > len(free) // 2
    again = shapes["root"] / "again"
    generate_corpus(again, 16, image_size=64, seed=0, noise_rate=0.3, workers=2)
    assert (again / CONVENTIONAL_MANIFEST).read_bytes() == shapes["conventional"].read_bytes()


# ------------------------------------------------------------------------------------------------ curation chain


def test_describe_conventional_then_filter_pack_and_stream(shapes: dict, tmp_path: Path) -> None:
    """pairs without captions -> describe --prompt conventional (the B.2 prompt verbatim, both images) -> filter
    (free text kept, flagged; an empty answer rejected) -> pack -> the shards stream the free-text records."""
    from namc.data.cli import main as data_main

    corpus = shapes["root"] / "corpus"
    truth = {
        hashlib.sha256((corpus / f["image1"]).read_bytes()).hexdigest(): f["description"] for f in shapes["free"][:8]
    }
    prompts: list[str] = []

    def answer(text: str, images: list[bytes]) -> str:
        prompts.append(text)
        assert len(images) == 2
        said = truth[hashlib.sha256(images[0]).hexdigest()]
        return "" if said == shapes["free"][3]["description"] else said

    work = tmp_path / "work"
    work.mkdir()
    with open(work / "pairs.jsonl", "w", encoding="utf-8") as f:
        for r in shapes["records"][:8]:  # no captions: the conventional prompt needs none
            refs = {k: os.path.relpath(corpus / r[k], work) for k in ("image1", "image2")}
            f.write(json.dumps({"id": r["id"], "source": "shapes", **refs}) + "\n")
    with LLMServer(answer=answer) as server:
        args = ["--workdir", str(work), "--prompt", "conventional", "--base-url", server.url, *FAST]
        assert describe_cli.main(args) == 0
    assert prompts and set(prompts) == {CONVENTIONAL_PROMPT} and conventional_prompt()[1] == CONVENTIONAL_PROMPT
    results = [json.loads(x) for x in (work / "descriptions.jsonl").read_text().splitlines()]
    assert {r["prompt"] for r in results} == {"conventional"}

    assert filter_cli.main(["--workdir", str(work)]) == 0
    manifest = [json.loads(x) for x in (work / "manifest.jsonl").read_text().splitlines()]
    rejects = [json.loads(x) for x in (work / "rejects.jsonl").read_text().splitlines()]
    expected = {f["id"]: f["description"] for i, f in enumerate(shapes["free"][:8]) if i != 3}
    assert {m["id"]: m["description"] for m in manifest} == expected
    assert all(m["free_text"] is True and "verb1" not in m for m in manifest)
    assert [(r["id"], r["reason"]) for r in rejects] == [(shapes["free"][3]["id"], "empty")]
    stats = json.loads((work / "table14.json").read_text())
    assert stats["table14"]["shapes"]["total"] == 7

    shards = tmp_path / "shards"
    assert data_main(["pack", str(work / "manifest.jsonl"), str(shards), "--shard-size", "4", "--quiet"]) == 0
    items = list(CorpusDataset(shards, 32))
    assert {it["id"]: it["description"] for it in items} == expected
    assert all(it["free_text"] and it["image1"].shape == (3, 32, 32) for it in items)


def test_describe_refuses_to_mix_prompt_styles(shapes: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "descriptions.jsonl"
    out.write_text(json.dumps({"id": "x", "source": "shapes", "prompt": "cc3m", "status": "ok", "text": "t"}) + "\n")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"id": "y", "image1": "a.png", "image2": "b.png"}) + "\n")
    args = ["--pairs", str(pairs), "--out", str(out), "--prompt", "conventional", "--base-url", "http://127.0.0.1:9/v1"]
    assert describe_cli.main([*args, *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds --prompt template results" in err and str(out) in err


# ------------------------------------------------------------------------------------------------ pre-training


def test_the_collator_takes_a_free_text_description_whole(shapes: dict) -> None:
    dm = _dm(shapes["conventional"])
    tok = dm.caption_tokenizer
    items = list(islice(CorpusDataset(shapes["conventional"], 64), 2))
    templated = next(iter(CorpusDataset(shapes["manifest"], 64)))
    batch = PretrainCollator(tok, 48, 64)([items[0], templated, items[1]])
    assert batch["free_text"].tolist() == [True, False, True]
    for row, item in ((0, items[0]), (2, items[1])):
        ids = encode_caption(tok, item["description"], 64)
        assert batch["caption"][row, : len(ids)].tolist() == ids
        assert (batch["caption_src1"][row] == -1).all() and (batch["caption_src2"][row] == -1).all()
        assert batch["desc1"][row, :2].tolist() == [tok.bos_id, tok.eos_id]
        assert not batch["noise1"][row].any() and not batch["has_noise"][row]
    assert (batch["caption_src1"][1] >= 0).any()  # the templated item still copies from its halves
    with pytest.raises(ValueError, match="free-text description cannot follow swapped images"):
        PretrainCollator(tok, 48, 64, swap_prob=1.0)(items)


def test_a_free_text_batch_trains_fdg_alone(shapes: dict) -> None:
    """The pre-training step on free-text descriptions: L = L_FDG, and only FDG and MIR's encoder (whose E_MIR FDG
    reads) get gradients; NIM's towers get none."""
    dm = _dm(shapes["conventional"])
    no_masks = {"masking": "random", "p_img": 0.0, "p_txt": 0.0}  # what PretrainModule builds for masking="none"
    model = create_model("namc_tiny", tokenizer=dm.caption_tokenizer, use_nim=False, use_mir=False, **no_masks, **TINY)
    batch = PretrainCollator(dm.caption_tokenizer, 48, 64)(list(islice(CorpusDataset(shapes["conventional"], 64), 4)))
    out = pretrain_step(model, batch, torch.Generator().manual_seed(0))
    assert out["nim"] == 0 and out["mir"] == 0 and torch.equal(out["loss"], out["fdg"]) and out["fdg"] > 0
    out["loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.fdg.parameters())
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.nim.parameters())
    assert out["img_mask_frac"] == 0 and out["txt_mask_frac"] == 0  # masking none


@pytest.mark.slow
def test_a_free_text_corpus_pretrains_fdg_only(shapes: dict, tmp_path: Path) -> None:
    pl.seed_everything(0)
    dm = _dm(shapes["conventional"], val=str(shapes["conventional"]))
    module = PretrainModule("namc_tiny", tokenizer=dm.caption_tokenizer, overrides=TINY, **FDG_ONLY)
    before = {k: v.clone() for k, v in module.model.fdg.state_dict().items()}
    trainer = _fit(module, dm, tmp_path, steps=1, val_check_interval=1, limit_val_batches=1)
    assert trainer.global_step == 1
    m = trainer.callback_metrics
    assert m["train/nim"] == 0 and m["train/mir"] == 0 and m["train/fdg"] > 0 and torch.isfinite(m["train/loss"])
    assert m["val/nim"] == 0 and m["val/mir"] == 0 and m["val/fdg"] > 0  # validation reads free text too
    assert m["train/loss"] == m["train/fdg"]
    after = module.model.fdg.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # FDG learnt from the free text


@pytest.mark.parametrize(
    ("switches", "named"),
    [
        ({"use_nim": True, "use_mir": False, "masking": "noise"}, "turn off model.init_args.use_nim (false / 0)"),
        ({"use_nim": False, "use_mir": True, "masking": "none"}, "turn off model.init_args.use_mir (false / 0)"),
        ({}, "turn off model.init_args.use_nim and model.init_args.use_mir (false / 0)"),
    ],
)
def test_nim_or_mir_on_a_free_text_corpus_is_a_one_line_error(
    shapes: dict, tmp_path: Path, switches: dict, named: str
) -> None:
    dm = _dm(shapes["conventional"])
    module = PretrainModule("namc_tiny", tokenizer=dm.caption_tokenizer, overrides=TINY, **switches)
    with pytest.raises(ValueError, match="free-text description") as err:
        _fit(module, dm, tmp_path)
    message = str(err.value)
    assert "\n" not in message and message.endswith(named) and "'shapes-0000000'" in message


def test_order_exchange_on_a_free_text_corpus_is_refused(shapes: dict, tmp_path: Path) -> None:
    dm = _dm(shapes["conventional"], swap_prob=0.5)
    module = PretrainModule("namc_tiny", tokenizer=dm.caption_tokenizer, overrides=TINY, **FDG_ONLY)
    with pytest.raises(ValueError, match=r"turn off data\.init_args\.swap_prob \(false / 0\)$"):
        _fit(module, dm, tmp_path)
    with pytest.raises(ValueError, match=r"swap_prob must be a probability in \[0, 1\], got 1.5"):
        _dm(shapes["conventional"], swap_prob=1.5)


def test_a_free_text_record_after_the_first_is_caught_at_its_batch(shapes: dict, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.jsonl"
    corpus = shapes["root"] / "corpus"
    with open(mixed, "w", encoding="utf-8") as f:
        for r, free in zip(shapes["records"][:8], shapes["free"][:8]):
            line = free if r["id"] == "shapes-0000005" else r
            f.write(
                json.dumps({**line, "image1": str(corpus / line["image1"]), "image2": str(corpus / line["image2"])})
            )
            f.write("\n")
    dm = _dm(mixed, shuffle_buffer=0)
    assert dm.free_text_example() is None  # the first record is templated
    module = PretrainModule("namc_tiny", tokenizer=dm.caption_tokenizer, overrides=TINY, use_mir=False)
    with pytest.raises(ValueError, match=r"pair 'shapes-0000005' has a free-text description.*use_nim \(false / 0\)$"):
        _fit(module, dm, tmp_path)


def test_order_exchange_swaps_images_and_halves_in_pretraining_batches(shapes: dict) -> None:
    """swap_prob (Table 12): a seeded half of the pairs come with both images and both halves exchanged."""
    dm = _dm(shapes["manifest"], swap_prob=0.5, shuffle_buffer=0, batch_size=16)
    loader = dm.train_dataloader()
    batch = next(iter(loader))
    by_id = {r["id"]: r for r in shapes["records"]}
    plain = {it["id"]: it for it in CorpusDataset(shapes["manifest"], 64)}
    tok = dm.caption_tokenizer
    swapped = 0
    for row, pair_id in enumerate(batch["ids"]):
        rec, item = by_id[pair_id], plain[pair_id]
        first = tok.encode(rec["desc1"].split()[0])
        exchanged = torch.equal(batch["image1"][row], item["image2"])
        assert exchanged == (not torch.equal(batch["image1"][row], item["image1"]))
        own = batch["desc1"][row, 1 : 1 + len(first)].tolist() == first
        assert own != exchanged or rec["desc1"].split()[0] == rec["desc2"].split()[0]
        swapped += exchanged
    assert 0 < swapped < len(batch["ids"])


# ------------------------------------------------------------------------------------------------ the studies


def test_shipped_table11_and_table12_studies(tmp_path: Path) -> None:
    t11 = load_study(ROOT / "configs" / "experiments" / "table11.yaml")
    t12 = load_study(ROOT / "configs" / "experiments" / "table12.yaml")
    assert [v.name for v in t11.variants] == ["ours", "conventional"] and t11.seeds == [0, 1, 2, 3, 4]
    assert [v.name for v in t12.variants] == ["without_exchange", "with_exchange"] and t12.seeds == [0, 1, 2, 3, 4]
    runner = _Runner(t11, tmp_path, {"pretrain": {}, "finetune": {}})
    plans = {v.name: runner.plan(v, 0) for v in t11.variants}
    data = str(tmp_path.resolve() / "data")
    conv = plans["conventional"]["pre"]["data"]["init_args"]
    assert (
        conv["train"] == f"{data}/corpus/conventional.jsonl" and conv["val"] == f"{data}/corpus_val/conventional.jsonl"
    )
    for plan in plans.values():
        init = plan["pre"]["model"]["init_args"]
        assert (init["use_nim"], init["use_mir"], init["masking"]) == (False, False, "none")
    assert plans["ours"]["pre_hash"] != plans["conventional"]["pre_hash"]
    swap = {v.name: load_study(t12.path).stage_config(v, "pretrain")["data"]["init_args"] for v in t12.variants}
    assert swap["with_exchange"]["swap_prob"] == 0.5 and "swap_prob" not in swap["without_exchange"]
    assert _expand_shapes({"a": ["{shapes}/x", 3]}, Path("/d")) == {"a": ["/d/x", 3]}
