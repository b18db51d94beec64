"""Caption with an exported model on ONNX Runtime or OpenVINO: :func:`load_captioner` and :class:`OnnxCaptioner`.

Dimension letters: B pairs, b pairs still decoding, N memory positions, H heads, E head width, t positions decoded,
V vocabulary, S shortlist.

The runtimes run the three graphs of an export folder (:mod:`namc.deploy.manifest`); the greedy loop stays in namc's
Python, as :meth:`FDG.generate <namc.models.fdg.FDG.generate>` runs it: encode each pair once, compute the
cross-attention keys/values once, then one decoding step per token fed the keys/values of the positions before;
the greedy pick is the first index of the largest logit (over a shortlist's columns only where ``vocabulary=`` is
given, mapped back to the vocabulary), a row that wrote [EOS] writes padding after it, and finished rows leave the
batch once they are a quarter of it. fp32 greedy ids equal PyTorch's (tests/test_export_onnx.py).

Both runtimes run on the CPU, an int8 export's quantised graphs (:mod:`namc.deploy.quantize`) as they are and the
rest in fp32: OpenVINO is told so (``INFERENCE_PRECISION_HINT``), since on a CPU with bf16 it would otherwise compute
in bf16. ``threads`` sets each runtime's intra-op threads (None: the runtime's default);
where ``OMP_WAIT_POLICY=passive`` is set, ONNX Runtime's idle threads sleep too instead of spinning, as PyTorch's
OpenMP threads do (:mod:`namc.kernels`).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from namc import ops
from namc.deploy import BACKENDS, RUNTIME_MODULES
from namc.deploy.graphs import cache_names
from namc.deploy.manifest import GRAPHS, WEIGHTS_METADATA, ExportedConfig, Manifest, check_weights, read_manifest
from namc.models.inputs import check_inputs
from namc.models.io import read_tokenizer
from namc.models.shortlist import Shortlist, load_shortlist
from namc.text.tokenizer import CaptionTokenizer

__all__ = ["OnnxCaptioner", "RuntimeMissingError", "check_backend", "load_captioner", "runtime_module"]

_INSTALL = 'pip install "namc[deploy]"'


class RuntimeMissingError(ModuleNotFoundError):
    """A backend's runtime is not installed; the message names the extra that brings it."""


def check_backend(backend: str) -> None:
    """ValueError for a backend that runs no exported folder: ``torch`` (it runs the model itself) or an unknown
    name."""
    if backend in ("torch", "cpu", "cuda"):
        raise ValueError(f"the {backend} backend runs a saved model itself: namc.compile(namc.load_model(...))")
    if backend not in RUNTIME_MODULES:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")


def runtime_module(backend: str, modules: Mapping[str, str] = RUNTIME_MODULES) -> ModuleType:
    """The runtime module of ``backend``, imported (``modules``: backend -> module name).

    Raises:
        ValueError: an unknown backend.
        RuntimeMissingError: the runtime is not installed (the message names the extra to install).
    """
    check_backend(backend)
    name = modules[backend]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        raise RuntimeMissingError(
            f"the {backend} backend needs the {name} package, which is not installed: {_INSTALL}", name=name
        ) from None


class _OnnxRuntimeGraph:
    """One ONNX file in an ONNX Runtime session: ``run(feed) -> outputs`` in the graph's order."""

    def __init__(self, runtime: ModuleType, path: Path, threads: int | None, settings: Mapping[str, Any]) -> None:
        options = runtime.SessionOptions()
        options.inter_op_num_threads = 1
        if threads is not None:
            options.intra_op_num_threads = threads
        if os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive":
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        for key, value in settings.items():
            options.add_session_config_entry(key, str(value))
        self.session = runtime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.weights_sha256 = self.session.get_modelmeta().custom_metadata_map.get(WEIGHTS_METADATA)

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feed)


@functools.cache
def _openvino_core(runtime: ModuleType) -> Any:
    """One OpenVINO ``Core`` for the process. Each Core's CPU plugin gives the thread a signal stack of its own and
    puts back the one it found when the Core is destroyed, so Cores destroyed in the order they were made leave a
    freed signal stack behind, and the next Python signal handler (torch's SIGCHLD one, say) crashes the process."""
    return runtime.Core()


class _OpenVINOGraph:
    """One ONNX file compiled by OpenVINO for the CPU in fp32: ``run(feed) -> outputs`` in the graph's order."""

    def __init__(self, runtime: ModuleType, path: Path, threads: int | None, settings: Mapping[str, Any]) -> None:
        core = _openvino_core(runtime)
        model = core.read_model(str(path))
        key = ["framework", WEIGHTS_METADATA]  # where OpenVINO keeps an ONNX file's metadata
        self.weights_sha256 = model.get_rt_info(key).astype(str) if model.has_rt_info(key) else None
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32", **settings}
        if threads is not None:
            config["INFERENCE_NUM_THREADS"] = threads
        self.request = core.compile_model(model, "CPU", config).create_infer_request()

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        # inputs shared, not copied (the cross-attention keys/values are read at every step); outputs copied, since
        # the next call writes the request's buffers
        return list(self.request.infer(feed, share_inputs=True).to_tuple())


