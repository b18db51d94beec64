"""What the demo measures and reports: the trivial baseline, noise identification, and the report itself.

:func:`build_report` lays the results of the stages out as ``<out>/report.json``; :func:`format_report` is the
short text ``namc demo`` prints.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

__all__ = ["build_report", "format_report", "frequent_caption_baseline", "noise_identification", "pick_examples"]


def frequent_caption_baseline(root: Path, image_size: int) -> tuple[str, dict[str, Any], dict[str, str]]:
    """The trivial baseline: the most frequent training caption, predicted for every test pair.

    Args:
        root: the benchmark folder (CLEVR-Change layout).
        image_size: the side images are loaded at.

    Returns:
        ``(caption, scores, predictions)``: the caption (ties broken alphabetically), its test scores (per change
        type too; pairs without a type count as ``"none"``) and test id -> caption.
    """
    from namc.data.idc import build_benchmark
    from namc.lit.modules import caption_evaluator

    train = build_benchmark("clevr_change", root, "train", image_size)
    test = build_benchmark("clevr_change", root, "test", image_size)
    counts = collections.Counter(c for entry in train.entries for c in entry[3])
    caption = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    predictions = {entry[0]: caption for entry in test.entries}
    references = {entry[0]: list(entry[3]) for entry in test.entries}
    types = {entry[0]: entry[4] or "none" for entry in test.entries}
    return caption, caption_evaluator().evaluate(predictions, references, change_types=types), predictions


def noise_identification(model_dir: Path, corpus: Path, out_png: Path, batch_size: int) -> dict[str, Any]:
    """AUROC of NIM's irrelevance on the held-out corpus, and the relevance-map figure.

    Args:
        model_dir: the pre-trained model (a ``from_pretrained`` folder, NIM included).
        corpus: the held-out corpus manifest (``manifest.jsonl``) with its noise labels.
        out_png: where to draw the relevance maps of up to two pairs of the first batch, noisy ones first.
        batch_size: pairs per batch.

    Returns:
        what :func:`~namc.eval.noise.noise_auroc` returns, plus ``"figure"``: the PNG written.
    """
    import torch
    from torch.utils.data import DataLoader

    from namc.data.collate import PretrainCollator
    from namc.data.corpus import CorpusDataset
    from namc.eval.noise import noise_auroc
    from namc.eval.plots import plot_relevance
    from namc.lit.cli import clip_context_length
    from namc.models.namc import NAMC

    model = NAMC.from_pretrained(model_dir)
    collate = PretrainCollator(
        model.tokenizer, clip_context_length(model.config.clip_model), model.config.max_caption_len
    )
    loader = DataLoader(CorpusDataset(corpus, model.config.image_size), batch_size=batch_size, collate_fn=collate)
    batches = list(loader)
    result = noise_auroc(model, batches)
    first = batches[0]
    noisy = [i for i in range(len(first["ids"])) if bool(first["noise1"][i].any() and first["noise2"][i].any())]
    noisy += [i for i in range(len(first["ids"])) if bool(first["noise1"][i].any() or first["noise2"][i].any())]
    pairs = list(dict.fromkeys(noisy))[:2] or [0]
    with torch.no_grad():
        result["figure"] = str(plot_relevance(model, first, out_png, pairs=pairs))
    return result


def pick_examples(test_captions: Path, count: int) -> list[dict[str, Any]]:
    """Up to ``count`` test pairs spread over the captions file FinetuneModule wrote (none when it is missing).

    Returns:
        ``[{"id", "namc": prediction, "references"}, ...]``.
    """
    if not test_captions.is_file():
        return []
    rows = json.loads(test_captions.read_text())["captions"]
    step = max(len(rows) // max(count, 1), 1)
    picked = [rows[min(i * step + i % 2, len(rows) - 1)] for i in range(min(count, len(rows)))]
    return [{"id": r["id"], "namc": r["prediction"], "references": r["references"]} for r in picked]


def _metrics(scores: dict[str, Any]) -> dict[str, Any]:
    """The overall scores rounded to 2 decimals (SPICE's "unavailable (...)" kept as is)."""
    overall = scores["overall"]
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in overall.items()}


def _cider_per_type(scores: dict[str, Any]) -> dict[str, float]:
    """Change type -> CIDEr-D rounded to 2 decimals (empty without per-type scores)."""
    return {t: round(v["CIDEr-D"], 2) for t, v in scores.get("per_type", {}).items()}


