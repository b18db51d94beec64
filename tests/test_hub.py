"""Hugging Face Hub ids (``hf-hub:org/name[@revision]``) resolved through huggingface_hub's real cache code.

No network is used: the tests write a cache in the Hub's on-disk layout (``models--org--name/blobs``, ``refs/<ref>``
and ``snapshots/<commit>/<file>`` symlinks to the blobs, as ``snapshot_download`` leaves them) holding tiny saved
models, and resolve ids from it with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

import namc
from namc.cli import main as namc_main
from namc.inference import describe
from namc.models import NAMC, create_model, load_model
from namc.models.hub import HubError, HubModelNotFoundError, parse_hub_id, push_to_hub, resolve_model_path

ROOT = Path(__file__).resolve().parents[1]
MAIN = "a" * 40  # the commit refs/main points at
V1 = "b" * 40  # the commit of tag v1


def _blob_name(data: bytes, lfs: bool) -> str:
    """The Hub's blob name: the sha256 of an LFS file (the weights), the git blob sha1 of any other file."""
    if lfs:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def add_snapshot(cache: Path, repo_id: str, commit: str, folder: Path, refs: tuple[str, ...] = ()) -> Path:
    """Put ``folder``'s files into ``cache`` as the snapshot ``commit`` of model repo ``repo_id``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in sorted(folder.iterdir()):
        data = file.read_bytes()
        blob = repo / "blobs" / _blob_name(data, lfs=file.suffix == ".safetensors")
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    for ref in refs:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny saved models (different weights): ``main`` and ``v1``."""
    root = tmp_path_factory.mktemp("models")
    folders = {}
    for seed, name in ((0, "main"), (1, "v1")):
        torch.manual_seed(seed)
        model = create_model("namc_tiny", dim=32, heads=2)
        model.drop_pretraining_modules()
        folders[name] = model.save_pretrained(root / name)
    return folders


