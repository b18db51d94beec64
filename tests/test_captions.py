"""Caption metrics: the wrapper reproduces pycocoevalcap (x100), splits by change type, reports SPICE honestly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

from namc.eval.captions import (
    METRIC_KEYS,
    CaptionEvaluator,
    evaluate_captions,
    main,
    metrics,
    ptb_tokenize,
    spice_status,
    write_results,
)

# CLEVR-Change-like pairs: id -> references, and a prediction of varying quality for each.
REFERENCES = {
    "000001.png": ["The red cube has moved.", "the red cube changed its location", "The red cube was moved."],
    "000002.png": ["The small gray ball has disappeared.", "the tiny gray sphere is missing"],
    "000003.png": ["A big blue cylinder has been added.", "someone added a large blue cylinder"],
    "000004.png": ["The green cube changed to purple.", "the green block became purple"],
    "000005.png": ["The shiny sphere became matte.", "the metal ball changed to rubber"],
    "000006.png": ["There is no change.", "nothing has changed", "the scene is the same"],
    "000007.png": ["The yellow cylinder was moved.", "the yellow cylinder changed its location"],
    "000008.png": ["A small cyan cube has been added.", "someone added a tiny cyan block"],
}
PREDICTIONS = {
    "000001.png": "the red cube has moved",
    "000002.png": "the small gray ball is missing .",
    "000003.png": "a big blue cylinder was added",
    "000004.png": "the green cube changed to red",
    "000005.png": "",  # an empty prediction is scored, not an error
    "000006.png": "there is no change",
    "000007.png": "the yellow sphere was moved",
    "000008.png": "A small cyan cube has appeared!",
}
TYPES = {
    "000001.png": "move",
    "000002.png": "drop",
    "000003.png": "add",
    "000004.png": "color",
    "000005.png": "material",
    "000006.png": "distractor",
    "000007.png": "move",
    "000008.png": "add",
}


@pytest.fixture(scope="module")
def evaluator():
    """One METEOR JVM for the whole module (it takes seconds to start)."""
    with CaptionEvaluator(spice=True) as ev:
        yield ev


@pytest.fixture(scope="module")
def scores(evaluator):
    return evaluator.evaluate(PREDICTIONS, REFERENCES, change_types=TYPES)


def _pycocoevalcap_scores(
    predictions: dict[str, str], references: dict[str, list[str]], meteor_scorer: Meteor
) -> dict[str, float]:
    """What COCOEvalCap.evaluate() computes, called directly on pycocoevalcap's own classes (not x100)."""
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({k: [{"caption": c} for c in refs] for k, refs in references.items()})
    res = tokenizer.tokenize({k: [{"caption": predictions[k]}] for k in references})
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    meteor, _ = meteor_scorer.compute_score(gts, res)
    rouge, _ = Rouge().compute_score(gts, res)
    cider, _ = Cider().compute_score(gts, res)
    return {
        "BLEU-1": bleu[0],
        "BLEU-2": bleu[1],
        "BLEU-3": bleu[2],
        "BLEU-4": bleu[3],
        "METEOR": meteor,
        "ROUGE-L": rouge,
        "CIDEr-D": cider,
    }


@pytest.mark.slow  # the module's METEOR JVM loads its paraphrase table (seconds)
def test_reproduces_pycocoevalcap_x100(evaluator, scores):
    # pycocoevalcap's own Meteor object; we borrow the evaluator's running one rather than wait for a second JVM
    # (each METEOR EVAL request is independent of earlier ones).
    meteor_scorer = evaluator._meteor_scorer()
    assert isinstance(meteor_scorer, Meteor)
    expected = _pycocoevalcap_scores(PREDICTIONS, REFERENCES, meteor_scorer)
    overall = scores["overall"]
    assert list(overall) == list(METRIC_KEYS)
    for key, value in expected.items():
        assert overall[key] == pytest.approx(100.0 * value, rel=1e-12, abs=1e-12), key
    # Not trivially zero or saturated on this mixed-quality set.
    assert 0.0 < overall["BLEU-4"] < 100.0
    assert overall["CIDEr-D"] > 0.0
    assert scores["num_pairs"] == len(PREDICTIONS)
    assert scores["scale"] == "x100"
    assert scores["tokenizer"] == "PTB"


