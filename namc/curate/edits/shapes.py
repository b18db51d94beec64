"""Shapes-world stand-ins for the image models of the edit-pair engines: the difference they make is known exactly.

The procedural shapes world (:mod:`namc.data.synthetic`) renders a scene from its objects, so it can play the three
roles of :mod:`namc.curate.edits.base` with a ground truth that a diffusion model cannot give:

- :class:`ShapesPairGenerator` renders a *shapes caption* (``"a small red metal cube, a large blue rubber sphere
  and a small green rubber cylinder"``: full object names, in slot order) and its one-object replacement as two
  images identical except for the replaced object;
- :class:`ShapesInpainter` removes the objects that the mask covers (the scene re-rendered without them);
- :class:`ShapesEditor` applies one instruction of a small grammar (:data:`INSTRUCTION_FORMS`) covering MED's
  categories that the shapes world can express, and fails with ``unsupported_instruction`` otherwise.

A caption parses back into a scene deterministically: object ``k`` of the caption sits at slot ``k`` of a layout
drawn from the item's seed (:func:`layout`), so replacing one name moves nothing else. Every image a stand-in makes
carries its scene in ``image.info["namc_shapes"]`` (JSON), which :func:`save_png` writes as a PNG text chunk and
PIL reads back, so the inpainter and the editor can work on images made earlier. After each batch,
``last_boxes[i]`` lists one exact box ``(x0, y0, x1, y1)`` (pixels, ends exclusive) per place where item ``i``'s
output differs from its input (the footprint of the object before and after the change): the ground truth that
``namc curate regions`` is measured against.
"""

from __future__ import annotations

import functools
import json
import math
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, PngImagePlugin

from namc.curate.edits.base import GenerationFailed, Result, Throughput
from namc.data.synthetic.render import render_scene
from namc.data.synthetic.scene import COLORS, MATERIALS, RADIUS, SHAPES, SIZES, ShapeObject
from namc.jsonl import loads

__all__ = [
    "INSTRUCTION_FORMS",
    "SCENE_KEY",
    "Box",
    "MAX_SLOTS",
    "ShapesEditor",
    "ShapesInpainter",
    "ShapesPairGenerator",
    "Unsupported",
    "apply_instruction",
    "build",
    "caption_of",
    "crop_scene_share",
    "layout",
    "object_box",
    "parse_caption",
    "random_caption",
    "replace_object",
    "save_png",
    "scene_of",
]

#: the key of the scene (JSON list of objects) in ``image.info`` and in the PNG text chunk
SCENE_KEY = "namc_shapes"
MAX_SLOTS = 6  # the cells of layout(): as many as namc.data.synthetic.scene.MAX_OBJECTS

Box = tuple[int, int, int, int]

_NAME = re.compile(
    rf"\b({'|'.join(SIZES)})\s+({'|'.join(COLORS)})\s+({'|'.join(MATERIALS)})\s+({'|'.join(SHAPES)})s?\b"
)
_X_RANGE, _Y_RANGE = (0.1, 0.9), (0.3, 0.86)  # the floor area of namc.data.synthetic.scene

# ---------------------------------------------------------------------------------------------------------------
# Captions <-> scenes
# ---------------------------------------------------------------------------------------------------------------


def _fits(x: float, y: float, r: float, placed: Sequence[tuple[float, float, float]]) -> bool:
    return all(math.hypot(x - px, y - py) >= 1.15 * (r + pr) for px, py, pr in placed)  # scene._fits' margin


@functools.lru_cache(maxsize=1024)
def layout(seed: int) -> tuple[tuple[float, float], ...]:
    """:data:`MAX_SLOTS` object centres drawn from ``seed`` (fractions of the image side): a 3 x 2 grid, shuffled
    and jittered, whose cells hold a large object each, so any object can take any slot without overlap."""
    rng = random.Random(f"{seed}-shapes-layout")
    cells = [(x, y) for y in (0.38, 0.76) for x in (0.2, 0.5, 0.8)]
    rng.shuffle(cells)
    return tuple((round(x + rng.uniform(-0.03, 0.03), 4), round(y + rng.uniform(-0.05, 0.05), 4)) for x, y in cells)


