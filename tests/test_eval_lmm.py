"""``namc eval lmm`` against a real chat-completions server (tests/llm_server.py) on a shapes-world benchmark: every
pair captioned once, a rerun asks nothing, failures counted by kind, resumption after a torn write and after SIGKILL,
the prompts' words, and the comparison report beside namc with the judge-free diagnostic."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import namc.llm  # noqa: F401 (the commands import the client lazily: its import time is not a test's)
from namc.curate.prompts import CC3M_PROMPT, CONVENTIONAL_PROMPT
from namc.data.synthetic import generate_benchmark
from namc.eval.captions.cli import main as eval_main
from namc.eval.lmm.pairs import benchmark_pairs
from namc.eval.lmm.presets import CAPTION_PRESETS, SlotError, fill_slots, load_prompt
from namc.text.template import TEMPLATE

sys.path.insert(0, str(Path(__file__).parent))
from llm_server import LLMServer, labelled_answer, pair_digest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--timeout", "20", "--backoff-base", "0.01", "--backoff-max", "0.03", "--max-attempts", "3", "--quiet"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A shapes-world benchmark (CLEVR-Change layout) and a labelled caption for each test pair."""
    root = tmp_path_factory.mktemp("world") / "clevr_change"
    generate_benchmark(root, 6, image_size=32, seed=0, n_captions=2, splits=(0.2, 0.0, 0.8))
    pairs, _ = benchmark_pairs("clevr_change", root, "test")
    labels = {}
    for p in pairs:  # a labelled "LMM" caption: right on changes, a wrong one on distractors
        digest = pair_digest([Path(p.image1).read_bytes(), Path(p.image2).read_bytes()])
        labels[digest] = f"LMM says: {p.references[0]}" if p.change_type != "no_change" else "a cube turned red"
    return {"root": root, "pairs": pairs, "labels": labels}


def _lmm(world: dict, out: Path, url: str, *extra: str) -> int:
    argv = ["lmm", "--dataset", "clevr_change", "--root", str(world["root"]), "--out", str(out), "--base-url", url]
    return eval_main([*argv, *FAST, *extra])


def _answers(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "answers.jsonl").read_text(encoding="utf-8").splitlines()]


def test_presets_are_the_papers_words() -> None:
    assert set(CAPTION_PRESETS) == {"table13", "d2_template", "d2_cc3m"}
    assert load_prompt("table13").text == CONVENTIONAL_PROMPT  # appendix B.2, verbatim (Table 13 prints none)
    assert load_prompt("d2_cc3m").text == CC3M_PROMPT  # appendix D.2, verbatim
    d2 = load_prompt("d2_template")
    assert fill_slots(d2.text).endswith(f"strictly according to the template: '{TEMPLATE}'.")
    assert "#" not in load_prompt("table13").text  # the comment lines at the top are not sent
    filled = fill_slots(CC3M_PROMPT, ("a red cube.", "a {caption} cube"))
    assert "described as: a red cube. Second" in filled and "a {caption} cube" in filled  # not re-expanded
    with pytest.raises(SlotError, match="caption"):
        fill_slots(CC3M_PROMPT, ("only one", None))
    with pytest.raises(ValueError, match="unknown prompt preset 'table14'"):
        load_prompt("table14")


def test_a_bad_prompt_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "latin1.txt").write_bytes("describe the change \xe9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt: not UTF-8"):
        load_prompt(file=tmp_path / "latin1.txt")
    (tmp_path / "comment.txt").write_text("# only a comment\n")
    with pytest.raises(ValueError, match="no text after its comment lines"):
        load_prompt(file=tmp_path / "comment.txt")
    with pytest.raises(ValueError, match="cannot read"):
        load_prompt(file=tmp_path / "absent.txt")


def test_every_pair_once_and_a_rerun_asks_nothing(world: dict, tmp_path: Path) -> None:
    n = len(world["pairs"])
    with LLMServer(answer=labelled_answer(world["labels"])) as server:
        assert _lmm(world, tmp_path / "cmp", server.url, "--no-score") == 0
        assert server.images_seen == 2 * n and sum(server.actions.values()) == n
        assert _lmm(world, tmp_path / "cmp", server.url, "--no-score") == 0
        assert sum(server.actions.values()) == n  # nothing asked again
    answers = _answers(tmp_path / "cmp")
    assert sorted(a["id"] for a in answers) == sorted(p.id for p in world["pairs"])
    for pair in world["pairs"]:
        digest = pair_digest([Path(pair.image1).read_bytes(), Path(pair.image2).read_bytes()])
        assert next(a for a in answers if a["id"] == pair.id)["text"] == world["labels"][digest]
    runs = [json.loads(line) for line in (tmp_path / "cmp" / "runs.jsonl").read_text().splitlines()]
    assert [r["ok"] for r in runs] == [n, 0] and [r["resumed"] for r in runs] == [0, n]
    assert runs[0]["prompt_tokens"] > 0 and runs[0]["completion_tokens"] > 0