_GRAPH_TYPES = {"onnxruntime": _OnnxRuntimeGraph, "openvino": _OpenVINOGraph}
# per backend and graph, settings beyond the defaults. OpenVINO's CPU plugin runs the attention pattern
# (MatMul -> Softmax -> MatMul) as a "Snippets" subgraph, which returns wrong values where the keys' length is
# dynamic and at least 8 (OpenVINO 2026.4 on an AVX2 CPU; errors of order 1 in the outputs): the decoding step's
# keys grow by one per token, so that graph runs without Snippets (tests/test_export_onnx.py compares the captions)
_SETTINGS: dict[str, dict[str, dict[str, Any]]] = {"openvino": {"decoder_step": {"SNIPPETS_MODE": "DISABLE"}}}


def load_captioner(
    directory: str | Path,
    backend: str = "onnxruntime",
    threads: int | None = None,
    verify: bool = True,
    modules: Mapping[str, str] = RUNTIME_MODULES,
) -> OnnxCaptioner:
    """Load an export folder (``namc export onnx``) on a runtime.

    Args:
        directory: the export folder.
        backend: ``onnxruntime`` or ``openvino``.
        threads: intra-op threads of each graph (None: the runtime's default).
        verify: check every file against the SHA-256 the manifest records (about a second per GB).
        modules: backend -> the module it imports.

    Raises:
        ValueError: an unknown backend (or ``torch``).
        RuntimeMissingError: the runtime is not installed (the message names the extra).
        FileNotFoundError: the folder or its manifest is missing.
        ConfigError: the manifest or tokenizer is unreadable.
        WeightsError: a listed file is missing or damaged, or a graph was exported from other weights than the
            manifest records (each message names the file).
    """
    runtime = runtime_module(backend, modules)
    manifest = read_manifest(directory, verify=verify)
    graphs = {}
    for graph in GRAPHS:
        settings = _SETTINGS.get(backend, {}).get(graph, {})
        graphs[graph] = _GRAPH_TYPES[backend](runtime, manifest.graph_path(graph), threads, settings)
        check_weights(manifest, graph, graphs[graph].weights_sha256)
    tokenizer = read_tokenizer(manifest.directory)
    shortlist = load_shortlist(manifest.directory, tokenizer) if manifest.data["shortlist"] else None
    return OnnxCaptioner(manifest, backend, graphs, tokenizer, shortlist)