def caption_of(objects: Sequence[ShapeObject]) -> str:
    """The shapes caption of a scene: ``"a small red metal cube, a large blue rubber sphere and a ..."``."""
    names = [f"a {o.name}" for o in objects]
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def parse_caption(caption: str, seed: int) -> list[ShapeObject] | None:
    """The scene of a shapes caption (object ``k`` at slot ``k`` of ``layout(seed)``), or None when the caption names
    no object or more than :data:`MAX_SLOTS` (full names only: size, colour, material, shape)."""
    names = _NAME.findall(caption.lower())
    if not names or len(names) > MAX_SLOTS:
        return None
    slots = layout(seed)
    return [
        ShapeObject(shape, color, size, material, *slots[k]) for k, (size, color, material, shape) in enumerate(names)
    ]


def random_caption(rng: random.Random, min_objects: int = 2, max_objects: int = 5) -> str:
    """A caption of ``min_objects..max_objects`` distinct random objects (a source caption for ``replace``)."""
    keys: list[tuple[str, str, str, str]] = []
    while len(keys) < rng.randint(min_objects, max_objects) or not keys:
        key = (rng.choice(SIZES), rng.choice(list(COLORS)), rng.choice(MATERIALS), rng.choice(SHAPES))
        if key not in keys:
            keys.append(key)
    return caption_of([ShapeObject(shape, color, size, material, 0.0, 0.0) for size, color, material, shape in keys])


def replace_object(caption: str, rng: random.Random) -> tuple[str, str, str] | None:
    """What an obliging LLM does with a shapes caption: one object name swapped for another that is not in it.

    Returns:
        ``(target caption, old name, new name)``, or None when the caption names no object.
    """
    matches = list(_NAME.finditer(caption.lower()))
    if not matches:
        return None
    m = rng.choice(matches)
    taken = {x.group(0) for x in matches}
    while True:
        new = f"{rng.choice(SIZES)} {rng.choice(list(COLORS))} {rng.choice(MATERIALS)} {rng.choice(SHAPES)}"
        if new not in taken:
            break
    return caption[: m.start()] + new + caption[m.end() :], m.group(0), new


# ---------------------------------------------------------------------------------------------------------------
# Images carry their scene
# ---------------------------------------------------------------------------------------------------------------


def _render(objects: Sequence[ShapeObject], image_size: int) -> Image.Image:
    image = render_scene(objects, image_size)
    image.info[SCENE_KEY] = json.dumps([asdict(o) for o in objects])
    return image


def scene_of(image: Image.Image) -> list[ShapeObject] | None:
    """The scene an image was rendered from (``image.info[SCENE_KEY]``), or None for any other image."""
    text = image.info.get(SCENE_KEY)
    if not isinstance(text, str):
        return None
    try:
        return [ShapeObject(**o) for o in loads(text)]
    except (ValueError, TypeError):
        return None


def save_png(image: Image.Image, path: str | Path) -> None:
    """Writes ``image`` as PNG, keeping its scene (if any) as a text chunk that ``Image.open`` reads back."""
    info = None
    if isinstance(image.info.get(SCENE_KEY), str):
        info = PngImagePlugin.PngInfo()
        info.add_text(SCENE_KEY, image.info[SCENE_KEY])
    image.save(path, format="PNG", pnginfo=info)


@functools.lru_cache(maxsize=4096)
def _footprint(obj: ShapeObject, image_size: int) -> np.ndarray:
    """(H, W) bool: the pixels an object (with its shadow) changes on the empty floor."""
    floor = np.asarray(render_scene([], image_size), dtype=np.int16)
    alone = np.asarray(render_scene([obj], image_size), dtype=np.int16)
    return np.abs(alone - floor).max(axis=2) > 0  # (H, W)


