"""The fine-grained implicit-change template (paper section 3.1.2, appendix D.2).

Every pre-training description follows one sentence frame::

    The difference between the two images is that the first image {verb} [object description],
    while the second image {verb} [object description].

This module parses such a description into its two halves, rejects text that is off the template (with a reason
code, so the rejection can be counted and reported: the paper rejects about 0.2% of 770K, appendix D.2), rebuilds
the canonical text from (possibly denoised) halves, exposes the frame's fixed segments for tokenizers, and computes
the repetition statistics of the paper's Table 14.

Choices (the paper is silent on these):

- **Verb list.** Appendix D.2 prints 50 slots, one of them empty (``"illustrates, , displays"``). We read the empty
  slot as a typesetting artefact, not as a licence to omit the verb: ``VERBS`` holds the 49 printed verbs, and a
  half whose first word is not one of them is rejected (:attr:`RejectReason.UNKNOWN_VERB`).
- **Tolerated variations.** Matching is case-insensitive and whitespace-insensitive (runs of spaces/newlines count
  as one space); ``"between two images"`` is accepted as well as ``"between the two images"`` (the paper's own
  generations in Figures 7, 8 and 10 say ``"The difference between two images is that ..."``); the comma before
  ``"while"`` may be missing; one trailing period is optional. Commas, quotes and further clauses inside a
  description are kept (Figure 8: ``"a person jumping, with each frame capturing the person in mid-air"``). The
  first ``"while the second image"`` after the first half starts the second half.
- **Not tolerated.** ``"whereas"`` or ``"and the second image"`` instead of ``"while"``: none of the paper's
  examples uses them and the paper says descriptions "strictly" follow the template, so they are off-template.
- **Negation / auxiliary-only halves.** Appendix D.2 filters halves "containing only negations and auxiliary verbs,
  such as something does/is/was/was not/is not/does not". A half is rejected when every word after ``"the first
  image"`` / ``"the second image"`` belongs to :data:`NEGATION_AUXILIARY_WORDS` (``"is not"``, ``"does not."``,
  ``"was"``), or when its description after the verb does (``"shows nothing"``). This check runs before the verb
  check, so ``"... while the second image does not."`` is ``NEGATION_ONLY``, not ``UNKNOWN_VERB``.
- **The frame inside a half.** A half that itself holds the template's frame (``"the difference between the two
  images"``, or a second ``"while the second image"``) is rejected (:attr:`RejectReason.NESTED_TEMPLATE`): an LLM
  answer that repeats or embeds a whole template sentence would otherwise pass, with one sentence's ending glued
  into the other's description.
- **Length.** A description longer than :data:`MAX_DESCRIPTION_CHARS` characters is rejected
  (:attr:`RejectReason.TOO_LONG`) before it is parsed: the paper's descriptions are one sentence of a few dozen
  words, and a server that ignores its token cap must not put megabytes into a corpus.
- **Verbs are returned lower-cased; descriptions keep their case** (``"HUNGER"`` in Figure 10 stays upper-case).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "NEGATION_AUXILIARY_WORDS",
    "TEMPLATE",
    "VERBS",
    "ParsedDescription",
    "RejectReason",
    "SourceStats",
    "TemplateError",
    "TemplateStats",
    "normalize_whitespace",
    "parse",
    "rebuild",
    "segments",
    "validate",
]

#: The template as printed in section 3.1.2 / appendix D.2.
TEMPLATE = (
    "The difference between the two images is that the first image {descriptive verb} [object description], "
    "while the second image {descriptive verb} [object description]."
)

#: Appendix D.2's predefined verb list, in the paper's order, without its empty slot (see the module docstring).
VERBS: tuple[str, ...] = (
    "is",
    "describes",
    "depicts",
    "illustrates",
    "displays",
    "demonstrates",
    "introduces",
    "has",
    "positions",
    "starts",
    "places",
    "discusses",
    "promotes",
    "takes",
    "converts",
    "adopts",
    "presents",
    "reveals",
    "incorporates",
    "aims",
    "refers",
    "offers",
    "focuses",
    "suggests",
    "attributes",
    "specifies",
    "captures",
    "symbolizes",
    "advertises",
    "conveys",
    "features",
    "appears",
    "consists",
    "remains",
    "shows",
    "lists",
    "explains",
    "shifts",
    "indicates",
    "provides",
    "contains",
    "exhibits",
    "labels",
    "sets",
    "looks",
    "states",
    "showcases",
    "creates",
    "centers",
)
_VERB_SET = frozenset(VERBS)

#: Negations and auxiliary verbs (appendix D.2: "something does/is/was/was not/is not/does not"). A half made only
#: of these words carries no object description.
_NEGATION_AUXILIARY = """
    not no never nothing none neither nor n't
    is isn't are aren't was wasn't were weren't be been being am
    do does did don't doesn't didn't
    has hasn't have haven't had hadn't
    can cannot can't could couldn't will won't would wouldn't shall should shouldn't
    may might must mustn't
