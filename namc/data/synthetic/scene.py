"""The shapes world's scenes: objects, views, random scenes and :func:`make_pair` (one before/after/distractor pair).

Scenes hold 2-6 objects with CLEVR's attributes: shape {cube, sphere, cylinder}, the 8 CLEVR colours (RGB values of
CLEVR's ``properties.json``), size {small, large} and material {rubber, metal}. Every object of a scene has a
distinct (size, colour, material, shape), so each one has an unambiguous name. Sizes are 0.08 and 0.12 of the image
side (radius), so a small object is still about 10 px wide at 64 px and the four attributes stay readable.

A pair is a *before* scene and one change {color, material, add, drop, move} (change type ``index % 5``, so the
types are balanced), plus a *distractor*: the same scene under a small global shift/scale and brightness change
(captioned as no change). As in CLEVR-Change, the changed image also gets such a viewpoint/lighting jitter.
Everything derives from ``(seed, stream, index)`` through its own ``random.Random``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

__all__ = [
    "CHANGE_TYPES",
    "COLORS",
    "MATERIALS",
    "MAX_OBJECTS",
    "MIN_OBJECTS",
    "NO_CHANGE",
    "RADIUS",
    "SHAPES",
    "SIZES",
    "ShapeObject",
    "ShapesPair",
    "View",
    "make_pair",
]

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

RADIUS = {"small": 0.08, "large": 0.12}  # fraction of the image side
_X_RANGE = (0.1, 0.9)
_Y_RANGE = (0.3, 0.86)
MIN_OBJECTS, MAX_OBJECTS = 2, 6


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
    r = RADIUS[size]
    for o in others:
        if o is ignore:
            continue
        if math.hypot(x - o.x, y - o.y) < 1.15 * (r + RADIUS[o.size]):
            return False
    return True


def _random_position(
    rng: random.Random, size: str, others: Sequence[ShapeObject], ignore: ShapeObject | None = None
) -> tuple[float, float] | None:
    r = RADIUS[size]
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


def _change(
    rng: random.Random, ctype: str, before: list[ShapeObject], target: ShapeObject
) -> tuple[ShapeObject, ShapeObject | None] | None:
    """Change ``ctype`` applied to ``target`` of the scene ``before``, or None when this scene cannot take it.

    Returns:
        ``(changed, changed_after)``: the object before the change (the new object for "add") and after it (None
        for "drop").
    """
    taken = {o.key for o in before}
    if ctype == "color":
        colors = [
            c for c in COLORS if c != target.color and (target.size, c, target.material, target.shape) not in taken
        ]
        return target, replace(target, color=rng.choice(colors))
    if ctype == "material":
        new = "metal" if target.material == "rubber" else "rubber"
        if (target.size, target.color, new, target.shape) in taken:
            return None
        return target, replace(target, material=new)
    if ctype == "move":
        for _ in range(50):
            cand = _random_position(rng, target.size, before, ignore=target)
            if cand is not None and math.hypot(cand[0] - target.x, cand[1] - target.y) >= 0.25:
                return target, replace(target, x=cand[0], y=cand[1])
        return None
    if ctype == "drop":
        return target, None
    size, color, material, shape = _random_attributes(rng, taken)  # add
    pos = _random_position(rng, size, before)
    if pos is None:
        return None
    added = ShapeObject(shape, color, size, material, *pos)
    return added, added


def check_object_range(min_objects: int, max_objects: int) -> None:
    """Raises ValueError unless ``1 <= min_objects < max_objects <= 8`` (generators check before writing anything)."""
    if not 1 <= min_objects < max_objects <= 8:
        raise ValueError(
            f"need 1 <= min_objects < max_objects <= 8 (more objects do not fit without overlap), got {min_objects} "
            f"and {max_objects}"
        )


def make_pair(
    seed: int,
    index: int,
    stream: str = "benchmark",
    change_type: str | None = None,
    min_objects: int = MIN_OBJECTS,
    max_objects: int = MAX_OBJECTS,
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
    check_object_range(min_objects, max_objects)
    rng = random.Random(f"{seed}-{stream}-{index}")
    ctype = change_type or CHANGE_TYPES[index % len(CHANGE_TYPES)]
    if ctype not in CHANGE_TYPES:
        raise ValueError(f"unknown change type {ctype!r}")
    lo = min_objects + 1 if ctype == "drop" else min_objects
    hi = max_objects - 1 if ctype == "add" else max_objects
    while True:  # draw scenes until one can take the change
        before = _random_scene(rng, rng.randint(lo, hi))
        target = rng.choice(before)
        change = _change(rng, ctype, before, target)
        if change is not None:
            break
    changed, changed_after = change
    after = list(before)
    if ctype == "add":
        after.append(changed)
    elif ctype == "drop":
        after.remove(target)
    else:
        after[after.index(target)] = changed_after  # type: ignore[assignment]
    view_after = _random_view(rng) if jitter_changed else View()
    return ShapesPair(index, ctype, before, after, changed, changed_after, view_after, _random_view(rng))
