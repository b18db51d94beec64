"""The files of ``namc eval``: predictions, references and change types to read, and the results file it writes.

Read: predictions ``{"id": "caption"}``, COCO results ``[{"image_id": id, "caption": "..."}]`` or a results file
of :func:`write_results` (what ``namc eval --out`` and ``namc test`` write); references ``{"id": ["reference",
...]}`` (CLEVR-Change's ``change_captions.json``) or those of a results file; change types ``{"id": "type"}`` or
``{"type": [id, ...]}`` (CLEVR-Change's ``type_mapping.json``). Every reader raises a ``ValueError`` that names the
file (and the line of malformed JSON). Written: :func:`write_results`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from namc.eval.captions.metrics import few_ids
from namc.jsonl import JSONError, loads

__all__ = ["load_predictions", "load_references", "load_types", "write_results"]


def _load_json(path: str) -> Any:
    """Parse a JSON file through the bounded reader (:func:`namc.jsonl.loads`: depth, duplicate keys); a
    malformed, too deep or unreadable one is a ``ValueError`` naming the file (and line)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 ({err.reason} at byte {err.start})") from None
    try:
        return loads(text, max_chars=None)
    except JSONError as err:
        raise ValueError(f"{path}: malformed JSON: {err}") from None


def load_predictions(path: str) -> dict[str, str]:
    """Read predictions: ``{"id": "caption"}``, COCO results ``[{"image_id": id, "caption": "..."}]`` or the
    ``{"scores": ..., "captions": [{"id": id, "prediction": "...", ...}]}`` of :func:`write_results`.

    Returns:
        id -> caption, ids as strings.
    """
    data = _load_json(path)
    if _is_results(data):
        return _entries(path, data["captions"], "id", "prediction")
    if isinstance(data, dict):
        return {str(k): v for k, v in data.items()}
    if isinstance(data, list):
        return _entries(path, data, "image_id", "caption")
    raise ValueError(f"{path}: expected an object {{id: caption}} or a list of {{image_id, caption}}")


def _is_results(data: Any) -> bool:
    """``data`` has the layout :func:`write_results` writes."""
    return isinstance(data, dict) and set(data) == {"scores", "captions"} and isinstance(data["captions"], list)


def _entries(path: str, items: list, id_key: str, caption_key: str) -> dict[str, Any]:
    """``{item[id_key]: item[caption_key]}`` over a list of objects; a malformed entry or a repeated id is an error."""
    preds: dict[str, Any] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or id_key not in item or caption_key not in item:
            raise ValueError(f"{path}: entry {i} is not {{{id_key!r}: ..., {caption_key!r}: ...}}")
        key = str(item[id_key])
        if key in preds:
            raise ValueError(f"{path}: entry {i} repeats {id_key} {key!r}")
        preds[key] = item[caption_key]
    return preds


def load_references(path: str) -> dict[str, list[str]]:
    """Read references: ``{"id": ["reference", ...]}`` (the layout of CLEVR-Change's ``change_captions.json``) or
    those of a :func:`write_results` file."""
    data = _load_json(path)
    if _is_results(data):
        return _entries(path, data["captions"], "id", "references")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object {{id: [reference, ...]}}")
    return {str(k): v for k, v in data.items()}


def load_types(path: str) -> dict[str, str]:
    """Read change types: ``{"id": "type"}`` or, like CLEVR-Change's ``type_mapping.json``, ``{"type": [id, ...]}``.

    Returns:
        id -> change type, ids as strings.
    """
    data = _load_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object {{id: type}} or {{type: [id, ...]}}")
    if all(isinstance(v, list) for v in data.values()):
        types: dict[str, str] = {}
        for change_type, members in data.items():
            for key in members:
                if str(key) in types and types[str(key)] != change_type:
                    raise ValueError(f"{path}: id {key!r} has types {types[str(key)]!r} and {change_type!r}")
                types[str(key)] = change_type
        return types
    return {str(k): str(v) for k, v in data.items()}


def write_results(
    path: str | os.PathLike[str],
    predictions: Mapping[str, str],
    references: Mapping[str, Sequence[str]],
    scores: Mapping[str, Any],
) -> Path:
    """Write scores and every prediction beside its references as one JSON file.

    Layout: ``{"scores": scores, "captions": [{"id": id, "prediction": str, "references": [str]}, ...]}`` in the
    order of ``predictions``.

    Args:
        path: output file; parent folders are created.
        predictions: id -> predicted caption.
        references: id -> reference captions (every prediction id must be present).
        scores: the dict returned by :func:`evaluate_captions`.

    Returns:
        The path written.

    Raises:
        ValueError: a prediction id has no references.
    """
    missing = set(predictions) - set(references)
    if missing:
        raise ValueError(f"{len(missing)} prediction id(s) have no references: {few_ids(missing)}")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "scores": dict(scores),
        "captions": [
            {"id": key, "prediction": pred, "references": list(references[key])} for key, pred in predictions.items()
        ],
    }
    out.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return out
