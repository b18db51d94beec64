"""``namc curate embed``: CLIP ViT-L/14 and DINOv2 ViT-L/14 features of every image of ``images.jsonl`` (appendix
D.1, Eq. 3), as the float16 shards of :mod:`namc.curate.features`, through Lightning ``Trainer.predict``.

::

    namc curate embed --config configs/curate/pipeline.yaml                      # the embed section of the YAML
    namc curate embed --workdir work --clip_weights clip.safetensors --dino_weights dino.safetensors \\
        --trainer.devices 8 --trainer.num_nodes 2

Every image is decoded once and preprocessed for both encoders (:mod:`namc.curate.encoders`); the features are
L2-normalised in float32 and stored as float16. The run is cut into shards of ``shard_size`` lines of
``images.jsonl`` (:mod:`namc.lit.shardwise`): pending shards are dealt to all ranks (``--trainer.devices``,
``--trainer.num_nodes``), each shard is written atomically when its last batch is in, finished shards are skipped on
a rerun, and a batch never spans two shards, so the features are the same bytes whether one process or many ran
them, and whether the run was killed and resumed or not. Lines whose image cannot be used are skipped and written,
with the reason, to the shard's ``skipped.jsonl``: a malformed line (``malformed_line``), a key an earlier line
already took (``duplicate_id``), an image that cannot be read (``missing_image``), decoded (``corrupt_image``:
corrupt, truncated, not an image) or is over the pixel cap (``oversized_image``). Grey, palette, alpha and 16-bit
images are converted to RGB by namc's one rule (:func:`namc.data.transforms.to_rgb`), not skipped. Blank lines are
ignored.

Options come from argparse with :func:`namc.curate.config.parse_with_config` (section ``embed`` of the pipeline
YAML), not LightningCLI: every curation step reads the same flat YAML (``workdir`` shared, one section per step),
which LightningCLI's ``class_path``/``init_args`` layout would break; the Trainer's few options keep LightningCLI's
names (``--trainer.devices``, also ``trainer.devices:`` in the YAML).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.encoders import TINY_CLIP_CONFIG, TINY_DINO_KWARGS, ImageEncoder, build_clip, build_dino
from namc.curate.features import FeaturesError, check_meta, shard_path, tally, write_meta, write_shard
from namc.data.corpus.records import IMAGE_ERRORS
from namc.data.issues import IssueKind
from namc.data.refs import read_ref
from namc.data.transforms import MAX_IMAGE_PIXELS, ImageTooLargeError, open_image, pixel_cap_arg, to_rgb
from namc.jsonl import JSONError, loads
from namc.lit.shardwise import (
    ShardDataModule,
    ShardWriter,
    add_trainer_arguments,
    clean_temporaries,
    make_trainer,
)
from namc.locks import LockedError, is_launching_process, output_lock

__all__ = ["EmbedJob", "EmbedModule", "EmbedSource", "ImageLines", "build_parser", "main", "scan_images"]

logger = logging.getLogger(__name__)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # PIL names a BytesIO by its address: drop it, so reruns match


@dataclass
class ImageLines:
    """Where each shard of ``images.jsonl`` starts, and which lines reuse an earlier line's key.

    Attributes:
        path: the file.
        shard_size: lines per shard.
        n_lines: physical lines (the last shard may be short).
        n_images: non-blank lines.
        offsets: byte offset of each shard's first line.
        duplicates: ``{line number: line number of the first line with the same key}``.
    """

    path: Path
    shard_size: int
    n_lines: int = 0
    n_images: int = 0
    offsets: list[int] = field(default_factory=list)
    duplicates: dict[int, int] = field(default_factory=dict)

    @property
    def n_shards(self) -> int:
        return math.ceil(self.n_lines / self.shard_size)


def _key_of(raw: bytes) -> str | None:
    try:
        obj = loads(raw)
    except JSONError:
        return None  # the line is skipped and counted when its shard is embedded
    key = obj.get("key") if isinstance(obj, dict) else None
    return key if isinstance(key, str) and key else None


def scan_images(path: str | Path, shard_size: int) -> ImageLines:
    """One pass over ``images.jsonl``: line count, shard offsets and duplicate keys (the first line owns a key)."""
    if shard_size <= 0:
        raise ValueError(f"shard_size must be positive, got {shard_size}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no images.jsonl; write it with `namc curate index`")
    out = ImageLines(path, shard_size)
    first: dict[str, int] = {}
    offset = 0
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if (line_no - 1) % shard_size == 0:
                out.offsets.append(offset)
            offset += len(raw)
            out.n_lines = line_no
            if not raw.strip():
                continue
            out.n_images += 1
            key = _key_of(raw)
            if key is not None:
                if key in first:
                    out.duplicates[line_no] = first[key]
                else:
                    first[key] = line_no
    return out


class _Skip(Exception):
    """A line that gives no image: the record written to the shard's ``skipped.jsonl``."""

    def __init__(self, reason: IssueKind, error: str) -> None:
        super().__init__(error)
        self.reason = reason
        self.key: str | None = None
        self.image: str | None = None

    def record(self, where: str) -> dict[str, Any]:
        error = f"{where}: " + _ADDRESS.sub("", str(self))
        return {"key": self.key, "image": self.image, "reason": self.reason.value, "error": error}


