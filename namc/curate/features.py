"""The image-feature shards that ``namc curate embed`` writes and pair mining reads.

One folder per encoder, ``WORKDIR/features/<name>/`` with ``name`` ``clip`` or ``dino``::

    meta.json                      {"model", "dim", "shard_size", "images", "n_images", "n_shards"}
    shard-00000.keys.txt           the n_0 image keys of the shard's rows, in order (UTF-8, one per line)
    shard-00000.skipped.jsonl      the shard's images that were skipped: {"key", "image", "reason", "error"}
    shard-00000.npy                float16 (n_0, dim), every row L2-normalised; written last
    ...

Shard ``i`` covers the lines ``[i * S, (i + 1) * S)`` (1-based line ``l`` is in shard ``(l - 1) // S``) of
``images.jsonl``; every line of it is either a row or a line of ``skipped.jsonl``. Each file is written to a
temporary file in the same folder and renamed (:func:`os.replace`), and the ``.npy`` is renamed last: its presence
means the shard is complete, so a reader never sees half a shard and a killed run redoes at most the shards it was
in. ``reason`` is an :class:`~namc.data.issues.IssueKind` value (``missing_image``, ``corrupt_image``,
``oversized_image``, ``malformed_line``, ``duplicate_id``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from namc.jsonl import json_line, loads
from namc.models.files import atomic_write_text, read_json

__all__ = [
    "META_FILE",
    "FeaturesError",
    "atomic_save_npy",
    "check_meta",
    "complete_shards",
    "load_features",
    "missing_shards",
    "read_meta",
    "shard_path",
    "tally",
    "write_meta",
    "write_shard",
]

logger = logging.getLogger(__name__)

META_FILE = "meta.json"
_SHARD = "shard-{:05d}"
# meta.json keys that must agree for a rerun to continue a folder (n_shards follows from them)
_IDENTITY = ("model", "dim", "shard_size", "images", "n_images")


class FeaturesError(ValueError):
    """A features folder that cannot be used (the message names the folder or file)."""


def shard_path(directory: str | Path, index: int, suffix: str) -> Path:
    """``directory/shard-%05d{suffix}``, e.g. ``suffix=".npy"``, ``".keys.txt"``, ``".skipped.jsonl"``."""
    return Path(directory) / (_SHARD.format(index) + suffix)


def atomic_save_npy(path: Path, array: np.ndarray) -> None:
    """``np.save`` through a temporary file in the same folder and a rename: the file is whole or absent."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_shard(
    directory: str | Path,
    index: int,
    keys: Sequence[str],
    features: np.ndarray,
    skipped: Sequence[dict[str, Any]],
) -> None:
    """Writes one complete shard: keys, skipped images, then the float16 features (the completion mark).

    Args:
        directory: the encoder's features folder.
        index: the shard number.
        keys: (n,) image keys of the rows.
        features: (n, dim) L2-normalised features (stored as float16).
        skipped: one ``{"key", "image", "reason", "error"}`` dict per skipped line of the shard.
    """
    directory = Path(directory)
    features = np.asarray(features)
    if features.ndim != 2 or features.shape[0] != len(keys):
        raise ValueError(f"shard {index}: {features.shape} features for {len(keys)} keys")
    if any("\n" in k or "\r" in k for k in keys):
        raise ValueError(f"shard {index}: an image key holds a line break")
    atomic_write_text(shard_path(directory, index, ".keys.txt"), "".join(f"{k}\n" for k in keys))
    lines = "".join(json_line(s, sort_keys=True) for s in skipped)
    atomic_write_text(shard_path(directory, index, ".skipped.jsonl"), lines)
    atomic_save_npy(shard_path(directory, index, ".npy"), features.astype(np.float16))


def write_meta(directory: str | Path, meta: dict[str, Any]) -> None:
    """Writes ``meta.json`` atomically (keys sorted, so a rerun writes the same bytes)."""
    atomic_write_text(Path(directory) / META_FILE, json.dumps(meta, indent=1, sort_keys=True) + "\n")


