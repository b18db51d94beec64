"""The Img-Diff steps (replace, regions, region-captions, remove) on the shapes world, against a real chat server on
127.0.0.1: the changed box is known exactly, so what `regions` finds is checked against it; thresholds at their
boundaries; bad input and bad answers counted; runs resumed after a torn write; the corpus feeds pre-training."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.ndimage  # noqa: F401 - imported at collection (2 s here), not inside the first timed test
from PIL import Image, ImageDraw
from pretrain_smoke import pretrain_two_steps

from namc.curate.edits import region_captions, regions, remove, replace, shapes
from namc.curate.edits.imgdiff_common import StepCounts
from namc.curate.edits.regions import RegionThresholds, difference_boxes
from namc.curate.edits.tools import PixelSimilarity, ShapesMatcher, box_iou, crop
from namc.data.corpus.records import parse_record

sys.path.insert(0, str(Path(__file__).parent))
from imgdiff_helpers import shapes_answer  # noqa: E402
from llm_server import LLMServer  # noqa: E402

FAST = ["--timeout", "5", "--backoff-base", "0.01", "--backoff-max", "0.03", "--max-attempts", "2", "--quiet"]
TOOLS = "{similarity: pixels, matcher: shapes, segmenter: foreground}"
SHAPES = "{backend: shapes, image_size: 64}"


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _captions(path: Path, n: int, seed: int = 0, extra: list[bytes] | None = None) -> Path:
    rng = random.Random(seed)
    rows = [json.dumps({"key": f"c{i:03d}", "caption": shapes.random_caption(rng, 2, 4)}).encode() for i in range(n)]
    path.write_bytes(b"\n".join(rows + (extra or [])) + b"\n")
    return path


def _floor(boxes: list[tuple[tuple[int, int, int, int], tuple[int, int, int]]]) -> Image.Image:
    image = Image.new("RGB", (64, 64), (160, 160, 158))
    draw = ImageDraw.Draw(image)
    for (x0, y0, x1, y1), colour in boxes:
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=colour)
    return image


RED, BLUE, GREEN = (173, 35, 35), (42, 75, 215), (29, 105, 20)
KNOWN = (38, 36, 50, 48)  # the edited box of the hand-made pair


def _hand_made(tmp_path: Path) -> Path:
    """Two images with three objects; the third changes colour inside KNOWN."""
    a = _floor([((4, 6, 18, 20), RED), ((40, 4, 56, 16), GREEN), (KNOWN, RED)])
    b = _floor([((4, 6, 18, 20), RED), ((40, 4, 56, 16), GREEN), (KNOWN, BLUE)])
    a.save(tmp_path / "a.png")
    b.save(tmp_path / "b.png")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"id": "p0", "image1": "a.png", "image2": "b.png"}) + "\n")
    return pairs


def test_regions_finds_the_edited_box_and_no_other(tmp_path: Path) -> None:
    pairs = _hand_made(tmp_path)
    args = ["--pairs", str(pairs), "--tools", "{similarity: pixels, segmenter: foreground, matcher: none}"]
    assert regions.main([*args, "--quiet"]) == 0
    (line,) = _lines(tmp_path / "regions.jsonl")
    assert line["status"] == "ok" and line["boxes"] == [list(KNOWN)]
    summary = json.loads((tmp_path / "regions.summary.json").read_text())
    assert summary["kept"] == 1 and summary["boxes"]["candidates"] == 6 and summary["boxes"]["same"] == 4
    assert summary["boxes"]["duplicate"] == 1  # the box found in both images, de-duplicated at IoU 0.5
    assert summary["thresholds"] == {
        "is_min": 0.9,
        "is_max": 0.98,
        "conf": 0.05,
        "iou": 0.5,
        "box_sim": 0.85,
        "bitm": 0.35,
    }


def test_box_thresholds_at_their_boundaries(tmp_path: Path) -> None:
    """A box differs only when its crop similarity is strictly below box_sim; it holds an object only when the match
    is strictly above bitm (section 18.4's "less than 0.85", "exceeds 0.35")."""
    _hand_made(tmp_path)
    a, b = Image.open(tmp_path / "a.png"), Image.open(tmp_path / "b.png")
    sim = PixelSimilarity()
    (s,) = sim.image_similarity([crop(a, KNOWN)], [crop(b, KNOWN)])
    for box_sim, kept in ((s, 0), (float(np.nextafter(s, 1.0)), 1)):
        counts = StepCounts()
        th = RegionThresholds(box_sim=box_sim)
        assert len(difference_boxes(a, b, [KNOWN], sim, None, None, th, counts)) == kept

    caption = "a small red metal cube and a large blue rubber sphere"
    (pair,) = shapes.ShapesPairGenerator(64).generate_pairs([(caption, caption.replace("blue", "green"))], [1])
    box = shapes.object_box(shapes.scene_of(pair[0])[1], 64)
    (m,) = ShapesMatcher().match([crop(pair[0], box)], ["large blue rubber sphere"])
    for bitm, kept in ((m, 0), (float(np.nextafter(m, 0.0)), 1)):
        th = RegionThresholds(bitm=bitm, box_sim=1.0)
        got = difference_boxes(
            pair[0], pair[1], [box], sim, ShapesMatcher(), ("blue sphere", "green sphere"), th, StepCounts()
        )
        assert len(got) == kept


def test_pair_similarity_band_is_inclusive(tmp_path: Path) -> None:
    pairs = _hand_made(tmp_path)
    (s,) = PixelSimilarity().image_similarity([Image.open(tmp_path / "a.png")], [Image.open(tmp_path / "b.png")])
    base = ["--pairs", str(pairs), "--tools", "{similarity: pixels, segmenter: foreground, matcher: none}", "--quiet"]
    outcomes = {}
    for name, lo, hi in [
        ("at_min", s, 1.0),
        ("above", float(np.nextafter(s, 1.0)), 1.0),
        ("at_max", 0.0, s),
        ("below", 0.0, float(np.nextafter(s, 0.0))),
    ]:
        out = tmp_path / f"{name}.jsonl"
        assert regions.main([*base, "--out", str(out), "--is-min", repr(lo), "--is-max", repr(hi)]) == 0
        outcomes[name] = _lines(out)[0].get("reason", "ok")
    assert outcomes == {"at_min": "ok", "above": "pair_too_different", "at_max": "ok", "below": "pair_too_similar"}


def test_regions_counts_bad_images_and_lines(tmp_path: Path) -> None:
    _hand_made(tmp_path)
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG not really")
    Image.new("RGB", (32, 32)).save(tmp_path / "small.png")
    rows = [
        b'{"id": "ok", "image1": "a.png", "image2": "b.png"}',
        b'{"id": "gone", "image1": "a.png", "image2": "missing.png"}',
        b'{"id": "bad", "image1": "corrupt.png", "image2": "b.png"}',
        b'{"id": "size", "image1": "a.png", "image2": "small.png"}',
        b'{"id": "nofield", "image1": "a.png"}',
        b"\xff\xfe not utf-8",
        b'{"id": "ok", "image1": "a.png", "image2": "b.png"}',
    ]
    pairs = tmp_path / "mixed.jsonl"
    pairs.write_bytes(b"\n".join(rows) + b"\n")
    tools = "{similarity: pixels, segmenter: foreground, matcher: none}"
    assert regions.main(["--pairs", str(pairs), "--tools", tools, "--quiet"]) == 0
    summary = json.loads((tmp_path / "regions.summary.json").read_text())
    assert summary["kept"] == 1
    assert summary["rejected"] == {"corrupt_image": 1, "missing_field": 1, "missing_image": 1, "size_mismatch": 1}
    assert summary["skipped"] == {"duplicate_id": 1, "malformed_line": 1} and summary["lines"] == 7


def test_bad_options_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pairs = _hand_made(tmp_path)
    assert regions.main(["--pairs", str(pairs), "--is-min", "0.99", "--is-max", "0.5", "--quiet"]) == 2
    assert regions.main(["--pairs", str(tmp_path / "none.jsonl")]) == 2
    assert regions.main(["--pairs", str(pairs), "--tools", "{segmenter: fastsam}"]) == 2
    assert regions.main(["--pairs", str(pairs), "--tools", "{similarity: pixels, segmenter: sam, sam: /no/sam}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and "sam-vit-base" in err[-1] and "is_min <= is_max" in err[0]


def test_replace_counts_every_bad_caption_and_answer(tmp_path: Path) -> None:
    seven = shapes.caption_of([shapes.ShapeObject("cube", c, "small", "metal", 0, 0) for c in shapes.COLORS][:7])
    extra = [
        json.dumps({"key": "refuse", "caption": "a photo of a quiet street"}).encode(),
        json.dumps({"key": "empty", "caption": "a small red metal cube [[empty]]"}).encode(),
        json.dumps({"key": "off", "caption": "a small red metal cube [[off]]"}).encode(),
        json.dumps({"key": "garbled", "caption": "a small red metal cube [[garbled]]"}).encode(),
        json.dumps({"key": "seven", "caption": seven}).encode(),
        json.dumps({"key": "blank", "caption": ""}).encode(),
        b"not json",
    ]
    captions = _captions(tmp_path / "captions.jsonl", 3, extra=extra)
    with LLMServer(answer=shapes_answer) as server:
        args = ["--captions", str(captions), "--generator", SHAPES, "--base-url", server.url, *FAST]
        assert replace.main(args) == 0
        summary = json.loads((tmp_path / "pairs.summary.json").read_text())
        assert replace.main(args) == 0  # a second run finds everything done
    assert summary["kept"] == 3
    assert summary["rejected"] == {
        "empty_answer": 1,
        "generator:unparsable_prompt": 1,
        "malformed_answer": 1,
        "refusal": 1,
        "request_failed": 1,
    }
    assert summary["llm"]["skipped"] == {"malformed_line": 1, "missing_field": 1}
    again = json.loads((tmp_path / "pairs.summary.json").read_text())
    assert again["resumed"] == 8 and again["kept"] == 0 and again["llm"]["resumed"] == 8
    ok = [x for x in _lines(tmp_path / "pairs.jsonl") if x["status"] == "ok"]
    assert len(ok) == 3 and len(_lines(tmp_path / "pairs.jsonl")) == 8  # one line per caption, none twice
    for line in ok:
        a, b = Image.open(tmp_path / line["image1"]), Image.open(tmp_path / line["image2"])
        assert shapes.caption_of(shapes.scene_of(a)) == line["caption1"]
        assert shapes.caption_of(shapes.scene_of(b)) == line["caption2"]
        assert line["object1"] in line["caption1"] and line["object2"] in line["caption2"]


def test_a_torn_write_is_redone_and_nothing_is_duplicated(tmp_path: Path) -> None:
    captions = _captions(tmp_path / "captions.jsonl", 6, seed=3)
    with LLMServer(answer=shapes_answer) as server:
        args = ["--captions", str(captions), "--generator", SHAPES, "--base-url", server.url, *FAST]
        assert replace.main(args) == 0
        whole = (tmp_path / "pairs.jsonl").read_bytes()
        lines = whole.splitlines(keepends=True)
        (tmp_path / "pairs.jsonl").write_bytes(b"".join(lines[:3]) + lines[3][:17])  # killed mid-write
        assert replace.main(args) == 0
    again = _lines(tmp_path / "pairs.jsonl")
    assert sorted(x["id"] for x in again) == sorted(json.loads(x)["id"] for x in lines)
    assert {x["id"]: x for x in again} == {json.loads(x)["id"]: json.loads(x) for x in lines}  # same seeds, same pairs
    summary = json.loads((tmp_path / "pairs.summary.json").read_text())
    assert summary["resumed"] == 3 and summary["kept"] == 3


def _pipeline(work: Path, n: int, seed: int = 0) -> dict:
    captions = _captions(work / "captions.jsonl", n, seed)
    with LLMServer(answer=shapes_answer) as server:
        common = ["--base-url", server.url, *FAST]
        assert replace.main(["--captions", str(captions), "--generator", SHAPES, *common]) == 0
        assert regions.main(["--workdir", str(work), "--tools", TOOLS, "--quiet"]) == 0
        assert region_captions.main(["--workdir", str(work), "--tools", TOOLS, *common]) == 0
        assert remove.main(["--workdir", str(work), "--tools", TOOLS, "--inpainter", SHAPES, *common]) == 0
    return {p.stem: json.loads(p.read_text()) for p in work.glob("*.summary.json")}


def test_shapes_world_end_to_end(tmp_path: Path) -> None:
    summaries = _pipeline(tmp_path, 6)
    for name in ("pairs", "regions", "region_captions", "remove"):
        s = summaries[name + ".summary"]
        assert s["lines"] == s["kept"] + s["resumed"] + sum(s["rejected"].values()) + sum(s["skipped"].values())
    found = truth_hits = 0
    for line in _lines(tmp_path / "regions.jsonl"):
        if line["status"] == "ok":
            for box in line["boxes"]:
                found += 1
                truth_hits += any(box_iou(box, t) >= 0.5 for t in line["truth_boxes"])
    assert found > 0 and truth_hits / found >= 0.8
    manifest = _lines(tmp_path / "manifest.jsonl")
    assert manifest and [m["id"] for m in manifest] == sorted(m["id"] for m in manifest)
    for m in manifest:
        record = parse_record(m)
        assert record.desc1 == m["captions"][0] and record.desc2 == m["captions"][1] and m["box"] in m["boxes"]
        assert m["difference"] == (
            f"The difference is that the left image has {m['captions'][0]} where the right image has {m['captions'][1]}"
        )
        assert (tmp_path / record.image1).is_file()
    questions = _lines(tmp_path / "questions.jsonl")
    assert questions
    for q in questions:
        human, gpt = q["conversations"]
        assert human["value"].startswith("Analyse the left image and the right image") and gpt["value"] in "AB"
        assert Image.open(tmp_path / q["path"]).size == (64 + 20 + 64, 64)
    choices = _lines(tmp_path / "choice.jsonl")
    assert len(choices) == len(questions) and all(
        parse_record({"id": c["id"], "source": "x", "image1": "a", "image2": "b", "description": c["candidates"][0]})
        for c in choices
    )


def test_removal_thresholds_reject_at_the_boundary(tmp_path: Path) -> None:
    """exists 1.0 rejects every erased object (the crop holds all of it: a match of exactly 1.0, not above)."""
    captions = _captions(tmp_path / "captions.jsonl", 3, seed=5)
    with LLMServer(answer=shapes_answer) as server:
        common = ["--base-url", server.url, *FAST]
        assert replace.main(["--captions", str(captions), "--generator", SHAPES, *common]) == 0
        args = ["--workdir", str(tmp_path), "--tools", TOOLS, "--inpainter", SHAPES, *common]
        assert remove.main([*args, "--exists", "1.0"]) == 0
    summary = json.loads((tmp_path / "remove.summary.json").read_text())
    assert summary["questions"] == 0 and summary["boxes"]["exists_mismatch"] > 0
    assert "kept" not in summary["boxes"]


@pytest.mark.slow
def test_shapes_corpus_pretrains(tmp_path: Path) -> None:

    _pipeline(tmp_path, 24)
    pretrain_two_steps(tmp_path / "manifest.jsonl", tmp_path / "r", batch_size=4, shuffle_buffer=4)


@pytest.mark.parametrize("step", [replace, regions, region_captions, remove])
def test_example_pipeline_yaml_is_valid_for_every_step(step, capsys: pytest.CaptureFixture) -> None:
    root = Path(__file__).resolve().parents[1]
    with pytest.raises(SystemExit) as done:
        step.main(["--config", str(root / "configs" / "curate" / "imgdiff.yaml"), "--print_config"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert "is_min: 0.9" in printed or "citm: 0.4" in printed or "exists: 0.35" in printed or "generator:" in printed


@pytest.mark.slow
def test_regions_resumes_after_sigkill(tmp_path: Path) -> None:
    """A run killed with SIGKILL mid-way, then rerun, writes the same results as one uninterrupted run: every pair
    once, nothing lost."""
    import os
    import signal
    import subprocess
    import time

    captions = _captions(tmp_path / "captions.jsonl", 60, seed=7)
    with LLMServer(answer=shapes_answer) as server:
        assert replace.main(["--captions", str(captions), "--generator", SHAPES, "--base-url", server.url, *FAST]) == 0
    reference = tmp_path / "reference.jsonl"
    assert regions.main(["--workdir", str(tmp_path), "--out", str(reference), "--tools", TOOLS, "--quiet"]) == 0
    out = tmp_path / "regions.jsonl"
    cmd = [sys.executable, "-m", "namc", "curate", "regions", "--workdir", str(tmp_path), "--tools", TOOLS, "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 5:
            break
        time.sleep(0.01)
    killed = proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = out.read_bytes().count(b"\n")
    assert subprocess.run(cmd, env=env, check=False).returncode == 0
    lines = _lines(out)
    ids = [x["id"] for x in lines]
    assert len(ids) == len(set(ids)) == 60  # every pair once
    assert {x["id"]: x for x in lines} == {x["id"]: x for x in _lines(reference)}
    summary = json.loads((tmp_path / "regions.summary.json").read_text())
    assert not killed or summary["resumed"] == partial


def test_ids_from_the_input_never_name_another_folder(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    keys = ["../../evil", "cc3m/0001", "/abs/path", "cc3m_0001"]
    rows = [json.dumps({"key": k, "caption": "a small red metal cube and a large blue rubber sphere"}) for k in keys]
    (work / "captions.jsonl").write_text("\n".join(rows) + "\n")
    with LLMServer(answer=shapes_answer) as server:
        args = ["--captions", str(work / "captions.jsonl"), "--generator", SHAPES, "--base-url", server.url, *FAST]
        assert replace.main(args) == 0
    lines = _lines(work / "pairs.jsonl")
    assert sorted(x["id"] for x in lines if x["status"] == "ok") == sorted(keys)
    files = {x["image1"] for x in lines} | {x["image2"] for x in lines}
    assert len(files) == 8 and all((work / f).resolve().parent == (work / "images").resolve() for f in files)
    assert sorted(p.name for p in tmp_path.rglob("*.png")) == sorted(Path(f).name for f in files)


def _noise_caption_pairs(work: Path, n: int) -> Path:
    return _captions(work / "captions.jsonl", n, seed=11)


def test_replace_and_remove_through_the_openai_images_backend(tmp_path: Path) -> None:
    """The remote backends against a real server on 127.0.0.1 that speaks the images and chat endpoints: pairs from
    one seed differ only where the prompt's colour square is; removal repaints the box through images.edit."""
    from images_server import ImagesServer

    captions = _noise_caption_pairs(tmp_path, 3)
    with ImagesServer(answer=shapes_answer) as server:
        section = f"{{backend: openai, base_url: '{server.url}', model: img, size: 64x64}}"
        common = ["--base-url", server.url, *FAST]
        assert replace.main(["--captions", str(captions), "--generator", section, *common]) == 0
        tools = "{similarity: pixels, matcher: shapes, segmenter: foreground}"
        args = ["--workdir", str(tmp_path), "--tools", tools, "--inpainter", section, "--object-sim", "1.0", *common]
        assert remove.main(args) == 0
        routes = [r["route"] for r in server.requests]
    pairs = [x for x in _lines(tmp_path / "pairs.jsonl") if x["status"] == "ok"]
    assert len(pairs) == 3 and routes.count("generations") >= 6
    for line in pairs:
        a, b = (np.asarray(Image.open(tmp_path / line[k]).convert("RGB"), np.int16) for k in ("image1", "image2"))
        changed = np.abs(a - b).max(axis=2) > 0  # (H, W): the square only, the noise background is shared
        assert 0 < changed.mean() < 0.5
    summary = json.loads((tmp_path / "remove.summary.json").read_text())
    assert summary["lines"] == summary["kept"] + sum(summary["rejected"].values())
    assert summary["inpainter"]["images"] == summary["kept"] and "edits" in routes


@pytest.mark.slow
def test_replace_and_remove_through_tiny_diffusers_pipelines(tmp_path: Path) -> None:
    """The real diffusers code paths: a tiny text-to-image pipeline renders the pairs with Prompt-to-Prompt, a tiny
    inpainting pipeline erases the boxes; the steps' bookkeeping holds whatever random weights draw."""
    import edits_tiny

    t2i = edits_tiny.text_to_image(tmp_path / "t2i")
    inpaint = edits_tiny.inpainting(tmp_path / "inpaint")
    work = tmp_path / "work"
    work.mkdir()
    captions = _noise_caption_pairs(work, 2)
    with LLMServer(answer=shapes_answer) as server:
        common = ["--base-url", server.url, *FAST]
        generator = f"{{backend: diffusers, model: '{t2i}', steps: 2, device: cpu}}"
        assert replace.main(["--captions", str(captions), "--generator", generator, *common]) == 0
        inpainter = f"{{backend: diffusers, model: '{inpaint}', steps: 2, device: cpu}}"
        tools = "{similarity: pixels, matcher: shapes, segmenter: foreground}"
        args = ["--workdir", str(work), "--tools", tools, "--inpainter", inpainter, "--object-sim", "1.0", *common]
        assert remove.main(args) == 0
    pairs = [x for x in _lines(work / "pairs.jsonl") if x["status"] == "ok"]
    assert len(pairs) == 2
    for line in pairs:
        a, b = (Image.open(work / line[k]) for k in ("image1", "image2"))
        assert a.size == b.size and a.size[0] >= 32
    summary = json.loads((work / "pairs.summary.json").read_text())
    assert summary["generator"]["images"] == 4  # two per pair
    removal = json.loads((work / "remove.summary.json").read_text())
    assert removal["lines"] == removal["kept"] + sum(removal["rejected"].values())
