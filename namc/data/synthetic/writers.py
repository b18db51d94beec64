"""Writing the shapes world to disk: a CLEVR-Change-layout benchmark and a pre-training corpus.

- :func:`generate_benchmark` writes the CLEVR-Change layout read by :class:`namc.data.idc.ClevrChange`::

      images/CLEVR_default_%06d.png  sc_images/CLEVR_semantic_%06d.png  nsc_images/CLEVR_nonsemantic_%06d.png
      splits.json  change_captions.json  no_change_captions.json  type_mapping.json
      scenes.json   (ours: the objects of each scene, for inspection and tests)

  with several CLEVR-Change-style paraphrases per pair (``"the small red metal cube changed to blue"``, ``"the
  large cyan rubber sphere has been newly placed"``, ``"no change was made"``, ...).
- :func:`generate_corpus` writes a pre-training corpus (``manifest.jsonl``, ``images/%07d_1.png``,
  ``images/%07d_2.png``, ``meta.json``) of implicit-change descriptions in the paper's template (section 3.1.2),
  one per pair, naming the changed object and its context, e.g. ``"The difference between the two images is that
  the first image shows a small red metal cube left of a large gray rubber sphere, while the second image shows a
  small blue metal cube left of a large gray rubber sphere."``, with injected noise phrases and word-level labels
  (:mod:`namc.data.synthetic.noise`), and its free-text twin ``conventional.jsonl`` (the same pairs described in one
  short sentence, ``"The small red metal cube changed to blue."``: appendix B.2's conventional corpus, Table 11).

Pairs are split into chunks run by a process pool; every pair derives from ``(seed, stream, index)`` through its
own ``random.Random``, so its bytes depend neither on the number of worker processes nor on the chunk size.
``progress=True`` shows a tqdm bar (on stderr) over the pairs written.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from PIL import Image
from tqdm.auto import tqdm

from namc.data.synthetic.language import change_captions, conventional_description, no_change_captions
from namc.data.synthetic.noise import corpus_record
from namc.data.synthetic.render import render_scene
from namc.data.synthetic.scene import CHANGE_TYPES, MAX_OBJECTS, MIN_OBJECTS, check_object_range, make_pair

__all__ = ["CONVENTIONAL_MANIFEST", "generate_benchmark", "generate_corpus"]

logger = logging.getLogger(__name__)

#: The corpus's free-text twin of ``manifest.jsonl`` (appendix B.2, Table 11): the same pairs and images.
CONVENTIONAL_MANIFEST = "conventional.jsonl"

# The most pairs one job renders: small enough that a progress bar moves every second or so on one core.
_MAX_CHUNK = 64


def _benchmark_job(args: tuple[int, int, Path, int, int, int, tuple[int, int]]) -> list[dict[str, Any]]:
    seed, image_size, out, n_captions, min_objects, max_objects, (start, stop) = args
    results = []
    for i in range(start, stop):
        pair = make_pair(seed, i, "benchmark", min_objects=min_objects, max_objects=max_objects)
        _save(render_scene(pair.before, image_size), out / "images" / f"CLEVR_default_{i:06d}.png")
        _save(render_scene(pair.after, image_size, pair.view_after), out / "sc_images" / f"CLEVR_semantic_{i:06d}.png")
        _save(
            render_scene(pair.before, image_size, pair.view_distractor),
            out / "nsc_images" / f"CLEVR_nonsemantic_{i:06d}.png",
        )
        rng = random.Random(f"{seed}-captions-{i}")
        results.append(
            {
                "index": i,
                "type": pair.change_type,
                "change": change_captions(pair, rng, n_captions),
                "no_change": no_change_captions(rng, n_captions),
                "scene": {
                    "before": [asdict(o) for o in pair.before],
                    "after": [asdict(o) for o in pair.after],
                    "changed": asdict(pair.changed) if pair.changed else None,
                    "changed_after": asdict(pair.changed_after) if pair.changed_after else None,
                    "view_after": asdict(pair.view_after),
                    "view_distractor": asdict(pair.view_distractor),
                },
            }
        )
    return results


def _run_jobs(fn: Any, jobs: list[Any], workers: int, bar: tqdm) -> list[Any]:
    """Every job's results, in job order; ``bar`` advances by the results of each finished job."""
    results: list[Any] = []
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            rs = fn(job)
            results += rs
            bar.update(len(rs))
        return results
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for rs in pool.map(fn, jobs):
            results += rs
            bar.update(len(rs))
    return results


