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

The option checks and batch helpers the backends share are in :mod:`namc.curate.edits.options`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from namc.curate.edits.base import BackendError, Editor, Inpainter, PairGenerator

__all__ = ["BACKENDS", "ROLES", "build"]

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
