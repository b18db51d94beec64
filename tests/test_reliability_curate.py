"""Reliability of the curation steps against hostile input and hostile servers: deeply nested JSON, unbounded and
dripping LLM answers, a template sentence injected into an answer, two runs on one folder, and tar headers that
declare absurd sizes. Servers are the real HTTP server of tests/llm_server.py on 127.0.0.1."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from PIL import Image

from namc.curate import describe as describe_cli
from namc.curate import filtering as filter_cli
from namc.curate.audit.report import render_html
from namc.curate.index import build_index
from namc.curate.index import main as index_main
from namc.curate.sources import SourceSpec
from namc.curate.sources.captions import read_captions
from namc.curate.sources.cc3m import read_webdataset
from namc.data.issues import DataIssues
from namc.llm import ClientConfig, LLMClient, RequestFailed, ResultStore, image_message
from namc.llm.runner import RunSummary, read_jsonl_objects
from namc.locks import output_lock
from namc.text.template import MAX_DESCRIPTION_CHARS, RejectReason, TemplateError, parse, rebuild, validate

sys.path.insert(0, str(Path(__file__).parent))
from llm_server import DEFAULT_ANSWER, LLMServer  # noqa: E402

FAST = ["--timeout", "2", "--backoff-base", "0.01", "--backoff-max", "0.02", "--max-attempts", "1", "--quiet"]
NESTED = "[" * 10_000 + "]" * 10_000  # Python's decoder recurses: a RecursionError without the bounded reader


def _png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format="PNG")
    return buf.getvalue()


def _pairs(folder: Path, n: int, extra_lines: tuple[str, ...] = (), bom: bool = False) -> Path:
    """A pairs JSONL of ``n`` pairs over two tiny PNGs, followed by ``extra_lines`` as written."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.png").write_bytes(_png((200, 0, 0)))
    (folder / "b.png").write_bytes(_png((0, 0, 200)))
    lines = [
        json.dumps(
            {
                "id": f"p{i}",
                "source": "test",
                "image1": "a.png",
                "image2": "b.png",
                "caption1": f"red {i}",
                "caption2": f"blue {i}",
            }
        )
        for i in range(n)
    ]
    path = folder / "pairs.jsonl"
    path.write_text(("\ufeff" if bom else "") + "\n".join([*lines, *extra_lines]) + "\n", encoding="utf-8")
    return path


def _result(pair_id: str, text: str) -> str:
    return json.dumps(
        {"id": pair_id, "source": "test", "image1": "a.png", "image2": "b.png", "status": "ok", "text": text}
    )


# --- 1. deeply nested JSON and byte-order marks -----------------------------------------------------------------


def test_a_deeply_nested_input_line_is_skipped_and_counted(tmp_path: Path) -> None:
    path = _pairs(tmp_path, 2, extra_lines=(NESTED, '{"id": "x", "a": ' + NESTED + "}"), bom=True)
    summary = RunSummary()
    ids = [obj["id"] for _, obj in read_jsonl_objects(path, summary, "id")]
    assert ids == ["p0", "p1"]  # the first line keeps its id despite the byte-order mark
    assert summary.skipped == {"malformed_line": 2} and summary.lines == 4


def test_describe_skips_a_nested_pairs_line_and_resumes_over_a_nested_results_line(tmp_path: Path) -> None:
    pairs = _pairs(tmp_path / "in", 2, extra_lines=(NESTED,), bom=True)
    out = tmp_path / "out" / "descriptions.jsonl"
    out.parent.mkdir()
    out.write_text(_result("p0", DEFAULT_ANSWER) + "\n" + NESTED + "\n", encoding="utf-8")  # a damaged line
    with LLMServer() as server:
        rc = describe_cli.main(["--pairs", str(pairs), "--out", str(out), "--base-url", server.url, *FAST])
    assert rc == 0
    summary = json.loads((out.with_name("descriptions.summary.json")).read_text())
    assert summary["resumed"] == 1 and summary["ok"] == 1 and summary["skipped"] == {"malformed_line": 1}
    assert summary["corrupt_lines"] == 1


def test_filter_counts_a_nested_results_line_as_corrupt(tmp_path: Path) -> None:
    results = tmp_path / "descriptions.jsonl"
    results.write_text("\ufeff" + _result("p0", DEFAULT_ANSWER) + "\n" + NESTED + "\n", encoding="utf-8")
    report = filter_cli.filter_results(results, tmp_path / "manifest.jsonl", tmp_path / "rejects.jsonl")
    assert report.accepted == 1 and report.corrupt_lines == 1


