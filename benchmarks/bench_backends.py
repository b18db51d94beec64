"""Backends side by side: a model with random weights captioned by PyTorch (``model.generate_ids``, fp32), ONNX
Runtime and OpenVINO (namc.deploy, fp32), interleaved in one process. Prints a table; asserts nothing.

    python benchmarks/bench_backends.py                          # namc_base, batch 1 and 32, 2 threads, 3 rounds
    python benchmarks/bench_backends.py --model namc_tiny --rounds 2

For each batch size, each round times every backend in turn (after one untimed warm-up run each): end to end (pixels
to ids: grid, MIR, prefill and decoding) and decoding alone (from E_MIR: the cross-attention prefill and the greedy
steps). [EOS] is switched off, so every row generates ``--max-new-tokens`` tokens (as ``namc benchmark``'s fixed
length mode): tokens/s is batch x tokens over the time. The table gives the median over rounds, and the fastest.
PyTorch runs ``--threads`` intra-op threads, each runtime as many; ``--omp-wait-policy`` is set before torch loads
(passive, as ``namc benchmark`` measures; ONNX Runtime's threads then sleep too, namc.deploy.captioner).
"""

from __future__ import annotations

import argparse
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
        "--backends", nargs="+", default=["torch", "onnxruntime", "openvino"], help="the backends to time"
    )
    parser.add_argument("--omp-wait-policy", choices=("passive", "active"), default="passive")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the model and its export go (a temp dir)")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()  # read by OpenMP when torch loads
    import torch

    from namc.deploy import load_captioner
    from namc.deploy.export import export_onnx
    from namc.eval.throughput.inference import length_mode
    from namc.models import create_model

    torch.set_num_threads(args.threads)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="namc-backends-"))
    torch.manual_seed(0)
    model = create_model(args.model, pretraining=False).eval()
    start = time.perf_counter()
    folder = model.save_pretrained(work / "model")
    export = export_onnx(folder, work / "export")
    print(f"{args.model}: saved and exported to {work} in {time.perf_counter() - start:.0f} s")
    captioners = {b: load_captioner(export, b, threads=args.threads) for b in args.backends if b != "torch"}
    for captioner in captioners.values():
        captioner.eos_id = -1  # every row runs every step, as the model under length_mode("fixed")
    n, S = args.max_new_tokens, model.config.image_size

    def runs(batch: int) -> dict[str, dict[str, Callable[[], object]]]:
        g = torch.Generator().manual_seed(batch)
        images_1, images_2 = torch.rand(2, batch, 3, S, S, generator=g)
        with torch.inference_mode():
            memory = model.encode_pair(images_1, images_2)
        out = {}
        for backend in args.backends:
            if backend == "torch":
                out[backend] = {
                    "e2e": lambda: model.generate_ids(images_1, images_2, n),
                    "decode": lambda: model.fdg.generate(memory, n),
                }
            else:
                c = captioners[backend]
                out[backend] = {
                    "e2e": lambda c=c: c.generate_ids(images_1, images_2, n),
                    "decode": lambda c=c: c.decode(memory.numpy(), n),
                }
        return out

    times: dict[tuple[int, str, str], list[float]] = {}
    same: dict[tuple[int, str], bool] = {}  # the warm-up's end-to-end ids equal torch's
    with length_mode(model, "fixed"):
        for batch in args.batches:
            calls = runs(batch)
            for backend in calls:  # warm-up: first calls allocate and (OpenVINO) compile shapes
                ids = calls[backend]["e2e"]()
                calls[backend]["decode"]()
                same[(batch, backend)] = torch.equal(ids, calls["torch"]["e2e"]()) if "torch" in calls else None
            for _ in range(args.rounds):
                for backend, parts in calls.items():
                    for part, fn in parts.items():
                        start = time.perf_counter()
                        ids = fn()
                        elapsed = time.perf_counter() - start
                        assert ids.shape == (batch, n), ids.shape
                        times.setdefault((batch, backend, part), []).append(elapsed)

    print(
        f"\n{args.model}, random weights, fp32, {args.threads} threads, OMP_WAIT_POLICY={args.omp_wait_policy}, ",
        end="",
    )
    print(f"{n} tokens per caption, {args.rounds} interleaved rounds: tokens/s (median; fastest round)\n")
    print("| batch | backend | end to end | decoding | end to end vs torch | decoding vs torch | ids = torch's |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for batch in args.batches:
        base = (
            {p: statistics.median(times[(batch, "torch", p)]) for p in ("e2e", "decode")}
            if "torch" in args.backends
            else None
        )
        for backend in args.backends:
            med = {p: statistics.median(times[(batch, backend, p)]) for p in ("e2e", "decode")}
            fast = {p: min(times[(batch, backend, p)]) for p in ("e2e", "decode")}
            cells = [f"{batch * n / med[p]:,.0f} ({batch * n / fast[p]:,.0f})" for p in ("e2e", "decode")]
            ratios = [f"{med[p] / base[p]:.2f}x time" if base else "-" for p in ("e2e", "decode")]
            row = [str(batch), backend, *cells, *ratios, str(same[(batch, backend)])]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
