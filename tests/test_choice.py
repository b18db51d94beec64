"""Minimal-pair choice evaluation (``namc eval choice``): scores equal hand-computed log-probabilities, ties, input
errors, MED's release format, and the shapes-world generator (``namc data minimal-pairs``)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from namc.data.synthetic import render_scene
from namc.data.synthetic.minimal_pairs import CATEGORIES, generate_minimal_pairs
from namc.eval.choice import _credit, evaluate_choices, read_choices, read_med, score_candidates
from namc.models import create_model
from namc.text.tokenizer import WordTokenizer

TEXTS = [
    "the small red metal cube changed to blue",
    "the small red rubber cube changed to blue",
    "the large red metal cube changed to blue",
    "no change was made",
    "the small red metal cube is missing",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("choice")
    torch.manual_seed(0)
    tok = WordTokenizer.build(TEXTS)
    model = create_model("namc_tiny", tokenizer=tok, pretraining=False, image_size=32, dim=32, heads=2, dropout=0.0)
    model.save_pretrained(root / "model")
    for i in range(2):
        for slot in (1, 2):
            img = torch.rand(32, 32, 3).mul(255).byte().numpy()
            from PIL import Image

            Image.fromarray(img).save(root / f"p{i}_{slot}.png")
    return {"root": root, "model": model.eval(), "tok": tok}


def _hand_logprob(model, memory: torch.Tensor, text: str) -> float:
    """sum_t log softmax(FDG(ids[:t]))[ids[t]] / (number of targets), one position at a time."""
    tok = model.tokenizer
    ids = [tok.bos_id, *tok.encode(text), tok.eos_id]
    total = 0.0
    for t in range(1, len(ids)):
        logits = model.fdg(torch.tensor([ids[:t]]), memory)  # (1, t, V)
        total += F.log_softmax(logits[0, -1].double(), -1)[ids[t]].item()
    return total / (len(ids) - 1)


def test_scores_match_hand_computed_logprobs(tiny: dict) -> None:
    model = tiny["model"]
    torch.manual_seed(1)
    im1, im2 = torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)
    cands = [TEXTS[:3], TEXTS[2:]]
    scores = score_candidates(model, im1, im2, cands)
    with torch.no_grad():
        memory = model.encode_pair(im1, im2)
        for b in range(2):
            for k, text in enumerate(cands[b]):
                assert scores[b][k] == pytest.approx(_hand_logprob(model, memory[b : b + 1], text), abs=1e-4)


def test_accuracy_follows_the_highest_score(tiny: dict, tmp_path) -> None:
    root, model = tiny["root"], tiny["model"]
    lines = [
        {
            "id": "a",
            "image1": str(root / "p0_1.png"),
            "image2": str(root / "p0_2.png"),
            "candidates": TEXTS[:3],
            "answer": 0,
            "category": "material",
        },
        {
            "id": "b",
            "image1": str(root / "p1_1.png"),
            "image2": str(root / "p1_2.png"),
            "candidates": TEXTS[2:],
            "answer": 2,
            "category": "size",
        },
        {
            "id": "c",
            "image1": str(root / "missing.png"),
            "image2": str(root / "p1_2.png"),
            "candidates": TEXTS[:2],
            "answer": 1,
            "category": "size",
        },
    ]
    path = tmp_path / "choices.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = evaluate_choices(model, read_choices(path), batch_size=2)
    assert res["skipped"] == 1 and "c:" in res["skipped_examples"][0]
    from namc.data.transforms import ImageTransform

    load = ImageTransform(32).load
    expected = {}
    for x in lines[:2]:
        s = score_candidates(model, load(x["image1"])[None], load(x["image2"])[None], [x["candidates"]])[0]
        expected[x["category"]] = 100.0 * (max(range(len(s)), key=s.__getitem__) == x["answer"])
    assert res["per_category"]["material"]["accuracy"] == expected["material"]
    assert res["per_category"]["size"]["accuracy"] == expected["size"]
    assert res["per_category"]["material"]["chance"] == pytest.approx(100 / 3)
    assert res["overall"]["n"] == 2


def test_ties_count_as_a_random_pick() -> None:
    assert _credit([0.1, 0.5, 0.5], 1) == (0.5, 2)
    assert _credit([0.1, 0.5, 0.5], 0) == (0.0, 2)
    assert _credit([0.9, 0.5, 0.5], 0) == (1.0, 1)


def test_bad_lines_name_file_and_line(tmp_path) -> None:
    path = tmp_path / "c.jsonl"
    good = {"image1": "a.png", "image2": "b.png", "candidates": ["x", "y"], "answer": 1}
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"c\.jsonl:2: invalid JSON"):
        read_choices(path)
    path.write_text(json.dumps({**good, "answer": 2}) + "\n")
    with pytest.raises(ValueError, match=r"c\.jsonl:1: 'answer' must be an index"):
        read_choices(path)
    path.write_bytes(b'{"image1": "\xff"}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:1: not UTF-8"):
        read_choices(path)
    with pytest.raises(FileNotFoundError, match="minimal-pairs"):
        read_choices(tmp_path / "none.jsonl")


def test_med_release_format(tmp_path) -> None:
    # the layout of benchmark/MED_bench.json and MED_real_set.json in github.com/beccabai/hallu_med
    bench = [
        {
            "image_name": "images/test_00043.jpg",
            "edited_image_name": "images/test_00043_edited.jpg",
            "type": "Negation",
            "question": "What's the most significant contrast between these two photos?",
            "options": [
                "A. In the second image, the cracks are absent.  ",
                "B. In the second image, ice is gone.",
                "C. In the second image, the sign is red.",
                "D. Nothing differs.",
            ],
            "answer": "C",
        },
    ]
    real = [
        {
            "image_name": "/path/to/MMVP Images/1.jpg",
            "edited_image_name": "/path/to/MMVP Images/2.jpg",
            "options": ["A. Wings open in the first image.", "B. Wings closed in the first image."],
            "answer": "A",
            "question": "What's the most significant contrast between these two photos?",
        },
    ]
    (tmp_path / "MED_bench.json").write_text(json.dumps(bench))
    (tmp_path / "MED_real_set.json").write_text(json.dumps(real))
    (item,) = read_med(tmp_path / "MED_bench.json")
    assert item.candidates[0] == "In the second image, the cracks are absent." and item.answer == 2
    assert item.category == "Negation" and item.image1 == tmp_path / "images" / "test_00043.jpg"
    (item,) = read_med(tmp_path / "MED_real_set.json", image_root=tmp_path / "mmvp")
    assert item.category == "real" and item.answer == 0 and item.image2 == tmp_path / "mmvp" / "2.jpg"
    (tmp_path / "bad.json").write_text(json.dumps([{**bench[0], "answer": "E"}]))
    with pytest.raises(ValueError, match=r"bad\.json: entry 0: answer 'E'"):
        read_med(tmp_path / "bad.json")


def test_minimal_pairs_generator_and_the_eval_choice_command(tiny: dict, tmp_path, capsys) -> None:
    from namc.data.cli import main as data_main
    from namc.eval.captions.cli import main as eval_main

    assert (
        data_main(["minimal-pairs", "--out", str(tmp_path / "mp"), "--items", "16", "--image-size", "32", "--quiet"])
        == 0
    )
    items = read_choices(tmp_path / "mp" / "choices.jsonl")
    assert [it.category for it in items] == list(CATEGORIES) * 2
    for it in items:
        assert len(set(it.candidates)) == len(it.candidates) >= 2
        assert it.image1.is_file() and it.image2.is_file()
    by_cat = {it.category: it for it in items}
    assert len(by_cat["size"].candidates) == 2 and len(by_cat["colour"].candidates) == 4
    assert by_cat["no_change"].candidates[by_cat["no_change"].answer] in {
        "no change was made",
        "the scene remains the same",
        "nothing has changed",
        "the two scenes seem identical",
        "there is no difference",
        "the scene is the same as before",
    }
    # the same seed writes the same items
    again = generate_minimal_pairs(tmp_path / "mp2", 16, image_size=32)
    assert (tmp_path / "mp2" / "choices.jsonl").read_text() == (tmp_path / "mp" / "choices.jsonl").read_text()
    assert again["items"] == 16 and set(again["categories"]) == set(CATEGORIES)
    capsys.readouterr()
    out = tmp_path / "res.json"
    code = eval_main(
        [
            "choice",
            str(tmp_path / "mp" / "choices.jsonl"),
            "--model",
            str(tiny["root"] / "model"),
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "overall" in printed and "chance" in printed
    res = json.loads(out.read_text())
    assert res["overall"]["n"] == 16 and set(res["per_category"]) == set(CATEGORIES)
    assert eval_main(["choice", str(tmp_path / "none.jsonl"), "--model", str(tiny["root"] / "model")]) == 2


def test_rendered_pairs_differ_except_no_change_jitter(tmp_path) -> None:
    from namc.data.synthetic.minimal_pairs import minimal_pair_item

    (o1, v1), (o2, v2), rec = minimal_pair_item(0, 7)  # index 7: no_change
    assert rec["category"] == "no_change" and o1 == o2 and v2 is not None
    (o1, _), (o2, _), rec = minimal_pair_item(0, 0)  # colour
    assert rec["category"] == "colour" and o1 != o2
    assert render_scene(o1, 32).size == (32, 32)