@pytest.fixture
def cache(tmp_path: Path, saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hub cache holding org/tiny (main -> MAIN, tag v1 -> V1), offline mode on, HF_HUB_CACHE pointing at it."""
    cache = tmp_path / "hub"
    add_snapshot(cache, "org/tiny", MAIN, saved["main"], refs=("main",))
    add_snapshot(cache, "org/tiny", V1, saved["v1"], refs=("v1",))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _same_weights(a: NAMC, b: NAMC) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_hub_ids_are_parsed() -> None:
    assert parse_hub_id("hf-hub:org/name") == ("org/name", None)
    assert parse_hub_id("hf-hub:org/name@v1.0") == ("org/name", "v1.0")
    assert parse_hub_id("org/name@" + MAIN) == ("org/name", MAIN)
    for bad in ("hf-hub:name", "hf-hub:org/", "hf-hub:org/a/b", "hf-hub:org/name@", "hf-hub:org/na me"):
        with pytest.raises(ValueError, match="not a Hub model id"):
            parse_hub_id(bad)


def test_a_hub_id_resolves_to_its_cached_snapshot(cache: Path) -> None:
    repo = cache / "models--org--tiny"
    assert resolve_model_path("hf-hub:org/tiny") == repo / "snapshots" / MAIN
    assert resolve_model_path("hf-hub:org/tiny@v1") == repo / "snapshots" / V1  # a tag, through refs/v1
    assert resolve_model_path(f"hf-hub:org/tiny@{V1}") == repo / "snapshots" / V1  # a commit hash
    assert resolve_model_path("runs/model") == Path("runs/model")  # a path is kept as it is
    other = cache.parent / "other"
    add_snapshot(other, "org/tiny", V1, cache / "models--org--tiny" / "snapshots" / V1, refs=("main",))
    assert resolve_model_path("hf-hub:org/tiny", cache_dir=other) == other / "models--org--tiny" / "snapshots" / V1


def test_every_loader_takes_a_hub_id(cache: Path, saved: dict[str, Path]) -> None:
    main_model, v1_model = NAMC.from_pretrained(saved["main"]), NAMC.from_pretrained(saved["v1"])
    assert not _same_weights(main_model, v1_model)

    loaded = namc.from_pretrained("hf-hub:org/tiny")
    assert _same_weights(loaded, main_model) and not loaded.training
    assert _same_weights(namc.from_pretrained("hf-hub:org/tiny@v1"), v1_model)
    assert _same_weights(load_model("hf-hub:org/tiny@v1", pretraining=False), v1_model)
    assert _same_weights(load_model(f"hf-hub:org/tiny@{MAIN}"), main_model)
    created = create_model("namc_tiny", pretrained="hf-hub:org/tiny@v1")
    assert _same_weights(created, v1_model) and created.config.dim == 32


@pytest.mark.parametrize(
    ("spec", "repo", "revision"),
    [("hf-hub:org/missing", "org/missing", "main"), ("hf-hub:org/tiny@v2", "org/tiny", "v2")],
)
def test_a_model_missing_from_the_offline_cache_is_a_one_line_error(
    cache: Path, spec: str, repo: str, revision: str
) -> None:
    with pytest.raises(HubModelNotFoundError) as info:
        load_model(spec)
    message = str(info.value)
    assert "\n" not in message
    assert f"model {repo} (revision {revision}) is not in the Hugging Face cache {cache}" in message
    assert "HF_HUB_OFFLINE=1" in message
    suffix = " --revision v2" if revision == "v2" else ""
    include = "--include '*.json' --include '*.safetensors' --include '*.txt.gz' --include '*.md'"
    assert f"`hf download {repo}{suffix} {include} --cache-dir {cache}`" in message
    assert isinstance(info.value, FileNotFoundError)  # callers that catch a missing file catch this too


def test_a_snapshot_without_a_config_is_not_a_namc_model(cache: Path, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "README.md").write_text("# not a namc model\n")
    add_snapshot(cache, "org/other", MAIN, tmp_path / "other", refs=("main",))
    with pytest.raises(HubError, match=r"hf-hub:org/other: org/other \(revision main\) is not a namc model: .*config"):
        resolve_model_path("hf-hub:org/other")


@pytest.mark.slow  # a namc process
def test_describe_cli_with_a_hub_id_end_to_end(tmp_path: Path, saved: dict[str, Path]) -> None:
    """``namc describe --model hf-hub:...`` in a fresh process: the cache comes from HF_HOME, offline mode is on."""
    home = tmp_path / "hf_home"
    add_snapshot(home / "hub", "org/tiny", MAIN, saved["main"], refs=("main",))
    for name, color in (("a.png", (200, 30, 30)), ("b.png", (30, 30, 200))):
        Image.new("RGB", (64, 64), color).save(tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "namc",
            "describe",
            str(tmp_path / "a.png"),
            str(tmp_path / "b.png"),
            "--model",
            "hf-hub:org/tiny",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    expected = describe(saved["main"], tmp_path / "a.png", tmp_path / "b.png")
    assert done.stdout.strip() == expected


def test_describe_cli_names_a_missing_hub_model(cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    Image.new("RGB", (64, 64)).save(tmp_path / "a.png")
    code = namc_main(["describe", str(tmp_path / "a.png"), str(tmp_path / "a.png"), "--model", "hf-hub:org/missing"])
    err = capsys.readouterr().err
    assert code in (1, 2)
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "hf-hub:org/missing" in err and "hf download org/missing" in err and str(cache) in err


@pytest.mark.parametrize("spec", ["hf-hub:", "hf-hub:org/", "hf-hub:a/b/c", "hf-hub:org/na me", "hf-hub:org/x@"])
def test_describe_cli_calls_a_malformed_hub_id_a_usage_error(spec: str, tmp_path: Path, capsys) -> None:
    Image.new("RGB", (64, 64)).save(tmp_path / "a.png")
    code = namc_main(["describe", str(tmp_path / "a.png"), str(tmp_path / "a.png"), "--model", spec])
    err = capsys.readouterr().err
    assert code == 2  # as a missing path is; 1 is for a file that cannot be used
    assert err.startswith(f"namc describe: error: --model: not a Hub model id: {spec!r}") and err.count("\n") == 1


def test_push_to_hub_in_offline_mode_is_a_clear_error(cache: Path, saved: dict[str, Path]) -> None:
    offline = r"push_to_hub org/tiny: HF_HUB_OFFLINE=1 is set and uploading needs the network"
    with pytest.raises(HubError, match=offline):
        push_to_hub(saved["main"], "hf-hub:org/tiny")
    with pytest.raises(HubError, match="HF_HUB_OFFLINE=1"):
        namc.push_to_hub(NAMC.from_pretrained(saved["main"]), "org/tiny")


@pytest.mark.slow  # a fresh interpreter
def test_push_to_hub_without_a_token_says_how_to_log_in(tmp_path: Path, saved: dict[str, Path]) -> None:
    """Online mode but no token (none in the environment, no login in HF_HOME): an error before any request."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hf_home"), PYTHONPATH=str(ROOT))
    code = (
        "import sys; from namc.models.hub import HubError, push_to_hub\n"
        "try:\n    push_to_hub(sys.argv[1], 'org/tiny')\n"
        "except HubError as err:\n    print(err)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(saved["main"])], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "push_to_hub org/tiny: no Hugging Face token; set HF_TOKEN or run `hf auth login`"


def test_describe_cli_with_a_hub_id(cache: Path, saved: dict[str, Path], tmp_path: Path, capsys) -> None:
    """The end-to-end run above in this process: ``namc describe --model hf-hub:...`` captions from the cache."""
    for name, color in (("a.png", (200, 30, 30)), ("b.png", (30, 30, 200))):
        Image.new("RGB", (64, 64), color).save(tmp_path / name)
    pair = [str(tmp_path / "a.png"), str(tmp_path / "b.png")]
    assert namc_main(["describe", *pair, "--model", "hf-hub:org/tiny"]) == 0
    assert capsys.readouterr().out.strip() == describe(saved["main"], *pair)


def test_push_to_hub_without_a_token_says_how_to_log_in_here(
    tmp_path: Path, saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fresh-interpreter test above in this process: huggingface_hub read its offline flag and the place of a
    stored login when it was imported, so both are set here as a fresh import under that environment sets them."""
    from huggingface_hub import constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))  # no login stored
    with pytest.raises(HubError) as info:
        push_to_hub(saved["main"], "org/tiny")
    assert str(info.value) == "push_to_hub org/tiny: no Hugging Face token; set HF_TOKEN or run `hf auth login`"
