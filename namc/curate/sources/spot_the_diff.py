"""Spot-the-Diff (Jhamtani & Berg-Kirkpatrick 2018): 8K real pairs with human difference sentences, already pairs.

``kind: spot_the_diff``; root = the dataset folder in its official layout, read through namc's benchmark loader
:class:`namc.data.idc.spot_the_diff.SpotTheDiff` (``annotations/{split}.json``, ``resized_images/{img_id}.png`` and
``{img_id}_2.png``; the layout is checked and documented there). ``splits`` (default ``[train]``: the val and test
pairs are the fine-tuning benchmark's, and pre-training on them would leak it). The loader's missing images and
items without sentences are counted into the index's issues. The sentences of a pair (several, one per difference)
are joined into one ``difference`` text, each ending with a full stop. Key ``std/<img_id>``.
"""

from __future__ import annotations

from collections.abc import Iterator

from namc.curate.sources.base import PairItem, SourceSpec, register_source
from namc.data.idc.spot_the_diff import SpotTheDiff
from namc.data.issues import DataIssues

__all__ = ["join_sentences", "read_spot_the_diff"]


def join_sentences(sentences: list[str]) -> str:
    """``["the car is gone", "a man appears."]`` -> ``"the car is gone. a man appears."``."""
    return " ".join(s if s.endswith((".", "!", "?")) else s + "." for s in (x.strip() for x in sentences) if s)


@register_source("spot_the_diff")
def read_spot_the_diff(spec: SourceSpec, issues: DataIssues) -> Iterator[PairItem]:
    """Pairs of Spot-the-Diff's ``splits`` (see the module docstring)."""
    splits = spec.options.get("splits", ["train"])
    if isinstance(splits, str):
        splits = [splits]
    for split in splits:
        ds = SpotTheDiff(spec.root, split, image_size=None)
        issues.merge(ds.issues)
        for item_id, p1, p2, captions, _ in ds.entries:
            yield PairItem(
                key=f"{spec.name}/{item_id}",
                ref1=str(p1.absolute()),
                ref2=str(p2.absolute()),
                difference=join_sentences(captions),
            )