class EmbedSource:
    """The batches of one shard of ``images.jsonl``: decoded once, preprocessed for every encoder.

    Args:
        lines: the scanned file.
        transforms: encoder name -> its eval transform (RGB PIL image -> (3, S, S)).
        batch_size: images per batch.
        max_image_pixels: the pixel cap (None: none).
    """

    def __init__(
        self, lines: ImageLines, transforms: dict[str, Any], batch_size: int, max_image_pixels: int | None
    ) -> None:
        self.index = lines
        self.transforms = transforms
        self.batch_size = batch_size
        self.max_image_pixels = max_image_pixels

    def lines(self, shard: int) -> int:
        start = shard * self.index.shard_size
        return min(self.index.shard_size, self.index.n_lines - start)

    def _line(self, line_no: int, raw: bytes) -> tuple[str, dict[str, torch.Tensor]]:
        key = image = None
        try:
            try:
                obj = loads(raw.decode("utf-8-sig" if line_no == 1 else "utf-8"))
            except UnicodeDecodeError as err:
                raise _Skip(IssueKind.MALFORMED_LINE, f"not UTF-8: byte 0x{raw[err.start]:02x}") from None
            except JSONError as err:  # invalid, too deep, too long, or a key given twice
                raise _Skip(IssueKind.MALFORMED_LINE, str(err)) from None
            if not isinstance(obj, dict):
                raise _Skip(IssueKind.MALFORMED_LINE, f"expected a JSON object, got {type(obj).__name__}")
            key, image = obj.get("key"), obj.get("image")
            for name, value in (("key", key), ("image", image)):
                if not isinstance(value, str) or not value:
                    raise _Skip(IssueKind.MALFORMED_LINE, f"missing or empty string field {name!r}")
            if line_no in self.index.duplicates:
                first = self.index.duplicates[line_no]
                raise _Skip(IssueKind.DUPLICATE_ID, f"key {key!r} is taken by line {first}")
            try:
                data = read_ref(image, self.index.path.parent)
            except (FileNotFoundError, IsADirectoryError, KeyError) as err:
                raise _Skip(IssueKind.MISSING_IMAGE, str(err).strip("'\"")) from None
            except (OSError, ValueError) as err:
                raise _Skip(IssueKind.CORRUPT_IMAGE, str(err)) from None
            try:
                rgb = to_rgb(open_image(data, self.max_image_pixels))
            except ImageTooLargeError as err:
                raise _Skip(IssueKind.OVERSIZED_IMAGE, str(err)) from None
            except IMAGE_ERRORS as err:
                raise _Skip(IssueKind.CORRUPT_IMAGE, f"{type(err).__name__}: {err}") from None
        except _Skip as skip:
            skip.key = key if isinstance(key, str) else None
            skip.image = image if isinstance(image, str) else None
            raise
        return key, {name: t(rgb) for name, t in self.transforms.items()}

    def batches(self, shard: int) -> Iterator[dict[str, Any]]:
        size = self.index.shard_size
        first, last = shard * size + 1, min((shard + 1) * size, self.index.n_lines)
        keys: list[str] = []
        skipped: list[dict[str, Any]] = []
        inputs: dict[str, list[torch.Tensor]] = {name: [] for name in self.transforms}
        consumed = 0
        with open(self.index.path, "rb") as f:
            f.seek(self.index.offsets[shard])
            for line_no in range(first, last + 1):
                raw = f.readline()
                consumed += 1
                if not raw.strip():
                    continue
                try:
                    key, tensors = self._line(line_no, raw)
                except _Skip as skip:
                    skipped.append(skip.record(f"{self.index.path.name} line {line_no}"))
                    continue
                keys.append(key)
                for name, t in tensors.items():
                    inputs[name].append(t)
                if len(keys) == self.batch_size and line_no < last:
                    yield self._batch(shard, False, consumed, keys, skipped, inputs)
                    keys, skipped, inputs, consumed = [], [], {name: [] for name in self.transforms}, 0
        yield self._batch(shard, True, consumed, keys, skipped, inputs)

    @staticmethod
    def _batch(
        shard: int, last: bool, consumed: int, keys: list[str], skipped: list[dict], inputs: dict[str, list]
    ) -> dict[str, Any]:
        return {
            "shard": shard,
            "last": last,
            "n_lines": consumed,
            "keys": keys,
            "skipped": skipped,
            "inputs": {name: torch.stack(ts) if ts else torch.zeros(0) for name, ts in inputs.items()},
        }


