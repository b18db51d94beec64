"""Default vocabularies: the words a ``word``-tokenizer preset starts from when it is given no tokenizer; and the
captions file a vocabulary shortlist is read from (``namc describe --vocabulary``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["default_word_texts", "read_captions"]

_COLORS = "gray red blue green brown purple cyan yellow"
_WORDS = (
    "the difference between the two images is that first image shows, while second image shows. "
    "a an small large tiny big rubber metal matte shiny metallic cube sphere cylinder block ball object thing "
    f"{_COLORS} left right of behind in front next to near and with on has been changed its color to "
    "newly placed added removed missing disappeared moved location position there is no change was made "
    "scene remains same nothing someone changed"
)


def default_word_texts() -> list[str]:
    """Texts a default word vocabulary is built from when a ``word`` preset gets no tokenizer.

    It covers the template and CLEVR-style change captions; build a real one with ``WordTokenizer.build(corpus)``.
    """
    return [_WORDS]


def read_captions(path: str | Path) -> list[str]:
    """The non-blank lines of a UTF-8 text file (one caption per line), e.g. for :meth:`NAMC.shortlist
    <namc.models.namc.NAMC.shortlist>`; a missing file or a line that is not UTF-8 names the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"captions file not found: {path}")
    lines = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise ValueError(f"{path}: line {number} is not UTF-8 text") from None
            if line:
                lines.append(line)
    if not lines:
        raise ValueError(f"{path}: no captions (every line is blank)")
    return lines
