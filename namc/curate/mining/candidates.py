"""The candidate rule of appendix D.1.2: from the CLIP and DINOv2 top-k sets to one candidate set C_i per image.

The paper: "we apply thresholds {tau_max, tau_min} to retain images whose similarity is neither too high (indicating
identical images) nor too low (indicating dissimilar images) within each candidate set. We also apply another set of
thresholds {tau_max^CLIP, tau_min^CLIP, tau_max^DINO, tau_min^DINO} to ensure that the candidate set falls within an
appropriate range by filtering out any sets where the maximum similarity is below tau_max^theta or minimum similarity
is below tau_min^theta. The final candidate image set is C_i = {I_c}, where I_c denotes the images that appear in
both C_i^CLIP and C_i^DINO after filtering." Values (D.1.4): {tau_max, tau_min} = {0.95, 0.78};
{tau_max^CLIP, tau_min^CLIP, tau_max^DINO, tau_min^DINO} = {0.80, 0.78, 0.80, 0.78}.

The wording leaves open which set the second test looks at. **Reading implemented by default**
(``set_test="topk"``): the set test is applied to the top-k set *as retrieved*, before the band filter: C_i^theta is
dropped whole when its most similar image is below tau_max^theta (I_i has no close enough neighbour) or its k-th
(least similar) image is below tau_min^theta (the neighbourhood is not uniformly similar); the surviving set then keeps
only the images with tau_min <= s <= tau_max. This is the reading in which both set thresholds can act: applied after
the band filter, every kept similarity is already >= tau_min = 0.78 = tau_min^theta, so the minimum test could never
fire with the paper's values. The other reading is ``set_test="band"``: band filter first, then drop a set whose kept
similarities have a maximum below tau_max^theta or a minimum below tau_min^theta (an emptied set is dropped). All six
thresholds are options.

A dropped set empties C_i (an image must appear in both sets). C_i keeps the CLIP ranking's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Thresholds", "candidate_sets", "filter_sets"]


@dataclass(frozen=True)
class Thresholds:
    """Appendix D.1.4's values by default."""

    tau_max: float = 0.95
    tau_min: float = 0.78
    tau_max_clip: float = 0.80
    tau_min_clip: float = 0.78
    tau_max_dino: float = 0.80
    tau_min_dino: float = 0.78
    set_test: str = "topk"  # "topk" (default reading) or "band"; see the module docstring

    def __post_init__(self) -> None:
        if self.set_test not in ("topk", "band"):
            raise ValueError(f"set_test must be 'topk' or 'band', got {self.set_test!r}")
        if self.tau_min > self.tau_max:
            raise ValueError(f"tau_min {self.tau_min} is above tau_max {self.tau_max}")


def filter_sets(sims: np.ndarray, ids: np.ndarray, set_max: float, set_min: float, t: Thresholds) -> np.ndarray:
    """Which top-k entries survive under one feature: (N, k) bool.

    Args:
        sims, ids: (N, k) from :func:`namc.curate.mining.knn.top_k` (``-1`` ids are padding).
        set_max, set_min: tau_max^theta and tau_min^theta of this feature.
        t: the band thresholds and the reading.
    """
    valid = ids >= 0
    band = valid & (sims >= t.tau_min) & (sims <= t.tau_max)
    looked = valid if t.set_test == "topk" else band
    has = looked.any(axis=1)
    s_max = np.where(looked, sims, -np.inf).max(axis=1, initial=-np.inf)
    s_min = np.where(looked, sims, np.inf).min(axis=1, initial=np.inf)
    keep_set = has & (s_max >= set_max) & (s_min >= set_min)  # (N,)
    return band & keep_set[:, None]


def candidate_sets(
    clip_sims: np.ndarray,
    clip_ids: np.ndarray,
    dino_sims: np.ndarray,
    dino_ids: np.ndarray,
    t: Thresholds | None = None,
    chunk: int = 65_536,
) -> tuple[np.ndarray, np.ndarray]:
    """C_i for every image, as a CSR pair ``(indptr (N+1,), indices)``: C_i = ``indices[indptr[i]:indptr[i+1]]``.

    Args:
        clip_sims, clip_ids: (N, k) top-k under CLIP features.
        dino_sims, dino_ids: (N, k') top-k under DINOv2 features.
        t: thresholds (appendix D.1.4 by default).
        chunk: rows intersected at a time (bounds the (chunk, k, k') comparison).
    """
    t = t or Thresholds()
    keep_c = filter_sets(clip_sims, clip_ids, t.tau_max_clip, t.tau_min_clip, t)
    keep_d = filter_sets(dino_sims, dino_ids, t.tau_max_dino, t.tau_min_dino, t)
    n = clip_ids.shape[0]
    counts = np.zeros(n, dtype=np.int64)
    parts = []
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        c = np.where(keep_c[start:stop], clip_ids[start:stop], -1)  # (B, k)
        d = np.where(keep_d[start:stop], dino_ids[start:stop], -2)  # (B, k'); -2 never equals -1
        both = (c[:, :, None] == d[:, None, :]).any(axis=2)  # (B, k): in the CLIP set and the DINO set
        counts[start:stop] = both.sum(axis=1)
        parts.append(c[both])  # row-major: each row's candidates in CLIP rank order
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return indptr, indices.astype(np.int64)