def object_box(obj: ShapeObject, image_size: int) -> Box:
    """The exact box ``(x0, y0, x1, y1)`` (ends exclusive) of the pixels the object changes on an empty floor."""
    ys, xs = np.nonzero(_footprint(obj, image_size))
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def crop_scene_share(image: Image.Image, text: str) -> float:
    """For a crop of a shapes image (:func:`namc.curate.edits.tools.crop`): the largest share of the footprint of
    an object named by ``text`` (every attribute word of the text is one of the object's) that lies in the crop;
    0 for an image without a scene, or a text naming no attribute."""
    scene = scene_of(image)
    where = image.info.get("namc_crop")
    if scene is None:
        return 0.0
    x0, y0, x1, y1, w, h = (int(v) for v in where.split(",")) if isinstance(where, str) else (0, 0, *image.size) * 2
    words = {w.strip(".,").removesuffix("s") for w in text.lower().split()} | set(text.lower().split())
    wanted = {word for word in words if word in _ATTRIBUTE}
    if not wanted or w != h:
        return 0.0
    best = 0.0
    for o in scene:
        if not wanted <= {o.size, o.color, o.material, o.shape}:
            continue
        foot = _footprint(o, w)
        best = max(best, float(foot[y0:y1, x0:x1].sum()) / max(1, int(foot.sum())))
    return best


def _union(a: Box, b: Box) -> Box:
    return min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])


def _changed_boxes(before: Sequence[ShapeObject], after: Sequence[ShapeObject], image_size: int) -> list[Box]:
    """One box per place that differs: an object changed in place (its before/after union), gone, or new."""
    gone = [o for o in before if o not in after]
    new = [o for o in after if o not in before]
    boxes: list[Box] = []
    for o in gone:
        twin = next((n for n in new if (n.x, n.y) == (o.x, o.y)), None)
        box = object_box(o, image_size)
        if twin is not None:
            new.remove(twin)
            box = _union(box, object_box(twin, image_size))
        boxes.append(box)
    boxes.extend(object_box(n, image_size) for n in new)
    return boxes


def _side(section: Mapping[str, Any]) -> int:
    size = section.get("image_size", 64)
    if not isinstance(size, int) or isinstance(size, bool) or not 16 <= size <= 1024:
        raise ValueError(f"shapes backend: image_size must be an integer in [16, 1024], got {size!r}")
    return size


# ---------------------------------------------------------------------------------------------------------------
# The three stand-ins
# ---------------------------------------------------------------------------------------------------------------


class ShapesPairGenerator:
    """:class:`~namc.curate.edits.base.PairGenerator` of shapes captions: both captions laid out from the item's
    seed, so the two images differ exactly where the object names differ."""

    def __init__(self, image_size: int = 64) -> None:
        self.image_size = image_size
        self.throughput = Throughput()
        self.last_boxes: list[list[Box]] = []

    def generate_pairs(
        self, prompts: Sequence[tuple[str, str]], seeds: Sequence[int]
    ) -> list[tuple[Image.Image, Image.Image] | GenerationFailed]:
        started = time.perf_counter()
        out: list[tuple[Image.Image, Image.Image] | GenerationFailed] = []
        self.last_boxes = []
        for (source, target), seed in zip(prompts, seeds, strict=True):
            a, b = parse_caption(source, seed), parse_caption(target, seed)
            if a is None or b is None:
                out.append(GenerationFailed("unparsable_prompt", f"a shapes caption names 1-{MAX_SLOTS} full objects"))
                self.last_boxes.append([])
                continue
            out.append((_render(a, self.image_size), _render(b, self.image_size)))
            self.last_boxes.append(_changed_boxes(a, b, self.image_size))
        # Throughput's convention for pairs (options.pair_images): two images per pair, a failed pair twice
        self.throughput.record([x for r in out for x in ((r, r) if isinstance(r, GenerationFailed) else r)], started)
        return out


class ShapesInpainter:
    """:class:`~namc.curate.edits.base.Inpainter` that removes every object of which the mask covers at least
    ``min_cover`` of the footprint; an image without a scene gets the masked area repainted with the empty floor."""

    def __init__(self, image_size: int = 64, min_cover: float = 0.5) -> None:
        self.image_size = image_size
        self.min_cover = min_cover
        self.throughput = Throughput()
        self.last_boxes: list[list[Box]] = []

    def inpaint(
        self, images: Sequence[Image.Image], masks: Sequence[Image.Image], prompts: Sequence[str], seeds: Sequence[int]
    ) -> list[Result]:
        started = time.perf_counter()
        out: list[Result] = []
        self.last_boxes = []
        for image, mask in zip(images, masks, strict=True):
            result, boxes = self._one(image, mask)
            out.append(result)
            self.last_boxes.append(boxes)
        self.throughput.record(out, started)
        return out

    def _one(self, image: Image.Image, mask: Image.Image) -> tuple[Result, list[Box]]:
        if mask.size != image.size:
            return GenerationFailed("bad_mask", f"mask {mask.size} is not the image's size {image.size}"), []
        white = np.asarray(mask.convert("L")) >= 128  # (H, W)
        side = image.size[0]
        scene = scene_of(image)
        if scene is None or image.size[0] != image.size[1]:
            floor = render_scene([], max(image.size)).crop((0, 0, *image.size))
            painted = Image.composite(floor, image.convert("RGB"), Image.fromarray(white.astype(np.uint8) * 255))
            ys, xs = np.nonzero(white)
            return painted, ([(int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)] if xs.size else [])
        kept = [o for o in scene if (white & _footprint(o, side)).sum() < self.min_cover * _footprint(o, side).sum()]
        return _render(kept, side), _changed_boxes(scene, kept, side)


