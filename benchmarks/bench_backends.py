"""Backends side by side: a model with random weights captioned through ``namc.compile`` on every backend x
precision asked for (default: torch fp32, cpu int8, ONNX Runtime and OpenVINO fp32 and int8), interleaved in one
process. Prints a table; asserts nothing.

    python benchmarks/bench_backends.py                          # namc_base, batch 1 and 32, 2 threads, 3 rounds
    python benchmarks/bench_backends.py --model namc_tiny --rounds 2 --runs torch:fp32 onnxruntime:fp32

For each batch size, each round times every backend in turn (after one untimed warm-up run each): end to end (pixels
to ids: grid, MIR, prefill and decoding) and decoding alone (from E_MIR: the cross-attention prefill and the greedy
steps). [EOS] is switched off, so every row generates ``--max-new-tokens`` tokens (as ``namc benchmark``'s fixed
length mode): tokens/s is batch x tokens over the time. The table gives the median over rounds, and the fastest.
The first run is the reference of the ratios and of the ids column.
``cpu+onnxruntime:int8`` is no backend but a measurement: the ``cpu`` backend's int8 encoder (its static int8 grid)
feeding ONNX Runtime's int8 decoding graphs, the mix that retiring namc's own int8 decoding step would make.
PyTorch runs ``--threads`` intra-op threads, each runtime as many; ``--omp-wait-policy`` is set before torch loads
(passive, as ``namc benchmark`` measures; ONNX Runtime's threads then sleep too, namc.deploy.captioner).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="namc_base", help="a preset, built with random weights (default namc_base)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="batch sizes (default 1 32)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per batch size (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of every backend (default 2)")
    parser.add_argument("--max-new-tokens", type=int, default=23, help="tokens per caption (default 23)")
    parser.add_argument(
        "--runs",
        nargs="+",
        default=[
            "torch:fp32",
            "cpu:int8",
            "onnxruntime:fp32",
            "openvino:fp32",
            "onnxruntime:int8",
            "openvino:int8",
        ],
        help="backend:precision pairs to time, the first the reference (default: torch:fp32 cpu:int8 "
        "onnxruntime:fp32 openvino:fp32 onnxruntime:int8 openvino:int8; also cpu+onnxruntime:int8)",
    )
    parser.add_argument("--omp-wait-policy", choices=("passive", "active"), default="passive")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the model and its export go (a temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as a JSON report")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()  # read by OpenMP when torch loads
    import torch

    from namc.eval.throughput.inference import length_mode
    from namc.models import create_model

    torch.set_num_threads(args.threads)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="namc-backends-"))
    torch.manual_seed(0)
    model = create_model(args.model, pretraining=False).eval()
    start = time.perf_counter()
    folder = model.save_pretrained(work / "model")
    captioners = _captioners(model, folder, work, args)
    print(f"{args.model}: saved, exported and calibrated in {work} in {time.perf_counter() - start:.0f} s")
    n, S = args.max_new_tokens, model.config.image_size
    names = {key: f"{key[0]} {key[1]}" for key in captioners}

    def runs(batch: int) -> dict[str, dict[str, Callable[[], object]]]:
        g = torch.Generator().manual_seed(batch)
        images_1, images_2 = torch.rand(2, batch, 3, S, S, generator=g)
        with torch.inference_mode():
            memory = model.encode_pair(images_1, images_2)
        return {
            names[key]: {
                "e2e": lambda c=c: c.generate_ids(images_1, images_2, n),
                "decode": lambda c=c: c.decode(memory, n),
            }
            for key, c in captioners.items()
        }

    times: dict[tuple[int, str, str], list[float]] = {}
    same: dict[tuple[int, str], bool] = {}  # the warm-up's end-to-end ids equal the reference's
    with length_mode(model, "fixed"):
        for batch in args.batches:
            calls = runs(batch)
            reference = None
            for backend in calls:  # warm-up: first calls allocate and (OpenVINO) compile shapes
                ids = calls[backend]["e2e"]()
                calls[backend]["decode"]()
                reference = ids if reference is None else reference
                same[(batch, backend)] = torch.equal(ids, reference)
            for _ in range(args.rounds):
                for backend, parts in calls.items():
                    for part, fn in parts.items():
                        start = time.perf_counter()
                        ids = fn()
                        elapsed = time.perf_counter() - start
                        assert ids.shape == (batch, n), ids.shape
                        times.setdefault((batch, backend, part), []).append(elapsed)

    print(
        f"\n{args.model}, random weights, {args.threads} threads, OMP_WAIT_POLICY={args.omp_wait_policy}, ",
        end="",
    )
    print(f"{n} tokens per caption, {args.rounds} interleaved rounds: tokens/s (median; fastest round)\n")
    first = names[next(iter(captioners))]
    print(f"| batch | backend | end to end | decoding | end to end vs {first} | decoding vs {first} | ids equal |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for batch in args.batches:
        base = {p: statistics.median(times[(batch, first, p)]) for p in ("e2e", "decode")}
        for backend in names.values():
            med = {p: statistics.median(times[(batch, backend, p)]) for p in ("e2e", "decode")}
            fast = {p: min(times[(batch, backend, p)]) for p in ("e2e", "decode")}
            cells = [f"{batch * n / med[p]:,.0f} ({batch * n / fast[p]:,.0f})" for p in ("e2e", "decode")]
            ratios = [f"{med[p] / base[p]:.2f}x time" for p in ("e2e", "decode")]
            row = [str(batch), backend, *cells, *ratios, str(same[(batch, backend)])]
            print("| " + " | ".join(row) + " |")
    if args.out is not None:
        _write_report(args, list(names.values()), times, same, n, torch.__version__)


def _captioners(model, folder: Path, work: Path, args: argparse.Namespace) -> dict:
    """(backend, precision) -> a captioner of ``model`` (saved in ``folder``), every int8 one calibrated on the same
    random pixels: the weights are random, so the scales only have to be alike (timing only)."""
    import torch

    import namc
    from namc.deploy import load_captioner
    from namc.deploy.export import export_onnx

    S = model.config.image_size
    calibration = [tuple(torch.rand(2, 16, 3, S, S, generator=torch.Generator().manual_seed(1)))]
    runs = [tuple(run.split(":", 1)) for run in args.runs]
    exported = ("onnxruntime", "openvino", "cpu+onnxruntime")
    exports = {
        precision: export_onnx(
            folder,
            work / f"export-{precision}",
            precision=precision,
            calibration=calibration if precision == "int8" else None,
        )
        for precision in sorted({p for b, p in runs if b in exported})
    }
    compiled = {}  # (backend, precision) -> namc.compile's captioner, also the mix's encoder

    def compile_once(backend: str, precision: str):
        if (backend, precision) not in compiled:
            compiled[(backend, precision)] = namc.compile(model, backend, precision)
            if backend == "cpu" and precision == "int8":  # its static int8 grid, as the ONNX int8 encoder's
                compiled[(backend, precision)].calibrate_int8([torch.cat(calibration[0])])
        return compiled[(backend, precision)]

    captioners = {}
    for backend, precision in runs:
        if backend not in exported:
            captioners[(backend, precision)] = compile_once(backend, precision)
            continue
        runtime = load_captioner(exports[precision], backend.removeprefix("cpu+"), threads=args.threads)
        runtime.eos_id = -1  # every row runs every step, as length_mode("fixed")
        mixed = backend == "cpu+onnxruntime"
        captioners[(backend, precision)] = _Mixed(compile_once("cpu", precision), runtime) if mixed else runtime
    return captioners


class _Mixed:
    """The ``cpu`` backend's int8 encoder, then ONNX Runtime's int8 decoding graphs (``decode``)."""

    def __init__(self, encoder, decoder) -> None:
        self.encoder, self.decoder = encoder, decoder

    def generate_ids(self, images_1, images_2, n: int):
        import torch

        from namc.backends.precision import precision_context

        with torch.inference_mode(), precision_context(self.encoder.model, "int8", self.encoder.device) as model:
            memory = model.encode_pair(images_1, images_2)
        return self.decoder.decode(memory, n)

    def decode(self, memory, n: int):
        return self.decoder.decode(memory, n)


def _write_report(
    args: argparse.Namespace, names: list[str], times: dict, same: dict, n: int, torch_version: str
) -> None:
    """The figures as JSON: every run's timed seconds per batch and part, and whether its ids equal the first's."""
    report = {
        "what": "backends",
        "model": args.model,
        "threads": args.threads,
        "omp_wait_policy": args.omp_wait_policy,
        "max_new_tokens": n,
        "rounds": args.rounds,
        "torch": torch_version,
        "runs": [
            {
                "batch": batch,
                "run": name,
                "seconds": {p: times[(batch, name, p)] for p in ("e2e", "decode")},
                "ids_equal_first": same[(batch, name)],
            }
            for batch in args.batches
            for name in names
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
