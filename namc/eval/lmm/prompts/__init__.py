"""The prompt texts of `namc eval lmm` and the judge (read by :mod:`namc.eval.lmm.presets`)."""