"""
NEGATION_AUXILIARY_WORDS = frozenset(_NEGATION_AUXILIARY.split())

_PREFIX_RE = re.compile(r"^the difference between (?:the )?two images is that the first image\b", re.IGNORECASE)
_SEPARATOR_RE = re.compile(r"\s*,?\s*\bwhile the second image\b", re.IGNORECASE)
# the frame's own wording, which no object description holds: its opening clause, or a second separator
_FRAME_IN_HALF_RE = re.compile(
    r"\bthe difference between (?:the )?two images\b|\bwhile the second image\b", re.IGNORECASE
)

#: The longest description accepted, in characters: far above a one-sentence description (a few hundred
#: characters) and above what a 512-token answer holds, so only runaway or hostile answers reach it.
MAX_DESCRIPTION_CHARS = 8192
_STRIP_PUNCT = ".,;:!?\"'()[]"

_PREFIX = "The difference between the two images is that the first image"
_MIDDLE = ", while the second image"
_SUFFIX = "."


class RejectReason(StrEnum):
    """Why a description is not usable for pre-training (appendix D.2)."""

    EMPTY = "empty"  # not a string, or only whitespace
    OFF_TEMPLATE = "off_template"  # the sentence frame does not match
    UNKNOWN_VERB = "unknown_verb"  # a half does not start with a verb of VERBS
    EMPTY_HALF = "empty_half"  # a half has a verb but no object description
    NEGATION_ONLY = "negation_only"  # a half holds only negations / auxiliary verbs
    NESTED_TEMPLATE = "nested_template"  # a half holds the template's own frame (an embedded second sentence)
    TOO_LONG = "too_long"  # longer than MAX_DESCRIPTION_CHARS


class TemplateError(ValueError):
    """A description is off the template; ``reason`` says why."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason


class ParsedDescription(NamedTuple):
    """The two halves of an implicit-change description."""

    verb1: str
    desc1: str
    verb2: str
    desc2: str


def normalize_whitespace(text: str) -> str:
    """Collapses runs of whitespace into one space and strips both ends (``text.split()`` is unchanged)."""
    return " ".join(text.split())


def _is_negation_only(words: list[str]) -> bool:
    found = False
    for w in words:  # stops at the first content word (most halves: the second word)
        cleaned = w.strip(_STRIP_PUNCT).lower().replace("\u2019", "'")
        if not cleaned:
            continue
        if cleaned not in NEGATION_AUXILIARY_WORDS:
            return False
        found = True
    return found


def _parse_half(rest: str, which: str) -> tuple[str, str]:
    frame = _FRAME_IN_HALF_RE.search(rest)
    if frame is not None:
        raise TemplateError(
            RejectReason.NESTED_TEMPLATE, f"the {which} half holds the template's frame {frame.group(0)!r}"
        )
    words = rest.split()
    if not words:
        raise TemplateError(RejectReason.EMPTY_HALF, f"the {which} image has no verb and no description")
    if _is_negation_only(words):
        raise TemplateError(RejectReason.NEGATION_ONLY, f"the {which} half holds only negations/auxiliaries: {rest!r}")
    verb = words[0].lower()
    if verb not in _VERB_SET:
        raise TemplateError(RejectReason.UNKNOWN_VERB, f"the {which} half starts with {words[0]!r}, not a listed verb")
    desc = " ".join(words[1:])
    if not desc.strip(_STRIP_PUNCT + " "):
        raise TemplateError(RejectReason.EMPTY_HALF, f"the {which} half has the verb {verb!r} but no description")
    if _is_negation_only(words[1:]):
        raise TemplateError(RejectReason.NEGATION_ONLY, f"the {which} half holds only negations/auxiliaries: {rest!r}")
    return verb, desc


