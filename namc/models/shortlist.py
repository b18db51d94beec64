"""Lexical shortlists: decoding restricted to the tokens a domain's captions use.

Dimension letters: b rows, D width, V vocabulary, S shortlist.

FDG projects every decoding step onto the whole vocabulary: CLIP's 49,409 BPE tokens for namc_base, the largest
product of a step (38M multiply-adds per row, 70% of the step's) and, at batch 1, the largest matrix read. A model
fine-tuned on one benchmark writes captions from a few hundred to a few thousand of those tokens (the ids of its
fine-tuning captions); the others never were a target there. A :class:`Shortlist` restricts greedy and beam
decoding to a set of ids, as Marian's lexical shortlists do for translation on CPUs: each step projects onto those
rows of the vocabulary matrix only, and the pick is mapped back to the full vocabulary. The rows are gathered once
per shortlist and matrix (for an int8 or bf16 inference copy, quantised or laid out once as the copy does the full
matrix, :mod:`namc.backends.step`) and kept while the matrix is unchanged.

What it gives: namc_base decodes over 3,000 of its 49,409 tokens 1.5-2.6x faster, with the same ids where the list
holds the whole vocabulary's picks (docs/performance.md). ``namc benchmark --shortlist N`` gives the CLIP4IDC peer
the same list.

What it changes: greedy decoding gives the full vocabulary's ids wherever every step's top token is in the list. In
int8 the kept rows' logits are the full projection's to the bit (the weights' codes have one scale per row and the
activations' one scale per call); in fp32 and bf16 a product over fewer rows may round its last bit differently. Beam
search ranks hypotheses by log-probabilities normalised over the list, not over the full vocabulary (which would need
the full projection). [EOS] is always in the list.

A fine-tuned model keeps its list: :class:`~namc.lit.finetune.FinetuneModule` sets ``model.training_shortlist`` to
the tokens of the benchmark's training captions, Lightning checkpoints carry it and ``save_pretrained`` writes it to
:data:`SHORTLIST_FILE` (UTF-8 JSON ``{"format": "namc-shortlist/1", "vocab_size": V, "ids": [...]}``, recorded in
``config.json`` with its SHA-256 like the weights). Decoding never uses it unasked: ``generate(...,
vocabulary=model.training_shortlist)``, ``namc describe --shortlist``, ``FinetuneModule(inference_shortlist=True)``.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from namc.models.files import ConfigError, atomic_write_text, read_json

__all__ = ["SHORTLIST_FILE", "Shortlist", "greedy_ids", "load_shortlist", "save_shortlist"]

SHORTLIST_FILE = "shortlist.json"  # a fine-tuned model's training-caption tokens (save_pretrained)
_FORMAT = "namc-shortlist/1"


class Shortlist:
    """The token ids a generation may produce: sorted, unique, [EOS] included.

    Build one per domain and reuse it: it keeps the gathered (and quantised or laid-out) vocabulary rows of the
    matrices it was used with.

    Args:
        ids: token ids (any iterable of ints or a 1-D integer tensor).
        vocab_size: the size of the full vocabulary (every id must be below it).
        eos_id: the [EOS] id, added to the list (a negative id adds nothing).
    """

    _KEEP = 3  # prepared vocabulary heads kept (one per precision, say)

    def __init__(self, ids: Iterable[int] | torch.Tensor, vocab_size: int, eos_id: int) -> None:
        t = ids.detach().cpu() if isinstance(ids, torch.Tensor) else torch.tensor(list(ids), dtype=torch.long)
        if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(f"a shortlist takes 1-D integer token ids, got {t.dtype} of shape {tuple(t.shape)}")
        if eos_id >= 0:
            t = torch.cat([t.long(), torch.tensor([eos_id])])
        if t.numel() == 0:
            raise ValueError("a shortlist needs at least one token id")
        bad = t[(t < 0) | (t >= vocab_size)]
        if bad.numel():
            raise ValueError(f"shortlist id {int(bad[0])} is outside the vocabulary [0, {vocab_size})")
        self.ids = torch.unique(t.long())  # sorted
        self.vocab_size, self.eos_id = vocab_size, eos_id
        self._on: dict[torch.device, torch.Tensor] = {}
        self._heads: list[tuple[tuple, tuple]] = []  # (key: weak references to the entry and matrix, ...; head)

    @classmethod
    def from_captions(cls, captions: Iterable[str], tokenizer) -> Shortlist:
        """The tokens of ``captions`` under ``tokenizer`` (a model's :class:`~namc.text.tokenizer.CaptionTokenizer`),
        e.g. a benchmark's training captions, plus [EOS]."""
        ids: set[int] = set()
        for caption in set(captions):  # a benchmark's captions repeat (templates): each distinct one once
            ids.update(tokenizer.encode(caption))
        if not ids:
            raise ValueError("no tokens in the captions given for the shortlist")
        return cls(sorted(ids), tokenizer.vocab_size, tokenizer.eos_id)

    def __deepcopy__(self, memo: dict) -> Shortlist:
        return self  # immutable ids; its prepared heads are keyed by the matrices they came from: copies share it

    def __getstate__(self) -> dict[str, Any]:  # pickled (a process spawned with the model): the ids only
        return {**self.__dict__, "_on": {}, "_heads": []}

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``format``, ``vocab_size``, ``ids``): :data:`SHORTLIST_FILE`'s content and a checkpoint's."""
        return {"format": _FORMAT, "vocab_size": self.vocab_size, "ids": self.ids.tolist()}

    @classmethod
    def from_dict(cls, data: Any, tokenizer, source: str) -> Shortlist:
        """The list :meth:`to_dict` wrote, for a model with ``tokenizer``; ValueError naming ``source`` when it is
        not one, or was made for another vocabulary."""
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f'{source}: not a namc shortlist (want {{"format": "{_FORMAT}", ...}})')
        ids, size = data.get("ids"), data.get("vocab_size")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"{source}: 'ids' must be a list of integer token ids")
        if size != tokenizer.vocab_size:
            raise ValueError(f"{source}: made for a vocabulary of {size} ids; this model's has {tokenizer.vocab_size}")
        try:
            return cls(ids, size, tokenizer.eos_id)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None

    def fits(self, vocab_size: int) -> Shortlist:
        """This list, checked against a model's vocabulary size (ValueError naming both where it was built for
        another: it would index rows that are not there, or decode other tokens). [EOS] is not compared: a
        benchmark decodes with it switched off."""
        if self.vocab_size != vocab_size:
            raise ValueError(
                f"the shortlist was built for a vocabulary of {self.vocab_size} ids, this model's has {vocab_size}: "
                "build it with this model's shortlist()"
            )
        return self

    def __len__(self) -> int:
        return self.ids.numel()

    def __repr__(self) -> str:
        return f"Shortlist({len(self)} of {self.vocab_size} tokens)"

    def index(self, device: torch.device) -> torch.Tensor:
        """The (S,) ids on ``device``."""
        if device not in self._on:
            self._on[device] = self.ids.to(device)
        return self._on[device]

    def columns(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V) logits of the whole vocabulary -> the (..., S) of the list's tokens."""
        return logits.index_select(-1, self.index(logits.device))

    def to_vocabulary(self, picks: torch.Tensor) -> torch.Tensor:
        """Positions in the shortlist -> ids of the full vocabulary."""
        return self.index(picks.device)[picks]

    def head(self, entry: tuple, weight: torch.Tensor, form: Callable[[torch.Tensor], tuple] | None = None) -> tuple:
        """A decoding step's vocabulary entry (no bias) restricted to the list: ``form`` of the gathered (S, D) rows
        (default ``(rows in the entry's dtype, None)``); ``entry``: the full matrix's entry, whose first item is the
        matrix in the form a runtime keeps it (:mod:`namc.backends.step`); ``weight``: the (V, D) matrix it was made
        from (FDG's tied embedding or ``lm_head``). Kept while ``entry`` and ``weight`` are the same and unchanged."""
        try:
            version = weight._version
        except RuntimeError:  # an inference tensor keeps no version counter: a change in place goes unseen
            version = -1
        for (entry_ref, weight_ref, *rest), head in self._heads:
            if entry_ref() is entry[0] and weight_ref() is weight and rest == [version, weight.device]:
                return head
        rows = weight.detach().index_select(0, self.index(weight.device))  # (S, D)
        head = form(rows) if form is not None else (rows.to(entry[0].dtype), None)
        # weak references: a list outliving an inference copy keeps none of the copy's matrices alive
        key = (weakref.ref(entry[0]), weakref.ref(weight), version, weight.device)
        self._heads = [(key, head), *self._heads][: self._KEEP]
        return head


