"""namc.compile: one trained model on every backend, with NAMC.generate's signature and, in fp32, its ids."""

from __future__ import annotations

import gc
import importlib.util
from pathlib import Path

import pytest
import torch

import namc
from namc.backends import BACKENDS
from namc.backends.compile import PRECISIONS_OF, Captioner, default_backend
from namc.backends.step import FusedFDG
from namc.models.fdg import FDG

GOLDEN = Path(__file__).parent / "data" / "golden" / "namc_tiny"
ONNX = [b for b in ("onnxruntime", "openvino") if importlib.util.find_spec(b) is not None]


@pytest.fixture(scope="module")
def model() -> namc.NAMC:
    return namc.from_pretrained(GOLDEN)


@pytest.fixture(scope="module")
def pairs(model) -> tuple[torch.Tensor, torch.Tensor]:
    S = model.config.image_size
    return tuple(torch.rand(2, 3, 3, S, S, generator=torch.Generator().manual_seed(0)))


def test_every_backend_is_known_with_its_precisions() -> None:
    assert set(PRECISIONS_OF) == set(BACKENDS)
    assert PRECISIONS_OF["cpu"] == ("fp32", "bf16", "int8")
    assert default_backend("cpu") == "cpu" and default_backend(torch.device("cuda", 1)) == "cuda"


@pytest.mark.parametrize(
    "backend",
    ["torch", "cpu", *(pytest.param(b, marks=pytest.mark.slow) for b in ONNX)],  # ONNX: an export each
)
def test_fp32_backends_give_the_model_core_ids(model, pairs, backend) -> None:
    """The model core's eager ids are what every fp32 backend writes, end to end and from E_MIR."""
    want = model.generate_ids(*pairs)
    captioner = namc.compile(model, backend)
    assert captioner.precision == "fp32"
    assert torch.equal(captioner.generate_ids(*pairs), want)
    with torch.inference_mode():
        memory = model.encode_pair(*pairs)
    assert torch.equal(captioner.decode(memory, model.config.max_new_tokens), want)
    assert captioner.generate(*pairs) == model.generate(*pairs)
    short = model.shortlist(["the big red ball moved", "nothing has changed"])
    assert torch.equal(captioner.generate_ids(*pairs, vocabulary=short), model.generate_ids(*pairs, vocabulary=short))


def test_the_cpu_backend_runs_an_inference_copy_and_leaves_the_model_alone(model, pairs) -> None:
    """The copy's decoder takes the fused step; the model keeps its plain modules and parameters."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for precision in ("fp32", "int8"):
        captioner = namc.compile(model, "cpu", precision)
        ids = captioner.generate_ids(*pairs, max_new_tokens=5, num_beams=2)
        assert ids.shape[0] == 3 and ids.shape[1] <= 5
    assert type(model.fdg) is FDG and not isinstance(model.fdg, FusedFDG)
    core = [*model.mir.modules(), *model.fdg.modules()]
    assert all(type(m) is torch.nn.LayerNorm for m in core if isinstance(m, torch.nn.LayerNorm))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bf16_on_the_torch_backend_autocasts(model, pairs) -> None:
    ids = namc.compile(model, "torch", "bf16").generate_ids(*pairs, max_new_tokens=4)
    assert ids.dtype == torch.long and ids.shape[0] == 3


@pytest.mark.parametrize(
    ("backend", "precision", "words"),
    [
        ("tensorrt", "fp32", "unknown backend 'tensorrt'"),
        ("torch", "int8", "int8 runs on the cpu, onnxruntime and openvino backends"),
        ("onnxruntime", "bf16", "runs fp32, int8, not 'bf16'"),
        ("cuda", "fp32", "needs the model on a GPU"),
        ("cpu", "fp16", "runs fp32, bf16, int8, not 'fp16'"),
    ],
)
def test_what_a_backend_does_not_run_is_one_line(model, backend, precision, words) -> None:
    with pytest.raises(ValueError, match=words) as err:
        namc.compile(model, backend, precision)
    assert "\n" not in str(err.value)


def test_compile_takes_a_model(model) -> None:
    with pytest.raises(TypeError, match="takes a NAMC model"):
        namc.compile(namc.compile(model, "torch"))


def test_describe_runs_a_captioner_at_its_own_precision(model, tmp_path) -> None:
    from PIL import Image

    for name in ("a.png", "b.png"):
        Image.new("RGB", (64, 64), (10, 200, 30) if name == "a.png" else (200, 10, 30)).save(tmp_path / name)
    a, b = str(tmp_path / "a.png"), str(tmp_path / "b.png")
    captioner = namc.compile(model, "torch")
    assert isinstance(captioner, Captioner)
    assert namc.describe(captioner, a, b) == namc.describe(model, a, b)
    with pytest.raises(ValueError, match="runs fp32, not int8"):
        namc.describe(captioner, a, b, precision="int8")


@pytest.mark.slow  # two exports
@pytest.mark.skipif(not ONNX, reason="needs the [deploy] extra")
def test_an_onnx_backend_exports_into_a_folder_that_goes_with_it(model, tmp_path) -> None:
    kept = namc.compile(model, ONNX[0], export_dir=tmp_path / "export")
    assert (tmp_path / "export" / "manifest.json").is_file()
    passing = namc.compile(model, ONNX[0])
    folder = passing.manifest.directory
    assert folder.is_dir()
    del passing
    gc.collect()
    assert not folder.exists()
    assert kept.manifest.directory.is_dir()


def test_the_fp32_view_is_kept_until_the_model_changes(model) -> None:
    """The cpu backend's fp32 path decodes through one view per model (what its step prepared once is reused), made
    again when a submodule is replaced or the training mode changes; it shares every parameter with the model."""
    from namc.backends.precision import fp32_view

    view = fp32_view(model)
    assert fp32_view(model) is view and isinstance(view.fdg, FusedFDG)
    assert view.fdg.tok.weight is model.fdg.tok.weight and view.mir is model.mir
    try:
        model.train()
        again = fp32_view(model)
        assert again is not view and again.training and again.fdg.training
    finally:
        model.eval()
    assert fp32_view(model) is not again and not fp32_view(model).fdg.training
