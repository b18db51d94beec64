"""Model files on disk, below :mod:`namc.models.io`: the error types, what a failed safe read means (and what to
do), JSON read with located errors, SHA-256 digests of a model folder's files, and atomic writes.

A folder written by :meth:`namc.NAMC.save_pretrained` records, in its ``config.json``, the size and SHA-256 of every
file the model is rebuilt from besides the config itself::

    "files": {"model.safetensors": {"bytes": 1234, "sha256": "9f86d0..."},
              "tokenizer.json": {"bytes": 567, "sha256": "..."}}

safetensors has no checksum of its own, so a bit flip in the weights would otherwise load silently with different
numbers. :func:`check_files` compares them on load; a folder saved before namc recorded digests has no ``files``
entry and loads as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import tempfile
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from namc.jsonl import JSONError, loads

__all__ = [
    "FILES_KEY",
    "LIGHTNING_CALLBACK_KEYS",
    "ConfigError",
    "WeightsError",
    "atomic_write_text",
    "check_fields",
    "check_files",
    "describe_load_error",
    "file_digest",
    "load_error_advice",
    "read_json",
    "record_files",
]

FILES_KEY = "files"  # config.json entry: {file name: {"bytes": int, "sha256": hex}}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


class WeightsError(RuntimeError):
    """A checkpoint file could not be read, or its keys / shapes / digest do not fit what it is loaded into."""


class ConfigError(ValueError):
    """A model's ``config.json`` (or a checkpoint's namc entry) is unreadable; the message names the file and where."""


# ------------------------------------------------------------------------------------------------ reading weights


class _InertCheckpointKey:
    """Inert stand-in for a class object that a Lightning checkpoint uses as a dictionary key.

    Lightning 1.0-1.4 (the version the official taming-transformers VQGAN checkpoints were written with) stored
    callback states as ``checkpoint["callbacks"] = {ModelCheckpoint: {...}}``: the *class* is the key, so the file
    holds a pickle GLOBAL for it and ``torch.load(weights_only=True)`` refuses it. Allow-listing this class under
    those names lets such a file load with the safe unpickler; the stand-in does nothing if it is ever called.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass


# Lightning's stateful built-in callbacks of that era; their states (scores, paths, counters) are plain data.
LIGHTNING_CALLBACK_KEYS = [
    (_InertCheckpointKey, f"{package}.callbacks.{name}")
    for package in ("pytorch_lightning", "lightning.pytorch")
    for name in ("model_checkpoint.ModelCheckpoint", "early_stopping.EarlyStopping")
]


def _refused_global(exc: BaseException) -> str | None:
    """The Python object that ``torch.load(weights_only=True)`` refused to unpickle, if that is why it failed."""
    found = re.search(r"GLOBAL (\S+) was not an allowed global|Unsupported class (\S+)", str(exc))
    return (found.group(1) or found.group(2)) if found else None


def describe_load_error(exc: BaseException) -> str:
    """A one-line cause; torch's weights-only errors are long, so keep what they refused and drop the rest."""
    message = str(exc)
    if "TorchScript" in message:
        return "it is a TorchScript archive, which the safe loader does not read"
    refused = _refused_global(exc)
    if refused:
        return f"the safe loader (torch.load weights_only=True) refused the Python object {refused}"
    if "WeightsUnpickler error:" in message:  # the pickle stream itself is malformed
        detail = message.split("WeightsUnpickler error:", 1)[1].strip().splitlines()[0]
        return f"the file is corrupt or not a PyTorch checkpoint (unpickler: {detail})"
    first_line = message.strip().splitlines()[0] if message.strip() else ""
    if len(first_line) > 300:  # keep whole sentences
        first_line = first_line[: first_line.rfind(". ", 0, 300) + 1] or first_line[:300]
    return f"{type(exc).__name__}: {first_line}".rstrip(". ")


def load_error_advice(path: Path, exc: BaseException) -> str:
    """A suggestion for a file that could not be read, or '' when there is none."""
    if "TorchScript" in str(exc):
        return (
            " If it is OpenAI's CLIP (e.g. ViT-B-16.pt), convert it once with "
            f"`namc convert-clip {path} <out>.safetensors` and pass the .safetensors file."
        )
    if _refused_global(exc):
        target = path.with_suffix(".safetensors")
        return (
            " The file holds Python objects besides tensors (e.g. a training checkpoint's callbacks or"
            " hyper-parameters). If, and only if, you trust where the file came from, extract its weights once (this"
            " unpickles the file with code execution enabled) and pass the .safetensors file instead:\n"
            '  python -c "import torch; from namc.models.io import save_safetensors; '
            f"ckpt = torch.load('{path}', map_location='cpu', weights_only=False); "
            f"save_safetensors(ckpt.get('state_dict', ckpt), '{target}')\""
        )
    return ""


