"""MED's prompts (seed paper ``004``, appendix E, Figures 7-17), the eleven composition categories, and the parsers
of the answers the prompts ask for.

The prompt texts are copied from the paper's figures; each constant names its figure. Where the printed text is
damaged, the repair is the least that restores what the figure shows, and the constant's comment says what it is:

- Figure 7 is printed as one paragraph; its Markdown layout (headers and bullets on their own lines, which the
  prompt itself refers to: "bold section headers and bullet points as shown above") is restored line by line.
- Figure 8's ``Description of the image: {}`` is named ``{caption}`` here; the escapes ``\\n`` that the figure shows
  inside its answer format (and Figure 11's) are newlines, as the Python string literals the figures quote make them.
- Figure 9 lost the ``-`` of one bullet ("Naturally integrating ...").
- Figure 13 elides part of its text with ``.....``; the elision is left out. Its ``{second_edit_prompt}`` ("Second
  Description") is filled with the edited image's caption (Step 2 of section 3.2): the figure's own guidelines speak
  of "Caption 1" and "Caption 2", and the first judge (Figure 12) already compares with the edit prompt.
- Figure 16 has no slot for its input: the figure's text is sent as the system message and the difference as the
  user message, in the words of the figure's own example (``Input difference description: "..."``).
- Figure 17 opens with two quote marks instead of three, closes ``"{difference_description}'`` with a single quote,
  and runs its numbered list and its output format together on one line; the quotes are matched and the line breaks
  restored.

Placeholders are filled with :func:`fill` (plain replacement, so braces in a caption are never interpreted).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "CATEGORIES",
    "CATEGORY_DESCRIPTIONS",
    "CATEGORY_PROMPT_NAMES",
    "FIG7_FILTER",
    "FIG8_INSTRUCTION",
    "FIG9_COMPLETE_CAPTION",
    "FIG10_EDITED_CAPTION",
    "FIG11_DIFFERENCE",
    "FIG12_JUDGE",
    "FIG13_SECOND_JUDGE",
    "FIG15_QUESTIONS",
    "FIG16_INPUT",
    "FIG16_RIGHT_ANSWER",
    "FIG17_WRONG_ANSWERS",
    "AnswerError",
    "category_of",
    "fill",
    "parse_caption",
    "parse_completed_caption",
    "parse_difference",
    "parse_filter",
    "parse_instruction",
    "parse_right_answer",
    "parse_wrong_answers",
    "parse_yes_no",
]

#: The eleven composition categories, by the short names of Table 1 and of the released benchmark's ``type`` field
#: (``"Part"``, ``"Universality"``: Figures 5-6), in the order of Figure 8.
CATEGORIES: tuple[str, ...] = (
    "Object",
    "Attribute",
    "Scene",
    "Spatial",
    "Action",
    "Part",
    "Counting",
    "Differentiation",
    "Comparison",
    "Negation",
    "Universality",
)

#: The names Figures 8 and 11 list the categories by.
CATEGORY_PROMPT_NAMES: dict[str, str] = {
    **{c: c for c in CATEGORIES},
    "Spatial": "Spatial Relation",
    "Action": "Action Relation",
    "Part": "Part Relation",
}

#: Each category's description, as Figures 8 and 11 print it (Figure 10's ``{type description}``).
CATEGORY_DESCRIPTIONS: dict[str, str] = {
    "Object": "Adding or removing entities (people, animals, food, vehicles, objects)",
    "Attribute": "Changing visual properties (color, material, size, shape)",
    "Scene": "Modifying backgrounds or settings",
    "Spatial": "Altering physical arrangements (right, left, on top, below, inside)",
    "Action": "Changing interactions between entities",
    "Part": "Modifying part-whole relationships (body parts, clothing, accessories)",
    "Counting": "Adjusting quantity of entities",
    "Differentiation": "Distinguishing objects by attributes",
    "Comparison": "Changing relative characteristics",
    "Negation": "Removing elements",
    "Universality": "Applying changes to all members of a group",
}

# Figure 7 (Qwen-2.5-VL-72B filters editable images); the layout restored, the words as printed.
FIG7_FILTER = """\
Please evaluate the following sample--which includes an image and accompanying text (question-answer pair or \
description)--based on the criteria listed below. Your response must STRICTLY follow the format of the provided \
example. For each criterion, provide a brief analysis, and conclude with a clear "Yes" or "No" recommendation.
Caption of the image: {caption}
## **Evaluation**
**Final Recommendation:** **Yes** or **No**
**1. Image quality:**
- **Clarity:** [Evaluate if the image is sharp, free of blur, and low in noise]
- **Main Subject:** [Evaluate if there is a clearly identifiable primary subject in the image]
- **Background Complexity:** [Evaluate whether the background is simple and free of excessive clutter]
**2. Text_Clarity (Description):**
- **Specifity:** [Evaluate if the description is clear, specific, and unambiguous]
- **Uniquenes:** [Evaluate if the text provides straightforward, unique information without ambiguity]
**3. Editing Potential:**
- **Identifiable Editable Elements:** [Evaluate if the image contains clearly identifiable objects or attributes \
that can be modified]
- **Impact_on_Text_Accuracy:** [Evaluate whether applying an edit would make the original text incorrect]
**4. Interference Factors:**
- **Visual_Distractions:** [Evaluate whether there are distracting elements or complex scenes that might hinder a \
clear edit]
- **Subjectivity in Text:** [Evaluate if the text contains subjective aspects that could interfere with evaluation]
**Explanation:** [Provide a brief explanation supporting your recommendation]

