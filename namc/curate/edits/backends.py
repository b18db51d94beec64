"""The image models behind the edit-pair engines, built from a config section: :func:`build`.

``backend:`` picks one of three families; every other key belongs to that family (an unknown key is a one-line
error naming it):

- ``diffusers``: a local Hugging Face diffusers pipeline (:mod:`namc.curate.edits.pipelines`), from a folder in the
  diffusers layout (``model_index.json``) or ``hf-hub:org/name[@revision]`` from the local Hugging Face cache (never
  downloaded here); pairs are rendered with Prompt-to-Prompt (:mod:`namc.curate.edits.p2p`);
- ``openai``: an OpenAI-compatible images endpoint through the official ``openai`` client, ``images.generate`` and
  ``images.edit`` (:mod:`namc.curate.edits.images_api`);
- ``shapes``: the shapes-world stand-ins of :mod:`namc.curate.edits.shapes` (no weights, for tests and demos).

A role (``pairs``, ``inpaint`` or ``edit``) says which protocol of :mod:`namc.curate.edits.base` the step needs.
Every backend's ``throughput`` counts images (two per pair; a failed pair counts as two failures). Example sections
(YAML)::

    generator: {backend: diffusers, model: hf-hub:stabilityai/stable-diffusion-xl-base-1.0, dtype: float16}
    inpainter: {backend: diffusers, model: /models/sdxl-turbo, steps: 4, guidance_scale: 0.0}
    editor:    {backend: openai, base_url: http://127.0.0.1:8000/v1, model: gpt-image-1, api_key_env: OPENAI_API_KEY}

This module also holds the option checks and batch helpers that the backends share.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from PIL import Image

from namc.curate.edits.base import BackendError, Editor, GenerationFailed, Inpainter, PairGenerator, Result

__all__ = [
    "BACKENDS",
    "ROLES",
    "build",
    "check_batch",
    "check_masks",
    "chunks",
    "first_line",
    "flag_option",
    "number_option",
    "pair_images",
    "string_option",
]

ROLES = ("pairs", "inpaint", "edit")
BACKENDS = ("diffusers", "openai", "shapes")

_DIFFUSERS_KEYS = {
    "backend", "model", "device", "dtype", "steps", "guidance_scale", "batch_size", "height", "width",
    "negative_prompt", "progress",
}  # fmt: skip
_ROLE_KEYS = {
    "pairs": {"p2p", "cross_replace_steps", "self_replace_steps", "self_replace_max_tokens"},
    "inpaint": {"strength", "keep_unmasked"},
    "edit": {"image_guidance_scale"},
}
_OPENAI_KEYS = {
    "backend", "base_url", "model", "api_key_env", "size", "timeout", "max_attempts", "concurrency", "send_seed",
    "response_format", "max_pixels", "backoff_base", "backoff_max", "progress",
}  # fmt: skip


# --------------------------------------------------------------------------------------------------- the factory


def build(section: Mapping[str, Any], role: str) -> PairGenerator | Inpainter | Editor:
    """The backend a config section names, for one role.

    Args:
        section: ``backend`` (``diffusers``, ``openai`` or ``shapes``) and that backend's keys (see the classes).
        role: ``pairs`` (a :class:`~namc.curate.edits.base.PairGenerator`), ``inpaint`` (an
            :class:`~namc.curate.edits.base.Inpainter`) or ``edit`` (an :class:`~namc.curate.edits.base.Editor`).

    Raises:
        BackendError: one line: an unknown backend, role or key, a bad value, or weights, extra or server missing.
    """
    if role not in ROLES:
        raise BackendError(f"edits backend: unknown role {role!r}; expected one of {', '.join(ROLES)}")
    if not isinstance(section, Mapping):
        raise BackendError(f"edits backend: the section must be a mapping with a 'backend' key, got {section!r:.80}")
    backend = section.get("backend")
    if backend not in BACKENDS:
        raise BackendError(f"edits backend: unknown backend {backend!r}; expected backend: {' | '.join(BACKENDS)}")
    if backend == "shapes":
        try:
            return importlib.import_module("namc.curate.edits.shapes").build(section, role)  # type: ignore[no-any-return]
        except ValueError as err:  # the stand-ins check their own keys
            raise BackendError(f"edits backend shapes ({role}): {err}") from None
    known = _OPENAI_KEYS if backend == "openai" else _DIFFUSERS_KEYS | _ROLE_KEYS[role]
    unknown = sorted(set(section) - known)
    if unknown:
        raise BackendError(
            f"edits backend {backend} ({role}): unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}"
        )
    if backend == "openai":
        from namc.curate.edits.images_api import OpenAIImages

        return OpenAIImages(section, role)
    from namc.curate.edits import pipelines

    cls = {"pairs": pipelines.DiffusersPairGenerator, "inpaint": pipelines.DiffusersInpainter}.get(role)
    return (cls or pipelines.DiffusersEditor)(section)  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------------------ option checks


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
