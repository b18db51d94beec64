"""The shapes world's language: CLEVR-Change-style captions, spatial relations and the halves of a description.

Benchmark captions, and the free-text descriptions of the conventional corpus (appendix B.2), are paraphrases of
one change (``"the small red metal cube changed to blue"``, ``"the large cyan rubber sphere has been newly
placed"``) or of no change (``"no change was made"``). Pre-training descriptions follow the paper's implicit-change
template (section 3.1.2): each half names the changed object and its context (another object and their relation, or
the object's region), as lists of words grouped in phrases; :mod:`namc.data.synthetic.noise` adds the noise and
joins them.
"""

from __future__ import annotations

import random

from namc.data.synthetic.scene import NO_CHANGE, ShapeObject, ShapesPair

__all__ = ["VERBS", "change_captions", "conventional_description", "description_halves", "no_change_captions"]

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
VERBS = (
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


def conventional_description(pair: ShapesPair, rng: random.Random) -> str:
    """A free-text change description of the pair (the shapes world's answer to appendix B.2's conventional prompt):
    one short sentence, a change caption drawn from ``rng`` with a capital and a period, e.g. "The small red metal
    cube changed to blue." It names only the changed object, without the context the template's halves add, as the
    paper finds the conventional prompt's short sentences lose granularity (Figure 10)."""
    text = change_captions(pair, rng, 1)[0]
    return text[0].upper() + text[1:] + "."


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


def _object_phrases(obj: ShapeObject, ctx: ShapeObject | None, region: bool = False) -> list[list[str]]:
    """Real phrases of one half: the object, then its relation to the context object (or its region)."""
    phrases = [["a", *obj.name.split()]]
    if ctx is not None:
        phrases.append([*_relation(obj, ctx).split(), "a", *ctx.name.split()])
    elif region:
        phrases.append(_region(obj).split())
    return phrases


def description_halves(pair: ShapesPair, rng: random.Random) -> tuple[list[list[str]], list[list[str]]]:
    """The real phrases of the two halves of the pair's description (each phrase a list of words).

    The context object is drawn from ``rng``: an unchanged object (for a move, one whose relation to the moved
    object changed; the object's region when there is none). An added object appears only in the second half, a
    dropped one only in the first.
    """
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
