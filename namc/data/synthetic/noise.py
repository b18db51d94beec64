"""Noise injection for the shapes-world corpus, with word-level labels: :func:`corpus_record`.

A controlled fraction ``noise_rate`` of the phrases of a description are injected noise, placed before a real
phrase: an object in a colour absent from the image (``"near a yellow cylinder"``), scenery (``"on a wooden
table"``), or a false attribute word inside a name (``"a small striped red metal cube"``). The labels
``noise1``/``noise2`` (aligned to ``desc.split()``) mark exactly the injected words.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from namc.data.synthetic.language import VERBS, description_halves
from namc.data.synthetic.scene import COLORS, SHAPES, ShapeObject, ShapesPair
from namc.text.template import rebuild

__all__ = ["corpus_record"]

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


def _noise_phrase(rng: random.Random, scene: Sequence[ShapeObject], attribute_ok: bool) -> tuple[str, list[str]]:
    kind = rng.choice(("object", "scenery", "attribute"))
    if kind == "attribute" and not attribute_ok:
        kind = "scenery"
    absent = [c for c in COLORS if c not in {o.color for o in scene}]
    if kind == "object" and not absent:  # 8 objects of the 8 colours (--max-objects 8): nothing to hallucinate
        kind = "scenery"
    if kind == "object":  # a hallucinated object in a colour that nothing in this image has
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
    half1, half2 = description_halves(pair, rng)
    kinds: dict[str, int] = {}
    w1, l1, n1 = _inject(half1, pair.before, rng, q, kinds)
    w2, l2, n2 = _inject(half2, pair.after, rng, q, kinds)
    verb1, verb2 = rng.choice(VERBS), rng.choice(VERBS)
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