def test_ptb_tokenize_matches_pycocoevalcap_and_keeps_lines_aligned():
    captions = {k: [PREDICTIONS[k], *REFERENCES[k]] for k in REFERENCES}
    expected = PTBTokenizer().tokenize({k: [{"caption": c} for c in caps] for k, caps in captions.items()})
    assert ptb_tokenize(captions) == expected
    # A carriage return or U+2028 inside a caption makes the Java tokenizer emit an extra line; pycocoevalcap then
    # shifts every later caption onto the wrong id. Ours stays aligned.
    tricky = {"a": ["The red\rcube.", "A\u2028blue ball"], "b": [""], "c": ["Last one!"]}
    assert ptb_tokenize(tricky) == {"a": ["the red cube", "a blue ball"], "b": [""], "c": ["last one"]}


@pytest.mark.slow  # the module's METEOR JVM
def test_per_type_scores_are_subset_scores(evaluator, scores):
    assert set(scores["per_type"]) == set(TYPES.values())
    assert scores["per_type_num_pairs"] == {"add": 2, "color": 1, "distractor": 1, "drop": 1, "material": 1, "move": 2}
    # Each type is scored on its subset alone (CIDEr-D's IDF from the subset), like the CLEVR-Change code.
    for change_type in ("add", "move"):
        ids = [k for k, t in TYPES.items() if t == change_type]
        alone = evaluator.evaluate({k: PREDICTIONS[k] for k in ids}, {k: REFERENCES[k] for k in ids})
        assert scores["per_type"][change_type] == alone["overall"]
    assert scores["per_type"]["material"]["BLEU-1"] == pytest.approx(0.0, abs=1e-6)  # the empty prediction
    assert scores["per_type"]["add"]["CIDEr-D"] != pytest.approx(scores["overall"]["CIDEr-D"])


@pytest.mark.slow  # the module's METEOR JVM
def test_spice_reported_unavailable_not_zero(scores):
    available, reason = spice_status()
    if available:
        pytest.skip("the Stanford CoreNLP 3.6.0 jars are installed here, so SPICE runs")
    assert "stanford-corenlp-3.6.0" in reason
    assert scores["overall"]["SPICE"] == f"unavailable ({reason})"
    assert all(s["SPICE"] == f"unavailable ({reason})" for s in scores["per_type"].values())
    # The status check runs before Spice() is constructed, so nothing was downloaded into the package.
    assert not (metrics._spice_dir() / "lib" / "stanford-corenlp-3.6.0.jar").exists()


@pytest.mark.slow  # the module's METEOR JVM
def test_spice_disabled(evaluator):
    ids = ["000001.png", "000006.png"]
    evaluator.spice = False
    try:
        out = evaluator.evaluate({k: PREDICTIONS[k] for k in ids}, {k: REFERENCES[k] for k in ids})
    finally:
        evaluator.spice = True
    assert out["overall"]["SPICE"] == "unavailable (disabled: spice=False)"
    assert "per_type" not in out


@pytest.mark.slow  # the module's METEOR JVM
def test_perfect_predictions_beat_shuffled(evaluator):
    perfect = {k: refs[0] for k, refs in REFERENCES.items()}
    keys = list(REFERENCES)
    shuffled = {k: REFERENCES[keys[(i + 3) % len(keys)]][0] for i, k in enumerate(keys)}
    good = evaluator.evaluate(perfect, REFERENCES)["overall"]
    bad = evaluator.evaluate(shuffled, REFERENCES)["overall"]
    assert good["BLEU-4"] == pytest.approx(100.0, abs=1e-4)
    assert good["ROUGE-L"] == pytest.approx(100.0)
    assert good["CIDEr-D"] > bad["CIDEr-D"] + 100.0
    assert good["METEOR"] > bad["METEOR"]


@pytest.mark.parametrize(
    ("predictions", "references", "types", "message"),
    [
        (
            {**PREDICTIONS, "extra_1.png": "a cube"},
            REFERENCES,
            None,
            r"1 prediction id\(s\) have no references: 'extra_1.png'",
        ),
        (
            {k: v for k, v in PREDICTIONS.items() if k != "000002.png"},
            REFERENCES,
            None,
            r"reference id\(s\) have no prediction: '000002.png'",
        ),
        ({**PREDICTIONS, "000001.png": None}, REFERENCES, None, r"must be strings.*'000001.png'"),
        (PREDICTIONS, {**REFERENCES, "000003.png": []}, None, r"non-empty lists.*'000003.png'"),
        (PREDICTIONS, {**REFERENCES, "000003.png": "a string"}, None, r"non-empty lists.*'000003.png'"),
        (PREDICTIONS, REFERENCES, {"000001.png": "move"}, r"7 prediction id\(s\) have no change type: '000002.png'"),
        ({}, {}, None, "no predictions"),
    ],
)
def test_bad_input_names_ids(predictions, references, types, message):
    # Validation runs before any Java process starts.
    with pytest.raises(ValueError, match=message):
        CaptionEvaluator().evaluate(predictions, references, change_types=types)


