"""The int8 grid calibration a model carries as data: activation peaks of its ResNet grid, measured on images.

A runtime that runs the grid's blocks in static int8 (:mod:`namc.backends`) takes its activation scales from these
peaks; the model only keeps them, saves them with its weights and restores them. A calibration describes the grid
weights it was measured on: :class:`GridCalibration` records their :func:`weights_state`, and
:meth:`GridCalibration.current` refuses it once the grid changed (an optimiser step, ``load_state_dict``, a copy).

The file, ``int8_calibration.json`` in a saved model's folder (its SHA-256 recorded in ``config.json`` like the
weights'), is UTF-8 JSON ``{"format": "namc-int8-calibration/1", "peaks": [[...], ...]}``: one list per ResNet block
of the largest activation seen at its input, after each convolution but the last, at its output and, for a block
with a downsampling shortcut, out of the shortcut (:func:`peak_layout`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from torch import nn

from namc.models.files import ConfigError, atomic_write_text, read_json

__all__ = [
    "CALIBRATION_FILE",
    "GridCalibration",
    "block_peaks",
    "check_peaks",
    "load_calibration",
    "peak_layout",
    "save_calibration",
    "weights_state",
]

CALIBRATION_FILE = "int8_calibration.json"
_FORMAT = "namc-int8-calibration/1"


def weights_state(module: nn.Module) -> tuple:
    """Identity and version counter of every parameter and buffer of ``module``: changes when any of them is
    replaced or updated in place (an optimiser step bumps the version counter, ``load_state_dict`` copies into it)."""
    out = []
    for t in (*module.parameters(), *module.buffers()):
        try:
            version = t._version
        except RuntimeError:  # an inference tensor has no version counter; it cannot change in place either
            version = -1
        out.append((id(t), t.data_ptr(), version))
    return tuple(out)


def block_peaks(block: nn.Module) -> int:
    """How many peaks a calibration records for one ResNet block: input, one per convolution but the last, output,
    and the downsampling shortcut's where the block has one."""
    convs = sum(isinstance(getattr(block, f"conv{i}", None), nn.Conv2d) for i in (1, 2, 3))
    return convs - 1 + 2 + (getattr(block, "downsample", None) is not None)


def peak_layout(backbone: nn.Module) -> list[int]:
    """:func:`block_peaks` of each block of a (timm) ResNet ``backbone``, stage by stage."""
    return [block_peaks(b) for layer in backbone.children() if isinstance(layer, nn.Sequential) for b in layer]


def check_peaks(peaks: Any, layout: list[int], source: str) -> list[list[float]]:
    """``peaks`` as lists of floats, or ValueError naming ``source`` unless it holds one list of finite,
    non-negative numbers per block, of the lengths ``layout`` gives."""
    ok = isinstance(peaks, list) and all(
        isinstance(block, list)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in block)
        for block in peaks
    )
    if not ok or [len(block) for block in peaks] != layout:
        got = [len(b) for b in peaks] if ok else "not lists of finite non-negative numbers"
        raise ValueError(
            f"{source}: int8 peaks must be {len(layout)} lists of finite numbers >= 0 of lengths {layout} "
            f"(this model's grid), got {got}"
        )
    return [[float(v) for v in block] for block in peaks]


@dataclasses.dataclass(frozen=True, eq=False)
class GridCalibration:
    """Activation peaks of a grid (:func:`peak_layout`) and the :func:`weights_state` of the grid they describe."""

    peaks: list[list[float]]
    state: tuple

    @classmethod
    def of(cls, grid: nn.Module, peaks: Any, source: str = "calibration") -> GridCalibration:
        """``peaks`` checked against ``grid``'s layout (ValueError naming ``source``), for its current weights."""
        return cls(check_peaks(peaks, peak_layout(grid.backbone), source), weights_state(grid))

    def current(self, grid: nn.Module) -> list[list[float]] | None:
        """The peaks where ``grid`` still has the weights they were measured on, else None."""
        return self.peaks if self.state == weights_state(grid) else None


def save_calibration(calibration: GridCalibration | None, grid: nn.Module, directory: Path) -> str | None:
    """Write ``calibration`` to ``directory`` / :data:`CALIBRATION_FILE` where it describes ``grid``'s weights and
    return the file's name; else remove a stale file an earlier save left there and return None."""
    path = directory / CALIBRATION_FILE
    peaks = None if calibration is None else calibration.current(grid)
    if peaks is None:
        path.unlink(missing_ok=True)
        return None
    blocks = ",\n".join(f"  {json.dumps(block)}" for block in peaks)  # one grid block a line
    atomic_write_text(path, f'{{"format": "{_FORMAT}",\n "peaks": [\n{blocks}\n ]}}\n')
    return CALIBRATION_FILE


def load_calibration(grid: nn.Module, directory: Path) -> GridCalibration | None:
    """The calibration :func:`save_calibration` wrote to ``directory`` for ``grid`` (loaded), or None without one.

    Raises:
        ConfigError: the file is not UTF-8 JSON, not a namc calibration, or does not fit the grid.
    """
    path = directory / CALIBRATION_FILE
    if not path.is_file():
        return None
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise ConfigError(f'{path}: not a namc int8 calibration (want {{"format": "{_FORMAT}", ...}})')
    try:
        return GridCalibration.of(grid, data.get("peaks"), str(path))
    except ValueError as err:
        raise ConfigError(str(err)) from None
