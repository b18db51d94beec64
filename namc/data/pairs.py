"""Image pairs listed in a text file, for prediction (``namc predict --data.init_args.predict_pairs FILE``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from namc.data.transforms import ImageTransform

__all__ = ["PairListDataset"]


class PairListDataset(Dataset):
    """Image pairs listed in a text file, for prediction: ``first.png second.png`` per line.

    Paths are relative to the list file's folder; blank lines and ``#`` comments are skipped. A malformed line or a
    missing image is an error naming the file and the line (prediction never drops a pair silently).

    Items: ``{"id": "first.png|second.png", "image1", "image2", "captions": [""], "change_type": None}``.
    """

    def __init__(self, path: str | Path, image_size: int | None = 224) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"predict_pairs file not found: {self.path}")
        self.transform = ImageTransform(image_size)
        self.pairs: list[tuple[str, Path, Path]] = []
        for line_no, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            fields = text.split()
            if len(fields) != 2:
                raise ValueError(f"{self.path}:{line_no}: expected two image paths, got {len(fields)} fields: {line!r}")
            paths = [(self.path.parent / f) for f in fields]
            for p in paths:
                if not p.is_file():
                    raise FileNotFoundError(f"{self.path}:{line_no}: image not found: {p}")
            self.pairs.append((f"{fields[0]}|{fields[1]}", paths[0], paths[1]))
        if not self.pairs:
            raise ValueError(f"{self.path}: no image pairs listed")

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, Any]:
        key, p1, p2 = self.pairs[index]
        try:
            image1, image2 = self.transform.load(p1), self.transform.load(p2)
        except (OSError, SyntaxError, ValueError) as err:
            raise OSError(f"{self.path}: pair {key}: cannot read an image: {err}") from err
        return {"id": key, "image1": image1, "image2": image2, "captions": [""], "change_type": None}
