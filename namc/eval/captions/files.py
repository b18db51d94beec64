"""The files of ``namc eval``: predictions, references and change types to read, and the results file it writes.

Read: predictions ``{"id": "caption"}`` or COCO results ``[{"image_id": id, "caption": "..."}]``; references
``{"id": ["reference", ...]}`` (CLEVR-Change's ``change_captions.json``); change types ``{"id": "type"}`` or
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

__all__ = ["load_predictions", "load_references", "load_types", "write_results"]


def _load_json(path: str) -> Any:
    """Parse a JSON file; a malformed or unreadable one is a ``ValueError`` naming the file (and line)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}") from err
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror})") from err


def load_predictions(path: str) -> dict[str, str]:
    """Read predictions: ``{"id": "caption"}`` or COCO results ``[{"image_id": id, "caption": "..."}]``.

    Returns:
        id -> caption, ids as strings.
    """
    data = _load_json(path)
    if isinstance(data, dict):
        return {str(k): v for k, v in data.items()}
    if isinstance(data, list):
        preds: dict[str, str] = {}
        for i, item in enumerate(data):
            if not isinstance(item, dict) or "image_id" not in item or "caption" not in item:
                raise ValueError(f"{path}: entry {i} is not {{'image_id': ..., 'caption': ...}}")
            key = str(item["image_id"])
            if key in preds:
                raise ValueError(f"{path}: entry {i} repeats image_id {key!r}")
            preds[key] = item["caption"]
        return preds
    raise ValueError(f"{path}: expected an object {{id: caption}} or a list of {{image_id, caption}}")


def load_references(path: str) -> dict[str, list[str]]:
    """Read references: ``{"id": ["reference", ...]}`` (the layout of CLEVR-Change's ``change_captions.json``)."""
    data = _load_json(path)
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