def test_another_model_in_the_same_folder_is_refused(world: dict, tmp_path: Path, capsys) -> None:
    with LLMServer(answer=labelled_answer(world["labels"])) as server:
        assert _lmm(world, tmp_path / "cmp", server.url, "--no-score", "--limit", "2") == 0
        assert _lmm(world, tmp_path / "cmp", server.url, "--no-score", "--model", "llava-1.5-7b") == 2
        assert _lmm(world, tmp_path / "cmp", server.url, "--no-score", "--prompt", "d2_template") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("namc eval lmm: error: ") for line in err)
    assert "use another --out for 'llava-1.5-7b'" in err[0] and "prompt 'd2_template'" in err[1]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--concurrency", "0"], "concurrency and max_attempts must be >= 1"),
        (["--max-side", "0"], "--max-side must be at least 1"),
        (["--limit", "-3"], "--limit must be at least 1"),
        (["--namc", "absent.json"], "absent.json: cannot read"),
    ],
)
def test_an_absurd_option_is_a_one_line_error(world: dict, tmp_path: Path, capsys, option, message) -> None:
    with LLMServer(answer=labelled_answer(world["labels"])) as server:
        assert _lmm(world, tmp_path / "cmp", server.url, "--no-spice", *option) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("namc eval lmm: error: ") and message in err and "\n" not in err


def test_failures_are_counted_by_kind(world: dict, tmp_path: Path) -> None:
    pairs = world["pairs"]
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not really")
    rows = []
    for p in pairs[:6]:
        row = {"id": p.id, "image1": p.image1, "image2": p.image2, "references": list(p.references)}
        row |= {"caption1": "a scene", "caption2": "the scene after"}
        rows.append(row)
    rows[0]["caption1"] = "a scene [[500]]"  # a server error, every attempt
    rows[1]["caption1"] = "a scene [[429:0,ok]]"  # answered after a retry
    rows[2]["image2"] = "missing.png"
    rows[3]["image1"] = "broken.png"
    del rows[4]["caption2"]  # the d2_cc3m prompt needs both captions
    lines = [json.dumps(r) for r in rows] + ["{not json", json.dumps({"id": "x", "image1": "a", "image2": "b"})]
    (tmp_path / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "cmp"
    with LLMServer() as server:
        argv = ["lmm", "--pairs", str(tmp_path / "pairs.jsonl"), "--out", str(out), "--base-url", server.url]
        assert eval_main([*argv, "--prompt", "d2_cc3m", "--no-score", *FAST]) == 0
    run = json.loads((out / "runs.jsonl").read_text())
    assert run["lines"] == 8 and run["ok"] == 2 and run["retried_ok"] == 1
    assert run["failed"] == {"server_error": 1, "missing_image": 1, "corrupt_image": 1, "missing_field": 1}
    assert run["skipped"] == {"malformed_line": 1, "missing_references": 1}
    assert run["retries"] == {"rate_limit": 1, "server_error": 2}
    kinds = {a["id"]: a.get("error_kind") for a in _answers(out)}
    assert kinds[pairs[2].id] == "missing_image" and kinds[pairs[4].id] == "missing_field"


def test_a_torn_last_line_is_asked_again_and_nothing_is_duplicated(world: dict, tmp_path: Path) -> None:
    """The resume logic the SIGKILL test exercises, without a process: a run killed mid-write leaves a torn line."""
    n = len(world["pairs"])
    with LLMServer(answer=labelled_answer(world["labels"])) as server:
        assert _lmm(world, tmp_path / "cmp", server.url, "--no-score", "--limit", "5") == 0
        path = tmp_path / "cmp" / "answers.jsonl"
        raw = path.read_bytes()
        path.write_bytes(raw[: raw.rindex(b"\n", 0, len(raw) - 1) + 1] + raw.splitlines()[-1][:17])  # last one torn
        assert _lmm(world, tmp_path / "cmp", server.url, "--no-score") == 0
        assert sum(server.actions.values()) == 5 + (n - 4)  # the torn pair and the ones never asked
    ids = [a["id"] for a in _answers(tmp_path / "cmp")]
    assert len(ids) == len(set(ids)) == n


@pytest.mark.slow  # namc processes killed and resumed
def test_sigkill_mid_run_loses_and_duplicates_nothing(world: dict, tmp_path: Path) -> None:
    n = len(world["pairs"])
    out = tmp_path / "cmp"
    with LLMServer(answer=labelled_answer(world["labels"]), latency=0.2) as server:
        cmd = [sys.executable, "-m", "namc.eval.lmm.caption", "--dataset", "clevr_change", "--root", str(world["root"])]
        cmd += ["--out", str(out), "--base-url", server.url, "--no-score", "--concurrency", "2", *FAST]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        path = out / "answers.jsonl"
        while (not path.exists() or path.read_bytes().count(b"\n") < 3) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        before = path.read_bytes().count(b"\n")
        assert 3 <= before < n
        assert subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=300).returncode == 0
        asked = sum(server.actions.values())
    ids = [a["id"] for a in _answers(out)]
    assert len(ids) == len(set(ids)) == n
    assert asked <= n + 2  # at most the requests in flight at the kill (concurrency 2) were asked twice


