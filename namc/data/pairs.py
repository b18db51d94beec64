"""Image pairs listed in a text file: ``namc describe --pairs FILE`` and ``namc predict --data.init_args.predict_pairs
FILE``.

The list has one pair per line, the first ('before') image then the second, separated by a tab (paths may then hold
spaces) or by whitespace. Paths are relative to the list file's folder (or absolute); blank lines and comments are
skipped: a comment runs from a ``#`` at the start of a line or after whitespace to the end of the line, as in YAML,
so a ``#`` inside a name (``shot#1.png``) is part of the name. A UTF-8 byte-order mark at the start of the file is
dropped. A line that is not UTF-8 or does not hold two paths is an error naming the file and the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from namc.data.transforms import ImageTransform

__all__ = ["ListedPair", "PairListDataset", "read_pair_list"]

_COMMENT = re.compile(r"(?:^|(?<=\s))#")


@dataclass(frozen=True)
class ListedPair:
    """One line of a pair list: its number, the two paths as written and as resolved against the list's folder."""

    line: int
    written: tuple[str, str]
    first: Path
    second: Path

    @property
    def key(self) -> str:
        """``first.png|second.png``, the pair's id as written in the list."""
        return "|".join(self.written)


def read_pair_list(path: str | Path) -> list[ListedPair]:
    """The pairs a list file names (the format in the module docstring); the images are not opened.

    Raises:
        FileNotFoundError: the list file does not exist.
        ValueError: a line is not UTF-8 or does not hold two paths (the message names the file and the line), or
            the file lists no pair.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pair list not found: {path}")
    pairs = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a BOM from Windows editors is no path
            except UnicodeDecodeError:
                raise ValueError(f"{path}:{number}: not UTF-8 text") from None
            text = _COMMENT.split(line, maxsplit=1)[0].strip()
            if not text:
                continue
            fields = [f.strip() for f in text.split("\t")] if "\t" in text else text.split()
            if len(fields) != 2 or not all(fields):
                raise ValueError(f"{path}:{number}: expected two image paths, got {len(fields)} fields: {line!r}")
            pairs.append(ListedPair(number, (fields[0], fields[1]), path.parent / fields[0], path.parent / fields[1]))
    if not pairs:
        raise ValueError(f"{path}: no image pairs listed")
    return pairs


class PairListDataset(Dataset):
    """Image pairs listed in a text file (:func:`read_pair_list`), for prediction.

    A missing image is an error naming the file and the line before anything runs, and an unreadable one when it is
    read: prediction never drops a pair silently.

    Items: ``{"id": "first.png|second.png", "image1", "image2", "captions": [""], "change_type": None}``.
    """

    def __init__(self, path: str | Path, image_size: int | None = 224) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"predict_pairs file not found: {self.path}")
        self.transform = ImageTransform(image_size)
        self.pairs = read_pair_list(self.path)
        for pair in self.pairs:
            for p in (pair.first, pair.second):
                if not p.is_file():
                    raise FileNotFoundError(f"{self.path}:{pair.line}: image not found: {p}")

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, Any]:
        pair = self.pairs[index]
        try:
            image1, image2 = self.transform.load(pair.first), self.transform.load(pair.second)
        except (OSError, SyntaxError, ValueError) as err:
            raise OSError(f"{self.path}: pair {pair.key}: cannot read an image: {err}") from err
        return {"id": pair.key, "image1": image1, "image2": image2, "captions": [""], "change_type": None}
