"""timm-style model registry: ``@register_model`` presets, ``list_models``, ``create_model``."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PRESETS: dict[str, Callable[[], Any]] = {}


def register_model(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Register a preset: a function named after the model that returns its :class:`NAMCConfig`."""
    _PRESETS[fn.__name__] = fn
    return fn


def list_models(pattern: str = "*") -> list[str]:
    """Names of the registered presets matching a shell-style ``pattern``."""
    return sorted(n for n in _PRESETS if fnmatch.fnmatch(n, pattern))


def model_config(name: str, **overrides: Any):
    """The :class:`NAMCConfig` of preset ``name`` with ``overrides`` applied (unknown keys are an error)."""
    from namc.models.namc import NAMCConfig

    if name not in _PRESETS:
        raise ValueError(f"unknown model {name!r}; available: {list_models()}")
    cfg = _PRESETS[name]()
    known = {f.name for f in dataclasses.fields(NAMCConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown overrides {unknown} for {name}; valid keys: {sorted(known)}")
    return dataclasses.replace(cfg, **overrides)


def create_model(name: str, pretrained: str | Path | None = None, tokenizer: Any = None, **overrides: Any):
    """Build a NAMC model.

    Args:
        name: a preset from :func:`list_models` (``namc_base`` is the paper, ``namc_tiny`` runs on a CPU).
        pretrained: a folder written by ``save_pretrained`` (``config.json`` + ``model.safetensors``); its config and
            tokenizer win over the preset. Pretrained CLIP / ResNet / VQGAN parts are set with the
            ``clip_pretrained``, ``grid_pretrained`` and ``vqgan_pretrained`` overrides (local files).
        tokenizer: the caption tokenizer; by default CLIP's BPE (+[MASK]) for ``tokenizer="clip_bpe"`` presets and
            a small CLEVR-style word vocabulary for ``tokenizer="word"`` presets.
        **overrides: :class:`NAMCConfig` fields.

    Returns:
        the model (training mode when built from a preset, eval mode when loaded from ``pretrained``).
    """
    from namc.models.namc import NAMC
    from namc.text.tokenizer import ClipBPETokenizer, WordTokenizer

    if pretrained is not None:
        if overrides or tokenizer is not None:
            raise ValueError("a pretrained folder fixes the config and tokenizer: no overrides with pretrained=")
        return NAMC.from_pretrained(pretrained)
    cfg = model_config(name, **overrides)
    if tokenizer is None:
        if cfg.tokenizer == "clip_bpe":
            tokenizer = ClipBPETokenizer()
        else:
            from namc.models.presets import default_word_texts

            tokenizer = WordTokenizer.build(default_word_texts())
    cfg = dataclasses.replace(cfg, tokenizer="clip_bpe" if isinstance(tokenizer, ClipBPETokenizer) else "word")
    cfg = dataclasses.replace(cfg, vocab_size=tokenizer.vocab_size)
    return NAMC(cfg, tokenizer)
