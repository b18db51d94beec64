"""Untrusted model folders, checkpoints, recipes and evaluation files: one line naming the file and key, never a
traceback, a hang or a file read outside the folder (absurd config values, deep JSON, escaping paths, Hub
revisions, the experiment runner's output lock)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from namc.cli import main as namc_main
from namc.models import create_model, load_model, model_config
from namc.models.config import NAMCConfig
from namc.models.files import ConfigError
from namc.models.hub import parse_hub_id, resolve_model_path
from namc.models.io import read_config, read_tokenizer
from namc.models.validate import DEFAULT_MAX_PARAMETERS, MAX_PARAMETERS_ENV, known_fields
from namc.paths import PathEscapeError, check_revision, contained
from namc.text.tokenizer import load_tokenizer

DEEP = "[" * 100_000 + "]" * 100_000


def _tiny() -> dict[str, Any]:
    """namc_tiny's config as config.json holds it, with a word vocabulary's size."""
    return {"namc_version": "0", **dataclasses.replace(model_config("namc_tiny"), vocab_size=120).to_dict()}


def _folder(tmp_path: Path, text: str, tokenizer: dict[str, Any] | None = None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(text, encoding="utf-8")
    if tokenizer is not None:
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    return folder


def _images(tmp_path: Path) -> tuple[str, str]:
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(a)
    Image.new("RGB", (64, 64), (30, 30, 200)).save(b)
    return str(a), str(b)


# ------------------------------------------------------------------------------------------------ absurd values

ABSURD = [
    ({"dropout": math.nan}, "dropout: must be a finite number in [0, 1], got nan"),
    ({"dim": -32}, "dim: must be between 1 and"),
    ({"grid_model": "os"}, "grid_model: 'os' is not a timm model"),
    ({"grid_kwargs": {"pretrained_cfg_overlay": {"file": "/etc/passwd"}}}, "grid_kwargs: unknown or disallowed keys"),
    ({"grid_kwargs": {"layers": [1]}}, "grid_model: timm cannot build 'resnet18'"),
    ({"fdg_layers": 1_000_000}, "fdg_layers: 1000000 FDG layers of width 128 would build an estimated"),
    ({"vocab_size": 10**9}, "vocab_size: 1000000000 token embeddings"),
    ({"dim": 2**20, "heads": 1}, "dim: 2 FDG layers of width 1048576"),
    ({"clip_model": "ViT-nope"}, "clip_model: 'ViT-nope' is not an open_clip ViT config"),
    ({"p_img": 1.5}, "p_img: must be a finite number in [0, 1]"),
    ({"tau": math.inf}, "tau: must be a finite number"),
    ({"heads": 3}, "dim: 128 is not a multiple of heads (3)"),
    ({"fusion": "sum"}, "fusion: unknown MIR fusion 'sum'"),
    ({"image_size": 0}, "image_size: must be between 8 and 8192, got 0"),
    ({"masking": "some"}, "masking: must be one of"),
    ({"nim_token_ngram": 0}, "nim_token_ngram: must be null or an integer in [1, 16]"),
]


@pytest.mark.parametrize(("change", "message"), ABSURD, ids=[next(iter(c)) + str(i) for i, (c, _) in enumerate(ABSURD)])
def test_an_absurd_config_value_is_one_line_naming_the_file_and_key(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    folder = _folder(tmp_path, json.dumps({**_tiny(), **change}, allow_nan=True))
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        read_config(folder)
    assert time.perf_counter() - start < 5  # nothing is allocated
    text = str(info.value)
    assert text.startswith(f"{folder / 'config.json'}: ") and message in text and "\n" not in text


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("ch", 10**6, "vqgan_ddconfig.ch: must be between 32 and 4096"),
        ("give_pre_end", True, "vqgan_ddconfig: unknown or disallowed keys ['give_pre_end']"),
        ("in_channels", 4, "vqgan_ddconfig.in_channels: must be one of (3,)"),
        ("ch_mult", [1, -2], "vqgan_ddconfig.ch_mult: must be a list"),
    ],
)
def test_the_vqgan_configuration_is_allow_listed(tmp_path: Path, key: str, value: Any, message: str) -> None:
    cfg = _tiny()
    cfg["vqgan_ddconfig"] = {**cfg["vqgan_ddconfig"], key: value}
    folder = _folder(tmp_path, json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"^.*config\.json: ") as info:
        read_config(folder)
    assert message in str(info.value)


def test_the_parameter_limit_is_raised_by_the_environment_or_an_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    big = dataclasses.replace(model_config("namc_tiny"), fdg_layers=20_000)  # about 8e9 parameters
    with pytest.raises(ConfigError, match=f"over the limit of 2e9; .*{MAX_PARAMETERS_ENV}="):
        big.validate("big")
    big.validate("big", max_parameters=1e10)
    monkeypatch.setenv(MAX_PARAMETERS_ENV, "1e10")
    big.validate("big")
    monkeypatch.setenv(MAX_PARAMETERS_ENV, "lots")
    with pytest.raises(ConfigError, match=f"{MAX_PARAMETERS_ENV}='lots' is not a positive number"):
        big.validate("big")


def test_the_estimate_is_close_to_the_built_model() -> None:
    model = create_model("namc_tiny")
    estimate = model.config.estimate_parameters()
    assert abs(estimate - model.num_parameters()["total"]) < 0.15 * model.num_parameters()["total"]
    assert model_config("namc_base").estimate_parameters() < DEFAULT_MAX_PARAMETERS  # the paper's model loads


def test_every_config_field_has_a_validation_rule() -> None:
    assert {f.name for f in dataclasses.fields(NAMCConfig)} == known_fields()


def test_create_model_checks_overrides_before_building() -> None:
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^model 'namc_tiny': fdg_layers: 1000000 FDG layers"):
        create_model("namc_tiny", fdg_layers=1_000_000)
    assert time.perf_counter() - start < 5


def test_a_checkpoints_embedded_config_is_checked(tmp_path: Path) -> None:
    ckpt = tmp_path / "bad.ckpt"
    config = {**_tiny(), "dropout": float("nan")}
    del config["namc_version"]
    torch.save({"namc": {"config": config, "tokenizer": {"type": "word"}}, "state_dict": {}}, ckpt)
    for load in (read_config, load_model):
        with pytest.raises(ConfigError, match=r"bad\.ckpt \['namc'\]\['config'\]: dropout: must be a finite"):
            load(ckpt)


def test_a_saved_config_never_names_files_to_read(tmp_path: Path) -> None:
    folder = _folder(tmp_path, json.dumps({**_tiny(), "grid_pretrained": "/etc/passwd", "clip_pretrained": "../x"}))
    config = read_config(folder)
    assert config.grid_pretrained is None and config.clip_pretrained is None


@pytest.mark.parametrize("text", ["{" + '"a":' * 1 + DEEP + "}", DEEP])
def test_deeply_nested_config_json_is_one_line(tmp_path: Path, text: str) -> None:
    folder = _folder(tmp_path, text)
    with pytest.raises(ConfigError, match="nested deeper than 64 levels") as info:
        read_config(folder)
    assert str(info.value).startswith(str(folder / "config.json"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (DEEP, "nested deeper than 64 levels"),
        (json.dumps({**_tiny(), "fdg_layers": 1_000_000}), "fdg_layers: 1000000 FDG layers"),
        (json.dumps({**_tiny(), "grid_model": "os"}), "grid_model: 'os' is not a timm model"),
    ],
)
def test_describe_with_a_bad_model_folder_prints_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str, message: str
) -> None:
    folder = _folder(tmp_path, text, {"type": "word", "words": ["[PAD]", "[BOS]", "[EOS]", "[UNK]", "[MASK]"]})
    a, b = _images(tmp_path)
    code = namc_main(["describe", a, b, "--model", str(folder)])
    err = capsys.readouterr().err
    assert code != 0
    assert err.count("\n") == 1 and "Traceback" not in err and message in err and str(folder) in err


# ------------------------------------------------------------------------------------------------ paths


def test_contained_refuses_names_that_leave_the_folder(tmp_path: Path) -> None:
    (tmp_path / "inside.txt").write_text("x")
    (tmp_path / "link").symlink_to("/etc/hostname")
    assert contained(tmp_path, "inside.txt", "t") == tmp_path / "inside.txt"
    assert contained(tmp_path, "sub/inside.txt", "t") == tmp_path / "sub" / "inside.txt"
    for name, why in [
        ("/etc/passwd", "absolute path"),
        ("C:\\x", "absolute path"),
        ("\\\\server\\share", "absolute path"),
        ("../../../../etc/hostname", "contains '..'"),
        ("a/..\\..\\b", "contains '..'"),
        ("link", "resolves outside"),
        ("", "not a file name"),
        (3, "not a file name"),
    ]:
        with pytest.raises(PathEscapeError, match=f"^f.json: key: .*{why}"):
            contained(tmp_path, name, "f.json: key")


@pytest.mark.parametrize("bpe", ["/etc/passwd", "../../../../etc/hostname", "escape.txt.gz"])
def test_a_tokenizer_bpe_file_must_stay_in_the_model_folder(tmp_path: Path, bpe: str) -> None:
    folder = _folder(tmp_path, json.dumps(_tiny()), {"type": "clip_bpe", "bpe": bpe})
    (folder / "escape.txt.gz").symlink_to("/etc/hostname")
    with pytest.raises(ConfigError, match=r"tokenizer\.json: bpe: .*(absolute|'\.\.'|outside)"):
        read_tokenizer(folder)
    with pytest.raises(PathEscapeError, match=r"tokenizer\.json: bpe: "):
        load_tokenizer(folder)


def test_a_bpe_file_inside_the_model_folder_loads(tmp_path: Path) -> None:
    from open_clip.tokenizer import default_bpe

    folder = _folder(tmp_path, json.dumps(_tiny()), {"type": "clip_bpe", "bpe": "sub/bpe.txt.gz"})
    (folder / "sub").mkdir()
    (folder / "sub" / "bpe.txt.gz").write_bytes(Path(default_bpe()).read_bytes())
    assert read_tokenizer(folder).vocab_size == 49409


def test_tokenizer_json_is_read_through_the_bounded_reader(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "{}")
    (folder / "tokenizer.json").write_text(DEEP)
    with pytest.raises(ValueError, match=r"tokenizer\.json: nested deeper than 64 levels"):
        load_tokenizer(folder)


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "feature/x-y_z", "a" * 40])
def test_a_git_revision_name_is_accepted(revision: str) -> None:
    assert check_revision(revision, "spec") == revision
    assert parse_hub_id(f"hf-hub:org/name@{revision}") == ("org/name", revision)


@pytest.mark.parametrize(
    "revision", ["../../x", "/etc", "a/../b", ".hidden", "x.lock", "a//b", "x/", "sp ace", "a:b", "@", "a@{1}", "e."]
)
def test_a_revision_that_is_not_a_ref_name_is_refused(revision: str) -> None:
    with pytest.raises(PathEscapeError, match=r"revision .* is not a branch, tag or commit name"):
        parse_hub_id(f"hf-hub:org/name@{revision}")


def test_a_hub_revision_cannot_read_a_ref_file_outside_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``@../../escape`` would make huggingface_hub read ``<cache>/escape`` as a ref and load the model it names."""
    cache = tmp_path / "cache"
    snapshot = cache / "models--org--tiny" / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "escape").write_text("c" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="revision '../../escape' is not a branch, tag or commit name"):
        resolve_model_path("hf-hub:org/tiny@../../escape", cache_dir=cache)
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text("c" * 40)
    assert resolve_model_path("hf-hub:org/tiny", cache_dir=cache) == snapshot


