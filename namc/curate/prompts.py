"""The prompts of the paper's description generation (section 3.1.2, appendix D.2), quoted exactly, in one place.

One request per image pair asks a multimodal LLM (the paper: Qwen2-VL-7B-Instruct) for a *fine-grained
implicit-change description* in the template of section 3.1.2. The instruction depends on the pair's source:

- **Spot-the-Diff** (:data:`STD_PROMPT`): adds the dataset's human sentence as ``{difference}``;
- **InstructPix2Pix** (:data:`IP2P_PROMPT`): adds the edit prompt as ``{instruction}``;
- **CC3M and any other source** (:data:`CC3M_PROMPT`, also printed in section 3.1.2): captions only.

Appendix B.2's **conventional** prompt (:data:`CONVENTIONAL_PROMPT`, Table 11's baseline) asks for the change in
free text, without a template and without captions, for a pair of any source (:func:`conventional_prompt`); its
answers are kept as written (``free_text`` records, :mod:`namc.data.corpus.records`).

``{caption}`` appears twice in each instruction: the first is the first image's fine-grained paragraph, the second
the second image's. ``{template}`` is :data:`namc.text.template.TEMPLATE` (section 3.1.2), quoted inside the
prompt's single quotes as the paper prints it.

Choices (the paper is silent on these):

- **Caption prompt.** The paper takes CC3M's paragraphs from LLaVA-ReCap and has "LLava generate the fine-grained
  paragraph" for Spot-the-Diff and InstructPix2Pix images without printing that prompt. :data:`CAPTION_PROMPT` is
  ours: it asks for one detailed paragraph, which is what LLaVA-ReCap's captions are.
- **Source names.** :func:`prompt_kind` maps ``std``/``spot_the_diff``/``sp`` to the Spot-the-Diff prompt and
  ``ip2p``/``instructpix2pix``/``ip`` and the source kinds ``ip2p_folder``/``ip2p_parquet`` (the name a source
  gets when none is given) to the InstructPix2Pix prompt (case- and ``-``/``_``-insensitive). A pair of any other
  source name that carries an edit ``instruction`` gets the InstructPix2Pix prompt, one with a human ``difference``
  the Spot-the-Diff prompt (its own name, say ``pix2pix``, must not lose what the pair has), and any other pair
  the CC3M prompt, as the issue asks ("CC3M and any other source").
- **Filling.** Placeholders are filled in one pass from left to right, so a caption that itself contains the text
  ``{caption}`` or ``{template}`` is inserted verbatim and never re-expanded. A value's surrounding whitespace is
  stripped and a final period removed, because the instruction already puts ". " after every slot
  (``"... described as: {caption}. Second image ..."``); without this a caption ending in "." would read "..".
"""

from __future__ import annotations

import re

from namc.text.template import TEMPLATE

__all__ = [
    "CAPTION_PROMPT",
    "CC3M_PROMPT",
    "CONVENTIONAL",
    "CONVENTIONAL_PROMPT",
    "IP2P_PROMPT",
    "PROMPTS",
    "STD_PROMPT",
    "TEMPLATE",
    "PromptError",
    "conventional_prompt",
    "describe_prompt",
    "fill",
    "prompt_kind",
]

#: Appendix D.2, Spot-the-Diff pairs. ``{difference}`` is "a summarized change description provided by Spot-the-Diff".
STD_PROMPT = (
    "Given the first and the second images, describe the difference between the two images. First image could be "
    "described as: {caption}. Second image could be described as: {caption}. Here is the difference: {difference}. "
    "Generate the description strictly according to the template: '{template}'."
)

#: Appendix D.2, InstructPix2Pix pairs. ``{instruction}`` is the edit prompt of InstructPix2Pix (the paper's text
#: calls it "{prompt}" in the sentence after the instruction; the instruction itself says ``{instruction}``).
IP2P_PROMPT = (
    "Given the first image and a prompt, the second image is generated based on them. Describe the difference "
    "between the two images. Here is the prompt: {instruction}. First image could be described as: {caption}. "
    "Second image could be described as: {caption}. Generate the description strictly according to the template: "
    "'{template}'."
)

#: Appendix D.2 and section 3.1.2, CC3M pairs (and, here, pairs of any other source).
CC3M_PROMPT = (
    "Given the first and the second images, describe the difference between the two images. First image could be "
    "described as: {caption}. Second image could be described as: {caption}. Generate the description strictly "
    "according to the template: '{template}'."
)

#: The prompt kind of :data:`CONVENTIONAL_PROMPT` (``namc curate describe --prompt conventional``).
CONVENTIONAL = "conventional"

#: Appendix B.2: the "conventional" prompt without a template (the Table 11 baseline); no slots.
CONVENTIONAL_PROMPT = (
    "Given the first and the second images, describe the change between the two images. What has changed from the "
    "first image to the second?"
)

