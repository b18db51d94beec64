"""namc.lit: Lightning training and evaluation (LightningModules, the ``namc`` CLI, callbacks, the demo).

Only this package imports Lightning.
"""

from namc.lit.callbacks import CaptionWriter, ExportModel
from namc.lit.checkpoints import load_namc
from namc.lit.modules import CosineSchedule, FinetuneModule, NAMCModule, PretrainModule

__all__ = [
    "CaptionWriter",
    "CosineSchedule",
    "ExportModel",
    "FinetuneModule",
    "NAMCModule",
    "PretrainModule",
    "load_namc",
]