IMPORTANT: Your answer MUST follow this EXACT format, with bold section headers and bullet points as shown above. \
Your Final Recommendation must clearly state either "**Yes**" or "**No**" in bold."""

# Figure 8 (Qwen-2.5-VL-72B writes one editing instruction of one category).
FIG8_INSTRUCTION = """\
You are a professional image prompt engineer specializing in image editing instructions.

Analyze the provided image and any accompanying text, then generate a clear editing prompt based on what you see.

Description of the image: {caption}

Your editing prompt must follow this exact structure: "Hi, This is a photo of [brief description of the current \
image]. Can you [specific editing instruction] and output the image?"

Choose an appropriate editing instruction from these composition categories:

BASIC COMPOSITIONS:

- Object: Adding or removing entities (people, animals, food, vehicles, objects)

- Attribute: Changing visual properties (color, material, size, shape)
- Scene: Modifying backgrounds or settings
- Spatial Relation: Altering physical arrangements (right, left, on top, below, inside)
- Action Relation: Changing interactions between entities
- Part Relation: Modifying part-whole relationships (body parts, clothing, accessories)

ADVANCED COMPOSITIONS:

- Counting: Adjusting quantity of entities

- Differentiation: Distinguishing objects by attributes
- Comparison: Changing relative characteristics
- Negation: Removing elements
- Universality: Applying changes to all members of a group

Examples:

- "Hi, This is a photo of a dog with biscuits on its head. Can you subtract one biscuit on its head and output the \
image?"

- "Hi, This is a picture of a highway. Can you add two vehicles on its left side and output the image?"

- "Hi, This is a photo of a table. Can you only move the phone out of this scene and output the image?"

Based solely on what you observe in the provided image, first indicate which composition type you're using \
(Prioritize COMPOSITIONS other than 'Object'. Only choose 'Object' if other types cannot effectively demonstrate the \
editing possibilities of the image.), then create the appropriate editing prompt.

Your response should be in this format:

Type: [composition type]
## Prompt: [your editing prompt]
"""

# Figure 9 (Qwen-2.5-VL-72B completes the original image's caption; Step 1 of section 3.2).
FIG9_COMPLETE_CAPTION = """\
Given an image, its current caption, and an edit prompt, your task is to determine whether the caption fully \
incorporates all information from the edit prompt.

If not, you need to update the caption to include any missing information.

