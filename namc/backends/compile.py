"""``namc.compile(model, backend=..., precision=...)``: one trained model, made fast on one runtime.

Every backend returns a :class:`Captioner` whose ``generate`` / ``generate_ids`` take what :meth:`NAMC.generate
<namc.models.NAMC.generate>` takes (image pairs, ``max_new_tokens``, ``num_beams``, ``vocabulary``) and write the
same kind of captions; what differs is where the arithmetic runs:

========================  ==================  ===================================================================
backend                   precisions          what runs
========================  ==================  ===================================================================
``torch``                 fp32, bf16          the model core in eager PyTorch (bf16: ``torch.autocast`` on the
                                              model's device); any device
``cpu``                   fp32, bf16, int8    fp32: the model core (as ``torch``); bf16, int8: namc's hand-written CPU
                                              path, an inference copy with BatchNorm folded, oneDNN's fused
                                              convolutions and decoding step, dynamic int8 matrices and, once
                                              calibrated, a static int8 grid (:mod:`namc.backends.precision`)
``cuda``                  fp32, bf16          the model on a GPU; greedy decoding in fixed-shape steps replayed as
                                              CUDA graphs (:mod:`namc.backends.static_decode`)
``onnxruntime``           fp32, int8          the model exported to ONNX (:mod:`namc.deploy`), run by ONNX Runtime;
                                              int8: the graphs quantised by ONNX Runtime's tools, calibrated on
                                              ``calibration`` pairs (:mod:`namc.deploy.quantize`)
``openvino``              fp32, int8          the same graphs, run by OpenVINO
========================  ==================  ===================================================================

The default backend is ``cpu`` for a model on a CPU and ``cuda`` for one on a GPU. namc keeps no hand-written fp32
CPU path: ONNX Runtime and OpenVINO run fp32 faster than one did, so the fast fp32 on a CPU is ``onnxruntime``.
``onnxruntime`` and ``openvino`` export the model into ``export_dir`` (a temporary folder, removed with the
captioner, when not given) and need the ``[deploy]`` extra; an export folder made once with ``namc export onnx``
loads directly with :func:`namc.deploy.load_captioner`. Speed and agreement of each backend are in
docs/performance.md.

A captioner keeps what it built from the weights (copies, reordered matrices, graphs). The ``cpu`` backend rebuilds
its copy when the model's weights change; the others are snapshots: compile again after training further.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from namc.backends import BACKENDS
from namc.backends.precision import PRECISIONS, calibrate_int8, check_precision, precision_context
from namc.models.inputs import check_inputs
from namc.models.namc import NAMC
from namc.models.shortlist import Shortlist

__all__ = ["BACKENDS", "PRECISIONS_OF", "Captioner", "compile", "default_backend"]

#: backend -> the precisions it runs
PRECISIONS_OF: dict[str, tuple[str, ...]] = {
    "torch": ("fp32", "bf16"),
    "cpu": PRECISIONS,
    "cuda": ("fp32", "bf16"),
    "onnxruntime": ("fp32", "int8"),
    "openvino": ("fp32", "int8"),
}


def default_backend(device: torch.device | str) -> str:
    """The backend :func:`compile` takes for a model on ``device``: ``cuda`` on a GPU, else ``cpu``."""
    return "cuda" if torch.device(device).type == "cuda" else "cpu"


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16: ``torch.autocast`` on ``device`` (the torch and cuda backends); fp32: nothing."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _within(context: contextlib.AbstractContextManager, model: NAMC) -> Iterator[NAMC]:
    with context:
        yield model


def _check(backend: str, precision: str, device: torch.device) -> None:
    if backend not in PRECISIONS_OF:
        raise ValueError(f"unknown backend {backend!r}: one of {', '.join(BACKENDS)}")
    if precision not in PRECISIONS_OF[backend]:
        raise ValueError(
            f"the {backend} backend runs {', '.join(PRECISIONS_OF[backend])}, not {precision!r}"
            + (" (int8 runs on the cpu, onnxruntime and openvino backends)" if precision == "int8" else "")
        )
    if backend == "cuda" and device.type != "cuda":
        raise ValueError(f"the cuda backend needs the model on a GPU (model.to('cuda')), not on {device}")
    if backend == "cpu" and device.type != "cpu":
        raise ValueError(f"the cpu backend needs the model on the CPU, not on {device}: use backend='cuda'")
    if backend not in ("onnxruntime", "openvino"):
        check_precision(precision, device)


class Captioner:
    """A model made fast on one backend (:func:`compile`): ``generate`` / ``generate_ids`` as :class:`NAMC`'s.

    Attributes:
        model: the model it was compiled from (eval mode).
        backend: the backend's name.
        precision: ``fp32``, ``bf16`` or ``int8``.
        config: the model's config (image size, token limits).
        tokenizer: the model's tokenizer.
        device: where it takes its inputs.
    """

    def __init__(self, model: NAMC, backend: str, precision: str) -> None:
        self.model, self.backend, self.precision = model, backend, precision
        self.config, self.tokenizer = model.config, model.tokenizer
        self.device = next(model.parameters()).device

    def __repr__(self) -> str:
        return f"Captioner({self.config.name}, backend={self.backend!r}, precision={self.precision!r})"

    @property
    def training_shortlist(self) -> Shortlist | None:
        """The model's fine-tuning shortlist (``vocabulary=`` it to decode over it), or None."""
        return self.model.training_shortlist

    def eval(self) -> Captioner:
        """Itself: a compiled model is for inference only (here so that code written for NAMC runs unchanged)."""
        return self

    def shortlist(self, captions: Iterable[str]) -> Shortlist:
        """The tokens of ``captions`` as a shortlist for ``vocabulary=`` (:meth:`NAMC.shortlist`)."""
        return self.model.shortlist(captions)

    @torch.inference_mode()
    def generate_ids(
        self,
        images_1: torch.Tensor,
        images_2: torch.Tensor,
        max_new_tokens: int | None = None,
        num_beams: int = 1,
        vocabulary: Shortlist | Iterable[int] | None = None,
    ) -> torch.Tensor:
        """Caption ids (B, T) for (B, 3, S, S) image pairs in [0, 1] (:meth:`NAMC.generate_ids`)."""
        rows = check_inputs(self.config.image_size, (images_1, images_2, None, None), max_new_tokens, num_beams)
        n = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        if rows == 0:
            return torch.zeros(0, 0, dtype=torch.long, device=self.device)
        with self._running() as model:
            x = [t.to(model.fdg.pos.dtype) for t in (images_1, images_2)]
            return self._decode(model, model.encode_pair(*x), n, num_beams, vocabulary)

    @torch.inference_mode()
    def decode(
        self,
        memory: torch.Tensor,
        max_new_tokens: int,
        vocabulary: Shortlist | Iterable[int] | None = None,
        num_beams: int = 1,
    ) -> torch.Tensor:
        """Caption ids (B, T) of (B, N, D) E_MIR (what ``model.encode_pair`` returns), as ``generate_ids`` decodes
        it."""
        with self._running() as model:
            return self._decode(model, memory.to(model.fdg.pos.dtype), max_new_tokens, num_beams, vocabulary)

    def _running(self) -> contextlib.AbstractContextManager[NAMC]:
        """The model this backend runs, inside its precision's context."""
        return _within(_autocast(self.precision, self.device), self.model)

    def _decode(self, model: NAMC, memory: torch.Tensor, n: int, num_beams: int, vocabulary) -> torch.Tensor:
        return model.fdg.generate(memory, n, num_beams, vocabulary=vocabulary)

    def generate(
        self,
        images_1: torch.Tensor,
        images_2: torch.Tensor,
        max_new_tokens: int | None = None,
        num_beams: int = 1,
        vocabulary: Shortlist | Iterable[int] | None = None,
    ) -> list[str]:
        """Describe what changed from each first image to its second (:meth:`NAMC.generate`)."""
        ids = self.generate_ids(images_1, images_2, max_new_tokens, num_beams, vocabulary)
        return [self.tokenizer.decode(row.tolist()) for row in ids]


