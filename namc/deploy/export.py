"""``namc export onnx``: a saved model's encoder, cross-attention prefill and decoding step as ONNX files.

The graphs (:mod:`namc.deploy.graphs`) are traced by PyTorch's TorchScript-based exporter
(``torch.onnx.export(..., dynamo=False)``): it needs no package beyond ``onnx``, and exports the three graphs of
namc_tiny in under a second where the dynamo-based exporter takes about ten for the encoder alone (and needs
``onnxscript``); the encoders either writes agree with PyTorch to about 1e-7. The axes a caller varies are dynamic:
the batch everywhere, and the number of decoded positions in the keys/values of the decoding step.

Each file is then checked as Hugging Face Optimum checks its exports: run in ONNX Runtime on inputs of another
batch size and cache length than the ones it was traced with, and compared with the PyTorch modules (relative L2
error of every output at most :data:`MAX_RELATIVE_ERROR`; fp32 exports agree to about 1e-7). The manifest
(:mod:`namc.deploy.manifest`) is written last, through a rename, so a folder whose export stopped half-way has no
manifest that vouches for it.
"""

from __future__ import annotations

import io
import json
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from namc._version import __version__
from namc.deploy import DEFAULT_OPSET
from namc.deploy.graphs import CrossKV, DecoderStep, PairEncoder, cache_names, cross_names
from namc.deploy.manifest import FORMAT, GRAPHS, MANIFEST_FILE, WEIGHTS_METADATA
from namc.models import NAMC, load_model
from namc.models.files import atomic_write_text, file_digest, record_files
from namc.models.hub import resolve_model_path
from namc.models.io import WEIGHTS_FILE
from namc.models.shortlist import save_shortlist
from namc.text.tokenizer import TOKENIZER_FILE

__all__ = ["DEFAULT_OPSET", "MAX_RELATIVE_ERROR", "ExportError", "export_onnx"]

logger = logging.getLogger(__name__)

MAX_RELATIVE_ERROR = 1e-4  # an fp32 graph's outputs against PyTorch's (they agree to about 1e-7)
MAX_INT8_RELATIVE_ERROR = 0.25  # an int8 graph this far from fp32 is broken (a good one: a few percent)
_TRACE_BATCH, _TRACE_PAST = 2, 1  # the example inputs' batch and cache length (not 1 or 0: no axis specialises)
_CHECK_BATCH, _CHECK_PAST = 3, 4  # the check's, different from the trace's


class ExportError(RuntimeError):
    """An exported graph disagrees with the PyTorch model it came from."""


