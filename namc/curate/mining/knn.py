"""Top-k neighbours of every image under one feature, with faiss (appendix D.1.2, Eq. 5: "with the help of Faiss").

Features are L2-normalised rows, so inner product = cosine similarity (Eq. 4). Two indexes:

- **exact** (``IndexFlatIP``): brute force, float32; the reference, and the faster one for small collections.
- **ivf** (``IndexIVFScalarQuantizer`` with fp16 storage, inner product): ``nlist`` coarse cells (default
  ``4 * sqrt(N)``, k-means trained on up to ``64 * nlist`` rows drawn with ``seed``), ``nprobe`` cells searched per
  query (default :data:`DEFAULT_NPROBE`). fp16 storage halves memory and loses nothing for the fp16 feature shards of
  ``namc curate embed``. Its recall of exact top-k is checked in ``tests/test_curate_mining.py``.

``index="auto"`` takes exact up to :data:`EXACT_MAX` images and IVF above, where IVF (its training included) is the
faster (:data:`~namc.thresholds.KNN_EXACT_MAX`; figures in docs/performance.md). With a GPU
(``faiss.get_num_gpus() > 0``, a faiss-gpu build) the index is moved to all GPUs.

Every image is its own nearest neighbour; it is removed from its row (if an index misses it, the row's last entry is
dropped instead), so a row holds the ``k`` nearest *other* images, most similar first, ``-1`` / ``-inf`` padding where
fewer exist.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import faiss
import numpy as np

from namc.thresholds import KNN_EXACT_MAX, KNN_NPROBE

__all__ = ["DEFAULT_NPROBE", "EXACT_MAX", "KnnResult", "build_index", "normalise", "top_k"]

logger = logging.getLogger(__name__)

EXACT_MAX = KNN_EXACT_MAX  #: up to this many images ``index="auto"`` searches exactly
DEFAULT_NPROBE = KNN_NPROBE  #: IVF cells searched per query by default
_CHUNK = 16_384  # rows converted / searched at a time (bounds the float32 copies)


@dataclass
class KnnResult:
    """``sims`` (N, k) float32 and ``ids`` (N, k) int64, most similar first; ``index`` names what searched."""

    sims: np.ndarray
    ids: np.ndarray
    index: str


def normalise(x: np.ndarray) -> np.ndarray:
    """Rows as float32, L2-normalised (a zero row stays zero)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12))


def _to_gpu(index: faiss.Index, use_gpu: bool | None) -> faiss.Index:
    n_gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if (use_gpu is None and n_gpus > 0) or use_gpu:
        if n_gpus == 0:
            raise RuntimeError("gpu=True but faiss sees no GPU (install faiss-gpu and check CUDA_VISIBLE_DEVICES)")
        logger.info("faiss: index on %d GPU(s)", n_gpus)
        return faiss.index_cpu_to_all_gpus(index)
    return index


def build_index(
    features: np.ndarray,
    index: str = "auto",
    nlist: int | None = None,
    nprobe: int = DEFAULT_NPROBE,
    seed: int = 0,
    use_gpu: bool | None = None,
) -> tuple[faiss.Index, str]:
    """An inner-product index holding every row of ``features`` (N, d), and its description.

    Args:
        features: (N, d) rows (float16 or float32; normalised here).
        index: ``"exact"``, ``"ivf"`` or ``"auto"`` (exact up to :data:`EXACT_MAX` rows).
        nlist: IVF cells (default ``4 * sqrt(N)``, at most N / 39 so k-means has points for every cell).
        nprobe: IVF cells searched per query.
        seed: draws the IVF training sample.
        use_gpu: None: all GPUs when faiss sees any; True: require one; False: CPU.
    """
    n, d = features.shape
    if index == "auto":
        index = "exact" if n <= EXACT_MAX else "ivf"
    if index == "exact":
        idx: faiss.Index = faiss.IndexFlatIP(d)
        desc = "exact (IndexFlatIP)"
    elif index == "ivf":
        nlist = nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))
        quantizer = faiss.IndexFlatIP(d)
        idx = faiss.IndexIVFScalarQuantizer(
            quantizer, d, nlist, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
        )
        idx.own_fields = True
        quantizer.this.disown()
        rng = np.random.default_rng(seed)
        n_train = min(n, 64 * nlist)
        rows = np.sort(rng.choice(n, size=n_train, replace=False)) if n_train < n else np.arange(n)
        idx.train(normalise(features[rows]))
        idx.nprobe = min(nprobe, nlist)
        desc = f"ivf (IndexIVFScalarQuantizer fp16, nlist={nlist}, nprobe={idx.nprobe})"
    else:
        raise ValueError(f"index must be 'exact', 'ivf' or 'auto', got {index!r}")
    idx = _to_gpu(idx, use_gpu)
    for start in range(0, n, _CHUNK):
        idx.add(normalise(features[start : start + _CHUNK]))
    return idx, desc


def _drop_self(sims: np.ndarray, ids: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Removes each row's own id (or, if absent, its last entry) keeping the order: (B, k+1) -> (B, k)."""
    is_self = ids == rows[:, None]  # (B, k+1)
    order = np.argsort(is_self, axis=1, kind="stable")  # non-self entries first, order kept
    return np.take_along_axis(sims, order, 1)[:, :k], np.take_along_axis(ids, order, 1)[:, :k]


def top_k(
    features: np.ndarray,
    k: int,
    index: str = "auto",
    nlist: int | None = None,
    nprobe: int = DEFAULT_NPROBE,
    seed: int = 0,
    use_gpu: bool | None = None,
    progress: bool = False,
    desc: str = "kNN",
) -> KnnResult:
    """The ``k`` most similar other rows of every row (Eq. 5's candidate sets before thresholds).

    Args:
        features: (N, d), rows L2-normalised (renormalised in float32 here).
        k: neighbours per row.
        index, nlist, nprobe, seed, use_gpu: see :func:`build_index`.
        progress: a tqdm bar over the query rows.

    Returns:
        (N, k) similarities and ids, most similar first; ``-1`` ids and ``-inf`` similarities pad missing entries.
    """
    from tqdm import tqdm

    n = features.shape[0]
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    idx, name = build_index(features, index, nlist, nprobe, seed, use_gpu)
    kk = min(k + 1, n)
    sims = np.full((n, k), -np.inf, dtype=np.float32)
    ids = np.full((n, k), -1, dtype=np.int64)
    with tqdm(total=n, desc=desc, unit="image", disable=not progress) as bar:
        for start in range(0, n, _CHUNK):
            q = normalise(features[start : start + _CHUNK])
            s, i = idx.search(q, kk)  # (B, kk)
            rows = np.arange(start, start + len(q))
            s, i = _drop_self(s, i, rows, min(k, kk - 1) if kk > 1 else 0)
            sims[start : start + len(q), : s.shape[1]] = s
            ids[start : start + len(q), : i.shape[1]] = i
            bar.update(len(q))
    ids[ids < 0] = -1
    sims[ids < 0] = -np.inf
    return KnnResult(sims, ids, name)