class _CpuCaptioner(Captioner):
    """The ``cpu`` backend: the inference copy of :func:`~namc.backends.precision.inference_copy`, rebuilt when the
    model's weights change."""

    def _running(self) -> contextlib.AbstractContextManager[NAMC]:
        return precision_context(self.model, self.precision, self.device)

    def calibrate_int8(self, images: Iterable[torch.Tensor]) -> None:
        """Give the int8 copy a static int8 grid (:func:`~namc.backends.precision.calibrate_int8`)."""
        calibrate_int8(self.model, images)


class _CudaCaptioner(Captioner):
    """The ``cuda`` backend: greedy decoding through one :class:`~namc.backends.static_decode.StaticDecoder` per
    length and shortlist (CUDA graphs per batch size); beam search through the model's own loop."""

    def __init__(self, model: NAMC, backend: str, precision: str) -> None:
        super().__init__(model, backend, precision)
        self._decoders: dict[tuple, Any] = {}

    def _decode(self, model: NAMC, memory: torch.Tensor, n: int, num_beams: int, vocabulary) -> torch.Tensor:
        if num_beams > 1:
            return super()._decode(model, memory, n, num_beams, vocabulary)
        from namc.backends.static_decode import StaticDecoder

        short = model.fdg._shortlist(vocabulary)
        key = (n, None if short is None else tuple(short.ids.tolist()))
        if key not in self._decoders:
            self._decoders[key] = StaticDecoder(model.fdg, n, vocabulary=short)
        return self._decoders[key](memory)