def test_captions_and_result_store_read_nested_lines_without_crashing(tmp_path: Path) -> None:
    captions = tmp_path / "captions.jsonl"
    captions.write_text('\ufeff{"key": "k", "caption": "c"}\n' + NESTED + "\n", encoding="utf-8")
    issues = DataIssues("test")
    assert read_captions(captions, issues) == {"k": "c"}
    assert issues.counts == {"malformed_line": 1}
    results = tmp_path / "results.jsonl"
    results.write_text("\ufeff" + _result("p0", "x") + "\n" + NESTED + "\n", encoding="utf-8")
    with ResultStore(results) as store:
        assert store.done == {"p0"} and store.corrupt_lines == 1


# --- 2. unbounded answers ---------------------------------------------------------------------------------------


def _ask(config: ClientConfig) -> Exception | object:
    async def go() -> Exception | object:
        async with LLMClient(config, seed=0) as client:
            message = image_message("describe [[huge]]", ["data:image/png;base64,iVBORw0KGgo="])
            try:
                return await client.complete(message)
            except RequestFailed as err:
                return err

    return asyncio.run(go())


@pytest.mark.parametrize("huge_chars", [20_000, 3_000_000])  # over the answer cap; over the body's byte cap
def test_an_answer_over_the_caps_is_failed_as_too_long(huge_chars: int) -> None:
    with LLMServer(huge_chars=huge_chars) as server:
        out = _ask(ClientConfig(base_url=server.url, model="m", timeout=20, max_attempts=3, max_tokens=77))
        assert server.max_tokens_seen == [77]  # every request carries the token cap; too_long is not retried
    assert isinstance(out, RequestFailed) and out.kind == "too_long", out


def test_describe_fails_a_huge_answer_and_filter_rejects_a_stored_one(tmp_path: Path) -> None:
    pairs = _pairs(tmp_path / "in", 1)
    pairs.write_text(pairs.read_text().replace("red 0", "red 0 [[huge]]"), encoding="utf-8")
    out = tmp_path / "out" / "descriptions.jsonl"
    with LLMServer(huge_chars=50_000) as server:
        assert describe_cli.main(["--pairs", str(pairs), "--out", str(out), "--base-url", server.url, *FAST]) == 0
    stored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["status"], r["error_kind"]) for r in stored] == [("failed", "too_long")]
    assert out.stat().st_size < 10_000  # the answer was not kept

    # a results file written without the cap (or by hand) still does not reach the manifest
    long_text = rebuild("shows", "a cat " * 5000, "shows", "a dog")
    results = tmp_path / "old.jsonl"
    results.write_text(_result("p0", long_text) + "\n", encoding="utf-8")
    report = filter_cli.filter_results(results, tmp_path / "manifest.jsonl", tmp_path / "rejects.jsonl")
    assert report.accepted == 0 and report.stats.rows()["test"].rejected == {"too_long": 1}


