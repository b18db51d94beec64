"""A minimal-pair choice set from the shapes world: for each image pair, one true description and up to three
minimal edits of it, labelled with the kind of detail they change (in the spirit of MED, seed paper 004, whose
benchmark gives four options per image pair, one correct, by edit category).

Categories (:data:`CATEGORIES`), and what the wrong candidates change:

- ``colour``, ``shape``, ``material``, ``size``: one attribute word of the true description
  (:func:`~namc.data.synthetic.counterfactuals.attribute_edits`; a material change's description also gets its
  reversed direction). The shapes world has 2 sizes and 3 shapes, so ``size`` items have 2 candidates and ``shape``
  items 3: chance is reported per item, never assumed to be 1/4;
- ``position``: the object moved; the wrong candidates tell another event about the same object (recoloured,
  made of the other material, added, removed);
- ``add``, ``drop``: an object was added / removed; the wrong candidates reverse the direction (removed / added)
  or tell another event about it;
- ``no_change``: the second image is the first one under a small viewpoint / lighting jitter (CLEVR-Change's
  distractors); the wrong candidates describe a change of an object that is in the scene.

The true descriptions use the benchmark's caption templates (:mod:`namc.data.synthetic.language`), so a model
fine-tuned on the shapes-world benchmark knows every word. Scenes come from their own random stream
(``"minimal_pairs"``), so no item repeats a benchmark pair.

Output (read by :mod:`namc.eval.choice`)::

    choices.jsonl   {"id", "image1", "image2", "candidates": [str], "answer": int, "category": str}  per line
    images/%06d_1.png, images/%06d_2.png   (paths in the JSONL are relative to its folder)
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from namc.data.synthetic.counterfactuals import attribute_edits, event_edits
from namc.data.synthetic.language import _CAPTIONS
from namc.data.synthetic.render import render_scene
from namc.data.synthetic.scene import (
    CHANGE_TYPES,
    COLORS,
    MATERIALS,
    MAX_OBJECTS,
    MIN_OBJECTS,
    NO_CHANGE,
    check_object_range,
    make_pair,
)

__all__ = ["CATEGORIES", "generate_minimal_pairs", "minimal_pair_item"]

CATEGORIES = ("colour", "shape", "material", "size", "position", "add", "drop", "no_change")
_CHANGE_OF = {"colour": "color", "material": "material", "position": "move", "add": "add", "drop": "drop"}
CHOICES_FILE = "choices.jsonl"


def _true_description(ctype: str, k: int, obj: str, new: str) -> str:
    templates = _CAPTIONS[ctype]
    return templates[k % len(templates)].format(obj=obj, new=new)


def _no_change_distractors(before: list[Any], rng: random.Random, n: int) -> list[str]:
    """``n`` descriptions of made-up changes of objects of the scene (one per change type)."""
    out = []
    for ctype in rng.sample(["color", "material", "drop", "move"], n):
        obj = rng.choice(before)
        new = ""
        if ctype == "color":
            new = rng.choice([c for c in COLORS if c != obj.color])
        elif ctype == "material":
            new = next(m for m in MATERIALS if m != obj.material)
        out.append(_true_description(ctype, rng.randrange(len(_CAPTIONS[ctype])), obj.name, new))
    return out


def minimal_pair_item(
    seed: int, index: int, min_objects: int = MIN_OBJECTS, max_objects: int = MAX_OBJECTS
) -> tuple[Any, Any, dict[str, Any]]:
    """One item: the scene pair to render and its record (without image paths).

    Returns:
        ``(first image objects and view, second image objects and view, record)`` where the record holds
        ``id``, ``candidates``, ``answer``, ``category``.
    """
    rng = random.Random(f"{seed}-minimal-pairs-{index}")
    category = CATEGORIES[index % len(CATEGORIES)]
    ctype = _CHANGE_OF.get(category) or CHANGE_TYPES[(index // len(CATEGORIES)) % len(CHANGE_TYPES)]
    pair = make_pair(seed, index, "minimal_pairs", change_type=ctype, min_objects=min_objects, max_objects=max_objects)
    first = (pair.before, None)
    second = (pair.after, pair.view_after)
    if category == NO_CHANGE:
        second = (pair.before, pair.view_distractor)
        true = rng.choice(_CAPTIONS[NO_CHANGE])
        wrong = _no_change_distractors(pair.before, rng, 3)
    else:
        assert pair.changed is not None
        new = ""
        if ctype == "color":
            new = pair.changed_after.color  # type: ignore[union-attr]
        elif ctype == "material":
            new = pair.changed_after.material  # type: ignore[union-attr]
        true = _true_description(ctype, rng.randrange(len(_CAPTIONS[ctype])), pair.changed.name, new)
        if category in ("colour", "shape", "material", "size"):
            pool = attribute_edits(true, category)
            if category == "material":
                pool += [t for t in event_edits(true)["direction"] if t not in pool]
        else:
            events = event_edits(true, rng)
            pool = events["direction"] + [t for t in events["change_type"] if t not in _CAPTIONS[NO_CHANGE]]
        wrong = rng.sample(pool, min(3, len(pool)))
    candidates = [true, *wrong]
    rng.shuffle(candidates)
    record = {
        "id": f"mp-{index:06d}",
        "candidates": candidates,
        "answer": candidates.index(true),
        "category": category,
        "change_type": NO_CHANGE if category == NO_CHANGE else ctype,
    }
    return first, second, record


def generate_minimal_pairs(
    out_dir: str | Path,
    n_items: int,
    image_size: int = 64,
    seed: int = 0,
    min_objects: int = MIN_OBJECTS,
    max_objects: int = MAX_OBJECTS,
    progress: bool = False,
) -> dict[str, Any]:
    """Write ``n_items`` items (categories in turn, so balanced) to ``out_dir`` (see the module docstring).

    Returns:
        a summary: ``{"path", "items", "categories": {category: count}, "chance": mean 1 / candidates}``.
    """
    if n_items < 1:
        raise ValueError("n_items must be at least 1")
    check_object_range(min_objects, max_objects)
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    chance = 0.0
    path = out / CHOICES_FILE
    partial = out / f".{CHOICES_FILE}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        for i in tqdm(range(n_items), desc=f"writing {out.name}", unit="item", disable=not progress):
            (objs1, view1), (objs2, view2), record = minimal_pair_item(seed, i, min_objects, max_objects)
            names = (f"images/{i:06d}_1.png", f"images/{i:06d}_2.png")
            for name, objs, view in ((names[0], objs1, view1), (names[1], objs2, view2)):
                img = render_scene(objs, image_size) if view is None else render_scene(objs, image_size, view)
                img.save(out / name, format="PNG", compress_level=1)
            f.write(json.dumps({"id": record.pop("id"), "image1": names[0], "image2": names[1], **record}) + "\n")
            counts[record["category"]] = counts.get(record["category"], 0) + 1
            chance += 1 / len(record["candidates"])
    partial.replace(path)
    return {"path": str(path), "items": n_items, "categories": counts, "chance": chance / n_items}
