"""A trained NAMC on maintained inference runtimes: ONNX export, and ONNX Runtime and OpenVINO captioners.

::

    namc export onnx MODEL_DIR OUT_DIR                      # encoder.onnx, cross_kv.onnx, decoder_step.onnx, manifest
    namc export onnx MODEL_DIR OUT_DIR --precision int8 --calibration PAIRS   # quantised by ONNX Runtime's tools
    namc describe a.png b.png --backend onnxruntime --model OUT_DIR

    from namc.deploy import export_onnx, load_captioner
    export_onnx("runs/finetune/model", "exported")
    captioner = load_captioner("exported", "openvino")
    captioner.generate(images_1, images_2)                  # the same signature as NAMC.generate (greedy)

- :mod:`namc.deploy.graphs`: the three graphs as plain PyTorch modules over the model's parameters;
- :mod:`namc.deploy.export`: tracing them to ONNX, checking each against PyTorch, writing the manifest;
- :mod:`namc.deploy.quantize`: their int8 forms, by ONNX Runtime's quantiser with settings pinned per CPU;
- :mod:`namc.deploy.manifest`: what ``manifest.json`` holds and how a folder is checked before it loads;
- :mod:`namc.deploy.captioner`: the runtime sessions and the greedy loop over them.

The package is named for the ``[deploy]`` extra that brings its runtimes (``pip install "namc[deploy]"``: onnx,
onnxruntime, openvino); importing it loads neither torch nor a runtime, so the command line can parse first.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BACKENDS", "DEFAULT_OPSET", "RUNTIME_MODULES", "export_onnx", "load_captioner"]

# the runtimes that run an exported folder (namc.backends.BACKENDS has the others, which run the model itself)
BACKENDS = ("onnxruntime", "openvino")
# backend -> the module it imports (each comes with the [deploy] extra)
RUNTIME_MODULES = {"onnxruntime": "onnxruntime", "openvino": "openvino"}
DEFAULT_OPSET = 17  # the first with LayerNormalization as one operator; ONNX Runtime and OpenVINO both run it

_LAZY = {"export_onnx": "namc.deploy.export", "load_captioner": "namc.deploy.captioner"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'namc.deploy' has no attribute {name!r}")