def test_id_mismatch_message_is_short():
    many = {f"x{i:03d}": "a cube" for i in range(40)}
    with pytest.raises(ValueError, match=r"40 prediction id\(s\).*'x004' and 35 more") as info:
        evaluate_captions(many, {"y": ["a cube"]})
    assert "x039" not in str(info.value)


@pytest.mark.slow  # the module's METEOR JVM
def test_write_results_round_trip(tmp_path, scores):
    path = write_results(tmp_path / "sub" / "results.json", PREDICTIONS, REFERENCES, scores)
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    assert data["scores"] == scores
    assert [c["id"] for c in data["captions"]] == list(PREDICTIONS)
    assert data["captions"][1] == {
        "id": "000002.png",
        "prediction": PREDICTIONS["000002.png"],
        "references": REFERENCES["000002.png"],
    }


@pytest.mark.slow  # starts a METEOR JVM
def test_close_stops_the_jvm():
    ev = CaptionEvaluator(spice=False)
    process = ev._meteor_scorer().meteor_p  # starts the JVM without waiting for it
    assert process.poll() is None
    ev.close()
    assert process.poll() is not None
    ev.close()  # idempotent


@pytest.mark.slow  # each run starts its own METEOR JVM
def test_cli_coco_results_and_type_mapping(tmp_path, capsys):
    ids = ["000001.png", "000002.png", "000006.png"]
    (tmp_path / "pred.json").write_text(json.dumps([{"image_id": k, "caption": PREDICTIONS[k]} for k in ids]))
    (tmp_path / "refs.json").write_text(json.dumps({k: REFERENCES[k] for k in ids}))
    (tmp_path / "types.json").write_text(json.dumps({"move": ids[:1], "drop": ids[1:2], "distractor": ids[2:]}))
    out = tmp_path / "results.json"
    argv = [str(tmp_path / "pred.json"), str(tmp_path / "refs.json"), "--types", str(tmp_path / "types.json")]
    assert main([*argv, "--out", str(out), "--no-spice"]) == 0
    printed = capsys.readouterr().out
    assert "CIDEr-D" in printed and "distractor" in printed
    saved = json.loads(out.read_text())["scores"]
    assert saved["num_pairs"] == 3
    assert saved["per_type_num_pairs"] == {"distractor": 1, "drop": 1, "move": 1}


@pytest.mark.slow  # each run starts its own METEOR JVM
def test_cli_reads_results_files_and_compares_two_runs(tmp_path, capsys, scores):
    """`namc eval` takes what `namc test` writes (predictions and references) and counts identical captions."""
    first = write_results(tmp_path / "fp32.json", PREDICTIONS, REFERENCES, scores)
    changed = {**PREDICTIONS, "000002.png": "the gray ball is gone", "000005.png": "the ball became rubber"}
    second = write_results(tmp_path / "bf16.json", changed, REFERENCES, scores)
    out = tmp_path / "results.json"
    assert main([str(second), str(second), "--compare", str(first), "--no-spice", "--out", str(out)]) == 0
    assert f"identical to {first}: 6 of 8 captions (75.0%)" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["scores"]["compare"] == {"file": str(first), "identical": 6, "pairs": 8, "fraction": 0.75}
    assert {c["id"]: c["prediction"] for c in saved["captions"]} == changed
    assert saved["scores"]["num_pairs"] == 8 and saved["captions"][0]["references"] == REFERENCES["000001.png"]

    fewer = write_results(tmp_path / "fewer.json", dict(list(PREDICTIONS.items())[:5]), REFERENCES, scores)
    assert main([str(second), str(second), "--compare", str(fewer), "--no-spice"]) == 2
    err = capsys.readouterr().err
    assert f"{fewer}: not the same pairs (3 missing: '000006.png', '000007.png', '000008.png'" in err


def test_cli_malformed_json_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "pred.json"
    bad.write_text('{\n  "a": "x",\n  "b": \n}\n')
    refs = tmp_path / "refs.json"
    refs.write_text("{}")
    assert main([str(bad), str(refs)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "line 4" in err


def test_dead_meteor_jvm_is_a_clear_error():
    ev = CaptionEvaluator(spice=False)
    process = ev._meteor_scorer().meteor_p
    process.kill()
    process.wait()
    with pytest.raises(RuntimeError, match="METEOR JVM exited"):
        ev.evaluate({"1": "the red cube moved"}, {"1": ["the red cube has moved"]})
    ev.close()