def compile(  # noqa: A001 - namc.compile, as torch.compile
    model: NAMC,
    backend: str | None = None,
    precision: str = "fp32",
    export_dir: str | Path | None = None,
    threads: int | None = None,
    calibration: Iterable[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Captioner:
    """``model`` made fast on ``backend`` at ``precision`` (module docstring for the backends).

    Args:
        model: a :class:`NAMC` (put in eval mode here).
        backend: ``torch``, ``cpu``, ``cuda``, ``onnxruntime`` or ``openvino``; None: :func:`default_backend`.
        precision: ``fp32``, ``bf16`` or ``int8``, as the backend runs them (:data:`PRECISIONS_OF`).
        export_dir: where ``onnxruntime`` / ``openvino`` export the model (None: a temporary folder removed with
            the captioner).
        threads: intra-op threads of the ONNX graphs (None: the runtime's default).
        calibration: ``onnxruntime`` / ``openvino`` at int8: ``(images_1, images_2)`` batches of (B, 3, S, S) pairs
            in [0, 1] like the ones to caption (a few hundred pairs), on which the encoder's activation ranges are
            calibrated.

    Raises:
        ValueError: an unknown backend, a precision the backend does not run, or a device it does not run on.
        RuntimeMissingError: ``onnxruntime`` / ``openvino`` is not installed (the message names the extra).
    """
    if not isinstance(model, NAMC):
        raise TypeError(f"namc.compile takes a NAMC model, not {type(model).__name__}")
    device = next(model.parameters()).device
    backend = default_backend(device) if backend is None else backend
    _check(backend, precision, device)
    model.eval()
    if backend in ("onnxruntime", "openvino"):
        if precision == "int8" and calibration is None:
            raise ValueError(f"int8 on {backend} needs calibration=[(images_1, images_2), ...]: pairs like yours")
        pairs = None if calibration is None else [(a.cpu(), b.cpu()) for a, b in calibration]
        return _onnx(model, backend, export_dir, threads, precision, pairs)
    kind = {"cpu": _CpuCaptioner, "cuda": _CudaCaptioner}.get(backend, Captioner)
    return kind(model, backend, precision)


def _onnx(
    model: NAMC, backend: str, export_dir: str | Path | None, threads: int | None, precision: str, pairs: Any
) -> Any:
    from namc.deploy.captioner import load_captioner, runtime_module
    from namc.deploy.export import export_onnx

    runtime_module(backend)  # a missing runtime fails before the export
    folder = Path(export_dir) if export_dir is not None else Path(tempfile.mkdtemp(prefix="namc-onnx-"))
    with tempfile.TemporaryDirectory(prefix="namc-model-") as saved:
        model.save_pretrained(saved)
        export_onnx(saved, folder, precision=precision, calibration=pairs)
    captioner = load_captioner(folder, backend, threads=threads)
    if export_dir is None:
        weakref.finalize(captioner, shutil.rmtree, folder, ignore_errors=True)
    return captioner
