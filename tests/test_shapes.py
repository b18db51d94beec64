"""Shapes world: determinism, coverage of change types, noise labels, distinguishability, CLI."""

from __future__ import annotations

import filecmp
import itertools
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from namc.data.cli import main
from namc.data.corpus import CorpusDataset
from namc.data.synthetic import (
    CHANGE_TYPES,
    COLORS,
    MATERIALS,
    SHAPES,
    SIZES,
    ShapeObject,
    View,
    corpus_record,
    generate_benchmark,
    generate_corpus,
    make_pair,
    render_scene,
)
from namc.text.template import parse


def _same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return not mismatch and not errors and all(_same_tree(a / d, b / d) for d in cmp.common_dirs)


def test_same_seed_same_bytes_any_worker_count(tmp_path: Path) -> None:
    generate_benchmark(tmp_path / "a" / "bench", 12, image_size=32, seed=3)
    generate_corpus(tmp_path / "a" / "corpus", 12, image_size=32, seed=3)
    generate_benchmark(tmp_path / "b" / "bench", 12, image_size=32, seed=3, workers=2)
    generate_corpus(tmp_path / "b" / "corpus", 12, image_size=32, seed=3, workers=2)
    assert _same_tree(tmp_path / "a", tmp_path / "b")
    generate_benchmark(tmp_path / "c" / "bench", 12, image_size=32, seed=4)
    a = (tmp_path / "a" / "bench" / "images" / "CLEVR_default_000000.png").read_bytes()
    c = (tmp_path / "c" / "bench" / "images" / "CLEVR_default_000000.png").read_bytes()
    assert a != c


def test_benchmark_covers_every_change_type_and_distractor(tmp_path: Path) -> None:
    info = generate_benchmark(tmp_path, 10, image_size=32, seed=0, n_captions=3)
    assert info["types"] == {t: 2 for t in CHANGE_TYPES}
    assert sum(info["splits"].values()) == 10
    mapping = json.loads((tmp_path / "type_mapping.json").read_text())
    assert sorted(mapping) == sorted(CHANGE_TYPES)
    no_change = json.loads((tmp_path / "no_change_captions.json").read_text())
    change = json.loads((tmp_path / "change_captions.json").read_text())
    scenes = json.loads((tmp_path / "scenes.json").read_text())
    mapping_of = {int(name.split(".")[0]): t for t, names in mapping.items() for name in names}
    for i in range(10):
        key = f"CLEVR_default_{i:06d}.png"
        assert len(no_change[key]) == 3 and len(set(no_change[key])) == 3
        assert not any(w in SHAPES for c in no_change[key] for w in c.split())  # no object is named
        changed, after = scenes[key]["changed"], scenes[key]["changed_after"]
        name = f"{changed['size']} {changed['color']} {changed['material']} {changed['shape']}"
        assert all(name in c for c in change[key])
        if mapping_of[i] == "color":
            assert all(c.endswith(after["color"]) for c in change[key])
        if mapping_of[i] == "material":
            assert all(c.endswith(after["material"]) for c in change[key])
        assert len(change[key]) == 3 and len(set(change[key])) == 3
        for sub, prefix in (
            ("images", "CLEVR_default"),
            ("sc_images", "CLEVR_semantic"),
            ("nsc_images", "CLEVR_nonsemantic"),
        ):
            assert (tmp_path / sub / f"{prefix}_{i:06d}.png").exists()
        before = np.asarray(Image.open(tmp_path / "images" / key))
        distractor = np.asarray(Image.open(tmp_path / "nsc_images" / f"CLEVR_nonsemantic_{i:06d}.png"))
        assert np.abs(before.astype(int) - distractor).mean() > 0.5  # the distractor is visibly different
        assert scenes[key]["view_distractor"] != {"dx": 0.0, "dy": 0.0, "scale": 1.0, "brightness": 1.0}


