"""What the Img-Diff steps share: per-step counts by reason, the summary file, images in and out, seeds.

Every step reads a JSONL (one item per line, keyed by ``id``), appends one line per finished item to its results
file through :class:`~namc.llm.store.ResultStore` (``status`` ``ok`` or ``rejected`` with a ``reason``), so a
run killed at any moment resumes where it stopped with nothing lost or written twice, and ends by writing
``<results>.summary.json``: :class:`StepCounts`, in which every input line is in exactly one bucket.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from namc.data.corpus.records import image_error
from namc.data.refs import read_ref
from namc.data.transforms import open_image, to_rgb
from namc.llm.store import atomic_write_text

__all__ = [
    "ImageLoadError",
    "mapping",
    "StepCounts",
    "item_seed",
    "load_image",
    "png_data_url",
    "summary_path",
    "write_summary",
]


@dataclass
class StepCounts:
    """What one run of a step did with each input line: ``kept``, ``rejected`` by reason, ``resumed`` (done in an
    earlier run) or ``skipped`` (not an item: a malformed line, a duplicate id) by reason; ``boxes`` counts the
    per-box filters of the region steps by reason; ``seconds`` per stage (``backend``, ``filters``, ``llm``)."""

    lines: int = 0
    kept: int = 0
    resumed: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    boxes: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Raises AssertionError unless every input line is in exactly one bucket."""
        total = self.kept + self.resumed + sum(self.rejected.values()) + sum(self.skipped.values())
        if total != self.lines:
            raise AssertionError(f"summary does not add up: {total} outcomes for {self.lines} input lines")

    def timed(self, stage: str, started: float) -> None:
        self.seconds[stage] += time.perf_counter() - started

    def to_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "kept": self.kept,
            "resumed": self.resumed,
            "rejected": dict(sorted(self.rejected.items())),
            "skipped": dict(sorted(self.skipped.items())),
            "boxes": dict(sorted(self.boxes.items())),
            "seconds": {k: round(v, 3) for k, v in sorted(self.seconds.items())},
            **self.extra,
        }

    def format(self, step: str) -> str:
        def kinds(c: Counter[str]) -> str:
            return " (" + ", ".join(f"{k}={v}" for k, v in sorted(c.items())) + ")" if c else ""

        return (
            f"{step}: {self.lines} input lines: {self.kept} kept, {sum(self.rejected.values())} rejected"
            f"{kinds(self.rejected)}, {self.resumed} done in an earlier run, {sum(self.skipped.values())} skipped"
            f"{kinds(self.skipped)}" + (f"; boxes{kinds(self.boxes)}" if self.boxes else "")
        )


def summary_path(results: Path) -> Path:
    """``regions.jsonl`` -> ``regions.summary.json``."""
    return results.with_name(results.stem + ".summary.json")


def write_summary(results: Path, counts: StepCounts, **more: Any) -> Path:
    path = summary_path(results)
    atomic_write_text(path, json.dumps({**counts.to_dict(), **more}, indent=2) + "\n")
    return path


class ImageLoadError(ValueError):
    """An image that cannot be used: ``kind`` is ``missing_image``, ``corrupt_image`` or ``oversized_image``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def load_image(ref: Any, base: Path, slot: str) -> Image.Image:
    """The RGB image of a reference (a path relative to ``base``, or a tar / parquet reference), its PNG text chunks
    kept in ``info``.

    Raises:
        ImageLoadError: missing, corrupt or oversized (the pixel cap is checked from the header first).
    """
    if not isinstance(ref, str) or not ref.strip():
        raise ImageLoadError("missing_field", f"no {slot} reference")
    try:
        image = open_image(read_ref(ref, base))
    except Exception as err:  # noqa: BLE001 - every decoder error is this item's, counted by kind
        e = image_error(err if not isinstance(err, FileNotFoundError) else err, slot, ref)
        kind = "missing_image" if isinstance(err, FileNotFoundError) else str(getattr(e.kind, "value", e.kind))
        raise ImageLoadError(kind, str(e)) from None
    info = dict(image.info)
    image = to_rgb(image)
    image.info.update({k: v for k, v in info.items() if isinstance(v, str)})
    return image


def png_data_url(image: Image.Image) -> str:
    """An in-memory image (a crop) as a PNG ``data:`` URL for a chat request."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def file_stem(item_id: str) -> str:
    """A file name stem for an item id read from the input: only ``[A-Za-z0-9._-]`` (an id such as ``cc3m/001`` or
    ``../x`` never names another folder) and a hash of the whole id, so two ids never share a file."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", item_id)[:80].lstrip(".") or "item"
    return f"{safe}-{hashlib.sha256(item_id.encode()).hexdigest()[:8]}"


def item_seed(item_id: str, seed: int) -> int:
    """A generator seed of one item that does not depend on the order or the batch it runs in."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{item_id}".encode()).digest()[:4], "little")


def mapping(value: Any) -> dict[str, Any]:
    """An option holding a YAML section: a mapping from the pipeline YAML, or YAML text from the command line."""
    from namc.yamltext import load_yaml

    data = value if isinstance(value, dict) else load_yaml(str(value))
    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping, got {type(data).__name__}")
    return data
