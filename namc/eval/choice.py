"""Minimal-pair choice evaluation (``namc eval choice``): pick the true description of an image pair among candidates
that differ from it in one detail, by the captioner's length-normalised log-probability.

For each pair the model scores every candidate T_k with ``log pi(T_k | X1, X2) / |T_k|`` (the summed log-probability
of its tokens and [EOS], divided by their number: :func:`namc.objectives.caption.sequence_logprob` with
``normalize=True``) and picks the highest. Accuracy is reported overall and per category, with the chance level
(mean of 1 / number of candidates) beside it. Ties (e.g. candidates that differ only in words the vocabulary lacks,
which all become [UNK]) count as a random pick among the tied: the item scores 1 / (number tied) when the true one
is among them; candidates with unknown words are counted in the report.

Input formats:

- **JSONL** (ours; :mod:`namc.data.synthetic.minimal_pairs` writes it): one item per line, ``{"id": str
  (optional), "image1": path, "image2": path, "candidates": [str, ...], "answer": int (index of the true one),
  "category": str (optional)}``; relative image paths are relative to the JSONL file's folder.
- **MED** (``--format med``; Micro Edit Detection, seed paper 004, released at github.com/beccabai/hallu_med as
  ``benchmark/MED_bench.json`` with ``benchmark/images/`` and ``MED_real_set.json``): a JSON list of ``{"image_name",
  "edited_image_name", "type" (one of the 11 categories; absent in the real set), "question", "options": ["A. ...",
  "B. ...", ...], "answer": "C"}``. The option letters are stripped and the question is not used (namc is a
  captioner: it scores each option as a description of the pair). Image paths are relative to ``--image-root``
  (default: the JSON file's folder); the real set's placeholder paths (``/path/to/MMVP Images/1.jpg``) resolve to
  ``--image-root/1.jpg``. Items without a ``type`` get the category ``real``.

An item whose image is missing or unreadable is skipped and counted (the report names the first few); a malformed
line or entry is an error naming the file and the line / entry.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from namc.data.collate import encode_caption, pad_sequences
from namc.data.transforms import ImageTransform
from namc.jsonl import JSONError, loads
from namc.models.namc import NAMC
from namc.objectives.caption import sequence_logprob

__all__ = ["ChoiceItem", "evaluate_choices", "main", "read_choices", "read_med", "score_candidates"]

logger = logging.getLogger(__name__)

_OPTION_RE = re.compile(r"^\s*([A-Z])[.)]\s*")


@dataclass(frozen=True)
class ChoiceItem:
    """One image pair, its candidate descriptions, the index of the true one and its category."""

    id: str
    image1: Path
    image2: Path
    candidates: tuple[str, ...]
    answer: int
    category: str


def _check_item(where: str, candidates: Any, answer: Any) -> None:
    if not isinstance(candidates, list) or len(candidates) < 2 or not all(isinstance(c, str) for c in candidates):
        raise ValueError(f"{where}: 'candidates' must be a list of at least two strings")
    if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(candidates):
        raise ValueError(f"{where}: 'answer' must be an index into the {len(candidates)} candidates, got {answer!r}")


def read_choices(path: str | Path) -> list[ChoiceItem]:
    """Items of a JSONL choice file (see the module docstring); a bad line raises ValueError naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"choice file not found: {path} (`namc data minimal-pairs --out DIR` writes one)")
    items = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            where = f"{path}:{n}"
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise ValueError(f"{where}: not UTF-8") from None
            if not line:
                continue
            try:
                rec = loads(line)
            except JSONError as err:
                raise ValueError(f"{where}: invalid JSON: {err}") from None
            if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str) for k in ("image1", "image2")):
                raise ValueError(f"{where}: expected an object with string 'image1' and 'image2'")
            _check_item(where, rec.get("candidates"), rec.get("answer"))
            image1, image2 = path.parent / rec["image1"], path.parent / rec["image2"]
            category = str(rec.get("category", "all"))
            items.append(
                ChoiceItem(str(rec.get("id", n)), image1, image2, tuple(rec["candidates"]), rec["answer"], category)
            )
    return items


