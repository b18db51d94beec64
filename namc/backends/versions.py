"""When to rebuild what was made from a model's weights: :func:`fingerprint`.

An inference copy, a reordered step matrix or a compiled step is made once from the weights and kept; it is made
again when a parameter or buffer was replaced or changed in place (an optimiser step bumps the tensor's version
counter, ``load_state_dict`` copies into it), so that a model trained further never decodes with stale weights.
"""

from __future__ import annotations

from torch import nn

__all__ = ["fingerprint"]


def fingerprint(model: nn.Module) -> tuple:
    """Identity and version counter of every parameter and buffer: changes when any of them is replaced or updated
    in place (an optimiser step, ``load_state_dict``)."""
    out = []
    for t in (*model.parameters(), *model.buffers()):
        try:
            version = t._version
        except RuntimeError:  # an inference tensor has no version counter; it cannot change in place either
            version = -1
        out.append((id(t), t.data_ptr(), version))
    return tuple(out)