# ---------------------------------------------------------------------------------------------------------------
# The editor's grammar
# ---------------------------------------------------------------------------------------------------------------

#: the instruction forms :class:`ShapesEditor` understands, with the MED category (``004``, Figure 8) each serves;
#: ``<ref>`` is any words naming one object (``"red cube"``), ``<value>`` an attribute value
INSTRUCTION_FORMS: dict[str, str] = {
    "change the (color|material|size|shape) of the <ref> to <value>": "Attribute",
    "make the <ref> <value>": "Attribute",
    "make the <ref> (larger|bigger|smaller) than the <ref>": "Comparison",
    "turn the <ref> into a <value>": "Attribute",
    "move the <ref> to the (left|right|front|back)": "Spatial Relation",
    "add a <ref>": "Object",
    "remove the <ref>": "Object / Negation",
    "add (one|two|three|N) more <ref>s": "Counting",
    "remove all the <ref>s": "Negation / Universality",
    "make all the <ref>s <value>": "Universality",
    "make only the <ref> <value>": "Differentiation",
}
_ATTRIBUTE = {**{c: "color" for c in COLORS}, **{m: "material" for m in MATERIALS}, **{s: "size" for s in SIZES}}
_ATTRIBUTE.update({s: "shape" for s in SHAPES})
_NUMBERS = {"one": 1, "two": 2, "three": 3, "a": 1, "an": 1}
_WRAPPER = re.compile(r"can you (.+?) and output the image", re.S)  # MED's "Hi, This is a photo of ... Can you X ..."
_NOISE = ("object", "objects", "thing", "one", "shape", "item")


