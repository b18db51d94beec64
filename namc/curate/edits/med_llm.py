"""MED's chat stages of ``namc curate edit`` (seed paper ``004``, Figures 7-13): each figure's prompt, filled from an
image's state, paired with the parser that reads its answer and says what the image keeps or why it stops.

:class:`MedStages` builds the :class:`~namc.curate.edits.med_stages.Stage` list in the paper's order (section 3.1's
filter and instruction, the local edit and similarity stages of :mod:`namc.curate.edits.med_edit`, section 3.2's
Steps 1-3 and the two judges). A stage's ``messages`` may raise :class:`~namc.llm.BadInput` (a missing,
corrupt or oversized image, no caption): the runner stores it as a failure of that kind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from namc.curate.edits.med_prompts import (
    CATEGORY_DESCRIPTIONS,
    CATEGORY_PROMPT_NAMES,
    FIG7_FILTER,
    FIG8_INSTRUCTION,
    FIG9_COMPLETE_CAPTION,
    FIG10_EDITED_CAPTION,
    FIG11_DIFFERENCE,
    FIG12_JUDGE,
    FIG13_SECOND_JUDGE,
    fill,
    parse_caption,
    parse_completed_caption,
    parse_difference,
    parse_filter,
    parse_instruction,
    parse_yes_no,
)
from namc.curate.edits.med_stages import Rejected, Stage
from namc.llm import BadInput, data_url, image_message

__all__ = ["MIN_SIMILARITY", "MedStages", "edit_stages"]

#: Section 3.1: "discard pairs below a 0.7 threshold following the MMVP" (CLIP clip-vit-base-patch32 cosine).
MIN_SIMILARITY = 0.7

State = dict[str, Any]


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


class MedStages:
    """MED's stages (the module docstring's table, ``template`` aside), as the accept / messages pairs of
    :class:`~namc.curate.edits.med_stages.Stage`.

    Args:
        base: the input's folder (original image references start there).
        out_dir: the output folder (edited image references start there).
        min_similarity: the similarity stage's threshold.
        second_judge: run Figure 13's judge after Figure 12's.
        require_type_match: reject a pair whose Figure 11 type is not the instruction's category.
        max_side: resize images sent to the server above this side.
    """

    def __init__(
        self,
        base: Path,
        out_dir: Path,
        min_similarity: float = MIN_SIMILARITY,
        second_judge: bool = True,
        require_type_match: bool = False,
        max_side: int | None = None,
    ) -> None:
        self.base, self.out_dir, self.max_side = base, out_dir, max_side
        self.min_similarity, self.second_judge, self.require_type_match = (
            min_similarity,
            second_judge,
            require_type_match,
        )

    def stages(self) -> list[Stage]:
        stages = [
            Stage("filter", self.filter_accept, self.filter_messages),
            Stage("instruction", self.instruction_accept, self.instruction_messages),
            Stage("edit", self.edit_accept),
            Stage("similarity", self.similarity_accept, store="edit"),
            Stage("caption1", self.caption1_accept, self.caption1_messages),
            Stage("caption2", self.caption2_accept, self.caption2_messages),
            Stage("difference", self.difference_accept, self.difference_messages),
            Stage("judge", _verdict("judge_no", "Figure 12"), self.judge_messages),
        ]
        if self.second_judge:
            stages.append(Stage("judge2", _verdict("judge2_no", "Figure 13"), self.judge2_messages))
        return stages

    # the inputs every prompt quotes
    def image1(self, state: State) -> str:
        ref = state.get("image")
        if not isinstance(ref, str) or not ref.strip():
            raise BadInput("missing_field", "the line needs a string 'image' reference")
        return data_url(ref, self.base, self.max_side)

    @staticmethod
    def caption(state: State) -> str:
        text = state.get("caption")
        if not isinstance(text, str) or not text.strip():
            raise BadInput("missing_caption", "the image has no caption (the line's 'caption' or --captions)")
        return " ".join(text.split())

    # Figure 7
    def filter_messages(self, s: State) -> list[dict[str, Any]]:
        return image_message(fill(FIG7_FILTER, caption=self.caption(s)), [self.image1(s)])

    @staticmethod
    def filter_accept(state: State, result: dict[str, Any]) -> State:
        if not parse_filter(result.get("text") or ""):
            raise Rejected("filter_no", "Figure 7's Final Recommendation is No")
        return {}

    # Figure 8
    def instruction_messages(self, s: State) -> list[dict[str, Any]]:
        return image_message(fill(FIG8_INSTRUCTION, caption=self.caption(s)), [self.image1(s)])

    @staticmethod
    def instruction_accept(state: State, result: dict[str, Any]) -> State:
        category, prompt, core = parse_instruction(result.get("text") or "")
        return {"category": category, "edit_prompt": prompt, "instruction": core}

    # the editor and the similarity (run_edit_stage stores both)
    @staticmethod
    def edit_accept(state: State, result: dict[str, Any]) -> State:
        sim = result.get("similarity")
        if not isinstance(result.get("image2"), str) or not isinstance(sim, int | float):
            raise Rejected("bad_record", "the edit record lacks image2 or similarity")
        return {"image2": result["image2"], "similarity": float(sim), "edit_seed": result.get("seed")}

    def similarity_accept(self, state: State, result: dict[str, Any]) -> State:
        if state["similarity"] < self.min_similarity:
            raise Rejected("low_similarity", f"similarity {state['similarity']:.4f} < {self.min_similarity}")
        return {}

    # Figure 9
    def caption1_messages(self, s: State) -> list[dict[str, Any]]:
        text = fill(FIG9_COMPLETE_CAPTION, original_description=self.caption(s), edit_prompt=s["edit_prompt"])
        return image_message(text, [self.image1(s)])

    def caption1_accept(self, state: State, result: dict[str, Any]) -> State:
        text, updated = parse_completed_caption(result.get("text") or "", self.caption(state))
        return {"caption1": text, "caption1_updated": updated}

    # Figure 10
    def caption2_messages(self, s: State) -> list[dict[str, Any]]:
        category = s["category"]
        prompt = fill(
            FIG10_EDITED_CAPTION,
            description=s["caption1"],
            type=CATEGORY_PROMPT_NAMES[category],
            type_description=CATEGORY_DESCRIPTIONS[category],
        )
        return image_message(prompt, [data_url(s["image2"], self.out_dir, self.max_side)])

    @staticmethod
    def caption2_accept(state: State, result: dict[str, Any]) -> State:
        text = parse_caption(result.get("text") or "")
        if text.lower().rstrip(". ") == state["caption1"].lower().rstrip(". "):
            raise Rejected("identical_captions", "the edited image's caption equals the original's")
        return {"caption2": text}

    # Figure 11
    @staticmethod
    def difference_messages(s: State) -> list[dict[str, Any]]:
        return _user(fill(FIG11_DIFFERENCE, complete_caption=s["caption1"], new_caption=s["caption2"]))

    def difference_accept(self, state: State, result: dict[str, Any]) -> State:
        kind, sentence = parse_difference(result.get("text") or "")
        if self.require_type_match and kind != state["category"]:
            raise Rejected("type_mismatch", f"difference type {kind} is not the instruction's {state['category']}")
        return {"difference_type": kind, "difference": sentence}

    # Figures 12 and 13
    @staticmethod
    def judge_messages(s: State) -> list[dict[str, Any]]:
        return _user(fill(FIG12_JUDGE, edit_prompt=s["edit_prompt"], difference_description=s["difference"]))

    @staticmethod
    def judge2_messages(s: State) -> list[dict[str, Any]]:
        text = fill(FIG13_SECOND_JUDGE, second_edit_prompt=s["caption2"], difference_description=s["difference"])
        return _user(text)


def _verdict(reason: str, figure: str) -> Callable[[State, dict[str, Any]], State]:
    def accept(state: State, result: dict[str, Any]) -> State:
        if not parse_yes_no(result.get("text") or ""):
            raise Rejected(reason, f"{figure}'s judge answered No")
        return {}

    return accept


def edit_stages(
    base: Path,
    out_dir: Path,
    min_similarity: float = MIN_SIMILARITY,
    second_judge: bool = True,
    require_type_match: bool = False,
    max_side: int | None = None,
) -> list[Stage]:
    """MED's stages in order (see :class:`MedStages` for the arguments)."""
    return MedStages(base, out_dir, min_similarity, second_judge, require_type_match, max_side).stages()
