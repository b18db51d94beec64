"""Benchmark of the LLM client (namc.llm) against the local test server (tests/llm_server.py).

Prints, for concurrency 1, 16 and 64:

- with zero server latency: requests/s and the client's own CPU time per request (the server runs in another
  process, so its CPU is not counted; with a zero-latency Python server, requests/s is bounded by the server too);
- with 2 s server latency: requests/s, to show that concurrency hides latency (ideal: concurrency / 2 s).

Then the memory check: ``namc curate describe``'s whole path (pairs JSONL -> images -> requests -> results store)
over ``--pairs`` pairs (default 100,000; every pair points at the same two small PNGs), RSS at start, during, at the
end and its peak. (The threaded Python test server, not the client, limits zero-latency throughput at concurrency 64:
its 64 threads contend for one GIL; the client's CPU per request stays flat.) Numbers are printed, never asserted::

    nice -n 10 python benchmarks/bench_llm_client.py                      # everything
    python benchmarks/bench_llm_client.py --pairs 20000 --skip-latency    # a shorter run
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from PIL import Image

from namc.curate.describe import describe_jobs
from namc.llm import ClientConfig, LLMClient, ResultStore, RunSummary, image_message, run_jobs

ROOT = Path(__file__).resolve().parents[1]


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "llm_server.py"), "--latency", str(latency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/v1"


def _png(color: tuple[int, int, int], side: int = 64) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), color).save(buf, format="PNG")
    return buf.getvalue()


async def _burst(url: str, concurrency: int, n: int) -> tuple[float, float, int]:
    urls = [f"data:image/png;base64,{base64.b64encode(_png(c)).decode()}" for c in ((200, 0, 0), (0, 0, 200))]
    config = ClientConfig(base_url=url, model="bench", concurrency=concurrency, timeout=30.0, max_attempts=1)
    async with LLMClient(config) as client:
        await client.complete(image_message("warm-up", urls))
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(client.complete(image_message(f"pair {i}", urls)) for i in range(n)))
        return time.perf_counter() - t0, time.process_time() - cpu0, client.stats["attempts"] - 1


def throughput(latency: float, sizes: dict[int, int]) -> None:
    proc, url = start_server(latency)
    try:
        print(f"\nserver latency {latency:g} s")
        print(f"{'concurrency':>12}{'requests':>10}{'wall s':>9}{'req/s':>9}{'client CPU ms/req':>19}")
        for concurrency, n in sizes.items():
            wall, cpu, done = asyncio.run(_burst(url, concurrency, n))
            print(f"{concurrency:>12}{done:>10}{wall:>9.2f}{done / wall:>9.1f}{1000 * cpu / done:>19.3f}")
    finally:
        proc.terminate()
        proc.wait()


def memory(n_pairs: int, concurrency: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="namc-bench-llm-"))
    (work / "a.png").write_bytes(_png((200, 0, 0)))
    (work / "b.png").write_bytes(_png((0, 0, 200)))
    pairs = work / "pairs.jsonl"
    with open(pairs, "w", encoding="utf-8") as f:
        for i in range(n_pairs):
            row = {
                "id": f"p{i:07d}",
                "source": "cc3m",
                "image1": "a.png",
                "image2": "b.png",
                "caption1": f"a red square number {i}",
                "caption2": "a blue square",
            }
            f.write(json.dumps(row) + "\n")
    proc, url = start_server(0.0)
    me = psutil.Process()
    peak = [me.memory_info().rss]
    stop = threading.Event()
    summary = RunSummary()
    samples: list[tuple[int, int]] = []  # (pairs answered, RSS)

    def sample() -> None:
        while not stop.wait(0.5):
            rss = me.memory_info().rss
            peak[0] = max(peak[0], rss)
            samples.append((summary.ok, rss))

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        out = work / "descriptions.jsonl"
        config = ClientConfig(base_url=url, model="bench", concurrency=concurrency, timeout=30.0)
        rss0 = me.memory_info().rss
        sampler.start()
        with ResultStore(out) as store:
            rss_start = me.memory_info().rss
            jobs = describe_jobs(pairs, work, store, summary, {})
            run_jobs(jobs, store, config, summary, total=n_pairs, progress=False)
        stop.set()
        rss_end = me.memory_info().rss
        summary.check()
        mib = 1 / 2**20
        print(f"\nmemory over {n_pairs} pairs (describe path, concurrency {concurrency}, zero latency):")
        rate = summary.ok / summary.seconds
        print(
            f"  answered {summary.ok}, failed {sum(summary.failed.values())}, {summary.seconds:.1f} s "
            f"({rate:.0f} pairs/s), results file {out.stat().st_size * mib:.1f} MiB"
        )
        print(
            f"  RSS before opening the store {rss0 * mib:.1f} MiB, at start {rss_start * mib:.1f} MiB, "
            f"at end {rss_end * mib:.1f} MiB, peak {max(peak[0], rss_end) * mib:.1f} MiB"
        )
        marks = [samples[int(f * (len(samples) - 1))] for f in (0.0, 0.25, 0.5, 0.75, 1.0)] if samples else []
        print("  RSS during the run: " + ", ".join(f"{rss * mib:.1f} MiB after {n} pairs" for n, rss in marks))
    finally:
        stop.set()
        proc.terminate()
        proc.wait()
        for p in work.iterdir():
            p.unlink()
        work.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100_000, help="pairs in the memory run (0: skip it)")
    parser.add_argument("--requests", type=int, default=600, help="requests per zero-latency burst")
    parser.add_argument("--skip-latency", action="store_true", help="skip the 2 s latency runs")
    parser.add_argument("--skip-throughput", action="store_true", help="only the memory run")
    parser.add_argument("--memory-concurrency", type=int, default=16, help="concurrency of the memory run")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}")
    if not args.skip_throughput:
        throughput(0.0, {1: args.requests // 3, 16: args.requests, 64: args.requests})
    if not args.skip_latency and not args.skip_throughput:
        throughput(2.0, {1: 4, 16: 64, 64: 256})
    if args.pairs:
        memory(args.pairs, args.memory_concurrency)


if __name__ == "__main__":
    main()
