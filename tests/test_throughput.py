"""The throughput harness (namc.eval.throughput): runs on namc_tiny, writes JSON that matches the documented schema,
counts tokens and FLOPs correctly. Timings are printed by the harness, never asserted here."""

from __future__ import annotations

import functools
import json
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

import namc
from namc.backends import onednn
from namc.backends.onednn import OneDNNLinear
from namc.backends.precision import calibrate_int8, int8_calibration
from namc.backends.qconv import qconv_available
from namc.backends.qlinear import DynamicLinear, full_range, int8_kernels
from namc.backends.step import InplaceGELU as GELU
from namc.backends.step import ThreadedLayerNorm as LayerNorm
from namc.eval import throughput as tp
from namc.eval.throughput.clip4idc import linear_form
from namc.eval.throughput.flops import fdg_shape
from namc.eval.throughput.schema_doc import schema_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmark_schema.md"
# what a CPU runs: oneDNN's bf16 (AVX-512 or AMX; an AVX2-only CPU keeps bf16 copies in fp32) and its exact int8
# convolutions (7-bit activations without VNNI; a torch build without them runs a calibrated grid in fp32)
BF16 = onednn.bf16_supported()
STATIC_GRID = "int8" if onednn.conv_available() and qconv_available() else "fp32"
QUICK = ["--threads", "1", "--repeats", "2", "--warmup", "1", "--gemm-size", "128", "--max-new-tokens", "5"]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "report.json"
    argv = ["--model", "namc_tiny", "--batch-sizes", "1", "3", "--reference", "all", "--train-batch-size", "2"]
    argv += ["--train-steps", "1", "--output", str(out), *QUICK]
    assert tp.main(argv) == 0
    return json.loads(out.read_text())


@pytest.mark.slow  # the module's report runs the benchmark with the full-size peer
def test_report_matches_schema(report):
    assert report["schema_version"] == tp.SCHEMA_VERSION == 13
    assert tp.validate_report(report) == []
    assert report["machine"]["allocator"]["reuse_freed_memory"] is False  # the default leaves malloc alone


@pytest.mark.slow  # the report fixture
def test_report_matches_jsonschema_package(report):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(report, tp.REPORT_SCHEMA)


def test_documented_schema_is_generated_from_the_code():
    """docs/benchmark_schema.md is rendered from REPORT_SCHEMA; regenerate it after changing the schema."""
    assert DOC.read_text() == schema_markdown(), "run: python -m namc.eval.throughput.schema_doc > " + str(DOC)


def test_documented_schema_is_the_code_schema():
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, "docs/benchmark_schema.md holds exactly one JSON Schema block"
    assert json.loads(blocks[0]) == json.loads(json.dumps(tp.REPORT_SCHEMA))


@pytest.mark.slow  # the report fixture
def test_documented_tables_name_every_field(report):
    """Every key the report writes appears in the documentation as a `field`."""
    text = DOC.read_text()

    def keys(obj, prefix=""):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield k
                if k not in ("backends", "parameters", "samples"):
                    yield from keys(v)
        elif isinstance(obj, list) and obj and isinstance(obj[0], dict):
            yield from keys(obj[0])

    missing = sorted({k for k in keys(report) if f"`{k}`" not in text})
    assert missing == []


