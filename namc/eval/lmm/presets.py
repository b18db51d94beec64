"""The prompts of ``namc eval lmm`` and ``namc eval judge``: named presets shipped as text files, or files of yours.

A prompt file is plain UTF-8 text sent as written, except that the lines starting with ``#`` at its top are a
comment (where the words come from) and are not sent. Slots, filled in one pass from left to right:

- ``{caption}``: in a captioning prompt, the first occurrence is the pair's ``caption1``, the second its
  ``caption2``, a final period dropped (the prompt writes one; a pair without them fails as ``missing_field``);
- ``{template}``: the section 3.1.2 template (:data:`namc.text.template.TEMPLATE`);
- ``{references}`` and ``{prediction}``: in a judge prompt, the reference captions (one per line after ``- ``) and
  the caption judged.

Any other brace (a JSON example in a judge prompt) is left as it is.

Captioning presets (:data:`CAPTION_PRESETS`), one per setting of the NAMC paper:

- ``table13``: the zero-shot question for a multimodal LLM that is not fine-tuned (Table 13). The paper does not
  print the question it asked; the preset is the one it prints for asking Qwen2-VL-7B-Instruct for a change
  description without a template (appendix B.2, the "conventional" approach of Table 11), verbatim;
- ``d2_template``: appendix D.2's instruction without its two caption sentences (a benchmark pair has no per-image
  captions), so the LLM writes the templated implicit-change description namc is pre-trained on;
- ``d2_cc3m``: appendix D.2's CC3M instruction verbatim, for a pair list whose pairs carry ``caption1``/``caption2``.

The judge's prompt (:data:`JUDGE_PRESET`) is ours: the paper has no change-level judge.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from pathlib import Path

from namc.text.template import TEMPLATE

__all__ = [
    "CAPTION_PRESETS",
    "JUDGE_PRESET",
    "Prompt",
    "SlotError",
    "fill_slots",
    "load_prompt",
]

#: preset name -> file in namc/eval/lmm/prompts
CAPTION_PRESETS: dict[str, str] = {
    "table13": "table13_zero_shot.txt",
    "d2_template": "d2_template.txt",
    "d2_cc3m": "d2_cc3m.txt",
}
JUDGE_PRESET = "judge.txt"
_SLOT = re.compile(r"\{(caption|template|references|prediction)\}")
_MAX_PROMPT_CHARS = 100_000  # a prompt file is a page of text; a larger file is a mistake


class SlotError(ValueError):
    """A prompt slot without a value (the message names the slot)."""


class Prompt:
    """A prompt's text, where it came from, and the SHA-256 of the text (what a cache and a run are keyed by).

    Args:
        text: the prompt, comment lines removed.
        name: the preset's name or the file's path.
    """

    def __init__(self, text: str, name: str) -> None:
        self.text = text
        self.name = name
        self.sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()

    def slots(self) -> set[str]:
        """The slot names the text uses."""
        return set(_SLOT.findall(self.text))


def _strip_comment(text: str) -> str:
    lines = text.splitlines()
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "\n".join(lines).strip()


def load_prompt(preset: str | None = None, file: str | Path | None = None, judge: bool = False) -> Prompt:
    """A preset's prompt, or a prompt file's.

    Args:
        preset: a name of :data:`CAPTION_PRESETS` (ignored for ``judge``).
        file: a prompt file of one's own (wins over ``preset``).
        judge: the judge's preset.

    Raises:
        ValueError: an unknown preset, or a file that is missing, not UTF-8, too large or empty, in one line.
    """
    if file is not None:
        path = Path(file)
        try:
            raw = path.read_bytes()
        except OSError as err:
            raise ValueError(f"prompt file {path}: cannot read ({err.strerror})") from None
        if len(raw) > _MAX_PROMPT_CHARS:
            raise ValueError(f"prompt file {path}: {len(raw):,} bytes, over the limit of {_MAX_PROMPT_CHARS:,}")
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise ValueError(f"prompt file {path}: not UTF-8 ({err.reason} at byte {err.start})") from None
        name = str(path)
    else:
        if judge:
            name = JUDGE_PRESET.removesuffix(".txt")
            filename = JUDGE_PRESET
        elif preset in CAPTION_PRESETS:
            name, filename = preset, CAPTION_PRESETS[preset]
        else:
            raise ValueError(f"unknown prompt preset {preset!r}; choose from {sorted(CAPTION_PRESETS)}")
        text = resources.files("namc.eval.lmm").joinpath("prompts", filename).read_text(encoding="utf-8")
    text = _strip_comment(text)
    if not text:
        raise ValueError(f"prompt {name}: no text after its comment lines")
    return Prompt(text, name)


def fill_slots(text: str, captions: tuple[str | None, str | None] = (None, None), **values: str) -> str:
    """``text`` with its slots filled in one left-to-right pass (a value holding ``{caption}`` is not re-expanded).

    Args:
        text: a prompt's text.
        captions: the first and the second image's captions, for the first and second ``{caption}``.
        **values: ``references``, ``prediction`` (``template`` defaults to :data:`TEMPLATE`).

    Raises:
        SlotError: a slot without a non-empty value.
    """
    values.setdefault("template", TEMPLATE)
    queue = list(captions)

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "caption":
            value = queue.pop(0) if queue else None
        else:
            value = values.get(name)
        if not isinstance(value, str) or not value.strip():
            raise SlotError(
                f"the prompt's {{{name}}} slot has no value" + (" (caption1/caption2)" * (name == "caption"))
            )
        if name == "references":
            return value.strip()
        text = " ".join(value.split())
        # the prompt puts ". " after a caption itself (as namc.curate.prompts does): "a cube." would read "a cube.."
        return text[:-1].rstrip() if name == "caption" and text.endswith(".") else text

    return _SLOT.sub(one, text)
