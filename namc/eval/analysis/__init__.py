"""Analyses of a trained NAMC: Table 9's reconstruction quality (:mod:`~namc.eval.analysis.reconstruction`) and
Figures 6-8's relevance and co-attention pictures (:mod:`~namc.eval.analysis.relevance`); ``namc analyze``
(:mod:`~namc.eval.analysis.cli`)."""

from namc.eval.analysis.reconstruction import (
    TABLE9_ROWS,
    VQGANDecoder,
    mir_codes,
    patch_metrics,
    reconstruction_table,
)
from namc.eval.analysis.relevance import pair_batch, pair_maps, plot_pair

__all__ = [
    "TABLE9_ROWS",
    "VQGANDecoder",
    "mir_codes",
    "pair_batch",
    "pair_maps",
    "patch_metrics",
    "plot_pair",
    "reconstruction_table",
]
