"""namc.experiment: the study schema, the statistics against hand computations, skipping finished runs, the report
from results alone, and (slow) a two-variant, two-seed study end to end through real `namc fit` / `namc test`
subprocesses at the --fast scale."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from namc.experiment import load_study, read_results, run_study, write_results
from namc.experiment import runner as runner_mod
from namc.experiment.cli import main as experiment_main
from namc.experiment.cli import report_dir
from namc.experiment.stats import paired, summarise
from namc.experiment.study import StudyError, apply_overrides

ROOT = Path(__file__).resolve().parents[1]
T_975_DF1 = 12.706204736174698  # Student t, 0.975 quantile, 1 degree of freedom (tables)
T_975_DF4 = 2.7764451051977987  # 4 degrees of freedom


def _study(tmp_path: Path, **extra) -> Path:
    """A two-variant, two-seed fine-tuning-only study; its ``fast`` section is the tiny shapes world."""
    scratch = {"model.init_args.pretrained": None, "model.init_args.overrides": {"dim": 32, "heads": 2, "dropout": 0.0}}
    spec = {
        "name": "tiny",
        "title": "tiny study",
        "recipe": {"finetune": str(ROOT / "configs/demo/finetune.yaml")},
        "data": {"shapes": {"corpus_pairs": 200, "corpus_val_pairs": 20, "benchmark_pairs": 200, "image_size": 64}},
        "scale": {"finetune": {"trainer.max_epochs": 20}},
        "fast": {
            "shapes": {"corpus_pairs": 8, "corpus_val_pairs": 4, "benchmark_pairs": 16},
            "scale": {
                "finetune": {
                    "trainer.max_epochs": 1,
                    "trainer.check_val_every_n_epoch": 1,
                    "trainer.limit_train_batches": 2,
                    "data.init_args.batch_size": 8,
                }
            },
        },
        "seeds": [0, 1],
        "reference": "a",
        "variants": {
            "a": {"pretrain": None, "finetune": scratch},
            "b": {"pretrain": None, "finetune": {**scratch, "model.init_args.lr": 0.003}},
        },
        "metrics": ["test/CIDEr-D", "test/BLEU-4"],
        **extra,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_summary_and_paired_test_match_hand_computations():
    s = summarise([1, 2, 3, 4, 5])
    half = T_975_DF4 * math.sqrt(2.5) / math.sqrt(5)  # sd = sqrt(10 / 4)
    assert (s.n, s.mean, s.sd) == (5, 3.0, pytest.approx(math.sqrt(2.5)))
    assert (s.low, s.high) == (pytest.approx(3 - half), pytest.approx(3 + half))
    assert summarise([7.0]).n == 1 and math.isnan(summarise([7.0]).sd)
    # differences 2, 3, 2: mean 7/3, sd 1/sqrt(3), t = (7/3) / (1/3) = 7; df 2: two-sided p = 1 - t / sqrt(t^2 + 2)
    p = paired({0: 3, 1: 5, 2: 4, 9: 1}, {0: 1, 1: 2, 2: 2})
    assert p.n == 3 and p.diff.mean == pytest.approx(7 / 3) and p.t == pytest.approx(7.0)
    assert p.p == pytest.approx(1 - 7 / math.sqrt(51))
    assert paired({0: 1, 1: 2}, {0: 1, 1: 2}).p == 1.0  # identical: no difference at all


def test_overrides_and_study_errors(tmp_path):
    cfg = {"model": {"init_args": {"lr": 1, "overrides": {"dim": 8}}}}
    apply_overrides(cfg, {"model.init_args.lr": 2, "trainer.max_epochs": 3, "model": {"init_args": {"seed": 4}}})
    assert cfg == {"model": {"init_args": {"lr": 2, "overrides": {"dim": 8}, "seed": 4}}, "trainer": {"max_epochs": 3}}
    path = _study(tmp_path, bogus=1)
    with pytest.raises(StudyError, match=r"study.yaml: unknown key\(s\) \['bogus'\]"):
        load_study(path)
    path = _study(tmp_path, reference="zzz")
    with pytest.raises(StudyError, match="reference 'zzz' is not a variant"):
        load_study(path)
    with pytest.raises(StudyError, match="does not exist"):
        load_study(tmp_path / "missing.yaml")


@pytest.mark.parametrize("name", ["table6", "figure3", "table7_8", "table10", "figure4_9", "fusion"])
def test_shipped_studies_load_and_build_configs(name):
    study = load_study(ROOT / "configs/experiments" / f"{name}.yaml", fast=True)
    assert study.reference in {v.name for v in study.variants} and len(study.seeds) >= 5
    for v in study.variants:
        cfg = study.stage_config(v, "finetune")
        assert cfg["model"]["class_path"] == "namc.lit.FinetuneModule"
        pre = study.stage_config(v, "pretrain")
        assert pre is None or pre["model"]["class_path"] == "namc.lit.PretrainModule"


def _fake_rows(study_path: Path) -> list[dict]:
    """Rows whose hashes match the study's plan, with known metric values."""
    study = load_study(study_path, fast=True)
    out = study_path.parent / "out"
    r = runner_mod._Runner(study, out, runner_mod.prepare_data(study, out, progress=False))
    values = {("a", 0): 10.0, ("a", 1): 14.0, ("b", 0): 13.0, ("b", 1): 19.0}
    return [
        {
            "variant": v.name,
            "seed": s,
            "config_hash": r.plan(v, s)["hash"],
            "wall_s": 1.0,
            "metrics": {"test/CIDEr-D": values[(v.name, s)], "test/BLEU-4": 1.0},
            "stages": {},
        }
        for v in study.variants
        for s in study.seeds
    ]