#: Ours (see the module docstring): one fine-grained paragraph for one image, as LLaVA-ReCap provides for CC3M.
CAPTION_PROMPT = (
    "Describe this image in detail in one paragraph: the objects, their attributes (colour, size, material, text), "
    "their positions and relations, and the setting. Write plain prose without lists or headings."
)

#: prompt kind -> instruction.
PROMPTS: dict[str, str] = {"std": STD_PROMPT, "ip2p": IP2P_PROMPT, "cc3m": CC3M_PROMPT}

_KIND_OF_SOURCE = {
    "std": "std",
    "spotthediff": "std",
    "sp": "std",
    "ip2p": "ip2p",
    "ip2pfolder": "ip2p",
    "ip2pparquet": "ip2p",
    "instructpix2pix": "ip2p",
    "ip": "ip2p",
    "cc3m": "cc3m",
    "cc": "cc3m",
}
_SLOT_RE = re.compile(r"\{(caption|difference|instruction|template)\}")


class PromptError(ValueError):
    """A pair lacks a field its source's instruction needs (the message names the field)."""


def prompt_kind(source: str, instruction: object = None, difference: object = None) -> str:
    """``"std"``, ``"ip2p"`` or ``"cc3m"``: which instruction of appendix D.2 a pair of ``source`` gets; for a source
    name not in the table, the pair's own ``instruction`` or ``difference`` decides (module docstring)."""
    key = re.sub(r"[-_\s]", "", source.lower())
    if key in _KIND_OF_SOURCE:
        return _KIND_OF_SOURCE[key]
    if isinstance(instruction, str) and instruction.strip():
        return "ip2p"
    if isinstance(difference, str) and difference.strip():
        return "std"
    return "cc3m"


def _clean(value: str) -> str:
    text = " ".join(value.split())
    return text[:-1].rstrip() if text.endswith(".") else text


def fill(instruction: str, values: dict[str, list[str] | str]) -> str:
    """Fills the ``{...}`` slots of an instruction in one left-to-right pass.

    Args:
        instruction: one of :data:`PROMPTS`.
        values: slot name -> text, or a list of texts for a slot that occurs several times (``caption``: first
            image, second image). ``template`` defaults to :data:`TEMPLATE`.

    Raises:
        PromptError: a slot without a (non-empty) value.
    """
    queues = {k: list(v) if isinstance(v, list) else [v] for k, v in values.items()}
    queues.setdefault("template", [TEMPLATE])

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        queue = queues.get(name)
        if not queue:
            raise PromptError(f"the {name!r} slot has no value")
        value = queue.pop(0) if len(queue) > 1 else queue[0]
        if name == "template":
            return value
        if not isinstance(value, str) or not value.strip():
            raise PromptError(f"the {name!r} slot is empty")
        return _clean(value)

    return _SLOT_RE.sub(one, instruction)


def describe_prompt(
    source: str,
    caption1: str | None,
    caption2: str | None,
    instruction: str | None = None,
    difference: str | None = None,
) -> tuple[str, str]:
    """The appendix D.2 instruction for one pair, filled.

    Args:
        source: the pair's source name (chooses the instruction, :func:`prompt_kind`).
        caption1: fine-grained paragraph of the first image (required by every instruction).
        caption2: fine-grained paragraph of the second image.
        instruction: InstructPix2Pix's edit prompt (required for ``ip2p`` sources).
        difference: Spot-the-Diff's human sentence (required for ``std`` sources).

    Returns:
        ``(kind, text)``: the prompt kind and the filled instruction.

    Raises:
        PromptError: a required field is missing or empty, naming it (``caption1``, ``instruction``, ...).
    """
    kind = prompt_kind(source, instruction, difference)
    fields = {"caption1": caption1, "caption2": caption2}
    if kind == "std":
        fields["difference"] = difference
    if kind == "ip2p":
        fields["instruction"] = instruction
    for name, value in fields.items():
        if not isinstance(value, str) or not value.strip():
            hint = " (run `namc curate caption` or pass --captions)" if name.startswith("caption") else ""
            raise PromptError(f"a {kind} pair needs a non-empty {name!r}{hint}")
    values: dict[str, list[str] | str] = {"caption": [caption1, caption2]}  # type: ignore[list-item]
    if kind == "std":
        values["difference"] = difference  # type: ignore[assignment]
    if kind == "ip2p":
        values["instruction"] = instruction  # type: ignore[assignment]
    return kind, fill(PROMPTS[kind], values)


def conventional_prompt() -> tuple[str, str]:
    """``(kind, text)`` of appendix B.2's conventional request, the same for every pair: it names no caption,
    instruction or difference, and both images go with it."""
    return CONVENTIONAL, CONVENTIONAL_PROMPT
