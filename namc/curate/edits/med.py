"""``namc curate edit``: MED's controlled micro-edit engine (seed paper ``004``, sections 3.1-3.2, Figures 7-13).

From captioned single images (the ``images.jsonl`` of ``namc curate index``: ``{"key", "source", "image",
"caption"}``; captions may also come from ``--captions``, the output of ``namc curate caption``), every image goes
through these stages, each kept in its own resumable store under ``OUT/stages/``::

    filter       Figure 7: the MLLM judges image quality, caption clarity and editability; a strict "Yes" passes
    instruction  Figure 8: one editing prompt of one of the 11 composition categories ("Type: ...", "## Prompt: ...")
    edit         the image editor applies the prompt (namc.curate.edits.backends: diffusers InstructPix2Pix,
                 an OpenAI-compatible images.edit server, or the shapes world); the CLIP cosine similarity of the
                 two images is stored with the edited image
    similarity   CLIP similarity >= 0.7 (section 3.1: clip-vit-base-patch32, the MMVP threshold) keeps a pair
    caption1     Figure 9: the original caption completed with what the edit prompt names and the image shows
    caption2     Figure 10: a caption of the edited image, the completed caption as reference, the category's aspect
    difference   Figure 11: from the two captions alone, one difference sentence and its category
    judge        Figure 12: does the difference match the edit prompt ("Yes" passes)
    judge2       Figure 13: does the difference match the edited image's caption ("Yes" passes; --no-second-judge)
    template     the pair's implicit-change description (below) must pass namc's template check

Commands::

    namc curate edit --config configs/curate/med.yaml              # WORKDIR/images.jsonl -> WORKDIR/med/
    namc curate questions --config configs/curate/med.yaml         # -> WORKDIR/med/MED_bench.json

Outputs in ``--out`` (rebuilt from the stores at the end of every run, so a resumed run writes what an
uninterrupted one writes): ``images/`` (edited images, PNG), ``pairs.jsonl`` (every kept pair with its category,
prompts, both captions, difference and similarity: the input of ``namc curate questions``), ``manifest.jsonl`` (a
namc pre-training corpus: ``namc data pack`` / ``namc fit`` read it), ``rejects.jsonl`` (``{"id", "stage", "reason",
"detail"}`` per rejected image) and ``edit.summary.json`` (per stage: in, kept, rejected by reason, pending, and this
run's items per second; the 11 categories counted).

The corpus description: NAMC pre-trains on the implicit-change template (namc.text.template), whose halves describe
each image. A MED pair has exactly such a description per image, the two captions of Steps 1-2 (Figures 9-10), so
the description is ``rebuild("shows", caption1, "shows", caption2)``: each caption with its final period dropped, its
first letter lower-cased (unless the first word is an acronym), and a lead-in such as "The image shows" folded into
the verb when that verb is one of the template's. The difference sentence of Figure 11 stays in ``pairs.jsonl`` (it
compares, so it fits neither half). Identical captions (the edit did not show) are rejected at ``caption2``.

The chat stages are :mod:`namc.curate.edits.med_llm` (prompts in :mod:`namc.curate.edits.med_prompts`), the edit
and similarity stages :mod:`namc.curate.edits.med_edit`, the resumable machinery :mod:`namc.curate.edits.med_stages`.

Every image is accounted for: each input line ends kept, rejected at one stage by one reason (a refused, empty or
malformed answer, a failed request by its kind, a missing, corrupt or oversized image, a generator failure by its
kind, a generator exception as ``generator_error``), or skipped as a malformed or duplicate line.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.describe import load_captions
from namc.curate.edits.base import BackendError, Editor
from namc.curate.edits.med_edit import (
    CLIP_HINT,
    build_clip_similarity,
    build_editor,
    describe_similarity,
    run_edit_stage,
)
from namc.curate.edits.med_llm import MIN_SIMILARITY, MedStages, edit_stages
from namc.curate.edits.med_prompts import (
    CATEGORIES,
)
from namc.curate.edits.med_stages import (
    InputItems,
    Outcome,
    Stage,
    StageBook,
    StageRun,
    funnel,
    run_llm_stage,
    trace,
)
from namc.data.refs import rebase_ref
from namc.jsonl import json_line
from namc.llm import add_client_arguments, client_config, configure_logging
from namc.llm.store import atomic_write_text
from namc.locks import LockedError, output_lock
from namc.text.template import VERBS, parse, rebuild, validate

if TYPE_CHECKING:
    from namc.curate.edits.tools import Similarity

__all__ = [
    "MIN_SIMILARITY",
    "STAGES",
    "MedStages",
    "build_clip_similarity",
    "build_editor",
    "build_parser",
    "edit_stages",
    "main",
    "run_edit",
    "run_edit_stage",
    "template_description",
]

logger = logging.getLogger(__name__)

STAGES = (
    "filter",
    "instruction",
    "edit",
    "similarity",
    "caption1",
    "caption2",
    "difference",
    "judge",
    "judge2",
    "template",
)
_LEAD_IN = re.compile(r"^(?:the|this|an?)\s+(?:image|photo|photograph|picture|scene)\s+(\w+)\s+", re.IGNORECASE)

State = dict[str, Any]


# ---------------------------------------------------------------------------------------------------------------
# The corpus description
# ---------------------------------------------------------------------------------------------------------------


def _half(caption: str) -> tuple[str, str]:
    text = " ".join(caption.split()).rstrip(" .")
    verb = "shows"
    m = _LEAD_IN.match(text)
    if m and m.group(1).lower() in VERBS:
        verb, text = m.group(1).lower(), text[m.end() :]
    first = text.split(" ", 1)[0]
    if first[:1].isupper() and not (len(first) > 1 and first[1:2].isupper()):
        text = text[0].lower() + text[1:]
    return verb, text


def template_description(caption1: str, caption2: str) -> str:
    """The implicit-change description of a MED pair from its two captions (see the module docstring).

    Raises:
        ValueError: a caption is empty once its lead-in and final period are dropped.
    """
    (v1, d1), (v2, d2) = _half(caption1), _half(caption2)
    return rebuild(v1, d1, v2, d2)


def _mapping(value: Any) -> dict[str, Any]:
    """A YAML mapping, or its text on the command line (``--editor '{backend: shapes}'``)."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise argparse.ArgumentTypeError(f"not a YAML mapping: {str(err).splitlines()[0]}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a mapping such as {{backend: shapes}}, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------------------------------


