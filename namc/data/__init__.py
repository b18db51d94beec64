"""Data: IDC dataset loaders, the pre-training corpus, the shapes world, collators and the image transform.

Import from the subpackage that holds what you need; this package imports none of them, so reading one image
(:mod:`namc.data.transforms`, which ``namc.describe`` uses) does not load the loaders or the shapes renderer:

- :mod:`namc.data.idc`: image difference captioning datasets in their official layouts, one registry
  (``build_benchmark``, ``list_datasets``, ``register_dataset``).
- :mod:`namc.data.corpus`: the pre-training corpus (records, tar shards, packing, streaming ``CorpusDataset``).
- :mod:`namc.data.synthetic`: the shapes world (``generate_benchmark``, ``generate_corpus``).
- :mod:`namc.data.collate`, :mod:`namc.data.transforms`, :mod:`namc.data.issues` (skip-and-count bad input).

Nothing here imports Lightning (the Lightning DataModules live in :mod:`namc.lit.datamodules`).
"""
