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
    from namc.inference import describe  # noqa: F401
    from namc.models import (  # noqa: F401
        NAMC,
        NAMCConfig,
        create_model,
        list_models,
        load_model,
        model_config,
        register_model,
    )

# public name -> the module that defines it
_EXPORTS = {
    "NAMC": "namc.models",
    "NAMCConfig": "namc.models",
    "create_model": "namc.models",
    "list_models": "namc.models",
    "load_model": "namc.models",
    "model_config": "namc.models",
    "register_model": "namc.models",
    "describe": "namc.inference",
}
_SUBPACKAGES = ("data", "eval", "lit", "models", "objectives", "ops", "text")

__all__ = [*sorted(_EXPORTS), "__version__", "from_pretrained"]


def from_pretrained(directory: Any, map_location: Any = "cpu") -> NAMC:
    """Load a model folder written by ``save_pretrained`` (strict; eval mode): :meth:`NAMC.from_pretrained`."""
    from namc.models import NAMC

    return NAMC.from_pretrained(directory, map_location)


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