def _finish(outcome: Outcome) -> Outcome:
    """The template stage: the pair's implicit-change description, or a rejection by the template's reason."""
    if outcome.status != "done":
        return outcome
    s = outcome.state
    try:
        description = template_description(s["caption1"], s["caption2"])
    except ValueError as err:
        return Outcome("rejected", "template", s, "empty_half", str(err))
    reason = validate(description)
    if reason is not None:
        return Outcome("rejected", "template", s, reason.value, description[:200])
    return Outcome("done", None, {**s, "description": description})


def _outputs(
    items: Callable[[], Iterator[tuple[str, State]]],
    stages: Sequence[Stage],
    book: StageBook,
    base: Path,
    out_dir: Path,
) -> list[Outcome]:
    """Writes pairs.jsonl, manifest.jsonl and rejects.jsonl from the stores (atomically); returns every outcome."""
    outcomes: list[Outcome] = []
    pairs, manifest, rejects = [], [], []
    for key, state in items():
        o = _finish(trace(state, key, stages, book))
        outcomes.append(Outcome(o.status, o.stage, {"category": o.state.get("category")}, o.reason))
        if o.status == "rejected":
            rejects.append(json_line({"id": key, "stage": o.stage, "reason": o.reason, "detail": o.detail[:300]}))
        if o.status != "done":
            continue
        s = o.state
        image1 = rebase_ref(s["image"], base, out_dir)
        pairs.append(
            json_line(
                {
                    "id": key,
                    "source": s.get("source") or "unknown",
                    "image1": image1,
                    "image2": s["image2"],
                    "category": s["category"],
                    "edit_prompt": s["edit_prompt"],
                    "instruction": s["instruction"],
                    "caption": s["caption"],
                    "caption1": s["caption1"],
                    "caption2": s["caption2"],
                    "difference": s["difference"],
                    "difference_type": s["difference_type"],
                    "similarity": s["similarity"],
                    "description": s["description"],
                }
            )
        )
        halves = parse(s["description"])
        manifest.append(
            json_line(
                {
                    "id": key,
                    "source": "med",
                    "image1": image1,
                    "image2": s["image2"],
                    "description": s["description"],
                    **halves._asdict(),
                    "category": s["category"],
                }
            )
        )
    for name, lines in (("pairs.jsonl", pairs), ("manifest.jsonl", manifest), ("rejects.jsonl", rejects)):
        atomic_write_text(out_dir / name, "".join(lines))
    return outcomes


