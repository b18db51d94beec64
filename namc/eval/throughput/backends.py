"""Throughput of a model on each runtime: ``namc benchmark --backend cpu:fp32 cpu:int8 onnxruntime:int8 ...``.

Every run is a captioner ``namc.compile(model, backend, precision)`` (:mod:`namc.backends.compile`) timed at the
levels a captioner runs: ``decode`` (its ``decode`` of E_MIR, the eager model's memory of the same pixels) and
``e2e`` (its ``generate_ids`` from pixels), at every batch size. One set of images per batch size serves every run,
and with ``reference`` ``clip4idc`` (or ``all``) each run's calls are interleaved with the CLIP4IDC peer's at the
same level (:func:`~namc.eval.throughput.inference.time_peer`), so each row's speed-up over the peer comes from
one loop under one machine load. Each inference and reference row records its ``backend`` and ``precision``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from namc.backends.compile import Captioner, compile
from namc.backends.precision import inference_copy
from namc.eval.throughput.clip4idc import CLIP4IDCPeer
from namc.eval.throughput.inference import (
    flops_entry,
    length_mode,
    peer_calls,
    peer_length,
    time_level,
    time_peer,
)
from namc.eval.throughput.settings import BenchmarkInputError, BenchmarkSettings, backend_run
from namc.models.namc import NAMC
from namc.models.shortlist import Shortlist

__all__ = ["compile_runs", "run_backends"]

logger = logging.getLogger(__name__)

_PEER_LEVEL = {"decode": "clip4idc_decode", "e2e": "clip4idc_e2e"}


def compile_runs(model: NAMC, settings: BenchmarkSettings) -> list[tuple[str, str, Any]]:
    """``(backend, precision, captioner)`` of each of ``settings.backends``; a run that cannot be built (a precision
    its backend does not run, a runtime not installed) is a BenchmarkInputError naming it."""
    runs = []
    for spec in settings.backends:
        backend, precision = backend_run(spec, settings.precision)
        pairs = None
        if precision == "int8" and backend in ("onnxruntime", "openvino"):  # synthetic scales: timing only
            size = model.config.image_size
            pairs = [tuple(torch.rand(2, 8, 3, size, size, generator=torch.Generator().manual_seed(settings.seed + 1)))]
        try:
            captioner = compile(model, backend, precision, threads=settings.threads, calibration=pairs)
        except (ValueError, ModuleNotFoundError, FileNotFoundError) as err:
            raise BenchmarkInputError(f"--backend {spec}: {err}") from None
        runs.append((backend, precision, captioner))
    return runs


@contextlib.contextmanager
def _fixed_length(model: NAMC, runs: list[tuple[str, str, Any]], mode: str) -> Iterator[None]:
    """:func:`length_mode` over everything that decodes: the model, the cpu backend's copies (built here) and the
    exported captioners, whose [EOS] is their own."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(length_mode(model, mode))
        for backend, precision, captioner in runs:
            if backend == "cpu":
                stack.enter_context(length_mode(inference_copy(model, precision), mode))
            elif not isinstance(captioner, Captioner) and mode == "fixed":
                saved = captioner.eos_id
                captioner.eos_id = -1
                stack.callback(setattr, captioner, "eos_id", saved)
        yield


def run_backends(
    model: NAMC,
    settings: BenchmarkSettings,
    device: torch.device,
    matmul_flops: float | None,
    peer: CLIP4IDCPeer | None,
    short: Shortlist | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The (inference, reference) rows of every run of ``settings.backends`` at every batch size and level."""
    runs = compile_runs(model, settings)
    inference: list[dict[str, Any]] = []
    reference: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(settings.seed)
    size, n = model.config.image_size, settings.max_new_tokens
    eos_id = model.tokenizer.eos_id  # the real one: the fixed length mode hides it
    for batch in settings.batch_sizes:
        img1, img2 = (x.to(device) for x in torch.rand(2, batch, 3, size, size, generator=gen))  # (B, 3, H, W)
        with torch.inference_mode():
            memory = model.encode_pair(img1, img2)  # (B, N, D)
        theirs = peer_calls(peer, img1, img2, n) if peer is not None else {}
        for backend, precision, captioner in runs:
            calls = {
                "decode": lambda c=captioner, m=memory: c.decode(m, n, short),
                "e2e": lambda c=captioner, a=img1, b=img2: c.generate_ids(a, b, n, vocabulary=short),
            }
            tag = {"backend": backend, "precision": precision}
            with _fixed_length(model, runs, settings.length_mode):
                for mode in settings.modes:
                    logger.info("inference: %s %s, batch %d, %s", backend, precision, batch, mode)
                    entry, _, lengths = time_level(settings, device, batch, mode, calls[mode], eos_id)
                    if mode == "decode":
                        entry["flops"] = flops_entry(model, short, lengths, entry["time_s"]["median"], matmul_flops)
                    inference.append(entry | tag)
                    if peer is None:
                        continue
                    level = _PEER_LEVEL[mode]
                    logger.info(
                        "CLIP4IDC peer: batch %d, %s (interleaved with %s %s)", batch, level, backend, precision
                    )
                    with peer_length(peer, settings.length_mode):
                        reference.append(time_peer(settings, device, batch, level, calls[mode], theirs[level]) | tag)
    return inference, reference