def _med_path(name: str, root: Path) -> Path:
    p = Path(name)
    if p.is_absolute():
        return p if p.exists() else root / p.name  # the real set's placeholder folders
    return root / p


def read_med(path: str | Path, image_root: str | Path | None = None) -> list[ChoiceItem]:
    """Items of a MED benchmark file (``MED_bench.json`` / ``MED_real_set.json``; see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"MED file not found: {path} (MED_bench.json and images/ are in the benchmark/ folder of "
            "github.com/beccabai/hallu_med)"
        )
    try:
        data = loads(path.read_bytes().decode("utf-8-sig"), max_chars=None)
    except (UnicodeDecodeError, JSONError) as err:
        raise ValueError(f"{path}: not a UTF-8 JSON file: {err}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of questions")
    root = Path(image_root) if image_root is not None else path.parent
    items = []
    for n, rec in enumerate(data):
        where = f"{path}: entry {n}"
        if not isinstance(rec, dict) or not all(
            isinstance(rec.get(k), str) for k in ("image_name", "edited_image_name")
        ):
            raise ValueError(f"{where}: expected 'image_name' and 'edited_image_name' strings")
        options, answer = rec.get("options"), rec.get("answer")
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise ValueError(f"{where}: 'options' must be a list of strings")
        letters = [m.group(1) if (m := _OPTION_RE.match(o)) else None for o in options]
        if not isinstance(answer, str) or answer.strip() not in letters:
            raise ValueError(f"{where}: answer {answer!r} is not one of the option letters {letters}")
        candidates = [_OPTION_RE.sub("", o, count=1).strip() for o in options]
        _check_item(where, candidates, letters.index(answer.strip()))
        image1, image2 = _med_path(rec["image_name"], root), _med_path(rec["edited_image_name"], root)
        category = str(rec.get("type") or "real")
        items.append(ChoiceItem(f"med-{n}", image1, image2, tuple(candidates), letters.index(answer.strip()), category))
    return items


@torch.no_grad()
def score_candidates(model: NAMC, image1: torch.Tensor, image2: torch.Tensor, candidates: Sequence[Sequence[str]]):
    """Length-normalised log-probabilities of every candidate of every pair.

    Args:
        model: the captioner (put it in eval mode first).
        image1: (B, 3, H, W) first images in [0, 1].
        image2: (B, 3, H, W) second images.
        candidates: B lists of candidate descriptions.

    Returns:
        a list of B lists of floats: log pi(T_k | X1, X2) / |T_k|.
    """
    tok = model.tokenizer
    memory = model.encode_pair(image1, image2)  # (B, N, D)
    counts = [len(c) for c in candidates]
    ids = pad_sequences(
        [encode_caption(tok, t, model.config.max_caption_len) for c in candidates for t in c], tok.pad_id
    ).to(memory.device)  # (sum K_b, T)
    rows = torch.repeat_interleave(
        torch.arange(len(counts), device=memory.device), torch.tensor(counts, device=memory.device)
    )
    scores = sequence_logprob(model, memory[rows], ids, normalize=True).tolist()
    out, start = [], 0
    for k in counts:
        out.append(scores[start : start + k])
        start += k
    return out


def _credit(scores: Sequence[float], answer: int) -> tuple[float, int]:
    """(expected accuracy of an argmax with random tie-breaking, number tied at the top)."""
    best = max(scores)
    tied = [i for i, s in enumerate(scores) if s == best]
    return (1.0 / len(tied) if answer in tied else 0.0), len(tied)


def evaluate_choices(
    model: NAMC,
    items: Sequence[ChoiceItem],
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> dict[str, Any]:
    """Accuracy of picking the true candidate, overall and per category, with chance levels.

    Returns:
        ``{"overall": {...}, "per_category": {category: {...}}, "skipped": int, "skipped_examples": [...],
        "items": [{"id", "category", "answer", "pick", "scores", "credit"}]}``; each summary has ``n``, ``accuracy``
        and ``chance`` (percent), ``ties`` (items with a tie at the top) and ``unknown_word_candidates``.
    """
    model = model.to(device).eval()
    transform = ImageTransform(model.config.image_size)
    unk = getattr(model.tokenizer, "unk_id", None)
    results: list[dict[str, Any]] = []
    skipped: list[str] = []
    for start in tqdm(range(0, len(items), batch_size), desc="choice", unit="batch", disable=not progress):
        batch, im1, im2 = [], [], []
        for it in items[start : start + batch_size]:
            try:
                a, b = transform.load(it.image1), transform.load(it.image2)
            except (OSError, SyntaxError, ValueError) as err:
                skipped.append(f"{it.id}: {err}")
                continue
            batch.append(it)
            im1.append(a)
            im2.append(b)
        if not batch:
            continue
        scores = score_candidates(
            model, torch.stack(im1).to(device), torch.stack(im2).to(device), [it.candidates for it in batch]
        )
        for it, s in zip(batch, scores):
            credit, tied = _credit(s, it.answer)
            oov = sum(unk in model.tokenizer.encode(c) for c in it.candidates) if unk is not None else 0
            pick = max(range(len(s)), key=s.__getitem__)
            results.append(
                {
                    "id": it.id,
                    "category": it.category,
                    "answer": it.answer,
                    "pick": pick,
                    "scores": s,
                    "credit": credit,
                    "tied": tied,
                    "n": len(s),
                    "oov": oov,
                }
            )
    if skipped:
        logger.warning(
            "choice evaluation: skipped %d item(s) with unreadable images, e.g. %s", len(skipped), skipped[0]
        )

    def summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
        n = len(rs)
        return {
            "n": n,
            "accuracy": 100.0 * sum(r["credit"] for r in rs) / n if n else float("nan"),
            "chance": 100.0 * sum(1 / r["n"] for r in rs) / n if n else float("nan"),
            "ties": sum(r["tied"] > 1 for r in rs),
            "unknown_word_candidates": sum(r["oov"] for r in rs),
        }

    cats = sorted({r["category"] for r in results})
    return {
        "overall": summary(results),
        "per_category": {c: summary([r for r in results if r["category"] == c]) for c in cats},
        "skipped": len(skipped),
        "skipped_examples": skipped[:5],
        "items": results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``namc eval choice CHOICES --model DIR [--format jsonl|med] [--image-root DIR] [--out RESULTS.json]``."""
    parser = argparse.ArgumentParser(prog="namc eval choice", description=__doc__.split("\n\n")[0])
    parser.add_argument("choices", help="a JSONL choice file, or MED's MED_bench.json with --format med")
    parser.add_argument("--model", required=True, help="a save_pretrained folder, hf-hub: id or namc .ckpt")
    parser.add_argument("--format", choices=("jsonl", "med"), default=None, help="default: by the file's suffix")
    parser.add_argument("--image-root", default=None, help="MED: the folder its image paths are relative to")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="write the scores (per item too) to this JSON file")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    from namc.models import load_model

    fmt = args.format or ("med" if args.choices.endswith(".json") else "jsonl")
    try:
        items = read_med(args.choices, args.image_root) if fmt == "med" else read_choices(args.choices)
        model = load_model(args.model, pretraining=False)
    except (OSError, ValueError) as err:
        print(f"namc eval choice: error: {err}", file=sys.stderr)
        return 2
    res = evaluate_choices(model, items, args.batch_size, args.device, progress=not args.quiet)
    print(f"{'category':<18} {'n':>5} {'accuracy':>9} {'chance':>7} {'ties':>5}")
    for name, s in [*res["per_category"].items(), ("overall", res["overall"])]:
        print(f"{name:<18} {s['n']:>5} {s['accuracy']:>9.2f} {s['chance']:>7.2f} {s['ties']:>5}")
    print(
        f"accuracy in %, by length-normalised log-probability; {res['skipped']} item(s) skipped (unreadable images); "
        f"{res['overall']['unknown_word_candidates']} candidate(s) with words outside the vocabulary"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
        print(f"wrote {args.out}")
    return 0
