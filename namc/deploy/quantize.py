"""int8 ONNX graphs: an fp32 export quantised by ONNX Runtime's own tools (``onnxruntime.quantization``).

- ``encoder`` (pixels -> E_MIR): static int8 in QDQ form, activation ranges calibrated on the user's image pairs
  (``--calibration``): the convolutions and the MIR's matrix products read int8 codes whose scales come from images
  like the ones to caption, not from each call.
- ``cross_kv`` and ``decoder_step``: dynamic int8 matrix products (weights int8 per output channel, activations
  quantised per call), where the activations change with every token.

As in namc's own int8 copy (:mod:`namc.backends.precision`), only products with a weight matrix of
:data:`~namc.thresholds.INT8_MIN_WEIGHT` entries or more are quantised, and attention's products of two activations
stay fp32: on the demo's width-32 model, dynamic int8 on its small decoder matrices changed one caption in ten
(docs/performance.md).

The settings are namc's, pinned per CPU capability in :data:`INT8_SETTINGS`, never the runtime's defaults: without
VNNI, x86 int8 kernels add pairs of uint8 x int8 products in int16 and saturate, and the default signed 8-bit
weights then cost namc_base's encoder 26% relative error on its output, 7-bit weights (``reduce_range``) 3.5%
(docs/performance.md). The manifest records the settings and the capability
they were chosen for. OpenVINO reads the QDQ graphs as they are.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from namc import kernels
from namc.thresholds import INT8_MIN_WEIGHT

__all__ = ["INT8_SETTINGS", "cpu_capability", "quantize_export"]

logger = logging.getLogger(__name__)


#: CPU capability -> the quantiser's settings; ``avx2``: 7-bit weights, as 8-bit ones saturate without VNNI
INT8_SETTINGS: dict[str, dict[str, Any]] = {
    "vnni": {"weight_type": "QInt8", "activation_type": "QUInt8", "reduce_range": False, "per_channel": True},
    "avx2": {"weight_type": "QInt8", "activation_type": "QUInt8", "reduce_range": True, "per_channel": True},
}


def cpu_capability() -> str:
    """``vnni`` where this CPU has VNNI (int32 accumulation of int8 products), else ``avx2``."""
    return "vnni" if kernels.vnni() else "avx2"


class _PairReader:
    """ONNX Runtime's calibration reader over pair batches: one ``{"images_1", "images_2"}`` feed per batch."""

    def __init__(self, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._feeds: Iterator[dict[str, np.ndarray]] = iter(
            [{"images_1": a.float().numpy(), "images_2": b.float().numpy()} for a, b in batches]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)

    def rewind(self) -> None:  # one pass is all the min-max calibration takes
        return None


def quantize_export(
    out_dir: Path, files: dict[str, str], batches: list[tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, Any]:
    """Replace the fp32 graphs ``files`` (graph -> file name in ``out_dir``) by their int8 forms (module docstring);
    returns the manifest's ``quantization`` entry."""
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    if not batches:
        raise ValueError("int8 export needs calibration image pairs (--calibration)")
    capability = cpu_capability()
    pinned = INT8_SETTINGS[capability]
    kinds = {k: getattr(QuantType, pinned[k]) for k in ("weight_type", "activation_type")}
    quantised = {}
    for graph, name in files.items():
        source, partial = out_dir / name, out_dir / f".{name}.int8.partial"
        products, skipped = _products(source)
        quantised[graph] = len(products)
        if graph == "encoder":
            quantize_static(
                str(source),
                str(partial),
                _PairReader(batches),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=["Conv", "MatMul", "Gemm"],
                nodes_to_exclude=skipped,
                per_channel=pinned["per_channel"],
                reduce_range=pinned["reduce_range"],
                calibrate_method=CalibrationMethod.MinMax,
                **kinds,
            )
        else:
            quantize_dynamic(
                str(source),
                str(partial),
                op_types_to_quantize=["MatMul", "Gemm"],
                nodes_to_exclude=skipped,
                per_channel=pinned["per_channel"],
                reduce_range=pinned["reduce_range"],
                weight_type=kinds["weight_type"],
            )
        os.replace(partial, source)
    pairs = sum(a.shape[0] for a, _ in batches)
    logger.info("int8 export: %d calibration pairs, settings %s for %s", pairs, pinned, capability)
    return {
        "tool": "onnxruntime.quantization",
        "cpu_capability": capability,
        "settings": dict(pinned),
        "static": {"graphs": ["encoder"], "format": "QDQ", "calibration": "MinMax", "pairs": pairs},
        "dynamic": {"graphs": [g for g in files if g != "encoder"]},
        "min_weight": INT8_MIN_WEIGHT,
        "quantised_products": quantised,
    }


def _products(path: Path) -> tuple[list[str], list[str]]:
    """The names of the MatMul / Gemm nodes of an ONNX file to quantise (a constant weight of
    :data:`~namc.thresholds.INT8_MIN_WEIGHT` entries or more) and of the others (attention's products of two
    activations, small matrices)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    sizes = {t.name: int(np.prod(t.dims)) for t in graph.initializer}
    keep, skip = [], []
    for node in graph.node:
        if node.op_type in ("MatMul", "Gemm"):
            big = len(node.input) > 1 and sizes.get(node.input[1], 0) >= INT8_MIN_WEIGHT
            (keep if big else skip).append(node.name)
    return keep, skip