@pytest.mark.slow  # the report fixture
def test_report_contents(report):
    s = report["settings"]
    assert s["batch_sizes"] == [1, 3] and s["threads"] == 1 and s["length_mode"] == "fixed"
    assert report["machine"]["torch_threads"] == 1
    assert report["machine"]["cpu_model"]
    bits = 8 if full_range() else 7  # what the CPU's kernels can do decides what bf16 and int8 run
    cpu = {"capability": torch.backends.cpu.get_cpu_capability(), "onednn_bf16": BF16, "int8_activation_bits": bits}
    assert report["machine"]["cpu_kernels"] == cpu
    params = report["model"]["parameters"]
    assert 0 < params["inference"] < params["total"]  # the NIM towers and VQGAN are not used at inference
    entries = {(e["batch_size"], e["mode"]): e for e in report["inference"]}
    assert set(entries) == {(b, m) for b in (1, 3) for m in ("decode", "grid", "e2e")}
    for (b, mode), e in entries.items():
        assert e["tokens_per_call"] == b * 5  # fixed length: exactly max_new_tokens per pair
        assert e["time_s"]["n"] == 2
        assert e["tokens_per_s"]["min"] == pytest.approx(e["tokens_per_call"] / e["time_s"]["max"])
        assert e["latency_s_per_pair"] == pytest.approx(e["time_s"]["median"] / b)
        assert e["peak_memory"]["method"] in ("linux_vmhwm", "unavailable")
        assert (e["flops"] is not None) == (mode == "decode")
    eff = entries[(3, "decode")]["flops"]
    assert eff["efficiency"] == pytest.approx(eff["achieved_per_s"] / report["matmul"]["flops_per_s"])
    runs = report["matmul"]["runs"]  # measured before and after the timed calls; the faster is the reference
    assert len(runs) == 2 and report["matmul"]["flops_per_s"] == max(runs) == eff["matmul_per_s"]
    refs = {(r["batch_size"], r["mode"]): r for r in report["reference"]}
    assert set(refs) == {(b, m) for b in (1, 3) for m in ("decode", "clip4idc_decode", "clip4idc_e2e")}
    assert all(r["speedup"] > 0 for r in report["reference"])
    for (b, mode), r in refs.items():
        if mode == "decode":
            assert r["tokens_match"] and r["namc_time_s"] is None
        else:  # the peer: same length, interleaved with namc's call of the compared level
            assert r["tokens_match"] is None and r["tokens_per_call"] == b * 5
            assert r["time_s"]["n"] == r["namc_time_s"]["n"] == report["settings"]["reference_repeats"]
            assert r["speedup"] == pytest.approx(r["time_s"]["median"] / r["namc_time_s"]["median"])
    peer = report["peer"]
    assert peer["paper_parameters"] == 173_700_000
    assert abs(peer["parameters"]["total"] - 173_700_000) < 50_000  # the paper's count, to its 0.1M rounding
    assert 0 < peer["parameters"]["inference"] < peer["parameters"]["total"]
    assert peer["linear_maps"] == "fp32"  # fp32: the peer itself, as namc's fp32 is its model core
    assert peer["encoder_linear_maps"] == peer["linear_maps"]
    style = report["model"]["parameters_paper_style"]
    assert style["inference_without_vocab_embedding"] == params["inference"] - style["vocab_embedding"]
    t = report["training"]
    assert t["kind"] == "pretrain" and t["batch_size"] == 2 and not t["vqgan_in_step"]
    est = t["pretrain_estimate"]
    assert est["hours"] == pytest.approx(770_000 * 20 / t["pairs_per_s"]["median"] / 3600)
    assert est["devices"] == 8 and est["hours_on_devices"] == pytest.approx(est["hours"] / 8)
    assert report["paper_table5"][-1] == {"model": "NAMC (Ours)", "parameters": 64_200_000, "tokens_per_s": 2248.53}


@pytest.mark.slow  # the report fixture
def test_printed_parameter_parts_add_up_to_the_inference_count(report):
    # the table's parts are what runs at inference: MIR without its pre-training heads (namc_base printed 34.0M for
    # MIR, its 13.0M heads included, beside an inference total of 105.5M that leaves them out); namc_base's counts
    # here, since namc_tiny's heads (0.02M) vanish in the table's rounding
    base = {"grid": 27_535_424, "mir": 34_020_608, "mir_pretrain_heads": 12_993_280, "fdg": 56_977_152}
    base["inference"] = base["grid"] + base["mir"] - base["mir_pretrain_heads"] + base["fdg"]
    shown = dict(report, model=dict(report["model"], parameters=dict(report["model"]["parameters"], **base)))
    line = next(x for x in tp.format_table(shown).splitlines() if x.startswith("parameters:"))
    figures = {k: float(re.search(rf"{k} ([0-9.]+)M", line)[1]) for k in ("inference", "grid", "MIR", "FDG")}
    assert figures == {"inference": 105.5, "grid": 27.5, "MIR": 21.0, "FDG": 57.0}


def test_main_prints_table(tmp_path, capsys):
    model = namc.create_model("namc_tiny", pretraining=False)
    model.save_pretrained(tmp_path / "tiny")
    argv = ["--model", str(tmp_path / "tiny"), "--batch-sizes", "2", "--modes", "decode", "--reference", "decode"]
    argv += ["--length-mode", "eos", "--train-batch-size", "2", "--train-steps", "1", *QUICK]
    assert tp.main(argv) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "decode vs decode" in out and "training (finetune" in out


def test_run_benchmark_directory_model_and_eos_mode(tmp_path):
    model = namc.create_model("namc_tiny", pretraining=False)
    model.save_pretrained(tmp_path / "tiny")
    settings = tp.BenchmarkSettings(
        model=str(tmp_path / "tiny"),
        batch_sizes=(2,),
        modes=("decode",),
        length_mode="eos",
        repeats=1,
        warmup=0,
        gemm_size=64,
        max_new_tokens=6,
        threads=1,
        train_batch_size=2,
        train_steps=1,
        train_warmup=0,
    )
    threads = torch.get_num_threads()
    report = tp.run_benchmark(settings)
    assert torch.get_num_threads() == threads  # restored
    assert tp.validate_report(report) == []
    assert report["model"]["source"] == "directory"
    (entry,) = report["inference"]
    assert 2 <= entry["tokens_per_call"] <= 12 and entry["length_mode"] == "eos"
    assert report["reference"][0]["tokens_match"]
    assert report["training"]["kind"] == "finetune" and report["training"]["pretrain_estimate"] is None


