"""``namc demo --fast``: the whole pipeline (shapes world, pre-training, fine-tuning, baselines, report) end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from namc.cli import main
from namc.data.synthetic import generate_benchmark, generate_corpus
from namc.lit.demo import FULL, demo_configs, format_report
from namc.lit.demo.report import build_report, frequent_caption_baseline, noise_identification, pick_examples
from namc.models import create_model
from namc.models.namc import NAMC

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # the demo
def test_demo_fast_end_to_end(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--fast", "--out", str(out), "--workers", "1"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    _check_progress(captured.err, printed)
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


def _check_progress(err: str, out: str) -> None:
    """By default the demo says on stderr how long it takes, then where it is: stages, data bars, epochs, tests."""
    first = err.lstrip().splitlines()[0]
    assert re.fullmatch(
        r"namc demo: 5 stages, about \d+ s of wall time on a 2-core CPU \(data \d+ s, pre-training "
        r"\d+ s, fine-tuning \d+ s, baseline \d+ s, evaluation \d+ s\); this machine has \d+ CPU "
        r"cores",
        first,
    ), first
    for stage in range(1, 6):
        assert re.search(rf"^\[{stage}/5\] .*\(.*about \d+ s on 2 cores\)$", err, re.M), f"stage {stage}"
    for title in ("data", "pre-training", "fine-tuning", "baseline", "evaluation"):
        # a stage past a minute (a loaded machine) prints m:ss, as namc.lit.demo.settings.clock writes it
        assert re.search(rf"^      {title} done in (\d+ s|\d+:\d\d(:\d\d)?)$", err, re.M), title
    for bar in ("writing corpus", "writing corpus_val", "writing clevr_change"):
        assert re.search(rf"{bar}: 100%.*pair/s", err), bar
    for title in ("pre-training", "fine-tuning", "baseline"):
        epoch = rf"^  {title}  epoch 1/1  \d+ steps in [\d.]+ s \([\d.]+ it/s\)  loss [\d.]+  validation [\d.]+ s"
        assert re.search(epoch, err, re.M), title
    assert err.count("testing on the test split") == 2 and err.count("test done in") == 2
    assert "epoch 1/1" not in out and "namc demo: 5 stages" not in out  # stdout has the report only


class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    ("flags", "progress", "bars"), [((), True, False), (("--quiet",), False, False), (("--verbose",), True, True)]
)
def test_demo_flags_choose_the_progress(
    flags: tuple[str, ...], progress: bool, bars: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--quiet`` turns the progress off, ``--verbose`` adds Lightning's bars (the run itself is the test above)."""
    import namc.lit.demo.run as run

    seen: dict[str, object] = {}

    def record(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(run, "run_demo", record)
    with pytest.raises(_Stop):
        main(["demo", "--fast", *flags])
    assert seen["progress"] is progress and seen["bars"] is bars


def test_demo_configs_are_the_shipped_yaml() -> None:
    for name, config in demo_configs("runs/demo", FULL, seed=0, progress=True).items():
        shipped = yaml.safe_load((REPO / "configs" / "demo" / f"{name}.yaml").read_text())
        assert shipped == config, f"configs/demo/{name}.yaml differs from namc.lit.demo.demo_configs"


def test_demo_evaluation_and_report_on_a_small_world(tmp_path: Path) -> None:
    """The demo's last stage and its report, on a shapes world of a few pairs and an untrained model: the trivial
    baseline's scores, NIM's noise identification and its figure, the examples, report.json and the printed text
    (the training stages run in the end-to-end test above)."""
    benchmark = generate_benchmark(tmp_path / "clevr_change", 12, image_size=32, seed=0, n_captions=2)
    corpus = generate_corpus(tmp_path / "corpus_val", 8, image_size=64, seed=1, noise_rate=0.2)
    model = create_model("namc_tiny", dim=32, heads=2).save_pretrained(tmp_path / "model")

    caption, frequent, predictions = frequent_caption_baseline(tmp_path / "clevr_change", 32)
    assert set(predictions.values()) == {caption} and frequent["num_pairs"] == len(predictions) > 0
    noise = noise_identification(model, tmp_path / "corpus_val" / "manifest.jsonl", tmp_path / "maps.png", 8)
    assert 0.0 <= noise["auroc"] <= 1.0 and 0 < noise["noise_tokens"] < noise["tokens"]
    assert Path(noise["figure"]).read_bytes()[:4] == b"\x89PNG"
    captions = tmp_path / "test.json"
    rows = [{"id": k, "prediction": v, "references": ["a reference"]} for k, v in predictions.items()]
    captions.write_text(json.dumps({"captions": rows}))
    examples = pick_examples(captions, 3)
    assert len(examples) == min(3, len(rows)) and {e["namc"] for e in examples} == {caption}

    report = build_report(
        settings={"fast": True, "seed": 0},
        data={"corpus": corpus, "corpus_val": corpus, "benchmark": benchmark},
        test_scores={"namc": frequent, "no_pretraining": frequent, "frequent_caption": frequent},
        frequent_caption=caption,
        noise=noise,
        pretrain_val={"val/loss": 1.0},
        parameters=1,
        examples=examples,
        paths={k: str(tmp_path / k) for k in ("model", "tensorboard", "relevance_maps", "configs")},
        timings={"total": 1.0},
    )
    metrics = json.loads(json.dumps(report))["test_metrics"]  # report.json holds plain JSON
    for key in ("CIDEr-D", "BLEU-4", "METEOR", "ROUGE-L"):
        assert isinstance(metrics["namc"][key], float) and metrics["namc"][key] >= 0.0
    text = format_report(report)
    assert f"frequent caption: {caption!r}" in text and f"AUROC of 1 - R_T = {noise['auroc']:.3f}" in text
