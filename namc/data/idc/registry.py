"""The one registry of IDC datasets: name -> loader class, with each dataset's layout and download hint.

A loader registers itself with :func:`register_dataset`; its class attributes ``name``, ``title``, ``layout``,
``url`` and ``marker`` (see :class:`~namc.data.idc.base.BenchmarkDataset`) are all the registry knows, so adding a
dataset is one new file (imported by ``namc/data/idc/__init__.py``) and nothing else::

    @register_dataset
    class MyDataset(BenchmarkDataset):
        name = "my_dataset"
        title = "My-Dataset"
        layout = "pairs/{id}_1.png, pairs/{id}_2.png, captions.json"
        url = "https://example.org/my-dataset"
        marker = "captions.json"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from namc.data.idc.base import BenchmarkDataset

__all__ = [
    "BENCHMARKS",
    "build_benchmark",
    "check_benchmark_root",
    "dataset_class",
    "list_datasets",
    "register_dataset",
]

#: name -> loader class, filled by :func:`register_dataset`
BENCHMARKS: dict[str, type[BenchmarkDataset]] = {}

_REQUIRED = ("name", "title", "layout", "url", "marker")
D = TypeVar("D", bound=type[BenchmarkDataset])


def register_dataset(cls: D) -> D:
    """Class decorator: adds a :class:`BenchmarkDataset` subclass to :data:`BENCHMARKS` under ``cls.name``.

    Raises:
        TypeError: the class does not set one of ``name``, ``title``, ``layout``, ``url``, ``marker``.
        ValueError: another class is registered under the same name.
    """
    missing = [attr for attr in _REQUIRED if not getattr(cls, attr, "")]
    if "name" not in cls.__dict__ and "name" not in missing:  # the base class's placeholder name does not count
        missing.insert(0, "name")
    if missing:
        raise TypeError(f"{cls.__name__} must set the class attributes {', '.join(missing)}")
    if cls.name in BENCHMARKS and BENCHMARKS[cls.name] is not cls:
        raise ValueError(f"dataset name {cls.name!r} is taken by {BENCHMARKS[cls.name].__name__}")
    BENCHMARKS[cls.name] = cls
    return cls


def list_datasets() -> list[str]:
    """The registered dataset names, sorted."""
    return sorted(BENCHMARKS)


def dataset_class(name: str) -> type[BenchmarkDataset]:
    """The loader class registered under ``name`` (ValueError listing the choices if there is none)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose from {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]


def build_benchmark(
    name: str, root: str | Path, split: str, image_size: int | None = 224, **kwargs: Any
) -> BenchmarkDataset:
    """Builds a benchmark dataset by name (``clevr_change``, ``clevr_dc``, ``spot_the_diff``, ``ier``, ``omnidiff``,
    ``omnidiff_real``, ``omnidiff_render``; :func:`list_datasets`).

    Args:
        name: benchmark name.
        root: the dataset folder in its official layout.
        split: ``train``, ``val`` or ``test``.
        image_size: side of the square output images.
        **kwargs: loader options (``on_error``, ``max_image_pixels``; ``include_distractors``, ``image_dir``).
    """
    return dataset_class(name)(root, split, image_size, **kwargs)


def check_benchmark_root(name: str, root: str | Path) -> Path:
    """The benchmark folder, or a FileNotFoundError that says where to get the data and how to unpack it."""
    cls = dataset_class(name)
    root = Path(root)
    if not (root / cls.marker).exists():
        raise FileNotFoundError(
            f"{cls.title} not found at {root}: download it from {cls.url} and unpack it so that {root / cls.marker} "
            f"exists (or set data.init_args.root to where it is)"
        )
    return root
