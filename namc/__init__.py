"""namc: Noise-Aware Modeling and Captioning for image difference captioning.

>>> import namc
>>> model = namc.create_model("namc_tiny")
>>> captions = model.eval().generate(images_1, images_2)  # (B, 3, 64, 64) tensors in [0, 1]

The public names below are loaded on first use, so ``import namc`` (and ``namc --version``) costs no torch import;
the model library loads with the first ``namc.create_model`` / ``namc.NAMC`` / ``namc.describe``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from namc._version import __version__

if TYPE_CHECKING:
    from pathlib import Path

    from namc.backends.compile import compile  # noqa: F401
    from namc.inference import describe  # noqa: F401
    from namc.models import (  # noqa: F401
        NAMC,
        NAMCConfig,
        Shortlist,
        create_model,
        list_models,
        load_model,
        model_config,
        register_model,
    )
    from namc.models.hub import push_to_hub  # noqa: F401

# public name -> the module that defines it
_EXPORTS = {
    "NAMC": "namc.models",
    "NAMCConfig": "namc.models",
    "Shortlist": "namc.models",
    "create_model": "namc.models",
    "list_models": "namc.models",
    "load_model": "namc.models",
    "model_config": "namc.models",
    "register_model": "namc.models",
    "describe": "namc.inference",
    "compile": "namc.backends.compile",
    "push_to_hub": "namc.models.hub",
}
_SUBPACKAGES = ("backends", "data", "eval", "lit", "models", "objectives", "ops", "runtime", "text")

__all__ = [*sorted(_EXPORTS), "__version__", "from_pretrained"]


def from_pretrained(directory: str | Path, map_location: Any = "cpu", **kwargs: Any) -> NAMC:
    """Load a saved model (strict; eval mode): :meth:`NAMC.from_pretrained` of a folder written by
    ``save_pretrained``, or of a Hugging Face Hub id ``hf-hub:org/name[@revision]``, resolved through
    huggingface_hub's cache and offline mode (:func:`namc.models.hub.resolve_model_path`).

    Args:
        directory: the model folder or the Hub id.
        map_location: the device the weights go to.
        **kwargs: passed on to :meth:`NAMC.from_pretrained`.
    """
    from namc.models import NAMC

    return NAMC.from_pretrained(directory, map_location, **kwargs)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"namc.{name}")
    raise AttributeError(f"module 'namc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})
