"""open_clip model configs of namc's own CLIP encoders (``namc-tiny-clip``): importing this package registers them
with open_clip, so that :mod:`namc.models.encoders` builds them and :mod:`namc.models.validate` checks them."""

from pathlib import Path

import open_clip

open_clip.add_model_config(Path(__file__).parent)
