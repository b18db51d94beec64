"""Reading a throughput report: :func:`validate_report` checks it against :data:`REPORT_SCHEMA`, :func:`format_table`
prints it for people."""

from __future__ import annotations

from typing import Any

from namc.eval.throughput.schema import REPORT_SCHEMA

__all__ = ["format_table", "validate_report"]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def validate_report(report: Any, schema: dict[str, Any] | None = None) -> list[str]:
    """Check a report against :data:`REPORT_SCHEMA`; returns the problems found (empty when valid).

    Implements the subset of JSON Schema the schema uses (``anyOf`` included), so checking
    needs no extra package.
    """
    root = REPORT_SCHEMA if schema is None else schema
    errors: list[str] = []
    _check(report, root, "$", root, errors)
    return errors


def _check(value: Any, node: dict[str, Any], path: str, root: dict[str, Any], errors: list[str]) -> None:
    """Append to ``errors`` what is wrong with ``value`` at ``path`` against the schema ``node`` (``root`` holds the
    ``$defs`` that ``$ref`` points into)."""
    if "$ref" in node:
        node = root["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in node:  # valid where one alternative is
        before = len(errors)
        for alt in node["anyOf"]:
            mark = len(errors)
            _check(value, alt, path, root, errors)
            if len(errors) == mark:
                del errors[before:]
                return
        errors[before:] = [f"{path}: matches none of its alternatives ({'; '.join(errors[before:])})"]
        return
    kind = _json_type(value)
    if "type" in node:
        allowed = node["type"] if isinstance(node["type"], list) else [node["type"]]
        ok = kind in allowed or (kind == "integer" and "number" in allowed)
        if not ok:
            errors.append(f"{path}: expected {'/'.join(allowed)}, got {kind}")
            return
    errors += _value_problems(value, kind, node, path)
    if kind == "object":
        _check_object(value, node, path, root, errors)
    if kind == "array" and "items" in node:
        for i, sub in enumerate(value):
            _check(sub, node["items"], f"{path}[{i}]", root, errors)


def _value_problems(value: Any, kind: str, node: dict[str, Any], path: str) -> list[str]:
    """What ``value`` (of JSON type ``kind``) breaks of ``node``'s ``const``, ``enum`` and ``minimum``."""
    problems = []
    if "const" in node and value != node["const"]:
        problems.append(f"{path}: expected {node['const']!r}, got {value!r}")
    if "enum" in node and value not in node["enum"]:
        problems.append(f"{path}: {value!r} not in {node['enum']}")
    if "minimum" in node and kind in ("integer", "number") and value < node["minimum"]:
        problems.append(f"{path}: {value} < minimum {node['minimum']}")
    return problems


def _check_object(
    value: dict[str, Any], node: dict[str, Any], path: str, root: dict[str, Any], errors: list[str]
) -> None:
    """The required keys of an object, then each of its values against its property's (or the extra) schema."""
    for key in node.get("required", []):
        if key not in value:
            errors.append(f"{path}: missing {key!r}")
    props = node.get("properties", {})
    extra = node.get("additionalProperties")
    for key, sub in value.items():
        if key in props:
            _check(sub, props[key], f"{path}.{key}", root, errors)
        elif isinstance(extra, dict):
            _check(sub, extra, f"{path}.{key}", root, errors)


def _stat(s: dict[str, Any], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}-{fmt.format(s['max'])}]"


def _shortlist(entry: dict[str, Any] | None) -> str:
    return "off" if entry is None else f"{entry['size']} ({entry['source']})"


def _parts(model: dict[str, Any], precision: str) -> str:
    """What the parts ran in: ``grid bf16, MIR fp32, ...`` (reports before schema 8 name the grid only)."""
    parts = model.get("part_precisions") or {"grid": model.get("grid_precision", precision)}
    return ", ".join(f"{'MIR' if part == 'mir' else part} {kind}" for part, kind in parts.items())


def _run(row: dict[str, Any]) -> str:
    """``backend:precision`` of a row (reports before schema 12 record neither)."""
    return f"{row['backend']}:{row['precision']}" if "backend" in row else "-"


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.0f}"


