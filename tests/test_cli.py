"""The ``namc`` console script: LightningCLI configs, links, missing-file errors, describe and dispatching."""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from namc.cli import main
from namc.data.synthetic import generate_benchmark, make_pair, render_scene
from namc.inference import describe
from namc.lit.cli import NAMCCLI, link_tokenizer, model_settings
from namc.models import create_model, load_model

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*/*.yaml"))
TRAIN_CONFIGS = [p for p in CONFIGS if p.parent.name in ("pretrain", "finetune")]

logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)


def _print_config(capsys: pytest.CaptureFixture, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("config", TRAIN_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_print_config_works_for_every_config(config: Path, capsys: pytest.CaptureFixture) -> None:
    printed = _print_config(capsys, "--config", str(config))
    source = yaml.safe_load(config.read_text())
    assert printed["model"]["class_path"] == source["model"]["class_path"]
    assert printed["data"]["class_path"] == source["data"]["class_path"]
    assert printed["trainer"]["max_epochs"] == source["trainer"]["max_epochs"]
    if config.parent.name == "finetune":  # appendix F (OmniDiff is not in the paper: ours, for its long captions)
        init = printed["model"]["init_args"]
        max_new_tokens = 159 if config.stem == "omnidiff" else 23
        assert (init["lr"], init["max_new_tokens"], init["num_beams"]) == (2e-4, max_new_tokens, 1)
        assert printed["data"]["init_args"]["batch_size"] == 128
        assert (
            printed["trainer"]["max_epochs"]
            == {"clevr_change": 40, "clevr_dc": 40, "spot_the_diff": 10, "ier": 20, "omnidiff": 20}[config.stem]
        )


def test_print_config_takes_command_line_overrides(capsys: pytest.CaptureFixture) -> None:
    config = REPO / "configs" / "finetune" / "spot_the_diff.yaml"
    printed = _print_config(
        capsys, "--config", str(config), "--trainer.max_epochs", "3", "--model.init_args.lr", "1e-3"
    )
    assert printed["trainer"]["max_epochs"] == 3 and printed["model"]["init_args"]["lr"] == 1e-3


def test_links_follow_the_preset_and_the_pretrained_model(tmp_path: Path) -> None:
    ns = type("NS", (), {})

    def model(**init: object) -> object:
        m = ns()
        m.init_args = ns()
        m.init_args.__dict__.update(init)
        return m

    assert model_settings(model(model="namc_base")).image_size == 224
    assert link_tokenizer(model(model="namc_base")) == "clip_bpe"
    assert link_tokenizer(model(model="namc_tiny", overrides={"image_size": 32})) == "word"
    assert model_settings(model(model="namc_tiny", overrides={"image_size": 32})).image_size == 32
    saved = create_model("namc_tiny", pretraining=False, image_size=32).save_pretrained(tmp_path / "m")
    assert link_tokenizer(model(model="namc_base", pretrained=str(saved))) == str(saved)
    assert model_settings(model(model="namc_base", pretrained=str(saved))).image_size == 32  # the saved config wins
    # an unreadable pretrained path falls back to the preset (print_config must work before the files exist)
    assert model_settings(model(model="namc_base", pretrained=str(tmp_path / "nope"))).image_size == 224


@pytest.mark.slow  # builds namc_base
def test_missing_benchmark_names_the_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = REPO / "configs" / "finetune" / "clevr_change.yaml"
    cli = NAMCCLI(args=["--config", str(config), "--model.init_args.pretrained", "null"], run=False)
    # the data folder is checked when the run sets the data up (print_config works before it exists)
    with pytest.raises(
        FileNotFoundError, match=r"CLEVR-Change not found at data/clevr_change.*RobustChangeCaptioning.*images"
    ):
        cli.datamodule.setup("fit")


def test_missing_benchmark_names_the_download_before_any_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above without building the config's namc_base: the shipped config's data module, set up alone."""
    from namc.lit.datamodules import BenchmarkDataModule

    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load((REPO / "configs" / "finetune" / "clevr_change.yaml").read_text())["data"]["init_args"]
    module = BenchmarkDataModule(data["name"], data["root"])
    with pytest.raises(
        FileNotFoundError, match=r"CLEVR-Change not found at data/clevr_change.*RobustChangeCaptioning.*images"
    ):
        module.setup("fit")


def test_missing_pretrained_model_names_the_pretraining_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"runs/pretrain_namc_base/model"):
        NAMCCLI(args=["--config", str(REPO / "configs" / "finetune" / "ier.yaml")], run=False)


def test_missing_weights_name_the_config_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # jsonargparse reports a failing constructor as a ValueError that carries our message
    with pytest.raises((FileNotFoundError, ValueError), match=r"overrides.clip_pretrained.*namc convert-clip"):
        NAMCCLI(args=["--config", str(REPO / "configs" / "pretrain" / "namc_base.yaml")], run=False)


def test_describe_captions_two_image_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    torch.manual_seed(0)
    model_dir = create_model("namc_tiny", pretraining=False).save_pretrained(tmp_path / "model")
    pair = make_pair(0, 1)
    render_scene(pair.before, 64).save(tmp_path / "a.png")
    render_scene(pair.after, 64).save(tmp_path / "b.png")
    assert main(["describe", str(tmp_path / "a.png"), str(tmp_path / "b.png"), "--model", str(model_dir)]) == 0
    caption = capsys.readouterr().out.strip()
    assert caption and "[BOS]" not in caption and "[EOS]" not in caption
    assert main(["describe", str(tmp_path / "a.png"), str(tmp_path / "zz.png"), "--model", str(model_dir)]) == 2
    assert "image not found" in capsys.readouterr().err
    # a shortlist: only the words of the captions in the file (each word one token of namc_tiny's vocabulary)
    (tmp_path / "captions.txt").write_text("the cube moved\n\nthe sphere is gone\n", encoding="utf-8")
    argv = ["describe", str(tmp_path / "a.png"), str(tmp_path / "b.png"), "--model", str(model_dir)]
    assert main([*argv, "--vocabulary", str(tmp_path / "captions.txt")]) == 0
    captured = capsys.readouterr()
    listed = captured.out.strip().split()
    assert set(listed) <= {"the", "cube", "moved", "sphere", "is", "gone"}, listed
    # "gone" is no word of namc_tiny's vocabulary: listed as [UNK], and said so in one line
    assert captured.err.count("\n") == 1 and "1 word(s) outside the model's vocabulary (gone)" in captured.err
    # the model's own list (fine-tuning saves its training captions' tokens)
    model = load_model(model_dir)
    model.training_shortlist = model.shortlist(["a red sphere appeared"])
    model.save_pretrained(model_dir)
    assert main([*argv, "--shortlist"]) == 0
    listed = capsys.readouterr().out.strip().split()
    assert set(listed) <= {"a", "red", "sphere", "appeared"} and not set(caption.split()) <= set(listed), listed


def test_describe_captions_a_list_of_pairs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``namc describe --pairs LIST``: one JSON line per listed pair in order, the captions ``describe`` gives, a
    pair with a missing or corrupt image written with its error and counted (exit 1), a bad list one line."""
    torch.manual_seed(0)
    model_dir = create_model("namc_tiny", pretraining=False).save_pretrained(tmp_path / "model")
    (tmp_path / "img dir").mkdir()
    for i in range(5):
        pair = make_pair(i, 1)
        render_scene(pair.before, 64).save(tmp_path / f"a{i}.png")
        render_scene(pair.after, 64).save(tmp_path / "img dir" / f"b{i}.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    good = [(f"a{i}.png", f"img dir/b{i}.png") for i in range(5)]
    lines = ["# before<TAB>after", *("\t".join(g) for g in good[:3]), "a3.png\tnope.png", "", "broken.png a4.png"]
    lines += ["\t".join(g) for g in good[3:]]
    (tmp_path / "pairs.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["describe", "--model", str(model_dir), "--pairs", str(tmp_path / "pairs.txt"), "--batch-size", "2"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert [r["line"] for r in records] == [2, 3, 4, 5, 7, 8, 9]
    expected = describe(model_dir, [tmp_path / a for a, _ in good], [tmp_path / b for _, b in good])
    captioned = [r for r in records if r["caption"] is not None]
    assert [(r["image1"], r["image2"]) for r in captioned] == good
    assert [r["caption"] for r in captioned] == expected  # fp32 captions do not depend on the batch
    missing, broken = records[3], records[4]
    assert missing["issue"] == "missing_image" and "nope.png" in missing["error"] and missing["caption"] is None
    assert broken["issue"] == "corrupt_image" and "broken.png" in broken["error"]
    err = captured.err.strip().splitlines()[-1]
    assert "captioned 5 of 7 pairs" in err and "skipped 2 (corrupt_image=1, missing_image=1)" in err
    assert "pairs.txt line 5" in err, err
    # --output: the same records in a file; every pair usable: exit 0
    (tmp_path / "ok.txt").write_text("\n".join("\t".join(g) for g in good), encoding="utf-8")
    out = tmp_path / "out" / "captions.jsonl"
    argv = ["describe", "--model", str(model_dir), "--pairs", str(tmp_path / "ok.txt"), "--output", str(out)]
    assert main(argv) == 0
    assert [json.loads(line)["caption"] for line in out.read_text(encoding="utf-8").splitlines()] == expected
    assert capsys.readouterr().out == ""
    # the options of one pair apply to the list: int8 over a shortlist of the words of two captions
    (tmp_path / "words.txt").write_text("the cube moved\na red sphere is there\n", encoding="utf-8")
    listed = ["--precision", "int8", "--vocabulary", str(tmp_path / "words.txt")]
    assert main([*argv[:-2], *listed]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    words = {"the", "cube", "moved", "a", "red", "sphere", "is", "there"}  # each a word of namc_tiny's vocabulary
    assert len(records) == 5 and all(set(r["caption"].split()) <= words for r in records), records
    # a list that cannot be used, or a command line that mixes the two forms: one line, nothing captioned
    (tmp_path / "three.txt").write_text("a0.png a1.png a2.png\n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("a0.png\tb\xe9.png\n".encode("latin-1"))
    base = ["describe", "--model", str(model_dir)]
    for extra, code, words in (
        (["--pairs", str(tmp_path / "three.txt")], 1, "three.txt:1: expected two image paths, got 3"),
        (["--pairs", str(tmp_path / "latin1.txt")], 1, "latin1.txt:1: not UTF-8"),
        (["--pairs", str(tmp_path / "none.txt")], 2, "pair list not found"),
    ):
        assert main([*base, *extra]) == code
        captured = capsys.readouterr()
        assert captured.out == "" and words in captured.err and captured.err.count("\n") == 1, captured.err
    for extra, words in (
        (["--pairs", str(tmp_path / "ok.txt"), str(tmp_path / "a0.png"), str(tmp_path / "a1.png")], "not both"),
        ([str(tmp_path / "a0.png")], "two image files are needed"),
        ([str(tmp_path / "a0.png"), str(tmp_path / "a1.png"), "--output", str(out)], "--output is for --pairs"),
        (["--pairs", str(tmp_path / "ok.txt"), "--output", str(tmp_path)], "is a folder"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main([*base, *extra])
        assert exit_info.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.slow  # a namc process
def test_describe_stops_quietly_when_its_reader_does(tmp_path: Path) -> None:
    """``namc describe --pairs LIST | head -1``: once the reader closes the pipe the command stops, with 141 (as
    SIGPIPE would end it) and nothing on stderr, not a "Broken pipe" error or a traceback."""
    torch.manual_seed(0)
    model_dir = create_model("namc_tiny", pretraining=False).save_pretrained(tmp_path / "model")
    pair = make_pair(0, 1)
    render_scene(pair.before, 64).save(tmp_path / "a.png")
    render_scene(pair.after, 64).save(tmp_path / "b.png")
    (tmp_path / "pairs.txt").write_text("a.png b.png\n" * 400, encoding="utf-8")
    argv = ["describe", "--model", str(model_dir), "--pairs", str(tmp_path / "pairs.txt"), "--batch-size", "2"]
    child = subprocess.Popen(
        [sys.executable, "-m", "namc", *argv], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    first = json.loads(child.stdout.readline())
    child.stdout.close()  # the reader stops after one line
    _, err = child.communicate(timeout=300)
    assert first["line"] == 1 and first["caption"]
    assert child.returncode == 141 and err.decode() == "", err.decode()


def test_describe_stops_quietly_when_stdout_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The run above in this process: stdout is a pipe whose reader is gone before the first record."""
    torch.manual_seed(0)
    model_dir = create_model("namc_tiny", pretraining=False).save_pretrained(tmp_path / "model")
    pair = make_pair(0, 1)
    render_scene(pair.before, 64).save(tmp_path / "a.png")
    render_scene(pair.after, 64).save(tmp_path / "b.png")
    (tmp_path / "pairs.txt").write_text("a.png b.png\n" * 40, encoding="utf-8")
    read, write = os.pipe()
    os.close(read)
    with open(write, "w", encoding="utf-8") as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        argv = ["describe", "--model", str(model_dir), "--pairs", str(tmp_path / "pairs.txt"), "--batch-size", "2"]
        assert main(argv) == 141
        monkeypatch.undo()
    assert capsys.readouterr().err == ""


@pytest.mark.slow  # four LightningCLI runs
def test_fit_test_and_predict_through_the_cli(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    generate_benchmark(bench, 10, image_size=32, seed=0, n_captions=2)
    run = tmp_path / "run"
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "max_epochs": 1,
            "default_root_dir": str(run),
            "enable_progress_bar": False,
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": str(run), "name": "tb", "version": ""},
            },
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {
                        "dirpath": str(run / "ckpt"),
                        "monitor": "val/cider",
                        "mode": "max",
                        "filename": "best",
                    },
                },
                {"class_path": "namc.lit.ExportModel"},
                {"class_path": "namc.lit.CaptionWriter"},
            ],
        },
        "model": {
            "class_path": "namc.lit.FinetuneModule",
            "init_args": {"model": "namc_tiny", "overrides": {"image_size": 32, "dim": 32, "heads": 2}},
        },
        "data": {
            "class_path": "namc.lit.datamodules.BenchmarkDataModule",
            "init_args": {"name": "clevr_change", "root": str(bench), "batch_size": 8, "num_workers": 0},
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["fit", "--config", str(path)]) == 0
    assert (run / "ckpt" / "best.ckpt").is_file()
    assert (run / "tb" / "config.yaml").is_file()  # LightningCLI saved the resolved config
    assert (run / "tb" / "captions" / "val_epoch000.json").is_file()
    model_dir = run / "tb" / "model"
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file()
    assert main(["test", "--config", str(path), "--ckpt_path", str(run / "ckpt" / "best.ckpt")]) == 0
    assert (run / "tb" / "captions" / "test.json").is_file()
    fitted = (run / "tb" / "captions" / "val_epoch000.json").read_bytes()
    assert main(["validate", "--config", str(path), "--ckpt_path", str(run / "ckpt" / "best.ckpt")]) == 0
    assert (run / "tb" / "captions" / "val.json").is_file()  # not written over the fit's epoch-0 file
    assert (run / "tb" / "captions" / "val_epoch000.json").read_bytes() == fitted
    assert main(["predict", "--config", str(path), "--ckpt_path", str(run / "ckpt" / "best.ckpt")]) == 0
    predictions = yaml.safe_load((run / "tb" / "predictions.json").read_text())
    assert len(predictions) == 2 * 1 and all(
        isinstance(v, str) for v in predictions.values()
    )  # one test pair + distractor


def test_fit_and_predict_through_the_cli_in_one_step(tmp_path: Path) -> None:
    """The runs above at their smallest: one training step without validation, the model exported, then predict."""
    bench = tmp_path / "bench"
    generate_benchmark(bench, 10, image_size=32, seed=0, n_captions=2)
    run = tmp_path / "run"
    tensorboard = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"}
    tensorboard["init_args"] = {"save_dir": str(run), "name": "tb", "version": ""}
    trainer = {"accelerator": "cpu", "max_steps": 1, "limit_val_batches": 0, "num_sanity_val_steps": 0}
    trainer.update(default_root_dir=str(run), enable_progress_bar=False, logger=tensorboard)
    trainer["callbacks"] = [{"class_path": "namc.lit.ExportModel"}, {"class_path": "namc.lit.CaptionWriter"}]
    overrides = {"image_size": 32, "dim": 32, "heads": 2}
    config = {
        "seed_everything": 0,
        "trainer": trainer,
        "model": {"class_path": "namc.lit.FinetuneModule", "init_args": {"model": "namc_tiny", "overrides": overrides}},
        "data": {
            "class_path": "namc.lit.datamodules.BenchmarkDataModule",
            "init_args": {"name": "clevr_change", "root": str(bench), "batch_size": 8, "num_workers": 0},
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["fit", "--config", str(path)]) == 0
    assert (run / "tb" / "config.yaml").is_file()  # LightningCLI saved the resolved config
    model_dir = run / "tb" / "model"
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file()
    assert main(["predict", "--config", str(path)]) == 0
    predictions = json.loads((run / "tb" / "predictions.json").read_text())
    assert predictions and all(isinstance(v, str) for v in predictions.values())


def test_dispatch_and_usage(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main([]) == 2 and "demo" in capsys.readouterr().out
    assert main(["--help"]) == 0
    assert main(["frobnicate"]) == 2 and "unknown command" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["data", "--help"])
    assert "shapes" in capsys.readouterr().out
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    assert main(["eval", str(bad), str(bad)]) == 2  # forwarded to namc.eval.captions.main
    assert "malformed JSON" in capsys.readouterr().err
    bad.write_bytes(b'{"1": "caf\xe9"}')  # Latin-1, not UTF-8
    assert main(["eval", str(bad), str(bad)]) == 2
    assert f"{bad}: not UTF-8" in capsys.readouterr().err


# run in a fresh interpreter: `namc COMMAND ARGV`, then whether torch was imported and the exit status
_FRESH = """
import sys
from namc.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exit_:
    status = exit_.code
print("torch" in sys.modules, status or 0)
"""


# `namc ARGV`: its exit status and words of what it prints; all answer before torch loads
USAGE = [
    (["describe", "--help"], 0, "--pairs LIST"),
    (["describe", "a.png", "b.png"], 2, "the following arguments are required: --model"),
    (["describe", "a.png", "--model", "m"], 2, "two image files are needed"),
    (["describe", "a.png", "b.png", "--model", "m", "--precision", "fp8"], 2, "argument --precision"),
    (["describe", "nope-1.png", "nope-2.png", "--model", "m"], 2, "image not found: nope-1.png"),
    (["describe", "--pairs", "nope.txt", "--model", "m"], 2, "pair list not found: nope.txt"),
    (["describe", "README.md", "README.md", "--model", "m", "--vocabulary", "docs"], 2, "file not found: docs (a"),
    (["benchmark", "--help"], 0, "--omp-wait-policy"),
    (["benchmark", "--device", "tpu9"], 2, "device must be cpu, cuda or cuda:N, got 'tpu9'"),
    (["benchmark", "--dtype", "float16"], 2, "float16 is measured on CUDA only"),
]


@pytest.mark.slow  # a fresh interpreter per case
@pytest.mark.parametrize(
    ("argv", "status", "words"), USAGE, ids=lambda value: " ".join(value) if isinstance(value, list) else None
)
def test_help_and_usage_errors_answer_before_torch_loads(argv: list[str], status: int, words: str) -> None:
    """``namc describe`` and ``namc benchmark`` parse and check their options without importing torch (6-8 s):
    ``--help`` and a usage error answer at once, with the exit status and message of a full run."""
    proc = subprocess.run([sys.executable, "-c", _FRESH, *argv], capture_output=True, text=True, cwd=REPO)
    *printed, last = proc.stdout.splitlines()
    assert last == f"False {status}", proc.stdout + proc.stderr
    assert words in "\n".join(printed) + proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "status", "words"), USAGE, ids=lambda value: " ".join(value) if isinstance(value, list) else None
)
def test_help_and_usage_errors_in_this_process(
    argv: list[str], status: int, words: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The exit status and message of each case above, without the fresh interpreter (the next test checks, from
    the source, that these commands' modules import no torch)."""
    monkeypatch.chdir(REPO)
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    printed = capsys.readouterr()
    assert (code or 0) == status and words in printed.out + printed.err
    assert "Traceback" not in printed.err


def _module_file(name: str) -> Path | None:
    path = REPO.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _module_level_imports(name: str) -> set[str]:
    """The modules a namc module imports when it is imported (not those its functions import when they run)."""
    path = _module_file(name)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    body = list(ast.parse(path.read_text()).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            body += node.body + node.orelse
        elif isinstance(node, ast.Try):
            body += node.body + node.orelse + node.finalbody + [n for h in node.handlers for n in h.body]
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names if _module_file(f"{base}.{alias.name}")}
    return found


def test_the_torch_free_commands_import_no_torch_when_they_load() -> None:
    """``namc --help``, ``namc describe``'s and ``namc benchmark``'s option checks and ``namc convert-clip --help``
    run in the modules below and the namc modules they import as they load: none imports torch at module level."""
    roots = ["namc", "namc.cli", "namc.describe_cli", "namc.convert_cli", "namc.eval.throughput.cli"]
    seen, todo, outside = set(), list(roots), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        for module in [*_module_level_imports(name), *parents]:
            if module.split(".")[0] == "namc":
                todo += [module] if _module_file(module) else []
            else:
                outside.add(module.split(".")[0])
    assert "torch" not in outside and "lightning" not in outside, sorted(outside)
    assert {"namc.describe_cli", "namc.eval.throughput.settings"} <= seen
