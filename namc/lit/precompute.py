"""``namc data precompute``: the frozen VQGAN codes (and optionally the frozen ResNet grids) of every pair of a
packed corpus, written beside its shards (:mod:`namc.data.corpus.targets`), through Lightning ``Trainer.predict``.

::

    namc data precompute --shards data/corpus/shards --model namc_base \\
        --vqgan-weights vqgan_f16_16384/last.ckpt [--grids --grid-weights resnet101.safetensors] \\
        --trainer.devices 8

Pre-training then reads them (``CorpusDataModule(precomputed=True)``, the default) and neither frozen encoder runs
for those samples: the paper's ResNet grids are "pre-extracted" (appendix E.2), and the VQGAN codes are the MIR
targets (196 per image at 224 px). The parts are built from the preset's config (``--model``: VQGAN ddconfig and
codebook, ResNet architecture and stage, image size), with the weights files given here, and the images are read
exactly as pre-training reads them (:class:`namc.data.transforms.ImageTransform` at the preset's image size), so
the codes equal what the model computes on the fly. Give the model the same weights files when training
(``overrides: {vqgan_pretrained: ..., grid_pretrained: ...}``).

One shard of the corpus is one unit of work (:mod:`namc.lit.shardwise`): pending shards are dealt to all ranks, a
shard's targets are written when its last batch is in (``targets.json`` last), a rerun skips shards whose targets
exist for the same settings (image size, weights' SHA-256, grids) and shard size. Samples whose images do not
decode are listed in ``targets.json`` (``skipped``) and have no row. Options also come from the ``precompute``
section of a pipeline YAML (``--config``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.features import atomic_save_npy
from namc.data.corpus import CorpusDataset
from namc.data.corpus.records import IMAGE_ERRORS, RecordError
from namc.data.corpus.shards import iter_tar_groups, list_shards, shard_sizes
from namc.data.corpus.targets import made_from, shard_stamp, targets_path
from namc.data.issues import DataIssues, IssueKind
from namc.data.transforms import MAX_IMAGE_PIXELS, ImageTransform, pixel_cap_arg
from namc.lit.shardwise import ShardDataModule, ShardWriter, add_trainer_arguments, clean_temporaries, make_trainer
from namc.locks import LockedError, is_launching_process, output_lock
from namc.models.files import atomic_write_text, file_digest, read_json
from namc.models.grid import GridEncoder
from namc.models.registry import model_config
from namc.models.vqgan import VQGANTokenizer

__all__ = ["PrecomputeJob", "PrecomputeModule", "PrecomputeSource", "build_parser", "main"]


class PrecomputeSource:
    """The batches of one packed shard: both images of each sample, read as pre-training reads them.

    Args:
        shards: the corpus's shards, in order.
        image_size: the model's input side.
        batch_size: pairs per batch.
        max_image_pixels: the pixel cap (None: none).
    """

    def __init__(self, shards: list[Path], image_size: int, batch_size: int, max_image_pixels: int | None) -> None:
        self.shards = shards
        self.sizes = shard_sizes(shards)
        self.transform = ImageTransform(image_size, max_image_pixels)
        self.batch_size = batch_size

    def lines(self, shard: int) -> int:
        return self.sizes.get(self.shards[shard], 0)

    def batches(self, shard: int) -> Iterator[dict[str, Any]]:
        path = self.shards[shard]
        issues = DataIssues(path.name, max_examples=10**9)
        keys: list[str] = []
        skipped: list[dict[str, Any]] = []
        images: list[torch.Tensor] = []
        consumed = 0
        for key, group in iter_tar_groups(path, issues, self.sizes.get(path)):
            consumed += 1
            try:
                (img1, img2), _, _ = CorpusDataset._shard_parts(group)
                pair = []
                for slot, data in (("image1", img1), ("image2", img2)):
                    try:
                        pair.append(self.transform.load(data))
                    except IMAGE_ERRORS as err:
                        raise RecordError(IssueKind.CORRUPT_IMAGE, f"{slot}: {err}") from None
            except RecordError as err:  # oversized images included (ImageTooLargeError is a RecordError)
                skipped.append({"key": key, "reason": err.kind.value, "error": str(err)})
                continue
            keys.append(key)
            images.append(torch.stack(pair))  # (2, 3, H, W)
            if len(keys) == self.batch_size:
                yield self._batch(shard, False, consumed, keys, skipped, images)
                keys, skipped, images, consumed = [], [], [], 0
        for kind, examples in issues.examples.items():  # a damaged shard: what iter_tar_groups counted
            skipped += [{"key": None, "reason": kind, "error": e} for e in examples]
        yield self._batch(shard, True, consumed, keys, skipped, images)

    @staticmethod
    def _batch(shard: int, last: bool, consumed: int, keys: list, skipped: list, images: list) -> dict[str, Any]:
        stacked = torch.stack(images) if images else torch.zeros(0)  # (b, 2, 3, H, W)
        return {
            "shard": shard,
            "last": last,
            "n_lines": consumed,
            "keys": keys,
            "skipped": skipped,
            "inputs": {"images": stacked},
        }


class PrecomputeModule(pl.LightningModule):
    """The frozen VQGAN (and ResNet grid encoder); ``predict_step`` returns ``{"codes": (b, 2, N) int16,
    "grids": (b, 2, N, C) float16}``."""

    def __init__(self, vqgan: VQGANTokenizer, grid: GridEncoder | None) -> None:
        super().__init__()
        self.vqgan = vqgan
        self.grid = grid

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, np.ndarray]:
        x = batch["inputs"]["images"]  # (b, 2, 3, H, W)
        if x.shape[0] == 0:
            return {}
        b = x.shape[0]
        flat = x.flatten(0, 1)  # (2b, 3, H, W): sample 0 image 1, sample 0 image 2, ...
        out = {"codes": self.vqgan(flat).view(b, 2, -1).to(torch.int16).cpu().numpy()}  # (b, 2, N)
        if self.grid is not None:
            grid = self.grid(flat.contiguous(memory_format=torch.channels_last))  # (2b, N, C)
            out["grids"] = grid.view(b, 2, *grid.shape[1:]).half().cpu().numpy()
        return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="namc data precompute",
        description="VQGAN codes (and ResNet grids) of every pair of a packed corpus, beside its shards; resumable.",
    )
    add_config_arguments(parser)
    parser.add_argument("--shards", type=Path, required=True, help="folder of packed shards (namc data pack)")
    parser.add_argument("--model", default="namc_base", help="preset whose VQGAN / ResNet / image size to use")
    parser.add_argument(
        "--vqgan-weights",
        dest="vqgan_weights",
        type=Path,
        required=True,
        help="taming VQGAN checkpoint (last.ckpt of vqgan_imagenet_f16_16384 for namc_base)",
    )
    parser.add_argument("--grids", action="store_true", help="also the frozen ResNet grids (float16; large)")
    parser.add_argument(
        "--grid-weights",
        dest="grid_weights",
        type=Path,
        default=None,
        help="ImageNet ResNet-101 weights (torchvision or timm layout), with --grids",
    )
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=32, help="pairs per batch and device")
    parser.add_argument("--num-workers", dest="num_workers", type=int, default=4, help="decoding workers per device")
    parser.add_argument("--max-image-pixels", dest="max_image_pixels", type=pixel_cap_arg, default=MAX_IMAGE_PIXELS)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_trainer_arguments(parser)
    return parser


def _parts(args: argparse.Namespace) -> tuple[VQGANTokenizer, GridEncoder | None, dict[str, Any]]:
    c = model_config(args.model)
    for what, path in (("--vqgan-weights", args.vqgan_weights), ("--grid-weights", args.grid_weights)):
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"{what}: {path} not found; namc never downloads weights")
    if args.grids and args.grid_weights is None:
        raise FileNotFoundError("--grids needs --grid-weights (the ImageNet ResNet-101 the model is trained with)")
    if c.vqgan_n_embed > np.iinfo(np.int16).max + 1:
        raise ValueError(f"{c.vqgan_n_embed} codes do not fit int16")
    vqgan = VQGANTokenizer(c.vqgan_ddconfig, c.vqgan_n_embed, c.vqgan_embed_dim, args.vqgan_weights)
    grid = None
    if args.grids:
        grid = GridEncoder(c.grid_model, c.grid_out_index, args.grid_weights, frozen=True, model_kwargs=c.grid_kwargs)
    settings = {
        "image_size": c.image_size,
        "codes": {"weights": file_digest(args.vqgan_weights)["sha256"], "n_embed": c.vqgan_n_embed},
        "grids": {"weights": file_digest(args.grid_weights)["sha256"], "model": c.grid_model} if grid else None,
    }
    return vqgan, grid, settings


def _done(shard: Path, settings: dict[str, Any]) -> bool:
    """Whether the shard has targets of these settings, made from the shard as it is now."""
    path = targets_path(shard, "targets.json")
    if not path.is_file():
        return False
    try:
        meta = read_json(path, error=ValueError)
    except (OSError, ValueError):
        return False  # unreadable targets are made again
    if not isinstance(meta, dict):
        return False
    same = all(meta.get(k) == v for k, v in settings.items())
    return same and made_from(meta, shard_stamp(shard))


class PrecomputeJob:
    """What rank 0 does before the run (:meth:`pending`) and what a rank does with a finished shard (:meth:`finish`);
    plain data and methods, so that ``ddp_spawn`` can send it to its processes.

    Args:
        shards: the corpus's shards.
        settings: image size, weights digests, grids: recorded in ``targets.json``, compared on a rerun.
        n: codes per image; channels: grid channels (None: no grids).
    """

    def __init__(self, shards: list[Path], settings: dict[str, Any], n: int, channels: int | None) -> None:
        self.shards, self.settings, self.n, self.channels = shards, settings, n, channels

    def pending(self) -> list[int]:
        clean_temporaries(self.shards[0].parent)
        return [i for i, s in enumerate(self.shards) if not _done(s, self.settings)]

    def finish(self, index: int, parts: list[tuple[dict[str, Any], Any]]) -> None:
        shard = self.shards[index]
        keys = [k for meta, _ in parts for k in meta["keys"]]
        skipped = [s for meta, _ in parts for s in meta["skipped"]]
        preds = [p for _, p in parts if p]
        codes = np.concatenate([p["codes"] for p in preds]) if preds else np.zeros((0, 2, self.n), np.int16)
        atomic_save_npy(targets_path(shard, "codes.npy"), codes)  # (n, 2, N)
        if self.channels is not None:
            empty = np.zeros((0, 2, self.n, self.channels), np.float16)
            atomic_save_npy(
                targets_path(shard, "grids.npy"), np.concatenate([p["grids"] for p in preds]) if preds else empty
            )
        meta = {**self.settings, "keys": keys, "skipped": skipped, **shard_stamp(shard)}
        atomic_write_text(targets_path(shard, "targets.json"), json.dumps(meta, sort_keys=True) + "\n")  # last


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``namc data precompute``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_with_config(build_parser(), argv, "precompute")
    held = contextlib.ExitStack()
    try:
        shards = list_shards(args.shards)
        vqgan, grid, settings = _parts(args)
        if is_launching_process():  # one run per shard folder; the other ranks of this run write under its lock
            held.enter_context(output_lock(args.shards, shlex.join(["namc", "data", "precompute", *argv])))
    except (FileNotFoundError, ValueError, OSError, LockedError) as err:
        print(f"namc data precompute: error: {err}", file=sys.stderr)
        return 2
    with held:
        _precompute(args, shards, vqgan, grid, settings)
    return 0


def _precompute(
    args: argparse.Namespace, shards: list[Path], vqgan: VQGANTokenizer, grid: GridEncoder | None, settings: dict
) -> None:
    """Writes the targets of the pending shards and prints the totals (on rank 0)."""
    before = sum(_done(s, settings) for s in shards)
    n = vqgan.grid_size(settings["image_size"]) ** 2
    job = PrecomputeJob(shards, settings, n, grid.out_channels if grid is not None else None)
    source = PrecomputeSource(shards, settings["image_size"], args.batch_size, args.max_image_pixels)
    dm = ShardDataModule(source, job.pending, args.num_workers)
    trainer = make_trainer(args, ShardWriter(job.finish, "precomputing", progress=not args.quiet, unit="pair"))
    trainer.predict(PrecomputeModule(vqgan, grid), datamodule=dm, return_predictions=False)
    trainer.strategy.barrier()
    if trainer.global_rank == 0:
        done = [s for s in shards if _done(s, settings)]
        rows = skipped = 0
        for s in done:
            meta = read_json(targets_path(s, "targets.json"), error=ValueError)
            rows, skipped = rows + len(meta["keys"]), skipped + len(meta["skipped"])
        what = "codes and grids" if grid is not None else "codes"
        print(
            f"precomputed {what} of {rows} pairs in {args.shards}: {len(done)} of {len(shards)} shards complete "
            f"({before} were before this run); skipped {skipped}"
        )
