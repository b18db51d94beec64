"""docs/benchmark_schema.md, rendered from :data:`~namc.eval.throughput.schema.REPORT_SCHEMA`: the page is never
edited by hand, so it cannot drift from the schema the validator uses::

    python -m namc.eval.throughput.schema_doc > docs/benchmark_schema.md

The prose that is not about one field (what each level runs, length modes, how the FLOPs are counted) is kept
here; every field's meaning is the ``description`` of its node in the schema.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from namc.eval.throughput.schema import REPORT_SCHEMA, SCHEMA_VERSION

__all__ = ["schema_markdown"]

_COMMAND = "python -m namc.eval.throughput.schema_doc > docs/benchmark_schema.md"

_INTRO = f"""\
# `namc benchmark` JSON report: schema version {SCHEMA_VERSION}

<!-- Generated from namc/eval/throughput/schema.py by `{_COMMAND}`: edit the schema, not this page. -->

`namc benchmark ... --output report.json` (and `namc.eval.throughput.run_benchmark`) write one JSON object. This
page is its contract: tools that read reports rely on the names, units and meanings below. Changes that remove or
rename a field, or change a unit or meaning, bump `schema_version`; new optional fields may be added without a
bump. The page is rendered from `namc.eval.throughput.REPORT_SCHEMA`, the machine-readable JSON Schema printed at
the end; `namc.eval.throughput.validate_report(report)` returns the problems of a report (`[]` when it is valid),
and `tests/test_throughput.py` checks that this page, that schema and real reports agree.

Units: times in **seconds**, throughputs **per second**, memory in **bytes**, FLOPs as **floating-point operations**
(a multiply-add is 2). Counts are integers; other numbers are JSON floats.

## What is measured
"""

_LEVELS = (
    ("level (`mode`)", "input", "what a timed call runs"),
    (
        "`decode`",
        "precomputed E_MIR (B, N, D)",
        "`model.fdg.generate(memory, max_new_tokens)`: FDG's cross-attention K/V of the memory once, then KV-cached "
        "greedy steps",
    ),
    (
        "`grid`",
        "precomputed ResNet grids",
        "`model.generate_ids(grid_1=..., grid_2=...)`: MIR interaction + `decode` (the paper pre-extracts the grids, "
        "appendix E.2)",
    ),
    ("`e2e`", "pixels (B, 3, H, W) in [0, 1]", "`model.generate_ids(images_1, images_2)`: ResNet grid + `grid`"),
)
_NAIVE = (
    ("`mode`", "compared with", "what it runs (`namc.eval.throughput.baselines`)"),
    (
        "`decode`",
        "`decode`",
        "`generate_uncached(model.fdg, memory)`: at every step the whole prefix is re-run without a cache, the "
        "memory's cross-attention K/V are recomputed and every position is projected onto the vocabulary",
    ),
    (
        "`clip4idc_decode`",
        "`decode`",
        "the CLIP4IDC peer (`namc.eval.throughput.clip4idc`, 173.7M parameters, random weights) from its visual "
        "memory: at every step its 3-layer cross encoder re-runs over the 100 visual tokens and its 3-layer decoder "
        "over the whole prefix, every position projected onto the 49,408-word vocabulary; namc's and the peer's calls "
        "alternate in one loop",
    ),
    (
        "`clip4idc_e2e`",
        "`e2e`",
        "the peer from the same pixels: open_clip ViT-B/32 (9 layers per image, 3 over the joined pair) once, then "
        "`clip4idc_decode`",
    ),
)
_MEASUREMENT = """\
**Length modes.** `fixed` (default): [EOS] is disabled for the run, so every pair generates exactly
`max_new_tokens` tokens (random weights would otherwise stop at arbitrary lengths); `eos`: generation stops at
[EOS] as in real use, and a row's tokens are counted up to and including its first [EOS] (`max_new_tokens` when it
produced none). Every inference and reference entry repeats the `length_mode` it used.