def test_a_callers_model_is_not_trained_by_the_training_measurement():
    model = namc.create_model("namc_tiny", pretraining=False).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    settings = tp.BenchmarkSettings(
        model="namc_tiny",
        batch_sizes=(1,),
        modes=("decode",),
        repeats=1,
        warmup=0,
        gemm_size=64,
        max_new_tokens=2,
        threads=1,
        reference="none",
        train_batch_size=2,
        train_steps=1,
        train_warmup=0,
    )
    assert tp.run_benchmark(settings, model=model)["training"]["kind"] == "finetune"
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("length_mode", ["fixed", "eos"])
def test_static_decode_run(length_mode):
    """``--static-decode``: every level decodes through one StaticDecoder per batch size, with the ids of the
    naive decoder (eos mode: rows ending where they do)."""
    settings = tp.BenchmarkSettings(
        model="namc_tiny",
        batch_sizes=(1, 3),
        length_mode=length_mode,
        repeats=1,
        warmup=1,
        gemm_size=64,
        max_new_tokens=6,
        threads=1,
        static_decode=True,
    )
    report = tp.run_benchmark(settings)
    assert tp.validate_report(report) == []
    assert report["settings"]["static_decode"] is True
    assert [(e["batch_size"], e["mode"]) for e in report["inference"]] == [
        (b, m) for b in (1, 3) for m in ("decode", "grid", "e2e")
    ]
    assert [r["tokens_match"] for r in report["reference"]] == [True, True]


@pytest.mark.slow  # the report fixture
def test_validate_report_finds_problems(report):
    broken = json.loads(json.dumps(report))
    del broken["machine"]["torch_version"]
    broken["inference"][0]["tokens_per_s"]["median"] = "fast"
    broken["inference"][1]["mode"] = "warp"
    broken["schema_version"] = 1
    errors = tp.validate_report(broken)
    assert any("missing 'torch_version'" in e for e in errors)
    assert any("inference[0].tokens_per_s.median" in e for e in errors)
    assert any("'warp'" in e for e in errors)
    assert any("schema_version" in e for e in errors)


def test_decoder_flops_by_hand():
    # D 2, F 4, V 3, N 5, 1 layer; one row of 2 tokens.
    # per token (t): 2*2*6 + 2*2*2 + 2*2*2*2 + 4*5*2 + 2*2*2*4 = 24 + 8 + 16 + 40 + 32 = 120, + 4*(t+1)*2, + 2*2*3 = 12
    # t = 0: 120 + 8 + 12 = 140; t = 1: 120 + 16 + 12 = 148; prefill: 2*5*2*4 = 80
    fl = tp.decoder_flops(dim=2, heads=1, layers=1, hidden=4, vocab_size=3, memory_len=5, lengths=[2])
    assert fl == {"total": 368.0, "prefill": 80.0, "per_token_mean": 144.0}
    two = tp.decoder_flops(dim=2, heads=1, layers=2, hidden=4, vocab_size=3, memory_len=5, lengths=[2, 1])
    # 2 layers: prefill 2*80 per row; tokens: t=0 -> 2*(120+8)+12 = 268, t=1 -> 2*(120+16)+12 = 284
    assert two["total"] == 2 * 160 + 268 + 284 + 268


def test_generated_lengths():
    ids = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 0, 0, 0]])
    assert tp.generated_lengths(ids, eos_id=2, max_new_tokens=4, mode="eos") == [2, 4, 1]
    assert tp.generated_lengths(ids, eos_id=2, max_new_tokens=4, mode="fixed") == [4, 4, 4]


def test_length_mode_restores_eos():
    model = namc.create_model("namc_tiny", pretraining=False)
    eos = model.tokenizer.eos_id
    with tp.length_mode(model, "fixed"):
        assert model.fdg.eos_id == -1 and model.tokenizer.eos_id == -1
    assert model.fdg.eos_id == eos == model.tokenizer.eos_id
    with pytest.raises(ValueError, match="length mode"), tp.length_mode(model, "forever"):
        pass


def test_peak_memory_sees_a_large_allocation():
    with tp.peak_memory(torch.device("cpu")) as mem:
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        del block
    if mem["method"] == "unavailable":
        pytest.skip("no /proc/self/clear_refs on this system")
    assert mem["delta_bytes"] >= 60 * 2**20


def test_summarize():
    s = tp.summarize([2.0, 1.0, 4.0])
    assert s == {
        "median": 2.0,
        "min": 1.0,
        "max": 4.0,
        "mean": 7 / 3,
        "spread": 1.5,
        "n": 3,
        "samples": [2.0, 1.0, 4.0],
    }


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dtype": "float16"}, "CUDA only"),
        ({"batch_sizes": (0,)}, "positive"),
        ({"modes": ("decode", "warp")}, "modes"),
        ({"length_mode": "forever"}, "length_mode"),
        ({"reference": "sometimes"}, "reference"),
        ({"reference": "pixels"}, "reference"),
        ({"precision": "fp8"}, "precision"),
        ({"precision": "bf16", "device": "cuda"}, "CPU runs"),
        ({"threads": 0}, "threads"),
    ],
)
def test_settings_reject_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tp.BenchmarkSettings(**kwargs)


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="neither a folder"):
        tp.load_model("no_such_model", torch.device("cpu"))


