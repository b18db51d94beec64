"""Data-pipeline figures: reader throughput and peak memory on a 770K-line manifest, decode throughput from shards,
and shapes-world generation speed. Prints a table; asserts nothing.

    python benchmarks/bench_data.py                       # all figures (a few minutes on 2 cores)
    python benchmarks/bench_data.py --lines 100000 --pairs 500

1. A 770K-line manifest (the paper's corpus size, section 3.1.1) with paths only (no image files) is generated in a
   temporary folder and streamed by ``CorpusDataset(load_images=False)`` (JSON + template parsing, rank/worker
   split, shuffle buffer), in-process and with 2 DataLoader workers; Table 14-style statistics are computed over it.
2. Image pairs are packed into tar shards (JPEG 512x512, like InstructPix2Pix; PNG 64x64, like the demo) and
   decoded + transformed (RGB, bicubic resize, [0, 1]) by ``CorpusDataset`` with 0, 1 and 2 workers.
3. The shapes world generates 1,000 pairs at 64 px (benchmark: 3 images per pair; corpus: 2).

Peak memory is the PSS of the process plus its DataLoader workers (sum), sampled every 100 ms with psutil.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psutil
import torch
from torch.utils.data import DataLoader

from namc.data.corpus import CorpusDataset, pack_corpus
from namc.data.synthetic import corpus_record, generate_benchmark, generate_corpus, make_pair, render_scene
from namc.text.template import TemplateStats


class PeakMemory:
    """Samples the proportional set size (PSS: shared pages split between the processes sharing them, so forked
    DataLoader workers are not double-counted) of this process plus its children; ``peak`` in MiB."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak = 0.0
        self._stop = threading.Event()

    def current(self) -> float:
        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += p.memory_full_info().pss
        return total / 2**20

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.current())
            time.sleep(0.1)

    def __enter__(self) -> PeakMemory:
        self.peak = self.current()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.current())


def timed(fn: Callable[[], int]) -> tuple[int, float, float, float]:
    """Runs ``fn`` (returning an item count); returns (count, seconds, PSS before MiB, peak PSS MiB)."""
    before = PeakMemory().current()
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        n = fn()
        dt = time.perf_counter() - t0
    return n, dt, before, mem.peak


def write_manifest(path: Path, n_lines: int) -> None:
    """A manifest of ``n_lines`` pairs with shapes-world descriptions (1,000 distinct texts, cycled) and paths only."""
    texts = []
    for i in range(1000):
        rec, _ = corpus_record(make_pair(0, i, "corpus"), seed=0, noise_rate=0.2)
        rec.pop("change_type")
        texts.append(rec)
    sources = ("ip2p", "cc3m", "std")
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n_lines):
            line = {
                "id": f"pair-{i:07d}",
                "source": sources[i % 3],
                "image1": f"images/{i:07d}_1.jpg",
                "image2": f"images/{i:07d}_2.jpg",
                **texts[i % 1000],
            }
            f.write(json.dumps(line) + "\n")


def _stack(items: list[dict]) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
    """What a training collate must do with the images: stack them into (B, 3, H, W) (sent back to the main process)."""
    if not items or items[0]["image1"] is None:
        return len(items), None, None
    return len(items), torch.stack([it["image1"] for it in items]), torch.stack([it["image2"] for it in items])


def iterate(ds: CorpusDataset, workers: int) -> int:
    """Counts the samples of one epoch; with workers, in batches of 64 whose images are stacked in the worker."""
    if workers == 0:
        return sum(1 for _ in ds)
    loader = DataLoader(ds, batch_size=64, collate_fn=_stack, num_workers=workers, prefetch_factor=4)
    return sum(n for n, _, _ in loader)


