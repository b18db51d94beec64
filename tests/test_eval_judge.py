"""The change-level judge: its answers read and scored against hand-worked examples, and ``namc eval judge`` against
a real chat-completions server (tests/llm_server.py) answering scripted judgements: malformed answers counted and
repaired, never fatal; the cache makes a rerun ask nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import namc.llm  # noqa: F401 (the commands import the client lazily: its import time is not a test's)
from namc.eval.captions.cli import main as eval_main
from namc.eval.lmm.changes import Judgement, MalformedJudgement, parse_judgement, score_judgements
from namc.eval.lmm.judge import REPAIR

sys.path.insert(0, str(Path(__file__).parent))
from llm_server import LLMServer, judge_answer  # noqa: E402

FAST = ["--timeout", "20", "--backoff-base", "0.01", "--backoff-max", "0.03", "--max-attempts", "2", "--quiet"]
TWO = ["the red cube was added", "the blue sphere was removed"]


def _judgement(refs: list[str], predicted: list[tuple[str, int | None]]) -> dict:
    return {"reference_changes": refs, "prediction_changes": [{"change": c, "match": m} for c, m in predicted]}


def test_one_of_two_changes_named_is_recall_one_half() -> None:
    j = parse_judgement(json.dumps(_judgement(TWO, [("a red cube appeared", 0)])))
    scores = score_judgements({"p1": j}, {"p1": "add"})
    assert scores["changes"]["recall"] == 0.5 and scores["changes"]["precision"] == 1.0
    assert scores["changes"]["F1"] == pytest.approx(2 / 3)
    assert scores["per_type"]["add"]["recall"] == 0.5


def test_an_invented_change_on_a_distractor_is_counted() -> None:
    silent = parse_judgement(json.dumps(_judgement([], [])))
    invented = parse_judgement(json.dumps(_judgement([], [("the cube turned red", None)])))
    both = parse_judgement(json.dumps(_judgement(TWO, [("a red cube appeared", 0), ("a cone moved", None)])))
    types = {"d1": "no_change", "d2": "distractor", "c": "add"}
    scores = score_judgements({"d1": silent, "d2": invented, "c": both}, types)
    d = scores["distractors"]
    assert d == {"pairs": 2, "said_no_change": 0.5, "invented_change": 0.5, "invented_changes": 1}
    c = scores["changes"]  # distractors stay out of change precision and recall
    assert (c["pairs"], c["precision"], c["recall"]) == (1, 0.5, 0.5)
    # without types, a pair whose references name no change is the distractor
    untyped = score_judgements({"d2": invented, "c": both})
    assert untyped["distractors"]["invented_change"] == 1.0 and untyped["changes"]["pairs"] == 1


def test_a_reference_change_counts_once() -> None:
    j = Judgement(tuple(TWO), ("a red cube appeared", "a red block was added"), (0, 0))
    assert j.counts() == (2, 1, 2, 1)  # (predicted, matched, references, found): the duplicate is no second hit


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ("The prediction names one change.", "no JSON object"),
        ('{"reference_changes": ["a"], "prediction_changes": [{"change": "b", "match": 3}]}', "not an index of the 1"),
        ('{"reference_changes": "a", "prediction_changes": []}', "'reference_changes' is not a list"),
        ('{"reference_changes": [], "prediction_changes": [{"match": null}]}', r"prediction_changes\[0\] is not"),
        ('{"reference_changes": ["a"], "prediction_changes": [{"change": "b", "match": true}]}', "not an index"),
        ('{"reference_changes": ["a"], "prediction_changes": [', "no JSON object"),
        ('{"reference_changes": ["a"], "reference_changes": ["b"], "prediction_changes": []}', "not JSON"),
    ],
)
def test_malformed_answers_are_refused_in_one_line(answer: str, error: str) -> None:
    with pytest.raises(MalformedJudgement, match=error) as caught:
        parse_judgement(answer)
    assert "\n" not in str(caught.value)


def test_an_answer_in_a_code_fence_after_a_preamble_is_read() -> None:
    body = json.dumps(_judgement(TWO, [("a red cube appeared", 0)]))
    assert parse_judgement(f"Here is the judgement:\n```json\n{body}\n```\n").counts() == (1, 1, 2, 1)


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    refs = {
        "c1": ["the red cube was added and the blue sphere was removed", "a red cube appeared, the blue ball is gone"],
        "c2": ["the green cylinder moved"],
        "d1": ["nothing has changed", "the scene is the same"],
        "d2": ["there is no difference"],
    }
    lmm = {"c1": "a red cube appeared", "c2": "the cylinder moved", "d1": "nothing changed", "d2": "a cube turned red"}
    namc = {**lmm, "c1": "the red cube was added and the blue sphere was removed", "d2": "nothing has changed"}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "types.json").write_text(json.dumps({"c1": "add", "c2": "move", "d1": "no_change", "d2": "no_change"}))
    (tmp_path / "lmm.json").write_text(json.dumps(lmm))
    (tmp_path / "namc.json").write_text(json.dumps(namc))
    return tmp_path / "lmm.json", tmp_path / "namc.json", tmp_path / "refs.json"


SCRIPTS = {
    "a red cube appeared": [_judgement(TWO, [("a red cube appeared", 0)])],
    "the red cube was added and the blue sphere was removed": [
        "I think both changes are named.",  # malformed first, then repaired
        _judgement(TWO, [("the red cube was added", 0), ("the blue sphere was removed", 1)]),
    ],
    "the cylinder moved": ["not JSON at all"],  # malformed in every round: left out and counted
    "nothing changed": [_judgement([], [])],
    "nothing has changed": [_judgement([], [])],
    "a cube turned red": [_judgement([], [("a cube turned red", None)])],
}


@pytest.mark.slow  # three command runs against the server (test_a_repair_request_... is the fast one)
def test_judge_scores_systems_counts_malformed_answers_and_caches(tmp_path: Path, capsys) -> None:
    lmm, namc, refs = _files(tmp_path)
    out = tmp_path / "judge"
    argv = ["judge", str(lmm), str(namc), "--references", str(refs), "--types", str(tmp_path / "types.json")]
    argv += ["--out", str(out), "--max-rounds", "2", *FAST]
    with LLMServer(answer=judge_answer(SCRIPTS)) as server:
        assert eval_main(["judge", str(lmm), "--references", str(refs), "--out", str(out), "--temperature", "0.7"]) == 2
        assert "temperature 0" in capsys.readouterr().err
        server.url  # noqa: B018 (the server is up for the runs below)
        assert eval_main([*argv, "--base-url", server.url]) == 0
        # 6 distinct (pair, prediction) judgements; 2 malformed ones asked once more each
        assert sum(server.actions.values()) == 6 + 2
        report = json.loads((out / "judge.json").read_text())
        assert eval_main([*argv, "--base-url", server.url]) == 0
        assert sum(server.actions.values()) == 8  # all cached
    a, b = report["systems"][str(lmm)], report["systems"][str(namc)]
    assert a["changes"]["pairs"] == 1 and a["changes"]["recall"] == 0.5 and a["changes"]["precision"] == 1.0
    assert a["left_out"] == {"malformed_judgement": 1}
    assert a["distractors"] == {"pairs": 2, "said_no_change": 0.5, "invented_change": 0.5, "invented_changes": 1}
    assert b["changes"]["recall"] == 1.0 and b["distractors"]["said_no_change"] == 1.0
    assert report["run"]["repairs"] == 2 and report["run"]["requests"] == 8
    cache = [json.loads(line) for line in (out / "judgements.jsonl").read_text().splitlines()]
    assert len(cache) == 8 and sorted(r["round"] for r in cache).count(1) == 2
    printed = capsys.readouterr().out
    assert "malformed_judgement=1" in printed and "change-level judge" in printed


def test_a_repair_request_carries_the_bad_answer_and_its_error(tmp_path: Path) -> None:
    lmm, _, refs = _files(tmp_path)
    seen: list[str] = []
    scripted = judge_answer(SCRIPTS)

    def answer(text: str, images: list[bytes]) -> str:
        seen.append(text)
        return scripted(text, images)

    with LLMServer(answer=answer) as server:
        argv = ["judge", str(lmm), "--references", str(refs), "--out", str(tmp_path / "j"), "--base-url", server.url]
        assert eval_main([*argv, "--max-rounds", "3", *FAST]) == 0
    repairs = [t for t in seen if "could not be read" in t]
    assert len(repairs) == 2 and all("not JSON at all" in t for t in repairs)  # round 2 and 3 of "the cylinder"
    assert REPAIR.split(":")[0] in repairs[0] and "no JSON object in the answer" in repairs[0]