class OnnxCaptioner:
    """A captioner over an export folder's graphs on one runtime; ``generate`` and ``generate_ids`` take what
    :meth:`NAMC.generate <namc.models.NAMC.generate>` takes, and decode greedily in fp32.

    Attributes:
        backend: ``onnxruntime`` or ``openvino``.
        config: the exported model's settings (:class:`~namc.deploy.manifest.ExportedConfig`).
        tokenizer: the model's tokenizer.
        training_shortlist: a fine-tuned model's shortlist (``vocabulary=`` it to decode over it), or None.
        device: the CPU, where both runtimes run.
        precision: the export's, ``fp32`` or ``int8``.
    """

    def __init__(
        self,
        manifest: Manifest,
        backend: str,
        graphs: Mapping[str, Any],
        tokenizer: CaptionTokenizer,
        training_shortlist: Shortlist | None = None,
    ) -> None:
        self.manifest, self.backend, self.graphs = manifest, backend, dict(graphs)
        self.config: ExportedConfig = manifest.config
        self.tokenizer = tokenizer
        self.training_shortlist = training_shortlist
        self.device = torch.device("cpu")
        self.precision = manifest.data["precision"]  # fp32, or int8 graphs (namc.deploy.quantize)
        d = manifest.decoder
        self.pad_id, self.bos_id, self.eos_id = d["pad_id"], d["bos_id"], d["eos_id"]
        self._cross = manifest.names("cross_kv", "outputs")
        self._past = cache_names(d["layers"], "past")
        self._shape = (d["heads"], d["head_dim"])

    def __repr__(self) -> str:
        return f"OnnxCaptioner({self.config.name}, backend={self.backend!r}, {self.manifest.directory})"

    def eval(self) -> OnnxCaptioner:
        """Itself: an exported model has no training mode (here so that code written for NAMC runs unchanged)."""
        return self

    def shortlist(self, captions: Iterable[str]) -> Shortlist:
        """The tokens of ``captions`` as a shortlist for ``vocabulary=`` (:meth:`NAMC.shortlist
        <namc.models.NAMC.shortlist>`)."""
        return Shortlist.from_captions(captions, self.tokenizer)

    def generate(
        self,
        images_1: torch.Tensor | np.ndarray,
        images_2: torch.Tensor | np.ndarray,
        max_new_tokens: int | None = None,
        num_beams: int = 1,
        vocabulary: Shortlist | Iterable[int] | None = None,
    ) -> list[str]:
        """Describe what changed from each first image to its second (:meth:`NAMC.generate
        <namc.models.NAMC.generate>`; greedy, at the export's precision)."""
        ids = self.generate_ids(images_1, images_2, max_new_tokens, num_beams, vocabulary)
        return [self.tokenizer.decode(row.tolist()) for row in ids]

    def generate_ids(
        self,
        images_1: torch.Tensor | np.ndarray,
        images_2: torch.Tensor | np.ndarray,
        max_new_tokens: int | None = None,
        num_beams: int = 1,
        vocabulary: Shortlist | Iterable[int] | None = None,
    ) -> torch.Tensor:
        """Caption ids (B, T) of image pairs: (B, 3, S, S) floats in [0, 1], greedy, at most ``max_new_tokens``
        (default: the model's), over ``vocabulary``'s tokens only where given.

        Raises:
            ValueError: beam search (not available on this backend yet), inputs
                :meth:`NAMC.generate_ids <namc.models.NAMC.generate_ids>` refuses, or too many new tokens.
        """
        if num_beams != 1:
            raise ValueError(
                f"the {self.backend} backend decodes greedily (num_beams=1); beam search runs on the torch backend"
            )
        batches = tuple(torch.as_tensor(x) if isinstance(x, np.ndarray) else x for x in (images_1, images_2))
        rows = check_inputs(self.config.image_size, (*batches, None, None), max_new_tokens, num_beams)
        n = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        if n + 1 > self.config.max_caption_len:
            raise ValueError(f"max_new_tokens={n} needs {n + 1} positions > {self.config.max_caption_len}")
        if rows == 0:
            return torch.zeros(0, 0, dtype=torch.long)
        images = [b.detach().to("cpu", torch.float32).contiguous().numpy() for b in batches]
        (memory,) = self.graphs["encoder"].run({"images_1": images[0], "images_2": images[1]})
        return self.decode(memory, n, vocabulary)

    def decode(
        self,
        memory: np.ndarray | torch.Tensor,
        max_new_tokens: int,
        vocabulary: Shortlist | Iterable[int] | None = None,
    ) -> torch.Tensor:
        """Greedy caption ids (B, T), T <= ``max_new_tokens``, of (B, N, D) E_MIR, as :meth:`FDG.generate
        <namc.models.fdg.FDG.generate>` decodes it: the cross-attention keys/values once, then one step per token."""
        if isinstance(memory, torch.Tensor):
            memory = memory.detach().to("cpu", torch.float32).numpy()
        cross = self.graphs["cross_kv"].run({"memory": np.ascontiguousarray(memory, dtype=np.float32)})
        return torch.from_numpy(self._greedy(cross, memory.shape[0], max_new_tokens, self._shortlist(vocabulary)))

    def _shortlist(self, vocabulary: Shortlist | Iterable[int] | None) -> np.ndarray | None:
        """The (S,) sorted ids decoding may write, or None for the whole vocabulary."""
        if vocabulary is None:
            return None
        if isinstance(vocabulary, Shortlist):
            return vocabulary.fits(self.config.vocab_size).ids.numpy()
        return Shortlist(vocabulary, self.config.vocab_size, self.eos_id).ids.numpy()

    def _greedy(self, cross: Sequence[np.ndarray], B: int, n: int, shortlist: np.ndarray | None) -> np.ndarray:
        """FDG.generate's greedy loop over the decoding-step graph: (B, T) ids, T <= ``n``."""
        step = self.graphs["decoder_step"]
        cross = dict(zip(self._cross, cross, strict=True))  # name -> (b, H, N, E)
        H, E = self._shape
        past = {name: np.zeros((B, H, 0, E), np.float32) for name in self._past}  # (b, H, t, E), t = 0
        out = np.full((B, n), self.pad_id, dtype=np.int64)
        rows = np.arange(B)  # original row of each row still in the batch
        finished = np.zeros(B, dtype=bool)  # rows in the batch that wrote [EOS]
        tokens = np.full((B, 1), self.bos_id, dtype=np.int64)
        for t in range(n):
            logits, *present = step.run({"tokens": tokens, "position": np.array([t], np.int64), **past, **cross})
            if shortlist is None:
                nxt = logits.argmax(axis=-1)  # (b,): the first of ties, a NaN counting as the largest (as torch's)
            else:
                nxt = shortlist[logits[:, shortlist].argmax(axis=-1)]  # over the list's columns, as vocabulary ids
            nxt = np.where(finished, self.pad_id, nxt)
            out[rows, t] = nxt
            finished |= nxt == self.eos_id
            past = dict(zip(self._past, present, strict=True))  # (b, H, t + 1, E)
            n_done = int(finished.sum())
            if n_done == len(finished):
                break
            if 4 * n_done >= len(finished):  # drop finished rows in groups, as FDG.generate does
                keep = np.flatnonzero(~finished)
                rows, nxt, finished = rows[keep], nxt[keep], finished[keep]
                past = {name: value[keep] for name, value in past.items()}
                cross = {name: value[keep] for name, value in cross.items()}
            tokens = nxt[:, None].astype(np.int64)
        return np.ascontiguousarray(out[:, : ops.used_length(torch.from_numpy(out), self.pad_id)])
