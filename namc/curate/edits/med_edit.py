"""The image side of MED's ``namc curate edit`` (seed paper ``004``, section 3.1): the editor, the pair similarity
and the edit stage, which runs locally (no chat server) between the instruction and the captions.

:func:`run_edit_stage` loads each image that passed Figures 7-8, sends batches of (image, editing prompt, seed) to
the :class:`~namc.curate.edits.base.Editor`, measures the similarity of every edited image to its original and
stores ``{"image2", "similarity", "seed"}`` per image in the ``edit`` store (the edited image is written under
``images/`` through a temporary name first, so a kill never leaves half a PNG under the final name). A
:class:`~namc.curate.edits.base.GenerationFailed` is stored under its kind; an editor that raises costs its batch
(``generator_error``), never the run. The similarity threshold is applied later, by the ``similarity`` stage, so a
different threshold needs no new edit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from namc.curate.edits.base import BackendError, Editor, GenerationFailed
from namc.curate.edits.med_stages import Stage, StageBook, StageRun, pending_items
from namc.jsonl import loads
from namc.llm import BadInput, ResultStore
from namc.llm.images import load_image

if TYPE_CHECKING:
    from namc.curate.edits.tools import Similarity

__all__ = [
    "CLIP_HINT",
    "build_clip_similarity",
    "build_editor",
    "describe_similarity",
    "edited_name",
    "item_seed",
    "run_edit_stage",
]

logger = logging.getLogger(__name__)

State = dict[str, Any]

CLIP_HINT = (
    "CLIP ViT-B/32 in open_clip layout (the paper's clip-vit-base-patch32): open_clip_pytorch_model.bin from the "
    "Hub repository timm/vit_base_patch32_clip_224.openai"
)


def build_clip_similarity(section: Mapping[str, Any]) -> Similarity:
    """The image similarity of the edit stage (:func:`namc.curate.edits.tools.build_similarity`): ``similarity:
    clip`` (the paper: open_clip ``ViT-B-32``, tag ``openai``; ``clip_model`` may also be a config JSON file, as tests
    use) or ``pixels`` (SSIM, the shapes world's stand-in)."""
    from namc.curate.edits.tools import build_similarity

    section = dict(section)
    model = section.get("clip_model")
    if isinstance(model, str) and model.endswith(".json"):
        try:
            section["clip_model"] = loads(Path(model).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise BackendError(f"CLIP config {model}: not a readable JSON file: {err}") from None
    if section.get("similarity", "clip") == "clip" and section.get("clip_weights") is None:
        raise BackendError(
            f"CLIP weights: no file given. Download {CLIP_HINT} and pass its local path (--clip-weights, or "
            "clip_weights in the edit section of the pipeline YAML); namc never downloads"
        )
    return build_similarity(section)


def describe_similarity(section: Mapping[str, Any]) -> str:
    if section.get("similarity", "clip") == "pixels":
        return "pixels (SSIM)"
    model = section.get("clip_model", "ViT-B-32")
    return f"CLIP {Path(model).stem if str(model).endswith('.json') else model} {section.get('clip_tag')} " + (
        f"({Path(section['clip_weights']).name})"
    )


def build_editor(section: Mapping[str, Any]) -> Editor:
    """The :class:`~namc.curate.edits.base.Editor` a YAML mapping names (``backend: diffusers | openai | shapes``)."""
    from namc.curate.edits import backends

    editor = backends.build(section, "edit")
    if not isinstance(editor, Editor):
        raise BackendError(f"backend {section.get('backend')!r} built a {type(editor).__name__}, not an image editor")
    return editor


def item_seed(seed: int, key: str) -> int:
    """The editor's seed of one image: stable across runs and machines (a hash of the run seed and the key)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:4], "big")


def edited_name(key: str) -> str:
    """The edited image's file name under ``images/``: readable, unique, and never a path (keys hold ``/``)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("._")[:80] or "image"
    return f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:10]}.png"


def _save(image: Image.Image, path: Path) -> None:
    """Writes the PNG through a temporary name, so a killed run never leaves half an image under the final name."""
    from namc.curate.edits.shapes import save_png

    partial = path.with_name(f".{path.name}.partial")
    save_png(image if image.mode in ("RGB", "RGBA", "L") else image.convert("RGB"), partial)
    os.replace(partial, path)


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"[:300]


