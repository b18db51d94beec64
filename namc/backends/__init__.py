"""What makes a trained model fast: everything between :mod:`namc.models` (the architecture, in eager PyTorch) and
a caption, at a chosen precision.

- :mod:`namc.backends.precision`: inference copies of a model on a CPU in bf16 or int8 (BatchNorm folded,
  oneDNN's fused convolutions, dynamic and static int8, the fused decoding step of :mod:`namc.backends.step`).
- :mod:`namc.backends.static_decode`: fixed-shape greedy decoding with CUDA graphs.
- :mod:`namc.deploy`: ONNX export and the ONNX Runtime / OpenVINO captioners.

``namc.compile(model, backend=..., precision=...)`` (:mod:`namc.backends.compile`) is the one entry point: it
returns a captioner with :class:`~namc.models.NAMC`'s ``generate`` / ``generate_ids``. The model core imports none
of these (tests/test_architecture.py checks it).

This package's ``__init__`` imports nothing, so that the command line can list the backends without torch.
"""

#: what ``namc.compile`` and ``namc describe --backend`` take
BACKENDS = ("torch", "cpu", "cuda", "onnxruntime", "openvino")
