"""A shapes-world MLLM for MED's prompts (Figures 7-17), served by :class:`tests.llm_server.LLMServer`, and a
captioned shapes image index: what the MED engine's tests and ``benchmarks/bench_med_shapes.py`` run against.

:func:`shapes_mllm` answers each prompt the way an obliging model would, from what it can read: the images' scenes
(every shapes PNG carries its scene in a text chunk, :func:`namc.curate.edits.shapes.scene_of`) and the prompt's
text. It follows each figure's answer format exactly, so whatever the engine rejects is rejected by a filter, not
by a parser: Figure 7 says No to a scene of four or more objects (clutter), Figure 8 picks a category from the
image's hash (all eleven; the shapes editor cannot do Scene, Action and Part, and fails them), Figure 9 adds each
object's place to the caption, Figure 10 captions the edited image's scene, Figure 11 compares the two captions'
objects, Figures 12-13 say Yes unless the difference is empty, Figures 16-17 write the answer and three distractors
that change one attribute word each.

Test hooks: a caption holding ``refuse`` gets a refusal at Figure 7; a caption holding ``[[...]]`` carries a
:mod:`tests.llm_server` directive through every request that quotes it.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

from PIL import Image

from namc.curate.edits.shapes import MAX_SLOTS, ShapesPairGenerator, random_caption, save_png, scene_of
from namc.data.synthetic.scene import COLORS, MATERIALS, SHAPES, SIZES, ShapeObject

REFUSAL = "I'm sorry, but I can't help with evaluating this image."
_NAME = re.compile(
    rf"\b({'|'.join(SIZES)}) ({'|'.join(COLORS)}) ({'|'.join(MATERIALS)}) ({'|'.join(SHAPES)})\b(?: at the (\w+))?"
)
_UNSUPPORTED = {
    "Scene": "change the background to a sandy beach",
    "Action": "make the {ref} roll towards the camera",
    "Part": "add a handle to the {ref}",
}


def region(obj: ShapeObject) -> str:
    """Where an object stands, in words: left, center or right."""
    return "left" if obj.x < 0.4 else "right" if obj.x > 0.6 else "center"


def placed_caption(objects: list[ShapeObject]) -> str:
    """A caption naming every object and its place (what Figures 9-10 answer)."""
    names = [f"a {o.name} at the {region(o)}" for o in objects]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _scene(images: list[bytes]) -> list[ShapeObject] | None:
    if not images:
        return None
    return scene_of(Image.open(io.BytesIO(images[0])))


def _instruction(scene: list[ShapeObject], category: str, rng: random.Random) -> str:
    target = rng.choice(scene)
    ref = target.name
    if category in _UNSUPPORTED:
        return _UNSUPPORTED[category].format(ref=ref)
    if category == "Attribute":
        new = rng.choice([c for c in COLORS if c != target.color])
        return f"change the color of the {ref} to {new}"
    if category == "Spatial":
        return f"move the {ref} to the {'right' if target.x < 0.5 else 'left'}"
    if category == "Object":
        return f"add a {rng.choice(SIZES)} {rng.choice(list(COLORS))} {rng.choice(MATERIALS)} {rng.choice(SHAPES)}"
    if category == "Counting":
        return f"add one more {ref}s"
    if category == "Negation":
        return f"remove the {ref}"
    if category == "Universality":
        return f"make all the {target.material} objects {rng.choice([c for c in COLORS if c != target.color])}"
    if category == "Differentiation":
        return f"make only the {ref} {'metal' if target.material == 'rubber' else 'rubber'}"
    # Comparison
    other = rng.choice([o for o in scene if o is not target] or [target])
    return f"make the {ref} larger than the {other.name}"


def _objects(caption: str) -> list[tuple[str, str]]:
    return [(" ".join(m.groups()[:4]), m.group(5) or "") for m in _NAME.finditer(caption)]


def _difference(c1: str, c2: str) -> tuple[str, str]:
    a, b = _objects(c1), _objects(c2)
    count_a, count_b = Counter(n for n, _ in a), Counter(n for n, _ in b)
    gone, new = sorted((count_a - count_b).elements()), sorted((count_b - count_a).elements())
    if not gone and not new:
        moved = [(n, p, q) for (n, p), (m, q) in zip(sorted(a), sorted(b)) if p != q]
        if not moved:
            return "Spatial", "There is no difference."
        n, p, q = moved[0]
        return "Spatial", f"The {n} moved from the {p} to the {q}."
    if new and not gone:
        if new[0] in count_a:
            return "Counting", f"There is one more {new[0]} in the second caption."
        return "Object", f"A {new[0]} was added in the second caption."
    if gone and not new:
        return "Negation", f"The {gone[0]} was removed in the second caption."
    if len(gone) >= 2:
        return "Universality", f"The {' and the '.join(gone)} all changed, to the {' and the '.join(new)}."
    return "Attribute", f"The {gone[0]} became a {new[0]}."


def _distractors(right: str) -> list[str]:
    words = right.split()
    out: list[str] = []
    for i, w in enumerate(words):
        for values in (list(COLORS), SIZES, MATERIALS, SHAPES, ["left", "center", "right"]):
            if w.strip(".,") in values:
                for v in values:
                    cand = " ".join([*words[:i], v + w[len(w.strip(".,")) :], *words[i + 1 :]])
                    if v != w.strip(".,") and cand not in out:
                        out.append(cand)
    out += [right.replace("second image", "first image", 1), right + " The light also changed."]
    return [w for w in out if w != right][:3]


def shapes_mllm(text: str, images: list[bytes]) -> str:
    """The answer to one of MED's prompts (see the module docstring)."""
    if text.startswith("Please evaluate the following sample"):
        if "refuse" in text:
            return REFUSAL
        scene = _scene(images)
        verdict = "No" if scene is None or len(scene) >= 4 else "Yes"
        return (
            f"## **Evaluation**\n**Final Recommendation:** **{verdict}**\n**1. Image quality:**\n"
            f"- **Clarity:** sharp render\n**Explanation:** {len(scene or [])} objects on a plain floor."
        )
    if text.startswith("You are a professional image prompt engineer"):
        scene = _scene(images) or []
        digest = hashlib.sha256(images[0]).digest()
        categories = list(_UNSUPPORTED) + ["Attribute", "Spatial", "Object", "Counting", "Negation"]
        categories += ["Universality", "Differentiation", "Comparison"]
        category = categories[digest[0] % len(categories)]
        instruction = _instruction(scene, category, random.Random(digest))
        name = {"Spatial": "Spatial Relation", "Action": "Action Relation", "Part": "Part Relation"}.get(category)
        caption = ", ".join(o.name for o in scene)
        return (
            f"Type: {name or category}\n## Prompt: Hi, This is a photo of {caption}. Can you {instruction} and "
            "output the image?\n"
        )
    if text.startswith("Given an image, its current caption"):
        return placed_caption(_scene(images) or [])
    if text.startswith("Your task is generating an accurate caption"):
        return "CAPTION: " + placed_caption(_scene(images) or [])
    if text.startswith("Given these two image captions"):
        m = re.search(r"Caption 1: (.*?) Caption 2: (.*?)\n", text)
        kind, sentence = _difference(m.group(1), m.group(2))
        return f"TYPE:{kind}\nDIFFERENCE:{sentence}"
    if text.startswith("Determine if the described difference") or text.startswith("Your task is determine"):
        return "No" if "There is no difference" in text else "Yes"
    if text.startswith("You are analyzing the differences"):
        diff = re.findall(r'Input difference description: "(.*)"', text)[-1]
        return f"ANSWER: In the second image, compared with the first, {diff[0].lower()}{diff[1:]}"
    if text.startswith("Please create exactly 3 completely incorrect statements"):
        right = re.search(r'The correct statement that describes this difference is: "(.*)"\n', text).group(1)
        return "\n".join(f"wrong_answer{k}: {w}" for k, w in enumerate(_distractors(right), 1))
    return "I do not know this prompt."


def shapes_index(
    folder: Path, n: int, seed: int = 0, image_size: int = 64, extra: list[dict[str, Any]] | None = None
) -> Path:
    """Writes ``n`` captioned shapes images (2-4 objects) and their ``images.jsonl`` (``{"key", "source",
    "image", "caption"}``, references relative to ``folder``); ``extra`` lines are appended as given."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "images").mkdir(exist_ok=True)
    rng = random.Random(seed)
    gen = ShapesPairGenerator(image_size)
    lines = []
    for i in range(n):
        caption = random_caption(rng, 2, 4)
        (image, _) = gen.generate_pairs([(caption, caption)], [seed * 100_003 + i])[0]
        assert len(scene_of(image) or []) <= MAX_SLOTS
        save_png(image, folder / "images" / f"{i:05d}.png")
        lines.append({"key": f"shapes/{i:05d}", "source": "shapes", "image": f"images/{i:05d}.png", "caption": caption})
    lines += extra or []
    path = folder / "images.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path
