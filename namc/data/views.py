"""Training views of datasets, drawn without the global RNG so that workers, ranks and resuming do not change them.

- :class:`ReferencePicker`: each benchmark item keeps one reference caption, drawn from ``(seed, epoch, index)``.
- :class:`EvenStream`: every reader of a :class:`~namc.data.corpus.CorpusDataset` yields exactly the same number of
  samples (DDP would hang otherwise), with image-order swapping (appendix B.3) drawn from ``(seed, epoch, reader)``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Dataset, IterableDataset, get_worker_info

from namc.data.corpus import CorpusDataset

__all__ = ["EvenStream", "ReferencePicker", "swap_pair"]

logger = logging.getLogger(__name__)


class ReferencePicker(Dataset):
    """Training view of a benchmark: each item keeps one reference caption, drawn from ``(seed, epoch, index)``.

    The draw uses no global RNG, so it does not depend on DataLoader workers or on when Lightning creates the
    iterator, and a resumed run draws what an uninterrupted one does.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> dict[str, Any] | None:
        item = self.dataset[index]
        if item is None:
            return None
        refs = item["captions"]
        pick = random.Random(f"reference-{self.seed}-{self.epoch}-{index}").randrange(len(refs)) if refs else 0
        return {**item, "captions": refs[pick : pick + 1] or refs}


def swap_pair(item: dict[str, Any]) -> dict[str, Any]:
    """The pair with its two images (and everything attached to each) exchanged."""
    out = dict(item)
    for a, b in (("image1", "image2"), ("verb1", "verb2"), ("desc1", "desc2"), ("noise1", "noise2"),
                 ("codes1", "codes2")):  # fmt: skip
        out[a], out[b] = item.get(b), item.get(a)
    return out


class EvenStream(IterableDataset):
    """Yields exactly ``per_reader`` samples from every reader of a :class:`CorpusDataset`, optionally swapped.

    Every rank then runs the same number of steps (DDP would hang otherwise). A reader whose share runs short
    (skipped bad samples, or an uneven split) starts its share again and the repeats are logged. Image-order
    swapping (appendix B.3) is drawn here from ``(seed, epoch, reader)`` instead of the global RNG, so it does not
    depend on workers or on resuming.
    """

    def __init__(self, dataset: CorpusDataset, per_reader: int, workers: int, swap_prob: float = 0.0) -> None:
        super().__init__()
        self.dataset = dataset
        self.per_reader = per_reader
        self.workers = max(workers, 1)
        self.swap_prob = swap_prob

    def __len__(self) -> int:
        return self.per_reader * self.workers

    def __iter__(self) -> Iterator[dict[str, Any]]:
        n, repeats = 0, 0
        reader, _ = self.dataset.reader()
        rng = random.Random(f"swap-{self.dataset.seed}-{self.dataset.epoch}-{reader}")
        while n < self.per_reader:
            got = 0
            for item in self.dataset:
                yield swap_pair(item) if self.swap_prob > 0 and rng.random() < self.swap_prob else item
                n += 1
                got += 1
                if n >= self.per_reader:
                    break
            if got == 0:
                reader, readers = self.dataset.reader()
                raise RuntimeError(
                    f"corpus reader {reader} of {readers} got no samples: use more shards than ranks x workers "
                    "(or fewer DataLoader workers)"
                )
            if n < self.per_reader:
                repeats += 1
        if repeats:
            info = get_worker_info()
            logger.warning("corpus reader (worker %s) restarted its share %d time(s) to even out the ranks",
                           info.id if info else 0, repeats)  # fmt: skip

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)
