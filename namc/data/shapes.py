"""Shapes world: a fast, seeded, procedural CLEVR-like generator of image pairs (PIL + numpy, no renderer).

Scenes hold 2-6 objects with CLEVR's attributes: shape {cube, sphere, cylinder} (drawn as a square with a top face,
a disc, and an upright can with elliptical caps), the 8 CLEVR colours (RGB values of CLEVR's ``properties.json``),
size {small, large} and material {rubber: flat, metal: radial shading with a specular highlight}. Every object of
a scene has a distinct (size, colour, material, shape), so each one has an unambiguous name. Sizes are 0.08 and
0.12 of the image side (radius), so a small object is still about 10 px wide at 64 px and the four attributes stay
readable.

A pair is a *before* scene and one change {color, material, add, drop, move} (change type ``index % 5``, so the
types are balanced), plus a *distractor*: the same scene under a small global shift/scale and brightness change
(captioned as no change). As in CLEVR-Change, the changed image also gets such a viewpoint/lighting jitter.

Two writers:

- :func:`generate_benchmark` writes the CLEVR-Change layout read by :class:`namc.data.benchmarks.ClevrChange`::

      images/CLEVR_default_%06d.png  sc_images/CLEVR_semantic_%06d.png  nsc_images/CLEVR_nonsemantic_%06d.png
      splits.json  change_captions.json  no_change_captions.json  type_mapping.json
      scenes.json   (ours: the objects of each scene, for inspection and tests)

  with several CLEVR-Change-style paraphrases per pair (``"the small red metal cube changed to blue"``, ``"the
  large cyan rubber sphere has been newly placed"``, ``"no change was made"``, ...).
- :func:`generate_corpus` writes a pre-training corpus (``manifest.jsonl``, ``images/%07d_1.png``,
  ``images/%07d_2.png``, ``meta.json``) of implicit-change descriptions in the paper's template (section 3.1.2),
  one per pair, naming the changed object and its context, e.g. ``"The difference between the two images is that
  the first image shows a small red metal cube left of a large gray rubber sphere, while the second image shows a
  small blue metal cube left of a large gray rubber sphere."`` A controlled fraction ``noise_rate`` of the phrases
  are injected noise, placed before a real phrase (an object in a colour absent from the image: ``"near a yellow
  cylinder"``; scenery: ``"on a wooden table"``; or a false attribute word inside a name: ``"a small striped red
  metal cube"``), and word-level labels
  ``noise1``/``noise2`` (aligned to ``desc.split()``) mark exactly the injected words.

Everything derives from ``(seed, stream, index)`` through its own ``random.Random``, so a pair's bytes do not
depend on the number of worker processes.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from namc.text.template import rebuild

__all__ = [
    "CHANGE_TYPES",
    "COLORS",
    "MATERIALS",
    "NO_CHANGE",
    "SHAPES",
    "SIZES",
    "ShapeObject",
    "ShapesPair",
    "View",
    "generate_benchmark",
    "generate_corpus",
    "make_pair",
    "render_scene",
]

logger = logging.getLogger(__name__)

#: CLEVR's colours (``properties.json`` of facebookresearch/clevr-dataset-gen).
COLORS: dict[str, tuple[int, int, int]] = {
    "gray": (87, 87, 87),
    "red": (173, 35, 35),
    "blue": (42, 75, 215),
    "green": (29, 105, 20),
    "brown": (129, 74, 25),
    "purple": (129, 38, 192),
    "cyan": (41, 208, 208),
    "yellow": (255, 238, 51),
}
SHAPES = ("cube", "sphere", "cylinder")
SIZES = ("small", "large")
MATERIALS = ("rubber", "metal")
CHANGE_TYPES = ("color", "material", "add", "drop", "move")
NO_CHANGE = "no_change"

_RADIUS = {"small": 0.08, "large": 0.12}  # fraction of the image side
_X_RANGE = (0.1, 0.9)
_Y_RANGE = (0.3, 0.86)
_MIN_OBJECTS, _MAX_OBJECTS = 2, 6

_CAPTIONS = {
    "color": [
        "the {obj} changed to {new}",
        "the {obj} became {new}",
        "the {obj} turned {new}",
        "the {obj} was painted {new}",
        "someone changed the color of the {obj} to {new}",
    ],
    "material": [
        "the {obj} changed to {new}",
        "the {obj} became {new}",
        "the {obj} is now {new}",
        "the material of the {obj} changed to {new}",
        "someone changed the {obj} to {new}",
    ],
    "add": [
        "the {obj} has been newly placed",
        "someone added a {obj}",
        "a {obj} has been added",
        "there is a new {obj}",
        "a {obj} appeared",
    ],
    "drop": [
        "the {obj} is missing",
        "the {obj} has disappeared",
        "someone removed the {obj}",
        "the {obj} is no longer there",
        "the {obj} was removed",
    ],
    "move": [
        "the {obj} moved",
        "the {obj} changed its location",
        "someone moved the {obj}",
        "the {obj} is in a different location",
        "the {obj} has been moved",
    ],
    NO_CHANGE: [
        "no change was made",
        "the scene remains the same",
        "nothing has changed",
        "the two scenes seem identical",
        "there is no difference",
        "the scene is the same as before",
    ],
}
# verbs for the shapes-world descriptions: a subset of appendix D.2's list
_VERBS = (
    "shows",
    "depicts",
    "displays",
    "features",
    "contains",
    "presents",
    "has",
    "exhibits",
    "showcases",
    "captures",
    "reveals",
    "illustrates",
)  # a subset of appendix D.2's list
_SCENERY = (
    "on a wooden table",
    "under a blue sky",
    "in a grassy field",
    "beside a brick wall",
    "on a sandy beach",
    "in a dark room",
    "near a window",
    "on a marble floor",
    "in front of a mountain",
    "next to a tree",
)
_NEAR = ("near", "beside", "with", "and")
_FALSE_ATTRIBUTES = ("striped", "glowing", "transparent", "wooden", "furry", "dotted", "cracked", "glass")


@dataclass(frozen=True)
class ShapeObject:
    """One object; ``x``, ``y`` are its centre in fractions of the image (y grows towards the viewer)."""

    shape: str
    color: str
    size: str
    material: str
    x: float
    y: float

    @property
    def name(self) -> str:
        """``"small red metal cube"``."""
        return f"{self.size} {self.color} {self.material} {self.shape}"

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.size, self.color, self.material, self.shape)


@dataclass(frozen=True)
class View:
    """Global viewpoint/lighting jitter: shift (fractions of the side), scale about the centre, brightness factor."""

    dx: float = 0.0
    dy: float = 0.0
    scale: float = 1.0
    brightness: float = 1.0


@dataclass
class ShapesPair:
    """A before scene, its changed scene and the distractor view, with what changed."""

    index: int
    change_type: str
    before: list[ShapeObject]
    after: list[ShapeObject]
    changed: ShapeObject | None  # the object as it is before the change (the added object for "add")
    changed_after: ShapeObject | None  # the object after the change (None for "drop")
    view_after: View
    view_distractor: View


# ---------------------------------------------------------------------------------------------------------------
# Scene sampling
# ---------------------------------------------------------------------------------------------------------------


def _fits(x: float, y: float, size: str, others: Sequence[ShapeObject], ignore: ShapeObject | None = None) -> bool:
    r = _RADIUS[size]
    for o in others:
        if o is ignore:
            continue
        if math.hypot(x - o.x, y - o.y) < 1.15 * (r + _RADIUS[o.size]):
            return False
    return True


def _random_position(
    rng: random.Random, size: str, others: Sequence[ShapeObject], ignore: ShapeObject | None = None
) -> tuple[float, float] | None:
    r = _RADIUS[size]
    for _ in range(200):
        x = rng.uniform(_X_RANGE[0] + r * 0.5, _X_RANGE[1] - r * 0.5)
        y = rng.uniform(_Y_RANGE[0], _Y_RANGE[1])
        if _fits(x, y, size, others, ignore):
            return x, y
    return None


def _random_attributes(rng: random.Random, taken: set[tuple[str, str, str, str]]) -> tuple[str, str, str, str]:
    while True:
        key = (rng.choice(SIZES), rng.choice(list(COLORS)), rng.choice(MATERIALS), rng.choice(SHAPES))
        if key not in taken:
            return key


def _random_scene(rng: random.Random, n: int) -> list[ShapeObject]:
    for _ in range(1000):
        objects: list[ShapeObject] = []
        taken: set[tuple[str, str, str, str]] = set()
        for _ in range(n):
            size, color, material, shape = _random_attributes(rng, taken)
            pos = _random_position(rng, size, objects)
            if pos is None:
                break
            objects.append(ShapeObject(shape, color, size, material, *pos))
            taken.add((size, color, material, shape))
        if len(objects) == n:
            return objects
    raise RuntimeError(f"could not place {n} non-overlapping objects")


def _random_view(rng: random.Random) -> View:
    while True:
        v = View(
            dx=rng.uniform(-0.04, 0.04),
            dy=rng.uniform(-0.03, 0.03),
            scale=rng.uniform(0.94, 1.06),
            brightness=rng.uniform(0.82, 1.18),
        )
        if abs(v.brightness - 1) > 0.05 or math.hypot(v.dx, v.dy) > 0.015:  # a visible distractor
            return v


def make_pair(
    seed: int,
    index: int,
    stream: str = "benchmark",
    change_type: str | None = None,
    min_objects: int = _MIN_OBJECTS,
    max_objects: int = _MAX_OBJECTS,
    jitter_changed: bool = True,
) -> ShapesPair:
    """Samples one pair deterministically from ``(seed, stream, index)``.

    Args:
        seed: global seed.
        index: pair index; the change type defaults to ``CHANGE_TYPES[index % 5]``.
        stream: name of the random stream (``"benchmark"`` and ``"corpus"`` give different scenes).
        change_type: force a change type.
        min_objects: fewest objects in any image of the pair (>= 1).
        max_objects: most objects in any image of the pair (<= 8).
        jitter_changed: give the changed image a random viewpoint/lighting jitter too (as CLEVR-Change does).
    """
    if not 1 <= min_objects < max_objects <= 8:
        raise ValueError("need 1 <= min_objects < max_objects <= 8 (more objects do not fit without overlap)")
    rng = random.Random(f"{seed}-{stream}-{index}")
    ctype = change_type or CHANGE_TYPES[index % len(CHANGE_TYPES)]
    if ctype not in CHANGE_TYPES:
        raise ValueError(f"unknown change type {ctype!r}")
    lo = min_objects + 1 if ctype == "drop" else min_objects
    hi = max_objects - 1 if ctype == "add" else max_objects
    while True:
        before = _random_scene(rng, rng.randint(lo, hi))
        taken = {o.key for o in before}
        target = rng.choice(before)
        changed: ShapeObject | None = target
        after = list(before)
        if ctype == "color":
            colors = [
                c for c in COLORS if c != target.color and (target.size, c, target.material, target.shape) not in taken
            ]
            changed_after: ShapeObject | None = replace(target, color=rng.choice(colors))
        elif ctype == "material":
            new = "metal" if target.material == "rubber" else "rubber"
            if (target.size, target.color, new, target.shape) in taken:
                continue
            changed_after = replace(target, material=new)
        elif ctype == "move":
            pos = None
            for _ in range(50):
                cand = _random_position(rng, target.size, before, ignore=target)
                if cand is not None and math.hypot(cand[0] - target.x, cand[1] - target.y) >= 0.25:
                    pos = cand
                    break
            if pos is None:
                continue
            changed_after = replace(target, x=pos[0], y=pos[1])
        elif ctype == "drop":
            changed_after = None
        else:  # add
            size, color, material, shape = _random_attributes(rng, taken)
            pos = _random_position(rng, size, before)
            if pos is None:
                continue
            changed = ShapeObject(shape, color, size, material, *pos)
            changed_after = changed
        if ctype == "add":
            after.append(changed_after)  # type: ignore[arg-type]
        elif ctype == "drop":
            after.remove(target)
        else:
            after[after.index(target)] = changed_after  # type: ignore[assignment]
        break
    view_after = _random_view(rng) if jitter_changed else View()
    return ShapesPair(index, ctype, before, after, changed, changed_after, view_after, _random_view(rng))


# ---------------------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------------------


def _supersample(image_size: int) -> int:
    return 4 if image_size <= 128 else 2 if image_size <= 384 else 1


@functools.lru_cache(maxsize=8)
def _background(side: int) -> Image.Image:
    """A vertical floor gradient (lighter far away), as in CLEVR's renders."""
    t = np.linspace(0.0, 1.0, side, dtype=np.float32)[:, None, None]  # (side, 1, 1)
    top, bottom = np.array([189, 189, 184], np.float32), np.array([148, 148, 145], np.float32)
    rows = top + (bottom - top) * t  # (side, 1, 3)
    return Image.fromarray(np.repeat(rows, side, axis=1).round().astype(np.uint8), mode="RGB")  # (side, side, 3)


