"""Collate functions: dataset items -> the batches :class:`namc.NAMC` consumes.

Dimension letters: B batch, L description tokens, T caption tokens, N grid positions.

Pre-training items (:class:`namc.data.corpus.CorpusDataset`) carry the parsed template halves; the collator tokenizes
each "[object description]" for NIM's text tower and builds the whole implicit-change description for FDG piece by
piece (template prefix + description 1 + middle + description 2 + suffix), recording for every caption token which
description token it copies (``caption_src1``/``caption_src2``), so the model can write the *denoised* description
(masked words -> [MASK]) with one gather once NIM has chosen its masks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from namc.text.template import segments
from namc.text.tokenizer import CaptionTokenizer

logger = logging.getLogger(__name__)


class SkipNone:
    """Collate wrapper: drops the ``None`` items of unreadable images; a batch left empty becomes ``None``.

    Datasets built with ``on_error="skip"`` return ``None`` for an item whose image does not decode (and count it);
    wrapping the collate function keeps such items out of the batch. A class, not a closure, so DataLoader workers
    can pickle it.

    Args:
        collate: the collate function for the remaining items.
    """

    def __init__(self, collate: Callable[[Sequence[dict[str, Any]]], Any]) -> None:
        self.collate = collate

    def __call__(self, items: Sequence[dict[str, Any] | None]) -> Any:
        kept = [it for it in items if it is not None]
        return self.collate(kept) if kept else None


def pad_sequences(rows: Sequence[Sequence[int]], value: int, length: int | None = None) -> torch.Tensor:
    """Right-pad integer rows into a (B, max length) LongTensor."""
    length = length if length is not None else max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(length, 1)), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    return out


def encode_caption(tokenizer: CaptionTokenizer, text: str, max_len: int) -> list[int]:
    """``[BOS] tokens [EOS]`` truncated to ``max_len`` ids (the [EOS] is kept)."""
    ids = tokenizer.encode(text)[: max_len - 2]
    return [tokenizer.bos_id, *ids, tokenizer.eos_id]


def _encode_words(tokenizer: CaptionTokenizer, desc: str) -> tuple[list[int], list[int]]:
    """Token ids of a description and, for each token, the index of its whitespace word."""
    ids: list[int] = []
    word_of: list[int] = []
    for k, word in enumerate(desc.split()):
        piece = tokenizer.encode(word)
        ids += piece
        word_of += [k] * len(piece)
    return ids, word_of


class PretrainCollator:
    """Batches pre-training items for :func:`namc.objectives.pretrain_step`.

    Args:
        tokenizer: the model's caption tokenizer.
        max_text_len: most ids of a description half with [SOS]/[EOS] (the CLIP context length, 77 for ViT-B/16).
        max_caption_len: most ids of the whole description with [BOS]/[EOS] (the FDG's ``max_caption_len``).
        swap_prob: probability of exchanging the two images and their halves (appendix B.3 ablation).

    Items need ``image1``, ``image2`` (3, H, W) tensors, ``verb1``, ``desc1``, ``verb2``, ``desc2``; optional
    ``noise1``/``noise2`` (word-level labels), ``codes1``/``codes2`` (N,) VQGAN codes and ``id``.
    The batch has ``image1``, ``image2``, ``desc1``, ``desc2`` (B, L), ``caption``, ``caption_src1``,
    ``caption_src2`` (B, T), ``noise1``, ``noise2`` (B, L) bool token labels (all False where unknown),
    ``has_noise`` (B,) bool, ``codes1``/``codes2`` (B, N) when every item has codes, ``grid1``/``grid2`` (B, N, C)
    when every item has precomputed grids (``namc data precompute``), ``free_text`` (B,) bool and ``ids``.

    A free-text item (``free_text`` True, :mod:`namc.data.corpus.records`) has no halves: its caption is its whole
    description, its ``desc1``/``desc2`` hold only [SOS] [EOS] and no caption token copies from them.
    """

    def __init__(
        self, tokenizer: CaptionTokenizer, max_text_len: int = 77, max_caption_len: int = 160, swap_prob: float = 0.0
    ) -> None:
        if max_text_len < 3 or max_caption_len < 3:
            raise ValueError("max_text_len and max_caption_len must leave room for at least one token")
        self.tokenizer = tokenizer
        self.max_text_len = max_text_len
        self.max_caption_len = max_caption_len
        self.swap_prob = swap_prob

    def _half(self, desc: str, noise: Sequence[int] | None, item_id: Any) -> tuple[list[int], list[int], list[bool]]:
        tok = self.tokenizer
        ids, word_of = _encode_words(tok, desc)
        if noise is not None and len(noise) != len(desc.split()):
            raise ValueError(
                f"item {item_id!r}: {len(noise)} noise labels for {len(desc.split())} words of {desc!r} "
                "(labels are aligned to desc.split())"
            )
        labels = [bool(noise[w]) for w in word_of] if noise is not None else [False] * len(ids)
        kept = self.max_text_len - 2
        return [tok.bos_id, *ids[:kept], tok.eos_id], ids, [False, *labels[:kept], False]

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        tok = self.tokenizer
        img1, img2, d1s, d2s, caps, src1s, src2s, n1s, n2s, has_noise = ([] for _ in range(10))
        swaps = (
            torch.rand(len(items)) < self.swap_prob if self.swap_prob > 0 else torch.zeros(len(items), dtype=torch.bool)
        )
        for item, swap in zip(items, swaps.tolist()):
            if item.get("free_text"):  # no halves to swap or copy: the caption is the description, NIM reads nothing
                if swap:
                    raise ValueError(f"item {item.get('id')!r}: a free-text description cannot follow swapped images")
                img1.append(item["image1"])
                img2.append(item["image2"])
                for rows in (d1s, d2s):
                    rows.append([tok.bos_id, tok.eos_id])
                caps.append(encode_caption(tok, item["description"], self.max_caption_len))
                src1s.append([-1] * len(caps[-1]))
                src2s.append([-1] * len(caps[-1]))
                n1s.append([False, False])
                n2s.append([False, False])
                has_noise.append(False)
                continue
            a, b = ("2", "1") if swap else ("1", "2")
            verb1, verb2 = item["verb" + a], item["verb" + b]
            desc1_ids, words1, noise1 = self._half(item["desc" + a], item.get("noise" + a), item.get("id"))
            desc2_ids, words2, noise2 = self._half(item["desc" + b], item.get("noise" + b), item.get("id"))
            prefix, middle, suffix = segments(verb1, verb2)
            caption, src1, src2 = [tok.bos_id], [-1], [-1]
            for piece, src in ((prefix, None), (words1, src1), (middle, None), (words2, src2), (suffix, None)):
                ids = tok.encode(piece) if isinstance(piece, str) else piece
                start = len(caption)
                caption += ids
                for s in (src1, src2):
                    s += [-1] * len(ids)
                if src is not None:  # caption token k of this half copies description token 1 + k (if not truncated)
                    limit = len(desc1_ids if src is src1 else desc2_ids) - 2
                    for k in range(len(ids)):
                        src[start + k] = 1 + k if k < limit else -1
            cut = self.max_caption_len - 1
            caption, src1, src2 = caption[:cut] + [tok.eos_id], src1[:cut] + [-1], src2[:cut] + [-1]
            img1.append(item["image" + a])
            img2.append(item["image" + b])
            d1s.append(desc1_ids)
            d2s.append(desc2_ids)
            caps.append(caption)
            src1s.append(src1)
            src2s.append(src2)
            n1s.append(noise1)
            n2s.append(noise2)
            has_noise.append(item.get("noise1") is not None and item.get("noise2") is not None)
        L = max(len(r) for r in d1s + d2s)
        batch: dict[str, Any] = {
            "image1": torch.stack(img1),
            "image2": torch.stack(img2),
            "desc1": pad_sequences(d1s, tok.pad_id, L),
            "desc2": pad_sequences(d2s, tok.pad_id, L),
            "caption": pad_sequences(caps, tok.pad_id),
            "caption_src1": pad_sequences(src1s, -1),
            "caption_src2": pad_sequences(src2s, -1),
            "noise1": pad_sequences([[int(x) for x in n] for n in n1s], 0, L).bool(),
            "noise2": pad_sequences([[int(x) for x in n] for n in n2s], 0, L).bool(),
            "has_noise": torch.tensor(has_noise),
            "free_text": torch.tensor([bool(item.get("free_text")) for item in items]),
            "ids": [str(item.get("id", i)) for i, item in enumerate(items)],
        }
        c1 = [it.get("codes1") for it in items]
        c2 = [it.get("codes2") for it in items]
        if all(c is not None for c in c1 + c2):
            pairs = [(b, a) if s else (a, b) for a, b, s in zip(c1, c2, swaps.tolist())]
            batch["codes1"] = torch.stack([torch.as_tensor(a, dtype=torch.long) for a, _ in pairs])
            batch["codes2"] = torch.stack([torch.as_tensor(b, dtype=torch.long) for _, b in pairs])
        g1 = [it.get("grid1") for it in items]
        g2 = [it.get("grid2") for it in items]
        if all(g is not None for g in g1 + g2):
            pairs = [(b, a) if s else (a, b) for a, b, s in zip(g1, g2, swaps.tolist())]
            batch["grid1"] = torch.stack([torch.as_tensor(a, dtype=torch.float32) for a, _ in pairs])  # (B, N, C)
            batch["grid2"] = torch.stack([torch.as_tensor(b, dtype=torch.float32) for _, b in pairs])
        return batch


class CaptionCollator:
    """Batches benchmark items for fine-tuning, validation and prediction.

    Args:
        tokenizer: the model's caption tokenizer.
        max_caption_len: most ids of a caption with [BOS]/[EOS].
        sample_reference: pick one reference caption per pair at random (training: every epoch sees a different
            one, drawn from torch's RNG so ``seed_everything`` and DataLoader worker seeding make it reproducible);
            when False the first reference is the target.

    Items need ``image1``, ``image2``, ``captions`` (list of str); optional ``id`` and ``change_type``. The batch has
    ``image1``, ``image2``, ``caption`` (B, T), ``references`` (list of lists), ``ids`` and ``change_types``.
    """

    def __init__(self, tokenizer: CaptionTokenizer, max_caption_len: int = 64, sample_reference: bool = True) -> None:
        self.tokenizer = tokenizer
        self.max_caption_len = max_caption_len
        self.sample_reference = sample_reference

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        caps = []
        for item in items:
            refs = item["captions"]
            if not refs:
                raise ValueError(f"pair {item.get('id')!r} has no reference caption")
            k = int(torch.randint(len(refs), ())) if self.sample_reference else 0
            caps.append(encode_caption(self.tokenizer, refs[k], self.max_caption_len))
        return {
            "image1": torch.stack([it["image1"] for it in items]),
            "image2": torch.stack([it["image2"] for it in items]),
            "caption": pad_sequences(caps, self.tokenizer.pad_id),
            "references": [list(it["captions"]) for it in items],
            "ids": [str(it.get("id", i)) for i, it in enumerate(items)],
            "change_types": [it.get("change_type") for it in items],
        }