def build_report(
    *,
    settings: dict[str, Any],
    data: dict[str, Any],
    test_scores: dict[str, dict[str, Any]],
    frequent_caption: str,
    noise: dict[str, Any],
    pretrain_val: dict[str, float],
    parameters: int,
    examples: list[dict[str, Any]],
    paths: dict[str, str],
    timings: dict[str, float],
) -> dict[str, Any]:
    """Lay the demo's results out as its report (``report.json``), rounding the numbers for reading.

    Args:
        settings: the settings of the run (with ``fast``, ``seed``, ``torch_threads``).
        data: what the shapes-world generation returned (``corpus``, ``corpus_val``, ``benchmark``).
        test_scores: system (``namc``, ``no_pretraining``, ``frequent_caption``, in the order the report lists
            them) -> its test-split scores (what :meth:`~namc.eval.captions.CaptionEvaluator.evaluate` returns).
        frequent_caption: the trivial baseline's caption.
        noise: what :func:`noise_identification` returned.
        pretrain_val: the pre-training run's last ``val/*`` metrics.
        parameters: the number of parameters of the pre-trained model.
        examples: what :func:`pick_examples` returned.
        paths: the model folders, logs, figure, configs and test captions.
        timings: stage -> seconds.

    Returns:
        the report dict.
    """
    return {
        "settings": settings,
        "data": {
            "corpus_pairs": data["corpus"]["pairs"],
            "corpus_word_noise_fraction": round(data["corpus"]["word_noise_fraction"], 4),
            "benchmark_splits": data["benchmark"]["splits"],
            "test_pairs": test_scores["namc"]["num_pairs"],
        },
        "test_metrics": {system: _metrics(scores) for system, scores in test_scores.items()},
        "test_cider_per_type": {
            "namc": _cider_per_type(test_scores["namc"]),
            "no_pretraining": _cider_per_type(test_scores["no_pretraining"]),
        },
        "frequent_caption": frequent_caption,
        "noise_identification": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in noise.items()},
        "pretrain_validation": {k: round(v, 4) for k, v in pretrain_val.items()},
        "parameters": parameters,
        "examples": examples,
        "paths": paths,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
    }


def format_report(report: dict[str, Any]) -> str:
    """The short text report ``namc demo`` prints."""
    m = report["test_metrics"]
    lines = [
        "",
        f"namc demo: shapes world, test split of {report['data']['test_pairs']} image pairs (half of them distractors "
        f"without change); pre-trained on {report['data']['corpus_pairs']} pairs with "
        f"{100 * report['data']['corpus_word_noise_fraction']:.1f}% injected noise words; scores x100",
    ]
    if report["settings"].get("pretrain_grid_trainable"):
        lines.append(
            "(pre-training also trains the ResNet grid encoder, which has no ImageNet weights here; fine-tuning keeps "
            "it frozen, and the baseline without pre-training keeps it random)"
        )
    lines.append(f"  {'system':<34} {'CIDEr-D':>8} {'BLEU-4':>8} {'METEOR':>8} {'ROUGE-L':>8}")
    names = {
        "namc": "NAMC (pre-trained + fine-tuned)",
        "no_pretraining": "same model, no pre-training",
        "frequent_caption": "most frequent training caption",
    }
    for key, label in names.items():
        r = m[key]
        lines.append(f"  {label:<34} {r['CIDEr-D']:>8.2f} {r['BLEU-4']:>8.2f} {r['METEOR']:>8.2f} {r['ROUGE-L']:>8.2f}")
    n = report["noise_identification"]
    lines += [
        f"  frequent caption: {report['frequent_caption']!r}",
        f"NIM noise identification (held-out corpus, {n['tokens']} word tokens, {n['noise_tokens']} injected): "
        f"AUROC of 1 - R_T = {n['auroc']:.3f}",
        "examples (test split):",
    ]
    for ex in report["examples"]:
        lines.append(f"  {ex['id']}: {ex['namc']!r}   (reference: {ex['references'][0]!r})")
    p = report["paths"]
    lines += [
        f"model (namc.from_pretrained / namc describe --model): {p['model']}",
        f"TensorBoard logs: tensorboard --logdir {p['tensorboard']}",
        f"relevance maps: {p['relevance_maps']}",
        f"report: {Path(p['configs']).parent / 'report.json'}; configs to rerun a stage: {p['configs']}",
        "wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in report["timings_s"].items()),
    ]
    return "\n".join(lines)
