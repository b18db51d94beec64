"""Where the time of greedy decoding goes: FDG's KV-cached generation of one preset at one precision and batch size.

Prints the median time of ``fdg.generate`` over random memory (the MIR output shape of the preset), tokens/s, and the
torch profiler's operators by self CPU time for one call. Random weights: the time of a call does not depend on
them (EOS is disabled, so every call makes exactly ``--tokens`` tokens). Profiles taken while other jobs run show
where time goes, not how fast it goes: compare changes with interleaved timings in one process.

    OMP_WAIT_POLICY=PASSIVE python scripts/profile_decode.py --model namc_base --precision bf16 --batch 32 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import namc
from namc.backends.precision import PRECISIONS, inference_copy, run_context


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="namc_base")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--tokens", type=int, default=23)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=25, help="operators listed")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = inference_copy(namc.create_model(args.model).eval(), args.precision)
    fdg = model.fdg
    eos = fdg.eos_id
    fdg.eos_id = -1  # never stop early: every call makes exactly --tokens tokens
    with torch.inference_mode(), run_context(args.precision, torch.device("cpu")):
        g = torch.Generator().manual_seed(0)
        size = model.config.image_size
        img = torch.rand(2, args.batch, 3, size, size, generator=g)
        grid = model.grid(img.flatten(0, 1))
        memory = model.encode_pair(None, None, grid[: args.batch], grid[args.batch :])
        n_mem = memory.shape[1]
        ms = _median_ms(lambda: fdg.generate(memory, args.tokens), args.repeats)
        print(
            f"{args.model} {args.precision} batch {args.batch}, memory {n_mem} x {memory.shape[2]}, "
            f"{args.threads} thread(s): generate {ms:.1f} ms median of {args.repeats}, "
            f"{args.batch * args.tokens / ms * 1e3:.1f} tokens/s"
        )
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fdg.generate(memory, args.tokens)
    fdg.eos_id = eos
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
