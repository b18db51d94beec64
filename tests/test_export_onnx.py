"""``namc export onnx`` and the onnxruntime / openvino captioners (namc.deploy): the exported graphs compute what
PyTorch computes, fp32 greedy captions equal torch's on the shapes world, ``namc describe --backend`` captions a pair
list through the same code path as torch, and a damaged folder or a missing runtime is one line naming the file or
the extra to install."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("openvino")

from namc.cli import main  # noqa: E402 (after the skips: the runtimes come with the [deploy] extra)
from namc.data.collate import pad_sequences  # noqa: E402
from namc.data.synthetic import make_pair, render_scene  # noqa: E402
from namc.data.transforms import ImageTransform  # noqa: E402
from namc.deploy.captioner import RuntimeMissingError, load_captioner, runtime_module  # noqa: E402
from namc.deploy.export import export_onnx  # noqa: E402
from namc.deploy.graphs import cache_names  # noqa: E402
from namc.deploy.manifest import MANIFEST_FILE  # noqa: E402
from namc.models import NAMC, create_model, load_model  # noqa: E402
from namc.models.files import ConfigError, WeightsError  # noqa: E402
from namc.models.layers import KVCache  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "golden" / "namc_tiny"  # trained a few steps (tests/test_golden.py)
BACKENDS = ("onnxruntime", "openvino")
PAIRS = 8


def _relative_error(got: np.ndarray, want: torch.Tensor) -> float:
    want = want.double().numpy()
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _shapes_pairs(count: int, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    transform = ImageTransform(size, None)
    pairs = [make_pair(i, 1) for i in range(count)]
    first = torch.stack([transform(render_scene(p.before, size)) for p in pairs])
    second = torch.stack([transform(render_scene(p.after, size)) for p in pairs])
    return first, second


@pytest.fixture(scope="module")
def one_thread():
    """Tiny graphs run fastest on one thread (and do not wait for a busy second core); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def golden(one_thread, tmp_path_factory: pytest.TempPathFactory) -> tuple[NAMC, Path]:
    """The golden namc_tiny (its greedy captions run all 23 steps) and its export by ``namc export onnx``."""
    out = tmp_path_factory.mktemp("export") / "golden"
    assert main(["export", "onnx", str(GOLDEN), str(out)]) == 0
    return load_model(GOLDEN, pretraining=False).eval(), out


@pytest.fixture(scope="module")
def captioners(golden) -> dict[str, object]:
    return {backend: load_captioner(golden[1], backend, threads=1) for backend in BACKENDS}


@pytest.fixture(scope="module")
def pairs() -> tuple[torch.Tensor, torch.Tensor]:
    return _shapes_pairs(PAIRS)


