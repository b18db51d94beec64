"""MED's engine (``namc curate edit`` and ``namc curate questions``, seed paper 004): the paper's prompts and their
answer parsers, the corpus description, the stages end to end on the shapes world against a real chat server on
127.0.0.1, every rejection counted by reason, resumption after a kill, the benchmark file that ``namc eval choice
--format med`` reads, and (slow) pre-training on the corpus the engine writes."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from PIL import Image
from pretrain_smoke import pretrain_two_steps

from namc.curate.edits import med, questions
from namc.curate.edits import med_prompts as P
from namc.curate.edits.shapes import ShapesEditor, scene_of
from namc.data.corpus.records import parse_record
from namc.eval.choice import read_med
from namc.llm import ClientConfig
from tests.llm_server import LLMServer
from tests.med_helpers import REFUSAL, shapes_index, shapes_mllm

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--timeout", "5", "--backoff-base", "0.01", "--backoff-max", "0.03", "--max-attempts", "2", "--quiet"]


def _config(url: str) -> ClientConfig:
    return ClientConfig(base_url=url, concurrency=8, timeout=5, max_attempts=2, backoff_base=0.01, backoff_max=0.03)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random CLIP saved in open_clip's layout: a config JSON and a safetensors state dict."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    from namc.curate.encoders import TINY_CLIP_CONFIG

    root = tmp_path_factory.mktemp("clip")
    torch.manual_seed(0)
    model = open_clip.CLIP(**TINY_CLIP_CONFIG)
    (root / "tiny-clip.json").write_text(json.dumps(TINY_CLIP_CONFIG))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, root / "open_clip_model.safetensors")
    return {"config": root / "tiny-clip.json", "weights": root / "open_clip_model.safetensors"}


def _similarity(clip: dict[str, Path]):
    return med.build_clip_similarity(
        {"similarity": "clip", "clip_weights": clip["weights"], "clip_model": str(clip["config"]), "clip_tag": None}
    )


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels in its header and holds almost none."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


# ---------------------------------------------------------------------------------------------------------------
# Prompts and parsers
# ---------------------------------------------------------------------------------------------------------------


def test_prompts_hold_the_papers_words_and_fill_every_slot() -> None:
    assert "Prioritize COMPOSITIONS other than 'Object'" in P.FIG8_INSTRUCTION
    assert '(By Answer exactly "NO UPDATE")' in P.FIG9_COMPLETE_CAPTION
    assert 'Please strctly follow this format:"TYPE:XXX\nDIFFERENCE:XXXX"' in P.FIG11_DIFFERENCE  # sic
    assert "- BE GENEROUS IN INTERPRETATION" in P.FIG13_SECOND_JUDGE and "....." not in P.FIG13_SECOND_JUDGE
    assert len(P.FIG15_QUESTIONS) == 9 and len(set(P.FIG15_QUESTIONS)) == 9
    assert len(P.CATEGORIES) == 11 and set(P.CATEGORY_DESCRIPTIONS) == set(P.CATEGORIES)
    for name in ("Spatial Relation", "Counting", "Universality"):  # Figures 8 and 11 list the same categories
        assert f"- {name}: " in P.FIG8_INSTRUCTION and f"- {name}: " in P.FIG11_DIFFERENCE
    filled = [
        P.fill(P.FIG7_FILTER, caption="c"),
        P.fill(P.FIG8_INSTRUCTION, caption="c"),
        P.fill(P.FIG9_COMPLETE_CAPTION, original_description="c", edit_prompt="e"),
        P.fill(P.FIG10_EDITED_CAPTION, description="d", type="Part Relation", type_description="x"),
        P.fill(P.FIG11_DIFFERENCE, complete_caption="a", new_caption="b"),
        P.fill(P.FIG12_JUDGE, edit_prompt="e", difference_description="d"),
        P.fill(P.FIG13_SECOND_JUDGE, second_edit_prompt="s", difference_description="d"),
        P.fill(P.FIG17_WRONG_ANSWERS, difference_description="d", right_answer="r"),
    ]
    for text in filled:
        assert "{" not in text, text[:80]
    assert "Key aspect to focus on: Part Relation (x)" in filled[3]
    assert P.fill(P.FIG7_FILTER, caption="a {caption} b").count("{caption}") == 1  # a caption is never re-read


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("## **Evaluation**\n**Final Recommendation:** **Yes**\n...", True),
        ("**Final Recommendation:** **No**", False),
        ("Final Recommendation: yes", True),
        (REFUSAL, "filter_unparsed"),
        ("", "filter_unparsed"),
    ],
)
def test_filter_answers(answer: str, expected: object) -> None:
    if isinstance(expected, bool):
        assert P.parse_filter(answer) is expected
    else:
        with pytest.raises(P.AnswerError) as err:
            P.parse_filter(answer)
        assert err.value.reason == expected


def test_instruction_difference_and_answer_parsers() -> None:
    got = P.parse_instruction(
        "Type: **Spatial Relation**\\n## Prompt: Hi, This is a photo of a table. Can you only move the phone out of "
        "this scene and output the image?\\n"
    )
    assert got == (
        "Spatial",
        "Hi, This is a photo of a table. Can you only move the phone out of this scene and output the image?",
        "only move the phone out of this scene",
    )
    assert P.parse_instruction("Type: [Counting]\n## Prompt: add two vehicles")[::2] == ("Counting", "add two vehicles")
    for text, reason in (("Type: Lighting\n## Prompt: x", "unknown_category"), ("Prompt: x", "malformed_instruction")):
        with pytest.raises(P.AnswerError) as err:
            P.parse_instruction(text)
        assert err.value.reason == reason
    assert P.parse_difference("TYPE:Negation\nDIFFERENCE:The cup is gone.") == ("Negation", "The cup is gone.")
    assert P.parse_difference("TYPE: Count\\nDIFFERENCE: Two more cars.") == ("Counting", "Two more cars.")
    assert P.parse_completed_caption("NO UPDATE", "orig") == ("orig", False)
    assert P.parse_completed_caption("Caption is complete. No updates needed.", "orig") == ("orig", False)
    assert P.parse_completed_caption("A dog on a red sofa.", "orig") == ("A dog on a red sofa.", True)
    assert P.parse_caption('CAPTION: "A dog."') == "A dog."
    assert P.parse_yes_no("Yes.") and not P.parse_yes_no("**No**")
    assert P.parse_right_answer("ANSWER: In the second image, x.") == "In the second image, x."
    wrong = P.parse_wrong_answers("wrong_answer1: a\nwrong_answer2: b\nwrong_answer3: c", "r")
    assert wrong == ["a", "b", "c"]
    for text, reason in (
        ("wrong_answer1: a wrong_answer2: b", "malformed_distractors"),
        ("wrong_answer1: a wrong_answer2: R. wrong_answer3: c", "duplicate_option"),
    ):
        with pytest.raises(P.AnswerError) as err:
            P.parse_wrong_answers(text, "r")
        assert err.value.reason == reason


def test_the_corpus_description_fills_the_template_from_the_two_captions() -> None:
    from namc.text.template import parse

    d = med.template_description("The image shows a Red cup on a table.", "A blue cup on a table.")
    assert d == (
        "The difference between the two images is that the first image shows a Red cup on a table, while the second "
        "image shows a blue cup on a table."
    )
    assert parse(med.template_description("This photo depicts NASA's rover.", "It rains.")).verb1 == "depicts"
    assert parse(med.template_description("NASA's rover.", "x")).desc1 == "NASA's rover"


# ---------------------------------------------------------------------------------------------------------------
# The edit step end to end
# ---------------------------------------------------------------------------------------------------------------


class RaisingEditor(ShapesEditor):
    """The shapes editor, except that a batch holding ``instruction`` raises as a crashed generator would."""

    def __init__(self, poison: str) -> None:
        super().__init__()
        self.poison = poison

    def edit(self, images, instructions, seeds):
        if any(self.poison in t for t in instructions):
            raise RuntimeError("CUDA error: out of memory\n(the rest of a long traceback)")
        return super().edit(images, instructions, seeds)


def _store(path: Path, results: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"status": "ok", **r}) + "\n" for r in results), encoding="utf-8")


FIG8 = "Type: {}\n## Prompt: Hi, This is a photo of shapes. Can you {} and output the image?"


def test_the_edit_stage_stores_images_and_counts_failures_without_a_server(tmp_path: Path) -> None:
    """The local stage of ``namc curate edit`` over hand-written Figure 7-8 answers: shapes edits, a generator that
    raises, an unreadable image, an instruction outside the grammar; then the stores replayed by ``trace``."""
    from namc.curate.edits.med_stages import StageBook, funnel, trace

    index = shapes_index(tmp_path / "src", 4, seed=9, extra=[{"key": "gone", "image": "none.png", "caption": "x"}])
    items = [json.loads(x) for x in index.read_text().splitlines()]
    scenes = [scene_of(Image.open(tmp_path / "src" / it["image"])) for it in items[:4]]
    out = tmp_path / "med"
    _store(
        out / "stages" / "filter.jsonl",
        [{"id": it["key"], "text": "**Final Recommendation:** **Yes**"} for it in items],
    )
    answers = [
        FIG8.format("Attribute", f"change the color of the {scenes[0][0].name} to purple"),
        FIG8.format("Negation", f"remove the {scenes[1][0].name}"),
        FIG8.format("Scene", "change the background to a beach"),
        FIG8.format("Counting", f"add one more {scenes[3][0].name}s"),  # the batch the editor raises on
        FIG8.format("Object", "add a large red rubber sphere"),
    ]
    answers[0] = answers[0] if scenes[0][0].color != "purple" else answers[0].replace("purple", "cyan")
    _store(out / "stages" / "instruction.jsonl", [{"id": it["key"], "text": a} for it, a in zip(items, answers)])
    stages = med.edit_stages(index.parent, out, min_similarity=0.9)

    def all_items():
        for it in items:
            yield it["key"], {"key": it["key"], "image": it["image"], "caption": it["caption"]}

    sim = med.build_clip_similarity({"similarity": "pixels"})
    with StageBook(out / "stages", ["filter", "instruction", "edit"]) as book:
        run = med.run_edit_stage(
            all_items, stages, book, RaisingEditor("add one more"), sim, index.parent, out, batch_size=1, progress=False
        )
        assert run.ok == 2 and run.failed == {"unsupported_instruction": 1, "generator_error": 1, "missing_image": 1}
        again = med.run_edit_stage(all_items, stages, book, ShapesEditor(), sim, index.parent, out, progress=False)
        assert again.items == 0  # everything is stored: nothing is edited twice
        outcomes = [trace(state, key, stages, book) for key, state in all_items()]
    by_key = {it["key"]: o for it, o in zip(items, outcomes)}
    stored = {e["id"]: e for e in _lines(out / "stages" / "edit.jsonl")}
    for key in (items[0]["key"], items[1]["key"]):  # the two edits: kept by the similarity stage iff >= 0.9
        o, sim = by_key[key], stored[key]["similarity"]
        assert (o.status, o.stage) == (("pending", "caption1") if sim >= 0.9 else ("rejected", "similarity"))
    assert by_key[items[2]["key"]].reason == "unsupported_instruction"
    assert by_key[items[3]["key"]].reason == "generator_error" and by_key["gone"].reason == "missing_image"
    edited = [_lines(out / "stages" / "edit.jsonl")[k] for k in range(5)]
    ok = [e for e in edited if e["status"] == "ok"]
    assert [e["id"] for e in ok] == [items[0]["key"], items[1]["key"]]
    after = scene_of(Image.open(out / ok[0]["image2"]))
    assert [o.color for o in after] == [("cyan" if scenes[0][0].color == "purple" else "purple")] + [
        o.color for o in scenes[0][1:]
    ]
    assert len(scene_of(Image.open(out / ok[1]["image2"]))) == len(scenes[1]) - 1
    stats = funnel(outcomes, [s.name for s in stages])
    assert stats["filter"] == {"in": 5, "kept": 5, "rejected": {}, "pending": 0}
    assert stats["edit"]["in"] == 5 and sum(stats["edit"]["rejected"].values()) == 3


def test_trace_replays_the_stores_and_a_torn_tail_is_redone(tmp_path: Path) -> None:
    from namc.curate.edits.med_stages import StageBook, trace
    from namc.llm import ResultStore

    stages = med.edit_stages(tmp_path, tmp_path)
    folder = tmp_path / "stages"
    _store(
        folder / "filter.jsonl",
        [
            {"id": "a", "text": "**Final Recommendation:** **Yes**"},
            {"id": "b", "text": "**Final Recommendation:** **No**"},
            {"id": "c", "text": REFUSAL},
        ],
    )
    with (folder / "filter.jsonl").open("a") as f:
        f.write(json.dumps({"id": "d", "status": "failed", "error_kind": "timeout", "error": "deadline"}) + "\n")
        f.write('{"id": "e", "status": "ok", "te')  # a kill mid-write
    with ResultStore(folder / "filter.jsonl") as store:  # opening drops the torn tail
        assert store.torn_bytes > 0 and store.done == {"a", "b", "c", "d"}
    state = {"image": "x.png", "caption": "a cup"}
    with StageBook(folder, ["filter", "instruction", "edit"]) as book:
        got = {k: trace(state, k, stages, book) for k in "abcde"}
        assert trace(state, "d", stages, book, retry="filter").status == "pending"  # --retry-failed
    assert (got["a"].status, got["a"].stage) == ("pending", "instruction")
    assert (got["b"].reason, got["c"].reason, got["d"].reason) == ("filter_no", "filter_unparsed", "timeout")
    assert (got["e"].status, got["e"].stage) == ("pending", "filter")  # the torn line's item is asked again


@pytest.mark.slow  # three rounds of requests and an images server
def test_edit_drives_an_openai_images_server(tmp_path: Path) -> None:
    """The editor as an OpenAI-compatible ``images.edit`` server (tests/images_server.py, which speaks chat too): its
    bad output is counted by kind, its edits stored and measured."""
    from tests.images_server import ImagesServer

    index = shapes_index(tmp_path / "src", 3, seed=8)  # one four-object scene the filter turns down

    def answer(text: str, images: list[bytes]) -> str:
        if text.startswith("You are a professional image prompt engineer"):
            scene = scene_of(Image.open(io.BytesIO(images[0])))
            directive = "[[notimage]] " if len(scene) == 2 else ""
            return FIG8.format("Attribute", f"{directive}paint everything red")
        return shapes_mllm(text, images)

    with ImagesServer(answer=answer) as server:
        editor = {"backend": "openai", "base_url": server.url, "model": "gpt-image-1", "max_attempts": 1}
        argv = ["--images", str(index), "--out", str(tmp_path / "med"), "--editor", json.dumps(editor)]
        argv += ["--similarity", "pixels", "--min-similarity", "0.99", "--base-url", server.url, *FAST]
        assert med.main(argv) == 0
        edits = [r for r in server.requests if r["route"] == "edits"]
    summary = json.loads((tmp_path / "med" / "edit.summary.json").read_text())
    st = summary["stages"]
    sizes = [len(scene_of(Image.open(tmp_path / "src" / "images" / f"{i:05d}.png"))) for i in range(3)]
    assert st["filter"]["rejected"] == ({"filter_no": 1} if 4 in sizes else {})
    assert st["edit"]["rejected"] == ({"bad_output": sizes.count(2)} if 2 in sizes else {})
    assert len(edits) == st["edit"]["in"]
    ok = [r for r in _lines(tmp_path / "med" / "stages" / "edit.jsonl") if r["status"] == "ok"]
    for r in ok:  # the server painted the whole image one colour: far from the original, stopped by the threshold
        assert len(Image.open(tmp_path / "med" / r["image2"]).convert("RGB").getcolors()) == 1
    assert len(ok) >= 1 and st["similarity"]["rejected"] == {"low_similarity": len(ok)}


@pytest.mark.slow  # nine rounds of requests: a few seconds on a loaded two-core machine
def test_edit_runs_every_stage_and_accounts_for_every_image(tmp_path: Path, clip: dict[str, Path]) -> None:
    bad = [
        {"key": "missing", "image": "images/none.png", "caption": "a small red metal cube"},
        {"key": "corrupt", "image": "corrupt.png", "caption": "a small red metal cube"},
        {"key": "nocaption", "image": "images/00000.png"},
        {"key": "refused", "image": "images/00001.png", "caption": "refuse this small red metal cube"},
        {"key": "error500", "image": "images/00002.png", "caption": "a small red metal cube [[500]]"},
        {"key": "empty", "image": "images/00003.png", "caption": "a small red metal cube [[empty]]"},
        {"key": "huge", "image": "huge.png", "caption": "a small red metal cube"},
    ]
    index = shapes_index(tmp_path / "src", 4, seed=8, extra=bad)
    (tmp_path / "src" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    (tmp_path / "src" / "huge.png").write_bytes(_png_header(60_000, 60_000))
    with index.open("a") as f:
        f.write("{not json\n" + json.dumps({"key": "shapes/00003", "image": "x.png", "caption": "dup"}) + "\n")
    out = tmp_path / "med"
    with LLMServer(answer=shapes_mllm) as server:
        summary = med.run_edit(index, out, ShapesEditor(), _similarity(clip), _config(server.url), progress=False)
        requests = sum(server.actions.values())
    asked = sum(s["run"]["items"] for n, s in summary["stages"].items() if "run" in s and n != "edit")
    assert requests == asked - 4 + 1  # four bad inputs never sent; error500 sent twice

    assert summary["input"]["items"] == 11 and summary["input"]["skipped"] == {"malformed_line": 1, "duplicate_id": 1}
    assert summary["pairs"] + summary["rejected"] == 11 and summary["pending"] == 0
    st = summary["stages"]
    assert st["filter"]["rejected"]["missing_image"] == 1 and st["filter"]["rejected"]["corrupt_image"] == 1
    assert (
        st["filter"]["rejected"]["oversized_image"] == 1
        and st["filter"]["rejected"]["missing_caption"] == 1
        and st["filter"]["rejected"]["server_error"] == 1
    )
    assert st["filter"]["rejected"]["filter_unparsed"] == 2  # the refusal and the empty answer
    assert st["filter"]["rejected"]["filter_no"] >= 1  # four-object scenes
    assert st["edit"]["rejected"]["unsupported_instruction"] >= 1  # Scene / Action / Part
    for name, s in st.items():
        assert s["in"] == s["kept"] + sum(s["rejected"].values()) + s["pending"], name
    names = list(st)
    for a, b in zip(names, names[1:]):
        assert st[a]["kept"] == st[b]["in"]
    assert st["template"]["kept"] == summary["pairs"] > 0
    assert list(summary["categories"]) == list(P.CATEGORIES) and sum(summary["categories"].values()) == summary["pairs"]
    assert sum(summary["instructed_categories"].values()) == st["instruction"]["kept"]

    rejects = _lines(out / "rejects.jsonl")
    assert len(rejects) == summary["rejected"] and {r["id"] for r in rejects} >= {x["key"] for x in bad}
    pairs, manifest = _lines(out / "pairs.jsonl"), _lines(out / "manifest.jsonl")
    assert [p["id"] for p in pairs] == [m["id"] for m in manifest] and len(pairs) == summary["pairs"]
    for p, m in zip(pairs, manifest):
        record = parse_record(m)  # the corpus format: the template and its halves
        assert record.desc1 and record.desc2 and m["category"] == p["category"] in P.CATEGORIES
        assert p["similarity"] >= med.MIN_SIMILARITY
        first, second = (Image.open(out / p[k]) for k in ("image1", "image2"))
        before, after = scene_of(first), scene_of(second)
        assert before is not None and after is not None and before != after  # the edit is in the image
        assert p["caption1"] != p["caption2"]


@pytest.mark.slow
def test_edit_counts_generator_errors_and_resumes_from_a_torn_store(tmp_path: Path, clip: dict[str, Path]) -> None:
    index = shapes_index(tmp_path / "src", 4, seed=9)
    out = tmp_path / "med"
    with LLMServer(answer=shapes_mllm) as server:
        editor = RaisingEditor(poison="add one more")
        first = med.run_edit(index, out, editor, _similarity(clip), _config(server.url), batch_size=1, progress=False)
        assert first["stages"]["edit"]["rejected"].get("generator_error", 0) >= 1
        outputs = {n: (out / n).read_bytes() for n in ("pairs.jsonl", "manifest.jsonl", "rejects.jsonl")}
        # a kill mid-write: the caption2 store loses its last two results and ends in half a line
        store = out / "stages" / "caption2.jsonl"
        lines = store.read_bytes().splitlines(keepends=True)
        assert len(lines) >= 2
        store.write_bytes(b"".join(lines[:-2]) + lines[-2][:7])
        asked = sum(server.actions.values())
        second = med.run_edit(index, out, editor, _similarity(clip), _config(server.url), batch_size=1, progress=False)
        assert second["stages"]["caption2"]["run"]["items"] == 2  # exactly the two lost results, asked again
        assert sum(server.actions.values()) - asked == 2  # later stages kept their stored answers
        # the command line over the same folder: nothing left to ask, the same outputs
        argv = ["--images", str(index), "--out", str(out), "--editor", "{backend: shapes}", "--clip-weights"]
        argv += [str(clip["weights"]), "--clip-model", str(clip["config"]), "--clip-tag", "none"]
        asked = sum(server.actions.values())
        assert med.main([*argv, "--base-url", server.url, *FAST]) == 0
        assert sum(server.actions.values()) == asked
    again = json.loads((out / "edit.summary.json").read_text())
    counts = ("in", "kept", "rejected", "pending")
    for name, s in second["stages"].items():
        assert {k: again["stages"][name][k] for k in counts} == {k: s[k] for k in counts}, name
    ids = [r["id"] for r in _lines(store)]
    assert len(ids) == len(set(ids))  # nothing duplicated
    for name, data in outputs.items():
        assert (out / name).read_bytes() == data, name


def test_edit_reads_its_yaml_section_and_fails_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as end:
        med.main(["--config", str(ROOT / "configs" / "curate" / "med.yaml"), "--print_config"])
    assert end.value.code == 0
    printed = capsys.readouterr().out
    assert "min_similarity: 0.7" in printed and "backend: diffusers" in printed
    with pytest.raises(SystemExit) as end:
        questions.main(["--config", str(ROOT / "configs" / "curate" / "med.yaml"), "--print_config"])
    assert end.value.code == 0 and "min_similarity: 0.95" in capsys.readouterr().out
    index = shapes_index(tmp_path, 1)
    code = med.main(
        ["--images", str(index), "--editor", "{backend: shapes}", "--clip-weights", str(tmp_path / "no.bin")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "timm/vit_base_patch32_clip_224.openai" in err


# ---------------------------------------------------------------------------------------------------------------
# Questions
# ---------------------------------------------------------------------------------------------------------------


def _pairs(folder: Path, n: int) -> Path:
    """A pairs.jsonl as the edit step writes it, over shapes renders (image2 = image1 re-rendered)."""
    from namc.curate.edits.shapes import ShapesPairGenerator, save_png

    gen = ShapesPairGenerator(32)
    rows = []
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        a, b = gen.generate_pairs(
            [("a small red metal cube", f"a small {'blue' if i % 2 else 'green'} metal cube")], [i]
        )[0]
        save_png(a, folder / f"{i}_1.png")
        save_png(b, folder / f"{i}_2.png")
        cat = P.CATEGORIES[i % 11]
        diff = f"The small red metal cube became a small {'blue' if i % 2 else 'green'} metal cube."
        if i == 5:
            diff += " refuse"
        rows.append(
            {
                "id": f"p{i}",
                "image1": f"{i}_1.png",
                "image2": f"{i}_2.png",
                "category": cat,
                "difference": diff,
                "similarity": 0.99 if i != 3 else 0.9,
            }
        )
    with tarfile.open(folder / "shard.tar", "w") as tar:  # an original stored in a WebDataset shard
        tar.add(folder / "0_1.png", arcname="0_1.png")
    rows[0]["image1"] = "shard.tar::0_1.png"
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _question_answers(text: str, images: list[bytes]) -> str:
    if "refuse" in text:
        return "I'm sorry, I can't help with that."
    return shapes_mllm(text, images)


def _questions(tmp_path: Path) -> tuple[dict, list, list]:
    """Runs ``namc curate questions`` over :func:`_pairs` and checks what it wrote; returns the summary, the
    benchmark entries and the items ``namc eval choice --format med`` reads from them."""
    pairs = _pairs(tmp_path / "med", 14)
    with LLMServer(answer=_question_answers) as server:
        code = questions.main(["--pairs", str(pairs), "--per-category", "1", "--base-url", server.url, *FAST])
    assert code == 0
    summary = json.loads((tmp_path / "med" / "questions.summary.json").read_text())
    st = summary["stages"]
    assert st["similarity"]["rejected"] == {"low_similarity": 1}
    assert st["answer"]["rejected"] == {"malformed_answer": 1}  # the refusal
    assert summary["questions"] == sum(summary["categories"].values())
    assert all(n <= 1 for n in summary["categories"].values())
    assert st["balance"]["rejected"] == {"category_full": 3}  # categories 0-2 have two pairs each
    assert summary["questions"] + summary["rejected"] == 14
    bench = json.loads((tmp_path / "med" / "MED_bench.json").read_text())
    items = read_med(tmp_path / "med" / "MED_bench.json")
    assert len(items) == len(bench) == summary["questions"]
    for entry, item in zip(bench, items):
        assert entry["question"] in P.FIG15_QUESTIONS and entry["type"] in P.CATEGORIES
        assert [o[:3] for o in entry["options"]] == ["A. ", "B. ", "C. ", "D. "]
        assert len(set(item.candidates)) == 4 and item.candidates[item.answer].startswith("In the second image")
        assert item.image1.is_file() and item.image2.is_file()
    p0 = next(e for e in bench if e["id"] == "p0")
    assert p0["image_name"].startswith("originals/") and p0["image_name"].endswith(".png")
    assert len({e["answer"] for e in bench}) > 1  # the right answer's place is drawn, not fixed
    return summary, bench, items


def test_questions_write_the_med_format(tmp_path: Path) -> None:
    summary, bench, items = _questions(tmp_path)
    assert summary["questions"] == len(items) > 0


@pytest.mark.slow  # builds and scores a model
def test_eval_choice_scores_the_questions(tmp_path: Path, capsys) -> None:
    import torch

    from namc.eval.captions.cli import main as eval_main
    from namc.models import create_model
    from namc.text.tokenizer import WordTokenizer

    _, _, items = _questions(tmp_path)
    torch.manual_seed(0)
    texts = [c for it in items for c in it.candidates]
    model = create_model(
        "namc_tiny",
        tokenizer=WordTokenizer.build(texts),
        pretraining=False,
        image_size=32,
        dim=32,
        heads=2,
        dropout=0.0,
    )
    model.save_pretrained(tmp_path / "model")
    capsys.readouterr()
    res = tmp_path / "res.json"
    assert (
        eval_main(
            [
                "choice",
                str(tmp_path / "med" / "MED_bench.json"),
                "--format",
                "med",
                "--model",
                str(tmp_path / "model"),
                "--out",
                str(res),
                "--quiet",
            ]
        )
        == 0
    )
    scored = json.loads(res.read_text())
    assert scored["overall"]["n"] == len(items) and scored["overall"]["chance"] == pytest.approx(25.0)
    assert set(scored["per_category"]) <= set(P.CATEGORIES)


# ---------------------------------------------------------------------------------------------------------------
# Slow: a kill at any moment, and pre-training on the corpus
# ---------------------------------------------------------------------------------------------------------------


def _edit_proc(index: Path, out: Path, url: str, clip: dict[str, Path]) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "namc.curate.edits.med",
        "--images",
        str(index),
        "--out",
        str(out),
        "--editor",
        "{backend: shapes}",
        "--clip-weights",
        str(clip["weights"]),
        "--clip-model",
        str(clip["config"]),
        "--clip-tag",
        "none",
        "--batch-size",
        "2",
        "--base-url",
        url,
        *FAST,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)


@pytest.mark.slow
def test_edit_survives_sigkill_at_any_moment(tmp_path: Path, clip: dict[str, Path]) -> None:
    index = shapes_index(tmp_path / "src", 20, seed=7)
    with LLMServer(answer=shapes_mllm, latency=0.01) as server:
        assert _edit_proc(index, tmp_path / "a", server.url, clip).wait(timeout=300) == 0
        kills = 0
        for delay in (3.0, 4.0, 5.0, 6.0, 7.0):
            proc = _edit_proc(index, tmp_path / "b", server.url, clip)
            time.sleep(delay)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                kills += 1
            proc.wait()
        assert kills >= 2
        assert _edit_proc(index, tmp_path / "b", server.url, clip).wait(timeout=300) == 0
    for name in ("pairs.jsonl", "manifest.jsonl", "rejects.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    for store in (tmp_path / "b" / "stages").glob("*.jsonl"):
        ids = [r["id"] for r in _lines(store)]
        assert len(ids) == len(set(ids)), store.name


@pytest.mark.slow
def test_the_edit_corpus_pretrains(tmp_path: Path, clip: dict[str, Path]) -> None:

    index = shapes_index(tmp_path / "src", 40, seed=11)
    with LLMServer(answer=shapes_mllm) as server:
        summary = med.run_edit(
            index, tmp_path / "med", ShapesEditor(), _similarity(clip), _config(server.url), progress=False
        )
    assert summary["pairs"] >= 8
    pretrain_two_steps(
        tmp_path / "med" / "manifest.jsonl", tmp_path / "run", batch_size=4, shuffle_buffer=8, max_text_len=64
    )