def _scaled(rgb: tuple[int, int, int], factor: float) -> tuple[int, int, int]:
    return tuple(min(255, max(0, round(c * factor))) for c in rgb)  # type: ignore[return-value]


def _faces(
    shape: str, cx: float, cy: float, r: float
) -> list[tuple[str, list[float] | list[tuple[float, float]], float]]:
    """The faces of a shape as (kind, geometry, light factor), back to front; kind is "ellipse" or "polygon"."""
    if shape == "sphere":
        return [("ellipse", [cx - r, cy - r, cx + r, cy + r], 1.0)]
    if shape == "cube":  # front square, a lighter top face and a darker right face (a cabinet projection)
        a, t = 0.78 * r, 0.4 * r
        x, y = cx - 0.18 * r, cy + 0.18 * r
        front = [(x - a, y - a), (x + a, y - a), (x + a, y + a), (x - a, y + a)]
        top = [(x - a, y - a), (x + a, y - a), (x + a + t, y - a - t), (x - a + t, y - a - t)]
        side = [(x + a, y - a), (x + a + t, y - a - t), (x + a + t, y + a - t), (x + a, y + a)]
        return [("polygon", top, 1.3), ("polygon", side, 0.72), ("polygon", front, 1.0)]
    w, h = 0.72 * r, 0.8 * r  # cylinder: an upright can with elliptical caps
    e = 0.34 * w
    body = [(cx - w, cy - h), (cx + w, cy - h), (cx + w, cy + h), (cx - w, cy + h)]
    return [
        ("ellipse", [cx - w, cy + h - e, cx + w, cy + h + e], 1.0),
        ("polygon", body, 1.0),
        ("ellipse", [cx - w, cy - h - e, cx + w, cy - h + e], 1.3),
    ]