@pytest.mark.slow  # a benchmark process
def test_omp_wait_policy_reruns_in_a_child_process(tmp_path, monkeypatch):
    """OpenMP reads OMP_WAIT_POLICY when torch loads: the flag re-runs the benchmark in a child that has it set.
    The child, a process of its own, also applies ``--allocator reuse`` (tests/test_runtime.py checks what that
    does)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    out = tmp_path / "passive.json"
    argv = ["--model", "namc_tiny", "--batch-sizes", "1", "--modes", "decode", "--reference", "none"]
    argv += ["--omp-wait-policy", "passive", "--output", str(out), *QUICK, "--allocator", "reuse"]
    assert tp.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["machine"]["env"]["OMP_WAIT_POLICY"] == "PASSIVE"
    assert report["machine"]["allocator"]["reuse_freed_memory"] is (platform.libc_ver()[0] == "glibc")
    assert tp.validate_report(report) == []


@pytest.mark.parametrize(("precision", "grid"), [("bf16", "bf16"), ("int8", "int8"), ("int8", "fp32")])
def test_low_precision_run(tmp_path, capsys, precision, grid):
    """A bf16 / int8 run: namc's precision copy decodes, the matmul reference is measured in that precision; int8's
    grid is static int8 (calibrated on the synthetic images) unless ``--int8-grid fp32``."""
    out = tmp_path / "low.json"
    argv = ["--model", "namc_tiny", "--batch-sizes", "2", "--modes", "decode", "e2e", "--reference", "decode"]
    argv += ["--precision", precision, "--output", str(out), *QUICK]
    argv += ["--int8-grid", "fp32"] if precision == "int8" and grid == "fp32" else []
    assert tp.main(argv) == 0
    report = json.loads(out.read_text())
    assert tp.validate_report(report) == []
    assert report["settings"]["precision"] == precision
    decoder = {"bf16": "fp32", "int8": "int8"}[precision]  # namc_tiny's 128 x 512 layers: under bf16's 2^17 entries
    grid = STATIC_GRID if grid == "int8" else grid
    mir = "bf16" if precision == "int8" and onednn.amx_bf16() else precision  # AMX: int8's MIR in bf16
    parts = {"grid": grid, "mir": mir, "decoder": decoder, "vocabulary": decoder}
    matmul = {"bf16": "bfloat16", "int8": "int8"}[precision]
    if precision == "bf16" and not BF16:  # the bf16 copy, and so the GEMM reference, in fp32
        parts, matmul = dict.fromkeys(parts, "fp32"), "float32"
    assert report["model"]["part_precisions"] == parts
    assert report["matmul"]["dtype"] == matmul
    assert report["machine"]["int8_kernels"] == int8_kernels()  # the kernels its int8 layers ran on
    assert all(e["tokens_per_call"] == 10 for e in report["inference"])
    machine = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("machine: "))
    assert f"({torch.backends.cpu.get_cpu_capability()})" in machine
    if precision == "int8":
        assert f"({8 if full_range() else 7}-bit activations)" in machine
    assert ("no oneDNN bf16 here" in machine) is (precision == "bf16" and not BF16)


@pytest.mark.slow  # the full-size peer
def test_peer_at_its_own_precision(tmp_path, capsys):
    """``--reference-precision``: namc in int8 against the peer in bf16 (each at its fastest on a CPU with AMX), in
    one interleaved run; the report and the printed peer line say which precision the peer ran in."""
    if not onednn.linear_available():
        pytest.skip("this torch build has no oneDNN linear kernel")
    out = tmp_path / "mixed.json"
    argv = ["--model", "namc_tiny", "--batch-sizes", "1", "--modes", "decode", "--reference", "clip4idc"]
    argv += ["--precision", "int8", "--reference-precision", "bf16", "--output", str(out), *QUICK]
    assert tp.main(argv) == 0
    report = json.loads(out.read_text())
    assert tp.validate_report(report) == []
    assert report["settings"]["precision"] == "int8" and report["settings"]["reference_precision"] == "bf16"
    want = "onednn_bf16_prepacked" if BF16 else "fp32"  # bf16 is fp32 where oneDNN has no bf16
    assert report["peer"]["linear_maps"] == report["peer"]["encoder_linear_maps"] == want
    assert report["model"]["part_precisions"]["decoder"] == "int8"
    peer_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("CLIP4IDC peer: "))
    assert "random weights, bf16, every linear map " + want in peer_line


def test_int8_grid_of_a_calibrated_model(tmp_path):
    """A saved folder's calibration runs as the static grid and ``--int8-grid fp32`` still means fp32; a model passed
    to run_benchmark leaves with the calibration it came with (none stays none: the synthetic scales do not stick)."""
    model = namc.create_model("namc_tiny", pretraining=False).eval()
    calibrate_int8(model, [torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))])
    peaks = int8_calibration(model)
    model.save_pretrained(tmp_path / "tiny")
    for grid, want in (("static", STATIC_GRID), ("fp32", "fp32")):
        out = tmp_path / f"{grid}.json"
        argv = ["--model", str(tmp_path / "tiny"), "--batch-sizes", "2", "--modes", "decode", "--reference", "none"]
        assert tp.main([*argv, "--precision", "int8", "--int8-grid", grid, "--output", str(out), *QUICK]) == 0
        assert json.loads(out.read_text())["model"]["part_precisions"]["grid"] == want
    plain = namc.create_model("namc_tiny", pretraining=False)
    for m, before in ((model, peaks), (plain, None)):
        for grid in ("static", "fp32"):
            settings = tp.BenchmarkSettings(
                model="namc_tiny",
                batch_sizes=(1,),
                modes=("decode",),
                precision="int8",
                int8_grid=grid,
                repeats=1,
                warmup=0,
                gemm_size=64,
                max_new_tokens=3,
                threads=1,
                reference="none",
            )
            tp.run_benchmark(settings, model=m)
            assert int8_calibration(m) == before


@pytest.mark.slow  # the full-size peer
def test_clip4idc_peer_decodes_from_its_memory():
    """The peer: 100 visual tokens of width 512 from a pair, the prefix re-run at every step, one id per step."""
    torch.manual_seed(0)
    peer = tp.CLIP4IDCPeer().eval()
    images = torch.rand(2, 1, 3, 224, 224)
    with torch.inference_mode():
        memory = peer.encode(images[0], images[1])
        assert memory.shape == (1, 100, 512)
        logits = peer.logits(torch.full((1, 3), 49406), memory)
    assert logits.shape == (1, 3, 49408)  # every position projected
    peer.eos_id = -1
    ids = peer.decode(memory, 4)
    assert ids.shape == (1, 4)
    with torch.inference_mode():  # greedy: each id is the argmax after the prefix before it
        prefix = torch.cat([torch.full((1, 1), 49406), ids[:, :3]], dim=1)
        assert torch.equal(peer.logits(prefix, memory).argmax(-1), ids)
    int8 = tp.peer_at(peer, "int8")
    assert isinstance(int8.head, DynamicLinear) and int8 is not peer
    # a shortlist holding the full vocabulary's picks: the same ids, from a head of the listed rows only
    keep = torch.tensor(sorted({*ids.flatten().tolist(), 5, 700, 49407}))
    weight = peer.head.weight.detach().clone()
    peer.restrict_vocabulary(keep)
    assert peer.head.weight.shape == (keep.numel(), 512) and torch.equal(peer.head.weight, weight[keep])
    assert torch.equal(peer.decode(memory, 4), ids)
    assert isinstance(tp.peer_at(peer, "int8").head, DynamicLinear)


@pytest.mark.parametrize("precision", ["int8", "bf16", "fp32"])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("call", ["self", "causal", "cross"])
def test_projected_attention_is_multihead_attention(precision: str, batch_first: bool, call: str) -> None:
    """The converted peer's attention gives nn.MultiheadAttention's output up to int8, bf16 or float rounding, in each
    form the peer calls it (open_clip's self-attention, the decoder's causal self-attention and its cross-attention)."""
    from namc.eval.throughput.clip4idc import ProjectedAttention

    if precision != "int8" and not onednn.linear_available():
        pytest.skip("this torch build has no oneDNN linear kernel")
    if precision == "bf16" and not BF16:
        pytest.skip("oneDNN has no bf16 on this CPU (AVX2 only)")
    torch.manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    mha = nn.MultiheadAttention(64, 4, batch_first=batch_first).eval()
    with torch.no_grad():
        mha.in_proj_bias.normal_(0, 0.1)
        mha.out_proj.bias.normal_(0, 0.1)
    x, memory = torch.randn(3, 7, 64), torch.randn(3, 11, 64)
    if not batch_first:
        x, memory = x.transpose(0, 1), memory.transpose(0, 1)
    mask = torch.triu(torch.full((7, 7), float("-inf")), 1) if call == "causal" else None
    kv = memory if call == "cross" else x
    linear = DynamicLinear if precision == "int8" else functools.partial(OneDNNLinear, dtype=dtype)
    form = ProjectedAttention(mha, linear, cross=call == "cross")
    with torch.inference_mode():
        want = mha(x, kv, kv, attn_mask=mask, need_weights=False)[0]
        queries = x.to(dtype)
        memory = kv.to(dtype) if call == "cross" else queries  # a self-attention's keys are its queries
        got, weights = form(queries, memory, memory, attn_mask=None if mask is None else mask.to(dtype))
        wrong = form(queries, memory, memory)[0]  # what a dropped causal mask would give
    assert weights is None and got.shape == want.shape and got.dtype == dtype
    error = float((got.float() - want).norm() / want.norm())
    assert error < {"fp32": 1e-5, "bf16": 0.02, "int8": 0.02 if full_range() else 0.03}[precision], error  # 7 bits
    if call == "causal":
        assert float((wrong.float() - want).norm() / want.norm()) > 10 * error
    other = queries if call == "cross" else queries.clone()
    with pytest.raises(NotImplementedError):  # a form built for one kind of call refuses the other
        form(queries, other, other)


@pytest.mark.slow  # the full-size peer
@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_converted_peer_runs_every_linear_map_converted(precision: str) -> None:
    """The peer is converted as fully as namc: no linear map of its inference path stays as it was (PyTorch's dynamic
    flow leaves nn.MultiheadAttention's projections in fp32, a third of the peer's products; a plain bf16 weight is
    reordered by oneDNN at every call, where namc's bf16 decoding keeps its matrices prepacked). In fp32 both run as
    they are (test_the_fp32_peer_is_the_peer_itself)."""
    if precision == "bf16" and not (BF16 and onednn.linear_available()):
        pytest.skip("oneDNN has no bf16 linear kernel here: the bf16 peer is the fp32 peer")
    torch.manual_seed(0)
    peer = tp.CLIP4IDCPeer().eval()
    low = tp.peer_at(peer, precision)
    forms = {"int8": "int8_dynamic", "bf16": "onednn_bf16_prepacked"}
    assert linear_form(low) == forms[precision] and linear_form(peer) == "fp32"  # the report's peer.linear_maps
    encoder = "onednn_bf16_prepacked" if precision == "int8" and onednn.amx_bf16() else forms[precision]
    assert linear_form(low, encoder=True) == encoder and linear_form(peer, encoder=True) == "fp32"
    used = [low.clip.visual, low.cross, low.decoder, low.transform, low.head]
    assert not [m for part in used for m in part.modules() if isinstance(m, (nn.Linear, nn.MultiheadAttention))]
    # its LayerNorms and GELUs are namc's, with namc's rule for small inputs (namc.kernels)
    norms = [m for m in low.modules() if isinstance(m, (nn.LayerNorm, nn.GELU))]
    assert len(norms) > 40 and all(type(m) in (LayerNorm, GELU) for m in norms)
    assert all(isinstance(layer.activation, GELU) for layer in low.decoder)
    dtype = torch.bfloat16 if precision == "bf16" and BF16 else torch.float32
    images = torch.rand(2, 1, 3, 224, 224)
    with torch.inference_mode():
        want, got = peer.encode(images[0], images[1]), low.encode(images[0].to(dtype), images[1].to(dtype))
        bound = 1e-5 if dtype == torch.float32 and precision != "int8" else 0.05
        assert float((got.float() - want).norm() / want.norm()) < bound
        tokens = torch.full((1, 3), 49406)
        want, got = peer.logits(tokens, want), low.logits(tokens, want.to(dtype))
        assert float((got.float() - want).norm() / want.norm()) < bound


def test_the_fp32_peer_is_the_peer_itself() -> None:
    """namc's fp32 is its model core in eager PyTorch, so the fp32 peer is the peer as it is; where oneDNN has no
    bf16, the bf16 peer is too, as namc's bf16 copy stays fp32 there."""
    peer = tp.CLIP4IDCPeer.__new__(tp.CLIP4IDCPeer)
    nn.Module.__init__(peer)
    peer.head = nn.Linear(4, 4)
    assert tp.peer_at(peer, "fp32") is peer
    if not BF16:
        assert tp.peer_at(peer, "bf16") is peer


@pytest.mark.slow  # the full-size peer
@pytest.mark.skipif(not BF16, reason="oneDNN has no bf16 on this CPU (AVX2 only)")
def test_int8_peer_runs_its_memory_side_in_bf16_where_namc_does(monkeypatch) -> None:
    """On a CPU with AMX (set here) namc's int8 copy runs MIR and its cross-attention keys / values in bf16, so the
    int8 peer runs what it computes from the images alone in bf16 on oneDNN's prepacked kernel: its image encoder
    (the ViT and the pair embeddings), its cross encoder over the visual memory (re-run at every step) and its
    decoder's keys / values of that memory; everything else of its decoding in dynamic int8."""
    if not onednn.linear_available():
        pytest.skip("this torch build has no oneDNN linear kernel")
    monkeypatch.setattr(onednn, "_AMX_OK", True)
    torch.manual_seed(0)
    peer = tp.CLIP4IDCPeer().eval()
    low = tp.peer_at(peer, "int8")
    kinds = (OneDNNLinear, DynamicLinear)
    bf16 = [m for part in (low.clip.visual, low.cross) for m in part.modules() if isinstance(m, kinds)]
    bf16 += [layer.multihead_attn.kv for layer in low.decoder]
    assert bf16 and all(isinstance(m, OneDNNLinear) and m.weight.dtype == torch.bfloat16 for m in bf16)
    int8 = [m for part in (low.decoder, low.transform, low.head) for m in part.modules() if isinstance(m, kinds)]
    int8 = [m for m in int8 if all(m is not layer.multihead_attn.kv for layer in low.decoder)]
    assert len(int8) == 3 * 6 + 2 and all(isinstance(m, DynamicLinear) for m in int8)  # self q/k/v, out, q, out, FFN
    assert linear_form(low) == "int8_dynamic" and linear_form(low, encoder=True) == "onednn_bf16_prepacked"
    assert low.bef_embedding.dtype == low.clip.visual.conv1.weight.dtype == torch.bfloat16
    assert peer.bef_embedding.dtype == torch.float32  # the peer itself is untouched
    images = torch.rand(2, 1, 3, 224, 224)
    tokens = torch.full((1, 3), 49406)
    with torch.inference_mode():
        want, got = peer.encode(images[0], images[1]), low.encode(images[0], images[1])
        assert got.dtype == torch.bfloat16 and float((got.float() - want).norm() / want.norm()) < 0.05
        want, got = peer.logits(tokens, want), low.logits(tokens, got)
        assert got.dtype == torch.float32 and float((got - want).norm() / want.norm()) < 0.1
        monkeypatch.setattr(onednn, "_AMX_OK", False)
        assert tp.peer_at(peer, "int8").clip.visual.conv1.weight.dtype == torch.float32  # elsewhere all int8


def test_shortlist_run(tmp_path):
    """``--shortlist``: every level decodes over the same random list, the naive decoder too (the same ids), and
    the FLOP count has the list's rows in the vocabulary projection."""
    out = tmp_path / "report.json"
    argv = ["--model", "namc_tiny", "--batch-sizes", "2", "--shortlist", "12", "--output", str(out), *QUICK]
    assert tp.main(argv) == 0
    report = json.loads(out.read_text())
    assert tp.validate_report(report) == []
    assert report["settings"]["shortlist"] == 12 and report["reference"][0]["tokens_match"]
    assert report["model"]["shortlist"] == {"source": "random", "size": 12}
    shape = fdg_shape(namc.create_model("namc_tiny"))
    listed = report["inference"][0]["flops"]["per_call"]
    assert listed == tp.decoder_flops(**{**shape, "vocab_size": 12}, lengths=[5, 5])["total"]
    assert listed < tp.decoder_flops(**shape, lengths=[5, 5])["total"]
    short = tp.random_shortlist(81, 2, 12, 0)
    assert len(short) == 12 and 2 in short.ids.tolist()


def test_shortlist_of_the_model(tmp_path, capsys):
    """``--shortlist model``: a folder's own list (what ``namc fit`` keeps) is what every level decodes over, in
    the FLOP count too; a model without one, or a bad ``--shortlist``, is a one-line error before anything runs."""
    model = namc.create_model("namc_tiny", pretraining=False).eval()
    model.training_shortlist = model.shortlist(["the red cube moved", "a small sphere appeared"])
    size = len(model.training_shortlist)
    model.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "report.json"
    argv = ["--model", str(tmp_path / "tiny"), "--batch-sizes", "2", "--modes", "decode", "--reference", "decode"]
    assert tp.main([*argv, "--shortlist", "model", "--output", str(out), *QUICK]) == 0
    report = json.loads(out.read_text())
    assert tp.validate_report(report) == []
    assert report["settings"]["shortlist"] == "model" and report["model"]["shortlist"] == {
        "source": "model",
        "size": size,
    }
    assert report["reference"][0]["tokens_match"]
    shape = fdg_shape(model)
    assert (
        report["inference"][0]["flops"]["per_call"]
        == tp.decoder_flops(**{**shape, "vocab_size": size}, lengths=[5, 5])["total"]
    )
    assert f"shortlist={size} (model)" in capsys.readouterr().out
    # the ids generated are those of generate(..., vocabulary=model.training_shortlist)
    settings = tp.BenchmarkSettings(model=str(tmp_path / "tiny"), shortlist="model")
    assert tp.decoding_shortlist(namc.NAMC.from_pretrained(tmp_path / "tiny"), settings).ids.tolist() == (
        model.training_shortlist.ids.tolist()
    )
    assert tp.main(["--model", "namc_tiny", "--shortlist", "model", *QUICK]) == 2
    err = capsys.readouterr().err
    assert "has no shortlist of its own" in err and err.count("\n") == 1
    with pytest.raises(SystemExit):
        tp.main(["--shortlist", "most"])
    assert "a token count or 'model'" in capsys.readouterr().err
    bad = json.loads(json.dumps(report))
    bad["settings"]["shortlist"] = "random"
    assert any("settings.shortlist" in e for e in tp.validate_report(bad))


def test_bad_model_or_settings_is_one_line(tmp_path, capsys, monkeypatch):
    """What cannot run (no such model, a damaged folder, settings that contradict, int8 kernels that do not
    exist) exits 2 with one line."""
    model = namc.create_model("namc_tiny", pretraining=False)
    model.save_pretrained(tmp_path / "tiny")
    weights = tmp_path / "tiny" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + bytes(8))  # the digest no longer matches
    for argv, words in (
        (["--model", "no_such_model"], "neither a folder"),
        (["--model", str(tmp_path / "tiny")], "model.safetensors"),
        (["--precision", "bf16", "--device", "cuda"], "CPU runs"),
        (["--reference-precision", "bf16"], "with reference clip4idc"),  # the default reference has no peer
        (["--reference", "clip4idc", "--reference-precision", "int8", "--device", "cuda"], "CPU runs"),
        (["--batch-sizes", "0"], "positive"),
    ):
        assert tp.main([*argv, *QUICK]) == 2
        err = capsys.readouterr().err
        assert err.startswith("namc benchmark: ") and words in err and err.count("\n") == 1, err
    monkeypatch.setenv("NAMC_INT8_KERNELS", "int4")
    assert tp.main(QUICK) == 2
    err = capsys.readouterr().err
    assert err == "namc benchmark: NAMC_INT8_KERNELS='int4': expected 'quantized' or 'plain'\n", err


