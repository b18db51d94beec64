"""timm-style model registry: ``@register_model`` presets, ``list_models``, ``create_model``, and ``load_model`` for
a saved model (a ``save_pretrained`` folder, a Hugging Face Hub id ``hf-hub:org/name[@revision]`` or a namc
Lightning ``.ckpt``)."""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from namc.models.config import NAMCConfig
from namc.models.hub import is_hub_id, resolve_model_path
from namc.models.io import (
    NAMC_KEY,
    checkpoint_state_dict,
    load_strict,
    read_checkpoint,
    read_config,
    read_tokenizer,
)
from namc.models.namc import NAMC
from namc.models.shortlist import Shortlist
from namc.models.skip_init import skip_random_init
from namc.text.tokenizer import CaptionTokenizer, ClipBPETokenizer, WordTokenizer
from namc.text.vocab import default_word_texts

__all__ = ["create_model", "list_models", "load_model", "model_config", "register_model"]

logger = logging.getLogger(__name__)

_PRESETS: dict[str, Callable[[], NAMCConfig]] = {}


def register_model(fn: Callable[[], NAMCConfig]) -> Callable[[], NAMCConfig]:
    """Register a preset: a function named after the model that returns its :class:`NAMCConfig`."""
    _PRESETS[fn.__name__] = fn
    return fn


def list_models(pattern: str = "*") -> list[str]:
    """Names of the registered presets matching a shell-style ``pattern``."""
    return sorted(n for n in _PRESETS if fnmatch.fnmatch(n, pattern))


def model_config(name: str, **overrides: Any) -> NAMCConfig:
    """The :class:`NAMCConfig` of preset ``name`` with ``overrides`` applied (unknown keys are an error)."""
    if name not in _PRESETS:
        raise ValueError(f"unknown model {name!r}; available: {list_models()}")
    cfg = _PRESETS[name]()
    known = {f.name for f in dataclasses.fields(NAMCConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown overrides {unknown} for {name}; valid keys: {sorted(known)}")
    return dataclasses.replace(cfg, **overrides)


def create_model(
    name: str, pretrained: str | Path | None = None, tokenizer: CaptionTokenizer | str | None = None, **overrides: Any
) -> NAMC:
    """Build a NAMC model.

    Args:
        name: a preset from :func:`list_models` (``namc_base`` is the paper, ``namc_tiny`` runs on a CPU).
        pretrained: a folder written by ``save_pretrained`` (``config.json`` + ``model.safetensors``), a Hub id
            ``hf-hub:org/name[@revision]`` of such a folder, or a namc Lightning ``.ckpt``; its config and tokenizer
            win over the preset. Pretrained CLIP / ResNet / VQGAN parts are set with the ``clip_pretrained``,
            ``grid_pretrained`` and ``vqgan_pretrained`` overrides (local files).
        tokenizer: the caption tokenizer, or its kind (the config's ``tokenizer``, ``"clip_bpe"`` or ``"word"``);
            by default the preset's kind: CLIP's BPE (+[MASK]) for ``clip_bpe``, a small CLEVR-style word
            vocabulary for ``word``.
        **overrides: :class:`NAMCConfig` fields.

    Returns:
        the model (training mode when built from a preset, eval mode when loaded from ``pretrained``).

    Raises:
        ConfigError: the config (preset + overrides) fails :meth:`NAMCConfig.validate`; checked before building.
    """
    if pretrained is not None:
        if overrides or tokenizer is not None:
            raise ValueError("a pretrained folder fixes the config and tokenizer: no overrides with pretrained=")
        return load_model(pretrained).eval()
    if isinstance(tokenizer, str):  # a kind
        overrides, tokenizer = {**overrides, "tokenizer": tokenizer}, None
    cfg = model_config(name, **overrides)
    if tokenizer is None:
        if cfg.tokenizer not in ("clip_bpe", "word"):
            raise ValueError(f"unknown tokenizer kind {cfg.tokenizer!r}: expected 'clip_bpe' or 'word'")
        tokenizer = ClipBPETokenizer() if cfg.tokenizer == "clip_bpe" else WordTokenizer.build(default_word_texts())
    cfg = dataclasses.replace(cfg, tokenizer=tokenizer.kind, vocab_size=tokenizer.vocab_size)
    cfg.validate(f"model {name!r}")  # before anything is allocated: a bad override is one line, not a traceback
    return NAMC(cfg, tokenizer)


def load_model(path: str | Path, pretraining: bool | None = None) -> NAMC:
    """Load a NAMC from a ``save_pretrained`` folder, a Hub id or a namc Lightning ``.ckpt`` (strict: every key must
    match).

    Args:
        path: the folder, ``hf-hub:org/name[@revision]`` (resolved by :func:`~namc.models.hub.resolve_model_path`
            through huggingface_hub's cache and offline mode), or the ``.ckpt`` file.
        pretraining: ``False`` drops NIM, the VQGAN and MIR's reconstruction head after loading (fine-tuning and
            inference need none of them); ``None`` keeps the model as saved.

    Returns:
        the model, in training mode.
    """
    spec = path
    path = resolve_model_path(path)
    if path.is_dir():
        model = NAMC.from_pretrained(path).train()
    else:
        ckpt = read_checkpoint(path)
        entry = ckpt[NAMC_KEY]
        # its config and tokenizer as read_config / read_tokenizer check them (a bad entry: a ConfigError naming it;
        # the pretrained-part paths it records are dropped, the checkpoint holds every weight)
        config = read_config(path)
        tokenizer = read_tokenizer(path)
        with skip_random_init():  # every weight comes from the checkpoint, loaded strictly below
            model = NAMC(config, tokenizer)
        load_strict(model, checkpoint_state_dict(ckpt), what=f"NAMC weights from {path}")
        if "shortlist" in entry:  # a fine-tuning checkpoint: its training captions' tokens
            model.training_shortlist = Shortlist.from_dict(entry["shortlist"], model.tokenizer, f"{path}: shortlist")
    if pretraining is False and model.config.pretraining:
        model.drop_pretraining_modules()
    logger.info("loaded %s from %s", model.config.name, f"{spec} ({path})" if is_hub_id(spec) else path)
    return model