def write_pairs(root: Path, n: int, size: int, fmt: str) -> Path:
    """``n`` shapes-world pairs rendered at ``size`` and saved as ``fmt`` (``jpg``/``png``), plus a manifest."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    manifest = root / "manifest.jsonl"
    with open(manifest, "w") as f:
        for i in range(n):
            pair = make_pair(0, i, "corpus")
            rec, _ = corpus_record(pair, seed=0, noise_rate=0.2)
            for k, scene in ((1, pair.before), (2, pair.after)):
                img = render_scene(scene, size)
                path = root / "images" / f"{i:06d}_{k}.{fmt}"
                img.save(path, quality=90) if fmt == "jpg" else img.save(path)
            f.write(
                json.dumps(
                    {
                        "id": f"p{i}",
                        "source": "shapes",
                        "image1": f"images/{i:06d}_1.{fmt}",
                        "image2": f"images/{i:06d}_2.{fmt}",
                        **rec,
                    }
                )
                + "\n"
            )
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=770_000)
    parser.add_argument("--pairs", type=int, default=2000, help="pairs per shard benchmark")
    parser.add_argument("--tmp", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    rows: list[tuple[str, str, str, str]] = []

    def row(name: str, result: tuple[int, float, float, float], unit: str = "pairs") -> None:
        n, dt, before, peak = result
        rows.append((name, f"{n:,} {unit} in {dt:.1f} s", f"{n / dt:,.0f} {unit}/s", f"{before:.0f} -> {peak:.0f}"))
        print(" | ".join(rows[-1]), flush=True)

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        tmp_path = Path(tmp)
        manifest = tmp_path / "big" / "manifest.jsonl"
        manifest.parent.mkdir()
        t0 = time.perf_counter()
        write_manifest(manifest, args.lines)
        size_mib = manifest.stat().st_size / 2**20
        print(f"wrote {args.lines:,} lines ({size_mib:.0f} MiB) in {time.perf_counter() - t0:.1f} s")

        for workers in (0, 2):
            ds = CorpusDataset(manifest, None, shuffle_buffer=10_000, load_images=False)
            row(f"manifest {args.lines:,} lines, paths only, workers={workers}", timed(partial(iterate, ds, workers)))
            assert ds.issues.ok == args.lines, ds.issues.summary()

        def stats() -> int:
            st = TemplateStats()
            with open(manifest) as f:
                for line in f:
                    rec = json.loads(line)
                    st.add(rec["description"], rec["source"])
            print(st.format_table())
            return st.rows()["overall"].total

        row("Table 14 statistics over the manifest", timed(stats), unit="descriptions")

        for size, fmt, image_size in ((512, "jpg", 224), (64, "png", 64)):
            root = tmp_path / f"pairs{size}"
            t0 = time.perf_counter()
            m = write_pairs(root, args.pairs, size, fmt)
            pack_corpus(m, root / "shards", shard_size=100, verify_images=False, progress=False)
            print(f"wrote and packed {args.pairs} pairs at {size} px in {time.perf_counter() - t0:.1f} s")
            for workers in (0, 1, 2):
                ds = CorpusDataset(root / "shards", image_size, shuffle_buffer=256)
                name = f"shards {size}px {fmt} -> {image_size}px tensors, workers={workers}"
                row(name, timed(partial(iterate, ds, workers)))

        jobs = [
            ("shapes benchmark 1,000 pairs at 64 px (3,000 PNGs)", partial(generate_benchmark, tmp_path / "b1", 1000)),
            ("shapes corpus 1,000 pairs at 64 px (2,000 PNGs)", partial(generate_corpus, tmp_path / "c1", 1000)),
            ("shapes benchmark, workers=2", partial(generate_benchmark, tmp_path / "b2", 1000, workers=2)),
        ]
        for name, job in jobs:
            cpu0 = os.times()
            row(name, timed(lambda job=job: (job(), 1000)[1]))
            cpu1 = os.times()
            print(f"  cpu time of this process: {cpu1.user - cpu0.user + cpu1.system - cpu0.system:.1f} s")
        t0 = time.perf_counter()
        for i in range(1000):
            pair = make_pair(0, i)
            render_scene(pair.before, 64)
            render_scene(pair.after, 64, pair.view_after)
            render_scene(pair.before, 64, pair.view_distractor)
        dt = time.perf_counter() - t0
        rows.append(
            (
                "shapes: render only, 3 images per pair at 64 px",
                f"1,000 pairs in {dt:.1f} s",
                f"{1000 / dt:,.0f} pairs/s",
                "-",
            )
        )

    print(f"\ncpu cores: {os.cpu_count()}")
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'work':<30}{'rate':<24}PSS MiB (before -> peak)")
    for name, work, rate, mem in rows:
        print(f"{name:<{width}}  {work:<30}{rate:<24}{mem}")


if __name__ == "__main__":
    main()
