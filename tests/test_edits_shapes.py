"""The shapes-world stand-ins of the edit-pair engines: captions round-trip, and each stand-in changes exactly the
boxes it reports, through the protocols of namc.curate.edits.base."""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image, ImageDraw

from namc.curate.edits import shapes
from namc.curate.edits.base import Editor, GenerationFailed, Inpainter, PairGenerator
from namc.data.synthetic.scene import ShapeObject

SIDE = 64


def _diff_box(a: Image.Image, b: Image.Image) -> tuple[int, int, int, int] | None:
    d = np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).max(axis=2) > 0  # (H, W)
    ys, xs = np.nonzero(d)
    return None if xs.size == 0 else (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)


def _inside(inner: tuple[int, int, int, int], outer: tuple[int, int, int, int]) -> bool:
    return outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]


def _source(seed: int = 0, caption: str | None = None) -> Image.Image:
    caption = caption or shapes.random_caption(random.Random(seed), 3, 4)
    scene = shapes.parse_caption(caption, seed)
    assert scene is not None
    gen = shapes.ShapesPairGenerator(SIDE)
    (pair,) = gen.generate_pairs([(caption, caption)], [seed])
    assert not isinstance(pair, GenerationFailed)
    return pair[0]


def test_caption_round_trip_is_deterministic() -> None:
    rng = random.Random(3)
    caption = shapes.random_caption(rng, 2, 6)
    scene = shapes.parse_caption(caption, seed=7)
    assert scene is not None and shapes.caption_of(scene) == caption
    assert shapes.parse_caption(caption, seed=7) == scene
    assert shapes.parse_caption(caption, seed=8) != scene  # the seed draws the layout
    assert shapes.parse_caption("a photo of a cat on a sofa", 0) is None
    too_many = shapes.caption_of([ShapeObject("cube", "red", "small", "metal", 0, 0)] * (shapes.MAX_SLOTS + 1))
    assert shapes.parse_caption(too_many, 0) is None


@pytest.mark.parametrize("seed", range(6))
def test_layout_slots_hold_large_objects_without_overlap(seed: int) -> None:
    slots = shapes.layout(seed)
    assert len(slots) == shapes.MAX_SLOTS == len(set(slots))
    feet = [shapes._footprint(ShapeObject("cube", "red", "large", "rubber", x, y), SIDE) for x, y in slots]
    for i in range(len(feet)):
        for j in range(i + 1, len(feet)):
            assert (feet[i] & feet[j]).sum() <= 0.05 * feet[j].sum()  # at most the soft edges of two shadows touch


@pytest.mark.parametrize("seed", range(4))
def test_pair_generator_changes_only_the_replaced_object(seed: int) -> None:
    rng = random.Random(seed)
    source = shapes.random_caption(rng, 3, 5)
    target, old, new = shapes.replace_object(source, rng)
    gen = shapes.build({"image_size": SIDE}, "pairs")
    assert isinstance(gen, PairGenerator)
    (pair,) = gen.generate_pairs([(source, target)], [seed])
    assert not isinstance(pair, GenerationFailed)
    a, b = pair
    assert shapes.caption_of(shapes.scene_of(a)) == source and shapes.caption_of(shapes.scene_of(b)) == target
    (box,) = gen.last_boxes[0]
    diff = _diff_box(a, b)
    assert diff is not None and _inside(diff, box)
    assert gen.throughput.images == 2 and gen.throughput.items == 2  # two images per pair


def test_pair_generator_fails_an_unparsable_prompt_per_item() -> None:
    gen = shapes.ShapesPairGenerator(SIDE)
    ok = "a small red metal cube and a large blue rubber sphere"
    out = gen.generate_pairs([("a dog on a beach", ok), (ok, ok)], [0, 1])
    assert isinstance(out[0], GenerationFailed) and out[0].kind == "unparsable_prompt"
    assert isinstance(out[1], tuple) and gen.last_boxes == [[], []]
    assert gen.throughput.failed["unparsable_prompt"] == 2  # a failed pair counts twice, as in backends


def test_scene_survives_png(tmp_path) -> None:
    image = _source(1)
    path = tmp_path / "a.png"
    shapes.save_png(image, path)
    with Image.open(path) as loaded:
        loaded.load()
        assert shapes.scene_of(loaded) == shapes.scene_of(image)
        assert np.array_equal(np.asarray(loaded.convert("RGB")), np.asarray(image))


def test_inpainter_removes_the_masked_object() -> None:
    image = _source(2)
    scene = shapes.scene_of(image)
    target = scene[1]
    box = shapes.object_box(target, SIDE)
    mask = Image.new("L", image.size, 0)
    ImageDraw.Draw(mask).rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=255)
    inpainter = shapes.build({"image_size": SIDE}, "inpaint")
    assert isinstance(inpainter, Inpainter)
    (out,) = inpainter.inpaint([image], [mask], ["background, nothing, 8k"], [0])
    assert shapes.scene_of(out) == [o for o in scene if o != target]
    assert inpainter.last_boxes == [[box]]
    assert _inside(_diff_box(image, out), box)


