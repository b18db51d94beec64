"""Word-level irrelevance of corpus descriptions under a pre-trained NIM (paper Eq. 1): :func:`score_manifest`.

For each pair, each half's ``[object description]`` (``desc1`` with image 1, ``desc2`` with image 2, as NIM pairs
them in pre-training, section 3.2.1) goes through the model's text tower and the image through its image tower;
``R_T[n] = max_m cos(H_I[m], H_T[n])`` (Eq. 1, :meth:`namc.models.namc.NAMC.relevance`) and the token's
irrelevance is ``IR_T = 1 - R_T`` (in [0, 2]; higher = less supported by the image).

Choices (ours; the paper scores tokens, a person reads words):

- **Words.** A description word is ``desc.split()[k]``, the unit of the corpus's ``noise1``/``noise2`` labels. It is
  tokenized on its own (as :class:`namc.data.collate.PretrainCollator` does, so the tokens are those of training)
  and its irrelevance is the **mean** over its tokens.
- **Truncation.** Words past the text tower's context (``context_length - 2`` tokens) get no score (``None``) and are
  never flagged; the summary counts them.
- **Flags.** A word is flagged when its irrelevance is ``>= threshold``; a *span* is a maximal run of consecutive
  flagged words of one half. A pair's ``flagged_fraction`` is flagged words / scored words over both halves.

Dimension letters: B pairs in a batch, L tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from namc.data.collate import pad_sequences
from namc.data.corpus.records import CorpusRecord, RecordError, iter_manifest, parse_line, parse_record
from namc.data.issues import DataIssues, IssueKind
from namc.data.refs import read_ref
from namc.data.transforms import ImageTransform, open_image
from namc.models.namc import NAMC

__all__ = ["ScoredPair", "flag_spans", "iter_records", "score_manifest", "word_ids"]

logger = logging.getLogger(__name__)


@dataclass
class ScoredPair:
    """One pair's record, its image bytes (for the report) and the irrelevance of every word of both halves."""

    record: CorpusRecord
    scores1: list[float | None]
    scores2: list[float | None]


def word_ids(tokenizer: Any, desc: str, max_tokens: int) -> tuple[list[int], list[int]]:
    """Token ids of a description (at most ``max_tokens``) and, per token, the index of its whitespace word."""
    ids: list[int] = []
    word_of: list[int] = []
    for k, word in enumerate(desc.split()):
        piece = tokenizer.encode(word)
        ids += piece
        word_of += [k] * len(piece)
    return ids[:max_tokens], word_of[:max_tokens]


def flag_spans(words: list[str], scores: list[float | None], threshold: float) -> list[dict[str, Any]]:
    """Maximal runs of consecutive words with irrelevance ``>= threshold``:
    ``[{"start", "end" (exclusive), "text", "max_score"}]``."""
    spans: list[dict[str, Any]] = []
    start = None
    for k in range(len(words) + 1):
        hit = k < len(words) and scores[k] is not None and scores[k] >= threshold  # type: ignore[operator]
        if hit and start is None:
            start = k
        elif not hit and start is not None:
            top = max(s for s in scores[start:k] if s is not None)
            spans.append({"start": start, "end": k, "text": " ".join(words[start:k]), "max_score": round(top, 4)})
            start = None
    return spans


def iter_records(manifest: Path, issues: DataIssues) -> Iterator[tuple[CorpusRecord, bytes, bytes]]:
    """Valid manifest records with their image bytes; bad lines and unreadable images are skipped and counted."""
    base = manifest.parent
    seen: set[str] = set()
    for line_no, line in iter_manifest(manifest):
        where = f"{manifest}:{line_no}"
        try:
            record = parse_record(parse_line(line))
            if record.id in seen:
                raise RecordError(IssueKind.DUPLICATE_ID, f"id {record.id!r} already seen")
            seen.add(record.id)
            data = []
            for slot, ref in (("image1", record.image1), ("image2", record.image2)):
                try:
                    raw = read_ref(ref, base)
                    open_image(raw)  # decodable and under the pixel cap
                except FileNotFoundError as err:
                    raise RecordError(IssueKind.MISSING_IMAGE, f"{slot}: {err}") from None
                except (OSError, SyntaxError) as err:
                    raise RecordError(IssueKind.CORRUPT_IMAGE, f"{slot}: {ref}: {err}") from None
                data.append(raw)
        except RecordError as err:
            issues.add(err.kind, where, str(err))
            continue
        issues.add_ok()
        yield record, data[0], data[1]


def _half_scores(model: NAMC, images: torch.Tensor, descs: list[str]) -> list[list[float | None]]:
    tok = model.tokenizer
    context = model.nim.context_length if model.nim is not None else 77
    rows, owners = [], []
    for desc in descs:
        ids, word_of = word_ids(tok, desc, context - 2)
        rows.append([tok.bos_id, *ids, tok.eos_id])
        owners.append(word_of)
    text = pad_sequences(rows, tok.pad_id).to(images.device)  # (B, L)
    _, r_txt = model.relevance(images, text)  # (B, L), Eq. 1
    ir = (1 - r_txt).float().cpu()
    out: list[list[float | None]] = []
    for b, (desc, word_of) in enumerate(zip(descs, owners)):
        n_words = len(desc.split())
        sums, counts = [0.0] * n_words, [0] * n_words
        for t, w in enumerate(word_of):
            sums[w] += float(ir[b, 1 + t])  # token t sits after [SOS]
            counts[w] += 1
        out.append([sums[w] / counts[w] if counts[w] else None for w in range(n_words)])
    return out


@torch.no_grad()
def score_manifest(
    model: NAMC,
    manifest: str | Path,
    issues: DataIssues,
    batch_size: int = 32,
    limit: int | None = None,
) -> Iterator[tuple[ScoredPair, bytes, bytes]]:
    """Scores every word of every valid record of a manifest, in batches; yields ``(scored, image1, image2)``.

    Args:
        model: a NAMC with its NIM module (a pre-training model), in eval mode.
        manifest: the corpus manifest (image references relative to its folder).
        issues: counts skipped lines and images.
        batch_size: pairs per forward pass.
        limit: stop after this many valid records.
    """
    if model.nim is None:
        raise ValueError("the audit needs NIM: load the pre-training model (not one fine-tuned with NIM dropped)")
    device = next(model.parameters()).device
    transform = ImageTransform(model.config.image_size)
    batch: list[tuple[CorpusRecord, bytes, bytes]] = []

    def flush() -> Iterator[tuple[ScoredPair, bytes, bytes]]:
        img1 = torch.stack([transform.load(b[1]) for b in batch]).to(device)  # (B, 3, H, W)
        img2 = torch.stack([transform.load(b[2]) for b in batch]).to(device)
        s1 = _half_scores(model, img1, [b[0].desc1 for b in batch])
        s2 = _half_scores(model, img2, [b[0].desc2 for b in batch])
        for (record, raw1, raw2), a, b in zip(batch, s1, s2):
            yield ScoredPair(record, a, b), raw1, raw2

    for n, item in enumerate(iter_records(Path(manifest), issues), start=1):
        batch.append(item)
        if len(batch) == batch_size:
            yield from flush()
            batch = []
        if limit is not None and n >= limit:
            break
    if batch:
        yield from flush()