def test_template_rejects_a_description_over_the_length_cap() -> None:
    text = rebuild("shows", "a cat " * (MAX_DESCRIPTION_CHARS // 6), "shows", "a dog")
    assert validate(text) is RejectReason.TOO_LONG


def test_audit_report_shows_a_bounded_number_of_words() -> None:
    words = ["word"] * 100_000
    pair = {
        "id": "x" * 10_000,
        "source": "s",
        "verb1": "shows",
        "verb2": "shows",
        "words1": words,
        "scores1": [0.5] * len(words),
        "words2": ["<script>alert(1)</script>"],
        "scores2": [0.1],
        "flagged_fraction": 0.5,
        "thumb1": "",
        "thumb2": "",
    }
    page = render_html("t", {}, [pair], 0.4, 1)
    assert len(page) < 100_000 and "99,800 more words not shown" in page
    assert "<script>" not in page and "&lt;script&gt;" in page


# --- 3. a dripping server ---------------------------------------------------------------------------------------


def test_the_timeout_is_a_deadline_for_the_whole_answer() -> None:
    with LLMServer(drip_seconds=0.05) as server:  # each read waits 0.05 s; the whole answer would take ~40 s
        config = ClientConfig(base_url=server.url, model="m", timeout=1.0, max_attempts=1)

        async def go() -> Exception | object:
            async with LLMClient(config, seed=0) as client:
                try:
                    return await client.complete(image_message("describe [[drip]]", []))
                except RequestFailed as err:
                    return err

        start = time.monotonic()
        out = asyncio.run(go())
        elapsed = time.monotonic() - start
    assert isinstance(out, RequestFailed) and out.kind == "timeout", out
    assert elapsed < 8.0  # generous: the deadline is 1 s


# --- 4. a template sentence inside an answer --------------------------------------------------------------------

INJECTED = (
    "The difference between the two images is that the first image shows a cat, while the second image shows The "
    "difference between the two images is that the first image shows a dog, while the second image shows a bird."
)


@pytest.mark.parametrize(
    "text",
    [
        INJECTED,
        "The difference between the two images is that the first image shows a cat while the second image shows "
        "a dog, while the second image shows a bird.",
        "The difference between the two images is that the first image shows the difference between two images, "
        "while the second image shows a dog.",
    ],
)
def test_a_half_holding_the_template_frame_is_rejected(text: str) -> None:
    with pytest.raises(TemplateError) as err:
        parse(text)
    assert err.value.reason is RejectReason.NESTED_TEMPLATE


def test_filter_counts_an_injected_template_sentence(tmp_path: Path) -> None:
    results = tmp_path / "descriptions.jsonl"
    results.write_text(_result("p0", INJECTED) + "\n" + _result("p1", DEFAULT_ANSWER) + "\n", encoding="utf-8")
    report = filter_cli.filter_results(results, tmp_path / "manifest.jsonl", tmp_path / "rejects.jsonl")
    assert report.accepted == 1 and report.stats.rows()["test"].rejected == {"nested_template": 1}
    rejected = json.loads((tmp_path / "rejects.jsonl").read_text())
    assert rejected["id"] == "p0" and rejected["reason"] == "nested_template"


# --- 5. one owner per output folder -----------------------------------------------------------------------------


def test_index_refuses_a_work_folder_another_run_holds(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.png").write_bytes(_png((1, 2, 3)))
    work = tmp_path / "work"
    with output_lock(work, "namc curate index --sources other"):
        assert index_main(["--workdir", str(work), "--sources", f"image_folder:{images}", "--no_progress"]) != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "namc curate index --sources other" in err
        assert not (work / "images.jsonl").exists()
    assert build_index([f"image_folder:{images}"], work, progress=False).images == 1  # free again


def test_describe_refuses_an_output_folder_another_run_holds(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pairs = _pairs(tmp_path / "in", 1)
    out = tmp_path / "out" / "descriptions.jsonl"
    with LLMServer() as server, output_lock(out.parent, "namc curate describe"):
        rc = describe_cli.main(["--pairs", str(pairs), "--out", str(out), "--base-url", server.url, *FAST])
        assert rc != 0 and server.actions == {}  # not one request sent
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "in use by another namc run" in err


def test_filter_refuses_a_folder_another_run_holds(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results = tmp_path / "descriptions.jsonl"
    results.write_text(_result("p0", DEFAULT_ANSWER) + "\n", encoding="utf-8")
    with output_lock(tmp_path, "namc curate describe"):
        assert filter_cli.main(["--results", str(results)]) != 0
    assert "in use by another namc run" in capsys.readouterr().err
    assert not (tmp_path / "manifest.jsonl").exists()


# --- 6. tar headers declaring absurd sizes ----------------------------------------------------------------------


def _hostile_shard(path: Path) -> None:
    """A shard with one good sample, then a member header declaring 2**60 bytes (no image extension)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in (("000.png", _png((9, 9, 9))), ("000.txt", b"a grey square")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("001.bin")
        info.size = 2**60
        assert tar.fileobj is not None
        tar.fileobj.write(info.tobuf(tarfile.GNU_FORMAT) + b"x" * 512)  # the header alone, never 2**60 bytes
        tar.offset += 1024
    path.write_bytes(out.getvalue())


def test_a_tar_member_declaring_2_60_bytes_is_a_corrupt_shard(tmp_path: Path) -> None:
    _hostile_shard(tmp_path / "00000.tar")
    issues = DataIssues("test")
    start = time.monotonic()
    items = list(read_webdataset(SourceSpec.parse({"kind": "webdataset", "root": str(tmp_path)}), issues))
    assert time.monotonic() - start < 5.0
    assert [i.caption for i in items] == ["a grey square"]  # what came before the damage is kept
    assert issues.counts == {"corrupt_shard": 1}


@pytest.mark.slow
def test_index_over_a_hostile_shard_ends_in_bounded_time(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    _hostile_shard(shards / "00000.tar")
    cmd = [sys.executable, "-m", "namc.curate.cli", "index", "--workdir", str(tmp_path / "work"),
           "--sources", f"webdataset:{shards}", "--no_progress"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "work" / "index_summary.json").read_text())
    assert "corrupt_shard" in json.dumps(summary) and summary["images"] == 1