def _metal_layer(size: tuple[int, int], hx: float, hy: float, r: float, base: tuple[int, int, int]) -> Image.Image:
    """A radial gradient (dark rim to bright centre at (hx, hy)) with a white specular spot."""
    layer = Image.new("RGB", size, _scaled(base, 0.35))
    draw = ImageDraw.Draw(layer)
    steps = 7
    for k in range(steps):
        rad = 2.2 * r * (1 - k / steps)
        draw.ellipse([hx - rad, hy - rad, hx + rad, hy + rad], fill=_scaled(base, 0.35 + 0.9 * (k + 1) / steps))
    spot = 0.22 * r
    draw.ellipse([hx - spot, hy - spot, hx + spot, hy + spot], fill=(250, 250, 250))
    return layer


def _draw(canvas: Image.Image, draw: ImageDraw.ImageDraw, obj: ShapeObject, view: View, ss: int) -> None:
    side = canvas.size[0]
    cx = (0.5 + (obj.x - 0.5) * view.scale + view.dx) * side
    cy = (0.6 + (obj.y - 0.6) * view.scale + view.dy) * side
    r = _RADIUS[obj.size] * view.scale * side
    draw.ellipse([cx - 0.9 * r, cy + 0.55 * r, cx + 1.4 * r, cy + 1.15 * r], fill=(0, 0, 0, 60))  # contact shadow
    base = COLORS[obj.color]
    faces = _faces(obj.shape, cx, cy, r)
    outline_width = max(1, ss // 2)
    if obj.material == "rubber":
        for kind, geom, light in faces:
            fill, outline = _scaled(base, light), _scaled(base, 0.55 * light)
            getattr(draw, kind)(geom, fill=fill, outline=outline, width=outline_width)
        return
    x0, y0 = int(cx - 1.6 * r), int(cy - 1.6 * r)
    size = (int(3.2 * r) + 2, int(3.2 * r) + 2)
    layer = _metal_layer(size, cx - x0 - 0.3 * r, cy - y0 - 0.35 * r, r, base)
    mask = Image.new("L", size, 0)
    mdraw = ImageDraw.Draw(mask)
    for kind, geom, _ in faces:
        if kind == "ellipse":
            ex0, ey0, ex1, ey1 = geom  # type: ignore[misc]
            mdraw.ellipse([ex0 - x0, ey0 - y0, ex1 - x0, ey1 - y0], fill=255)
        else:
            mdraw.polygon([(gx - x0, gy - y0) for gx, gy in geom], fill=255)  # type: ignore[misc]
    canvas.paste(layer, (x0, y0), mask)
    for kind, geom, light in faces:  # outlines keep the faces (and the shape) readable
        getattr(draw, kind)(geom, outline=_scaled(base, 0.45 * light), width=outline_width)


def render_scene(objects: Sequence[ShapeObject], image_size: int, view: View = View()) -> Image.Image:
    """Renders objects (back to front) on a gradient floor, antialiased by supersampling.

    Args:
        objects: the scene.
        image_size: side of the square RGB output.
        view: global jitter (shift, scale, brightness).
    """
    ss = _supersample(image_size)
    canvas = _background(image_size * ss).copy()
    draw = ImageDraw.Draw(canvas, "RGBA")  # RGBA fills blend (shadows)
    for obj in sorted(objects, key=lambda o: o.y):
        _draw(canvas, draw, obj, view, ss)
    if view.brightness != 1.0:
        lut = np.clip(np.rint(np.arange(256) * view.brightness), 0, 255).astype(np.uint8).tolist()
        canvas = canvas.point(lut * 3)
    return canvas.reduce(ss) if ss > 1 else canvas


# ---------------------------------------------------------------------------------------------------------------
# Language
# ---------------------------------------------------------------------------------------------------------------


def change_captions(pair: ShapesPair, rng: random.Random, n: int) -> list[str]:
    """``n`` distinct CLEVR-Change-style captions of the pair's change."""
    t = pair.change_type
    assert pair.changed is not None
    if t == "color":
        new = pair.changed_after.color  # type: ignore[union-attr]
    elif t == "material":
        new = pair.changed_after.material  # type: ignore[union-attr]
    else:
        new = ""
    templates = rng.sample(_CAPTIONS[t], min(n, len(_CAPTIONS[t])))
    return [tpl.format(obj=pair.changed.name, new=new) for tpl in templates]


def no_change_captions(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct no-change captions."""
    return rng.sample(_CAPTIONS[NO_CHANGE], min(n, len(_CAPTIONS[NO_CHANGE])))


def _relation(a: ShapeObject, b: ShapeObject) -> str:
    """Where ``a`` is relative to ``b`` (CLEVR's four relations; smaller y is further back)."""
    dx, dy = a.x - b.x, a.y - b.y
    if abs(dx) >= abs(dy):
        return "left of" if dx < 0 else "right of"
    return "behind" if dy < 0 else "in front of"


def _region(a: ShapeObject) -> str:
    horizontal = "on the left" if a.x < 0.4 else "on the right" if a.x > 0.6 else "in the middle"
    depth = "at the back" if a.y < 0.5 else "in the front"
    return f"{horizontal} {depth}"


Phrase = tuple[str, bool]  # (text, is_noise)


def _object_phrases(obj: ShapeObject, ctx: ShapeObject | None, region: bool = False) -> list[list[str]]:
    """Real phrases of one half: the object, then its relation to the context object (or its region)."""
    phrases = [["a", *obj.name.split()]]
    if ctx is not None:
        phrases.append([*_relation(obj, ctx).split(), "a", *ctx.name.split()])
    elif region:
        phrases.append(_region(obj).split())
    return phrases


def _halves(pair: ShapesPair, rng: random.Random) -> tuple[list[list[str]], list[list[str]]]:
    t, obj = pair.change_type, pair.changed
    assert obj is not None
    others = [o for o in pair.before if o is not obj and o in pair.after]
    if t in ("color", "material"):
        ctx = rng.choice(others) if others else None
        return _object_phrases(obj, ctx), _object_phrases(pair.changed_after, ctx)  # type: ignore[arg-type]
    if t == "move":
        after = pair.changed_after
        assert after is not None
        moved = [o for o in others if _relation(obj, o) != _relation(after, o)]
        if moved:
            ctx = rng.choice(moved)
            return _object_phrases(obj, ctx), _object_phrases(after, ctx)
        return _object_phrases(obj, None, region=True), _object_phrases(after, None, region=True)
    ctx = rng.choice(others)
    with_obj = _object_phrases(obj, ctx)
    alone = [["a", *ctx.name.split()]]
    return (alone, with_obj) if t == "add" else (with_obj, alone)


def _noise_phrase(rng: random.Random, scene: Sequence[ShapeObject], attribute_ok: bool) -> tuple[str, list[str]]:
    kind = rng.choice(("object", "scenery", "attribute"))
    if kind == "attribute" and not attribute_ok:
        kind = "scenery"
    if kind == "object":  # a hallucinated object in a colour that nothing in this image has
        absent = [c for c in COLORS if c not in {o.color for o in scene}]  # never empty: 8 colours, <= 6 objects
        return kind, [rng.choice(_NEAR), "a", rng.choice(absent), rng.choice(SHAPES)]
    if kind == "scenery":
        return kind, rng.choice(_SCENERY).split()
    return kind, [rng.choice(_FALSE_ATTRIBUTES)]


def _inject(
    phrases: list[list[str]], scene: Sequence[ShapeObject], rng: random.Random, q: float, kinds: dict[str, int]
) -> tuple[list[str], list[int], int]:
    """Joins a half's phrases, adding to each real phrase a noise phrase with probability ``q``.

    A noise phrase goes before the real phrase (``"in a grassy field a small green metal sphere"``), a false
    attribute inside the object's name. Before, not after: NIM's text tower is causal, so a word's embedding carries
    the words before it, and a hallucination that follows a real phrase inherits that phrase's relevance (a
    randomly initialised NIM then rates the noise *more* relevant than the clean words, AUROC 0.40-0.47, against
    0.65 with the noise first, in 600-1200 steps of token-level alignment).
    """
    words: list[str] = []
    labels: list[int] = []
    n_noise = 0
    for phrase in phrases:
        phrase_labels = [0] * len(phrase)
        if rng.random() < q:
            article = phrase.index("a") if "a" in phrase else -1  # "a {size} {color} ..." inside the phrase
            kind, noise = _noise_phrase(rng, scene, attribute_ok=article >= 0)
            kinds[kind] = kinds.get(kind, 0) + 1
            n_noise += 1
            if kind == "attribute":  # a false adjective inside the object's name, before its colour word
                phrase = [*phrase[: article + 2], noise[0], *phrase[article + 2 :]]
                phrase_labels.insert(article + 2, 1)
            else:
                words.extend(noise)
                labels.extend([1] * len(noise))
        words.extend(phrase)
        labels.extend(phrase_labels)
    return words, labels, n_noise


def corpus_record(pair: ShapesPair, seed: int, noise_rate: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest fields of one corpus pair (without image paths) and its noise statistics."""
    rng = random.Random(f"{seed}-corpus-text-{pair.index}")
    q = noise_rate / (1 - noise_rate)  # E[noise] / (real + E[noise]) = q / (1 + q) = noise_rate
    half1, half2 = _halves(pair, rng)
    kinds: dict[str, int] = {}
    w1, l1, n1 = _inject(half1, pair.before, rng, q, kinds)
    w2, l2, n2 = _inject(half2, pair.after, rng, q, kinds)
    verb1, verb2 = rng.choice(_VERBS), rng.choice(_VERBS)
    desc1, desc2 = " ".join(w1), " ".join(w2)
    record = {
        "description": rebuild(verb1, desc1, verb2, desc2),
        "verb1": verb1,
        "desc1": desc1,
        "verb2": verb2,
        "desc2": desc2,
        "noise1": l1,
        "noise2": l2,
        "change_type": pair.change_type,
    }
    stats = {
        "phrases": len(half1) + len(half2) + n1 + n2,
        "noise_phrases": n1 + n2,
        "words": len(l1) + len(l2),
        "noise_words": sum(l1) + sum(l2),
        "kinds": kinds,
    }
    return record, stats


# ---------------------------------------------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------------------------------------------


def _benchmark_job(args: tuple[int, int, Path, int, int, int, tuple[int, int]]) -> list[dict[str, Any]]:
    seed, image_size, out, n_captions, min_objects, max_objects, (start, stop) = args
    results = []
    for i in range(start, stop):
        pair = make_pair(seed, i, "benchmark", min_objects=min_objects, max_objects=max_objects)
        _save(render_scene(pair.before, image_size), out / "images" / f"CLEVR_default_{i:06d}.png")
        _save(render_scene(pair.after, image_size, pair.view_after), out / "sc_images" / f"CLEVR_semantic_{i:06d}.png")
        _save(
            render_scene(pair.before, image_size, pair.view_distractor),
            out / "nsc_images" / f"CLEVR_nonsemantic_{i:06d}.png",
        )
        rng = random.Random(f"{seed}-captions-{i}")
        results.append(
            {
                "index": i,
                "type": pair.change_type,
                "change": change_captions(pair, rng, n_captions),
                "no_change": no_change_captions(rng, n_captions),
                "scene": {
                    "before": [asdict(o) for o in pair.before],
                    "after": [asdict(o) for o in pair.after],
                    "changed": asdict(pair.changed) if pair.changed else None,
                    "changed_after": asdict(pair.changed_after) if pair.changed_after else None,
                    "view_after": asdict(pair.view_after),
                    "view_distractor": asdict(pair.view_distractor),
                },
            }
        )
    return results


def _run_jobs(fn: Any, jobs: list[Any], workers: int) -> list[Any]:
    if workers <= 1 or len(jobs) <= 1:
        return [r for job in jobs for r in fn(job)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return [r for rs in pool.map(fn, jobs) for r in rs]


def _chunks(n: int, workers: int) -> list[tuple[int, int]]:
    size = max(1, math.ceil(n / max(1, workers * 4)))
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def generate_benchmark(
    out_dir: str | Path,
    n_pairs: int,
    image_size: int = 64,
    seed: int = 0,
    n_captions: int = 3,
    splits: Sequence[float] = (0.8, 0.1, 0.1),
    workers: int = 1,
    min_objects: int = _MIN_OBJECTS,
    max_objects: int = _MAX_OBJECTS,
) -> dict[str, Any]:
    """Writes a shapes-world benchmark in the CLEVR-Change layout (see the module docstring).

    Args:
        out_dir: output folder (created).
        n_pairs: number of before images; each gives one change pair and one distractor pair.
        image_size: side of the square PNGs.
        seed: global seed (same seed, same bytes).
        n_captions: paraphrases per change pair and per distractor pair.
        splits: train/val/test fractions of the pair ids (a seeded permutation; each list sorted).
        workers: processes (1: in this process; the output does not depend on it).
        min_objects: fewest objects in an image.
        max_objects: most objects in an image.

    Returns:
        A summary: ``{"root", "pairs", "splits": {name: count}, "types": {type: count}}``.
    """
    if len(splits) != 3 or abs(sum(splits) - 1) > 1e-6 or min(splits) < 0:
        raise ValueError("splits must be three non-negative fractions summing to 1")
    out = Path(out_dir)
    for sub in ("images", "sc_images", "nsc_images"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    jobs = [(seed, image_size, out, n_captions, min_objects, max_objects, c) for c in _chunks(n_pairs, workers)]
    results = sorted(_run_jobs(_benchmark_job, jobs, workers), key=lambda r: r["index"])

    order = list(range(n_pairs))
    random.Random(f"{seed}-splits").shuffle(order)
    n_train = round(splits[0] * n_pairs)
    n_val = round(splits[1] * n_pairs)
    split_ids = {
        "train": sorted(order[:n_train]),
        "val": sorted(order[n_train : n_train + n_val]),
        "test": sorted(order[n_train + n_val :]),
    }
    name = "CLEVR_default_{:06d}.png".format
    types: dict[str, list[str]] = {t: [] for t in CHANGE_TYPES}
    for r in results:
        types[r["type"]].append(f"{r['index']:06d}.png")
    _write_json(out / "splits.json", split_ids)
    _write_json(out / "change_captions.json", {name(r["index"]): r["change"] for r in results})
    _write_json(out / "no_change_captions.json", {name(r["index"]): r["no_change"] for r in results})
    _write_json(out / "type_mapping.json", types)
    _write_json(out / "scenes.json", {name(r["index"]): r["scene"] for r in results})
    summary = {
        "root": str(out),
        "pairs": n_pairs,
        "splits": {k: len(v) for k, v in split_ids.items()},
        "types": {k: len(v) for k, v in types.items()},
    }
    logger.info("shapes benchmark: %s", summary)
    return summary


def _corpus_job(args: tuple[int, int, Path, float, int, int, tuple[int, int]]) -> list[dict[str, Any]]:
    seed, image_size, out, noise_rate, min_objects, max_objects, (start, stop) = args
    results = []
    for i in range(start, stop):
        pair = make_pair(seed, i, "corpus", min_objects=min_objects, max_objects=max_objects)
        rel1, rel2 = f"images/{i:07d}_1.png", f"images/{i:07d}_2.png"
        _save(render_scene(pair.before, image_size), out / rel1)
        _save(render_scene(pair.after, image_size, pair.view_after), out / rel2)
        record, stats = corpus_record(pair, seed, noise_rate)
        results.append(
            {
                "index": i,
                "id": f"shapes-{i:07d}",
                "source": "shapes",
                "image1": rel1,
                "image2": rel2,
                **record,
                "stats": stats,
            }
        )
    return results


def generate_corpus(
    out_dir: str | Path,
    n_pairs: int,
    image_size: int = 64,
    seed: int = 0,
    noise_rate: float = 0.2,
    workers: int = 1,
    min_objects: int = _MIN_OBJECTS,
    max_objects: int = _MAX_OBJECTS,
) -> dict[str, Any]:
    """Writes a shapes-world pre-training corpus: ``manifest.jsonl``, ``images/``, ``meta.json``.

    Each manifest line holds ``id, source="shapes", image1, image2, description, verb1, desc1, verb2, desc2,
    noise1, noise2, change_type`` (the schema of :mod:`namc.data.corpus`, plus the change type).

    Args:
        out_dir: output folder (created).
        n_pairs: number of pairs.
        image_size: side of the square PNGs.
        seed: global seed (same seed, same bytes).
        noise_rate: expected fraction of phrases that are injected noise, in [0, 0.5] (each real phrase is followed
            by a noise phrase with probability ``noise_rate / (1 - noise_rate)``).
        workers: processes (the output does not depend on it).
        min_objects: fewest objects in an image.
        max_objects: most objects in an image.

    Returns:
        The contents of ``meta.json``: counts and the realised phrase- and word-level noise fractions.
    """
    if not 0.0 <= noise_rate <= 0.5:
        raise ValueError("noise_rate must be in [0, 0.5]")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    jobs = [(seed, image_size, out, noise_rate, min_objects, max_objects, c) for c in _chunks(n_pairs, workers)]
    results = sorted(_run_jobs(_corpus_job, jobs, workers), key=lambda r: r["index"])
    totals = {"phrases": 0, "noise_phrases": 0, "words": 0, "noise_words": 0}
    kinds: dict[str, int] = {}
    with open(out / "manifest.jsonl", "w", encoding="utf-8") as f:
        for r in results:
            stats = r.pop("stats")
            r.pop("index")
            for k in totals:
                totals[k] += stats[k]
            for k, v in stats["kinds"].items():
                kinds[k] = kinds.get(k, 0) + v
            f.write(json.dumps(r) + "\n")
    meta = {
        "pairs": n_pairs,
        "image_size": image_size,
        "seed": seed,
        "noise_rate": noise_rate,
        **totals,
        "noise_kinds": kinds,
        "phrase_noise_fraction": totals["noise_phrases"] / totals["phrases"] if totals["phrases"] else 0.0,
        "word_noise_fraction": totals["noise_words"] / totals["words"] if totals["words"] else 0.0,
    }
    _write_json(out / "meta.json", meta)
    logger.info("shapes corpus: %d pairs, realised phrase noise %.3f", n_pairs, meta["phrase_noise_fraction"])
    return meta


def _save(img: Image.Image, path: Path) -> None:
    img.save(path, format="PNG", compress_level=1)  # fast zlib level; still lossless and deterministic


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=None, separators=(",", ":")))