class _EditBatches:
    """Collects loaded images into editor batches and stores each item's outcome the moment it is known."""

    def __init__(
        self,
        store: ResultStore,
        editor: Editor,
        similarity: Similarity,
        out_dir: Path,
        seed: int,
        instruction_text: str,
        bar: Any,
        run: StageRun,
    ) -> None:
        self.store, self.editor, self.similarity, self.out_dir = store, editor, similarity, out_dir
        self.seed, self.instruction_text, self.bar, self.run = seed, instruction_text, bar, run
        self.batch: list[tuple[str, State, Image.Image]] = []
        self.edit_seconds = self.similarity_seconds = 0.0

    def fail(self, key: str, kind: str, message: str) -> None:
        self.store.append({"id": key, "status": "failed", "error_kind": kind, "error": message, "attempts": 1})
        self.run.failed[kind] += 1
        self.bar.update(1)

    def _edit(self) -> list[Any]:
        texts = [s["edit_prompt"] if self.instruction_text == "full" else s["instruction"] for _, s, _ in self.batch]
        seeds = [item_seed(self.seed, key) for key, _, _ in self.batch]
        t0 = time.perf_counter()
        try:
            results: list[Any] = list(self.editor.edit([im for _, _, im in self.batch], texts, seeds))
            if len(results) != len(self.batch):
                results = [GenerationFailed("bad_output", f"{len(results)} results for {len(texts)} images")] * len(
                    texts
                )
        except Exception as err:  # a generator error costs its batch, never the run
            logger.warning("the editor raised on a batch of %d: %s", len(texts), _one_line(err))
            results = [GenerationFailed("generator_error", _one_line(err))] * len(texts)
        self.edit_seconds += time.perf_counter() - t0
        return results

    def flush(self) -> None:
        if not self.batch:
            return
        results = self._edit()
        made = []
        for (key, _, original), r in zip(self.batch, results):
            if isinstance(r, Image.Image):
                made.append((key, original, r))
            elif isinstance(r, GenerationFailed):
                self.fail(key, r.kind, r.message)
            else:
                self.fail(key, "bad_output", f"the editor returned a {type(r).__name__}")
        if made:
            t0 = time.perf_counter()
            sims = self.similarity.image_similarity([o for _, o, _ in made], [e for _, _, e in made])
            self.similarity_seconds += time.perf_counter() - t0
            for (key, _, edited), sim in zip(made, sims):
                name = edited_name(key)
                _save(edited, self.out_dir / "images" / name)
                record = {"image2": f"images/{name}", "similarity": round(sim, 6), "seed": item_seed(self.seed, key)}
                self.store.append({"id": key, "status": "ok", **record})
                self.run.ok += 1
                self.bar.update(1)
        self.batch.clear()


def run_edit_stage(
    items: Callable[[], Iterator[tuple[str, State]]],
    stages: Sequence[Stage],
    book: StageBook,
    editor: Editor,
    similarity: Similarity,
    base: Path,
    out_dir: Path,
    batch_size: int = 8,
    seed: int = 0,
    instruction_text: str = "full",
    retry_failed: bool = False,
    progress: bool = True,
) -> StageRun:
    """Edits every image pending at the edit stage, in batches, storing ``{"image2", "similarity", "seed"}``."""
    from tqdm.auto import tqdm

    index = [s.name for s in stages].index("edit")
    todo = sum(1 for _ in pending_items(items, stages, index, book, retry_failed))
    run = StageRun()
    if todo == 0:
        return run
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with (
        ResultStore(book.path("edit")) as store,
        tqdm(total=todo, desc="edit", unit="img", disable=not progress, dynamic_ncols=True) as bar,
    ):
        if retry_failed:
            store.forget_failed()
        batches = _EditBatches(store, editor, similarity, out_dir, seed, instruction_text, bar, run)
        for key, state in pending_items(items, stages, index, book, retry_failed):
            try:
                batches.batch.append((key, state, load_image(state["image"], base)))
            except BadInput as err:
                batches.fail(key, err.kind, str(err))
            except (KeyError, TypeError):
                batches.fail(key, "missing_field", "the line needs a string 'image' reference")
            if len(batches.batch) >= batch_size:
                batches.flush()
        batches.flush()
    book.refresh("edit")
    run.seconds = time.perf_counter() - started
    run.items = run.ok + sum(run.failed.values())
    run.extra = {
        "editor_seconds": round(batches.edit_seconds, 3),
        "editor_images_per_s": run.ok / batches.edit_seconds if batches.edit_seconds > 0 else None,
        "similarity_seconds": round(batches.similarity_seconds, 3),
        "similarity_pairs_per_s": run.ok / batches.similarity_seconds if batches.similarity_seconds > 0 else None,
    }
    return run
