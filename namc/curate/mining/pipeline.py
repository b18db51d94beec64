"""Appendix D.1 end to end over feature arrays: kNN (Eq. 5), candidates (D.1.2), clusters (Eq. 9-11), union (Eq. 12).

:func:`mine_pairs` takes the CLIP and DINOv2 features as plain arrays with rows in the same image order and returns
the pairs as row indices; the command line (:mod:`namc.curate.mining.cli`) adds the keys, references and captions.

Eq. 12's union is de-duplicated: (a, b) and (b, a) are one pair, kept where it first appears when the anchors are
visited in row order (so ``row1`` is that anchor, ``cluster`` its cluster number). Each pair carries both cosine
similarities (``sim_clip``, ``sim_dino``). Img-Diff's image-similarity filter (Img-Diff, seed 002, section 3 /
Table 17: keep pairs whose CLIP similarity lies in [0.9, 0.98]) is an option applied to the union.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from namc.curate.mining.candidates import Thresholds, candidate_sets
from namc.curate.mining.cluster import choose_per_cluster, cluster_labels, g_features
from namc.curate.mining.knn import DEFAULT_NPROBE, top_k

__all__ = ["MiningConfig", "MiningResult", "Pair", "cluster_all", "mine_pairs", "union_pairs"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MiningConfig:
    """Appendix D.1.4's values by default; ``k`` (the top-k of Eq. 5) is not given in the paper (ours: 10)."""

    k: int = 10
    thresholds: Thresholds = field(default_factory=Thresholds)
    n_clusters: int = 3
    gamma: float = 0.1
    alpha: float = 0.4
    beta: float = 0.6
    seed: int = 0
    index: str = "auto"
    nlist: int | None = None
    nprobe: int = DEFAULT_NPROBE
    use_gpu: bool | None = None
    imgdiff: tuple[float, float] | None = None  # Img-Diff's CLIP-similarity range, e.g. (0.9, 0.98)
    workers: int = 1
    assign_labels: str = "kmeans"  # or "cluster_qr" (faster): see cluster_labels


@dataclass(slots=True)
class Pair:
    """One mined pair as row indices: ``row1`` is the anchor I_i, ``row2`` = I*_{i,k} (Eq. 10)."""

    row1: int
    row2: int
    cluster: int
    sim_clip: float
    sim_dino: float


@dataclass
class MiningResult:
    pairs: list[Pair]
    summary: dict[str, Any]


_STATE: dict[str, Any] = {}  # arrays handed to forked clustering workers


def _cluster_range(start: int, stop: int) -> list[tuple[int, int, int]]:
    clip, dino = _STATE["clip"], _STATE["dino"]
    indptr, indices, cfg = _STATE["indptr"], _STATE["indices"], _STATE["cfg"]
    out = []
    for i in range(start, stop):
        cands = indices[indptr[i] : indptr[i + 1]]
        if len(cands) == 0:
            continue
        g_c = g_features(clip[cands], dino[cands], cfg.alpha, cfg.beta)  # (m, D)
        g_i = g_features(clip[i : i + 1], dino[i : i + 1], cfg.alpha, cfg.beta)[0]  # (D,)
        labels = cluster_labels(g_c, cfg.n_clusters, cfg.gamma, cfg.seed, cfg.assign_labels)
        for pos, k, _ in choose_per_cluster(g_i, g_c, labels):
            out.append((i, int(cands[pos]), k))
    return out


def cluster_all(
    clip: np.ndarray,
    dino: np.ndarray,
    indptr: np.ndarray,
    indices: np.ndarray,
    cfg: MiningConfig,
    progress: bool = False,
) -> list[tuple[int, int, int]]:
    """Eq. 9-11 for every anchor with a non-empty C_i: ``[(anchor, chosen, cluster), ...]`` in anchor order.

    ``cfg.workers > 1`` splits the anchors over forked processes (each clustering is seeded by ``cfg.seed``
    alone, so the result does not depend on the split).
    """
    from tqdm import tqdm

    n = len(indptr) - 1
    _STATE.update(clip=clip, dino=dino, indptr=indptr, indices=indices, cfg=cfg)
    step = 2048
    ranges = [(s, min(s + step, n)) for s in range(0, n, step)]
    out: list[tuple[int, int, int]] = []
    try:
        with tqdm(total=n, desc="clustering", unit="image", disable=not progress) as bar:
            if cfg.workers > 1 and len(ranges) > 1:
                with ProcessPoolExecutor(cfg.workers, mp_context=mp.get_context("fork")) as pool:
                    for (s, e), part in zip(ranges, pool.map(_cluster_range, *zip(*ranges))):
                        out.extend(part)
                        bar.update(e - s)
            else:
                for s, e in ranges:
                    out.extend(_cluster_range(s, e))
                    bar.update(e - s)
    finally:
        _STATE.clear()
    return out