def test_inpainter_paints_floor_on_a_foreign_image_and_rejects_a_bad_mask() -> None:
    image = Image.new("RGB", (SIDE, SIDE), (255, 0, 0))
    mask = Image.new("L", (SIDE, SIDE), 0)
    ImageDraw.Draw(mask).rectangle([10, 10, 19, 19], fill=255)
    inpainter = shapes.ShapesInpainter(SIDE)
    out, bad = inpainter.inpaint([image, image], [mask, Image.new("L", (8, 8))], ["x", "x"], [0, 0])
    assert _diff_box(image, out) == (10, 10, 20, 20) and inpainter.last_boxes[0] == [(10, 10, 20, 20)]
    assert isinstance(bad, GenerationFailed) and bad.kind == "bad_mask"


def _edit(instruction: str, image: Image.Image) -> tuple[Image.Image | GenerationFailed, list]:
    editor = shapes.build({}, "edit")
    assert isinstance(editor, Editor)
    (out,) = editor.edit([image], [instruction], [5])
    return out, editor.last_boxes[0]


CAPTION = (
    "a small red metal cube, a large blue rubber sphere, a small blue rubber cylinder and a small green metal cube"
)


@pytest.mark.parametrize(
    ("instruction", "check"),
    [
        ("change the color of the red cube to yellow", lambda s: s[0].color == "yellow"),
        ("Make the blue sphere metal.", lambda s: s[1].material == "metal"),
        ("turn the red cube into a sphere", lambda s: s[0].shape == "sphere"),
        ("make the small blue cylinder larger than the blue sphere", None),
        ("make the red cube bigger than the green cube", lambda s: s[0].size == "large"),
        ("move the blue sphere to the left", lambda s: s[1].x < 0.4),
        ("Hi, This is a photo of toys. Can you remove the green cube and output the image?", lambda s: len(s) == 3),
        ("add a large yellow rubber cylinder", lambda s: len(s) == 5 and s[4].color == "yellow"),
        ("add two more red cubes", lambda s: len(s) == 6 and [o.color for o in s].count("red") == 3),
        ("remove all the cubes", lambda s: [o.shape for o in s] == ["sphere", "cylinder"]),
        ("make all the blue objects red", lambda s: [o.color for o in s] == ["red", "red", "red", "green"]),
        ("make only the sphere purple", lambda s: s[1].color == "purple"),
    ],
)
def test_editor_grammar(instruction: str, check) -> None:
    image = _source(4, CAPTION)
    before = shapes.scene_of(image)
    out, boxes = _edit(instruction, image)
    if check is None:
        assert isinstance(out, GenerationFailed) and out.kind == "unsupported_instruction"
        return
    assert not isinstance(out, GenerationFailed), out
    after = shapes.scene_of(out)
    assert check(after)
    diff = _diff_box(image, out)
    assert diff is not None and boxes
    covered = np.zeros((SIDE, SIDE), bool)
    for x0, y0, x1, y1 in boxes:
        covered[y0:y1, x0:x1] = True
    changed = np.abs(np.asarray(image, np.int16) - np.asarray(out, np.int16)).max(axis=2) > 0
    assert not (changed & ~covered).any()  # every changed pixel lies in a reported box
    assert len(boxes) == len([o for o in before if o not in after]) + len(
        [o for o in after if o not in before and (o.x, o.y) not in {(b.x, b.y) for b in before}]
    )


@pytest.mark.parametrize(
    ("instruction", "kind"),
    [
        ("make the sky blue", "unsupported_instruction"),
        ("make the man ride a motorcycle", "unsupported_instruction"),
        ("remove the purple sphere", "no_such_object"),
        ("change the color of the small cube to red", "ambiguous_object"),
        ("make the red cube red", "no_change"),
        ("add three more red cubes", "no_room"),
    ],
)
def test_editor_refusals(instruction: str, kind: str) -> None:
    out, boxes = _edit(instruction, _source(4, CAPTION))
    assert isinstance(out, GenerationFailed) and out.kind == kind and boxes == []


def test_editor_needs_a_shapes_image() -> None:
    out, _ = _edit("remove the red cube", Image.new("RGB", (SIDE, SIDE)))
    assert isinstance(out, GenerationFailed) and out.kind == "not_a_shapes_image"


def test_build_checks_its_section() -> None:
    with pytest.raises(ValueError, match="image_size"):
        shapes.build({"image_size": 5}, "pairs")
    with pytest.raises(ValueError, match="role"):
        shapes.build({}, "paint")
