"""``namc curate caption / describe / filter`` against a real chat-completions server (tests/llm_server.py): every
outcome counted, resumption after SIGKILL, Table 14, and the whole chain on the shapes world down to pre-training."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from pretrain_smoke import pretrain_two_steps

from namc.curate import caption as caption_cli
from namc.curate import describe as describe_cli
from namc.curate import filtering as filter_cli
from namc.data.synthetic import generate_corpus
from namc.text.template import normalize_whitespace, rebuild

sys.path.insert(0, str(Path(__file__).parent))
from llm_server import DEFAULT_ANSWER, LLMServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--timeout", "0.8", "--backoff-base", "0.01", "--backoff-max", "0.03", "--max-attempts", "3", "--quiet"]
_CAPTIONS = re.compile(r"First image could be described as: (.*?)\. Second image could be described as: (.*?)\. ")


def echo_answer(text: str, images: list[bytes]) -> str:
    """A template-following answer built from the two captions in the prompt (distinct pairs, distinct answers)."""
    m = _CAPTIONS.search(text)
    c1, c2 = (re.sub(r"\[\[.*?\]\]", "", g).strip() for g in m.groups())
    return rebuild("shows", c1, "shows", c2)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("shapes")
    generate_corpus(root / "corpus", 24, image_size=32, seed=3, noise_rate=0.3)
    text = (root / "corpus" / "manifest.jsonl").read_text(encoding="utf-8")
    records = [json.loads(line) for line in text.splitlines()]
    return {"root": root, "records": records}


def _write_pairs(path: Path, shapes: dict, n: int, extra: dict[int, dict] | None = None, captions: bool = True) -> None:
    """A pairs JSONL (interfaces.md format) over the first n shapes pairs; ``extra[i]`` updates pair i."""
    corpus = shapes["root"] / "corpus"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, r in enumerate(shapes["records"][:n]):
            pair = {
                "id": r["id"],
                "source": "shapes",
                "key1": f"{r['id']}/1",
                "key2": f"{r['id']}/2",
                "image1": os.path.relpath(corpus / r["image1"], path.parent),
                "image2": os.path.relpath(corpus / r["image2"], path.parent),
            }
            if captions:
                pair.update(caption1=r["desc1"], caption2=r["desc2"])
            pair.update((extra or {}).get(i, {}))
            f.write(json.dumps(pair) + "\n")


def _results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
def test_every_outcome_is_recorded_and_counted(shapes: dict, tmp_path: Path) -> None:
    pairs = tmp_path / "in" / "pairs.jsonl"
    pairs.parent.mkdir()
    (tmp_path / "in" / "broken.png").write_bytes(b"\x89PNG not really")
    extra = {
        0: {"caption1": "w [[429:0,ok]]"},
        1: {"caption1": "a [[500]]"},
        2: {"caption1": "b [[drop,ok]]"},
        3: {"caption1": "c [[slow]]"},
        4: {"caption1": "d [[off]]"},
        5: {"caption1": "e [[empty]]"},
        6: {"image2": "missing.png"},
        7: {"image1": "broken.png"},
        8: {"source": "std"},  # std without difference
        9: {"source": "ip2p", "instruction": "make it blue"},
        10: {"source": "std", "difference": "a cube moved"},
        11: {"caption1": "f [[garbled]]"},
        12: {"caption1": "g [[cut]]"},
        13: {"caption1": "h [[nousage]]"},
        14: {"source": "ip2p_folder", "instruction": "make it red"},  # a source named by its kind
        15: {"source": "my_edits", "instruction": "make it green"},  # a name of the user's: the pair's fields
    }
    _write_pairs(pairs, shapes, 16, extra)
    with open(pairs, "a", encoding="utf-8") as f:
        f.write("{not json\n" + json.dumps({"id": shapes["records"][0]["id"], "source": "dup"}) + "\n")
    out = tmp_path / "out" / "descriptions.jsonl"
    with LLMServer(answer=echo_answer, slow_seconds=3.0) as server:
        args = ["--pairs", str(pairs), "--out", str(out), "--base-url", server.url, "--concurrency", "4", *FAST]
        assert describe_cli.main(args) == 0
        summary = json.loads(out.with_name("descriptions.summary.json").read_text())
        assert summary["lines"] == 18
        assert summary["ok"] == 16 - 6 and summary["retried_ok"] == 2
        assert summary["failed"] == {
            "server_error": 1,
            "timeout": 1,
            "missing_image": 1,
            "corrupt_image": 1,
            "missing_field": 1,
            "bad_response": 1,
        }
        assert summary["skipped"] == {"malformed_line": 1, "duplicate_id": 1}
        assert summary["retries"] == {"rate_limit": 1, "server_error": 2, "connection": 1, "timeout": 2}
        assert summary["completion_tokens"] > 0 and summary["prompt_tokens"] > summary["completion_tokens"]
        results = _results(out)
        assert len(results) == 16 and len({r["id"] for r in results}) == 16
        by_id = {r["id"]: r for r in results}
        ids = [r["id"] for r in shapes["records"][:16]]
        assert by_id[ids[6]]["error_kind"] == "missing_image" and "missing.png" in by_id[ids[6]]["error"]
        assert by_id[ids[8]]["error_kind"] == "missing_field" and "difference" in by_id[ids[8]]["error"]
        assert [by_id[ids[i]]["prompt"] for i in (0, 9, 10, 14, 15)] == ["cc3m", "ip2p", "std", "ip2p", "ip2p"]
        assert by_id[ids[11]]["error_kind"] == "bad_response"  # a 200 whose body is not JSON: counted, run goes on
        assert by_id[ids[12]]["text"].endswith(" \ufffd")  # half an emoji: the replacement character
        assert by_id[ids[13]]["status"] == "ok"  # usage counts that are not numbers: the answer is kept
        assert by_id[ids[0]]["attempts"] == 2 and (out.parent / by_id[ids[0]]["image1"]).is_file()
        requests = sum(server.actions.values())

        assert describe_cli.main(args) == 0  # a rerun: everything is finished, nothing is requested
        again = json.loads(out.with_name("descriptions.summary.json").read_text())
        assert again["resumed"] == 16 and again["ok"] == 0 and sum(server.actions.values()) == requests

        assert describe_cli.main([*args, "--retry-failed"]) == 0  # the 6 failed pairs only: they fail again
        retry = json.loads(out.with_name("descriptions.summary.json").read_text())
        assert retry["resumed"] == 10 and sum(retry["failed"].values()) == 6
    assert filter_cli.main(["--results", str(out)]) == 0
    manifest = _results(out.parent / "manifest.jsonl")
    rejects = _results(out.parent / "rejects.jsonl")
    assert len(manifest) == 16 - 6 - 2 and len(rejects) == 6 + 2
    assert Counter(r["reason"] for r in rejects) == {"request_failed": 6, "off_template": 1, "empty": 1}
    assert [m["id"] for m in manifest] == sorted(m["id"] for m in manifest)
    assert all((out.parent / m["image1"]).is_file() for m in manifest)  # refs rebased for the manifest's folder


def test_filter_table14_statistics(shapes: dict, tmp_path: Path) -> None:
    recs = shapes["records"]
    same = {"caption1": recs[0]["desc1"], "caption2": recs[0]["desc2"]}  # pairs 0..2 answer identically
    ip2p = {"source": "ip2p", "instruction": "make it blue"}
    extra = {1: same, 2: same, 5: ip2p, 6: ip2p, 7: {**ip2p, "caption1": "q [[off]]"}}
    pairs = tmp_path / "pairs.jsonl"
    _write_pairs(pairs, shapes, 8, extra)
    with LLMServer(answer=echo_answer) as server:
        out = tmp_path / "descriptions.jsonl"
        describe_cli.main(["--pairs", str(pairs), "--out", str(out), "--base-url", server.url, *FAST])
    assert filter_cli.main(["--results", str(out), "--out", str(tmp_path / "corpus" / "manifest.jsonl")]) == 0
    stats = json.loads((tmp_path / "corpus" / "table14.json").read_text())
    rows = stats["table14"]
    texts = [
        echo_answer(f"First image could be described as: {a}. Second image could be described as: {b}. ", [])
        for a, b in [(r["desc1"], r["desc2"]) for r in recs[:5]]
    ]
    texts[1] = texts[2] = texts[0]
    assert rows["shapes"]["total"] == 5 and rows["shapes"]["unique"] == len(set(texts)) == 3
    assert rows["shapes"]["repetition"] == 2 and rows["shapes"]["repetition_ratio"] == pytest.approx(0.4)
    assert rows["ip2p"]["total"] == 2 and rows["ip2p"]["rejected"] == {"off_template": 1}
    assert rows["overall"]["total"] == 7 and rows["overall"]["unique"] == 5
    assert rows["overall"]["rejection_ratio"] == pytest.approx(1 / 8)
    assert stats["accepted"] == 7 and stats["results"] == 8


@pytest.mark.parametrize("keys", [True, False], ids=["key1/key2", "no keys: images keyed by reference"])
def test_caption_step_then_describe_with_joined_captions(shapes: dict, tmp_path: Path, keys: bool) -> None:
    pairs = tmp_path / "pairs.jsonl"
    _write_pairs(pairs, shapes, 4, captions=False)
    if not keys:  # a user's own pairs file: caption keys its images by reference, describe must join the same way
        lines = [json.loads(line) for line in pairs.read_text().splitlines()]
        pairs.write_text("".join(json.dumps({k: v for k, v in p.items() if k[:3] != "key"}) + "\n" for p in lines))
    with LLMServer() as server:
        out = tmp_path / "captions.jsonl"
        assert caption_cli.main(["--pairs", str(pairs), "--out", str(out), "--base-url", server.url, *FAST]) == 0
        captions = _results(out)
        lines = [json.loads(line) for line in pairs.read_text().splitlines()]
        expected = (
            {f"{r['id']}/{k}" for r in shapes["records"][:4] for k in (1, 2)}
            if keys
            else {p[f"image{k}"] for p in lines for k in (1, 2)}
        )
        assert len(captions) == 8 and {c["key"] for c in captions} == expected
        assert server.images_seen == 8  # one image per caption request
        res = tmp_path / "descriptions.jsonl"
        args = ["--pairs", str(pairs), "--captions", str(out), "--out", str(res), "--base-url", server.url, *FAST]
        assert describe_cli.main(args) == 0
    assert all(r["status"] == "ok" for r in _results(res)) and len(_results(res)) == 4


def _describe_proc(pairs: Path, out: Path, url: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "namc.curate.describe",
        "--pairs",
        str(pairs),
        "--out",
        str(out),
        "--base-url",
        url,
        "--concurrency",
        "4",
        *FAST,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow  # namc processes killed and resumed
def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(shapes: dict, tmp_path: Path) -> None:
    n = 24
    pairs = tmp_path / "pairs.jsonl"
    _write_pairs(pairs, shapes, n, {5: {"caption1": "z [[500]]"}, 9: {"caption1": "y [[off]]"}})
    rng = random.Random(16)
    with LLMServer(answer=echo_answer, latency=0.05) as server:
        plain = tmp_path / "a" / "descriptions.jsonl"
        describe_cli.main(["--pairs", str(pairs), "--out", str(plain), "--base-url", server.url, *FAST])
        killed = tmp_path / "b" / "descriptions.jsonl"
        kills = 0
        for _ in range(3):
            done = _lines(killed)
            if done >= n - 2:
                break
            target = done + rng.randint(1, max(1, (n - done) // 3))  # leave work for the later kills
            proc = _describe_proc(pairs, killed, server.url)
            deadline = time.monotonic() + 60
            while _lines(killed) < target and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.02))  # anywhere between two results, or in the middle of a write
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                kills += 1
            proc.wait()
        assert kills >= 2
        proc = _describe_proc(pairs, killed, server.url)
        assert proc.wait(timeout=120) == 0
    ids = [r["id"] for r in _results(killed)]
    assert len(ids) == len(set(ids)) == n  # no duplicate, no missing pair
    for d in ("a", "b"):
        assert filter_cli.main(["--results", str(tmp_path / d / "descriptions.jsonl")]) == 0
    assert (tmp_path / "a" / "manifest.jsonl").read_bytes() == (tmp_path / "b" / "manifest.jsonl").read_bytes()
    assert (tmp_path / "a" / "rejects.jsonl").read_bytes() == (tmp_path / "b" / "rejects.jsonl").read_bytes()


def test_chain_on_the_shapes_world_down_to_pretraining(shapes: dict, tmp_path: Path) -> None:
    """shapes pairs -> describe (server answers each pair's shapes description) -> filter -> pack -> pre-train."""
    from namc.data.cli import main as data_main

    corpus = shapes["root"] / "corpus"
    truth = {}
    for r in shapes["records"][:16]:
        truth[hashlib.sha256((corpus / r["image1"]).read_bytes()).hexdigest()] = r["description"]

    def by_image(text: str, images: list[bytes]) -> str:
        return truth[hashlib.sha256(images[0]).hexdigest()]

    pairs = tmp_path / "work" / "pairs.jsonl"
    _write_pairs(pairs, shapes, 16)
    with LLMServer(answer=by_image) as server:
        assert describe_cli.main(["--pairs", str(pairs), "--base-url", server.url, *FAST]) == 0
    assert filter_cli.main(["--workdir", str(tmp_path / "work")]) == 0
    manifest = tmp_path / "work" / "manifest.jsonl"
    got = {m["id"]: m["description"] for m in _results(manifest)}
    assert got == {r["id"]: normalize_whitespace(r["description"]) for r in shapes["records"][:16]}
    assert data_main(["pack", str(manifest), str(tmp_path / "shards"), "--shard-size", "8", "--quiet"]) == 0
    index = json.loads((tmp_path / "shards" / "index.json").read_text())
    assert [s["samples"] for s in index["shards"]] == [8, 8]  # every accepted pair packed

    pretrain_two_steps(tmp_path / "shards", tmp_path / "run", batch_size=8, shuffle_buffer=8)


def test_caption_an_image_index_counts_every_image(shapes: dict, tmp_path: Path) -> None:
    corpus = shapes["root"] / "corpus"
    r = shapes["records"]
    rows = [
        {"key": "a", "image": str(corpus / r[0]["image1"])},
        {"key": "b", "image": str(corpus / r[0]["image2"]), "caption": "already captioned"},
        {"key": "c", "image": "gone.png"},
        {"key": "a", "image": str(corpus / r[1]["image1"])},
    ]
    index = tmp_path / "images.jsonl"
    index.write_text("".join(json.dumps(x) + "\n" for x in rows), encoding="utf-8")
    with LLMServer() as server:
        assert caption_cli.main(["--images", str(index), "--base-url", server.url, *FAST]) == 0
    summary = json.loads((tmp_path / "captions.summary.json").read_text())
    assert summary["lines"] == 4 and summary["ok"] == 1 and summary["failed"] == {"missing_image": 1}
    assert summary["skipped"] == {"has_caption": 1, "duplicate_id": 1}
    assert _results(tmp_path / "captions.jsonl") == [{"key": "a", "caption": normalize_whitespace(DEFAULT_ANSWER)}]


def test_describe_reads_its_yaml_section(shapes: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pairs = tmp_path / "pairs.jsonl"
    _write_pairs(pairs, shapes, 2)
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"workdir: {tmp_path}\ndescribe:\n  concurrency: 3\n  max_attempts: 2\n  rpm: 600\n")
    with pytest.raises(SystemExit) as end:  # --print_config exits like --help
        describe_cli.main(["--config", str(config), "--print_config"])
    assert end.value.code == 0
    printed = capsys.readouterr().out
    assert "concurrency: 3" in printed and "max_attempts: 2" in printed and "rpm: 600" in printed
    with LLMServer() as server:
        assert describe_cli.main(["--config", str(config), "--base-url", server.url, "--quiet"]) == 0
    assert len(_results(tmp_path / "descriptions.jsonl")) == 2  # WORKDIR/pairs.jsonl -> WORKDIR/descriptions.jsonl


def test_filter_takes_hand_made_results_lines_without_crashing(tmp_path: Path) -> None:
    """A blank source is "unknown" (not a record that fails validation), a blank id a counted rejection."""
    from namc.curate.filtering import filter_results

    text = (
        "The difference between the two images is that the first image shows a red cube, while the second image "
        "shows a blue cube."
    )
    rows = [
        {"id": i, "source": src, "image1": "a.png", "image2": "b.png", "status": "ok", "text": text}
        for i, src in (("p0", "cc3m"), ("p1", " "), (" ", "cc3m"))
    ]
    (tmp_path / "descriptions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = filter_results(tmp_path / "descriptions.jsonl", tmp_path / "manifest.jsonl", tmp_path / "rejects.jsonl")
    assert report.accepted == 2
    assert [m["source"] for m in _results(tmp_path / "manifest.jsonl")] == ["cc3m", "unknown"]
    (reject,) = _results(tmp_path / "rejects.jsonl")
    assert reject["reason"] == "bad_result" and "id" in reject["detail"]


def test_the_last_caption_of_a_key_wins(tmp_path: Path) -> None:
    from namc.curate.describe import load_captions

    lines = [{"key": "k1", "caption": "old caption"}, {"key": "k2", "caption": "b"}, {"key": "k1", "caption": "fixed"}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "{broken\n")
    assert load_captions(tmp_path / "c.jsonl") == {"k1": "fixed", "k2": "b"}