def test_an_export_manifest_graph_file_must_stay_in_the_folder(tmp_path: Path) -> None:
    from namc.deploy.manifest import FORMAT, GRAPHS, read_manifest

    digest = {"bytes": 1, "sha256": "0" * 64}
    graphs = {g: {"file": f"{g}.onnx", "inputs": [], "outputs": []} for g in GRAPHS}
    graphs[GRAPHS[0]]["file"] = "../outside.onnx"
    manifest = {
        "format": FORMAT,
        "model": "m",
        "opset": 17,
        "precision": "fp32",
        "image_size": 64,
        "max_new_tokens": 5,
        "max_caption_len": 8,
        "vocab_size": 10,
        "decoder": {},
        "tokenizer": "tokenizer.json",
        "shortlist": None,
        "graphs": graphs,
        "weights": {},
        "files": {g["file"]: digest for g in graphs.values()},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=rf"manifest\.json: graphs\.{GRAPHS[0]}\.file: '\.\./outside\.onnx'"):
        read_manifest(tmp_path, verify=False)


# ------------------------------------------------------------------------------------------------ experiments


def _study(tmp_path: Path, overrides: dict[str, Any]) -> Path:
    recipe = {"model": {"class_path": "namc.lit.FinetuneModule", "init_args": {"model": "namc_tiny"}}}
    study = {
        "name": "s",
        "recipe": {"finetune": recipe},
        "variants": {"ok": {"pretrain": None}, "huge": {"pretrain": None, "finetune": overrides}},
    }
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps(study))  # JSON is YAML
    return path


