"""``namc curate index``: the pipeline's sources -> ``WORKDIR/images.jsonl`` (single images to embed and mine) and
``WORKDIR/source_pairs.jsonl`` (pairs the sources already have), plus ``WORKDIR/index_summary.json``.

``images.jsonl``: one line per single image, ``{"key", "source", "image": REF, "caption"?}``; ``source_pairs.jsonl``:
one line per pair in the pairs format of ``namc curate pairs`` (``id`` = key, ``key1``/``key2`` = ``KEY/1``,
``KEY/2``, ``caption1``/``caption2``/``instruction``/``difference`` where the source has them). References
(:mod:`namc.data.refs`) are absolute, so the files can be moved.

Every image is read and fully decoded once (``--verify full``, the default; ``--verify none`` trusts the sources and
only lists them): a missing, empty, truncated, corrupt or oversized image is skipped and counted with its reason, a
key that an earlier item already took is skipped as ``duplicate_id``; images whose mode is not RGB (grey, CMYK,
RGBA, 16-bit) are kept, since every consumer converts them with :func:`namc.data.transforms.to_rgb`, and counted in
the summary's ``modes``. Both files are written to ``.partial`` and renamed when complete.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.sources import ImageItem, PairItem, SourceSpec, check_image, iter_source
from namc.data.issues import DataIssues, IssueKind, RecordError
from namc.data.transforms import MAX_IMAGE_PIXELS, pixel_cap_arg
from namc.jsonl import json_line
from namc.locks import LockedError, output_lock

__all__ = ["IMAGES_FILE", "SOURCE_PAIRS_FILE", "IndexReport", "build_index", "main", "pair_line"]

logger = logging.getLogger(__name__)

IMAGES_FILE = "images.jsonl"
SOURCE_PAIRS_FILE = "source_pairs.jsonl"
SUMMARY_FILE = "index_summary.json"


@dataclass
class IndexReport:
    """What :func:`build_index` wrote."""

    images: int = 0
    pairs: int = 0
    per_source: dict[str, int] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)  # non-RGB image modes kept (converted when read)
    issues: DataIssues = field(default_factory=lambda: DataIssues("index"))
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "images": self.images,
            "pairs": self.pairs,
            "per_source": self.per_source,
            "non_rgb_modes": self.modes,
            "skipped": self.issues.counts,
            "examples": self.issues.examples,
            "seconds": round(self.seconds, 2),
        }

    def summary(self) -> str:
        head = f"indexed {self.images} images and {self.pairs} pairs in {self.seconds:.1f}s: " + ", ".join(
            f"{k}={v}" for k, v in self.per_source.items()
        )
        if self.modes:
            head += " (non-RGB, converted when read: " + ", ".join(f"{k}={v}" for k, v in self.modes.items()) + ")"
        return head + "\n" + self.issues.summary()


def pair_line(item: PairItem, source: str) -> dict[str, Any]:
    """A :class:`PairItem` as a pairs-JSONL line."""
    out: dict[str, Any] = {
        "id": item.key,
        "source": source,
        "image1": item.ref1,
        "image2": item.ref2,
        "key1": f"{item.key}/1",
        "key2": f"{item.key}/2",
    }
    for name in ("caption1", "caption2", "instruction", "difference"):
        value = getattr(item, name)
        if value:
            out[name] = value
    return out


def _check(item: ImageItem | PairItem, verify: str, max_pixels: int | None, report: IndexReport) -> bool:
    if verify == "none":
        return True
    checks = (
        [(item.ref, item.data)] if isinstance(item, ImageItem) else [(item.ref1, item.data1), (item.ref2, item.data2)]
    )
    modes = []
    for ref, data in checks:
        try:
            modes.append(check_image(ref, data, max_pixels))
        except RecordError as err:
            report.issues.add(err.kind, item.key, str(err))
            return False
    for mode in modes:
        if mode != "RGB":
            report.modes[mode or "?"] = report.modes.get(mode or "?", 0) + 1
    return True


def build_index(
    sources: Sequence[SourceSpec | dict[str, Any] | str],
    workdir: str | Path,
    verify: str = "full",
    max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    progress: bool = True,
) -> IndexReport:
    """Reads every source and writes ``images.jsonl``, ``source_pairs.jsonl`` and ``index_summary.json``.

    Args:
        sources: source entries (:class:`SourceSpec`, YAML mappings or ``[NAME=]KIND:ROOT`` strings).
        workdir: output folder.
        verify: ``"full"`` decodes every image (bad ones skipped and counted), ``"none"`` only lists them.
        max_image_pixels: an image over this many pixels is skipped as ``oversized_image`` (None: no cap).
        progress: tqdm bars per source.

    Raises:
        LockedError: another run holds ``workdir`` (:func:`namc.locks.output_lock`).
    """
    if verify not in ("full", "none"):
        raise ValueError(f"verify must be 'full' or 'none', got {verify!r}")
    specs = [s if isinstance(s, SourceSpec) else SourceSpec.parse(s) for s in sources]
    if not specs:
        raise ValueError("no sources: name them under 'sources' in the pipeline YAML or with --sources KIND:ROOT")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"source names must be unique (they prefix the keys): {names}")
    out = Path(workdir)
    with output_lock(out, "namc curate index"):  # two runs into one folder would each replace the other's index
        report = _write_index(specs, out, verify, max_image_pixels, progress)
    logger.info(report.summary())
    return report


def _write_index(
    specs: list[SourceSpec], out: Path, verify: str, max_image_pixels: int | None, progress: bool
) -> IndexReport:
    """The work of :func:`build_index` on its (locked) folder."""
    from tqdm import tqdm

    report = IndexReport()
    start = time.perf_counter()
    seen: set[str] = set()
    paths = {name: out / name for name in (IMAGES_FILE, SOURCE_PAIRS_FILE)}
    partial = {name: p.with_name(p.name + ".partial") for name, p in paths.items()}
    with (
        open(partial[IMAGES_FILE], "w", encoding="utf-8") as fi,
        open(partial[SOURCE_PAIRS_FILE], "w", encoding="utf-8") as fp,
    ):
        for spec in specs:
            if spec.kind == "ip2p_parquet" and verify == "none":
                spec.options.setdefault("read_images", False)
            n = 0
            with tqdm(desc=f"index {spec.name} ({spec.kind})", unit="item", disable=not progress) as bar:
                for item in iter_source(spec, report.issues):
                    bar.update()
                    if item.key in seen:
                        report.issues.add(IssueKind.DUPLICATE_ID, item.key, f"key already taken (source {spec.name})")
                        continue
                    if not _check(item, verify, max_image_pixels, report):
                        continue
                    seen.add(item.key)
                    if isinstance(item, ImageItem):
                        line: dict[str, Any] = {"key": item.key, "source": spec.name, "image": item.ref}
                        if item.caption:
                            line["caption"] = item.caption
                        fi.write(json_line(line))
                        report.images += 1
                    else:
                        fp.write(json_line(pair_line(item, spec.name)))
                        report.pairs += 1
                    report.issues.add_ok()
                    n += 1
            report.per_source[spec.name] = n
    for name in paths:
        os.replace(partial[name], paths[name])
    report.seconds = time.perf_counter() - start
    (out / SUMMARY_FILE).write_text(json.dumps(report.to_json(), indent=1, ensure_ascii=False), encoding="utf-8")
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="namc curate index",
        description="List the sources' images (to mine) and pairs (ready) into WORKDIR/images.jsonl and "
        "WORKDIR/source_pairs.jsonl; bad images skipped and counted.",
    )
    add_config_arguments(parser)
    parser.add_argument("--workdir", type=Path, required=True, help="output folder (top-level 'workdir' of the YAML)")
    parser.add_argument(
        "--sources",
        nargs="*",
        default=[],
        help="sources as [NAME=]KIND:ROOT (the YAML's 'sources' list takes mappings with more keys)",
    )
    parser.add_argument("--verify", choices=("full", "none"), default="full", help="decode every image (default)")
    parser.add_argument(
        "--max_image_pixels", type=pixel_cap_arg, default=MAX_IMAGE_PIXELS, help="pixel cap per image (0: no cap)"
    )
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_with_config(build_parser(), argv, "index")
        report = build_index(args.sources, args.workdir, args.verify, args.max_image_pixels, not args.no_progress)
    except (ValueError, FileNotFoundError, LockedError) as err:
        print(f"namc curate index: {err}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0
