"""The pre-training corpus: a JSONL manifest, WebDataset-style tar shards, and a streaming dataset over either.

- :mod:`~namc.data.corpus.records`: the manifest format, :class:`CorpusRecord` and its validation
  (:func:`parse_record`), precomputed VQGAN codes (:func:`read_codes`);
- :mod:`~namc.data.corpus.shards`: the tar shard format, its ``index.json``, reading samples back with truncation
  checks;
- :mod:`~namc.data.corpus.pack`: :func:`pack_corpus` (manifest -> shards, resumable) and its :class:`PackReport`;
- :mod:`~namc.data.corpus.dataset`: :class:`CorpusDataset`, which streams a manifest or shards to every rank and
  DataLoader worker through a seeded shuffle buffer.
"""

from namc.data.corpus.dataset import CorpusDataset
from namc.data.corpus.pack import PackReport, pack_corpus
from namc.data.corpus.records import (
    CorpusRecord,
    RecordError,
    iter_manifest,
    parse_record,
    read_codes,
    write_manifest,
)

__all__ = [
    "CorpusDataset",
    "CorpusRecord",
    "PackReport",
    "RecordError",
    "iter_manifest",
    "pack_corpus",
    "parse_record",
    "read_codes",
    "write_manifest",
]