def test_gpu_script_stops_at_once_without_a_gpu(tmp_path):
    """benchmarks/gpu.sh (the GPU tables' runs) stops with one line where no CUDA GPU is found, before it writes."""
    script, bash = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.sh", shutil.which("bash")
    env = {"PATH": str(tmp_path)}  # no nvidia-smi on it, whatever this machine has
    usage = subprocess.run([bash, str(script)], capture_output=True, text=True, env=env)
    assert usage.returncode == 2
    assert usage.stderr.startswith("usage: bash benchmarks/gpu.sh OUT_DIR (") and usage.stderr.count("\n") == 1
    check = subprocess.run([bash, str(script), str(tmp_path / "out")], capture_output=True, text=True, env=env)
    assert check.returncode == 2
    assert check.stderr == (
        "gpu.sh: no CUDA GPU here (nvidia-smi finds none); DEVICE=cpu DTYPE=float32 MODEL=namc_tiny is a dry run\n"
    )
    assert not (tmp_path / "out").exists()


def test_backend_runs_through_the_command_line(tmp_path, capsys):
    """``--backend`` times each run through namc.compile at decode and e2e, and every row names its run."""
    out = tmp_path / "backends.json"
    argv = ["--model", "namc_tiny", "--batch-sizes", "2", "--reference", "none", "--output", str(out), "--threads"]
    argv += ["1", "--repeats", "1", "--warmup", "0", "--gemm-size", "32", "--max-new-tokens", "3"]
    assert tp.main([*argv, "--backend", "cpu:fp32", "cpu:int8", "torch"]) == 0
    report = json.loads(out.read_text())
    assert tp.validate_report(report) == []
    assert report["settings"]["backends"] == ["cpu:fp32", "cpu:int8", "torch"]
    assert report["settings"]["modes"] == ["decode", "e2e"]
    rows = [(e["backend"], e["precision"], e["mode"]) for e in report["inference"]]
    assert rows == [
        (*run, m) for run in (("cpu", "fp32"), ("cpu", "int8"), ("torch", "fp32")) for m in ("decode", "e2e")
    ]
    assert all(e["tokens_per_call"] == 3 * 2 for e in report["inference"])  # the fixed length on every backend
    table = capsys.readouterr().out
    assert "cpu:int8" in table and "torch:fp32" in table


