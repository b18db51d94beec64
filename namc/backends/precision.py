"""Inference precision: the ``precision`` option of :meth:`NAMC.generate`, ``namc describe`` and ``namc benchmark``.

- ``fp32``: the model as it is, the model core in eager PyTorch (the default). namc keeps no hand-written fp32 path:
  ONNX Runtime and OpenVINO run fp32 faster than one did (docs/performance.md), so a fast fp32 is the
  ``onnxruntime`` backend of :func:`namc.compile`.
- ``bf16``: on a CPU, a copy of the inference path (grid encoder with BatchNorm folded into its convolutions, MIR,
  FDG) whose convolution and linear weights, and the vocabulary matrix, are stored in bfloat16 where bf16 pays:
  oneDNN runs them in bf16 (AVX-512 BF16 / AMX where the CPU has them). Each part is kept in the dtype it runs in and
  casts what it takes (no autocast, which would run the fp32 parts in bf16 too and re-cast every weight at every
  call). The grid is bf16 wherever oneDNN's fused convolutions run. MIR is bf16 throughout (LayerNorms, positions,
  residual stream: an fp32 residual stream would cost a cast at every layer) where its largest matrix has
  :data:`~namc.thresholds.MIR_BF16_MIN_WEIGHT` entries, else fp32; FDG's layers (all or none) and its vocabulary
  matrix each in bf16 from :data:`~namc.thresholds.BF16_MIN_WEIGHT` entries
  (:func:`~namc.backends.onednn.bf16_worthwhile`), its LayerNorms and residual stream fp32 (its steps are bound by the
  matrices, not the casts). namc_base is bf16 in every matrix; a narrow model keeps its small parts in fp32, where
  bf16 would be slower. Two oneDNN preparations follow, both done once per copy: the grid's convolutions run fused
  with their ReLUs and residual additions (:mod:`namc.backends.onednn`) and the decoding step's matrices are reordered
  into oneDNN's blocked layout (:meth:`FusedFDG.pack_step`). The step's one-query
  attention runs as two batched products (:func:`~namc.backends.step.attend_one`) wherever PyTorch's fused SDPA
  kernel would take a second thread (:func:`~namc.backends.step.attend_step`), where the fused kernel is the slower
  one; but for a CPU with AMX, where the fused kernel runs on the tiles and is the faster one. On CUDA:
  ``torch.autocast`` over the model itself (:func:`run_context`).
- ``int8``: on a CPU, the copy's BatchNorm folded as for bf16, every ``nn.Linear`` of MIR (on a CPU with AMX, MIR in
  bf16 as the bf16 copy runs it: :func:`mir_in_bf16`) and every matrix of FDG's decoding step (the vocabulary
  projection and the cross-attention keys / values included) in dynamic int8 (PyTorch's x86 kernel: int8 weights
  with per-channel scales, activations quantised per call, to 8 bits where the CPU has VNNI:
  :mod:`namc.backends.qlinear`), but for matrices under :data:`~namc.thresholds.INT8_MIN_WEIGHT` entries, which stay
  fp32 (int8 is no faster there: a narrow model's); attention stays fp32 but for the decoder's cross-attention over
  a memory of :data:`~namc.thresholds.CROSS_KV_BF16_MIN` elements or more, which reads its keys / values in bf16
  (:meth:`FusedFDG.pack_step`). The grid's convolutions run fused in fp32, or, once
  :func:`calibrate_int8` has seen images, its stem and ResNet blocks in static int8 (:mod:`namc.backends.qconv`: the
  oneDNN kernels PyTorch's PT2E x86 flow lowers to, without ``torch.export``, inductor or torchao; activation scales
  from the calibration images). :class:`~namc.lit.finetune.FinetuneModule` calibrates on training pairs, ``namc
  benchmark`` on its synthetic images.

The speed of each precision on each part is in docs/performance.md.

A calibration is data of the model (``model.grid_calibration``, :mod:`namc.models.calibration`): the activation
peaks :func:`~namc.backends.qconv.calibrate_resnet` records, which ``save_pretrained`` writes to
``int8_calibration.json`` and ``from_pretrained`` reads back.

The copies are built on first use, kept per model and rebuilt when a parameter of the model changed since
(an optimiser step bumps the parameter's version counter), so a model trained further never decodes with stale
weights. Quality against fp32 is measured, not assumed (tests/test_precision.py; ``FinetuneModule
(inference_precision=...)`` with ``namc eval --compare`` measures it on any test split): on the demo's models bf16
and int8 change a few percent of the captions and move CIDEr-D by about a point either way. A caption changes where
fp32's choice led its runner-up by a near-tie: the rounding flips near-ties between paraphrases. Folding BatchNorm
alone changes no caption.

A pair's fp32 caption does not depend on the batch it is captioned in (its logits move by float rounding only); its
bf16 and int8 captions may: the decoding step's one-query attention switches kernels by size
(:func:`~namc.backends.step.attend_step`), int8's cross-attention keys / values switch to bf16 by the memory's size,
and its dynamic layers take one activation scale per call for all the call's rows. Batch-independent forms would
slow bf16 decoding and int8's MIR (docs/performance.md), so namc does not use them.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from namc.backends import onednn, qlinear
from namc.backends.grid import fold_batchnorm, fuse_grid, grid_int8_peaks, quantize_grid
from namc.backends.qlinear import int8_forms, int8_kernels
from namc.backends.step import fuse_decoder, fused_view
from namc.backends.versions import fingerprint as _fingerprint
from namc.models.calibration import CALIBRATION_FILE, GridCalibration
from namc.thresholds import MIR_BF16_MIN_WEIGHT

__all__ = [
    "CALIBRATION_FILE",
    "PRECISIONS",
    "calibrate_int8",
    "check_precision",
    "inference_copy",
    "int8_calibration",
    "int8_grid",
    "mir_in_bf16",
    "part_precisions",
    "precision_context",
    "run_context",
    "set_int8_calibration",
]

PRECISIONS = ("fp32", "bf16", "int8")

_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {precision: (fingerprint, copy)}
_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (its modules and modes, fp32 view)


def check_precision(precision: str, device: torch.device | str = "cpu") -> None:
    """Raise ValueError for an unknown precision or one this device does not run (int8 is CPU only)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "int8" and torch.device(device).type != "cpu":
        raise ValueError(f"int8 runs on a CPU only (dynamic int8 linear kernels), not on {device}")