def _counts(values: Sequence[str | None]) -> dict[str, int]:
    got = Counter(v for v in values if v)
    return {c: got.get(c, 0) for c in CATEGORIES}


def run_edit(
    images: Path,
    out_dir: Path,
    editor: Editor,
    clip: Similarity,
    config: Any,
    captions: Mapping[str, str] | None = None,
    min_similarity: float = MIN_SIMILARITY,
    second_judge: bool = True,
    require_type_match: bool = False,
    instruction_text: str = "full",
    batch_size: int = 8,
    seed: int = 0,
    max_side: int | None = None,
    retry_failed: bool = False,
    limit: int | None = None,
    progress: bool = True,
    similarity_name: str = "",
) -> dict[str, Any]:
    """Runs every stage over ``images`` into ``out_dir`` and returns the summary (also written as
    ``edit.summary.json``). See :func:`build_parser` for the arguments' meaning."""
    base = images.parent
    captions = captions or {}
    stages = edit_stages(base, out_dir, min_similarity, second_judge, require_type_match, max_side)

    def convert(key: str, obj: dict[str, Any]) -> State:
        caption = obj.get("caption") if isinstance(obj.get("caption"), str) else captions.get(key)
        return {"key": key, "source": obj.get("source"), "image": obj.get("image"), "caption": caption}

    items = InputItems(images, "key", convert, limit)

    runs: dict[str, StageRun] = {}
    started = time.perf_counter()
    (out_dir / "stages").mkdir(parents=True, exist_ok=True)
    with StageBook(out_dir / "stages", sorted({s.source for s in stages})) as book:
        for i, stage in enumerate(stages):
            if stage.name == "edit":
                runs[stage.name] = run_edit_stage(
                    items,
                    stages,
                    book,
                    editor,
                    clip,
                    base,
                    out_dir,
                    batch_size,
                    seed,
                    instruction_text,
                    retry_failed,
                    progress,
                )
            elif stage.messages is not None:
                runs[stage.name] = run_llm_stage(items, stages, i, book, config, retry_failed, progress, config.seed)
        outcomes = _outputs(items, stages, book, base, out_dir)
    names = [s.name for s in stages] + ["template"]
    stats = funnel(outcomes, names)
    for name, run in runs.items():
        stats[name]["run"] = run.to_json()
    kept = [o for o in outcomes if o.status == "done"]
    summary = {
        "input": {"file": str(images), "items": len(outcomes), "skipped": dict(items.skipped)},
        "pairs": len(kept),
        "categories": _counts([o.state["category"] for o in kept]),
        "instructed_categories": _counts([o.state["category"] for o in outcomes]),
        "rejected": sum(o.status == "rejected" for o in outcomes),
        "pending": sum(o.status == "pending" for o in outcomes),
        "stages": stats,
        "editor": editor.throughput.to_json(),
        "similarity": {"model": similarity_name, "min": min_similarity},
        "seconds": round(time.perf_counter() - started, 3),
    }
    atomic_write_text(out_dir / "edit.summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def format_summary(summary: Mapping[str, Any]) -> str:
    """The printed form of a step's summary: one line per stage, then the categories."""
    lines = [
        f"{summary['input']['items']} images ({sum(summary['input']['skipped'].values())} input lines skipped: "
        f"{summary['input']['skipped']}) -> {summary['pairs']} pairs, {summary['rejected']} rejected, "
        f"{summary['pending']} pending"
    ]
    for name, s in summary["stages"].items():
        run = s.get("run") or {}
        rate = f", {run['items_per_s']:.2f}/s this run" if run.get("items_per_s") else ""
        lines.append(f"  {name:<12} in {s['in']:>6}  kept {s['kept']:>6}  rejected {s['rejected']}{rate}")
    lines.append("categories: " + ", ".join(f"{c} {n}" for c, n in summary["categories"].items()))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="namc curate edit",
        description="MED's controlled micro-edits (004, Figures 7-13): filter, instruct one of 11 categories, edit, "
        "CLIP >= 0.7, captions, difference, judges -> edited pairs, a corpus manifest, a summary. Resumable.",
    )
    add_config_arguments(p)
    p.add_argument("--workdir", type=Path, default=None, help="default folder of --images and --out")
    p.add_argument("--images", type=Path, default=None, help="image index JSONL (default WORKDIR/images.jsonl)")
    p.add_argument("--captions", type=Path, default=None, help="captions JSONL {key, caption} for images without one")
    p.add_argument("--out", type=Path, default=None, help="output folder (default WORKDIR/med)")
    p.add_argument(
        "--editor",
        type=_mapping,
        default=None,
        help="the image editor, a mapping: backend diffusers | openai | shapes and its keys (YAML: editor: {...})",
    )
    p.add_argument(
        "--instruction-text",
        choices=("full", "core"),
        default="full",
        help="send the editor the whole Figure 8 prompt (the paper, Gemini) or only its instruction part",
    )
    p.add_argument("--batch-size", type=int, default=8, help="images per editor call")
    p.add_argument("--edit-seed", type=int, default=0, help="the editor's seeds derive from it and each key")
    p.add_argument(
        "--similarity",
        choices=("clip", "pixels"),
        default="clip",
        help="the pair's image similarity: CLIP (the paper) or pixels (SSIM, a stand-in for the shapes world)",
    )
    p.add_argument("--clip-weights", type=Path, default=None, help=f"open_clip weights file: {CLIP_HINT}")
    p.add_argument("--clip-model", default="ViT-B-32", help="open_clip config name, or a config JSON file")
    p.add_argument("--clip-tag", default="openai", help="open_clip pretrained tag of the weights ('none': no tag)")
    p.add_argument("--device", default="cpu", help="torch device of CLIP")
    p.add_argument("--min-similarity", type=float, default=MIN_SIMILARITY, help="CLIP cosine kept (section 3.1: 0.7)")
    p.add_argument("--second-judge", action=argparse.BooleanOptionalAction, default=True, help="Figure 13's judge")
    p.add_argument(
        "--require-type-match",
        action="store_true",
        help="reject a pair whose Figure 11 type differs from the instruction's category",
    )
    p.add_argument("--max-side", type=int, default=None, help="resize images sent to the server above this side")
    p.add_argument("--retry-failed", action="store_true", help="redo the items recorded as failed, at every stage")
    p.add_argument("--limit", type=int, default=None, help="only the first N images (a trial run)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_client_arguments(p)
    return p


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Path, Path]:
    images = args.images or (args.workdir / "images.jsonl" if args.workdir else None)
    if images is None:
        parser.error("give --images (or --workdir holding images.jsonl)")
    if not images.is_file():
        parser.error(f"image index not found: {images} (namc curate index writes WORKDIR/images.jsonl)")
    if not 0.0 <= args.min_similarity <= 1.0:
        parser.error(f"--min-similarity must be in [0, 1], got {args.min_similarity}")
    if not 1 <= args.batch_size <= 4096:
        parser.error(f"--batch-size must be in [1, 4096], got {args.batch_size}")
    if args.editor is None:
        parser.error("give --editor (YAML: editor: {backend: diffusers | openai | shapes, ...})")
    return images, args.out or (args.workdir / "med" if args.workdir else images.parent / "med")


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    parser = build_parser()
    args = parse_with_config(parser, argv, "edit")
    images, out = _check(args, parser)
    config = client_config(args)
    try:
        captions = load_captions(args.captions) if args.captions else {}
        with output_lock(out, "namc curate edit"):
            editor = build_editor(args.editor)
            section = {
                "similarity": args.similarity,
                "clip_weights": args.clip_weights,
                "clip_model": args.clip_model,
                "clip_tag": None if str(args.clip_tag).lower() == "none" else args.clip_tag,
                "device": args.device,
            }
            clip = build_clip_similarity(section)
            summary = run_edit(
                images,
                out,
                editor,
                clip,
                config,
                captions,
                args.min_similarity,
                args.second_judge,
                args.require_type_match,
                args.instruction_text,
                args.batch_size,
                args.edit_seed,
                args.max_side,
                args.retry_failed,
                args.limit,
                not args.quiet,
                describe_similarity(section),
            )
    except (LockedError, BackendError, FileNotFoundError) as err:
        print(f"namc curate edit: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    print(f"pairs: {out / 'pairs.jsonl'}  manifest: {out / 'manifest.jsonl'}  (next: namc curate questions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