def test_rerun_skips_finished_runs_and_report_from_results_alone(tmp_path, monkeypatch):
    path = _study(tmp_path)
    rows = _fake_rows(path)
    out = tmp_path / "out"
    write_results(out, rows)

    def no_subprocess(*args, **kwargs):
        raise AssertionError("a finished run was started again")

    monkeypatch.setattr(runner_mod, "_namc", no_subprocess)
    got, failures = run_study(load_study(path, fast=True), out, jobs=2, progress=False)
    assert load_study(path).scale["finetune"] != load_study(path, fast=True).scale["finetune"]
    assert failures == [] and got == rows
    (out / "study.yaml").write_text(path.read_text())
    text = report_dir(out, fast=True, plots=False).read_text()
    # a: 10, 14 -> mean 12, sd 2*sqrt(2), half = t(0.975, 1) * sd / sqrt(2) = 2 t
    assert f"12.00 ± {2 * math.sqrt(2):.2f} [{12 - 2 * T_975_DF1:.2f}, {12 + 2 * T_975_DF1:.2f}]" in text
    # b - a per seed: 3, 5 -> mean 4, sd sqrt(2), half = t * 1; paired t = 4 / 1 = 4, df 1: p = 1 - 2 atan(4) / pi
    p = 1 - 2 * math.atan(4) / math.pi
    assert f"+4.00 [{4 - T_975_DF1:.2f}, {4 + T_975_DF1:.2f}], p={p:.3f}" in text
    # a changed config reruns only that variant's runs
    calls = []
    monkeypatch.setattr(
        runner_mod._Runner,
        "run",
        lambda self, v, s, plan: (
            calls.append((v.name, s))
            or {"variant": v.name, "seed": s, "config_hash": plan["hash"], "wall_s": 0.0, "metrics": {}}
        ),
    )
    spec = yaml.safe_load(path.read_text())
    spec["variants"]["b"]["finetune"]["model.init_args.lr"] = 0.004
    path.write_text(yaml.safe_dump(spec))
    run_study(load_study(path, fast=True), out, jobs=1, progress=False)
    assert sorted(calls) == [("b", 0), ("b", 1)]


def test_stale_rows_foreign_seeds_best_checkpoint_and_a_moved_study(tmp_path, monkeypatch, capsys):
    path = _study(tmp_path)
    rows = _fake_rows(path)
    out = tmp_path / "out"
    (out / "study.yaml").parent.mkdir(parents=True, exist_ok=True)
    (out / "study.yaml").write_text(path.read_text())
    write_results(out, rows)
    own = report_dir(out, fast=True, plots=False).read_text()
    write_results(out, [*rows, {**rows[0], "seed": 7, "metrics": {"test/CIDEr-D": 90.0, "test/BLEU-4": 1.0}}])
    assert report_dir(out, fast=True, plots=False).read_text() == own  # seed 7 is not the study's: not reported
    assert experiment_main(["run", str(path), "--out", str(out), "--fast", "--seeds", "5", "--quiet"]) == 2
    assert "no seed(s) [5]; the study has [0, 1]" in capsys.readouterr().err

    def fails(self, variant, seed, plan):
        raise runner_mod.RunError("namc fit failed (exit 1)")

    monkeypatch.setattr(runner_mod._Runner, "run", fails)
    spec = yaml.safe_load(path.read_text())
    spec["variants"]["b"]["finetune"]["model.init_args.lr"] = 0.004  # b's config changes, and its reruns fail
    path.write_text(yaml.safe_dump(spec))
    _, failures = run_study(load_study(path, fast=True), out, progress=False)
    assert len(failures) == 2  # the old config's rows of b are gone, not reported as b's results
    assert sorted((r["variant"], r["seed"]) for r in read_results(out)) == [("a", 0), ("a", 1), ("a", 7)]

    ckpts = tmp_path / "ckpts"  # the benchmark recipes' ModelCheckpoint(filename="best"), then last.ckpt
    ckpts.mkdir()
    (ckpts / "best.ckpt").write_text("epoch 3")
    (ckpts / "last.ckpt").write_text("epoch 9")
    assert runner_mod._best_checkpoint(ckpts).name == "best.ckpt"

    stage = tmp_path / "old" / "stages" / "pretrain-abc"  # a pre-training finished, then the study folder moved
    (stage / "model").mkdir(parents=True)
    (stage / "done.json").write_text(json.dumps({"hash": "abc", "wall_s": 1, "model": str(stage / "model")}))
    (tmp_path / "old").rename(tmp_path / "new")
    study = load_study(path, fast=True)
    info = runner_mod._Runner(study, tmp_path / "new", {})._pretrain({}, "abc", 0)
    assert info["reused"] and info["model"] == str((tmp_path / "new" / "stages" / "pretrain-abc" / "model").resolve())


