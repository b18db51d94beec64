"""NAMC's modules, the registry and the presets."""

from namc.models import presets as _presets  # noqa: F401  (registers the presets)
from namc.models._registry import create_model, list_models, model_config, register_model
from namc.models.namc import NAMC, NAMCConfig

__all__ = ["NAMC", "NAMCConfig", "create_model", "list_models", "model_config", "register_model"]
