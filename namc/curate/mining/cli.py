"""``namc curate pairs``: features of ``namc curate embed`` -> ``WORKDIR/pairs.jsonl`` and ``pairs_summary.json``.

Reads ``WORKDIR/features/clip`` and ``WORKDIR/features/dino`` (:func:`namc.curate.features.load_features`), keeps
the images both encoders have (rows aligned by key, in the CLIP folder's order), mines the pairs of appendix D.1
(:func:`namc.curate.mining.pipeline.mine_pairs`) and writes one line per pair::

    {"id": "mined-00000000", "source": "cc3m", "image1": REF, "image2": REF, "key1": ..., "key2": ...,
     "caption1"?: ..., "caption2"?: ..., "sim_clip": 0.91, "sim_dino": 0.83, "cluster": 0}

References and captions come from ``images.jsonl`` (the one ``meta.json`` names, or ``WORKDIR/images.jsonl``),
rewritten relative to the output's folder. A pair whose key has no line there is dropped and counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.features import FeaturesError, load_features, read_meta
from namc.curate.mining.candidates import Thresholds
from namc.curate.mining.pipeline import MiningConfig, Pair, mine_pairs
from namc.data.refs import rebase_ref
from namc.jsonl import JSONError, json_line, loads
from namc.locks import LockedError, output_lock

__all__ = ["build_parser", "main", "write_pairs"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="namc curate pairs",
        description="Mine similar image pairs from CLIP and DINOv2 features (NAMC appendix D.1).",
    )
    add_config_arguments(p)
    p.add_argument("--workdir", type=Path, required=True, help="the pipeline's folder (top-level 'workdir')")
    p.add_argument("--clip", type=Path, default=None, help="CLIP features folder (default WORKDIR/features/clip)")
    p.add_argument("--dino", type=Path, default=None, help="DINOv2 features folder (default WORKDIR/features/dino)")
    p.add_argument("--images", type=Path, default=None, help="images.jsonl (default: meta.json's, else WORKDIR's)")
    p.add_argument("--out", type=Path, default=None, help="pairs JSONL (default WORKDIR/pairs.jsonl)")
    p.add_argument("--k", type=int, default=10, help="top-k neighbours per feature (Eq. 5; not in the paper)")
    t = Thresholds()
    for name, help_ in (
        ("tau_max", "band: drop neighbours above (near-identical), D.1.4"),
        ("tau_min", "band: drop neighbours below (dissimilar), D.1.4"),
        ("tau_max_clip", "drop a CLIP set whose max is below"),
        ("tau_min_clip", "drop a CLIP set whose min is below"),
        ("tau_max_dino", "drop a DINOv2 set whose max is below"),
        ("tau_min_dino", "drop a DINOv2 set whose min is below"),
    ):
        p.add_argument(f"--{name}", type=float, default=getattr(t, name), help=f"{help_} (default %(default)s)")
    p.add_argument(
        "--set_test",
        choices=("topk", "band"),
        default="topk",
        help="which set the per-feature max/min test looks at: the retrieved top-k (default) or the band-filtered set",
    )
    p.add_argument("--n_clusters", type=int, default=3, help="K of the spectral clustering (D.1.4)")
    p.add_argument("--gamma", type=float, default=0.1, help="RBF affinity gamma (D.1.4)")
    p.add_argument("--alpha", type=float, default=0.4, help="weight of CLIP in g(I) (Eq. 8, D.1.4)")
    p.add_argument("--beta", type=float, default=0.6, help="weight of DINOv2 in g(I) (Eq. 8, D.1.4)")
    p.add_argument("--seed", type=int, default=0, help="seeds the clustering and the IVF training sample")
    p.add_argument("--index", choices=("auto", "exact", "ivf"), default="auto", help="faiss index (auto: by size)")
    p.add_argument("--nlist", type=int, default=None, help="IVF cells (default 4 sqrt(N))")
    p.add_argument("--nprobe", type=int, default=MiningConfig.nprobe, help="IVF cells searched per query")
    p.add_argument("--gpu", choices=("auto", "yes", "no"), default="auto", help="faiss on GPUs (auto: if any)")
    p.add_argument("--imgdiff_filter", action="store_true", help="keep pairs whose CLIP similarity is in the range")
    p.add_argument("--imgdiff_range", type=float, nargs=2, default=[0.9, 0.98], help="Img-Diff's range (seed 002)")
    p.add_argument("--workers", type=int, default=1, help="processes for the clustering")
    p.add_argument(
        "--assign_labels",
        choices=("kmeans", "cluster_qr"),
        default="kmeans",
        help="spectral clustering's label step: kmeans (sklearn's default) or cluster_qr (about 3x faster)",
    )
    p.add_argument("--allow_missing_shards", action="store_true", help="mine the complete shards only")
    p.add_argument("--no_progress", action="store_true", help="no progress bars")
    return p


def _aligned(clip_dir: Path, dino_dir: Path, allow_missing: bool) -> tuple[list[str], np.ndarray, np.ndarray, int]:
    keys_c, clip = load_features(clip_dir, allow_missing=allow_missing)
    keys_d, dino = load_features(dino_dir, allow_missing=allow_missing)
    if keys_c == keys_d:
        return keys_c, clip, dino, 0
    pos_d = {k: j for j, k in enumerate(keys_d)}
    rows_c = [i for i, k in enumerate(keys_c) if k in pos_d]
    rows_d = [pos_d[keys_c[i]] for i in rows_c]
    dropped = len(keys_c) + len(keys_d) - 2 * len(rows_c)
    return [keys_c[i] for i in rows_c], clip[rows_c], dino[rows_d], dropped


def _image_lines(images: Path, wanted: set[str]) -> tuple[dict[str, dict[str, Any]], int]:
    """The images.jsonl lines of the ``wanted`` keys (streamed), and how many lines were malformed."""
    found: dict[str, dict[str, Any]] = {}
    bad = 0
    with open(images, "rb") as f:
        for raw in f:
            try:
                obj = loads(raw)  # bounded (depth, length, duplicate keys); a byte-order mark is dropped
                key, image = obj["key"], obj["image"]
                if not isinstance(key, str) or not isinstance(image, str) or not image.strip():
                    raise TypeError("a line needs a string 'key' and a non-empty string 'image'")
            except (JSONError, KeyError, TypeError):
                bad += 1
                continue
            if key in wanted and key not in found:
                found[key] = obj
    return found, bad


def write_pairs(pairs: list[Pair], keys: list[str], images: Path, out: Path) -> tuple[int, dict[str, int]]:
    """Writes the pairs JSONL (``.partial`` then renamed); returns (lines written, counts of dropped pairs)."""
    wanted = {keys[r] for p in pairs for r in (p.row1, p.row2)}
    lines, bad = _image_lines(images, wanted)
    dropped = {"pairs_without_image_line": 0, "malformed_image_lines": bad}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    n = 0
    with open(partial, "w", encoding="utf-8") as f:
        for p in pairs:
            k1, k2 = keys[p.row1], keys[p.row2]
            a, b = lines.get(k1), lines.get(k2)
            if a is None or b is None:
                dropped["pairs_without_image_line"] += 1
                continue
            s1, s2 = str(a.get("source", "")), str(b.get("source", ""))
            line: dict[str, Any] = {
                "id": f"mined-{n:08d}",
                "source": s1 if s1 == s2 else f"{s1}+{s2}",
                "image1": rebase_ref(a["image"], images.parent, out.parent),
                "image2": rebase_ref(b["image"], images.parent, out.parent),
                "key1": k1,
                "key2": k2,
            }
            for name, src in (("caption1", a), ("caption2", b)):
                if src.get("caption"):
                    line[name] = src["caption"]
            line.update(sim_clip=round(p.sim_clip, 4), sim_dino=round(p.sim_dino, 4), cluster=p.cluster)
            f.write(json_line(line))
            n += 1
    os.replace(partial, out)
    return n, dropped


def main(argv: Sequence[str] | None = None) -> int:
    held = contextlib.ExitStack()
    try:
        args = parse_with_config(build_parser(), argv, "pairs")
        work: Path = args.workdir
        clip_dir = args.clip or work / "features" / "clip"
        dino_dir = args.dino or work / "features" / "dino"
        images = args.images
        if images is None:
            named = read_meta(clip_dir).get("images")
            images = Path(named) if named and Path(named).is_file() else work / "images.jsonl"
        if not images.is_file():
            raise FileNotFoundError(f"{images}: images.jsonl not found (run `namc curate index` first)")
        out = args.out or work / "pairs.jsonl"
        thresholds = Thresholds(
            args.tau_max,
            args.tau_min,
            args.tau_max_clip,
            args.tau_min_clip,
            args.tau_max_dino,
            args.tau_min_dino,
            args.set_test,
        )
        cfg = MiningConfig(
            k=args.k,
            thresholds=thresholds,
            n_clusters=args.n_clusters,
            gamma=args.gamma,
            alpha=args.alpha,
            beta=args.beta,
            seed=args.seed,
            index=args.index,
            nlist=args.nlist,
            nprobe=args.nprobe,
            use_gpu={"auto": None, "yes": True, "no": False}[args.gpu],
            imgdiff=tuple(args.imgdiff_range) if args.imgdiff_filter else None,
            workers=args.workers,
            assign_labels=args.assign_labels,
        )
        held.enter_context(output_lock(out.parent, "namc curate pairs"))  # one run writes a folder's pairs at a time
        t0 = time.perf_counter()
        keys, clip, dino, unaligned = _aligned(clip_dir, dino_dir, args.allow_missing_shards)
        load_s = time.perf_counter() - t0
        result = mine_pairs(clip, dino, cfg, progress=not args.no_progress)
        t0 = time.perf_counter()
        n, dropped = write_pairs(result.pairs, keys, images, out)
        summary = dict(result.summary)
        summary["seconds"] = {
            "load": round(load_s, 3),
            **summary["seconds"],
            "write": round(time.perf_counter() - t0, 3),
        }
        summary.update(pairs_written=n, keys_in_one_encoder_only=unaligned, out=str(out), **dropped)
        summary_path = out.with_name("pairs_summary.json")
        summary_path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    except (FeaturesError, FileNotFoundError, ValueError, LockedError) as err:
        print(f"namc curate pairs: {err}", file=sys.stderr)
        return 1
    finally:
        held.close()
    print(
        f"{summary['images']} images, {summary['images_with_candidates']} with candidates "
        f"({summary['candidates']} candidates), {n} pairs -> {out} (summary: {summary_path})"
    )
    return 0
