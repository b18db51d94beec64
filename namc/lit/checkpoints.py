"""What namc stores in (and reads back from) Lightning checkpoints.

A Lightning ``.ckpt`` written by :mod:`namc.lit` carries, beside Lightning's own entries, one ``"namc"`` entry of
plain data: the model's :class:`~namc.models.namc.NAMCConfig` as a dict, its tokenizer as a dict (the word list of a
word vocabulary, or the kind of a CLIP BPE), and the namc version. With it a checkpoint is self-contained: it can be
resumed (the tokenizer is checked against the one the data built), fine-tuned from (:func:`load_namc`), or exported
to a ``save_pretrained`` folder. Everything is read with ``torch.load(weights_only=True)``; nothing is unpickled.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from namc.models._weights import load_strict
from namc.models.namc import CONFIG_FILE, NAMC, NAMCConfig
from namc.text.tokenizer import TOKENIZER_FILE, CaptionTokenizer, ClipBPETokenizer, WordTokenizer, load_tokenizer

__all__ = [
    "NAMC_KEY",
    "load_namc",
    "namc_checkpoint_entry",
    "read_checkpoint",
    "read_model_config",
    "resolve_tokenizer",
    "same_tokenizer",
    "tokenizer_from_dict",
    "tokenizer_to_dict",
]

logger = logging.getLogger(__name__)

NAMC_KEY = "namc"
# Pretrained-part paths are only needed to initialise a fresh model; a checkpoint holds all the weights.
_PART_PATHS = ("clip_pretrained", "grid_pretrained", "vqgan_pretrained")


def tokenizer_to_dict(tokenizer: CaptionTokenizer) -> dict[str, Any]:
    """Plain-data description of a tokenizer (what ``tokenizer.json`` holds, without a BPE file copy)."""
    if isinstance(tokenizer, WordTokenizer):
        return {"type": "word", "words": list(tokenizer.words)}
    if isinstance(tokenizer, ClipBPETokenizer):
        return {"type": "clip_bpe", "vocab_size": tokenizer.vocab_size}
    raise TypeError(f"cannot store a tokenizer of type {type(tokenizer).__name__} in a checkpoint")


def tokenizer_from_dict(data: dict[str, Any], where: str = "checkpoint") -> CaptionTokenizer:
    """Inverse of :func:`tokenizer_to_dict` (a CLIP BPE comes from open_clip's bundled vocabulary)."""
    kind = data.get("type")
    if kind == "word":
        return WordTokenizer(data["words"])
    if kind == "clip_bpe":
        tok = ClipBPETokenizer()
        if tok.vocab_size != data.get("vocab_size", tok.vocab_size):
            raise ValueError(f"{where}: CLIP BPE with {data['vocab_size']} ids, the installed one has {tok.vocab_size}")
        return tok
    raise ValueError(f"{where}: unknown tokenizer type {kind!r} (expected 'word' or 'clip_bpe')")


def same_tokenizer(a: CaptionTokenizer, b: CaptionTokenizer) -> bool:
    """Whether two tokenizers map text to the same ids."""
    return tokenizer_to_dict(a) == tokenizer_to_dict(b)


def namc_checkpoint_entry(model: NAMC) -> dict[str, Any]:
    """The ``checkpoint["namc"]`` entry for a model: config, tokenizer and version, all plain data."""
    from namc import __version__

    return {"config": model.config.to_dict(), "tokenizer": tokenizer_to_dict(model.tokenizer), "version": __version__}


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a Lightning checkpoint safely (``weights_only=True``) and check it holds a namc entry.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not a namc Lightning checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # tensors paged in only when used
    if not isinstance(ckpt, dict) or NAMC_KEY not in ckpt or "state_dict" not in ckpt:
        raise ValueError(
            f"{path} is not a namc Lightning checkpoint (no '{NAMC_KEY}' entry): pass a .ckpt written by `namc fit` "
            "or a folder written by save_pretrained"
        )
    return ckpt


def _model_state(ckpt: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The NAMC weights of a LightningModule state dict (the module holds the network as ``self.model``)."""
    return {k[len("model.") :]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}


def read_model_config(path: str | Path) -> NAMCConfig:
    """The :class:`NAMCConfig` of a saved model (a ``save_pretrained`` folder or a namc ``.ckpt``)."""
    path = Path(path)
    if path.is_dir():
        cfg_path = path / CONFIG_FILE
        if not cfg_path.is_file():
            raise FileNotFoundError(f"{cfg_path} not found: a saved model folder holds {CONFIG_FILE}")
        data = json.loads(cfg_path.read_text())
        data.pop("namc_version", None)
        return NAMCConfig.from_dict(data)
    return NAMCConfig.from_dict(read_checkpoint(path)[NAMC_KEY]["config"])


def resolve_tokenizer(spec: str | Path) -> CaptionTokenizer:
    """The tokenizer of a saved model: a folder with ``tokenizer.json`` or a namc ``.ckpt``."""
    path = Path(spec)
    if path.is_dir():
        if not (path / TOKENIZER_FILE).is_file():
            raise FileNotFoundError(f"no {TOKENIZER_FILE} in {path}: expected a folder written by save_pretrained")
        return load_tokenizer(path)
    if path.is_file():
        return tokenizer_from_dict(read_checkpoint(path)[NAMC_KEY]["tokenizer"], where=str(path))
    raise FileNotFoundError(
        f"saved model not found at {path}: expected a save_pretrained folder (config.json, model.safetensors, "
        "tokenizer.json) or a Lightning .ckpt written by `namc fit`; run the pre-training first "
        "(`namc fit --config configs/pretrain/namc_base.yaml` exports runs/pretrain_namc_base/model)"
    )


def load_namc(path: str | Path, pretraining: bool | None = None) -> NAMC:
    """Load a NAMC from a ``save_pretrained`` folder or a namc Lightning ``.ckpt`` (strict: every key must match).

    Args:
        path: the folder or the ``.ckpt`` file.
        pretraining: ``False`` drops NIM, the VQGAN and MIR's reconstruction head after loading (fine-tuning and
            inference need none of them); ``None`` keeps the model as saved.

    Returns:
        the model, in training mode.
    """
    path = Path(path)
    if path.is_dir():
        model = NAMC.from_pretrained(path).train()
    else:
        ckpt = read_checkpoint(path)
        entry = ckpt[NAMC_KEY]
        config = NAMCConfig.from_dict(entry["config"])
        config = NAMCConfig.from_dict({**config.to_dict(), **dict.fromkeys(_PART_PATHS)})
        model = NAMC(config, tokenizer_from_dict(entry["tokenizer"], where=str(path)))
        load_strict(model, _model_state(ckpt), what=f"NAMC weights from {path}")
    if pretraining is False and model.config.pretraining:
        model.drop_pretraining_modules()
    logger.info("loaded %s from %s", model.config.name, path)
    return model
