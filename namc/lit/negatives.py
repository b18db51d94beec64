"""The candidate negatives of preference fine-tuning: for each training pair, K captions that are not its positives.

Dimension letters: B pairs, K candidates per pair, T caption ids.

Two sources (ADPO section 4.2; issue 18):

- ``captions``: other captions of the training set, drawn uniformly from the de-duplicated pool (the paper's random
  candidate set of size |N|, drawn "from the dataset prior to calculating the logits");
- ``counterfactuals``: rule-made edits of the pair's own captions (:mod:`namc.data.synthetic.counterfactuals`:
  a colour, shape, material or size word, the direction of the change, or its type), the hard negatives that a
  retriever over real captions can only approximate. A pair without any (a "no change" pair) falls back to
  ``captions``.

``both`` puts up to K/2 counterfactuals first and fills the set with captions. Positives (every reference caption
of the pair, compared as lower-cased, whitespace-normalised text; for a "no change" pair, every "no change" caption of
the split) are never candidates. All draws come from the
``torch.Generator`` passed in, so a run is reproducible and a resumed one draws the same sets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from namc.data.collate import encode_caption, pad_sequences
from namc.data.synthetic.counterfactuals import counterfactuals
from namc.text.tokenizer import CaptionTokenizer

__all__ = ["CANDIDATE_SOURCES", "NegativePool"]

CANDIDATE_SOURCES = ("captions", "counterfactuals", "both")


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


class NegativePool:
    """Candidate sets of negatives for the pairs of a training split.

    Args:
        positives: pair id -> all of its reference captions (the training split's annotations).
        tokenizer: the captioner's tokenizer.
        max_caption_len: most ids of a caption with [BOS]/[EOS].
        source: ``captions``, ``counterfactuals`` or ``both``.
        num_candidates: K, the size of each pair's set (ADPO's |N|; 128 was best).
        interchangeable: ids of pairs whose captions are true of each other (CLEVR-Change's distractor pairs: any
            "no change" caption describes every one of them): each such pair takes all of their captions as its
            positives, so "nothing has changed" is never the negative of a pair annotated "no change was made".
    """

    def __init__(
        self,
        positives: Mapping[str, Sequence[str]],
        tokenizer: CaptionTokenizer,
        max_caption_len: int,
        source: str = "both",
        num_candidates: int = 128,
        interchangeable: Sequence[str] = (),
    ) -> None:
        if source not in CANDIDATE_SOURCES:
            raise ValueError(f"unknown candidate source {source!r}; choose from {CANDIDATE_SOURCES}")
        if num_candidates < 1:
            raise ValueError("num_candidates must be at least 1")
        self.tokenizer = tokenizer
        self.max_caption_len = max_caption_len
        self.source = source
        self.num_candidates = num_candidates
        self.positives = {k: list(v) for k, v in positives.items()}
        shared = list(dict.fromkeys(c for k in interchangeable for c in self.positives.get(k, [])))
        for k in interchangeable:
            if k in self.positives:
                self.positives[k] = shared
        texts: dict[str, int] = {}
        for caps in self.positives.values():
            for c in caps:
                texts.setdefault(_norm(c), len(texts))
        self.texts = list(texts)
        self.ids = [encode_caption(tokenizer, t, max_caption_len) for t in self.texts]
        self._pos_index = {k: sorted({texts[_norm(c)] for c in caps}) for k, caps in self.positives.items()}
        self._cf: dict[str, list[list[int]]] = {}
        if len(self.texts) < 2:
            raise ValueError("the training split needs at least two distinct captions to draw negatives from")

    def counterfactual_ids(self, pair_id: str) -> list[list[int]]:
        """Token ids of the rule-made counterfactuals of every caption of ``pair_id`` (computed once)."""
        if pair_id not in self._cf:
            caps = self.positives[pair_id]
            seen: set[str] = set()
            out = []
            for c in caps:
                for _, text in counterfactuals(c, caps):
                    key = _norm(text)
                    if key not in seen:
                        seen.add(key)
                        out.append(encode_caption(self.tokenizer, text, self.max_caption_len))
            self._cf[pair_id] = out
        return self._cf[pair_id]

    def _random_captions(self, pair_id: str, n: int, generator: torch.Generator) -> list[int]:
        """``n`` pool indices drawn uniformly (with replacement) among the captions that are not positives."""
        skip = self._pos_index.get(pair_id, [])
        free = len(self.texts) - len(skip)
        if free <= 0:
            raise ValueError(f"pair {pair_id!r}: every caption of the training set is one of its positives")
        draws = torch.randint(free, (n,), generator=generator).tolist()
        out = []
        for r in draws:  # the r-th non-positive index: step over the sorted positives at or below it
            for p in skip:
                if r >= p:
                    r += 1
            out.append(r)
        return out

    def candidates(
        self, pair_ids: Sequence[str], generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The candidate sets of a batch.

        Args:
            pair_ids: (B,) ids of the training pairs.
            generator: a CPU generator for the draws.

        Returns:
            ``(ids, valid, counterfactual)``: (B, K, T) candidate ids (padded), (B, K) bool slots that hold a
            candidate, and (B, K) bool slots that hold a rule-made counterfactual.
        """
        K = self.num_candidates
        rows: list[list[int]] = []
        valid, is_cf = torch.zeros(len(pair_ids), K, dtype=torch.bool), torch.zeros(len(pair_ids), K, dtype=torch.bool)
        for b, pid in enumerate(pair_ids):
            if pid not in self.positives:
                raise KeyError(f"pair {pid!r} is not in the training split the negative pool was built from")
            chosen: list[list[int]] = []
            if self.source != "captions":
                cf = self.counterfactual_ids(pid)
                limit = K if self.source == "counterfactuals" else K // 2
                if len(cf) > limit:
                    order = torch.randperm(len(cf), generator=generator)[:limit].tolist()
                    cf = [cf[i] for i in order]
                chosen = list(cf)
            is_cf[b, : len(chosen)] = True
            if self.source == "both" or not chosen:
                chosen += [self.ids[i] for i in self._random_captions(pid, K - len(chosen), generator)]
            valid[b, : len(chosen)] = True
            rows += chosen + [[self.tokenizer.pad_id]] * (K - len(chosen))
        ids = pad_sequences(rows, self.tokenizer.pad_id).view(len(pair_ids), K, -1)  # (B, K, T)
        return ids, valid, is_cf
