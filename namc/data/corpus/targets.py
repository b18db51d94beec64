"""Precomputed pre-training targets beside a packed shard (``namc data precompute`` writes them).

For ``shard-000000.tar``::

    shard-000000.codes.npy      int16 (n, 2, N): the VQGAN codes of image 1 and image 2 of n samples
    shard-000000.grids.npy      float16 (n, 2, N, C): the frozen ResNet grid features (optional)
    shard-000000.targets.json   {"keys": [the n samples' tar keys, in row order], "skipped": [...],
                                 "image_size": int, "codes": {...}, "grids": {...} | null, "shard_bytes": int,
                                 "shard_digest": str | null}

The ``.json`` is written last (each file through a temporary file and a rename), so its presence means the arrays
beside it are complete. Rows are joined to samples by the tar key (``000000042`` for ``000000042.json``), so a
sample the precompute skipped (an image that does not decode) simply has no row and is computed on the fly, and a
reader never has to trust the order of anything. ``shard_bytes`` and ``shard_digest`` say which shard the targets
were made from: its size, and the digest of its bytes that packing wrote in its sidecar (``shard-000000.json``,
``"tar_digest"``). Targets of another shard are ignored with a warning (and recomputed by the next ``namc data
precompute``): a tar's size alone would not tell a repacked shard from the old one, since tar pads to 10,240-byte
records, and a row would then give another image's codes. Packing also deletes a shard's targets when it rewrites
the shard. Targets made before shards carried a digest (``shard_digest`` null) are matched by size alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from namc.jsonl import loads

__all__ = ["ShardTargets", "check_targets", "made_from", "read_targets", "shard_stamp", "targets_path"]

TARGET_FILES = ("targets.json", "codes.npy", "grids.npy")

logger = logging.getLogger(__name__)


def targets_path(shard: Path, what: str) -> Path:
    """``shard-000000.{what}`` beside ``shard-000000.tar`` (``what``: ``codes.npy``, ``grids.npy``,
    ``targets.json``)."""
    return shard.with_name(shard.name[: -len(shard.suffix)] + "." + what)


def shard_stamp(shard: Path) -> dict[str, Any]:
    """What identifies a shard's content: ``{"shard_bytes": its size, "shard_digest": its sidecar's "tar_digest"
    (None for a shard packed before sidecars carried one, or without a readable sidecar)}``."""
    digest = None
    try:
        side = loads(shard.with_suffix(".json").read_bytes())
        digest = side.get("tar_digest") if isinstance(side, dict) else None
    except (OSError, ValueError):
        pass
    return {"shard_bytes": shard.stat().st_size, "shard_digest": digest}


def made_from(meta: dict[str, Any], stamp: dict[str, Any]) -> bool:
    """Whether targets with ``meta`` (a ``targets.json``) were made from the shard of ``stamp`` (:func:`shard_stamp`):
    the same size, and the same digest unless the targets were made without one."""
    if meta.get("shard_bytes") != stamp["shard_bytes"]:
        return False
    return meta.get("shard_digest") is None or meta["shard_digest"] == stamp["shard_digest"]


@dataclass
class ShardTargets:
    """The precomputed targets of one shard, memory-mapped."""

    rows: dict[str, int]
    codes: np.ndarray  # (n, 2, N) int16
    grids: np.ndarray | None  # (n, 2, N, C) float16
    meta: dict[str, Any]

    def get(self, key: str) -> tuple[np.ndarray, np.ndarray | None] | None:
        """``(codes (2, N), grids (2, N, C) or None)`` of the sample with tar key ``key``; None when it has none."""
        row = self.rows.get(key)
        if row is None:
            return None
        return self.codes[row], (self.grids[row] if self.grids is not None else None)


def read_targets(shard: Path, image_size: int | None) -> ShardTargets | None:
    """The shard's precomputed targets, or None when it has none (or stale ones, made from another shard: a warning).

    Raises:
        ValueError: the targets were computed at another image size than ``image_size`` (naming the file), or the
            arrays do not match their keys.
    """
    meta_path = targets_path(shard, "targets.json")
    if not meta_path.is_file():
        return None
    try:
        meta = loads(meta_path.read_bytes())
        keys = meta["keys"]
        codes = np.load(targets_path(shard, "codes.npy"), mmap_mode="r", allow_pickle=False)
        grids = None
        if meta.get("grids"):
            grids = np.load(targets_path(shard, "grids.npy"), mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, KeyError, TypeError) as err:  # damaged by hand: the encoders compute them instead
        logger.warning(
            "%s: unreadable precomputed targets (%s: %s), ignored; rerun `namc data precompute`",
            meta_path,
            type(err).__name__,
            err,
        )
        return None
    stamp = shard_stamp(shard)
    if not made_from(meta, stamp):
        logger.warning(
            "%s: made from another %s (%s bytes, digest %s; now %d bytes, digest %s): ignored (rerun "
            "`namc data precompute`)",
            meta_path,
            shard.name,
            meta.get("shard_bytes"),
            meta.get("shard_digest"),
            stamp["shard_bytes"],
            stamp["shard_digest"],
        )
        return None
    if image_size is not None and meta.get("image_size") != image_size:
        raise ValueError(
            f"{meta_path}: targets precomputed at {meta.get('image_size')} px, the corpus is read at {image_size} px: "
            "rerun `namc data precompute --model PRESET` with the preset you train, or read the corpus without them "
            "(CorpusDataModule precomputed: false)"
        )
    if codes.shape[0] != len(keys) or (grids is not None and grids.shape[0] != len(keys)):
        raise ValueError(f"{meta_path}: {len(keys)} keys but arrays of {codes.shape[0]} rows")
    return ShardTargets({k: i for i, k in enumerate(keys)}, codes, grids, meta)


def check_targets(
    corpus: str | Path,
    n_embed: int,
    vqgan_sha256: str | None,
    grid_model: str | None = None,
    grid_sha256: str | None = None,
    image_size: int | None = None,
) -> int:
    """Check that the precomputed targets of a corpus were made by the frozen encoders the model trains with.

    Codes from another VQGAN (other weights or codebook size) or grids from another ResNet would train silently
    against the wrong targets, or fail deep in the run on a code past the codebook; this check runs once, before
    training, and reads only the small ``targets.json`` of each shard.

    Args:
        corpus: a folder of packed shards (a JSONL manifest has no precomputed targets: nothing to check).
        n_embed: the model's VQGAN codebook size.
        vqgan_sha256: SHA-256 of the model's VQGAN weights file; None: the model's VQGAN is randomly initialised,
            so only the codebook size is compared.
        grid_model, grid_sha256: the model's frozen grid encoder and its weights' SHA-256, when precomputed grids
            would be used (None: they are not, e.g. the grid encoder trains).
        image_size: the side the model reads images at (None: not compared); targets of another size would stop
            the run with an error when their shard is reached.

    Returns:
        How many shards carry targets.

    Raises:
        ValueError: naming the first shard whose targets do not match, and what to do.
    """
    folder = Path(corpus)
    if not folder.is_dir():
        return 0
    found = 0
    for shard in sorted(folder.glob("*.tar")):
        meta_path = targets_path(shard, "targets.json")
        if not meta_path.is_file():
            continue
        try:
            meta = loads(meta_path.read_bytes())
        except (OSError, ValueError):
            continue  # read_targets warns about it and the encoders compute that shard's targets
        if not isinstance(meta, dict):
            continue
        found += 1
        codes, grids = meta.get("codes") or {}, meta.get("grids")
        checks = [
            ("targets precomputed at {} px, the model reads {} px", meta.get("image_size"), image_size),
            ("codes from a VQGAN with {} codes, the model's has {}", codes.get("n_embed"), n_embed),
            (
                "codes made with VQGAN weights sha256 {:.12}..., the model loads {:.12}...",
                codes.get("weights"),
                vqgan_sha256,
            ),
        ]
        if grids and grid_model is not None:
            checks += [
                ("grids of a {}, the model's grid encoder is {}", grids.get("model"), grid_model),
                (
                    "grids made with weights sha256 {:.12}..., the model loads {:.12}...",
                    grids.get("weights"),
                    grid_sha256,
                ),
            ]
        for message, made, expected in checks:
            if expected is not None and made != expected:
                raise ValueError(
                    f"{meta_path}: {message.format(str(made), str(expected))}: rerun `namc data precompute` with the "
                    "model's weights, or set CorpusDataModule precomputed: false"
                )
    return found