def parse(description: str) -> ParsedDescription:
    """Splits an implicit-change description into ``(verb1, desc1, verb2, desc2)``.

    Args:
        description: one generated description (any case and whitespace; see the module docstring for the
            variations that are tolerated).

    Returns:
        The lower-cased verbs and the whitespace-normalised descriptions (original case, inner punctuation kept,
        the sentence's final period removed).

    Raises:
        TemplateError: the description is off the template; ``err.reason`` is a :class:`RejectReason`.
    """
    if not isinstance(description, str) or not description.strip():
        raise TemplateError(RejectReason.EMPTY, "empty description")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise TemplateError(
            RejectReason.TOO_LONG, f"{len(description):,} characters, over the limit of {MAX_DESCRIPTION_CHARS:,}"
        )
    text = normalize_whitespace(description)
    if text.endswith("."):
        text = text[:-1].rstrip()
    head = _PREFIX_RE.match(text)
    if head is None:
        raise TemplateError(RejectReason.OFF_TEMPLATE, f"does not start with the template's frame: {text[:80]!r}")
    body = text[head.end() :]
    sep = _SEPARATOR_RE.search(body)
    if sep is None:
        raise TemplateError(RejectReason.OFF_TEMPLATE, "no ', while the second image' separator")
    rest1 = body[: sep.start()].strip()
    rest2 = body[sep.end() :].strip()
    if rest1.endswith(","):  # "..., , while" or "the first image shows x,  while"
        rest1 = rest1[:-1].rstrip()
    verb1, desc1 = _parse_half(rest1, "first")
    verb2, desc2 = _parse_half(rest2, "second")
    return ParsedDescription(verb1, desc1, verb2, desc2)


def validate(description: str, free_text: bool = False) -> RejectReason | None:
    """Returns ``None`` for a usable description, else the :class:`RejectReason` it fails with; a ``free_text`` one
    (appendix B.2's conventional prompt, no template) fails only when empty or too long."""
    if free_text:
        if not isinstance(description, str) or not description.strip():
            return RejectReason.EMPTY
        return RejectReason.TOO_LONG if len(description) > MAX_DESCRIPTION_CHARS else None
    try:
        parse(description)
    except TemplateError as err:
        return err.reason
    return None


def _check_verb(verb: str) -> str:
    v = verb.strip().lower()
    if v not in _VERB_SET:
        raise ValueError(f"{verb!r} is not a verb of the template's list (appendix D.2)")
    return v


def segments(verb1: str, verb2: str) -> tuple[str, str, str]:
    """The template's fixed text around the two descriptions, for tokenizers that build it piece by piece.

    ``rebuild(v1, d1, v2, d2) == prefix + " " + d1 + middle + " " + d2 + suffix`` with
    ``prefix = "The difference between the two images is that the first image {v1}"``,
    ``middle = ", while the second image {v2}"`` and ``suffix = "."``: the segments carry no outer spaces; one
    space separates each verb from its description.

    Args:
        verb1: verb of the first half (one of :data:`VERBS`, any case).
        verb2: verb of the second half.

    Returns:
        ``(prefix, middle, suffix)``.
    """
    return f"{_PREFIX} {_check_verb(verb1)}", f"{_MIDDLE} {_check_verb(verb2)}", _SUFFIX


def rebuild(verb1: str, desc1: str, verb2: str, desc2: str) -> str:
    """The canonical template text for two (possibly denoised) descriptions (section 3.2.1).

    Args:
        verb1: verb of the first half (one of :data:`VERBS`).
        desc1: object description of the first image (e.g. with ``[MASK]`` words); whitespace is normalised,
            so ``desc1.split()`` and any word-level labels aligned to it are unchanged.
        verb2: verb of the second half.
        desc2: object description of the second image.

    Returns:
        ``"The difference between the two images is that the first image {verb1} {desc1}, while the second image
        {verb2} {desc2}."``

    Raises:
        ValueError: a verb outside :data:`VERBS` or an empty description.
    """
    d1, d2 = normalize_whitespace(desc1), normalize_whitespace(desc2)
    if not d1 or not d2:
        raise ValueError("both object descriptions must be non-empty")
    prefix, middle, suffix = segments(verb1, verb2)
    return f"{prefix} {d1}{middle} {d2}{suffix}"


