"""One throughput run: load the model, probe the machine, time inference and training, assemble the report.

The report is a JSON-ready dict whose layout is :data:`~namc.eval.throughput.schema.REPORT_SCHEMA`
(docs/benchmark_schema.md).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import logging
import os
from pathlib import Path
from typing import Any

import torch

from namc._version import __version__
from namc.backends.precision import (
    calibrate_int8,
    inference_copy,
    int8_calibration,
    part_precisions,
    set_int8_calibration,
)
from namc.backends.qlinear import int8_kernels
from namc.eval.throughput.backends import run_backends
from namc.eval.throughput.clip4idc import PAPER_PARAMETERS, CLIP4IDCPeer, linear_form, peer_at
from namc.eval.throughput.inference import decoding_shortlist, random_shortlist, run_inference
from namc.eval.throughput.machine import describe_machine, measure_matmul
from namc.eval.throughput.schema import SCHEMA_VERSION
from namc.eval.throughput.settings import (
    PAPER_TABLE5,
    SHORTLIST_OF_MODEL,
    BenchmarkInputError,
    BenchmarkSettings,
    backend_run,
)
from namc.eval.throughput.training import run_training
from namc.models.files import WeightsError
from namc.models.namc import NAMC
from namc.models.registry import create_model, list_models
from namc.models.shortlist import Shortlist

__all__ = ["load_model", "run_benchmark"]

logger = logging.getLogger(__name__)

PAPER_NAMC_PARAMETERS = 64_200_000  # Table 5


def load_model(spec: str, device: torch.device) -> tuple[NAMC, str]:
    """A preset name or a ``save_pretrained`` folder -> (model on ``device`` in eval mode, ``preset``/``directory``)."""
    if Path(spec).is_dir():
        try:
            model = NAMC.from_pretrained(spec)
        except (OSError, ValueError, WeightsError) as err:  # a folder that cannot be used: its error names the file
            raise BenchmarkInputError(f"--model {spec}: {err}") from err
        return model.to(device).eval(), "directory"
    if spec in list_models():
        return create_model(spec).to(device).eval(), "preset"
    raise BenchmarkInputError(
        f"--model {spec!r} is neither a folder written by save_pretrained nor a preset {list_models()}"
    )


def run_benchmark(settings: BenchmarkSettings, model: NAMC | None = None) -> dict[str, Any]:
    """Run everything ``settings`` asks for and return the report (a JSON-ready dict, :data:`REPORT_SCHEMA`).

    Args:
        settings: what to measure.
        model: an already built model (``settings.model`` then only names it in the report); it is moved to the
            device, put in eval mode and, for half precision, converted. Training throughput
            (``settings.train_batch_size``) trains a copy of it: its weights are left as they were.

    ``settings.threads`` applies for the run; torch's previous thread count is restored afterwards.
    """
    threads = torch.get_num_threads()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    calibration = None if model is None else int8_calibration(model)
    try:
        return _run(settings, model)
    finally:
        torch.set_num_threads(threads)
        if model is not None:  # a caller's model leaves with the int8 calibration it came with
            set_int8_calibration(model, calibration)


def _run(settings: BenchmarkSettings, model: NAMC | None) -> dict[str, Any]:
    caller_model = model
    device = torch.device(settings.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchmarkInputError(f"device {settings.device!r} requested but CUDA is not available")
    dtype = getattr(torch, settings.dtype)
    try:  # this torch's int8 kernels, or NAMC_INT8_KERNELS's choice: every report records them
        int8_kernels()
    except (ValueError, RuntimeError) as err:
        raise BenchmarkInputError(str(err)) from None
    machine = describe_machine(device)
    source = "object"
    if model is None:
        model, source = load_model(settings.model, device)
    model = model.to(device).eval()
    params = model.num_parameters()
    short = decoding_shortlist(model, settings)  # before anything is timed: a model without its own list stops here
    logger.info(
        "matmul reference: %d x %d %s %s", settings.gemm_size, settings.gemm_size, settings.dtype, settings.precision
    )
    matmul = measure_matmul(device, dtype, settings.gemm_size, precision=settings.precision)
    if dtype != torch.float32:
        model.to(dtype)
    _int8_grid(model, settings, device)
    runner = inference_copy(model, settings.precision)  # the model itself in fp32
    parts = part_precisions(model, settings.precision)  # fp32 on CUDA, whose half precision is settings.dtype
    peer, peer_entry = None, None
    if settings.reference in ("clip4idc", "all"):
        torch.manual_seed(settings.seed)
        peer = CLIP4IDCPeer().to(device).eval()
        peer_entry = {"name": "CLIP4IDC", "parameters": peer.num_parameters(), "paper_parameters": PAPER_PARAMETERS}
        if short is not None:  # as many tokens as namc's list; which ones changes no timing of random weights
            vocab = peer.clip.token_embedding.weight.shape[0]
            peer.restrict_vocabulary(random_shortlist(vocab, peer.eos_id, len(short), settings.seed).ids)
        peer = peer_at(peer.to(dtype), settings.reference_precision or settings.precision)
        peer_entry["linear_maps"] = linear_form(peer)
        peer_entry["encoder_linear_maps"] = linear_form(peer, encoder=True)
    if settings.backends:
        inference, reference = run_backends(model, settings, device, matmul["flops_per_s"], peer, short)
    else:
        inference, reference = run_inference(runner, settings, device, matmul["flops_per_s"], peer)
        tag = {"backend": _classic_backend(device, settings), "precision": settings.precision}
        inference, reference = [e | tag for e in inference], [e | tag for e in reference]
    matmul = _settle_matmul(matmul, measure_matmul(device, dtype, settings.gemm_size, precision=settings.precision))
    for entry in inference:
        if entry["flops"]:
            entry["flops"]["matmul_per_s"] = matmul["flops_per_s"]
            entry["flops"]["efficiency"] = entry["flops"]["achieved_per_s"] / matmul["flops_per_s"]
    trained = model if caller_model is None else copy.deepcopy(model)  # a caller's weights stay untrained
    training = run_training(trained, settings, device) if settings.train_batch_size else None
    return {
        "schema_version": SCHEMA_VERSION,
        "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "namc_version": __version__,
        "settings": dataclasses.asdict(settings)
        | {
            "batch_sizes": list(settings.batch_sizes),
            "modes": list(settings.modes),
            "backends": list(settings.backends),
        },
        "machine": machine,
        "model": _model_entry(model, source, params)
        | {"part_precisions": parts, "shortlist": _shortlist_entry(short, settings)},
        "matmul": matmul,
        "inference": inference,
        "reference": reference,
        "peer": peer_entry,
        "training": training,
        "paper_table5": [dict(row) for row in PAPER_TABLE5],
        "load_average_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _int8_grid(model: NAMC, settings: BenchmarkSettings, device: torch.device) -> None:
    """Where a run is int8: the grid uncalibrated (``int8_grid`` fp32), or calibrated on synthetic images unless the
    model has its own calibration."""
    if "int8" not in {backend_run(spec, settings.precision)[1] for spec in settings.backends} | {settings.precision}:
        return
    if settings.int8_grid == "fp32":
        set_int8_calibration(model, None)  # a saved model's calibration too: the grid as an uncalibrated one runs
    elif int8_calibration(model) is None:
        # activation scales from synthetic images: they change no timing (and no caption here means anything)
        gen = torch.Generator().manual_seed(settings.seed + 1)
        size = model.config.image_size
        calibrate_int8(model, [torch.rand(8, 3, size, size, generator=gen).to(device) for _ in range(2)])


def _classic_backend(device: torch.device, settings: BenchmarkSettings) -> str:
    """The ``namc.compile`` backend the run without ``settings.backends`` times: the cpu backend's copy on a CPU, on
    CUDA the model under autocast, or its static decoder (the cuda backend's)."""
    if device.type == "cpu":
        return "cpu"
    return "cuda" if settings.static_decode else "torch"


def _model_entry(model: NAMC, source: str, params: dict[str, int]) -> dict[str, Any]:
    cfg = model.config
    return {
        "name": cfg.name,
        "source": source,
        "image_size": cfg.image_size,
        "dim": cfg.dim,
        "heads": cfg.heads,
        "mir_layers": cfg.mir_layers,
        "fdg_layers": cfg.fdg_layers,
        "vocab_size": cfg.vocab_size,
        "memory_positions": model.grid_size**2,
        "parameters": params,
        "parameters_paper_style": _paper_style(model, params),
    }


def _shortlist_entry(short: Shortlist | None, settings: BenchmarkSettings) -> dict[str, Any] | None:
    """What namc decoded over: None (the whole vocabulary) or the list's source and size."""
    if short is None:
        return None
    return {"source": "model" if settings.shortlist == SHORTLIST_OF_MODEL else "random", "size": len(short)}


def _settle_matmul(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """The GEMM reference measured before and after the timed calls: on a shared virtual machine one measurement
    can move up to 3x between idle runs, so the efficiency's reference is the faster of the two (an efficiency errs
    low, never high); both are kept in ``runs``."""
    best = max((first, last), key=lambda m: m["flops_per_s"])
    return best | {"runs": [first["flops_per_s"], last["flops_per_s"]]}


def _paper_style(model: NAMC, params: dict[str, int]) -> dict[str, int]:
    """Counts to set beside Table 5's (64.2M for NAMC), which leaves out parts of what runs at inference."""
    vocab = model.fdg.tok.weight.numel()
    return {
        "paper": PAPER_NAMC_PARAMETERS,
        "vocab_embedding": vocab,
        "inference_without_vocab_embedding": params["inference"] - vocab,
        "inference_without_grid": params["inference"] - params["grid"],
        "mir_fdg_without_vocab_embedding": params["inference"] - params["grid"] - vocab,
    }