# ------------------------------------------------------------------------------------------------ folders


def read_json(path: Path, error: type[Exception] = ConfigError, max_chars: int | None = None) -> Any:
    """The decoded JSON of ``path`` through the bounded reader (:func:`namc.jsonl.loads`: depth, size,
    duplicate keys); ``error`` naming the file (with line and column where it is not UTF-8 or not JSON).

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise error(f"{path}: not UTF-8: byte 0x{raw[err.start]:02x} at line {line}, column {column}") from None
    try:
        return loads(text, max_chars=max_chars)
    except JSONError as err:
        raise error(f"{path}: {err}") from None


def file_digest(path: Path) -> dict[str, Any]:
    """``{"bytes": size, "sha256": hex digest}`` of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": h.hexdigest()}


def record_files(directory: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The ``files`` entry of ``config.json``: the digest of each named file in ``directory``, sorted by name."""
    return {name: file_digest(directory / name) for name in sorted(set(names))}


def _check_entry(config: Path, name: Any, entry: Any) -> None:
    plain = isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
    if not plain:
        raise ConfigError(f"{config}: '{FILES_KEY}' names {name!r}, not a file name in the folder")
    ok = (
        isinstance(entry, dict)
        and isinstance(entry.get("sha256"), str)
        and _SHA256.fullmatch(entry["sha256"]) is not None
        and isinstance(entry.get("bytes"), int)
        and not isinstance(entry["bytes"], bool)
    )
    if not ok:
        raise ConfigError(f'{config}: \'{FILES_KEY}\' entry {name!r} must be {{"bytes": int, "sha256": 64 hex}}')


def check_files(directory: Path, files: Any, config: Path) -> list[str]:
    """Checks every file that ``config.json`` records against its size and SHA-256.

    Args:
        directory: the model folder.
        files: the ``files`` entry of its config (``None``: a folder saved before digests were recorded).
        config: the config file, for messages.

    Returns:
        The names of the files checked (empty for a folder without digests).

    Raises:
        ConfigError: the ``files`` entry is malformed.
        WeightsError: a recorded file is missing or differs; the message names it and both digests.
    """
    if files is None:
        return []
    if not isinstance(files, dict):
        raise ConfigError(f"{config}: '{FILES_KEY}' must be an object {{file name: {{bytes, sha256}}}}")
    for name, want in files.items():
        _check_entry(config, name, want)
        path = directory / name
        if not path.is_file():
            raise WeightsError(f"{path} is missing; {config.name} records it ({want['bytes']} bytes, {want['sha256']})")
        got = file_digest(path)
        if got != {"bytes": want["bytes"], "sha256": want["sha256"]}:
            raise WeightsError(
                f"{path} does not match the SHA-256 recorded in {config}: recorded {want['sha256']} ({want['bytes']} "
                f"bytes), file {got['sha256']} ({got['bytes']} bytes). The file is damaged (a cut download, flipped "
                "bits) or was replaced: copy or download it again, or load with verify=False to skip the check"
            )
    return list(files)


def atomic_write_text(path: Path, text: str) -> None:
    """Writes ``path`` through a temporary file in the same folder and a rename: never half-written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_fields(data: Mapping[str, Any], cls: type, where: str) -> None:
    """Checks decoded JSON against the fields of dataclass ``cls``: no unknown key, and each value of its field's
    simple type (int, float, bool, str, dict, list, optionally None; other annotations are not checked).

    Raises:
        ConfigError: naming ``where`` and the key (with the valid keys, or the expected and the found type).
    """
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ConfigError(
            f"{where}: unknown keys {unknown} (written by a newer namc, or edited by hand); valid keys: {sorted(hints)}"
        )
    for key, value in data.items():
        allowed = _simple_types(hints.get(key))
        if allowed is None or (isinstance(value, allowed) and (bool in allowed or not isinstance(value, bool))):
            continue
        names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
        raise ConfigError(f"{where}: key {key!r} must be {names}, got {type(value).__name__} {value!r}")


def _simple_types(hint: Any) -> tuple[type, ...] | None:
    """The isinstance types of a simple annotation (None when it is not simple enough to check)."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union else ()
    parts = args or (hint,)
    out: list[type] = []
    for part in parts:
        base = typing.get_origin(part) or part
        if base is float:
            out += [float, int]
        elif base in (int, bool, str, dict, list, type(None)):
            out.append(base)
        else:
            return None
    return tuple(out)
