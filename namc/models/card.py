"""The model card: the ``README.md`` that :meth:`namc.NAMC.save_pretrained` writes into every model folder.

It says what the folder holds without loading it: the preset, the stage (pre-training or captioning), parameter
counts by module, the image size, the tokenizer, the training data and metrics when the caller knows them, and the
size and SHA-256 of each file (the same digests ``config.json`` records and ``from_pretrained`` checks). The front
matter (``library_name``, ``tags``, ``license``) is what the Hugging Face Hub reads.

The optional ``card`` data of ``save_pretrained``::

    {"training_data": "CLEVR-Change train split (namc data shapes ...)" or ["...", "..."],
     "metrics": {"val/cider": 1.234, ...},        # numbers, shown as given (state the scale in the name)
     "notes": "free text", "license": "mit"}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CARD_FILE", "CARD_KEYS", "check_card", "model_card"]

CARD_FILE = "README.md"
CARD_KEYS = ("training_data", "metrics", "notes", "license")

_MODULES = (
    ("grid", "ResNet grid encoder"),
    ("mir", "MIR encoder (embedding, co-attention, fusion)"),
    ("mir_pretrain_heads", "  of which pre-training heads"),
    ("fdg", "FDG caption decoder"),
    ("nim", "NIM (CLIP towers, pre-training only)"),
    ("vqgan", "VQGAN tokenizer (pre-training only, frozen)"),
    ("inference", "used for captioning"),
    ("total", "total"),
)


def check_card(card: Mapping[str, Any]) -> None:
    """Raises ValueError for an unknown key or a value of the wrong kind in model-card data."""
    unknown = sorted(set(card) - set(CARD_KEYS))
    if unknown:
        raise ValueError(f"unknown model card keys {unknown}; expected some of {list(CARD_KEYS)}")
    metrics = card.get("metrics") or {}
    if not isinstance(metrics, Mapping) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in metrics.values()
    ):
        raise ValueError("model card 'metrics' must map metric names to numbers")
    data = card.get("training_data")
    if data is not None and not isinstance(data, str | list | tuple):
        raise ValueError("model card 'training_data' must be a string or a list of strings")


def model_card(
    config: Mapping[str, Any],
    parameters: Mapping[str, int],
    tokenizer: str,
    files: Mapping[str, Mapping[str, Any]],
    version: str,
    card: Mapping[str, Any] | None = None,
) -> str:
    """The text of ``README.md`` for a saved model.

    Args:
        config: the saved ``NAMCConfig`` as a dict.
        parameters: :meth:`namc.NAMC.num_parameters`.
        tokenizer: a one-line description of the tokenizer, e.g. ``"word, 81 ids"``.
        files: ``{file name: {"bytes", "sha256"}}`` as recorded in ``config.json``.
        version: the namc version that wrote the folder.
        card: optional ``training_data``, ``metrics``, ``notes``, ``license`` (see the module docstring).

    Raises:
        ValueError: ``card`` has an unknown key or a value of the wrong kind.
    """
    card = dict(card or {})
    check_card(card)
    name = config.get("name", "namc")
    stage = "pre-training (NIM + MIR + FDG)" if config.get("pretraining") else "captioning (grid + MIR + FDG)"
    front = ["---", "library_name: namc", "tags:", "- image-difference-captioning", "- namc"]
    if card.get("license"):
        front.append(f"license: {card['license']}")
    lines = [*front, "---", "", f"# {name}", ""]
    lines += [
        "A NAMC image difference captioner (noise-aware masked image and description modelling), saved by "
        f"namc {version}.",
        "",
        "| | |",
        "| --- | --- |",
        f"| preset | `{name}` |",
        f"| stage | {stage} |",
        f"| image size | {config.get('image_size')} x {config.get('image_size')} px (RGB, [0, 1]) |",
        f"| tokenizer | {tokenizer} |",
        f"| width, heads, MIR / FDG layers | {config.get('dim')}, {config.get('heads')}, "
        f"{config.get('mir_layers')} / {config.get('fdg_layers')} |",
        f"| MIR fusion | `{config.get('fusion')}` |",
        "",
        "## Parameters",
        "",
        "| module | parameters |",
        "| --- | ---: |",
    ]
    lines += [f"| {label} | {parameters[key]:,} |" for key, label in _MODULES if parameters.get(key)]
    data = card.get("training_data")
    lines += ["", "## Training data", ""]
    if data is None:
        lines.append("Not recorded.")
    else:
        lines += [data] if isinstance(data, str) else [f"- {d}" for d in data]
    metrics = card.get("metrics") or {}
    lines += ["", "## Metrics", ""]
    if metrics:
        lines += ["| metric | value |", "| --- | ---: |"] + [f"| {k} | {v:.6g} |" for k, v in metrics.items()]
    else:
        lines.append("Not recorded.")
    if card.get("notes"):
        lines += ["", "## Notes", "", str(card["notes"])]
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "import namc",
        "",
        'model = namc.from_pretrained("path/to/this/folder")  # checks the SHA-256 of every file below',
        'print(namc.describe(model, "before.png", "after.png"))',
        "```",
        "",
        "or `namc describe before.png after.png --model path/to/this/folder`.",
        "",
        "## Files",
        "",
        "| file | bytes | SHA-256 |",
        "| --- | ---: | --- |",
    ]
    lines += [f"| {n} | {f['bytes']:,} | `{f['sha256']}` |" for n, f in files.items()]
    lines += ["", "`config.json` records these digests; `from_pretrained(..., verify=False)` skips the check."]
    return "\n".join(lines) + "\n"