Image: [The image will be provided] Current Caption: {original_description} Edit Prompt: {edit_prompt}

IMPORTANT: The complete caption should ONLY describe what is ACTUALLY VISIBLE in the image. DO NOT add information \
from the edit prompt if those elements don't actually exist in the image.

Follow these steps:

- 1. Carefully examine the image and understand the current caption
- 2. Identify all new or modified information requested in the edit prompt
- 3. Verify if each element from the edit prompt is actually visible in the image
- 4. Check whether the current caption already contains all relevant and visible information from the edit prompt
- 5. If the caption FULLY incorporates all relevant information from the edit prompt, respond with:
- "Caption is complete. No updates needed."
- 6. If the caption is MISSING any relevant information that is ACTUALLY VISIBLE in the image, create an updated \
caption by:
- Preserving relevant parts of the original caption
- Naturally integrating ONLY the missing information that is actually visible in the image
- Maintaining a coherent, fluent, and accurate description
- Ensuring the updated caption accurately describes what is visible in the image
- EXCLUDING any information from the edit prompt that is not actually present in the image

Provide only the updated caption without any explanations, or confirm that no updates are needed (By Answer exactly \
"NO UPDATE")."""

# Figure 10 (Qwen-2.5-VL-72B captions the edited image; Step 2 of section 3.2).
FIG10_EDITED_CAPTION = """\
Your task is generating an accurate caption for the given image, using the following information as context:

Reference description: {description} Key aspect to focus on: {type} ({type description})

Your task is to:

- 1. Carefully examine the actual image content
- 2. Note any differences between the image and the reference description, especially regarding the {type} aspects
- 3. Create an accurate caption that accurately describes ONLY what is truly visible in the image

IMPORTANT:

- Your description must be based solely on what is actually visible in the image
- Do not include details from the reference description that aren't present in the image
- Pay special attention to accurately describing the {type} elements
- Be precise and objective in your description

Please provide your accurate caption in English, beginning with "CAPTION:"."""

# Figure 11 (the difference description from the two captions; Step 3 of section 3.2: a text-only LLM).
FIG11_DIFFERENCE = """\
Given these two image captions and a specific type of difference:

Caption 1: {complete_caption} Caption 2: {new_caption}

Type class:

- Object: Adding or removing entities (people, animals, food, vehicles, objects)
- Attribute: Changing visual properties (color, material, size, shape)
- Scene: Modifying backgrounds or settings
- Spatial Relation: Altering physical arrangements (right, left, on top, below, inside)
- Action Relation: Changing interactions between entities
- Part Relation: Modifying part-whole relationships (body parts, clothing, accessories)
- Counting: Adjusting quantity of entities
- Differentiation: Distinguishing objects by attributes
- Comparison: Changing relative characteristics
- Negation: Removing elements
- Universality: Applying changes to all members of a group

Identify only the most obvious differences between these captions and choose a Type class the difference belong to.

Respond with just the key differences, using one sentence and one type class Please strctly follow this \
format:"TYPE:XXX
DIFFERENCE:XXXX\""""

# Figure 12 (the judge: does the difference match the edit prompt).
FIG12_JUDGE = """\
Determine if the described difference matches the edit prompt:

Edit Prompt: {edit_prompt} Described Difference: {difference description}

Assess whether the described difference correctly reflects what was requested in the edit prompt.

Answer with 1. Only "Yes" if they match. No explanation needed. 2. Only "No" if there's no obvious change. No \
explanation needed."""

