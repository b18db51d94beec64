"""``namc curate audit``: NIM's word-level irrelevance (1 - R_T, Eq. 1) over a shapes-world manifest with labelled
noise: per-word scores, spans, the HTML report, the filtered manifest, precision/recall at several thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import namc
from namc.curate.audit import main as audit_main
from namc.curate.audit import precision_recall
from namc.curate.audit.score import flag_spans, word_ids
from namc.data.corpus.records import parse_record
from namc.data.synthetic import generate_corpus
from namc.data.transforms import ImageTransform
from namc.text.tokenizer import WordTokenizer


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("audit")
    generate_corpus(root / "corpus", 12, image_size=64, seed=1, noise_rate=0.3)
    manifest = root / "corpus" / "manifest.jsonl"
    lines = manifest.read_text(encoding="utf-8").splitlines()
    evil = json.loads(lines[0])  # an LLM answer with markup in it must be shown, never run
    evil.update(id="evil", desc1=None, verb1=None, desc2=None, verb2=None, noise1=None, noise2=None)
    evil["description"] = evil["description"].replace("first image shows", "first image shows <script>x</script>", 1)
    missing = {**json.loads(lines[1]), "id": "missing", "image2": "images/nope.png"}
    with open(manifest, "a", encoding="utf-8") as f:
        for obj in (evil, missing):
            f.write(json.dumps({k: v for k, v in obj.items() if v is not None}) + "\n")
    texts = [json.loads(line)["description"] for line in lines] + ["<script>x</script>"]
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", tokenizer=WordTokenizer.build(texts), dim=32, heads=2)
    model.save_pretrained(root / "model")
    out = root / "reports" / "audit"  # another depth than the manifest's folder: references must be rebased
    rc = audit_main(
        [
            "--model",
            str(root / "model"),
            "--manifest",
            str(manifest),
            "--out",
            str(out),
            "--quiet",
            "--batch-size",
            "5",
            "--max-flagged",
            "0.1",
        ]
    )
    assert rc == 0
    rows = [json.loads(line) for line in (out / "audit.jsonl").read_text(encoding="utf-8").splitlines()]
    return {
        "root": root,
        "manifest": manifest,
        "out": out,
        "rows": rows,
        "model": model,
        "summary": json.loads((out / "summary.json").read_text()),
    }


def test_scores_are_nims_irrelevance_per_word(world: dict) -> None:
    rows = {r["id"]: r for r in world["rows"]}
    assert len(rows) == 13 and world["summary"]["skipped"] == {"missing_image": 1}
    record = parse_record(json.loads(world["manifest"].read_text(encoding="utf-8").splitlines()[2]))
    row = rows[record.id]
    assert row["words1"] == record.desc1.split() and len(row["scores1"]) == len(row["words1"])
    # recompute Eq. 1 for half 1 by hand: R_T[n] = max_m cos(H_I[m], H_T[n]); a word's score = mean of 1 - R_T
    model = world["model"].eval()
    tok = model.tokenizer
    ids, word_of = word_ids(tok, record.desc1, 46)
    text = torch.tensor([[tok.bos_id, *ids, tok.eos_id]])
    image = ImageTransform(model.config.image_size).load(world["manifest"].parent / record.image1)[None]
    with torch.no_grad():
        _, h_img = model.nim.encode_image(image)
        _, h_txt = model.nim.encode_text(text, tok.eos_id)
    cos = torch.nn.functional.normalize(h_img, dim=-1) @ torch.nn.functional.normalize(h_txt, dim=-1).transpose(1, 2)
    ir = 1 - cos[0].amax(dim=0)[1 : 1 + len(ids)]  # (L,) word tokens after [SOS]
    expected = [float(ir[[t for t, w in enumerate(word_of) if w == k]].mean()) for k in range(len(row["words1"]))]
    assert row["scores1"] == pytest.approx(expected, abs=2e-4)


def test_flags_spans_and_filtered_manifest(world: dict) -> None:
    t = world["summary"]["threshold"]
    for row in world["rows"]:
        for k in ("1", "2"):
            assert row["spans" + k] == flag_spans(row["words" + k], row["scores" + k], t)
    filtered = (world["out"] / "manifest.filtered.jsonl").read_text(encoding="utf-8")
    kept = [json.loads(line) for line in filtered.splitlines()]
    expect = sorted(r["id"] for r in world["rows"] if r["flagged_fraction"] <= 0.1)
    assert sorted(k["id"] for k in kept) == expect and world["summary"]["kept"] == len(expect)
    for obj in kept:  # a valid manifest for `namc data pack`, references rewritten for the new folder
        rec = parse_record(obj)
        assert (world["out"] / rec.image1).is_file() and (world["out"] / rec.image2).is_file()


def test_flag_spans_hand_values() -> None:
    words = ["a", "red", "cube", "on", "a", "wooden", "table"]
    scores = [0.1, 0.2, 0.9, 0.95, 0.3, 0.8, None]
    assert flag_spans(words, scores, 0.8) == [
        {"start": 2, "end": 4, "text": "cube on", "max_score": 0.95},
        {"start": 5, "end": 6, "text": "wooden", "max_score": 0.8},
    ]
    assert flag_spans(words, scores, 2.0) == []


def test_precision_recall_against_the_labels(world: dict) -> None:
    noise = world["summary"]["noise_labels"]
    labels = {}
    for line in world["manifest"].read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        if "noise1" in obj:
            labels[obj["id"]] = obj["noise1"] + obj["noise2"]
    s = np.array([x for r in world["rows"] if r["id"] in labels for x in r["scores1"] + r["scores2"]])
    y = np.array([bool(v) for r in world["rows"] if r["id"] in labels for v in labels[r["id"]]])
    assert noise["words"] == len(y) and noise["noise_words"] == int(y.sum()) > 0
    assert len(noise["precision_recall"]) >= 3
    for row in noise["precision_recall"]:
        flag = s >= row["threshold"] - 5e-5  # scores in the JSONL are rounded to 4 decimals
        assert row["flagged"] == pytest.approx(int(flag.sum()), abs=2)
        assert row["recall"] == pytest.approx((flag & y).sum() / y.sum(), abs=0.03)
    # hand values of the helper itself
    rows = precision_recall(np.array([0.9, 0.8, 0.3, 0.1]), np.array([True, False, True, False]), [0.5, 0.2])
    assert rows[0]["precision"] == 0.5 and rows[0]["recall"] == 0.5
    assert rows[1]["precision"] == pytest.approx(2 / 3) and rows[1]["recall"] == 1.0
    (none,) = precision_recall(np.array([0.1, 0.2]), np.array([False, False]), [0.5])  # nothing flagged, no noise
    assert none["precision"] is None and none["recall"] is None and "NaN" not in json.dumps(none)


def test_html_report_is_self_contained_and_escaped(world: dict) -> None:
    page = (world["out"] / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert page.count('src="data:image/jpeg;base64,') == 2 * 13  # both images of every audited pair, embedded
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    assert "<mark" in page


def test_audit_needs_nim(world: dict, tmp_path: Path) -> None:
    from namc.curate.audit import run_audit

    model = namc.create_model("namc_tiny", tokenizer=world["model"].tokenizer, dim=32, heads=2)
    model.drop_pretraining_modules()
    with pytest.raises(ValueError, match="needs NIM"):
        run_audit(model, world["manifest"], tmp_path, progress=False)