**Precision.** `precision` `bf16` / `int8` (CPU): namc runs `namc.backends.precision.inference_copy(model,
precision)` (BatchNorm folded; bf16 weights, or dynamic int8 linear layers), the peer a copy converted the same way,
and `matmul` is measured in that precision (`int8`: the dynamic int8 linear layer), so `flops.efficiency` compares
with the GEMM rate of the precision the decoder runs in. With `int8` and `int8_grid` `static` (the default) the grid's
ResNet blocks run in static int8 (`namc.backends.precision.calibrate_int8`, calibrated on 16 synthetic images of the
run's seed: scales change no timing). `model.part_precisions` says what each part ran in: a bf16 or int8 copy keeps
a narrow model's small matrices in fp32 (namc_base runs every part in the precision), where `flops.efficiency` still
compares with the precision's GEMM rate.

**Repeats.** Each measurement is `warmup` untimed calls followed by `repeats` timed calls (on CUDA with
`torch.cuda.synchronize()` around each), summarised by a [stats](#stats) object; its peak memory is measured over
one extra call after the timed ones ([memory](#memory)).
"""

# section -> prose printed under its heading, before its table
_NOTES = {
    "stats": """\
Throughput stats are computed per call (`tokens_per_call / time` of each call): `tokens_per_s.min` comes from the
slowest call, and with an odd number of repeats (the default is 5) `tokens_per_s.median` equals
`tokens_per_call / time_s.median`.""",
    "inference[].flops": """\
The analytic count, with D width, F FFN width, V vocabulary, N memory positions, L layers: per pair once
`L * 2 N D (2D)`; per generated token at step t (t + 1 cached keys) `L * (2 D 3D + 2 D D + 2 * 2 D D + 4 (t + 1) D +
4 N D + 2 * 2 D F) + 2 D V`, i.e. fused q/k/v projection, self-attention with the cache, self-attention output,
cross-attention query and output, cross-attention over N positions, FFN, and the vocabulary projection of the last
position only. Layer norms, GELU, softmax and residual additions are not counted. Rows that finished but are still
in the batch (the decoder drops finished rows once they are a quarter of it) are not counted either.""",
    "training": """\
The pre-training batch is built by the real `PretrainCollator` from synthetic items (random images, template
descriptions of 12 words per half, verbs from appendix D.2, random VQGAN codes unless `train_vqgan`); a model
without the pre-training modules is timed on fine-tuning steps over a `CaptionCollator` batch. Adam runs with the
paper's learning rates (appendix F; `namc.objectives.PRETRAIN_LR` / `FINETUNE_LR`).""",
}


def _table(rows: tuple[tuple[str, ...], ...] | list[tuple[str, ...]]) -> list[str]:
    """A markdown table: the first row is the header."""
    cells = [[c.replace("|", "\\|") for c in row] for row in rows]
    head, *body = cells
    return ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"] + [
        "| " + " | ".join(row) + " |" for row in body
    ]


def _anchor(title: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _type(node: dict[str, Any], link: str | None = None) -> str:
    """The type column: JSON types, ``array[item]``, a shared definition, enum values, a minimum; ``link`` points an
    object at its own section."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in node:
        return " or ".join(_type(alt) for alt in node["anyOf"])
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return "one of " + ", ".join(f"`{value}`" for value in node["enum"])
    kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
    text = "/".join(kinds)
    if "array" in kinds and "items" in node:
        text = text.replace("array", f"array[{_type(node['items'], link)}]")
    elif "object" in kinds and link is not None:
        text = text.replace("object", f"[object](#{link})")
    elif "object" in kinds and isinstance(node.get("additionalProperties"), dict):
        text = text.replace("object", f"object: name -> {_type(node['additionalProperties'])}")
    if "minimum" in node:
        text += f" >= {node['minimum']}"
    return text


def _child(node: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The object with properties a field holds (itself, or its items with ``[]``), if it has one."""
    if "properties" in node:
        return node, ""
    items = node.get("items")
    if isinstance(items, dict) and "properties" in items:
        return items, "[]"
    return None


def _sections(title: str, node: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(title, object node)`` of ``node`` and of every object with properties below it, depth first."""
    out = [(title, node)]
    for key, sub in node["properties"].items():
        child = _child(sub)
        if child is not None:
            out += _sections(f"{title}.{key}{child[1]}" if title else f"{key}{child[1]}", child[0])
    return out


def _section(heading: str, title: str, node: dict[str, Any], notes: dict[str, str]) -> list[str]:
    """A heading, the object's description, its note and the table of its fields."""
    lines = [heading, ""]
    if node.get("description"):
        lines += [_sentence(node["description"]), ""]
    if title in notes:
        lines += [notes.pop(title), ""]
    rows = [("field", "type", "meaning")]
    for key, sub in node["properties"].items():
        child = _child(sub)
        link = None if child is None else _anchor(f"{title}.{key}{child[1]}" if title else f"{key}{child[1]}")
        kind = _type(sub, link) + ("" if key in node.get("required", ()) else " (optional)")
        rows.append((f"`{key}`", kind, sub.get("description", "")))
    return [*lines, *_table(rows), ""]


def schema_markdown(schema: dict[str, Any] = REPORT_SCHEMA) -> str:
    """docs/benchmark_schema.md: the prose above, a table per object of ``schema``, then ``schema`` itself."""
    notes = dict(_NOTES)
    lines = [
        _INTRO,
        *_table(_LEVELS),
        "",
        "Naive reference decoders (`reference` entries), timed in the same process on the same inputs:",
        "",
        *_table(_NAIVE),
        "",
        _MEASUREMENT,
        "## Shared objects",
        "",
    ]
    for name, node in schema["$defs"].items():
        lines += _section(f"### `{name}`", name, node, notes)
    for title, node in _sections("", schema):
        lines += _section(f"### `{title}`" if title else "## Top level", title, node, notes)
    if notes:
        raise ValueError(f"notes for sections the schema does not have: {sorted(notes)}")
    lines += ["## JSON Schema", "", "```json", json.dumps(schema, indent=2), "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(schema_markdown())