def calibrate_int8(model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
    """Calibrate the static int8 grid of ``model``'s ``int8`` copy on ``batches`` of (B, 3, H, W) images in [0, 1]
    (a few hundred images like the ones to caption: both images of each pair). From then on the ``int8`` copy runs
    the grid's ResNet blocks in static int8 (:mod:`namc.backends.qconv`) instead of fp32, until the grid's weights
    change. Without calibration ``int8`` keeps the fp32 grid (activation scales need images to come from).
    The peaks are the model's ``grid_calibration``: ``save_pretrained`` keeps them (:data:`CALIBRATION_FILE`), so a
    loaded model needs none.
    """
    check_precision("int8", next(model.parameters()).device)
    set_int8_calibration(model, grid_int8_peaks(model.grid, batches))


def int8_calibration(model: nn.Module) -> list[list[float]] | None:
    """The activation peaks (per grid block) ``model``'s static int8 grid uses: its ``grid_calibration``
    (:mod:`namc.models.calibration`) where it describes the grid's current weights, else None."""
    calibration = getattr(model, "grid_calibration", None)
    return None if calibration is None else calibration.current(model.grid)


def set_int8_calibration(model: nn.Module, peaks: Any, source: str = "calibration") -> None:
    """Give ``model`` the int8 grid calibration ``peaks`` (what :func:`int8_calibration` returns, from this model or
    one with the same grid weights); None removes it (the int8 grid runs in fp32 again). ValueError, naming
    ``source``, unless ``peaks`` holds one list of finite, non-negative numbers per block of the grid, as many as
    :func:`~namc.backends.qconv.calibrate_resnet` records."""
    model.grid_calibration = None if peaks is None else GridCalibration.of(model.grid, peaks, source)
    _COPIES.get(model, {}).pop("int8", None)  # rebuilt with (or without) the static grid on next use


def int8_grid(model: nn.Module) -> str:
    """What the grid of ``model``'s ``int8`` copy runs in: ``"int8"`` once :func:`calibrate_int8` calibrated it for
    the current grid weights (or the calibration came with the saved model), where this torch build runs oneDNN's
    int8 convolutions exactly (:func:`~namc.backends.qconv.qconv_available`; with 7-bit activations on a CPU without
    VNNI, :func:`~namc.backends.qconv.code_ceiling`), else ``"fp32"``."""
    from namc.backends.qconv import qconv_available

    calibrated = int8_calibration(model) is not None
    return "int8" if calibrated and onednn.conv_available() and qconv_available() else "fp32"


def inference_copy(model: nn.Module, precision: str) -> nn.Module:
    """The ``precision`` copy of a NAMC model's inference path on a CPU (``fp32``: the model itself).

    The copy shares nothing with the model, has no NIM / VQGAN (inference never runs them) and is in eval mode.
    Built once per model and precision, rebuilt when the model's weights changed (or, for int8, the kernels
    :func:`~namc.backends.qlinear.int8_kernels` names).
    """
    check_precision(precision)
    if precision == "fp32":
        return model
    cached = _COPIES.setdefault(model, {})
    int8 = precision == "int8"
    rules = (int8_kernels(), qlinear.INT8_MIN_WEIGHT) if int8 else (onednn.BF16_MIN_WEIGHT, MIR_BF16_MIN_WEIGHT)
    bf16_mir = mir_in_bf16(model.mir, int8)
    rules += (bf16_mir,)
    key = (_fingerprint(model), rules, int8_calibration(model) if int8 else None)
    if precision in cached and cached[precision][0] == key:
        return cached[precision][1]
    cached.pop(precision, None)  # free the stale copy before building the new one
    with torch.inference_mode(False), torch.no_grad(), torch.autocast("cpu", enabled=False):
        memo: dict[int, nn.Module | None] = {
            id(m): None for m in (getattr(model, "nim", None), getattr(model, "vqgan", None)) if m is not None
        }
        if int8 and not bf16_mir:
            memo.update(int8_forms(model.mir))  # MIR's linear layers copied straight into int8
        twin = copy.deepcopy(model, memo=memo).eval()
        fuse_decoder(twin.fdg)  # the fused decoding step, the copy's LayerNorms and GELUs on the thread rules
        fold_batchnorm(twin.grid)
        if precision == "bf16":
            _to_bf16(twin, bf16_mir)
        else:
            if bf16_mir:  # bf16 throughout, handing FDG's int8 layers the fp32 memory they take
                twin.mir.to(torch.bfloat16).memory_dtype = torch.float32
            fused = fuse_grid(twin.grid)  # fp32 convolutions, fused as for bf16
            peaks = int8_calibration(model)
            if fused and peaks is not None:
                quantize_grid(twin.grid, peaks)  # static int8 blocks, scales from calibrate_int8
            twin.fdg.pack_step("int8")
    cached[precision] = (key, twin)
    return twin


def fp32_view(model: nn.Module) -> nn.Module:
    """``model`` as a GPU decodes it: a second handle on the same modules and parameters (nothing copied, ``model``
    unchanged) whose decoder takes the fused step (:func:`~namc.backends.step.fused_view`), fewer kernel launches per
    token. Kept per model; made again when a submodule is replaced or the training mode changes."""
    key = (model.training, model.fdg.training, *(id(m) for m in model._modules.values()))
    entry = _VIEWS.get(model)
    if entry is not None and entry[0] == key:
        return entry[1]
    view = copy.copy(model)
    view._modules = dict(model._modules)
    view._modules["fdg"] = fused_view(model.fdg)
    _VIEWS[model] = (key, view)
    return view


def mir_in_bf16(mir: nn.Module, int8: bool) -> bool:
    """Whether the bf16 copy (``int8`` False) or the int8 copy runs ``mir`` in bf16 throughout: the bf16 copy where
    oneDNN has bf16 and MIR's largest matrix has :data:`~namc.thresholds.MIR_BF16_MIN_WEIGHT` entries; the int8
    copy likewise, but only on a CPU with AMX (:func:`~namc.backends.onednn.amx_bf16`), where MIR's products of
    hundreds of rows run faster on the tiles in bf16 than in PyTorch's dynamic int8, which has no AMX path
    (docs/performance.md). Elsewhere the int8 copy's MIR is dynamic int8."""
    if (int8 and not onednn.amx_bf16()) or not onednn.bf16_supported():
        return False
    return max(m.weight.numel() for m in mir.modules() if isinstance(m, nn.Linear)) >= MIR_BF16_MIN_WEIGHT


def _to_bf16(twin: nn.Module, bf16_mir: bool) -> None:
    """Make ``twin``, a folded inference copy, the bf16 copy: each part in bf16 where bf16 pays on a CPU, else fp32,
    and every part casting what it takes to its own dtype (no autocast, which would run the fp32 parts in bf16).
    Where oneDNN has no bf16 on this CPU (:func:`~namc.backends.onednn.bf16_supported`), bf16 pays nowhere: every
    part stays fp32, the grid's convolutions fused as for int8 (a warning says so, once a process)."""
    if not onednn.bf16_supported():
        warnings.warn(_NO_BF16, RuntimeWarning, stacklevel=2)
        fuse_grid(twin.grid)
        return
    if onednn.conv_available():  # bf16 convolutions pay through oneDNN's fused kernels only
        for module in twin.grid.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                module.to(torch.bfloat16)
        fuse_grid(twin.grid)  # convolution + ReLU (+ shortcut) as one oneDNN call each
    if bf16_mir:  # mir_in_bf16(twin.mir, int8=False), as inference_copy found it
        twin.mir.to(torch.bfloat16)  # LayerNorms, positions and residual stream too: no casts between layers
    fdg = twin.fdg
    layers = max((m.weight for m in fdg.blocks.modules() if isinstance(m, nn.Linear)), key=torch.Tensor.numel)
    vocab = fdg.tok.weight if fdg.lm_head is None else fdg.lm_head.weight
    for module in list(fdg.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Linear:  # the layers (all or none in bf16: one attention's q, k, v agree) and lm_head
                weight = vocab if child is fdg.lm_head else layers
                setattr(module, name, CastLinear.of(child.to(_dtype(onednn.bf16_worthwhile(weight)))))
    fdg.tok.to(_dtype(onednn.bf16_worthwhile(vocab)))  # the vocabulary projection's matrix where tied
    fdg.pack_step("bf16")  # the decoding step's bf16 matrices in oneDNN's layout, reordered once


_NO_BF16 = (
    "precision bf16: oneDNN has no bf16 on this CPU (it needs AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX), where bf16 "
    "runs several times slower than fp32, so every part of the bf16 copy stays fp32 (part_precisions says so)"
)


def _dtype(bf16: bool) -> torch.dtype:
    return torch.bfloat16 if bf16 else torch.float32


class CastLinear(nn.Linear):
    """``nn.Linear`` that casts its input to its weight's dtype: a bf16 copy's decoder layers take fp32 LayerNorm
    outputs and a bf16 or fp32 memory, as autocast would hand them on, without autocast's cast of fp32 layers."""

    @classmethod
    def of(cls, layer: nn.Linear) -> CastLinear:
        cast = cls(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
        cast.weight, cast.bias = layer.weight, layer.bias
        return cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)


PARTS = ("grid", "mir", "decoder", "vocabulary")  # what part_precisions reports on


def part_precisions(model: nn.Module, precision: str) -> dict[str, str]:
    """What each part of ``model``'s ``precision`` copy on a CPU runs in, ``fp32``, ``bf16`` or ``int8``: the
    ``grid``, ``mir``, the ``decoder``'s layers (their largest matrices) and its ``vocabulary`` projection. A part the
    copy keeps in fp32 says so: a bf16 or int8 copy leaves a narrow model's small matrices in fp32, int8 an
    uncalibrated grid, bf16 a grid that oneDNN's fused convolutions cannot run."""
    if precision == "fp32":
        return dict.fromkeys(PARTS, "fp32")
    twin = inference_copy(model, precision)
    if precision == "int8":
        grid = int8_grid(model)
    else:
        conv = next(m for m in twin.grid.backbone.modules() if isinstance(m, (nn.Conv2d, onednn.FusedConv)))
        grid = _name(conv.dtype if isinstance(conv, onednn.FusedConv) else conv.weight.dtype)
    int8_mir = any(isinstance(m, qlinear.DynamicLinear) for m in twin.mir.modules())
    step = twin.fdg.step_weights()[0]
    return {
        "grid": grid,
        "mir": "int8" if int8_mir else _name(twin.mir.pos.dtype),
        "decoder": _matrix(step.ffn_in[0]),
        "vocabulary": _matrix(step.vocab[0]),
    }


def _matrix(weight: torch.Tensor | nn.Module) -> str:
    return "int8" if isinstance(weight, nn.Module) else _name(weight.dtype)


def _name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


def run_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """What calls of a ``precision`` module run under: on CUDA ``torch.autocast`` to bfloat16 for ``bf16``; else
    nothing (a CPU copy keeps each part in the dtype it runs in, :func:`inference_copy`)."""
    if precision == "bf16" and device.type != "cpu":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def precision_context(model: nn.Module, precision: str, device: torch.device) -> Iterator[nn.Module]:
    """Yield the module to run at ``precision`` on ``device`` (CPU: :func:`inference_copy`; CUDA: the model itself),
    inside :func:`run_context`. Inputs stay in the model's dtype."""
    check_precision(precision, device)
    runner = inference_copy(model, precision) if device.type == "cpu" else fp32_view(model)  # outside autocast
    with run_context(precision, device):
        yield runner