def test_the_graphs_compute_what_pytorch_computes(golden, captioners, pairs) -> None:
    """E_MIR against ``encode_pair`` and three decoding steps' logits and keys/values against FDG's own step (the
    module path, with its KV cache), on both runtimes: relative L2 error at most 1e-5."""
    model, _ = golden
    images_1, images_2 = pairs
    with torch.no_grad():
        memory = model.encode_pair(images_1, images_2)
        cross = model.fdg.cross_kv(memory)
    H, E = model.fdg.heads, model.config.dim // model.fdg.heads
    for backend, captioner in captioners.items():
        graphs = captioner.graphs
        (got,) = graphs["encoder"].run({"images_1": images_1.numpy(), "images_2": images_2.numpy()})
        assert _relative_error(got, memory) <= 1e-5, backend
        names = captioner.manifest.names("cross_kv", "outputs")
        got_cross = dict(zip(names, graphs["cross_kv"].run({"memory": memory.numpy()}), strict=True))
        flat = [t for kv in cross for t in kv]
        assert max(_relative_error(got_cross[n], t) for n, t in zip(names, flat, strict=True)) <= 1e-5, backend
        layers = len(model.fdg.blocks)
        caches = [KVCache(PAIRS, H, 4, E, "cpu", torch.float32) for _ in range(layers)]
        past = {name: np.zeros((PAIRS, H, 0, E), np.float32) for name in cache_names(layers, "past")}
        tokens = torch.full((PAIRS, 1), model.fdg.bos_id)
        for t in range(3):
            with torch.no_grad():
                want = model.fdg._step(tokens[:, 0], t, caches, cross, None)  # (B, V)
            feed = {"tokens": tokens.numpy(), "position": np.array([t]), **past, **got_cross}
            logits, *present = graphs["decoder_step"].run(feed)
            assert _relative_error(logits, want) <= 1e-5, (backend, t)
            for i, cache in enumerate(caches):
                assert _relative_error(present[2 * i], cache.k[:, :, : t + 1]) <= 1e-5, (backend, t, i)
                assert _relative_error(present[2 * i + 1], cache.v[:, :, : t + 1]) <= 1e-5, (backend, t, i)
            past = dict(zip(past, present, strict=True))
            tokens = want.argmax(-1, keepdim=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_captions_equal_torch(golden, captioners, pairs, backend: str) -> None:
    """fp32 greedy ids and captions of shapes-world pairs (23 steps: keys/values up to 23 positions), over the whole
    vocabulary and over a shortlist, equal torch's; a batch of one gives the first row's."""
    model, _ = golden
    captioner = captioners[backend]
    images_1, images_2 = pairs
    want = model.generate_ids(images_1, images_2)
    assert want.shape[1] == 23  # every step runs
    assert torch.equal(captioner.generate_ids(images_1, images_2), want)
    assert captioner.generate(images_1, images_2) == model.generate(images_1, images_2)
    assert torch.equal(captioner.generate_ids(images_1[:1].numpy(), images_2[:1].numpy()), want[:1, :23])
    shortlist = model.shortlist(["the cube moved", "a red sphere is there"])
    listed = captioner.generate_ids(images_1, images_2, vocabulary=shortlist)
    assert torch.equal(listed, model.generate_ids(images_1, images_2, vocabulary=shortlist))
    assert set(listed.unique().tolist()) <= set(shortlist.ids.tolist()) | {model.tokenizer.pad_id}
    assert bool((listed == model.tokenizer.eos_id).any(dim=1).all()) and listed.shape[1] < 23  # [EOS] ends each row
    assert torch.equal(captioner.generate_ids(images_1, images_2, max_new_tokens=5), want[:, :5])


@pytest.fixture(scope="module")
def lengths(one_thread, tmp_path_factory: pytest.TempPathFactory) -> tuple[NAMC, Path, torch.Tensor, torch.Tensor]:
    """namc_tiny whose FDG writes i + 1 words then [EOS] for shapes-world pair i (trained on E_MIR for tens of
    steps), saved and exported: rows finish at different steps and leave the batch as they do. It trains in eval
    mode and keeps the preset's dropout (0.1) in its config, which the export must switch off."""
    torch.manual_seed(0)
    model = create_model("namc_tiny", pretraining=False).eval()
    assert model.config.dropout > 0
    images_1, images_2 = _shapes_pairs(6)
    with torch.no_grad():
        memory = model.encode_pair(images_1, images_2)
    tok = model.tokenizer
    captions = [[*range(5, 6 + i), tok.eos_id] for i in range(6)]
    ids = pad_sequences([[tok.bos_id, *c] for c in captions], tok.pad_id)  # (P, T)
    inputs, targets = ids[:, :-1], ids[:, 1:].masked_fill(ids[:, 1:] == tok.pad_id, -100)
    opt = torch.optim.Adam(model.fdg.parameters(), lr=3e-3)
    for _ in range(400):
        logits = model.fdg(inputs, memory)  # (P, T - 1, V)
        if bool(((logits.argmax(-1) == targets) | (targets == -100)).all()):
            break
        opt.zero_grad()
        F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
        opt.step()
    folder = model.save_pretrained(tmp_path_factory.mktemp("lengths") / "model")
    return model, export_onnx(folder, folder.parent / "export"), images_1, images_2


@pytest.mark.slow  # trains tens of steps (the fast tier's [EOS]: the shortlist of test_greedy_captions_equal_torch)
@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_that_write_eos_stop_and_leave_the_batch(lengths, backend: str) -> None:
    model, folder, images_1, images_2 = lengths
    want = model.generate_ids(images_1, images_2)
    steps = [row.index(model.tokenizer.eos_id) + 1 for row in want.tolist()]
    assert steps == [2, 3, 4, 5, 6, 7], want  # the fixture learned its captions
    got = load_captioner(folder, backend, threads=1).generate_ids(images_1, images_2)
    assert torch.equal(got, want)


def test_describe_backend_captions_a_pair_list_as_torch_does(golden, tmp_path: Path, capsys) -> None:
    """``namc describe --backend onnxruntime --model EXPORT --pairs LIST``: the records torch's run writes."""
    for i in range(3):
        pair = make_pair(i, 1)
        render_scene(pair.before, 64).save(tmp_path / f"a{i}.png")
        render_scene(pair.after, 64).save(tmp_path / f"b{i}.png")
    (tmp_path / "pairs.txt").write_text("".join(f"a{i}.png\tb{i}.png\n" for i in range(3)), encoding="utf-8")
    argv = ["describe", "--pairs", str(tmp_path / "pairs.txt"), "--batch-size", "2"]
    assert main([*argv, "--model", str(GOLDEN)]) == 0
    want = capsys.readouterr().out
    assert main([*argv, "--model", str(golden[1]), "--backend", "onnxruntime"]) == 0
    assert capsys.readouterr().out == want
    assert len(want.splitlines()) == 3 and all(json.loads(line)["caption"] for line in want.splitlines())
    one = [str(tmp_path / "a0.png"), str(tmp_path / "b0.png")]
    assert main(["describe", *one, "--model", str(golden[1]), "--backend", "onnxruntime"]) == 0
    assert capsys.readouterr().out == json.loads(want.splitlines()[0])["caption"] + "\n"
    # another precision than the export's, int8 without an export, beam search: a usage error, one line
    for model, extra, words in (
        (golden[1], ["--precision", "int8"], "is a fp32 export: --precision fp32"),
        (GOLDEN, ["--precision", "int8"], "--precision int8 --calibration PAIRS"),
        (golden[1], ["--beams", "3"], "greedily"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["describe", *one, "--model", str(model), "--backend", "openvino", *extra])
        assert exit_info.value.code == 2 and words in capsys.readouterr().err.splitlines()[-1]


def _copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "copy"))


