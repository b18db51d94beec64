"""OmniDiff: the loader (Real and Render, change types, bad input) on a tiny fixture in the layout of
``namc.data.idc.omnidiff``, read through the registry; per-change-type scores with several types per pair; the length
limits of the fine-tuning config."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from PIL import Image

from namc.data.collate import CaptionCollator, SkipNone
from namc.data.idc import (
    BENCHMARKS,
    AnnotationError,
    OmniDiff,
    OmniDiffReal,
    OmniDiffRender,
    build_benchmark,
    check_benchmark_root,
)
from namc.data.idc.omnidiff import CHANGE_TYPES, normalise_change_type
from namc.lit import FinetuneModule
from namc.lit.datamodules import BenchmarkDataModule

LONG = " ".join(["the man in the blue shirt behind the desk on the left has turned from the window to the sofa"] * 4)


def _img(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (40, 30), (value, 80, 160)).save(path)


def _omnidiff(root: Path) -> None:
    """Real: 3 train pairs (one image missing), 1 val, 1 test; Render: 2 train pairs, 1 val, 1 test."""
    real = [
        {
            "id": "r1",
            "image1": "scene_a/1_before.jpg",
            "image2": "scene_a/1_after.jpg",
            "caption": LONG,
            "change_types": ["Pose", "addition"],
        },
        {
            "id": "r2",
            "image1": "scene_a/2_before.jpg",
            "image2": "scene_a/2_after.jpg",
            "captions": ["a cup was removed from the table", ""],
            "change_types": ["OCR (textual changes)", "removal"],
        },
        {
            "id": "r3",
            "image1": "scene_b/3_before.jpg",
            "image2": "scene_b/missing.jpg",
            "caption": "x",
            "change_types": [],
        },
    ]
    render = [
        {
            "id": 7,
            "image1": "r/7a.png",
            "image2": "r/7b.png",
            "caption": "the lamp is brighter",
            "change_type": "illumination",
        },
        {"image1": "r/8a.png", "image2": "r/8b.png", "caption": "the chair turned", "change_types": ["Colour"]},
    ]
    for subset, entries in (("Real", real), ("Render", render)):
        for i, e in enumerate(entries):
            for key in ("image1", "image2"):
                if "missing" not in e[key]:
                    _img(root / subset / e[key], 20 * i + (key == "image2"))
        (root / subset / "train.json").write_text(json.dumps(entries))
        for split in ("val", "test"):
            (root / subset / f"{split}.json").write_text(json.dumps(entries[:1]))


def test_registry_reads_real_and_render_with_their_change_types(tmp_path: Path) -> None:
    _omnidiff(tmp_path)
    both = build_benchmark("omnidiff", tmp_path, "train", image_size=16)
    assert isinstance(both, OmniDiff) and BENCHMARKS["omnidiff_real"] is OmniDiffReal
    ids = [e[0] for e in both.entries]
    assert ids == ["real/r1", "real/r2", "render/7", "render/train.json#1"]
    assert both.issues.counts["missing_image"] == 1  # r3's second image: skipped and counted, not a crash
    types = {e[0]: e[4] for e in both.entries}
    assert types["real/r1"] == ("addition", "pose")
    assert types["real/r2"] == ("ocr", "removal")
    assert types["render/7"] == ("illumination",) and types["render/train.json#1"] == ("color",)
    assert both.change_types() == {"addition": 1, "color": 1, "illumination": 1, "ocr": 1, "pose": 1, "removal": 1}
    item = both[0]
    assert item["image1"].shape == (3, 16, 16) and item["captions"] == [LONG]
    assert both[1]["captions"] == ["a cup was removed from the table"]  # the empty caption dropped

    real = build_benchmark("omnidiff_real", tmp_path, "valid", image_size=16)
    render = build_benchmark("omnidiff_render", tmp_path, "test", image_size=16)
    assert [e[0] for e in real.entries] == ["real/r1"] and [e[0] for e in render.entries] == ["render/7"]
    assert isinstance(render, OmniDiffRender)


def test_missing_subsets_say_what_to_download(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"OmniDiff not found at .*2503\.11093.*Real"):
        check_benchmark_root("omnidiff", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"OmniDiff-Render not found .*Render"):
        check_benchmark_root("omnidiff_render", tmp_path)
    (tmp_path / "Real").mkdir()
    (tmp_path / "Real" / "train.json").write_text("[]")
    assert len(build_benchmark("omnidiff_real", tmp_path, "train")) == 0
    with pytest.raises(FileNotFoundError, match=r"Render not found: download OmniDiff .*Render/\{train,val,test\}"):
        build_benchmark("omnidiff", tmp_path, "train")


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"image1": "a.png", "image2": "b.png"}, r"neither 'caption' nor 'captions'"),
        ({"image1": "a.png", "caption": "c"}, r"'image2' must be a non-empty path"),
        ({"image1": "../a.png", "image2": "b.png", "caption": "c"}, r"'image1' = '\.\./a\.png' must be a path inside"),
        ({"image1": "/etc/a.png", "image2": "b.png", "caption": "c"}, r"'image1' = '/etc/a\.png' must be a path"),
        ({"image1": "a.png", "image2": "b.png", "caption": 3}, r"'caption' must be a string"),
        ({"image1": "a.png", "image2": "b.png", "caption": "c", "change_types": [1]}, r"change types must be"),
        ({"id": True, "image1": "a.png", "image2": "b.png", "caption": "c"}, r"'id' must be a non-empty string"),
        ("not an object", r"is not an object"),
    ],
)
def test_malformed_entries_name_the_file_and_entry(tmp_path: Path, entry: object, message: str) -> None:
    (tmp_path / "Real").mkdir()
    (tmp_path / "Real" / "train.json").write_text(json.dumps([entry]))
    with pytest.raises(AnnotationError, match=r"Real/train\.json: entry 0\b.*" + message):
        OmniDiffReal(tmp_path, "train")


def test_duplicate_ids_non_lists_and_bad_bytes_are_errors(tmp_path: Path) -> None:
    (tmp_path / "Real").mkdir()
    path = tmp_path / "Real" / "train.json"
    e = {"id": "x", "image1": "a.png", "image2": "b.png", "caption": "c"}
    path.write_text(json.dumps([e, e]))
    with pytest.raises(AnnotationError, match=r"train\.json: entry 1: id 'x' appears twice"):
        OmniDiffReal(tmp_path, "train")
    path.write_text(json.dumps({"x": e}))
    with pytest.raises(AnnotationError, match=r"train\.json: expected a list"):
        OmniDiffReal(tmp_path, "train")
    path.write_bytes(b'[{"caption": "caf\xe9"}]')
    with pytest.raises(AnnotationError, match=r"train\.json: not UTF-8: byte 0xe9 at line 1"):
        OmniDiffReal(tmp_path, "train")


def test_change_type_names_are_normalised_and_unknown_ones_kept_and_logged(tmp_path: Path, caplog) -> None:
    assert len(CHANGE_TYPES) == 12  # paper, section 3.1
    assert normalise_change_type(" OCR (textual changes) ") == "ocr" and normalise_change_type("Colour") == "color"
    assert normalise_change_type("Count") == "counting" and normalise_change_type("view-point") == "view_point"
    _img(tmp_path / "Render" / "a.png", 1)
    _img(tmp_path / "Render" / "b.png", 2)
    entry = {"image1": "a.png", "image2": "b.png", "caption": "c", "change_types": ["weather", "size", "size"]}
    (tmp_path / "Render" / "train.json").write_text(json.dumps([entry]))
    with caplog.at_level(logging.WARNING, logger="namc.data.idc.omnidiff"):
        ds = OmniDiffRender(tmp_path, "train")
    assert ds.entries[0][4] == ("size", "weather")
    assert "change types outside OmniDiff's 12 (kept as written): weather" in caplog.text


def test_data_module_batches_carry_every_type_of_a_pair(tmp_path: Path) -> None:
    _omnidiff(tmp_path)
    dm = BenchmarkDataModule(
        name="omnidiff",
        root=str(tmp_path),
        batch_size=4,
        num_workers=0,
        image_size=16,
        tokenizer="word",
        max_caption_len=24,
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert sorted(batch["ids"]) == ["real/r1", "real/r2", "render/7", "render/train.json#1"]
    by_id = dict(zip(batch["ids"], batch["change_types"]))
    assert by_id["real/r1"] == ("addition", "pose")
    row = batch["ids"].index("real/r1")
    assert int((batch["caption"][row] != 0).sum()) == 24  # the long caption is cut to max_caption_len ids


REFS = {
    "a": ["a red cup was added on the table and the man turned to the left"],
    "b": ["the red cup is gone from the table"],
    "c": ["the lamp is brighter and the man turned to the right"],
    "d": ["a sign now reads open"],
}
PREDS = {"a": "a red cup was added on the table", "b": "the cup is gone", "c": "the man turned", "d": "a sign"}
TYPES = {"a": ("addition", "pose"), "b": ("disappearance",), "c": ("illumination", "pose"), "d": ("ocr",)}
NUM_PAIRS = {"addition": 1, "disappearance": 1, "illumination": 1, "ocr": 1, "pose": 2}


def test_per_type_grouping_counts_a_pair_under_each_of_its_types() -> None:
    """The grouping of CaptionEvaluator._score_per_type with pycocoevalcap's BLEU / ROUGE-L / CIDEr-D on captions
    that are already PTB-like (lower case, no punctuation); METEOR's JVM is left out here (the slow test below runs
    the whole evaluation)."""
    pytest.importorskip("pycocoevalcap")
    from namc.eval.captions import CaptionEvaluator

    class NoMeteor(CaptionEvaluator):
        def _meteor_score(self, gts, res) -> float:
            return 0.0

    ev = NoMeteor(spice=False)
    gts, res = REFS, {k: [v] for k, v in PREDS.items()}
    per_type, counts = ev._score_per_type(gts, res, TYPES, "unavailable (test)", {})
    assert counts == NUM_PAIRS
    assert per_type["pose"] == {
        **ev._score({k: gts[k] for k in "ac"}, {k: res[k] for k in "ac"}),
        "SPICE": "unavailable (test)",
    }
    assert per_type["pose"]["CIDEr-D"] != per_type["addition"]["CIDEr-D"]
    # a plain string type still means one group (CLEVR-Change), an empty tuple none
    _, counts = ev._score_per_type(gts, res, {"a": "move", "b": "move", "c": (), "d": ["ocr"]}, "-", {})
    assert counts == {"move": 2, "ocr": 1}


@pytest.mark.slow
def test_per_type_scores_count_a_pair_under_each_of_its_types() -> None:
    pytest.importorskip("pycocoevalcap")
    from namc.eval.captions import CaptionEvaluator

    with CaptionEvaluator(spice=False) as ev:
        scores = ev.evaluate(PREDS, REFS, change_types=TYPES)
        pose = ev.evaluate({k: PREDS[k] for k in "ac"}, {k: REFS[k] for k in "ac"})
    assert scores["per_type_num_pairs"] == NUM_PAIRS
    assert scores["per_type"]["pose"] == pose["overall"]  # the subset of pairs that have a pose change
    assert scores["num_pairs"] == 4


def test_finetune_records_long_generation_in_the_exported_config() -> None:
    module = FinetuneModule(model="namc_tiny", overrides={"dim": 32, "heads": 2}, max_new_tokens=63)
    assert module.model.config.max_caption_len == 64 and module.model.config.max_new_tokens == 63
    with pytest.raises(ValueError, match=r"max_new_tokens must be in \[1, 63\] .* got 64"):
        FinetuneModule(model="namc_tiny", overrides={"dim": 32, "heads": 2}, max_new_tokens=64)
    assert FinetuneModule(model="namc_tiny", overrides={"dim": 32, "heads": 2}).model.config.max_new_tokens == 23


def test_skip_none_collate_drops_unreadable_pairs(tmp_path: Path) -> None:
    _omnidiff(tmp_path)
    ds = OmniDiffReal(tmp_path, "train", image_size=16)
    (tmp_path / "Real" / "scene_a" / "2_after.jpg").write_bytes(b"not an image")
    from namc.text.tokenizer import WordTokenizer

    collate = SkipNone(CaptionCollator(WordTokenizer.build([LONG]), 160))
    batch = collate([ds[0], ds[1]])
    assert batch["ids"] == ["real/r1"] and ds.issues.counts["corrupt_image"] == 1
    assert torch.is_tensor(batch["caption"])