def read_meta(directory: str | Path) -> dict[str, Any]:
    """The folder's ``meta.json``.

    Raises:
        FeaturesError: no ``meta.json`` (not a features folder), or it is not a JSON object with the format's keys.
    """
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise FeaturesError(f"{directory}: no {META_FILE}; not a features folder (write one with `namc curate embed`)")
    meta = read_json(path, FeaturesError)
    missing = [k for k in (*_IDENTITY, "n_shards") if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise FeaturesError(f"{path}: missing keys {missing}")
    return meta


def check_meta(directory: str | Path, meta: dict[str, Any]) -> None:
    """Raises :class:`FeaturesError` when the folder holds features of other settings than ``meta`` (a rerun must
    use the same model, shard size and images file, or another folder)."""
    old = read_meta(directory)
    diff = [f"{k}: {old.get(k)!r} there, {meta.get(k)!r} now" for k in _IDENTITY if old.get(k) != meta.get(k)]
    if diff:
        raise FeaturesError(
            f"{directory} holds features of other settings ({'; '.join(diff)}): use another output folder, or delete "
            "it to start again"
        )


def complete_shards(directory: str | Path, n_shards: int) -> list[int]:
    """The shard numbers whose ``.npy`` (the completion mark) exists."""
    return [i for i in range(n_shards) if shard_path(directory, i, ".npy").is_file()]


def missing_shards(directory: str | Path) -> list[int]:
    """The shard numbers of the folder's ``meta.json`` that are not complete yet."""
    n = int(read_meta(directory)["n_shards"])
    done = set(complete_shards(directory, n))
    return [i for i in range(n) if i not in done]


def tally(directory: str | Path, shards: Sequence[int]) -> tuple[int, dict[str, int]]:
    """Rows and skipped images by reason over ``shards`` of a folder (for a run's summary)."""
    rows, reasons = 0, {}
    for i in shards:
        rows += len(_lines(shard_path(directory, i, ".keys.txt")))
        for line in _lines(shard_path(directory, i, ".skipped.jsonl")):
            try:
                reason = str(loads(line)["reason"])
            except (ValueError, KeyError, TypeError):  # a damaged line still stands for one skipped image
                reason = "unreadable_record"
            reasons[reason] = reasons.get(reason, 0) + 1
    return rows, reasons


def _lines(path: Path) -> list[str]:
    """The lines of a file written one item per ``\n``-ended line. Not ``str.splitlines``, which also breaks at
    U+2028, U+0085, form feeds and other characters that an image's file name (a key) may hold."""
    return [line for line in path.read_text(encoding="utf-8-sig").split("\n") if line]


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out, start = [], None
    for j, n in enumerate(numbers):
        if start is None:
            start = n
        if j + 1 == len(numbers) or numbers[j + 1] != n + 1:
            out.append(f"{start}" if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)


def load_features(directory: str | Path, *, allow_missing: bool = False) -> tuple[list[str], np.ndarray]:
    """All keys and features of a folder: its complete shards concatenated in shard order.

    Args:
        directory: a features folder (``meta.json`` and shards).
        allow_missing: return the complete shards (with a warning naming the missing ones) instead of failing.

    Returns:
        ``(keys, features)``: n image keys and an (n, dim) float16 array, row ``j`` the feature of ``keys[j]``.

    Raises:
        FeaturesError: shards are missing (unless ``allow_missing``; the message names them and says to rerun
            ``namc curate embed``), or a shard's keys and rows disagree, or its width is not ``meta["dim"]``.
    """
    directory = Path(directory)
    meta = read_meta(directory)
    n_shards, dim = int(meta["n_shards"]), int(meta["dim"])
    done = complete_shards(directory, n_shards)
    missing = [i for i in range(n_shards) if i not in set(done)]
    if missing:
        message = (
            f"{directory}: {len(missing)} of {n_shards} shards missing ({_ranges(missing)}); rerun `namc curate embed` "
            "with the same settings to finish them"
        )
        if not allow_missing:
            raise FeaturesError(message)
        logger.warning("%s; loading the %d complete ones", message, len(done))
    keys: list[str] = []
    parts: list[np.ndarray] = []
    for i in done:
        path = shard_path(directory, i, ".npy")
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:
            raise FeaturesError(f"{path}: unreadable ({err}); delete it and rerun `namc curate embed`") from None
        names = _lines(shard_path(directory, i, ".keys.txt"))
        if arr.ndim != 2 or arr.shape[1] != dim or arr.shape[0] != len(names):
            raise FeaturesError(f"{path}: shape {arr.shape} for {len(names)} keys of width {dim}")
        keys += names
        parts.append(arr.astype(np.float16, copy=False))
    array = np.concatenate(parts) if parts else np.zeros((0, dim), np.float16)
    return keys, array