def test_report_names_a_folder_without_a_study(tmp_path, capsys):
    assert experiment_main(["report", str(tmp_path)]) == 2
    assert "study.yaml is missing" in capsys.readouterr().err


def test_results_file_errors_name_the_line(tmp_path):
    good = '{"variant": "a", "seed": 0, "config_hash": "x", "wall_s": 1, "metrics": {}}'
    (tmp_path / "results.jsonl").write_text(good + "\nnot json\n")
    with pytest.raises(ValueError, match=r"results.jsonl:2: not a JSON line"):
        read_results(tmp_path)


@pytest.mark.slow
def test_two_variant_two_seed_study_end_to_end(tmp_path, monkeypatch):
    """Real `namc fit` / `namc test` subprocesses; aggregation checked against the rows by hand; a rerun starts
    nothing."""
    monkeypatch.chdir(ROOT)
    path = _study(tmp_path)
    out = tmp_path / "out"
    stale = out / "runs" / "a" / "seed0" / "finetune" / "checkpoints" / "best-epoch99.ckpt"  # a killed attempt's
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"not this run's")
    assert experiment_main(["run", str(path), "--out", str(out), "--fast", "--jobs", "2", "--quiet", "--no-plots"]) == 0
    rows = read_results(out)
    assert sorted((r["variant"], r["seed"]) for r in rows) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert all({"test/CIDEr-D", "test/BLEU-4", "test/METEOR"} <= set(r["metrics"]) for r in rows)
    assert all(r["stages"]["test"]["checkpoint"].startswith("best-") for r in rows) and not stale.exists()
    for r in rows:  # how many different captions the model wrote, and the share of the most frequent one
        m = r["metrics"]
        assert m["test/distinct_captions"] >= 1 and m["test/distinct_captions"] == int(m["test/distinct_captions"])
        assert 1 / m["test/distinct_captions"] <= m["test/top_caption_share"] <= 1
    a = [r["metrics"]["test/CIDEr-D"] for r in rows if r["variant"] == "a"]
    mean, sd = statistics.mean(a), statistics.stdev(a)
    text = (out / "report.md").read_text()
    assert f"| a | 2 | {mean:.2f} ± {sd:.2f} [{mean - T_975_DF1 * sd / math.sqrt(2):.2f}, " in text
    before = (out / "results.jsonl").read_text()
    monkeypatch.setattr(runner_mod, "_namc", lambda *a, **k: pytest.fail("a finished run was started again"))
    assert experiment_main(["run", str(path), "--out", str(out), "--fast", "--quiet", "--no-plots"]) == 0
    assert (out / "results.jsonl").read_text() == before
    assert json.loads(before.splitlines()[0])["config_hash"]


def test_caption_spread_counts_the_captions_of_a_test_file():
    item = lambda p: {"id": p, "prediction": p[0], "references": ["x"]}  # noqa: E731
    data = {"scores": {}, "captions": [item("a1"), item("b2"), item("a3"), item("a4")]}
    assert runner_mod.caption_spread(data) == {"test/distinct_captions": 2.0, "test/top_caption_share": 0.75}
    assert runner_mod.caption_spread({"scores": {}}) == {}


def test_masking_none_is_the_papers_without_nim():
    """Table 6's "without NIM": no L_NIM and no masks at all (random masking at p_I / p_T is its own arm)."""
    import torch

    from namc.lit import PretrainModule

    module = PretrainModule(use_nim=False, use_mir=False, masking="none", overrides={"dim": 32, "heads": 2})
    c = module.model.config
    assert (c.use_nim, c.p_img, c.p_txt) == (False, 0.0, 0.0)
    tok = module.model.tokenizer
    text = torch.tensor([[tok.bos_id, *tok.encode("a red cube")[:3], tok.eos_id]] * 4)
    img_mask, txt_mask = module.model.noise_masks(torch.rand(4, 3, 64, 64), text, torch.Generator().manual_seed(0))
    assert not img_mask.any() and not txt_mask.any()
    random = PretrainModule(use_nim=False, masking="random", overrides={"dim": 32, "heads": 2}).model
    img_mask, _ = random.noise_masks(torch.rand(4, 3, 64, 64), text, torch.Generator().manual_seed(0))
    assert img_mask.any()  # p_I = 0.2 over 4 x 64 cells