def greedy_ids(logits: torch.Tensor, shortlist: Shortlist | None = None) -> torch.Tensor:
    """The greedy pick of (b, V) logits, or of (b, S) logits over ``shortlist``, as (b,) vocabulary ids: the first
    index of each row's largest value (a NaN counting as the largest), ``argmax``'s rule."""
    picks = logits.max(dim=-1).indices
    return picks if shortlist is None else shortlist.to_vocabulary(picks)


def save_shortlist(shortlist: Shortlist | None, directory: Path) -> str | None:
    """Write ``shortlist`` to ``directory`` / :data:`SHORTLIST_FILE` and return the file's name; None removes a
    stale file an earlier save left there and returns None."""
    path = directory / SHORTLIST_FILE
    if shortlist is None:
        path.unlink(missing_ok=True)
        return None
    atomic_write_text(path, json.dumps(shortlist.to_dict()) + "\n")
    return SHORTLIST_FILE


def load_shortlist(directory: Path, tokenizer) -> Shortlist | None:
    """The list :func:`save_shortlist` wrote to ``directory`` for a model with ``tokenizer``, or None.

    Raises:
        ConfigError: the file is not UTF-8 JSON, not a namc shortlist, or does not fit the tokenizer.
    """
    path = directory / SHORTLIST_FILE
    if not path.is_file():
        return None
    try:
        return Shortlist.from_dict(read_json(path), tokenizer, str(path))
    except ValueError as err:
        raise ConfigError(str(err)) from None
