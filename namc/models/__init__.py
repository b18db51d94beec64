"""NAMC's modules, the registry and the presets."""

from namc.models import presets as _presets  # noqa: F401  (registers the presets)
from namc.models.config import NAMCConfig
from namc.models.fusion import create_fusion, list_fusions, register_fusion
from namc.models.hub import push_to_hub, resolve_model_path
from namc.models.namc import NAMC
from namc.models.registry import create_model, list_models, load_model, model_config, register_model
from namc.models.shortlist import Shortlist

__all__ = [
    "NAMC",
    "NAMCConfig",
    "Shortlist",
    "create_fusion",
    "create_model",
    "list_fusions",
    "list_models",
    "load_model",
    "model_config",
    "push_to_hub",
    "register_fusion",
    "register_model",
    "resolve_model_path",
]
