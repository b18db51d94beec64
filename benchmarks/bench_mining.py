"""Benchmark of ``namc curate pairs`` (appendix D.1) on synthetic features: printed figures, no assertions.

Synthetic 768-d "CLIP" and 1024-d "DINOv2" features (float16, L2-normalised, as ``namc curate embed`` writes them)
are drawn around shared centres (``--group`` images per centre, the same grouping in both spaces), so neighbourhoods
are dense enough for the candidate rule to keep images and the clustering to run.

Parts (each optional):

- ``--crossover N ...``: kNN time of the exact index (IndexFlatIP) against IVF (IndexIVFScalarQuantizer fp16,
  nlist 4 sqrt(N), nprobe 32) on the 768-d features at each N, and IVF's recall of exact top-k. The N where IVF gets
  faster is ``namc.thresholds.KNN_EXACT_MAX``.
Times are CPU seconds of the one process (the machine is shared, so wall time is also printed but inflated).

- ``--full N``: the whole pipeline (:func:`namc.curate.mining.mine_pairs`, ``index=auto``) at N images: seconds per
  stage, peak RSS, and a projection to ``--project`` images (IVF kNN scaled as N^1.5, since each query scans
  nprobe/nlist of N with nlist ~ sqrt(N); candidates, clustering and union linearly).

Run it niced::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_mining.py --crossover 5000 10000 20000 --full 100000

The figures it gave are in docs/performance.md (Building a pre-training corpus, Thresholds).
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

import numpy as np


def synthetic(n: int, dims: tuple[int, ...], group: int, spread: float, seed: int = 0) -> list[np.ndarray]:
    """float16 (n, d) features per dim, rows around n // group shared centres, L2-normalised; drawn in chunks."""
    rng = np.random.default_rng(seed)
    n_centres = max(1, n // group)
    labels = rng.integers(0, n_centres, n)
    scale = spread * rng.uniform(0.7, 1.3, n).astype(np.float32)  # some images closer to their centre than others
    out = []
    for d in dims:
        centres = rng.standard_normal((n_centres, d), dtype=np.float32)
        centres /= np.linalg.norm(centres, axis=1, keepdims=True)
        x = np.empty((n, d), np.float16)
        for s in range(0, n, 8192):  # small chunks: the generator's temporaries stay far below the mining's memory
            e = min(s + 8192, n)
            z = centres[labels[s:e]] + (scale[s:e, None] / np.sqrt(d)) * rng.standard_normal(
                (e - s, d), dtype=np.float32
            )
            x[s:e] = z / np.linalg.norm(z, axis=1, keepdims=True)
        out.append(x)
        del centres
    return out


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def crossover(sizes: list[int], k: int, group: int, spread: float) -> None:
    from namc.curate.mining import top_k

    print(f"\n== exact vs IVF kNN (768-d, k={k}) ==")
    print(f"{'N':>9} {'exact cpu s':>11} {'(wall)':>8} {'ivf cpu s':>9} {'(wall)':>8} {'recall':>7}  ivf index")
    for n in sizes:
        (x,) = synthetic(n, (768,), group, spread)
        t, c = time.perf_counter(), time.process_time()
        exact = top_k(x, k, index="exact")
        te, ce = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        ivf = top_k(x, k, index="ivf")
        ti, ci = time.perf_counter() - t, time.process_time() - c
        recall = sum(len(np.intersect1d(a, b)) for a, b in zip(exact.ids, ivf.ids)) / exact.ids.size
        print(f"{n:>9,} {ce:>11.2f} {te:>8.2f} {ci:>9.2f} {ti:>8.2f} {recall:>7.4f}  {ivf.index}", flush=True)


def full(n: int, k: int, group: int, spread: float, project: int, workers: int, assign: str) -> None:
    from namc.curate.mining import MiningConfig, mine_pairs

    print(f"\n== full pipeline, N={n:,} (768-d + 1024-d float16, k={k}, index=auto, assign_labels={assign}) ==")
    t = time.perf_counter()
    clip, dino = synthetic(n, (768, 1024), group, spread)
    print(
        f"features drawn in {time.perf_counter() - t:.1f}s; {(clip.nbytes + dino.nbytes) / 2**30:.2f} GiB float16; "
        f"peak RSS so far {peak_rss_gb():.2f} GiB"
    )
    result = mine_pairs(clip, dino, MiningConfig(k=k, workers=workers, assign_labels=assign), progress=True)
    s = result.summary
    sec, cpu = s["seconds"], s["cpu_seconds"]
    print(f"indexes: clip {s['index_clip']}; dino {s['index_dino']}")
    print(
        f"images {s['images']:,}, with candidates {s['images_with_candidates']:,}, candidates {s['candidates']:,}, "
        f"pairs {s['pairs']:,} (before de-dup {s['pairs_before_dedup']:,})"
    )
    print("cpu s:  " + ", ".join(f"{a} {b:.1f}" for a, b in cpu.items()) + f"; total {sum(cpu.values()):.1f}")
    print("wall s: " + ", ".join(f"{a} {b:.1f}" for a, b in sec.items()) + f"; total {sum(sec.values()):.1f}")
    print(f"peak RSS {peak_rss_gb():.2f} GiB")
    r = project / n
    knn = (cpu["knn_clip"] + cpu["knn_dino"]) * r**1.5
    linear = (cpu["candidates"] + cpu["clustering"] + cpu["union"]) * r
    print(
        f"projection to {project:,} images, one thread of this CPU: kNN ~{knn / 3600:.1f} h (N^1.5), candidates + "
        f"clustering + union ~{linear / 3600:.1f} h (linear; clustering divides by --workers); features "
        f"{project * (768 + 1024) * 2 / 2**30:.1f} GiB float16 + IVF fp16 storage of one feature at a time "
        f"{project * 1024 * 2 / 2**30:.1f} GiB"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--crossover", type=int, nargs="*", default=[5000, 10000, 20000])
    p.add_argument("--full", type=int, nargs="*", default=[100_000])
    p.add_argument("--project", type=int, default=3_000_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--group", type=int, default=24, help="images per synthetic centre")
    p.add_argument("--spread", type=float, default=0.45, help="noise around a centre (cosine to it ~ 1/(1+s^2))")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--assign_labels", choices=("kmeans", "cluster_qr"), default="kmeans")
    args = p.parse_args()
    import faiss

    print(
        f"{platform.processor() or platform.machine()}, faiss {faiss.__version__}, GPUs seen by faiss: "
        f"{faiss.get_num_gpus()}, faiss threads {faiss.omp_get_max_threads()}"
    )
    if args.crossover:
        crossover(args.crossover, args.k, args.group, args.spread)
    for n in args.full:
        full(n, args.k, args.group, args.spread, args.project, args.workers, args.assign_labels)


if __name__ == "__main__":
    main()