def test_a_study_recipe_with_an_absurd_model_is_refused_before_any_run(tmp_path: Path) -> None:
    from namc.experiment.study import StudyError, load_study

    path = _study(tmp_path, {"model.init_args.overrides": {"fdg_layers": 1_000_000}})
    with pytest.raises(StudyError, match=rf"^{path}: variants\.huge\.finetune model: fdg_layers: 1000000 FDG"):
        load_study(path)
    path = _study(tmp_path, {"model.init_args.overrides": {"dropout": float("nan")}})
    with pytest.raises(StudyError, match=r"variants\.huge\.finetune model: dropout: must be a finite number"):
        load_study(path)
    load_study(_study(tmp_path, {"model.init_args.overrides": {"dim": 64}}))


def test_a_deeply_nested_study_file_is_one_line(tmp_path: Path) -> None:
    from namc.experiment.study import StudyError, load_study

    path = tmp_path / "deep.yaml"
    path.write_text("[" * 5000 + "]" * 5000)  # past Python's recursion limit, as a deeper file is
    with pytest.raises(StudyError, match="nested too deeply"):
        load_study(path)


def _laughs(levels: int = 9) -> str:
    """The "billion laughs": each level aliases the one before it nine times (9**levels values expanded)."""
    text = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    names = "abcdefghij"
    for prev, name in zip(names, names[1 : levels + 1], strict=False):
        text += f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
    return text


