"""``namc convert-clip`` (namc.convert_cli) and the OpenAI CLIP conversion it runs (namc.models.openai_clip)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from namc.cli import main as namc_main
from namc.convert_cli import main
from namc.models.io import WeightsError, load_state_dict
from namc.models.openai_clip import convert, is_torchscript

# Building OpenAI-style TorchScript test files: torch warns that tracing is deprecated and about traced branches.
_TRACING_WARNINGS = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore:.*torch.jit.*:FutureWarning")
_TINY_CLIP = "namc-test-convert-tiny-quickgelu"
_TINY_CLIP_P4 = "namc-test-convert-tiny-p4-quickgelu"


@pytest.fixture(scope="module")
def tiny_clip_config(tmp_path_factory):
    open_clip = pytest.importorskip("open_clip")
    config = {
        "embed_dim": 32,
        "quick_gelu": True,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
        "text_cfg": {"context_length": 16, "vocab_size": 100, "width": 64, "heads": 2, "layers": 2},
    }
    folder = tmp_path_factory.mktemp("clip_configs")
    (folder / f"{_TINY_CLIP}.json").write_text(json.dumps(config))
    config["vision_cfg"]["patch_size"] = 4  # same layout, other shapes: a target the tiny checkpoint does not fit
    (folder / f"{_TINY_CLIP_P4}.json").write_text(json.dumps(config))
    open_clip.add_model_config(folder)
    return _TINY_CLIP


def _openai_style_torchscript(model_name: str, path: Path) -> nn.Module:
    """Save a random open_clip model the way OpenAI shipped CLIP: TorchScript, fp16 weights, metadata entries."""
    import open_clip
    from open_clip.model import convert_weights_to_lp

    torch.manual_seed(0)
    model = open_clip.create_model(model_name).eval()
    reference = open_clip.create_model(model_name).eval()
    convert_weights_to_lp(model, torch.float16)  # OpenAI's state dicts are partly float16
    reference.load_state_dict(model.state_dict())  # the fp32 model the converted file must reproduce
    attn_mask = model._buffers.pop("attn_mask")  # OpenAI's causal mask is a plain attribute, not in its state dict
    model.attn_mask = attn_mask
    for key, value in {"input_resolution": 32, "context_length": 16, "vocab_size": 100}.items():
        if hasattr(model, key):  # OpenAI's TorchScript state dict carries these three as entries
            delattr(model, key)
        model.register_buffer(key, torch.tensor(value))
    image = torch.rand(1, 3, 32, 32, dtype=torch.float16)
    torch.jit.trace_module(model, {"encode_image": (image,)}, check_trace=False).save(str(path))
    return reference


@_TRACING_WARNINGS
def test_convert_openai_torchscript_loads_strictly_into_open_clip(tmp_path, tiny_clip_config):
    import open_clip

    src, dst = tmp_path / "ViT-tiny.pt", tmp_path / "clip.safetensors"
    reference = _openai_style_torchscript(tiny_clip_config, src)
    assert is_torchscript(src)
    assert main([str(src), str(dst), "--model", tiny_clip_config]) == 0

    converted = load_state_dict(dst)
    assert all(v.dtype == torch.float32 for v in converted.values() if v.is_floating_point())
    expected = reference.state_dict()
    assert converted.keys() == expected.keys()
    assert all(torch.equal(converted[k], expected[k]) for k in expected)

    # open_clip's own strict loader accepts the file, and the model computes what the source computed
    model = open_clip.create_model(tiny_clip_config, pretrained=str(dst)).eval()
    images, text = torch.rand(2, 3, 32, 32), torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(images), reference.encode_image(images))
        torch.testing.assert_close(model.encode_text(text), reference.encode_text(text))


@_TRACING_WARNINGS
def test_convert_plain_state_dict_and_wrong_target(tmp_path, tiny_clip_config):
    src = tmp_path / "openai_state_dict.pt"
    reference = _openai_style_torchscript(tiny_clip_config, tmp_path / "unused.pt")
    torch.save({"state_dict": {f"module.{k}": v for k, v in reference.state_dict().items()}}, src)
    assert not is_torchscript(src)
    out = convert(src, tmp_path / "plain.safetensors", model_name=tiny_clip_config)
    assert torch.equal(out["visual.conv1.weight"], reference.visual.conv1.weight)
    # a checkpoint that does not fit the target config is refused, naming the keys
    with pytest.raises(WeightsError, match="shape mismatch in .*visual.conv1.weight"):
        convert(src, tmp_path / "wrong.safetensors", model_name=_TINY_CLIP_P4)
    assert not (tmp_path / "wrong.safetensors").exists()
    assert main([str(tmp_path / "missing.pt"), str(tmp_path / "x.safetensors")]) == 1


# run in a fresh interpreter: `namc ARGV`, then whether torch was imported and the exit status
_FRESH = """
import sys
from namc.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exit_:
    status = exit_.code
print("torch" in sys.modules, status or 0)
"""


# `namc ARGV`: its exit status and words of what it prints
USAGE = [
    (["convert-clip", "--help"], 0, "usage: namc convert-clip [-h] [--model MODEL] src dst"),
    (["convert-clip", "ViT-B-16.pt"], 2, "the following arguments are required: dst"),
    (["convert-clip", "ViT-B-16.pt", "clip.pt"], 2, "the output must end in .safetensors, got clip.pt"),
]


@pytest.mark.slow  # a fresh interpreter per case
@pytest.mark.parametrize(
    ("argv", "status", "words"), USAGE, ids=lambda value: " ".join(value) if isinstance(value, list) else None
)
def test_help_and_usage_errors_answer_before_torch_loads(argv: list[str], status: int, words: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _FRESH, *argv], capture_output=True, text=True)
    *printed, last = proc.stdout.splitlines()
    assert last == f"False {status}", proc.stdout + proc.stderr
    assert words in "\n".join(printed) + proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "status", "words"), USAGE, ids=lambda value: " ".join(value) if isinstance(value, list) else None
)
def test_help_and_usage_errors_in_this_process(argv: list[str], status: int, words: str, capsys) -> None:
    """The cases above without the fresh interpreter (tests/test_cli.py checks from the source that the command's
    module imports no torch)."""
    try:
        code = namc_main(argv)
    except SystemExit as exit_:
        code = exit_.code
    printed = capsys.readouterr()
    assert (code or 0) == status and words in printed.out + printed.err
    assert "Traceback" not in printed.err


def test_the_namc_command_runs_the_converter(tmp_path, capsys):
    missing = tmp_path / "ViT-B-16.pt"
    assert namc_main(["convert-clip", str(missing), str(tmp_path / "clip.safetensors")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"namc convert-clip: OpenAI CLIP checkpoint not found at {missing}") and err.count("\n") == 1
    assert namc_main(["--help"]) == 0
    assert "\n  convert-clip  OpenAI's CLIP checkpoint" in capsys.readouterr().out
