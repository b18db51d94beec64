"""Image difference captioning (IDC) datasets, read in their official file layouts: one file per dataset.

- :mod:`~namc.data.idc.base`: :class:`BenchmarkDataset` (items, image cache, skip-and-count) and the shared JSON
  and split helpers;
- :mod:`~namc.data.idc.clevr_change`, :mod:`~namc.data.idc.clevr_dc`, :mod:`~namc.data.idc.spot_the_diff`,
  :mod:`~namc.data.idc.image_editing_request`: one loader each, with the layout it reads and where it was checked;
- :mod:`~namc.data.idc.omnidiff`: OmniDiff (``omnidiff``, ``omnidiff_real``, ``omnidiff_render``), in a documented
  layout of our own, since the release layout could not be confirmed (see its docstring);
- :mod:`~namc.data.idc.registry`: the one registry (``@register_dataset``), :func:`build_benchmark` and
  :func:`check_benchmark_root` (where to download a dataset that is not there).

Where these datasets sit among namc's layers is described in docs/architecture.md.
"""

from namc.data.idc.base import NO_CHANGE, AnnotationError, BenchmarkDataset
from namc.data.idc.clevr_change import ClevrChange
from namc.data.idc.clevr_dc import ClevrDC
from namc.data.idc.image_editing_request import ImageEditingRequest
from namc.data.idc.omnidiff import OmniDiff, OmniDiffReal, OmniDiffRender
from namc.data.idc.registry import (
    BENCHMARKS,
    build_benchmark,
    check_benchmark_root,
    dataset_class,
    list_datasets,
    register_dataset,
)
from namc.data.idc.spot_the_diff import SpotTheDiff

__all__ = [
    "BENCHMARKS",
    "NO_CHANGE",
    "AnnotationError",
    "BenchmarkDataset",
    "ClevrChange",
    "ClevrDC",
    "ImageEditingRequest",
    "OmniDiff",
    "OmniDiffReal",
    "OmniDiffRender",
    "SpotTheDiff",
    "build_benchmark",
    "check_benchmark_root",
    "dataset_class",
    "list_datasets",
    "register_dataset",
]
