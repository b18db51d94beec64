"""``manifest.json``: what an exported folder holds, and the checks a folder passes before it loads.

An export folder (``namc export onnx MODEL_DIR OUT_DIR``) holds::

    encoder.onnx        images_1, images_2 (B, 3, S, S) float32 in [0, 1] -> memory (B, N, D): E_MIR
    cross_kv.onnx       memory -> cross.{i}.key, cross.{i}.value (B, H, N, E) for each decoder layer i
    decoder_step.onnx   tokens (B, 1) int64, position (1,) int64, past.{i}.key / .value (B, H, t, E),
                        cross.{i}.key / .value -> logits (B, V), present.{i}.key / .value (B, H, t + 1, E)
    tokenizer.json      the model's tokenizer (and the BPE file a CLIP tokenizer names)
    shortlist.json      a fine-tuned model's training shortlist, where it has one
    manifest.json       this module's format, written last

The manifest records the format, namc's version, the model's name, the ONNX opset, the precision, the image size,
the decoding settings (``max_new_tokens``, the decoder's positions, the special ids), each graph's input and output
names, shapes (a name for a dynamic axis: ``batch``, ``past``, ``present``) and dtypes, the size and SHA-256 of
the weights file the graphs came from, and the size and SHA-256 of every other file of the folder. Each ONNX file
also carries the weights' SHA-256 in its metadata (``namc.weights_sha256``).

Before a folder loads (:func:`read_manifest`), every file the manifest lists must be there with its recorded size and
digest, and each graph must carry the manifest's weights digest (:func:`check_weights`): a file that was damaged,
replaced, or exported from other weights is an error naming it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from namc.models.files import ConfigError, WeightsError, check_files, read_json
from namc.paths import PathEscapeError, contained

__all__ = [
    "FORMAT",
    "GRAPHS",
    "MANIFEST_FILE",
    "WEIGHTS_METADATA",
    "ExportedConfig",
    "Manifest",
    "check_weights",
    "read_manifest",
]

MANIFEST_FILE = "manifest.json"
FORMAT = "namc-onnx/1"
GRAPHS = ("encoder", "cross_kv", "decoder_step")  # each written to "<name>.onnx"
WEIGHTS_METADATA = "namc.weights_sha256"  # the metadata key of each ONNX file: the SHA-256 of its source weights


@dataclasses.dataclass(frozen=True)
class ExportedConfig:
    """The settings of an exported model that captioning reads (a subset of :class:`~namc.models.NAMCConfig`'s).

    Args:
        name: the preset the model was built from.
        image_size: S, the side the images are resized to.
        max_new_tokens: the default longest caption.
        max_caption_len: the decoder's positions ([BOS] included): at most ``max_caption_len - 1`` new tokens.
        vocab_size: V.
    """

    name: str
    image_size: int
    max_new_tokens: int
    max_caption_len: int
    vocab_size: int


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A read manifest: ``data`` is the JSON object, ``directory`` the export folder."""

    directory: Path
    data: dict[str, Any]

    @property
    def path(self) -> Path:
        return self.directory / MANIFEST_FILE

    def graph_path(self, graph: str) -> Path:
        return self.directory / self.data["graphs"][graph]["file"]

    def names(self, graph: str, side: str) -> list[str]:
        """The input (``side="inputs"``) or output names of ``graph``, in the graph's order."""
        return [entry["name"] for entry in self.data["graphs"][graph][side]]

    @property
    def weights_sha256(self) -> str:
        return self.data["weights"]["sha256"]

    @property
    def config(self) -> ExportedConfig:
        d = self.data
        return ExportedConfig(d["model"], d["image_size"], d["max_new_tokens"], d["max_caption_len"], d["vocab_size"])

    @property
    def decoder(self) -> dict[str, int]:
        """``layers``, ``heads``, ``head_dim`` and the special ids ``pad_id``, ``bos_id``, ``eos_id``."""
        return self.data["decoder"]


# the keys a manifest must have, with their JSON types
_KEYS: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "model": str,
    "opset": int,
    "precision": str,
    "image_size": int,
    "max_new_tokens": int,
    "max_caption_len": int,
    "vocab_size": int,
    "decoder": dict,
    "tokenizer": str,
    "shortlist": (str, type(None)),
    "graphs": dict,
    "weights": dict,
    "files": dict,
}


def read_manifest(directory: str | Path, verify: bool = True) -> Manifest:
    """The manifest of an export folder, checked.

    Args:
        directory: a folder written by ``namc export onnx``.
        verify: check every file the manifest lists against its size and SHA-256 (about a second per GB).

    Raises:
        FileNotFoundError: the folder or its manifest is missing.
        ConfigError: the manifest is unreadable, of another format, lacks a key, or names a graph file outside the
            folder (the message names it).
        WeightsError: a listed file is missing or does not match its digest (the message names it).
    """
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    if not directory.is_dir():
        raise FileNotFoundError(f"export folder not found: {directory} (write one with `namc export onnx MODEL DIR`)")
    if not path.is_file():
        raise FileNotFoundError(
            f"no {MANIFEST_FILE} in {directory}: the onnxruntime and openvino backends take a folder written by "
            "`namc export onnx MODEL_DIR OUT_DIR`"
        )
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f'{path}: not a namc export manifest (want {{"format": "{FORMAT}", ...}})')
    for key, kind in _KEYS.items():
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise ConfigError(f"{path}: '{key}' is missing or not a {_type_names(kind)}")
    for graph in GRAPHS:
        if not isinstance(data["graphs"].get(graph), dict) or "file" not in data["graphs"][graph]:
            raise ConfigError(f"{path}: 'graphs' has no entry for {graph!r}")
        if data["graphs"][graph]["file"] not in data["files"]:
            raise ConfigError(f"{path}: the file of graph {graph!r} is not among the recorded 'files'")
        try:  # the graph is loaded from this name, verified or not: it may not leave the folder
            contained(directory, data["graphs"][graph]["file"], f"{path}: graphs.{graph}.file")
        except PathEscapeError as err:
            raise ConfigError(str(err)) from None
    if verify:
        check_files(directory, data["files"], path)
    return Manifest(directory, data)


def check_weights(manifest: Manifest, graph: str, carried: str | None) -> None:
    """Raise WeightsError where ``graph``'s file carries another weights digest (``carried``, its
    ``namc.weights_sha256`` metadata) than the manifest records: the graphs come from different exports."""
    if carried != manifest.weights_sha256:
        raise WeightsError(
            f"{manifest.graph_path(graph)} was exported from weights with SHA-256 {carried}, but {manifest.path} "
            f"records {manifest.weights_sha256}: the folder mixes files of different exports; export the model again"
        )


def _type_names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "string", int: "integer", dict: "object", type(None): "null"}
    return " or ".join(names[k] for k in kinds)
