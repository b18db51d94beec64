"""namc: Noise-Aware Modeling and Captioning for image difference captioning.

>>> import namc
>>> model = namc.create_model("namc_tiny")
>>> captions = model.eval().generate(images_1, images_2)  # (B, 3, 64, 64) tensors in [0, 1]
"""

__version__ = "0.1.0"

from namc.describe import describe  # noqa: E402
from namc.models import NAMC, NAMCConfig, create_model, list_models, model_config, register_model  # noqa: E402

from_pretrained = NAMC.from_pretrained

__all__ = [
    "NAMC",
    "NAMCConfig",
    "__version__",
    "create_model",
    "describe",
    "from_pretrained",
    "list_models",
    "model_config",
    "register_model",
]