# ---------------------------------------------------------------------------------------------------------------
# Table 14 statistics
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class SourceStats:
    """One row of Table 14 plus the rejections of appendix D.2.

    ``total`` counts accepted descriptions; ``unique`` counts distinct accepted texts (exact match after whitespace
    normalisation, case-sensitive); ``repetition = total - unique``; ``repetition_ratio = repetition / total``.
    """

    total: int = 0
    unique: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    @property
    def repetition(self) -> int:
        return self.total - self.unique

    @property
    def repetition_ratio(self) -> float:
        return self.repetition / self.total if self.total else 0.0

    @property
    def n_rejected(self) -> int:
        return sum(self.rejected.values())

    @property
    def rejection_ratio(self) -> float:
        seen = self.total + self.n_rejected
        return self.n_rejected / seen if seen else 0.0


class TemplateStats:
    """Streams descriptions and keeps Table 14's statistics per source, plus rejection counts by reason.

    Memory is 16 bytes of hash per distinct description, so 770K descriptions fit in well under 200 MB.
    The ``"overall"`` row sums the per-source rows, as Table 14 does (its IP+CC+SP unique count 744,128 is the sum
    297,485 + 440,204 + 6,439 of the per-source counts): a sentence repeated across two sources counts as unique
    in each.
    """

    OVERALL = "overall"

    def __init__(self) -> None:
        self._rows: dict[str, SourceStats] = {}
        self._seen: dict[str, set[bytes]] = {}

    def add(self, description: str, source: str = "all", free_text: bool = False) -> RejectReason | None:
        """Validates and counts one description (``free_text``: as :func:`validate` does); returns its
        :class:`RejectReason` or ``None`` if accepted."""
        row = self._rows.setdefault(source, SourceStats())
        reason = validate(description, free_text)
        if reason is not None:
            row.rejected[reason.value] = row.rejected.get(reason.value, 0) + 1
            return reason
        row.total += 1
        digest = hashlib.blake2b(normalize_whitespace(description).encode("utf-8"), digest_size=16).digest()
        seen = self._seen.setdefault(source, set())
        if digest not in seen:
            seen.add(digest)
            row.unique += 1
        return None

    def update(self, items: Iterable[tuple[str, str]]) -> None:
        """Adds ``(source, description)`` pairs."""
        for source, description in items:
            self.add(description, source)

    def rows(self) -> dict[str, SourceStats]:
        """Per-source rows (in first-seen order) followed by the ``"overall"`` row."""
        out = dict(self._rows)
        overall = SourceStats()
        for row in self._rows.values():
            overall.total += row.total
            overall.unique += row.unique
            for k, v in row.rejected.items():
                overall.rejected[k] = overall.rejected.get(k, 0) + v
        out[self.OVERALL] = overall
        return out

    def format_table(self) -> str:
        """Table 14's columns plus rejections. Ratios are truncated to two decimals, as Table 14 prints them
        (14,014 / 311,499 = 4.499% is printed 4.49%)."""
        reasons = [r.value for r in RejectReason]
        head = f"{'source':<12}{'total':>10}{'unique':>10}{'repetition':>12}{'ratio':>9}{'rejected':>10}  by reason"
        lines = [head]
        for name, row in self.rows().items():
            ratio = int(row.repetition_ratio * 10000) / 100
            by_reason = ", ".join(f"{r}={row.rejected[r]}" for r in reasons if row.rejected.get(r))
            lines.append(
                f"{name:<12}{row.total:>10,}{row.unique:>10,}{row.repetition:>12,}{ratio:>8.2f}%{row.n_rejected:>10,}"
                f"  {by_reason or '-'}"
            )
        return "\n".join(lines)