def test_a_study_file_whose_aliases_expand_without_bound_is_one_line(tmp_path: Path) -> None:
    from namc.experiment.study import StudyError, load_study

    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs())
    with pytest.raises(StudyError, match=rf"^{path}: not a readable YAML file: expands to more than 1,000,000 values"):
        load_study(path)  # the walk stops at the budget, not after 9**9 values


def test_the_yaml_reader_refuses_duplicate_keys_and_recursive_aliases_and_keeps_merge_keys() -> None:
    from namc.yamltext import YAMLTextError, load_yaml

    with pytest.raises(YAMLTextError, match=r"^duplicate key 'x' on line 3$"):
        load_yaml("x: 1\ny: 2\nx: 3\n")
    with pytest.raises(YAMLTextError, match="expands to more than 100 values"):
        load_yaml("a: &a [*a]\n", max_values=100)
    assert load_yaml("base: &b {x: 1, y: 2}\nz:\n  <<: *b\n  x: 5\n") == {
        "base": {"x": 1, "y": 2},
        "z": {"x": 5, "y": 2},
    }
    assert load_yaml(_laughs(3)) is not None  # 9**3 values: inside the budget
    with pytest.raises(YAMLTextError, match="expands to more than 500 values"):
        load_yaml(_laughs(3), max_values=500)