def _header_lines(report: dict[str, Any]) -> list[str]:
    s, m, mdl = report["settings"], report["machine"], report["model"]
    p = mdl["parameters"]
    load = ""
    if m["load_average"]:
        load = f", load average {m['load_average'][0]:.2f} -> {report['load_average_end'][0]:.2f}"
    mm = report["matmul"]
    bits = m["cpu_kernels"]["int8_activation_bits"]
    backs = ", ".join(f"{k} {v['median'] / 1e9:.1f}" for k, v in mm["backends"].items())
    return [
        f"namc benchmark  model={mdl['name']} ({mdl['source']})  device={m['device']}  dtype={s['dtype']}  "
        f"precision={s['precision']} ({_parts(mdl, s['precision'])})  "
        f"static_decode={s['static_decode']}  shortlist={_shortlist(mdl['shortlist'])}  "
        f"threads={m['torch_threads']}  length_mode={s['length_mode']}  max_new_tokens={s['max_new_tokens']}",
        f"machine: {m['cpu_model']} ({m['cpu_kernels']['capability']}), {m['usable_cpus']} usable CPUs, "
        f"torch {m['torch_version']}"
        + (f", int8 kernels {m['int8_kernels']} ({bits}-bit activations)" if s["precision"] == "int8" else "")
        + (", no oneDNN bf16 here" if s["precision"] == "bf16" and not m["cpu_kernels"]["onednn_bf16"] else "")
        + (f", GPU {m['gpu']['name']}" if m["gpu"] else "")
        + load,
        f"parameters: total {p['total'] / 1e6:.1f}M, inference {p['inference'] / 1e6:.1f}M "
        f"(grid {p['grid'] / 1e6:.1f}M, MIR {(p['mir'] - p['mir_pretrain_heads']) / 1e6:.1f}M, "
        f"FDG {p['fdg'] / 1e6:.1f}M); without the "
        f"{mdl['parameters_paper_style']['vocab_embedding'] / 1e6:.2f}M vocabulary embedding "
        f"{mdl['parameters_paper_style']['inference_without_vocab_embedding'] / 1e6:.1f}M (paper: "
        f"{mdl['parameters_paper_style']['paper'] / 1e6:.1f}M)",
        f"matmul {mm['size']}^3 {mm['dtype']}: GFLOP/s {backs} (reference: {mm['best_backend']}, the faster of "
        + " and ".join(f"{r / 1e9:.1f}" for r in mm.get("runs", [mm["flops_per_s"]]))
        + " before / after the timed calls)",
    ]


def _inference_lines(report: dict[str, Any]) -> list[str]:
    header = (
        f"{'run':<16} {'batch':>5} {'mode':<7} {'tokens/s':>26} {'pairs/s':>22} {'s/pair':>9} {'peak MiB':>9} "
        f"{'eff.':>6}"
    )
    lines = [header, "-" * len(header)]
    for e in report["inference"]:
        eff = e["flops"]["efficiency"] if e["flops"] else None
        pairs = _stat(e["pairs_per_s"], "{:.2f}")
        lines.append(
            f"{_run(e):<16} {e['batch_size']:>5} {e['mode']:<7} {_stat(e['tokens_per_s']):>26} {pairs:>22} "
            f"{e['latency_s_per_pair']:>9.4f} {_mib(e['peak_memory']['delta_bytes']):>9} "
            f"{'' if eff is None else f'{eff:.0%}':>6}"
        )
    if report["reference"]:
        lines += [
            "",
            f"{'namc run':<16} {'batch':>5} {'compared with':<26} {'tokens/s':>26} {'speed-up':>9} {'same ids':>9}",
        ]
        for r in report["reference"]:
            sp = "n/a" if r["speedup"] is None else f"{r['speedup']:.2f}x"
            same = "-" if r["tokens_match"] is None else str(r["tokens_match"])
            lines.append(
                f"{_run(r):<16} {r['batch_size']:>5} {r['mode'] + ' vs ' + r['compared_with']:<26} "
                f"{_stat(r['tokens_per_s']):>26} "
                f"{sp:>9} {same:>9}"
            )
    if report.get("peer"):
        peer = report["peer"]
        pp, encoding, decoding = peer["parameters"], peer["encoder_linear_maps"], peer["linear_maps"]
        maps = (
            f"every linear map {decoding}"
            if encoding == decoding
            else f"linear maps {encoding} encoding, {decoding} decoding"
        )
        lines.append(
            f"CLIP4IDC peer: {pp['total'] / 1e6:.1f}M parameters ({pp['inference'] / 1e6:.1f}M run at inference; "
            f"paper {peer['paper_parameters'] / 1e6:.1f}M), random weights, "
            f"{report['settings'].get('reference_precision') or report['settings']['precision']}, {maps}"
        )
    return lines


def _training_lines(training: dict[str, Any]) -> list[str]:
    t = training
    lines = [
        f"training ({t['kind']}, batch {t['batch_size']}, VQGAN in step: {t['vqgan_in_step']}): "
        f"steps/s {_stat(t['steps_per_s'], '{:.3f}')}, pairs/s {_stat(t['pairs_per_s'], '{:.2f}')}, "
        f"peak +{_mib(t['peak_memory']['delta_bytes'])} MiB",
    ]
    est = t["pretrain_estimate"]
    if est:
        lines.append(
            f"pre-training {est['pairs']:,} pairs x {est['epochs']} epochs on this device: "
            f"{est['hours']:.1f} h [{est['hours_min']:.1f}-{est['hours_max']:.1f}] "
            f"({est['hours'] / 24:.1f} days) at batch {t['batch_size']}; on {est['devices']} such devices at "
            f"linear scaling {est['hours_on_devices']:.1f} h"
        )
    return lines


def format_table(report: dict[str, Any]) -> str:
    """The report as plain-text tables (medians with [min-max] over the repeats)."""
    lines = [*_header_lines(report), "", *_inference_lines(report)]
    if report["training"]:
        lines += ["", *_training_lines(report["training"])]
    paper = "; ".join(
        f"{r['model']} {r['parameters'] / 1e6:,.1f}M, {r['tokens_per_s']}" for r in report["paper_table5"]
    )
    lines += ["", f"paper Table 5 (params, tokens/s on one RTX 3090): {paper}"]
    return "\n".join(lines)