class EmbedModule(pl.LightningModule):
    """The frozen encoders; ``predict_step`` returns ``{name: (n, dim) float16 L2-normalised features}``."""

    def __init__(self, encoders: Sequence[ImageEncoder]) -> None:
        super().__init__()
        self.encoders = nn.ModuleDict({e.name: e.model for e in encoders})
        self.dims = {e.name: e.dim for e in encoders}

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, np.ndarray]:
        out = {}
        for name, model in self.encoders.items():
            x = batch["inputs"][name]  # (n, 3, S, S)
            if x.shape[0] == 0:
                out[name] = np.zeros((0, self.dims[name]), np.float16)
                continue
            f = F.normalize(model(x).float(), dim=-1)  # (n, dim), normalised in float32
            out[name] = f.half().cpu().numpy()
        return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="namc curate embed",
        description="CLIP ViT-L/14 and DINOv2 ViT-L/14 features of images.jsonl as float16 .npy shards (appendix "
        "D.1), through Lightning predict over all devices; resumable.",
    )
    add_config_arguments(parser)
    parser.add_argument("--workdir", type=Path, default=Path("."), help="the pipeline's work folder")
    parser.add_argument("--images", type=Path, default=None, help="image index (default WORKDIR/images.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="features root (default WORKDIR/features)")
    parser.add_argument("--models", nargs="+", choices=("clip", "dino"), default=["clip", "dino"])
    parser.add_argument("--clip_weights", type=Path, default=None, help="open_clip-layout CLIP ViT-L/14 weights")
    parser.add_argument("--dino_weights", type=Path, default=None, help="timm DINOv2 ViT-L/14 model.safetensors")
    parser.add_argument("--clip_model", default="ViT-L-14", help="open_clip config of the CLIP weights")
    parser.add_argument(
        "--clip_tag",
        default="openai",
        help="open_clip pretrained tag of the CLIP weights: openai "
        "(timm/vit_large_patch14_clip_224.openai), laion2b_s32b_b82k, ...; sets QuickGELU and the normalisation",
    )
    parser.add_argument("--dino_image_size", type=int, default=224, help="DINOv2 input side (multiple of 14)")
    parser.add_argument(
        "--arch",
        choices=("large", "tiny"),
        default="large",
        help="large: the paper's ViT-L/14s; tiny: the same architectures at tiny widths (tests, smoke runs)",
    )
    parser.add_argument("--shard_size", type=int, default=10000, help="images.jsonl lines per shard")
    parser.add_argument("--batch_size", type=int, default=64, help="images per batch and device")
    parser.add_argument("--num_workers", type=int, default=4, help="image decoding workers per device")
    parser.add_argument("--max_image_pixels", type=pixel_cap_arg, default=MAX_IMAGE_PIXELS, help="0: no cap")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_trainer_arguments(parser)
    return parser


def _encoders(args: argparse.Namespace) -> list[ImageEncoder]:
    tiny = args.arch == "tiny"
    out = []
    for name in args.models:
        weights = getattr(args, f"{name}_weights")
        if weights is None:
            raise FileNotFoundError(f"--{name}_weights is required (or {name}_weights in the YAML's embed section)")
        if name == "clip":
            out.append(
                build_clip(weights, TINY_CLIP_CONFIG, None)
                if tiny
                else build_clip(weights, args.clip_model, args.clip_tag)
            )
        else:
            size = 56 if tiny else args.dino_image_size
            out.append(build_dino(weights, size, TINY_DINO_KWARGS if tiny else None))
    return out


class EmbedJob:
    """What rank 0 does before the run (:meth:`pending`) and what a rank does with a finished shard (:meth:`finish`);
    plain data and methods, so that ``ddp_spawn`` can send it to its processes."""

    def __init__(self, out: Path, names: Sequence[str], n_shards: int) -> None:
        self.out, self.names, self.n_shards = out, list(names), n_shards

    def complete(self, shard: int) -> bool:
        return all(shard_path(self.out / n, shard, ".npy").is_file() for n in self.names)

    def pending(self) -> list[int]:
        for name in self.names:
            clean_temporaries(self.out / name)
        return [i for i in range(self.n_shards) if not self.complete(i)]

    def finish(self, shard: int, parts: list[tuple[dict[str, Any], Any]]) -> None:
        keys = [k for meta, _ in parts for k in meta["keys"]]
        skipped = [s for meta, _ in parts for s in meta["skipped"]]
        for name in self.names:
            feats = np.concatenate([pred[name] for _, pred in parts])  # (n, dim)
            write_shard(self.out / name, shard, keys, feats, skipped)


def _summary(job: EmbedJob, complete_before: int) -> str:
    """Totals over every complete shard (whichever rank wrote it)."""
    rows, reasons = tally(job.out / job.names[0], [i for i in range(job.n_shards) if job.complete(i)])
    head = (
        f"embedded {rows} images ({', '.join(job.names)}) into {job.out}: "
        f"{sum(map(job.complete, range(job.n_shards)))} of {job.n_shards} shards complete ({complete_before} were "
        f"before this run); skipped {sum(reasons.values())}"
    )
    return head + (": " + ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) if reasons else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``namc curate embed``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_with_config(build_parser(), argv, "embed")
    images = args.images or args.workdir / "images.jsonl"
    out = args.out or args.workdir / "features"
    held = contextlib.ExitStack()
    try:
        lines = scan_images(images, args.shard_size)
        encoders = _encoders(args)
        if is_launching_process():  # one run per features folder; the other ranks of this run write under its lock
            held.enter_context(output_lock(out, shlex.join(["namc", "curate", "embed", *argv])))
    except (FileNotFoundError, ValueError, OSError, LockedError) as err:
        print(f"namc curate embed: error: {err}", file=sys.stderr)
        return 2
    with held:
        return _embed(args, images, out, lines, encoders)


def _embed(args: argparse.Namespace, images: Path, out: Path, lines: Any, encoders: list) -> int:
    """Embeds the pending shards of ``lines`` with every encoder into ``out``; prints the totals (on rank 0)."""
    names, where = [e.name for e in encoders], str(images.resolve())
    try:
        for e in encoders:  # every rank, before any shard is written: a folder of other settings stops the run here
            folder = out / e.name
            folder.mkdir(parents=True, exist_ok=True)
            meta = {
                "model": e.description,
                "dim": e.dim,
                "shard_size": lines.shard_size,
                "images": where,
                "n_images": lines.n_images,
                "n_shards": lines.n_shards,
            }
            if (folder / "meta.json").is_file():
                check_meta(folder, meta)
            else:
                write_meta(folder, meta)  # the same bytes from every rank, written atomically
    except FeaturesError as err:
        print(f"namc curate embed: error: {err}", file=sys.stderr)
        return 2
    job = EmbedJob(out, names, lines.n_shards)
    complete_before = sum(job.complete(i) for i in range(lines.n_shards))
    transforms = {e.name: e.transform for e in encoders}
    source = EmbedSource(lines, transforms, args.batch_size, args.max_image_pixels)
    dm = ShardDataModule(source, job.pending, args.num_workers)
    writer = ShardWriter(job.finish, "embedding", progress=not args.quiet)
    trainer = make_trainer(args, writer)
    trainer.predict(EmbedModule(encoders), datamodule=dm, return_predictions=False)
    trainer.strategy.barrier()  # every rank's shards are written
    if trainer.global_rank == 0:
        print(_summary(job, complete_before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
