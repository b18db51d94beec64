"""Rule-made counterfactual captions: a true change caption with one detail made wrong.

The negatives of the fixed pool of preference fine-tuning (:class:`namc.lit.preference.PreferenceModule`, ADPO
section 4.2: "semantically similar but suboptimal captions") and the distractors of the minimal-pair set
(:mod:`namc.data.synthetic.minimal_pairs`). Edits, each one word or one event:

- ``colour``, ``shape``, ``material``, ``size``: one attribute word replaced by another value of the same kind
  (CLEVR's 8 colours, 3 shapes, 2 materials, 2 sizes, :mod:`namc.data.synthetic.scene`; CLEVR-Change's synonyms
  such as "ball", "block", "shiny", "matte", "big", "tiny" are recognised and replaced by another kind's word);
- ``direction``: the two values of a colour or material change exchanged ("the small red metal cube changed to
  blue" -> "the small blue metal cube changed to red"), or an addition told as a removal and the reverse (the
  temporal order of the pair; the shapes world's moves carry no direction in their captions);
- ``change_type``: the same object with another event (changed colour / material, added, removed, moved), or a
  change told as "no change". Only captions written from the shapes world's templates
  (:mod:`namc.data.synthetic.language`) are parsed for these; other captions get attribute edits only.

Every function is deterministic; the ones that choose take a ``random.Random``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from namc.data.synthetic.language import _CAPTIONS
from namc.data.synthetic.scene import COLORS, MATERIALS, NO_CHANGE, SHAPES, SIZES

__all__ = ["ATTRIBUTE_WORDS", "EDIT_KINDS", "attribute_edits", "counterfactuals", "event_edits", "parse_caption"]

#: kind -> canonical value -> the words that mean it (the canonical word first).
ATTRIBUTE_WORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "colour": {c: (c, "grey") if c == "gray" else (c,) for c in COLORS},
    "shape": {
        "cube": ("cube", "cubes", "block", "blocks"),
        "sphere": ("sphere", "spheres", "ball", "balls"),
        "cylinder": ("cylinder", "cylinders"),
    },
    "material": {"rubber": ("rubber", "matte"), "metal": ("metal", "metallic", "shiny")},
    "size": {"small": ("small", "tiny"), "large": ("large", "big")},
}
assert set(ATTRIBUTE_WORDS["shape"]) == set(SHAPES) and set(ATTRIBUTE_WORDS["material"]) == set(MATERIALS)
assert set(ATTRIBUTE_WORDS["size"]) == set(SIZES)
EDIT_KINDS = ("colour", "shape", "material", "size", "direction", "change_type")

_WORD_KIND = {w: (kind, value) for kind, values in ATTRIBUTE_WORDS.items() for value, ws in values.items() for w in ws}
_TOKEN_RE = re.compile(r"[a-z]+|[^a-z]+")
_OBJ = r"(?P<obj>(?:small|large) \w+ (?:rubber|metal) (?:cube|sphere|cylinder))"
_NEW = r"(?P<new>\w+)"


def _template_regex(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{obj\}|\{new\})", template)
    body = "".join(_OBJ if p == "{obj}" else _NEW if p == "{new}" else re.escape(p) for p in parts)
    return re.compile(f"^{body}$")


_PATTERNS = [
    (ctype, k, _template_regex(t))
    for ctype, templates in _CAPTIONS.items()
    if ctype != NO_CHANGE
    for k, t in enumerate(templates)
]


def parse_caption(caption: str) -> tuple[str, int, str, str] | None:
    """``(change type, template index, object name, new value)`` of a shapes-world change caption, else None.

    >>> parse_caption("the small red metal cube changed to blue")
    ('color', 0, 'small red metal cube', 'blue')
    """
    text = " ".join(caption.lower().split())
    for ctype, k, pattern in _PATTERNS:
        m = pattern.match(text)
        if m is None:
            continue
        new = m.groupdict().get("new") or ""
        if ctype == "color" and new not in COLORS or ctype == "material" and new not in MATERIALS:
            continue  # "changed to blue" is a colour change, "changed to metal" a material one
        return ctype, k, m.group("obj"), new
    return None


def attribute_edits(caption: str, kind: str) -> list[str]:
    """Every caption that differs from ``caption`` in one word of attribute ``kind``, in word order.

    A word is replaced by the canonical word of each other value of its kind (``"ball"`` -> ``"cube"``,
    ``"cylinder"``); duplicates and the caption itself are dropped.
    """
    if kind not in ATTRIBUTE_WORDS:
        raise ValueError(f"unknown attribute kind {kind!r}; choose from {sorted(ATTRIBUTE_WORDS)}")
    tokens = _TOKEN_RE.findall(caption.lower())
    out: list[str] = []
    for i, tok in enumerate(tokens):
        hit = _WORD_KIND.get(tok)
        if hit is None or hit[0] != kind:
            continue
        for value in ATTRIBUTE_WORDS[kind]:
            if value != hit[1]:
                edited = "".join(tokens[:i] + [value] + tokens[i + 1 :])
                if edited != caption.lower() and edited not in out:
                    out.append(edited)
    return out


def _render(ctype: str, k: int, obj: str, new: str) -> str:
    templates = _CAPTIONS[ctype]
    return templates[k % len(templates)].format(obj=obj, new=new)


def event_edits(caption: str, rng: random.Random | None = None) -> dict[str, list[str]]:
    """``direction`` and ``change_type`` edits of a shapes-world change caption (empty when it does not parse).

    The template index is kept where the other event has one of that index, so the wording stays as close as the
    templates allow. ``rng`` picks the colour / material of a made-up colour or material change (default: the
    first value that differs).
    """
    parsed = parse_caption(caption)
    out: dict[str, list[str]] = {"direction": [], "change_type": []}
    if parsed is None:
        return out
    ctype, k, obj, new = parsed
    size, colour, material, shape = obj.split()
    if ctype == "color":
        out["direction"].append(_render(ctype, k, f"{size} {new} {material} {shape}", colour))
    elif ctype == "material":
        out["direction"].append(_render(ctype, k, f"{size} {colour} {new} {shape}", material))
    elif ctype in ("add", "drop"):
        out["direction"].append(_render("drop" if ctype == "add" else "add", k, obj, ""))
    pick = rng.choice if rng is not None else (lambda xs: xs[0])
    for other in ("color", "material", "add", "drop", "move"):
        if other == ctype:
            continue
        value = ""
        if other == "color":
            value = pick([c for c in COLORS if c != colour])
        elif other == "material":
            value = pick([m for m in MATERIALS if m != material])
        out["change_type"].append(_render(other, k, obj, value))
    out["change_type"].append(_CAPTIONS[NO_CHANGE][k % len(_CAPTIONS[NO_CHANGE])])
    return out


def counterfactuals(
    caption: str, positives: Sequence[str] = (), kinds: Sequence[str] = EDIT_KINDS
) -> list[tuple[str, str]]:
    """``(kind, caption)`` edits of a true caption, none equal to it or to any of ``positives``.

    Args:
        caption: a true description of the pair.
        positives: the pair's other true descriptions (an edit that happens to equal one is dropped).
        kinds: which edits (:data:`EDIT_KINDS`).

    Returns:
        the edits, grouped by kind in the order of ``kinds``, without duplicates.
    """
    unknown = set(kinds) - set(EDIT_KINDS)
    if unknown:
        raise ValueError(f"unknown edit kinds {sorted(unknown)}; choose from {EDIT_KINDS}")
    skip = {" ".join(p.lower().split()) for p in (caption, *positives)}
    events = event_edits(caption) if {"direction", "change_type"} & set(kinds) else {}
    out: list[tuple[str, str]] = []
    for kind in kinds:
        edits = attribute_edits(caption, kind) if kind in ATTRIBUTE_WORDS else events.get(kind, [])
        for text in edits:
            key = " ".join(text.split())
            if key not in skip:
                skip.add(key)
                out.append((kind, text))
    return out