class Unsupported(ValueError):
    """An instruction outside :data:`INSTRUCTION_FORMS`, or one that names no object of the scene."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _ref(words: str) -> dict[str, str]:
    """``"small red cube"`` -> ``{"size": "small", "color": "red", "shape": "cube"}``."""
    attrs: dict[str, str] = {}
    for word in words.split():
        word = word.strip(",.")
        if word in ("a", "an", "the") or word in _NOISE:
            continue
        if word not in _ATTRIBUTE and word.endswith("s") and word[:-1] in _ATTRIBUTE:
            word = word[:-1]
        if word not in _ATTRIBUTE or _ATTRIBUTE[word] in attrs:
            raise Unsupported("unsupported_instruction", f"{words!r} is not an object description")
        attrs[_ATTRIBUTE[word]] = word
    if not attrs:
        raise Unsupported("unsupported_instruction", f"{words!r} names no attribute")
    return attrs


def _matching(scene: Sequence[ShapeObject], attrs: Mapping[str, str]) -> list[ShapeObject]:
    return [o for o in scene if all(getattr(o, k) == v for k, v in attrs.items())]


def _one(scene: Sequence[ShapeObject], words: str) -> ShapeObject:
    found = _matching(scene, _ref(words))
    if not found:
        raise Unsupported("no_such_object", f"no {words} in the image")
    if len(found) > 1:
        raise Unsupported("ambiguous_object", f"{len(found)} objects match {words!r}")
    return found[0]


def _value(word: str, attribute: str | None = None) -> tuple[str, str]:
    word = word.strip(".,")
    if word in ("larger", "bigger"):
        word = "large"
    elif word == "smaller":
        word = "small"
    kind = _ATTRIBUTE.get(word)
    if kind is None or (attribute is not None and kind != attribute):
        raise Unsupported("unsupported_instruction", f"{word!r} is not a {attribute or 'attribute'} value")
    return kind, word


def _free_position(
    rng: random.Random,
    obj: ShapeObject,
    others: Sequence[ShapeObject],
    x_range: tuple[float, float] = _X_RANGE,
    y_range: tuple[float, float] = _Y_RANGE,
) -> tuple[float, float]:
    r = RADIUS[obj.size]
    placed = [(o.x, o.y, RADIUS[o.size]) for o in others]
    for _ in range(400):
        x = rng.uniform(max(x_range[0], _X_RANGE[0] + r * 0.5), min(x_range[1], _X_RANGE[1] - r * 0.5))
        y = rng.uniform(*y_range)
        if _fits(x, y, r, placed):
            return round(x, 4), round(y, 4)
    raise Unsupported("no_room", f"no free place for a {obj.name}")


_DIRECTIONS = {"left": ((0.1, 0.4), _Y_RANGE), "right": ((0.6, 0.9), _Y_RANGE)}
_DIRECTIONS.update({"back": (_X_RANGE, (0.3, 0.5)), "front": (_X_RANGE, (0.66, 0.86))})


def _restyle(scene: list[ShapeObject], targets: Sequence[ShapeObject], kind: str, value: str) -> list[ShapeObject]:
    if all(getattr(t, kind) == value for t in targets):
        raise Unsupported("no_change", f"the object is already {value}")
    return [replace(o, **{kind: value}) if o in targets else o for o in scene]


def apply_instruction(scene: list[ShapeObject], instruction: str, rng: random.Random) -> list[ShapeObject]:
    """The scene after one instruction of :data:`INSTRUCTION_FORMS`; raises :class:`Unsupported` otherwise."""
    text = instruction.strip().lower()
    wrapped = _WRAPPER.search(text)
    if wrapped:
        text = wrapped.group(1)
    text = re.sub(r"\s+", " ", text).strip(" .!?")
    text = re.sub(r"^(please|only) ", "", text) if not text.startswith("only the") else text
    out = _attribute_edit(scene, text)
    return out if out is not None else _layout_edit(scene, text, rng)


def _attribute_edit(scene: list[ShapeObject], text: str) -> list[ShapeObject] | None:
    """The forms that restyle objects in place; None for any other text."""
    if m := re.fullmatch(r"change the (color|colour|material|size|shape) of the (.+?) to (?:an? )?(\w+)", text):
        kind, value = _value(m.group(3), "color" if m.group(1) == "colour" else m.group(1))
        return _restyle(scene, [_one(scene, m.group(2))], kind, value)
    if m := re.fullmatch(r"make the (.+?) (larger|bigger|smaller) than the (.+)", text):
        target, other = _one(scene, m.group(1)), _one(scene, m.group(3))
        want_large = m.group(2) != "smaller"
        if other.size == ("large" if want_large else "small"):
            raise Unsupported("unsupported_instruction", "the shapes world has two sizes only")
        return _restyle(scene, [target], "size", "large" if want_large else "small")
    if m := re.fullmatch(r"make all (?:of )?(?:the )?(.+?) (\w+)", text):
        targets = _matching(scene, _ref(m.group(1)))
        if len(targets) < 2:
            raise Unsupported("no_such_object", f"fewer than two {m.group(1)}")
        kind, value = _value(m.group(2))
        return _restyle(scene, targets, kind, value)
    if m := re.fullmatch(r"make (?:only )?the (.+?) (\w+)", text):
        kind, value = _value(m.group(2))
        return _restyle(scene, [_one(scene, m.group(1))], kind, value)
    if m := re.fullmatch(r"turn the (.+?) into (?:an? )?(\w+)", text):
        kind, value = _value(m.group(2))
        return _restyle(scene, [_one(scene, m.group(1))], kind, value)
    return None


def _layout_edit(scene: list[ShapeObject], text: str, rng: random.Random) -> list[ShapeObject]:
    """The forms that move, add or remove objects; raises :class:`Unsupported` for any other text."""
    if m := re.fullmatch(r"move the (.+?) to the (left|right|front|back)(?: side)?", text):
        obj = _one(scene, m.group(1))
        others = [o for o in scene if o is not obj]
        x, y = _free_position(rng, obj, others, *_DIRECTIONS[m.group(2)])
        return [replace(o, x=x, y=y) if o is obj else o for o in scene]
    if m := re.fullmatch(r"remove all (?:of )?(?:the )?(.+)", text):
        gone = _matching(scene, _ref(m.group(1)))
        if not gone:
            raise Unsupported("no_such_object", f"no {m.group(1)} in the image")
        return [o for o in scene if o not in gone]
    if m := re.fullmatch(r"(?:remove|delete|erase) the (.+)", text):
        obj = _one(scene, m.group(1))
        return [o for o in scene if o is not obj]
    if m := re.fullmatch(r"add (one|two|three|\d) more (.+)", text):
        model = _one(scene, m.group(2)) if len(_matching(scene, _ref(m.group(2)))) == 1 else None
        if model is None:
            raise Unsupported("no_such_object", f"no single {m.group(2)} to copy")
        return _add(scene, [model] * int(_NUMBERS.get(m.group(1), m.group(1))), rng)
    if m := re.fullmatch(r"add (?:an? |another )(.+)", text):
        attrs = _ref(m.group(1))
        size, color = attrs.get("size") or rng.choice(SIZES), attrs.get("color") or rng.choice(list(COLORS))
        material, shape = attrs.get("material") or rng.choice(MATERIALS), attrs.get("shape") or rng.choice(SHAPES)
        return _add(scene, [ShapeObject(shape, color, size, material, 0.0, 0.0)], rng)
    raise Unsupported("unsupported_instruction", f"not in the shapes grammar: {text[:80]!r}")


def _add(scene: list[ShapeObject], models: Sequence[ShapeObject], rng: random.Random) -> list[ShapeObject]:
    if len(scene) + len(models) > MAX_SLOTS:
        raise Unsupported("no_room", f"a shapes scene holds at most {MAX_SLOTS} objects")
    out = list(scene)
    for model in models:
        out.append(replace(model, **dict(zip(("x", "y"), _free_position(rng, model, out), strict=True))))
    return out


class ShapesEditor:
    """:class:`~namc.curate.edits.base.Editor` of shapes images (those that carry their scene): one instruction of
    :data:`INSTRUCTION_FORMS` (bare or in MED's ``"... Can you <instruction> and output the image?"``) re-rendered;
    anything else is a :class:`~namc.curate.edits.base.GenerationFailed` (``unsupported_instruction``,
    ``no_such_object``, ``ambiguous_object``, ``no_change``, ``no_room``, ``not_a_shapes_image``)."""

    def __init__(self) -> None:
        self.throughput = Throughput()
        self.last_boxes: list[list[Box]] = []

    def edit(self, images: Sequence[Image.Image], instructions: Sequence[str], seeds: Sequence[int]) -> list[Result]:
        started = time.perf_counter()
        out: list[Result] = []
        self.last_boxes = []
        for image, instruction, seed in zip(images, instructions, seeds, strict=True):
            scene = scene_of(image)
            if scene is None or image.size[0] != image.size[1]:
                out.append(GenerationFailed("not_a_shapes_image", "the image carries no shapes scene"))
                self.last_boxes.append([])
                continue
            try:
                after = apply_instruction(scene, instruction, random.Random(f"{seed}-shapes-edit"))
            except Unsupported as err:
                out.append(GenerationFailed(err.kind, str(err)))
                self.last_boxes.append([])
                continue
            out.append(_render(after, image.size[0]))
            self.last_boxes.append(_changed_boxes(scene, after, image.size[0]))
        self.throughput.record(out, started)
        return out


def build(section: Mapping[str, Any], role: str) -> ShapesPairGenerator | ShapesInpainter | ShapesEditor:
    """The stand-in for ``role`` (``pairs`` | ``inpaint`` | ``edit``) from a YAML section (``image_size``, default
    64; ``min_cover`` for ``inpaint``, default 0.5)."""
    if role == "pairs":
        return ShapesPairGenerator(_side(section))
    if role == "inpaint":
        cover = section.get("min_cover", 0.5)
        if not isinstance(cover, int | float) or not 0 < cover <= 1:
            raise ValueError(f"shapes backend: min_cover must be in (0, 1], got {cover!r}")
        return ShapesInpainter(_side(section), float(cover))
    if role == "edit":
        return ShapesEditor()
    raise ValueError(f"shapes backend: role must be pairs, inpaint or edit, got {role!r}")
