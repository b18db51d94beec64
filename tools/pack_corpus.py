"""Pack a JSONL pre-training manifest into WebDataset-style tar shards (thin over ``namc.data.corpus.pack_corpus``).

Resumable: complete shards (tar + sidecar json) are skipped, a partial one is rewritten. Descriptions, noise
labels, codes and (unless ``--no-verify-images``) images are validated; rejections are counted and reported.

    python tools/pack_corpus.py data/corpus/manifest.jsonl data/corpus/shards --shard-size 1000
"""

from __future__ import annotations

import logging
import sys

from namc.data.cli import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(main(["pack", *sys.argv[1:]]))