# Figure 13 (the second judge; the figure's "....." elision left out, see the module docstring).
FIG13_SECOND_JUDGE = """\
Your task is determine if the 'Described Difference' matches the 'Second Description':

Second Description: {second_edit_prompt} Described Difference: {difference_description}

IMPORTANT GUIDELINES FOR EVALUATION:

- "Caption 1" refers to the first image description, and "Caption 2" refers to the second image description.

- FOCUS ON MEANING, NOT EXACT WORDING: Synonyms, paraphrasing, and alternative expressions that convey the same \
meaning should be considered equivalent.

- ALLOW FOR VARIATION: The difference description may use different phrasing or perspective than the second \
description while still being correct.

- ACCEPT STRUCTURAL DIFFERENCES: Different sentence structures, word order, or narrative approaches that \
communicate the same content are valid.

- RECOGNIZE CONCEPTUAL MATCHES: When categories, concepts, or observations are semantically similar (even if using \
different terminology), treat them as matches.

- EVALUATE BASED ON CORE CHANGES: If both descriptions identify the same fundamental changes between images, even \
through different expressions, consider them aligned.

- BE GENEROUS IN INTERPRETATION: When in doubt, lean toward accepting descriptions that capture the essential \
elements, even if details vary.

Answer with 1. Only "Yes" if they match. No explanation needed. 2. Only "No" if there's no obvious change. No \
explanation needed."""

#: Figure 15: the benchmark's nine question variations, as printed.
FIG15_QUESTIONS: tuple[str, ...] = (
    "What is the primary difference between the two images?",
    "What is the main distinction between these two images?",
    "What's the key difference between these two pictures?",
    "Can you identify the principal disparity between these two images?",
    "How do these two images primarily differ from each other?",
    "What's the most significant contrast between these two photos?",
    "What distinguishes one image from the other?",
    "What is the fundamental difference you can see between these two visuals?",
    "What's the most notable variation between these two pictures?",
)

# Figure 16 (GPT-4o writes the right answer); sent as the system message, the difference as the user message.
FIG16_RIGHT_ANSWER = """\
You are analyzing the differences between two images described by captions. Your task is to generate a clear \
answer that describes how the second image differs from the first image.

Input: A difference description that compares elements between two images. Output: A precise statement that \
explains how the second image (Caption 2) differs from the first image (Caption 1).

Your output MUST follow this exact format:

ANSWER: [Your description of how the second image differs from the first image]

Example:

Input difference description: "The deer on the far right is grazing with his head facing toward the grass in the \
first caption, while in the second caption, it stands alone facing slightly to the right."

Output:

ANSWER: In the second image, the deer on the far right is standing alone facing slightly to the right, whereas in \
the first image, the deer was grazing with its head facing toward the grass.

Important requirements:

1. Always frame your answer to describe how the second image differs from the first image

2. Use precise language to describe the specific differences

3. Begin with "In the second image" to maintain clarity

4. Always follow the ANSWER: format exactly as shown"""

#: Figure 16's input line (the figure's own example wording).
FIG16_INPUT = 'Input difference description: "{difference_description}"'

# Figure 17 (GPT-4o writes three distractors); quotes matched and line breaks restored.
FIG17_WRONG_ANSWERS = """\
Please create exactly 3 completely incorrect statements about the difference between two images that are similar \
to the correct answer but wrong in subtle ways.

Context:

- The first image (Caption 1) and second image (Caption 2) show the same scene with a specific difference
- The actual difference is: "{difference_description}"
- The correct statement that describes this difference is: "{right_answer}"

Your task:

- 1. Create exactly 3 statements that are deceptively similar to the correct answer but entirely incorrect
- 2. Each wrong answer should be closely related to the actual difference, but contain crucial errors
- 3. Make the wrong answers similar enough to the right answer that they could confuse someone
- 4. The statements should sound plausible and require careful attention to distinguish from the correct answer
- 5. Each wrong answer should suggest a specific difference between "the first image" and "the second image"
- 6. Use similar wording, structure, and level of detail as the correct answer

Output format:

wrong_answer1: [Your first wrong answer here]
wrong_answer2: [Your second wrong answer here]
wrong_answer3: [Your third wrong answer here]

Remember, your statements should be subtly wrong in ways that make them challenging to distinguish from the correct \
answer!"""


def fill(template: str, **values: str) -> str:
    """``template`` with each ``{name}`` replaced by its value (``type_description`` fills ``{type description}``,
    ``difference_description`` also fills Figure 12's ``{difference description}``)."""
    for name, value in values.items():
        template = template.replace("{" + name + "}", value).replace("{" + name.replace("_", " ") + "}", value)
    return template