@pytest.mark.slow  # the caption metrics start a METEOR JVM
def test_the_report_sets_the_lmm_beside_namc_with_the_diagnostic(world: dict, tmp_path: Path, capsys) -> None:
    pairs = world["pairs"]
    namc_preds = {p.id: p.references[-1] for p in pairs}  # a stand-in for `namc test` captions
    (tmp_path / "namc.json").write_text(json.dumps(namc_preds))
    with LLMServer(answer=labelled_answer(world["labels"])) as server:
        assert _lmm(world, tmp_path / "cmp", server.url, "--namc", str(tmp_path / "namc.json"), "--no-spice") == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "cmp" / "report.json").read_text())
    lmm, namc = report["systems"]["lmm"], report["systems"]["namc"]
    assert report["pairs"] == len(pairs) and lmm["answered"] == len(pairs) and lmm["requests"] == len(pairs)
    assert lmm["prompt_tokens"] > 0 and lmm["completion_tokens"] > 0 and lmm["pairs_per_s"] > 0
    assert set(lmm["scores"]["per_type"]) == {p.change_type for p in pairs}
    # the labelled LMM names no distractor right and namc repeats a reference: namc scores higher on them
    assert namc["scores"]["per_type"]["no_change"]["CIDEr-D"] > lmm["scores"]["per_type"]["no_change"]["CIDEr-D"]
    diag = report["diagnostic"]
    assert diag["no_change"]["caption"] == "no change"
    refs = [r for p in pairs for r in p.references]
    assert diag["most_frequent_reference"]["caption"] == max(sorted(set(refs)), key=refs.count)
    assert diag["no_change"]["per_type"]["no_change"] > diag["no_change"]["per_type"]["move"]
    assert "constant 'no change'" in printed and "CIDEr-D per change type" in printed
    saved = json.loads((tmp_path / "cmp" / "predictions.json").read_text())  # namc's results format
    assert {c["id"]: c["prediction"] for c in saved["captions"]} == {
        a["id"]: a["text"] for a in _answers(tmp_path / "cmp")
    }
    assert eval_main([str(tmp_path / "cmp" / "predictions.json"), str(tmp_path / "cmp" / "predictions.json")]) == 0
    assert "diagnostic: CIDEr-D of the constant 'no change' for every pair" in capsys.readouterr().out


def test_the_diagnostic_scores_captions_that_see_no_image() -> None:
    from namc.eval.captions.metrics import trivial_baselines

    references = {
        "a": ["the red cube moved", "the red cube is somewhere else"],
        "b": ["the green sphere was removed", "the green sphere is gone"],
        "c": ["no change was made", "there is no change"],
        "d": ["nothing has changed", "there is no change"],
        "e": ["the scene is the same", "nothing moved"],
    }
    types = {"a": "move", "b": "drop", "c": "no_change", "d": "no_change", "e": "no_change"}
    diag = trivial_baselines(references, types)
    assert diag["most_frequent_reference"]["caption"] == "there is no change"  # 2 of 10 references
    none = diag["no_change"]
    assert none["caption"] == "no change" and none["CIDEr-D"] > 0
    # CIDEr-D's IDF is the subset's: "no change" scores on the distractors, where 2 of 3 pairs' references say it
    assert none["per_type"]["no_change"] > 0
    assert none["per_type"]["move"] == 0.0 and none["per_type"]["drop"] == 0.0  # none with a change's


def test_the_shapes_comparison_table_is_the_stored_report() -> None:
    """docs/comparison.md's table, cell by cell from benchmarks/results/epyc-avx2-shapes-lmm/report.json."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_tables", ROOT / "benchmarks" / "tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    report = json.loads(tables.LMM_SHAPES.read_text(encoding="utf-8"))
    rows = tables.cells(tables.blocks((ROOT / "docs" / "comparison.md").read_text(encoding="utf-8"))["lmm-shapes"])
    assert rows[0][:2] == ["system", "CIDEr-D"] and set(rows[1]) == {"---"}
    by_label = {row[0]: row for row in rows[2:]}
    assert len(by_label) == len(report["systems"]) + len(report["diagnostic"]) == 4
    for system in report["systems"].values():
        row, scores = by_label[system["label"]], system["scores"]
        assert row[1:5] == [f"{scores['overall'][m]:.2f}" for m in ("CIDEr-D", "BLEU-4", "METEOR", "ROUGE-L")]
        assert row[5] == f"{scores['per_type']['no_change']['CIDEr-D']:.2f}"
    lmm = report["systems"]["lmm"]
    assert by_label[lmm["label"]][6] == str(lmm["requests"]) == str(report["pairs"])  # one request per pair
    assert lmm["without_caption"] == {} and report["source"].startswith("clevr_change test")
    none = by_label["constant 'no change'"]
    assert none[1] == f"{report['diagnostic']['no_change']['CIDEr-D']:.2f}"
    assert none[5] == f"{report['diagnostic']['no_change']['per_type']['no_change']:.2f}"
