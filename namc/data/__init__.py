"""Data: the pre-training corpus (manifest + shards), benchmark loaders, the shapes world, transforms.

Nothing here imports Lightning (the Lightning DataModules live in ``namc.lit.datamodules``).
"""

from namc.data.benchmarks import (
    BENCHMARKS,
    AnnotationError,
    BenchmarkDataset,
    ClevrChange,
    ClevrDC,
    ImageEditingRequest,
    SpotTheDiff,
    build_benchmark,
)
from namc.data.corpus import CorpusDataset, CorpusRecord, pack_corpus, parse_record
from namc.data.issues import DataIssues, IssueKind
from namc.data.shapes import generate_benchmark, generate_corpus
from namc.data.transforms import ImageTransform

__all__ = [
    "BENCHMARKS",
    "AnnotationError",
    "BenchmarkDataset",
    "ClevrChange",
    "ClevrDC",
    "CorpusDataset",
    "CorpusRecord",
    "DataIssues",
    "ImageEditingRequest",
    "ImageTransform",
    "IssueKind",
    "SpotTheDiff",
    "build_benchmark",
    "generate_benchmark",
    "generate_corpus",
    "pack_corpus",
    "parse_record",
]