def _one_line_error(fn, error: type[Exception], *words: str) -> None:
    with pytest.raises(error) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_damaged_or_mixed_export_is_refused_naming_the_file(golden, tmp_path: Path, capsys) -> None:
    folder = _copy(golden[1], tmp_path)
    decoder = folder / "decoder_step.onnx"
    data = bytearray(decoder.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the weights
    decoder.write_bytes(bytes(data))
    _one_line_error(lambda: load_captioner(folder, "onnxruntime"), WeightsError, str(decoder), "SHA-256")
    decoder.unlink()
    _one_line_error(lambda: load_captioner(folder, "openvino"), WeightsError, str(decoder), "missing")
    # a manifest that vouches for other weights than the graphs carry
    folder = Path(shutil.copytree(golden[1], tmp_path / "mixed"))
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    manifest["weights"]["sha256"] = "0" * 64
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    for backend in BACKENDS:
        _one_line_error(lambda b=backend: load_captioner(folder, b), WeightsError, "encoder.onnx", "0" * 64)
    (folder / MANIFEST_FILE).write_text("{}")
    _one_line_error(lambda: load_captioner(folder, "onnxruntime"), ConfigError, "not a namc export manifest")
    # a model folder where an export folder is expected
    _one_line_error(lambda: load_captioner(GOLDEN, "onnxruntime"), FileNotFoundError, "namc export onnx")
    # the command line says each in one line
    pair = make_pair(0, 1)
    render_scene(pair.before, 64).save(tmp_path / "a.png")
    render_scene(pair.after, 64).save(tmp_path / "b.png")
    images = [str(tmp_path / "a.png"), str(tmp_path / "b.png")]
    assert main(["describe", *images, "--model", str(folder), "--backend", "onnxruntime"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a namc export manifest" in err, err
    # a model folder (no manifest) is exported on the fly, and captions as the torch backend does
    for backend in ("onnxruntime", "torch"):
        assert main(["describe", *images, "--model", str(GOLDEN), "--backend", backend]) == 0
    onnx, torch_ = capsys.readouterr().out.splitlines()
    assert onnx == torch_


def test_an_unknown_backend_or_a_missing_runtime_is_one_line(golden) -> None:
    _one_line_error(lambda: load_captioner(golden[1], "tensorrt"), ValueError, "unknown backend 'tensorrt'")
    _one_line_error(lambda: load_captioner(golden[1], "torch"), ValueError, "namc.load_model")
    missing = {"openvino": "openvino_is_not_installed"}  # a module name no environment has
    _one_line_error(
        lambda: runtime_module("openvino", missing), RuntimeMissingError, "openvino", 'pip install "namc[deploy]"'
    )
    assert runtime_module("onnxruntime").__name__ == "onnxruntime"


def test_the_manifest_records_shapes_opset_and_digests(golden) -> None:
    model, folder = golden
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert manifest["opset"] == 17 and manifest["precision"] == "fp32" and manifest["image_size"] == 64
    assert manifest["tokenizer"] == "tokenizer.json" and (folder / "tokenizer.json").is_file()
    assert manifest["decoder"]["eos_id"] == model.tokenizer.eos_id
    encoder = manifest["graphs"]["encoder"]
    assert encoder["inputs"][0] == {"name": "images_1", "shape": ["batch", 3, 64, 64], "dtype": "float32"}
    step = manifest["graphs"]["decoder_step"]
    assert [e["name"] for e in step["outputs"]][:3] == ["logits", "present.0.key", "present.0.value"]
    assert step["inputs"][2]["shape"] == ["batch", 2, "past", 16]
    weights = hashlib.sha256((GOLDEN / "model.safetensors").read_bytes()).hexdigest()
    assert manifest["weights"]["sha256"] == weights
    assert set(manifest["files"]) == {"encoder.onnx", "cross_kv.onnx", "decoder_step.onnx", "tokenizer.json"}
    assert max(manifest["checked"]["max_relative_error"].values()) < 1e-5
    # the tied vocabulary matrix is stored once, though the step reads it twice (embedding and projection)
    graph = onnx.load(str(folder / "decoder_step.onnx")).graph
    vocab = [t.name for t in graph.initializer if model.config.vocab_size in t.dims]
    assert len(vocab) == 1, vocab


def test_export_command_line(golden, tmp_path: Path, capsys) -> None:
    """``namc export onnx``: int8 without calibration pairs and a file as the output folder are one-line usage
    errors."""
    for argv, words in (
        (["onnx", str(GOLDEN), str(tmp_path / "x"), "--precision", "int8"], "needs --calibration"),
        (["onnx", str(GOLDEN), str(tmp_path / "x"), "--precision", "int8", "--calibration", "nope"], "no such"),
        (["onnx", str(tmp_path / "nope"), str(tmp_path / "x")], "model not found"),
    ):
        assert main(["export", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    (tmp_path / "file").write_text("")
    assert main(["export", "onnx", str(GOLDEN), str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err


_FRESH = """
import sys
from namc.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exit_:
    status = exit_.code
print("torch" in sys.modules, status or 0)
"""


@pytest.mark.slow  # fresh interpreters
def test_help_answers_before_torch_loads() -> None:
    """``namc export onnx --help`` and ``namc describe --help`` (which lists the backends) import no torch."""
    for argv, words in ((["export", "onnx", "--help"], "manifest.json"), (["describe", "--help"], "openvino")):
        proc = subprocess.run([sys.executable, "-c", _FRESH, *argv], capture_output=True, text=True, timeout=60)
        *printed, last = proc.stdout.splitlines()
        assert last == "False 0" and words in " ".join(printed), proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------------ int8


def _write_pair_list(folder: Path, count: int) -> Path:
    """``count`` shapes-world pairs as PNG files and a pair list naming them."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        pair = make_pair(100 + i, 1)  # other pairs than the ones checked
        for side, scene in (("a", pair.before), ("b", pair.after)):
            render_scene(scene, 64).save(folder / f"{i:03d}{side}.png")
        lines.append(f"{i:03d}a.png {i:03d}b.png")
    (folder / "pairs.txt").write_text("\n".join(lines) + "\n")
    return folder / "pairs.txt"


@pytest.fixture(scope="module")
def int8_export(one_thread, tmp_path_factory: pytest.TempPathFactory) -> tuple[NAMC, Path]:
    """A namc_tiny of width 128 (its matrices large enough to quantise: namc.thresholds.INT8_MIN_WEIGHT), random
    weights, exported in int8 by ``namc export onnx --precision int8``, calibrated on 16 pairs of a pair list."""
    tmp = tmp_path_factory.mktemp("int8")
    torch.manual_seed(0)
    folder = create_model("namc_tiny", pretraining=False, dim=128).save_pretrained(tmp / "model")
    pairs = _write_pair_list(tmp / "calibration", 16)
    argv = ["export", "onnx", str(folder), str(tmp / "out"), "--precision", "int8", "--calibration", str(pairs)]
    assert main(argv) == 0
    return load_model(folder, pretraining=False).eval(), tmp / "out"


def _teacher_forced_top1(captioner, memory: torch.Tensor, want: torch.Tensor) -> float:
    """The share of steps at which the captioner's decoding step, fed fp32's greedy tokens and its own caches, picks
    fp32's next token (one flip does not carry into the rest of the caption, as in free-running greedy ids)."""
    step = captioner.graphs["decoder_step"]
    cross = dict(zip(captioner._cross, captioner.graphs["cross_kv"].run({"memory": memory.numpy()}), strict=True))
    B, T = want.shape
    H, E = captioner._shape
    past = {name: np.zeros((B, H, 0, E), np.float32) for name in captioner._past}  # (B, H, t, E), t = 0
    tokens = np.full((B, 1), captioner.bos_id, np.int64)
    hits = 0
    for t in range(T):
        logits, *present = step.run({"tokens": tokens, "position": np.array([t], np.int64), **past, **cross})
        hits += int((logits.argmax(-1) == want[:, t].numpy()).sum())
        past = dict(zip(captioner._past, present, strict=True))
        tokens = want[:, t : t + 1].numpy()
    return hits / (B * T)


@pytest.mark.slow  # an export and its quantisation
@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_graphs_agree_with_fp32(int8_export, backend: str) -> None:
    """Each runtime's int8 encoder within 3.5% relative error of PyTorch's fp32 E_MIR and its int8 decoding step 97%
    top-1 agreement with fp32 (the hand-written int8 path: about 3% and 98%), with the settings namc pins for this
    CPU (on an AVX2 CPU without VNNI the runtime's defaults saturate: docs/performance.md)."""
    from namc.deploy.quantize import INT8_SETTINGS, cpu_capability

    if cpu_capability() != "avx2":
        pytest.skip("the bounds are measured on an AVX2 CPU without VNNI; this CPU has VNNI")
    model, folder = int8_export
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert manifest["precision"] == "int8" and manifest["quantization"]["settings"] == INT8_SETTINGS["avx2"]
    assert all(manifest["quantization"]["quantised_products"].values())  # every graph has int8 products
    captioner = load_captioner(folder, backend, threads=1)
    assert captioner.precision == "int8"
    first, second = _shapes_pairs(32)
    with torch.no_grad():
        memory = model.encode_pair(first, second)
        want = model.fdg.generate(memory, 23)
    (got,) = captioner.graphs["encoder"].run({"images_1": first.numpy(), "images_2": second.numpy()})
    assert _relative_error(got, memory) <= 0.035
    assert _teacher_forced_top1(captioner, memory, want) >= 0.97
    one = ["--model", str(folder), "--backend", backend, "--precision", "int8"]
    pair = [str(folder.parent / "calibration" / f"000{side}.png") for side in "ab"]
    assert main(["describe", *pair, *one]) == 0  # namc describe runs an int8 export at --precision int8


@pytest.mark.slow  # two exports and their quantisation
def test_compile_int8_on_the_exported_runtimes(golden, tmp_path: Path) -> None:
    """``namc.compile(model, "onnxruntime" | "openvino", "int8", calibration=...)`` exports, quantises and runs; int8
    without calibration pairs is a one-line error."""
    import namc

    model = golden[0]
    first, second = _shapes_pairs(8)
    with pytest.raises(ValueError, match="needs calibration"):
        namc.compile(model, "onnxruntime", "int8")
    want = model.generate(first, second)
    for backend in BACKENDS:
        captioner = namc.compile(model, backend, "int8", tmp_path / backend, calibration=[(first, second)])
        assert captioner.precision == "int8"
        same = [a == b for a, b in zip(captioner.generate(first, second), want, strict=True)]
        assert sum(same) >= 7, same


def test_int8_quantises_the_products_namc_quantises(golden) -> None:
    """The int8 export's choice of products: a constant weight of INT8_MIN_WEIGHT entries or more (none of the golden
    width-32 model's), never attention's product of two activations; 7-bit weights on a CPU without VNNI."""
    from namc.deploy.quantize import INT8_SETTINGS, _products
    from namc.thresholds import INT8_MIN_WEIGHT

    graph = onnx.load(str(golden[1] / "decoder_step.onnx")).graph
    sizes = {t.name: int(np.prod(t.dims)) for t in graph.initializer}
    products = [n for n in graph.node if n.op_type in ("MatMul", "Gemm")]
    keep, skip = _products(golden[1] / "decoder_step.onnx")
    assert sorted(keep + skip) == sorted(n.name for n in products) and keep == []
    assert any(n.input[1] not in sizes for n in products)  # attention's products are among the skipped
    assert max(sizes.get(n.input[1], 0) for n in products) < INT8_MIN_WEIGHT
    assert INT8_SETTINGS["avx2"]["reduce_range"] and not INT8_SETTINGS["vnni"]["reduce_range"]


def test_calibration_pairs_from_a_list_or_a_folder(tmp_path: Path) -> None:
    """``--calibration``: a pair list or a folder (consecutive files pair up), at the model's size; an unreadable
    image or an empty folder is a one-line error naming it."""
    from namc.export_cli import calibration_images

    listed = _write_pair_list(tmp_path / "pairs", 3)
    ((first, second),) = calibration_images(listed, 32)
    assert first.shape == second.shape == (3, 3, 32, 32) and 0 <= float(first.min()) <= float(first.max()) <= 1
    ((again, _),) = calibration_images(listed.parent, 32)  # the folder: 000a/000b, 001a/001b, ...
    assert torch.equal(again, first)
    (tmp_path / "empty").mkdir()
    (tmp_path / "pairs" / "000b.png").write_bytes(b"not a png")
    for source, words in ((tmp_path / "empty", "no pair of images"), (listed, "cannot read")):
        with pytest.raises(ValueError, match=words) as err:
            calibration_images(source, 32)
        assert "\n" not in str(err.value)