def export_onnx(
    model_path: str | Path,
    out_dir: str | Path,
    opset: int = DEFAULT_OPSET,
    precision: str = "fp32",
    calibration: list[tuple[torch.Tensor, torch.Tensor]] | Callable[[int], list] | None = None,
) -> Path:
    """Export a saved model as ONNX files with a manifest (layout: :mod:`namc.deploy.manifest`).

    Args:
        model_path: a ``save_pretrained`` folder, a Hub id or a namc ``.ckpt`` (what :func:`namc.load_model` reads).
        out_dir: the folder to write (created if needed; the files of an earlier export there are replaced).
        opset: the ONNX opset.
        precision: ``fp32``, or ``int8``: the fp32 graphs quantised by ONNX Runtime (:mod:`namc.deploy.quantize`).
        calibration: with ``int8``, image pairs like the ones to caption: ``(images_1, images_2)`` batches of
            (B, 3, S, S) in [0, 1], or a function of the model's image size S that returns them (``namc export``
            reads the images at the model's size).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ValueError: an unknown precision, int8 without calibration pairs, or ``out_dir`` is a file.
        ExportError: an exported graph's outputs disagree with PyTorch's.
    """
    if precision not in ("fp32", "int8"):
        raise ValueError(f"precision {precision!r}: ONNX export writes fp32 or int8")
    if precision == "int8" and calibration is None:
        raise ValueError("int8 export needs calibration image pairs: --calibration PAIR_LIST_OR_IMAGE_FOLDER")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir} is a file: name a folder to export into")
    source = resolve_model_path(model_path)
    weights = source / WEIGHTS_FILE if source.is_dir() else source
    model = load_model(source, pretraining=False).eval()
    weights_digest = file_digest(weights)
    out_dir.mkdir(parents=True, exist_ok=True)
    graphs = _export_graphs(model, out_dir, opset, weights_digest["sha256"])
    errors = _check_graphs(model, out_dir)
    quantization = None
    if precision == "int8":
        from namc.deploy.quantize import quantize_export

        batches = calibration(model.config.image_size) if callable(calibration) else list(calibration)
        quantization = quantize_export(out_dir, {g: graphs[g]["file"] for g in GRAPHS}, batches)
        errors = _check_graphs(model, out_dir, MAX_INT8_RELATIVE_ERROR)
    model.tokenizer.save(out_dir)
    bpe = json.loads((out_dir / TOKENIZER_FILE).read_text(encoding="utf-8")).get("bpe")
    shortlist = save_shortlist(model.training_shortlist, out_dir)
    listed = [graphs[g]["file"] for g in GRAPHS] + [TOKENIZER_FILE] + [n for n in (bpe, shortlist) if n]
    fdg = model.fdg
    manifest = {
        "format": FORMAT,
        "namc_version": __version__,
        "model": model.config.name,
        "opset": opset,
        "precision": precision,
        "image_size": model.config.image_size,
        "max_new_tokens": model.config.max_new_tokens,
        "max_caption_len": fdg.max_len,
        "vocab_size": model.config.vocab_size,
        "decoder": {
            "layers": len(fdg.blocks),
            "heads": fdg.heads,
            "head_dim": model.config.dim // fdg.heads,
            "memory_positions": model.grid_size**2,
            "pad_id": fdg.pad_id,
            "bos_id": fdg.bos_id,
            "eos_id": fdg.eos_id,
        },
        "tokenizer": TOKENIZER_FILE,
        "shortlist": shortlist,
        "graphs": graphs,
        "weights": {"file": weights.name, **weights_digest},
        "checked": {"runtime": "onnxruntime", "max_relative_error": errors},
        "quantization": quantization,
        "files": record_files(out_dir, listed),
    }
    atomic_write_text(out_dir / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
    logger.info("exported %s to %s (relative errors %s)", model.config.name, out_dir, errors)
    return out_dir


# ------------------------------------------------------------------------------------------------ tracing


def _graph_inputs(model: NAMC, batch: int, past: int, generator: torch.Generator) -> dict[str, dict[str, Any]]:
    """Example inputs of each graph, by name: pixels, the pixels' memory, and a decoding step at position ``past``
    with random past keys/values of that length."""
    S = model.config.image_size
    images = {f"images_{i}": torch.rand(batch, 3, S, S, generator=generator) for i in (1, 2)}
    with torch.no_grad():
        memory = model.encode_pair(images["images_1"], images["images_2"])
        cross = CrossKV(model)(memory)
    fdg = model.fdg
    L, H, E = len(fdg.blocks), fdg.heads, model.config.dim // fdg.heads
    step = {
        "tokens": torch.randint(0, model.config.vocab_size, (batch, 1), generator=generator),
        "position": torch.tensor([past]),
        **{name: torch.randn(batch, H, past, E, generator=generator) for name in cache_names(L, "past")},
        **dict(zip(cross_names(L), cross)),
    }
    return {"encoder": images, "cross_kv": {"memory": memory}, "decoder_step": step}


def _graph_modules(model: NAMC) -> dict[str, torch.nn.Module]:
    """The graphs' modules in eval mode: the exporter restores each module's mode after tracing, and a wrapper left
    in training mode would put ``model`` back into it (dropout on)."""
    modules = {"encoder": PairEncoder(model), "cross_kv": CrossKV(model), "decoder_step": DecoderStep(model)}
    return {name: module.eval() for name, module in modules.items()}


def _output_names(model: NAMC) -> dict[str, list[str]]:
    L = len(model.fdg.blocks)
    return {
        "encoder": ["memory"],
        "cross_kv": cross_names(L),
        "decoder_step": ["logits", *cache_names(L, "present")],
    }


def _dynamic_axes(names: list[str]) -> dict[str, dict[int, str]]:
    """Every tensor's batch axis; the past and present keys/values' position axis too."""
    axes: dict[str, dict[int, str]] = {}
    for name in names:
        if name == "position":
            continue
        axes[name] = {0: "batch"}
        for prefix in ("past", "present"):
            if name.startswith(prefix + "."):
                axes[name][2] = prefix
    return axes


def _export_graphs(model: NAMC, out_dir: Path, opset: int, weights_sha256: str) -> dict[str, dict[str, Any]]:
    """Write ``<graph>.onnx`` for each graph, with the weights' digest in its metadata; the manifest's ``graphs``."""
    import onnx

    examples = _graph_inputs(model, _TRACE_BATCH, _TRACE_PAST, torch.Generator().manual_seed(0))
    modules, outputs = _graph_modules(model), _output_names(model)
    entries = {}
    for graph in GRAPHS:
        inputs = examples[graph]
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            # the TorchScript exporter's deprecation notice, and the tracer's notes on shapes it records as values
            warnings.simplefilter("ignore", category=DeprecationWarning)
            warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
            with torch.enable_grad():  # autograd on: the model's inference-only in-place paths stay out (graphs.py)
                torch.onnx.export(
                    modules[graph],
                    tuple(inputs.values()),
                    buffer,
                    dynamo=False,
                    input_names=list(inputs),
                    output_names=outputs[graph],
                    dynamic_axes=_dynamic_axes([*inputs, *outputs[graph]]),
                    opset_version=opset,
                )
        proto = onnx.load_model_from_string(buffer.getvalue())
        onnx.helper.set_model_props(proto, {WEIGHTS_METADATA: weights_sha256, "namc.graph": graph})
        onnx.checker.check_model(proto)
        name = f"{graph}.onnx"
        partial = out_dir / f".{name}.partial"
        onnx.save_model(proto, str(partial))
        os.replace(partial, out_dir / name)
        entries[graph] = {
            "file": name,
            "inputs": _describe(proto.graph.input),
            "outputs": _describe(proto.graph.output),
        }
    return entries


def _describe(values: Any) -> list[dict[str, Any]]:
    """Name, shape (an int, or the name of a dynamic axis) and dtype of each graph input or output."""
    import onnx

    out = []
    for value in values:
        tensor = value.type.tensor_type
        shape = [d.dim_param or d.dim_value for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        out.append({"name": value.name, "shape": shape, "dtype": dtype})
    return out


# ------------------------------------------------------------------------------------------------ the check


def _check_graphs(model: NAMC, out_dir: Path, bound: float = MAX_RELATIVE_ERROR) -> dict[str, float]:
    """Each graph's largest relative L2 error over its outputs, run in ONNX Runtime against PyTorch on inputs of
    another batch and cache length than the trace's; ExportError above ``bound``."""
    import onnxruntime as ort

    examples = _graph_inputs(model, _CHECK_BATCH, _CHECK_PAST, torch.Generator().manual_seed(1))
    modules = _graph_modules(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    errors = {}
    for graph in GRAPHS:
        inputs = examples[graph]
        session = ort.InferenceSession(str(out_dir / f"{graph}.onnx"), options, providers=["CPUExecutionProvider"])
        got = session.run(None, {name: t.numpy() for name, t in inputs.items()})
        with torch.no_grad():
            want = modules[graph](*inputs.values())
        want = (want,) if isinstance(want, torch.Tensor) else want
        errors[graph] = max(_relative_error(g, w.numpy()) for g, w in zip(got, want, strict=True))
        if not errors[graph] <= bound:
            raise ExportError(
                f"{out_dir / f'{graph}.onnx'} disagrees with PyTorch: relative L2 error {errors[graph]:.2e} > {bound:g}"
            )
    return errors


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    scale = float(np.linalg.norm(want))
    return float(np.linalg.norm(got.astype(np.float64) - want)) / (scale if scale > 0 else 1.0)