@pytest.mark.parametrize("change_type", CHANGE_TYPES)
def test_pair_invariants(change_type: str) -> None:
    for i in range(30):
        pair = make_pair(1, i, change_type=change_type)
        assert pair.change_type == change_type
        for scene in (pair.before, pair.after):
            assert 2 <= len(scene) <= 6
            assert len({o.key for o in scene}) == len(scene)  # every object has a unique name
        before, after = {o.key: o for o in pair.before}, {o.key: o for o in pair.after}
        changed, new = pair.changed, pair.changed_after
        if change_type == "add":
            assert len(pair.after) == len(pair.before) + 1 and new.key not in before and new.key in after
        elif change_type == "drop":
            assert len(pair.after) == len(pair.before) - 1 and changed.key in before and changed.key not in after
        elif change_type == "move":
            assert changed.key == new.key and math.hypot(changed.x - new.x, changed.y - new.y) >= 0.25
        elif change_type == "color":
            assert (changed.color != new.color) and (changed.shape, changed.size, changed.material, changed.x) == (
                new.shape,
                new.size,
                new.material,
                new.x,
            )
        else:
            assert changed.material != new.material and changed.color == new.color
        untouched = [o for o in pair.before if o is not changed]
        assert all(o in pair.after for o in untouched)


def test_noise_labels_point_at_exactly_the_injected_words() -> None:
    sizes, colors, materials, shapes = set(SIZES), set(COLORS), set(MATERIALS), set(SHAPES)
    n_phrases = n_noise = 0
    for i in range(300):
        pair = make_pair(2, i, "corpus")
        record, stats = corpus_record(pair, seed=2, noise_rate=0.3)
        n_phrases += stats["phrases"]
        n_noise += stats["noise_phrases"]
        assert parse(record["description"])[1] == record["desc1"]
        for desc, labels, scene in (
            (record["desc1"], record["noise1"], pair.before),
            (record["desc2"], record["noise2"], pair.after),
        ):
            words = desc.split()
            assert len(labels) == len(words)
            names = {o.name for o in scene}
            clean = [w for w, lab in zip(words, labels) if lab == 0]
            # every object named by the clean words is in this image ("a size color material shape")
            for k, w in enumerate(clean):
                if w in shapes and k >= 3:
                    assert " ".join(clean[k - 3 : k + 1]) in names
            # every run of noise words is absent from the image
            k = 0
            while k < len(words):
                if labels[k] == 0:
                    k += 1
                    continue
                end = k
                while end < len(words) and labels[end] == 1:
                    end += 1
                run = words[k:end]
                if run[-1] in shapes:  # an object in a colour nothing in the image has: "near a yellow cylinder"
                    assert len(run) == 4 and run[0] in {"near", "beside", "with", "and"} and run[1] == "a"
                    assert run[2] in colors and run[2] not in {o.color for o in scene}
                elif len(run) == 1:  # a false attribute inside an object's name, before its colour
                    assert run[0] not in sizes | colors | materials | shapes and words[end] in colors
                else:  # scenery
                    assert run[0] in {"on", "under", "in", "beside", "near", "next"}
                if len(run) > 1:  # a noise phrase comes before the real phrase it accompanies
                    assert end < len(words) and labels[end] == 0
                k = end
    assert n_noise / n_phrases == pytest.approx(0.3, abs=0.04)


def test_noise_never_fails_on_scenes_of_every_colour() -> None:
    """With ``--max-objects 8`` an image can hold all 8 colours, leaving no colour to hallucinate an object in: such
    a phrase becomes scenery (pair 450 of seed 0 at 7-8 objects is such a scene)."""
    full = 0
    for i in range(460):
        pair = make_pair(0, i, "corpus", min_objects=7, max_objects=8)
        record, _ = corpus_record(pair, seed=0, noise_rate=0.5)
        full += any(len({o.color for o in scene}) == len(COLORS) for scene in (pair.before, pair.after))
        assert parse(record["description"])[1] == record["desc1"]
    assert full > 0


def test_noise_rate_zero_and_bounds() -> None:
    for i in range(20):
        record, stats = corpus_record(make_pair(0, i, "corpus"), seed=0, noise_rate=0.0)
        assert stats["noise_phrases"] == 0 and not any(record["noise1"]) and not any(record["noise2"])
    with pytest.raises(ValueError):
        generate_corpus("/nonexistent", 1, noise_rate=0.6)


def test_corpus_is_readable_by_corpus_dataset(tmp_path: Path) -> None:
    meta = generate_corpus(tmp_path, 20, image_size=32, seed=1, noise_rate=0.25)
    assert meta["pairs"] == 20 and 0 < meta["phrase_noise_fraction"] < 0.6
    samples = list(CorpusDataset(tmp_path / "manifest.jsonl", 32))
    assert len(samples) == 20
    assert {s["source"] for s in samples} == {"shapes"}
    assert all(len(s["noise1"]) == len(s["desc1"].split()) for s in samples)


