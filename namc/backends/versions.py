"""When to rebuild what was made from a model's weights: :func:`fingerprint`.

An inference copy or a reordered step matrix is made once from the weights and kept; it is made
again when a parameter or buffer was replaced or changed in place (an optimiser step bumps the tensor's version
counter, ``load_state_dict`` copies into it), so that a model trained further never decodes with stale weights.
"""

from __future__ import annotations

from namc.models.calibration import weights_state as fingerprint

__all__ = ["fingerprint"]
