"""The texts of the Img-Diff engine (``002``): the paper's where it prints them, namc's wording where it does not.

Printed in the supplementary material (quoted verbatim):

- :data:`REMOVAL_PROMPT`: the inpainting prompt of object removal (section 19.2.3);
- :data:`CHOICE_QUESTION`: the red-box multiple-choice question of object removal (Figure 10's JSON, and
  section 19.2.1: "which image has the object related to 'DESCRIPTION' within the red bounding box?").

The main text's instructions to the LLM (object replacement, section 3.2) and to the MLLM (region captions, the
removed object's description) are not printed in the supplementary; namc's own wording below asks for the same
outputs in a form a program can check (a JSON object, one noun phrase).
"""

from __future__ import annotations

import re

from namc.jsonl import loads

__all__ = [
    "CHOICE_QUESTION",
    "DIFFERENCE_PROMPT",
    "REGION_CAPTION_PROMPT",
    "REMOVAL_DESCRIBE_PROMPT",
    "REMOVAL_PROMPT",
    "REPLACE_PROMPT",
    "AnswerError",
    "choice_question",
    "clean_phrase",
    "parse_replacement",
]

#: section 19.2.3: "The prompt is "background, nothing, 8k.""
REMOVAL_PROMPT = "background, nothing, 8k"

#: Figure 10 (object removal data), the human turn, verbatim; ``{description}`` is the erased object's description
CHOICE_QUESTION = (
    "Analyse the left image and the right image (separated by the black vertical bar). Which image has the object "
    'related to "{description}" within the red bounding box?\nA. the left image\nB. the right image\nAnswer with '
    "the option's letter from the given choices directly."
)

#: namc's wording of the object-replacement request (section 3.2: an LLM replaces one object name in a caption)
REPLACE_PROMPT = (
    "Replace one object in the image caption below with a different object, so that the new caption describes a "
    "plausible image that differs from the original only in that object. Change nothing else in the caption.\n"
    'Answer with one JSON object and nothing else: {{"original": "<the object name replaced, as written in the '
    'caption>", "replacement": "<the new object name>", "caption": "<the new caption>"}}\n'
    "Caption: {caption}"
)

#: namc's wording of the region caption (Difference Captions Generator, stage 1: a content caption of one box)
REGION_CAPTION_PROMPT = (
    "Describe the main object in this image region in one short noun phrase (for example: a red apple on a plate). "
    "Answer with the phrase only."
)

#: namc's wording of the difference caption (Difference Captions Generator, stage 2: the two images and the region's
#: two captions -> one sentence, as Table 4's example: "The difference is that the teapot in the right image is made
#: of glass, whereas the teapot in the left image is made of porcelain.")
DIFFERENCE_PROMPT = (
    "The first image and the second image are the same except inside the bounding box {bbox} (fractions of the width "
    "and height: [x_min, y_min, x_max, y_max]). There, the first image shows {caption1} and the second image shows "
    "{caption2}. Describe the difference between the two images in that region in one sentence."
)

#: namc's wording of the erased object's description (section 19.2.4: the MLLM gets the box coordinates)
REMOVAL_DESCRIBE_PROMPT = (
    "Describe the object inside the bounding box {bbox} of this image (coordinates are fractions of the width and "
    "height: [x_min, y_min, x_max, y_max]) in one short noun phrase. Answer with the phrase only."
)

_REFUSAL = re.compile(r"^(i'?m sorry|i am sorry|sorry|i can(?:'|no)t|i cannot|i am unable|i'm unable|as an ai)\b", re.I)


class AnswerError(ValueError):
    """An answer that cannot be used; ``kind``: ``empty_answer``, ``refusal`` or ``malformed_answer``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def clean_phrase(text: str, max_words: int = 24) -> str:
    """One noun phrase from an MLLM's answer: the first line, quotes and a final full stop dropped.

    Raises:
        AnswerError: empty, a refusal, or longer than ``max_words`` words.
    """
    line = next((x for x in text.strip().splitlines() if x.strip()), "").strip().strip("\"'`").rstrip(".").strip()
    if not line:
        raise AnswerError("empty_answer", "the answer is empty")
    if _REFUSAL.match(line):
        raise AnswerError("refusal", f"the server refused: {line[:80]!r}")
    if len(line.split()) > max_words:
        raise AnswerError("malformed_answer", f"not one phrase ({len(line.split())} words)")
    return line


def parse_replacement(text: str, caption: str) -> tuple[str, str, str]:
    """``(original, replacement, new caption)`` of an answer to :data:`REPLACE_PROMPT`.

    Raises:
        AnswerError: empty, a refusal, not the JSON object asked for, or a replacement that changes nothing or does
            not occur in the caption.
    """
    body = text.strip()
    if not body:
        raise AnswerError("empty_answer", "the answer is empty")
    if _REFUSAL.match(body):
        raise AnswerError("refusal", f"the server refused: {body[:80]!r}")
    start, end = body.find("{"), body.rfind("}")
    try:
        obj = loads(body[start : end + 1]) if 0 <= start < end else None
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or not all(
        isinstance(obj.get(k), str) for k in ("original", "replacement", "caption")
    ):
        raise AnswerError("malformed_answer", f"not the JSON object asked for: {body[:80]!r}")
    original, replacement, new = (obj[k].strip() for k in ("original", "replacement", "caption"))
    if not original or not replacement or not new or new.lower() == caption.strip().lower():
        raise AnswerError("no_replacement", "the new caption is the old one")
    if original.lower() not in caption.lower() or original.lower() == replacement.lower():
        raise AnswerError("no_replacement", f"{original!r} is not an object of the caption, or was not replaced")
    return original, replacement, new


def choice_question(description: str) -> str:
    """Figure 10's question for one erased object."""
    return CHOICE_QUESTION.format(description=description)
