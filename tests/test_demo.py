"""``namc demo --fast``: the whole pipeline (shapes world, pre-training, fine-tuning, baselines, report) end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from namc.cli import main
from namc.lit.demo import FULL, demo_configs, format_report
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
        assert re.search(rf"^      {title} done in \d+ s$", err, re.M), title
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