def test_rows_without_backends_are_the_cpu_copy():
    """Without ``--backend`` the rows are the cpu backend's copy at ``--precision`` (and so tagged)."""
    settings = tp.BenchmarkSettings(
        model="namc_tiny",
        batch_sizes=(1,),
        modes=("decode",),
        precision="int8",
        int8_grid="fp32",
        repeats=1,
        warmup=0,
        gemm_size=32,
        max_new_tokens=2,
        threads=1,
        reference="decode",
    )
    report = tp.run_benchmark(settings)
    assert {(e["backend"], e["precision"]) for e in report["inference"] + report["reference"]} == {("cpu", "int8")}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backend", "tpu"], "want BACKEND or BACKEND:PRECISION"),
        (["--backend", "cpu:fp16"], "want BACKEND or BACKEND:PRECISION"),
        (["--backend", "cpu", "cpu:fp32"], "names a run twice"),
        (["--backend", "cpu", "--modes", "grid"], "with backends the levels are decode and e2e"),
        (["--backend", "onnxruntime:bf16"], "the onnxruntime backend runs"),
    ],
)
def test_bad_backend_runs_are_one_line_errors(argv, message, capsys):
    assert tp.main(["--model", "namc_tiny", "--reference", "none", *QUICK, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow  # namc_base, an ONNX export and the full-size peer
def test_namc_base_on_every_cpu_backend_beside_the_peer(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "base.json"
    runs = ["cpu:fp32", "cpu:int8", "onnxruntime:fp32"]
    argv = ["--model", "namc_base", "--batch-sizes", "1", "32", "--reference", "clip4idc", "--output", str(out)]
    argv += ["--repeats", "1", "--warmup", "0", "--gemm-size", "128", "--backend", *runs]
    assert tp.main(argv) == 0
    report = json.loads(out.read_text())
    assert tp.validate_report(report) == []
    got = {(e["backend"], e["precision"], e["batch_size"], e["mode"]) for e in report["inference"]}
    assert got == {(*r.split(":"), n, m) for r in runs for n in (1, 32) for m in ("decode", "e2e")}
    peer = {(r["backend"], r["precision"], r["batch_size"], r["mode"]) for r in report["reference"]}
    assert peer == {(*r.split(":"), n, m) for r in runs for n in (1, 32) for m in ("clip4idc_decode", "clip4idc_e2e")}
    assert all(r["speedup"] > 0 and r["namc_time_s"]["n"] == 1 for r in report["reference"])
    assert "CLIP4IDC peer" in capsys.readouterr().out
