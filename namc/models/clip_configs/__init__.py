"""open_clip model configs of namc's own CLIP encoders (``namc-tiny-clip``), read by :mod:`namc.models.encoders`."""