def _row_dots(x: np.ndarray, a: np.ndarray, b: np.ndarray, chunk: int = 65_536) -> np.ndarray:
    """``x[a[j]] . x[b[j]]`` for every j, in float32, a chunk of rows at a time (memory O(chunk * d), not O(P * d))."""
    out = np.empty(len(a), dtype=np.float32)
    for s in range(0, len(a), chunk):
        xa = np.asarray(x[a[s : s + chunk]], np.float32)  # (B, d)
        xb = np.asarray(x[b[s : s + chunk]], np.float32)
        out[s : s + chunk] = np.einsum("ij,ij->i", xa, xb)
    return out


def union_pairs(chosen: list[tuple[int, int, int]], clip: np.ndarray, dino: np.ndarray) -> list[Pair]:
    """Eq. 12 de-duplicated: (a, b) and (b, a) once, the first occurrence kept; both cosines attached."""
    if not chosen:
        return []
    arr = np.asarray(chosen, dtype=np.int64)  # (P, 3): anchor, chosen, cluster, in anchor order
    lo, hi = np.minimum(arr[:, 0], arr[:, 1]), np.maximum(arr[:, 0], arr[:, 1])
    _, first = np.unique(lo * (int(hi.max()) + 1) + hi, return_index=True)  # first occurrence of each unordered pair
    first = np.sort(first[arr[first, 0] != arr[first, 1]])
    keep = arr[first]
    if not len(keep):
        return []
    s_clip, s_dino = _row_dots(clip, keep[:, 0], keep[:, 1]), _row_dots(dino, keep[:, 0], keep[:, 1])
    return [
        Pair(int(a), int(b), int(k), float(sc), float(sd)) for (a, b, k), sc, sd in zip(keep.tolist(), s_clip, s_dino)
    ]


def mine_pairs(
    clip: np.ndarray, dino: np.ndarray, cfg: MiningConfig | None = None, progress: bool = False
) -> MiningResult:
    """Appendix D.1 over (N, d_clip) CLIP and (N, d_dino) DINOv2 features of the same N images (rows L2-normalised).

    Returns:
        The pairs (row indices) and a summary: images, images with candidates, candidates, pairs before and after
        the Img-Diff filter, the indexes used, wall and CPU seconds per stage.
    """
    cfg = cfg or MiningConfig()
    if clip.shape[0] != dino.shape[0]:
        raise ValueError(f"CLIP features have {clip.shape[0]} rows, DINOv2 features {dino.shape[0]}")
    n = clip.shape[0]
    times: dict[str, float] = {}
    cpu: dict[str, float] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    knn_args = dict(index=cfg.index, nlist=cfg.nlist, nprobe=cfg.nprobe, seed=cfg.seed, use_gpu=cfg.use_gpu)
    kc = top_k(clip, cfg.k, progress=progress, desc="kNN clip", **knn_args)
    times["knn_clip"], cpu["knn_clip"] = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    kd = top_k(dino, cfg.k, progress=progress, desc="kNN dino", **knn_args)
    times["knn_dino"], cpu["knn_dino"] = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    indptr, indices = candidate_sets(kc.sims, kc.ids, kd.sims, kd.ids, cfg.thresholds)
    del kc.sims, kd.sims
    times["candidates"], cpu["candidates"] = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    chosen = cluster_all(clip, dino, indptr, indices, cfg, progress)
    times["clustering"], cpu["clustering"] = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    pairs = union_pairs(chosen, clip, dino)
    n_union = len(pairs)
    if cfg.imgdiff is not None:
        lo, hi = cfg.imgdiff
        pairs = [p for p in pairs if lo <= p.sim_clip <= hi]
    times["union"], cpu["union"] = time.perf_counter() - t0, time.process_time() - c0
    sizes = np.diff(indptr)
    summary = {
        "images": n,
        "images_with_candidates": int((sizes > 0).sum()),
        "candidates": int(sizes.sum()),
        "pairs_before_dedup": len(chosen),
        "pairs_union": n_union,
        "pairs": len(pairs),
        "imgdiff_filter": list(cfg.imgdiff) if cfg.imgdiff else None,
        "index_clip": kc.index,
        "index_dino": kd.index,
        "seconds": {k: round(v, 3) for k, v in times.items()},
        "cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},  # this process only (not clustering workers)
    }
    logger.info("mined %d pairs from %d images (%d with candidates)", len(pairs), n, summary["images_with_candidates"])
    return MiningResult(pairs, summary)