def _chunks(n: int, workers: int) -> list[tuple[int, int]]:
    size = max(1, min(_MAX_CHUNK, math.ceil(n / max(1, workers * 4))))
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def _bar(total: int, what: str, progress: bool) -> tqdm:
    """A tqdm bar over ``total`` pairs on stderr (disabled unless ``progress``)."""
    return tqdm(total=total, desc=what, unit="pair", disable=not progress, dynamic_ncols=True)


def generate_benchmark(
    out_dir: str | Path,
    n_pairs: int,
    image_size: int = 64,
    seed: int = 0,
    n_captions: int = 3,
    splits: Sequence[float] = (0.8, 0.1, 0.1),
    workers: int = 1,
    min_objects: int = MIN_OBJECTS,
    max_objects: int = MAX_OBJECTS,
    progress: bool = False,
) -> dict[str, Any]:
    """Writes a shapes-world benchmark in the CLEVR-Change layout (see the module docstring).

    Args:
        out_dir: output folder (created).
        n_pairs: number of before images; each gives one change pair and one distractor pair.
        image_size: side of the square PNGs.
        seed: global seed (same seed, same bytes).
        n_captions: paraphrases per change pair and per distractor pair.
        splits: train/val/test fractions of the pair ids (a seeded permutation; each list sorted).
        workers: processes (1: in this process; the output does not depend on it).
        min_objects: fewest objects in an image.
        max_objects: most objects in an image.
        progress: show a progress bar over the pairs written (stderr).

    Returns:
        A summary: ``{"root", "pairs", "splits": {name: count}, "types": {type: count}}``.
    """
    if len(splits) != 3 or abs(sum(splits) - 1) > 1e-6 or min(splits) < 0:
        raise ValueError("splits must be three non-negative fractions summing to 1")
    check_object_range(min_objects, max_objects)
    out = Path(out_dir)
    for sub in ("images", "sc_images", "nsc_images"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    jobs = [(seed, image_size, out, n_captions, min_objects, max_objects, c) for c in _chunks(n_pairs, workers)]
    with _bar(n_pairs, f"writing {out.name}", progress) as bar:
        results = sorted(_run_jobs(_benchmark_job, jobs, workers, bar), key=lambda r: r["index"])

    order = list(range(n_pairs))
    random.Random(f"{seed}-splits").shuffle(order)
    n_train = round(splits[0] * n_pairs)
    n_val = round(splits[1] * n_pairs)
    split_ids = {
        "train": sorted(order[:n_train]),
        "val": sorted(order[n_train : n_train + n_val]),
        "test": sorted(order[n_train + n_val :]),
    }
    name = "CLEVR_default_{:06d}.png".format
    types: dict[str, list[str]] = {t: [] for t in CHANGE_TYPES}
    for r in results:
        types[r["type"]].append(f"{r['index']:06d}.png")
    _write_json(out / "splits.json", split_ids)
    _write_json(out / "change_captions.json", {name(r["index"]): r["change"] for r in results})
    _write_json(out / "no_change_captions.json", {name(r["index"]): r["no_change"] for r in results})
    _write_json(out / "type_mapping.json", types)
    _write_json(out / "scenes.json", {name(r["index"]): r["scene"] for r in results})
    summary = {
        "root": str(out),
        "pairs": n_pairs,
        "splits": {k: len(v) for k, v in split_ids.items()},
        "types": {k: len(v) for k, v in types.items()},
    }
    logger.info("shapes benchmark: %s", summary)
    return summary


def _corpus_job(args: tuple[int, int, Path, float, int, int, tuple[int, int]]) -> list[dict[str, Any]]:
    seed, image_size, out, noise_rate, min_objects, max_objects, (start, stop) = args
    results = []
    for i in range(start, stop):
        pair = make_pair(seed, i, "corpus", min_objects=min_objects, max_objects=max_objects)
        rel1, rel2 = f"images/{i:07d}_1.png", f"images/{i:07d}_2.png"
        _save(render_scene(pair.before, image_size), out / rel1)
        _save(render_scene(pair.after, image_size, pair.view_after), out / rel2)
        record, stats = corpus_record(pair, seed, noise_rate)
        conventional = conventional_description(pair, random.Random(f"{seed}-corpus-conventional-{i}"))
        results.append(
            {
                "index": i,
                "id": f"shapes-{i:07d}",
                "source": "shapes",
                "image1": rel1,
                "image2": rel2,
                **record,
                "stats": stats,
                "conventional": conventional,
            }
        )
    return results


def generate_corpus(
    out_dir: str | Path,
    n_pairs: int,
    image_size: int = 64,
    seed: int = 0,
    noise_rate: float = 0.2,
    workers: int = 1,
    min_objects: int = MIN_OBJECTS,
    max_objects: int = MAX_OBJECTS,
    progress: bool = False,
) -> dict[str, Any]:
    """Writes a shapes-world pre-training corpus: ``manifest.jsonl``, ``conventional.jsonl``, ``images/``,
    ``meta.json``.

    Each manifest line holds ``id, source="shapes", image1, image2, description, verb1, desc1, verb2, desc2,
    noise1, noise2, change_type`` (the schema of :mod:`namc.data.corpus.records`, plus the change type).
    ``conventional.jsonl`` (:data:`CONVENTIONAL_MANIFEST`) holds the same pairs with a free-text description each
    (``free_text: true``, :func:`~namc.data.synthetic.language.conventional_description`, no injected noise): the
    corpus of appendix B.2's conventional prompt, for Table 11.

    Args:
        out_dir: output folder (created).
        n_pairs: number of pairs.
        image_size: side of the square PNGs.
        seed: global seed (same seed, same bytes).
        noise_rate: expected fraction of phrases that are injected noise, in [0, 0.5] (each real phrase is followed
            by a noise phrase with probability ``noise_rate / (1 - noise_rate)``).
        workers: processes (the output does not depend on it).
        min_objects: fewest objects in an image.
        max_objects: most objects in an image.
        progress: show a progress bar over the pairs written (stderr).

    Returns:
        The contents of ``meta.json``: counts and the realised phrase- and word-level noise fractions.
    """
    if not 0.0 <= noise_rate <= 0.5:
        raise ValueError("noise_rate must be in [0, 0.5]")
    check_object_range(min_objects, max_objects)
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    jobs = [(seed, image_size, out, noise_rate, min_objects, max_objects, c) for c in _chunks(n_pairs, workers)]
    with _bar(n_pairs, f"writing {out.name}", progress) as bar:
        results = sorted(_run_jobs(_corpus_job, jobs, workers, bar), key=lambda r: r["index"])
    totals = {"phrases": 0, "noise_phrases": 0, "words": 0, "noise_words": 0}
    kinds: dict[str, int] = {}
    manifest, conventional_manifest = out / "manifest.jsonl", out / CONVENTIONAL_MANIFEST
    with open(manifest, "w", encoding="utf-8") as f, open(conventional_manifest, "w", encoding="utf-8") as g:
        for r in results:
            stats = r.pop("stats")
            conventional = r.pop("conventional")
            r.pop("index")
            for k in totals:
                totals[k] += stats[k]
            for k, v in stats["kinds"].items():
                kinds[k] = kinds.get(k, 0) + v
            f.write(json.dumps(r) + "\n")
            free = {k: r[k] for k in ("id", "source", "image1", "image2")}
            g.write(
                json.dumps({**free, "free_text": True, "description": conventional, "change_type": r["change_type"]})
            )
            g.write("\n")
    meta = {
        "pairs": n_pairs,
        "image_size": image_size,
        "seed": seed,
        "noise_rate": noise_rate,
        **totals,
        "noise_kinds": kinds,
        "phrase_noise_fraction": totals["noise_phrases"] / totals["phrases"] if totals["phrases"] else 0.0,
        "word_noise_fraction": totals["noise_words"] / totals["words"] if totals["words"] else 0.0,
    }
    _write_json(out / "meta.json", meta)
    logger.info("shapes corpus: %d pairs, realised phrase noise %.3f", n_pairs, meta["phrase_noise_fraction"])
    return meta


def _save(img: Image.Image, path: Path) -> None:
    img.save(path, format="PNG", compress_level=1)  # fast zlib level; still lossless and deterministic


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=None, separators=(",", ":")))