def test_a_training_config_whose_aliases_expand_without_bound_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``namc fit --config`` reads YAML through jsonargparse, which walked the expanded tree for minutes; the file is
    refused in one line that names it, and jsonargparse's loader refuses it too wherever else it reads YAML."""
    import jsonargparse

    from namc.lit.cli import bound_config_yaml, main
    from namc.yamltext import YAMLTextError

    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs())
    start = time.perf_counter()
    assert main(["fit", "--config", str(path)]) == 2
    assert time.perf_counter() - start < 30  # not a walk over 9**9 values
    err = capsys.readouterr().err
    assert err == f"namc fit: error: {path}: expands to more than 1,000,000 values (aliases of aliases?)\n"
    assert main(["fit", f"--config={path}"]) == 2
    bound_config_yaml()
    load = jsonargparse.get_loader("yaml")
    with pytest.raises(YAMLTextError, match="expands to more than"):
        load(_laughs())
    assert load("lr: 1e-3\nsteps: [1, 2]\n") == {"lr": 1e-3, "steps": [1, 2]}  # jsonargparse's own number rules
    bound_config_yaml()  # once bound, not wrapped again
    assert jsonargparse.get_loader("yaml") is load


def test_a_pipeline_config_with_a_duplicate_key_names_the_file(tmp_path: Path) -> None:
    from namc.curate.config import ConfigError as PipelineConfigError
    from namc.curate.config import load_section

    path = tmp_path / "pipeline.yaml"
    path.write_text("describe: {model: a}\ndescribe: {model: b}\n")
    with pytest.raises(
        PipelineConfigError, match=rf"^{path}: not a readable YAML file: duplicate key 'describe' on line 2$"
    ):
        load_section(path, "describe")


def test_experiment_run_refuses_a_folder_another_run_holds(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from namc.experiment.cli import main
    from namc.locks import output_lock

    out = tmp_path / "out"
    with output_lock(out, "namc experiment run (the other one)"):
        code = main(["run", str(_study(tmp_path, {})), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "in use by another namc run" in err and "the other one" in err
    assert not (out / "results.jsonl").exists()


def test_results_jsonl_is_read_through_the_bounded_reader(tmp_path: Path) -> None:
    from namc.experiment.results import read_results

    row = {"variant": "a", "seed": 0, "config_hash": "h", "wall_s": 1.0, "metrics": {}}
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n" + DEEP + "\n")
    with pytest.raises(ValueError, match=r"results\.jsonl:2: not a JSON line: nested deeper than 64 levels"):
        read_results(tmp_path)


# ------------------------------------------------------------------------------------------------ evaluation files


def test_evaluation_readers_refuse_deep_json_in_one_line(tmp_path: Path) -> None:
    from namc.eval.captions.files import load_predictions
    from namc.eval.choice import read_choices, read_med

    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    with pytest.raises(ValueError, match=rf"^{deep}: malformed JSON: nested deeper"):
        load_predictions(str(deep))
    with pytest.raises(ValueError, match=rf"^{deep}: not a UTF-8 JSON file: nested deeper"):
        read_med(deep)
    with pytest.raises(ValueError, match=rf"^{deep}:1: invalid JSON: nested deeper"):
        read_choices(deep)
    dup = tmp_path / "dup.json"
    dup.write_text('{"a": "x", "a": "y"}')
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        load_predictions(str(dup))