class AnswerError(ValueError):
    """An answer that does not follow its prompt's format; ``reason`` is the counter key of the rejection."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _clean(text: str) -> str:
    """Strips whitespace, Markdown emphasis and enclosing quotes or brackets from one answer field."""
    text = text.strip().strip("*").strip()
    while len(text) >= 2 and text[0] + text[-1] in ('""', "''", "[]", "``", "\u201c\u201d"):
        text = text[1:-1].strip()
    return text


def category_of(name: str) -> str | None:
    """The category a name means (``"Spatial Relation"``, ``"spatial"``, ``"**Counting**"``), or None."""
    key = re.sub(r"[^a-z ]", "", name.lower()).strip()
    key = re.sub(r"\s+relation(ship)?s?$", "", key).strip()
    aliases = {"count": "Counting", "attr": "Attribute", "neg": "Negation", "univ": "Universality"}
    for cat in CATEGORIES:
        if key == cat.lower():
            return cat
    return aliases.get(key)


_FINAL_RE = re.compile(r"final\s+recommendation\s*:?\s*\**\s*:?\s*\**\s*(yes|no)\b", re.IGNORECASE)


def parse_filter(text: str) -> bool:
    """Figure 7's verdict: True for a strict "Yes" as the Final Recommendation.

    Raises:
        AnswerError: ``filter_unparsed``: no Final Recommendation of Yes or No in the answer.
    """
    m = _FINAL_RE.search(text)
    if m is None:
        raise AnswerError("filter_unparsed", "no '**Final Recommendation:** **Yes**/**No**' in the answer")
    return m.group(1).lower() == "yes"


_TYPE_RE = re.compile(r"^\W*type\W*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_PROMPT_RE = re.compile(r"prompt\s*\**\s*:\s*(.+)", re.IGNORECASE | re.DOTALL)
_CORE_RE = re.compile(r"\bcan you\s+(.+?)\s+and output the image\b", re.IGNORECASE | re.DOTALL)


def parse_instruction(text: str) -> tuple[str, str, str]:
    """Figure 8's answer -> ``(category, prompt, core)``: the category, the whole editing prompt ("Hi, This is a photo
    of ... Can you ... and output the image?") and its ``[specific editing instruction]`` (the prompt itself when it
    lacks the frame).

    Raises:
        AnswerError: ``malformed_instruction`` (no ``Type:`` or ``Prompt:`` line), ``unknown_category``.
    """
    t = _TYPE_RE.search(text.replace("\\n", "\n"))
    p = _PROMPT_RE.search(text.replace("\\n", "\n"))
    if t is None or p is None:
        raise AnswerError("malformed_instruction", "the answer lacks a 'Type:' or a '## Prompt:' line")
    raw_type = t.group(1).split("##")[0]
    category = category_of(_clean(raw_type))
    if category is None:
        raise AnswerError("unknown_category", f"type {_clean(raw_type)[:60]!r} is none of the 11 categories")
    prompt = _clean(" ".join(p.group(1).split()))
    if not prompt:
        raise AnswerError("malformed_instruction", "the editing prompt is empty")
    core = _CORE_RE.search(prompt)
    return category, prompt, _clean(core.group(1)) if core else prompt


_NO_UPDATE = ("no update", "caption is complete. no updates needed", "caption is complete")


def parse_completed_caption(text: str, original: str) -> tuple[str, bool]:
    """Figure 9's answer -> ``(complete caption, updated)``: the original caption when the answer is "NO UPDATE" (or
    the figure's "Caption is complete. No updates needed."), else the updated caption.

    Raises:
        AnswerError: ``empty_answer``.
    """
    cleaned = _clean(text)
    if not cleaned:
        raise AnswerError("empty_answer", "no caption in the answer")
    if cleaned.lower().rstrip(".").strip() in _NO_UPDATE:
        return original, False
    cleaned = re.sub(r"^(updated|complete)\s+caption\s*:\s*", "", cleaned, flags=re.IGNORECASE)
    return _clean(cleaned), True


def parse_caption(text: str) -> str:
    """Figure 10's answer -> the caption after ``CAPTION:``.

    Raises:
        AnswerError: ``malformed_caption`` (no ``CAPTION:``), ``empty_answer``.
    """
    m = re.search(r"caption\s*\**\s*:\s*(.+)", text, re.IGNORECASE | re.DOTALL)
    if not text.strip():
        raise AnswerError("empty_answer", "no caption in the answer")
    if m is None:
        raise AnswerError("malformed_caption", "the answer does not begin with 'CAPTION:'")
    caption = _clean(" ".join(m.group(1).split()))
    if not caption:
        raise AnswerError("empty_answer", "'CAPTION:' is followed by nothing")
    return caption


def parse_difference(text: str) -> tuple[str, str]:
    """Figure 11's answer ``TYPE:XXX\\nDIFFERENCE:XXXX`` -> ``(category, difference sentence)``.

    Raises:
        AnswerError: ``malformed_difference``, ``unknown_type``.
    """
    text = text.replace("\\n", "\n")
    t = _TYPE_RE.search(text)
    d = re.search(r"difference\W*:\s*(.+)", text, re.IGNORECASE | re.DOTALL)
    if t is None or d is None:
        raise AnswerError("malformed_difference", "the answer is not 'TYPE:...' and 'DIFFERENCE:...'")
    category = category_of(_clean(t.group(1)))
    if category is None:
        raise AnswerError("unknown_type", f"type {_clean(t.group(1))[:60]!r} is none of the 11 categories")
    difference = _clean(" ".join(d.group(1).split()))
    if not difference:
        raise AnswerError("malformed_difference", "the difference sentence is empty")
    return category, difference


def parse_yes_no(text: str) -> bool:
    """Figures 12-13's one-word verdict.

    Raises:
        AnswerError: ``judge_unparsed``: the answer starts with neither Yes nor No.
    """
    m = re.match(r"\W*(yes|no)\b", text, re.IGNORECASE)
    if m is None:
        raise AnswerError("judge_unparsed", f"expected 'Yes' or 'No', got {text.strip()[:60]!r}")
    return m.group(1).lower() == "yes"


def parse_right_answer(text: str) -> str:
    """Figure 16's ``ANSWER: ...`` -> the answer sentence.

    Raises:
        AnswerError: ``malformed_answer``.
    """
    m = re.search(r"answer\s*\**\s*:\s*(.+)", text, re.IGNORECASE | re.DOTALL)
    answer = _clean(" ".join(m.group(1).split())) if m else ""
    if not answer:
        raise AnswerError("malformed_answer", "the answer has no 'ANSWER: ...'")
    return answer


def parse_wrong_answers(text: str, right: str) -> list[str]:
    """Figure 17's ``wrong_answer1: ... wrong_answer3: ...`` -> the three distractors, in order.

    Raises:
        AnswerError: ``malformed_distractors`` (not three), ``duplicate_option`` (a distractor equal to another or to
            the right answer).
    """
    parts = re.split(r"wrong[_ ]answer\s*([123])\s*\**\s*:", text, flags=re.IGNORECASE)
    found: dict[str, str] = {}
    for k in range(1, len(parts) - 1, 2):
        found.setdefault(parts[k], _clean(" ".join(parts[k + 1].split())))
    wrong = [found.get(k, "") for k in "123"]
    if not all(wrong):
        raise AnswerError("malformed_distractors", "the answer does not hold wrong_answer1, 2 and 3")
    return _distinct(wrong, right)


def _distinct(wrong: Sequence[str], right: str) -> list[str]:
    norm = [" ".join(w.lower().split()).rstrip(".") for w in (right, *wrong)]
    if len(set(norm)) != len(norm):
        raise AnswerError("duplicate_option", "a distractor repeats the right answer or another distractor")
    return list(wrong)
