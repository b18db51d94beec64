"""``namc demo --fast``: the whole pipeline (shapes world, pre-training, fine-tuning, baselines, report) end to end."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from namc.cli import main
from namc.lit.demo import FULL, demo_configs, format_report
from namc.models.namc import NAMC

REPO = Path(__file__).resolve().parents[1]


def test_demo_fast_end_to_end(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--fast", "--out", str(out), "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert format_report(report) in printed

    metrics = report["test_metrics"]
    for system in ("namc", "no_pretraining", "frequent_caption"):
        for key in ("CIDEr-D", "BLEU-4", "METEOR", "ROUGE-L"):
            assert isinstance(metrics[system][key], float) and metrics[system][key] >= 0.0
        assert str(metrics[system]["SPICE"]).startswith("unavailable") or isinstance(metrics[system]["SPICE"], float)
    noise = report["noise_identification"]
    assert 0.0 <= noise["auroc"] <= 1.0 and 0 < noise["noise_tokens"] < noise["tokens"]
    assert report["frequent_caption"] and report["examples"]

    paths = report["paths"]
    model = NAMC.from_pretrained(paths["model"])  # the fine-tuned model is from_pretrained-loadable
    assert model.nim is None
    assert NAMC.from_pretrained(paths["pretrained_model"]).nim is not None
    assert list(Path(paths["tensorboard"]).rglob("events.out.tfevents.*"))
    assert Path(paths["relevance_maps"]).read_bytes()[:4] == b"\x89PNG"
    assert Path(paths["test_captions"]).is_file()
    assert set(report["timings_s"]) >= {"data", "pretrain", "finetune", "scratch", "evaluation", "total"}


def test_demo_configs_are_the_shipped_yaml() -> None:
    for name, config in demo_configs("runs/demo", FULL, seed=0, progress=True).items():
        shipped = yaml.safe_load((REPO / "configs" / "demo" / f"{name}.yaml").read_text())
        assert shipped == config, f"configs/demo/{name}.yaml differs from namc.lit.demo.demo_configs"
