"""Default vocabularies: the words a ``word``-tokenizer preset starts from when it is given no tokenizer."""

from __future__ import annotations

__all__ = ["default_word_texts"]

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
