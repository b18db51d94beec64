"""The contract between the edit-pair engines' steps and the models that make or edit images.

Img-Diff (``002``) and MED (``004``) make the second image of a pair instead of finding it. Three kinds of model
do that, each behind a small protocol so that a step never knows which backend it drives:

- :class:`PairGenerator`: two prompts that differ in one object name -> two images that differ only there
  (Img-Diff's replacement: text-to-image with Prompt-to-Prompt attention sharing);
- :class:`Inpainter`: an image, a mask and a prompt -> the image with the masked area repainted (Img-Diff's removal,
  prompt ``"background, nothing, 8k"``);
- :class:`Editor`: an image and an instruction -> the edited image (MED's controlled micro-edits).

Every method takes a batch and one seed per item and returns one entry per item, in order: an image, or a
:class:`GenerationFailed` that says why (counted by the step under ``kind``, never raised out of a batch). A
backend that cannot start at all (weights or server missing, extra not installed) raises :class:`BackendError` with
one line that says what to install or download and where to put it.

Backends are built from a mapping (a YAML section) by :func:`namc.curate.edits.backends.build` (``backend:
diffusers | openai | shapes`` plus that backend's keys); :class:`Throughput` counts what each did.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from PIL import Image

__all__ = [
    "BackendError",
    "Editor",
    "GenerationFailed",
    "Inpainter",
    "PairGenerator",
    "Result",
    "Throughput",
]


class BackendError(RuntimeError):
    """A backend that cannot be used at all; the message is one line naming the file, server or extra."""


@dataclass(frozen=True)
class GenerationFailed:
    """One item a backend could not make. ``kind``: a short counter key (``refused``, ``server_error``,
    ``bad_output``, ``nsfw``, ``timeout``, ...); ``message``: one line for the log."""

    kind: str
    message: str = ""


#: what a backend returns per item
Result = Image.Image | GenerationFailed


@dataclass
class Throughput:
    """Counters of one backend over a run: items asked for, images made, failures by kind, seconds spent inside
    the backend (so ``images / seconds`` is its throughput, excluding the step's own filtering)."""

    items: int = 0
    images: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def record(self, results: Sequence[Result], started: float) -> None:
        """Adds one batch's results; ``started`` is the ``time.perf_counter()`` taken before the batch."""
        self.seconds += time.perf_counter() - started
        self.items += len(results)
        for r in results:
            if isinstance(r, GenerationFailed):
                self.failed[r.kind] += 1
            else:
                self.images += 1

    def to_json(self) -> dict[str, Any]:
        rate = self.images / self.seconds if self.seconds > 0 else None
        return {
            "items": self.items,
            "images": self.images,
            "failed": dict(self.failed),
            "seconds": round(self.seconds, 3),
            "images_per_s": rate,
        }


@runtime_checkable
class PairGenerator(Protocol):
    """Text-to-image for pairs: ``prompts[i] = (source, target)`` -> ``(image1, image2)`` sharing all but the
    replaced words (same seed, same layout), or a failure for the pair."""

    throughput: Throughput

    def generate_pairs(
        self, prompts: Sequence[tuple[str, str]], seeds: Sequence[int]
    ) -> list[tuple[Image.Image, Image.Image] | GenerationFailed]: ...


@runtime_checkable
class Inpainter(Protocol):
    """``images[i]`` with the white area of ``masks[i]`` (mode ``L``, same size) repainted from ``prompts[i]``."""

    throughput: Throughput

    def inpaint(
        self, images: Sequence[Image.Image], masks: Sequence[Image.Image], prompts: Sequence[str], seeds: Sequence[int]
    ) -> list[Result]: ...


@runtime_checkable
class Editor(Protocol):
    """``images[i]`` edited by the natural-language ``instructions[i]`` (MED: one micro-edit)."""

    throughput: Throughput

    def edit(
        self, images: Sequence[Image.Image], instructions: Sequence[str], seeds: Sequence[int]
    ) -> list[Result]: ...
