"""Similar-pair mining, NAMC appendix D.1: faiss top-k (Eq. 5), the candidate rule (D.1.2), spectral clustering and
one image per cluster (Eq. 7-11), the de-duplicated union (Eq. 12).

- :mod:`.knn`: faiss indexes (exact / IVF, GPU when present) and the top-k search.
- :mod:`.candidates`: the thresholds and the reading of D.1.2 implemented (module docstring).
- :mod:`.cluster`: g(I) (Eq. 8), spectral clustering (Eq. 9), the per-cluster choice (Eq. 10).
- :mod:`.pipeline`: :func:`mine_pairs` over plain arrays.
- :mod:`.cli`: ``namc curate pairs`` (:func:`main`).
"""

from __future__ import annotations

from collections.abc import Sequence

from namc.curate.mining.candidates import Thresholds, candidate_sets, filter_sets
from namc.curate.mining.cluster import choose_per_cluster, cluster_labels, g_features
from namc.curate.mining.knn import EXACT_MAX, KnnResult, top_k
from namc.curate.mining.pipeline import MiningConfig, MiningResult, Pair, mine_pairs, union_pairs

__all__ = [
    "EXACT_MAX",
    "KnnResult",
    "MiningConfig",
    "MiningResult",
    "Pair",
    "Thresholds",
    "candidate_sets",
    "choose_per_cluster",
    "cluster_labels",
    "filter_sets",
    "g_features",
    "main",
    "mine_pairs",
    "top_k",
    "union_pairs",
]


def main(argv: Sequence[str] | None = None) -> int:
    """``namc curate pairs`` (see :mod:`namc.curate.mining.cli`)."""
    from namc.curate.mining.cli import main as cli_main

    return cli_main(argv)
