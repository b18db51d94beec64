"""InstructPix2Pix "clip-filtered-dataset" (Brooks et al. 2023): 313K generated before/after pairs, already pairs.

Two published forms, both read here:

- **Released folder** (``kind: ip2p_folder``, root = the unpacked ``clip-filtered-dataset``). Checked against
  ``timothybrooks/instruct-pix2pix``: ``dataset_creation/generate_img_dataset.py`` writes one folder per prompt,
  ``f"{i:07d}"``, holding ``prompt.json`` (the prompt line: ``{"input": caption before, "edit": instruction,
  "output": caption after}``), ``{seed}_0.jpg`` (before) and ``{seed}_1.jpg`` (after) for up to 4 seeds, and
  ``metadata.jsonl``; ``edit_dataset.py`` reads ``seeds.json`` = ``[[folder name, [seed, ...]], ...]`` at the root and
  opens ``prompt.json["edit"]``, ``{seed}_0.jpg``, ``{seed}_1.jpg``. Here ``seeds.json`` is used when present, else
  every ``*_0.jpg`` of every folder with a ``prompt.json`` (sorted). One pair per (folder, seed), key
  ``ip2p/<folder>/<seed>``.
- **Hub parquet** (``kind: ip2p_parquet``, root = a folder searched for ``*.parquet``, a glob, or one file). Checked
  against the dataset card of ``timbrooks/instructpix2pix-clip-filtered`` (``dataset_info.features``:
  ``original_prompt`` string, ``original_image`` image, ``edit_prompt`` string, ``edited_prompt`` string,
  ``edited_image`` image; 313,010 rows in ``data/train-000NN-of-00262-*.parquet``); an ``image`` cell is the
  Hugging Face struct ``{bytes, path}``. Rows are read with pyarrow in batches (``batch_rows``; never a whole file),
  images as references ``FILE.parquet::ROW::original_image`` / ``::edited_image``; key
  ``ip2p/<file stem>/<row>``.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from namc.curate.sources.base import PairItem, SourceSpec, register_source
from namc.data.issues import DataIssues, IssueKind
from namc.data.refs import parquet_ref
from namc.jsonl import JSONError, loads

__all__ = ["PARQUET_COLUMNS", "read_ip2p_folder", "read_ip2p_parquet"]

#: the Hub release's columns: (caption before, image before, instruction, caption after, image after)
PARQUET_COLUMNS = ("original_prompt", "original_image", "edit_prompt", "edited_prompt", "edited_image")


def _read_prompt(path: Path, issues: DataIssues) -> dict[str, str] | None:
    try:
        prompt = loads(path.read_bytes())
    except FileNotFoundError:
        issues.add(IssueKind.MALFORMED_LINE, str(path), "prompt.json missing")
        return None
    except (OSError, JSONError) as err:
        issues.add(IssueKind.MALFORMED_LINE, str(path), f"not a UTF-8 JSON file: {err}")
        return None
    if not isinstance(prompt, dict) or not all(isinstance(prompt.get(k), str) for k in ("input", "edit", "output")):
        issues.add(IssueKind.MALFORMED_LINE, str(path), "expected an object with string 'input', 'edit', 'output'")
        return None
    return prompt


def _folder_seeds(root: Path, issues: DataIssues) -> Iterator[tuple[str, list[str]]]:
    seeds_file = root / "seeds.json"
    if seeds_file.is_file():
        try:
            seeds = loads(seeds_file.read_bytes())
            entries = [(str(name), [str(s) for s in ss]) for name, ss in seeds]
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as err:
            raise ValueError(f"{seeds_file}: expected [[folder, [seed, ...]], ...]: {err}") from None
        yield from entries
        return
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if not (folder / "prompt.json").is_file():
            continue
        yield folder.name, sorted(p.name[: -len("_0.jpg")] for p in folder.glob("*_0.jpg"))


@register_source("ip2p_folder")
def read_ip2p_folder(spec: SourceSpec, issues: DataIssues) -> Iterator[PairItem]:
    """Pairs of the released folder layout (see the module docstring)."""
    root = Path(spec.root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root}: InstructPix2Pix folder not found; download clip-filtered-dataset as "
            "timothybrooks/instruct-pix2pix's README says (scripts/download_data.sh) and point 'root' at it"
        )
    for name, seeds in _folder_seeds(root, issues):
        folder = root / name
        prompt = _read_prompt(folder / "prompt.json", issues)
        if prompt is None:
            issues.add(IssueKind.MALFORMED_LINE, str(folder), f"{len(seeds)} pair(s) without a prompt", n=0)
            continue
        for seed in seeds:
            p0, p1 = folder / f"{seed}_0.jpg", folder / f"{seed}_1.jpg"
            missing = [p for p in (p0, p1) if not p.is_file()]
            if missing:
                issues.add(IssueKind.MISSING_IMAGE, str(missing[0]), f"pair {name}/{seed}")
                continue
            yield PairItem(
                key=f"{spec.name}/{name}/{seed}",
                ref1=str(p0.absolute()),
                ref2=str(p1.absolute()),
                caption1=prompt["input"],
                caption2=prompt["output"],
                instruction=prompt["edit"],
            )


def parquet_files(root: str) -> list[Path]:
    """A folder (searched recursively for ``*.parquet``), a glob, or one file; sorted."""
    path = Path(root)
    if path.is_dir():
        files = sorted(path.rglob("*.parquet"))
    elif any(c in root for c in "*?["):
        files = sorted(Path(p) for p in glob.glob(root, recursive=True))
    else:
        files = [path]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(
            f"{root}: no parquet files; download timbrooks/instructpix2pix-clip-filtered (data/*.parquet) and point "
            "'root' at the folder"
        )
    return [f.absolute() for f in files]


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _cell(value: Any) -> bytes | None:
    if isinstance(value, dict):
        value = value.get("bytes")
    return bytes(value) if isinstance(value, bytes | bytearray) and value else None


@register_source("ip2p_parquet")
def read_ip2p_parquet(spec: SourceSpec, issues: DataIssues) -> Iterator[PairItem]:
    """Pairs of the Hub's parquet files, in row batches (``batch_rows``, default 64; see the module docstring).

    With ``spec.options["read_images"]`` false (the index step's ``--verify none``) only the text columns are read.
    """
    batch_rows = int(spec.options.get("batch_rows", 64))
    read_images = bool(spec.options.get("read_images", True))
    cap0, img0, edit, cap1, img1 = PARQUET_COLUMNS
    for path in parquet_files(spec.root):
        try:
            pf = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as err:  # not a parquet file
            issues.add(IssueKind.CORRUPT_SHARD, str(path), f"unreadable parquet file: {err}")
            continue
        names = pf.schema_arrow.names
        absent = [c for c in PARQUET_COLUMNS if c not in names]
        if absent:
            raise ValueError(f"{path}: not the InstructPix2Pix parquet layout: no column(s) {absent} (has {names})")
        columns = list(PARQUET_COLUMNS) if read_images else [cap0, edit, cap1]
        row = 0
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
                data = batch.to_pydict()
                for i in range(batch.num_rows):
                    r = row + i
                    d0 = _cell(data[img0][i]) if read_images else None
                    d1 = _cell(data[img1][i]) if read_images else None
                    if read_images and (d0 is None or d1 is None):
                        issues.add(IssueKind.MISSING_IMAGE, f"{path}::{r}", "image cell without bytes")
                        continue
                    yield PairItem(
                        key=f"{spec.name}/{path.stem}/{r}",
                        ref1=parquet_ref(path, r, img0),
                        ref2=parquet_ref(path, r, img1),
                        caption1=_text(data[cap0][i]),
                        caption2=_text(data[cap1][i]),
                        instruction=_text(data[edit][i]),
                        data1=d0,
                        data2=d1,
                    )
                row += batch.num_rows
        except (OSError, pa.ArrowException) as err:  # a truncated file: the rows after the damage are lost
            lost = pf.metadata.num_rows - row
            issues.add(IssueKind.CORRUPT_SHARD, str(path), f"read failed at row {row}: {err}", n=lost)