def _object_pixels(obj: ShapeObject, size: int) -> np.ndarray:
    background = np.asarray(render_scene([], size), dtype=np.float32)
    img = np.asarray(render_scene([obj], size), dtype=np.float32)
    return np.abs(img - background).sum(-1) > 30  # (H, W) mask of the object


def _crop(obj: ShapeObject, size: int = 64, half: int = 11) -> np.ndarray:
    img = np.asarray(render_scene([obj], size), dtype=np.float32)
    cx, cy = round(obj.x * size), round(obj.y * size)
    return img[cy - half : cy + half, cx - half : cx + half]  # (2 half, 2 half, 3) around the object


def test_objects_distinguishable_at_64px() -> None:
    # a nearest-template classifier over 22x22 crops tells shape, size and material apart for every colour,
    # with the object anywhere on the floor (sub-pixel offsets, a different background shade)
    rng = random.Random(0)
    keys = list(itertools.product(SHAPES, SIZES, MATERIALS))
    correct = total = 0
    for color in COLORS:
        templates = {k: _crop(ShapeObject(k[0], color, k[1], k[2], 0.5, 0.55)) for k in keys}
        for k in keys:
            for _ in range(4):
                crop = _crop(ShapeObject(k[0], color, k[1], k[2], rng.uniform(0.2, 0.8), rng.uniform(0.35, 0.8)))
                guess = min(keys, key=lambda t: float(np.abs(templates[t] - crop).mean()))
                correct += guess == k
                total += 1
    assert correct / total >= 0.97
    small = _object_pixels(ShapeObject("sphere", "red", "small", "rubber", 0.5, 0.55), 64).sum()
    large = _object_pixels(ShapeObject("sphere", "red", "large", "rubber", 0.5, 0.55), 64).sum()
    assert large > 1.8 * small and small >= 60  # a small object still covers about 9 x 9 pixels
    palette = np.array(list(COLORS.values()), dtype=np.float32)
    for name in COLORS:  # the object's mean colour is nearest to its own CLEVR colour
        obj = ShapeObject("cube", name, "small", "rubber", 0.5, 0.55)
        img = np.asarray(render_scene([obj], 64), dtype=np.float32)
        mean = img[_object_pixels(obj, 64)].mean(0)
        assert list(COLORS)[int(np.argmin(((palette - mean) ** 2).sum(1)))] == name


def test_render_any_resolution_and_view() -> None:
    scene = make_pair(0, 0).before
    for size in (16, 64, 224, 500):
        assert render_scene(scene, size).size == (size, size)
    base = np.asarray(render_scene(scene, 64), dtype=np.float32)
    dark = np.asarray(render_scene(scene, 64, View(brightness=0.8)), dtype=np.float32)
    assert dark.mean() < 0.85 * base.mean()
    shifted = np.asarray(render_scene(scene, 64, View(dx=0.05)), dtype=np.float32)
    assert np.abs(shifted - base).mean() > 1


def test_cli_shapes_and_pack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "world"
    assert (
        main(["shapes", "--out", str(out), "--pairs", "10", "--image-size", "32", "--shards", "--shard-size", "4"]) == 0
    )
    assert (out / "clevr_change" / "splits.json").exists()
    assert len((out / "corpus" / "manifest.jsonl").read_text().splitlines()) == 10
    assert len(list((out / "corpus" / "shards").glob("*.tar"))) == 3
    assert main(["pack", str(out / "corpus" / "manifest.jsonl"), str(tmp_path / "again"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "benchmark:" in printed and "packed 10 of 10 records" in printed
    with pytest.raises(SystemExit):
        main(["shapes"])  # --out is required
    capsys.readouterr()
    for argv, message in (
        (["pack", str(tmp_path / "nope.jsonl"), str(tmp_path / "nope")], f"manifest not found: {tmp_path}"),
        (["pack", str(out / "corpus" / "manifest.jsonl"), str(tmp_path / "nope"), "--shard-size", "0"], "positive"),
        (["shapes", "--out", str(tmp_path / "nope"), "--min-objects", "5", "--max-objects", "3"], "min_objects"),
    ):
        assert main(argv) == 2  # one line, no traceback, nothing created
        err = capsys.readouterr().err
        assert err.startswith(f"namc data {argv[0]}: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "nope").exists()
