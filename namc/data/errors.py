"""Why a sample is skipped: :class:`IssueKind` and :class:`RecordError`, torch-free.

Image checks and record validation raise :class:`RecordError`; :mod:`namc.data.issues` counts them. This module
imports nothing heavy, so curation steps that only check images and lines (``namc curate describe``,
``namc data pack``) start without torch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = ["IssueKind", "RecordError"]


class IssueKind(StrEnum):
    """Why a sample was skipped."""

    MALFORMED_LINE = "malformed_line"  # not UTF-8, not JSON, or a required key missing / of the wrong type
    OFF_TEMPLATE = "off_template"  # description rejected by namc.text.template
    MISSING_IMAGE = "missing_image"
    CORRUPT_IMAGE = "corrupt_image"
    OVERSIZED_IMAGE = "oversized_image"  # width x height over max_image_pixels (namc.data.transforms)
    BAD_LABELS = "bad_noise_labels"  # noise labels not aligned to desc.split() or not 0/1
    BAD_CODES = "bad_codes"  # precomputed VQGAN codes unreadable or of the wrong shape
    CORRUPT_SHARD = "corrupt_shard"  # samples lost to an unreadable or truncated tar shard
    INCOMPLETE_SAMPLE = "incomplete_sample"  # a shard sample without its json or one of its two images
    EMPTY_CAPTIONS = "empty_captions"  # a benchmark item whose captions are all empty
    DUPLICATE_ID = "duplicate_id"  # an id / sample an earlier manifest line or shard sample already took


class RecordError(ValueError):
    """A sample is unusable: a pipeline skips it and counts it under ``kind`` (an :class:`IssueKind`).

    Raised by the corpus record checks (:mod:`namc.data.corpus.records`) and by image loading for an image over
    the pixel cap (:class:`namc.data.transforms.ImageTooLargeError`), so any reader that skips ``RecordError``
    counts each under its own kind.
    """

    def __init__(self, kind: IssueKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes, subclasses with other signatures too
        return _rebuild_error, (type(self), self.args, self.__dict__)


def _rebuild_error(cls: type[RecordError], args: tuple[Any, ...], state: dict[str, Any]) -> RecordError:
    err = cls.__new__(cls, *args)
    err.args = args
    err.__dict__.update(state)
    return err
