"""Caption tokenizers shared by NIM's text tower and the FDG decoder.

Two kinds, one interface (``pad_id``, ``bos_id``, ``eos_id``, ``mask_id``, ``vocab_size``, ``encode``, ``decode``,
``save``):

- :class:`ClipBPETokenizer`: open_clip's bundled byte-pair encoder (the vocabulary CLIP ViT-B/16 was trained with)
  plus one extra ``[MASK]`` id appended after CLIP's 49,408 entries (section 3.2.1, "denoised description").
- :class:`WordTokenizer`: a word-level vocabulary built from a corpus, for small CPU models and small benchmarks.

Either one is written next to a saved model (``tokenizer.json``) and read back by :func:`load_tokenizer`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from namc.jsonl import JSONError, loads
from namc.paths import contained

TOKENIZER_FILE = "tokenizer.json"
_BPE_FILE = "bpe_vocab.txt.gz"
_WORD_RE = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")
_NO_SPACE_BEFORE = {".", ",", "!", "?", ";", ":", ")", "'s"}


class CaptionTokenizer(Protocol):
    """What the model and the data pipeline need from a tokenizer."""

    kind: str  # "word" or "clip_bpe": NAMCConfig.tokenizer, and "type" in tokenizer.json
    pad_id: int
    bos_id: int
    eos_id: int
    mask_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, directory: str | Path) -> None: ...

    def to_dict(self) -> dict[str, Any]: ...


def _join_words(words: Iterable[str]) -> str:
    out = ""
    for w in words:
        out += w if (not out or w in _NO_SPACE_BEFORE) else " " + w
    return out


class WordTokenizer:
    """Lower-cased word-level tokenizer; punctuation marks are tokens of their own.

    Ids 0-4 are ``[PAD] [BOS] [EOS] [UNK] [MASK]``; words follow in order of decreasing corpus frequency (ties
    broken alphabetically, so a vocabulary built twice from the same texts is identical).
    """

    kind = "word"

    SPECIALS = ("[PAD]", "[BOS]", "[EOS]", "[UNK]", "[MASK]")
    pad_id, bos_id, eos_id, unk_id, mask_id = range(5)

    def __init__(self, words: Sequence[str]) -> None:
        if list(words[: len(self.SPECIALS)]) != list(self.SPECIALS):
            raise ValueError(f"a word vocabulary must start with {self.SPECIALS}")
        if len(set(words)) != len(words):
            raise ValueError("duplicate entries in the word vocabulary")
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}

    @staticmethod
    def split(text: str) -> list[str]:
        """Lower-case and split ``text`` into word and punctuation tokens."""
        return _WORD_RE.findall(text.lower())

    @classmethod
    def build(cls, texts: Iterable[str], min_freq: int = 1, max_size: int | None = None) -> WordTokenizer:
        """Build a vocabulary from ``texts``, keeping words seen at least ``min_freq`` times."""
        counts = Counter(w for t in texts for w in cls.split(t))
        kept = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        if max_size is not None:
            kept = kept[: max(0, max_size - len(cls.SPECIALS))]
        return cls([*cls.SPECIALS, *kept])

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(w, self.unk_id) for w in self.split(text)]

    def decode(self, ids: Sequence[int]) -> str:
        skip = {self.pad_id, self.bos_id, self.eos_id}
        return _join_words(self.words[i] for i in ids if int(i) not in skip)

    def to_dict(self) -> dict[str, Any]:
        """Plain data that :func:`tokenizer_from_dict` rebuilds this tokenizer from."""
        return {"type": self.kind, "words": list(self.words)}

    def save(self, directory: str | Path) -> None:
        path = Path(directory) / TOKENIZER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=0))


class ClipBPETokenizer:
    """open_clip's bundled CLIP BPE with ``[MASK]`` appended as id 49408 (``vocab_size`` 49409).

    [SOS] is 49406, [EOS] 49407 and padding 0, as in CLIP. Decoding drops padding, [SOS] and [EOS].
    """

    kind = "clip_bpe"

    def __init__(self, bpe_path: str | Path | None = None) -> None:
        from open_clip.tokenizer import SimpleTokenizer, default_bpe

        self.bpe_path = Path(bpe_path) if bpe_path is not None else Path(default_bpe())
        self._tok = SimpleTokenizer(str(self.bpe_path))
        self.bos_id = self._tok.sot_token_id
        self.eos_id = self._tok.eot_token_id
        self.pad_id = 0
        self.clip_vocab_size = len(self._tok.encoder)
        self.mask_id = self.clip_vocab_size
        self.vocab_size = self.clip_vocab_size + 1

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        words: list[str] = []
        run: list[int] = []
        for i in (int(i) for i in ids):
            if i in (self.pad_id, self.bos_id, self.eos_id):
                continue
            if i == self.mask_id:
                if run:
                    words.append(self._tok.decode(run).strip())
                    run = []
                words.append("[MASK]")
            else:
                run.append(i)
        if run:
            words.append(self._tok.decode(run).strip())
        return " ".join(w for w in words if w)

    def to_dict(self) -> dict[str, Any]:
        """Plain data that :func:`tokenizer_from_dict` rebuilds this tokenizer from (no copy of the BPE file)."""
        return {"type": self.kind, "vocab_size": self.vocab_size}

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / _BPE_FILE
        if not (target.exists() and os.path.samefile(self.bpe_path, target)):  # saved again into its own folder
            partial = directory / f".{_BPE_FILE}.partial"
            shutil.copyfile(self.bpe_path, partial)
            os.replace(partial, target)
        (directory / TOKENIZER_FILE).write_text(json.dumps({"type": "clip_bpe", "bpe": _BPE_FILE}))


def tokenizer_to_dict(tokenizer: CaptionTokenizer) -> dict[str, Any]:
    """Plain-data description of a tokenizer (what a Lightning checkpoint stores)."""
    to_dict = getattr(tokenizer, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"cannot store a tokenizer of type {type(tokenizer).__name__}: it has no to_dict()")
    return to_dict()


def tokenizer_from_dict(
    data: dict[str, Any], where: str = "checkpoint", directory: str | Path | None = None
) -> WordTokenizer | ClipBPETokenizer:
    """Rebuild a tokenizer from :func:`tokenizer_to_dict`'s data or a ``tokenizer.json``.

    Args:
        data: ``{"type": "word", "words": [...]}`` or ``{"type": "clip_bpe", ...}``.
        where: the file the data came from, for error messages.
        directory: the folder of a ``tokenizer.json`` whose ``bpe`` entry names a BPE file there; without it a
            CLIP BPE comes from open_clip's bundled vocabulary and its size is checked.

    Raises:
        ValueError: an unknown type, a malformed entry, or a ``bpe`` name that leaves ``directory`` (absolute,
            ``..``, a symlink out: :class:`namc.paths.PathEscapeError`); each message starts with ``where``.
    """
    kind = data.get("type")
    if kind == "word":
        words = data.get("words")
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ValueError(f"{where}: 'words' must be a list of strings")
        return WordTokenizer(words)
    if kind == "clip_bpe":
        if directory is not None and "bpe" in data:  # a file of the model folder: it may not point outside it
            return ClipBPETokenizer(contained(directory, data["bpe"], f"{where}: bpe"))
        tok = ClipBPETokenizer()
        if tok.vocab_size != data.get("vocab_size", tok.vocab_size):
            raise ValueError(f"{where}: CLIP BPE with {data['vocab_size']} ids, the installed one has {tok.vocab_size}")
        return tok
    raise ValueError(f"{where}: unknown tokenizer type {kind!r} (expected 'word' or 'clip_bpe')")


def same_tokenizer(a: CaptionTokenizer, b: CaptionTokenizer) -> bool:
    """Whether two tokenizers map text to the same ids."""
    return tokenizer_to_dict(a) == tokenizer_to_dict(b)


def load_tokenizer(directory: str | Path) -> WordTokenizer | ClipBPETokenizer:
    """Read the tokenizer saved in ``directory`` (``tokenizer.json``, through the bounded JSON reader).

    Raises:
        FileNotFoundError: no ``tokenizer.json`` there.
        ValueError: it is not UTF-8 or not JSON (too deep, too long, a duplicate key), or not a namc tokenizer; the
            message names the file.
    """
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {TOKENIZER_FILE} in {directory}: it is written by save_pretrained()")
    try:
        data = loads(path.read_bytes().decode("utf-8-sig"))
    except (UnicodeDecodeError, JSONError) as err:
        raise ValueError(f"{path}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a tokenizer object, got {type(data).__name__}")
    return tokenizer_from_dict(data, where=str(path), directory=directory)


def build_tokenizer(
    kind: str, texts: Iterable[str] | None = None, min_freq: int = 1
) -> WordTokenizer | ClipBPETokenizer:
    """A tokenizer by kind: ``"clip_bpe"`` (no texts needed) or ``"word"`` (built from ``texts``)."""
    if kind == "clip_bpe":
        return ClipBPETokenizer()
    if kind == "word":
        if texts is None:
            raise ValueError("a word tokenizer is built from texts: pass texts=")
        return WordTokenizer.build(texts, min_freq=min_freq)
    raise ValueError(f"unknown tokenizer kind {kind!r}: expected 'clip_bpe' or 'word'")
