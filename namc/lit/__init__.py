"""namc.lit: Lightning training and evaluation (LightningModules, DataModules, callbacks, the ``namc`` CLI, the demo).

Only this package imports Lightning; everything it trains is a plain :class:`namc.NAMC` with the objectives of
:mod:`namc.objectives`.
"""

from namc.lit.callbacks import AtomicCheckpointIO, CaptionWriter, ExportModel
from namc.lit.finetune import FinetuneModule
from namc.lit.modules import NAMCModule
from namc.lit.preference import PreferenceModule
from namc.lit.pretrain import PretrainModule

__all__ = [
    "AtomicCheckpointIO",
    "CaptionWriter",
    "ExportModel",
    "FinetuneModule",
    "NAMCModule",
    "PreferenceModule",
    "PretrainModule",
]
