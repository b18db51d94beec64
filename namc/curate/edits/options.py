"""The option checks and batch helpers every image backend of the edit-pair engines shares
(:mod:`namc.curate.edits.backends` builds the backends; :mod:`~namc.curate.edits.pipelines` and
:mod:`~namc.curate.edits.images_api` use these)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from PIL import Image

from namc.curate.edits.base import BackendError, GenerationFailed, Result

__all__ = [
    "check_batch",
    "check_masks",
    "chunks",
    "first_line",
    "flag_option",
    "number_option",
    "pair_images",
    "string_option",
]


def number_option(
    section: Mapping[str, Any], key: str, default: Any, lo: float, hi: float, integer: bool = False
) -> Any:
    """``section[key]`` (or ``default``), checked to be a number in ``[lo, hi]``; a one-line error otherwise."""
    value = section.get(key, default)
    if value is None and default is None:
        return None
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not lo <= value <= hi:
        what = "an integer" if integer else "a number"
        raise BackendError(f"edits backend: {key} must be {what} in [{lo:g}, {hi:g}], got {value!r}")
    return value


def string_option(section: Mapping[str, Any], key: str, default: str | None) -> str | None:
    """``section[key]`` (or ``default``), checked to be a string or None."""
    value = section.get(key, default)
    if value is not None and not isinstance(value, str):
        raise BackendError(f"edits backend: {key} must be a string, got {value!r}")
    return value


def flag_option(section: Mapping[str, Any], key: str, default: bool) -> bool:
    """``section[key]`` (or ``default``), checked to be a YAML boolean."""
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise BackendError(f"edits backend: {key} must be true or false, got {value!r}")
    return value


def check_batch(name: str, *lists: Sequence[Any]) -> None:
    """A batch's inputs must have one length (a caller's bug otherwise, so a ValueError)."""
    if len({len(x) for x in lists}) > 1:
        raise ValueError(f"{name}: the inputs differ in length ({', '.join(str(len(x)) for x in lists)})")


def check_masks(images: Sequence[Image.Image], masks: Sequence[Image.Image]) -> None:
    """Each mask must have its image's size (a caller's bug otherwise, so a ValueError naming the item)."""
    for i, (img, mask) in enumerate(zip(images, masks, strict=True)):
        if img.size != mask.size:
            raise ValueError(
                f"inpaint: item {i}: the mask is {mask.size[0]}x{mask.size[1]}, the image {img.size[0]}x{img.size[1]}"
            )


def first_line(err: BaseException) -> str:
    """The exception's type and the first line of its message (for one-line errors and failure messages)."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")[:300]


def chunks(n: int, size: int) -> Iterator[range]:
    """Consecutive index ranges of at most ``size`` items covering ``range(n)``."""
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


def pair_images(results: Sequence[tuple[Image.Image, Image.Image] | GenerationFailed]) -> list[Result]:
    """What :class:`~namc.curate.edits.base.Throughput` counts for pairs: two images per pair, a failed pair twice."""
    return [x for r in results for x in ((r, r) if isinstance(r, GenerationFailed) else r)]
