"""Counting bad input that a data pipeline skips, across DataLoader workers and DDP ranks.

A long run must neither crash on one corrupt file nor lose samples silently: every skipped
sample is counted here by kind, the first few of each kind are logged with the file and line, and
:meth:`DataIssues.summary` reports the totals at the end. Code that finds a bad sample raises :class:`RecordError`
with its :class:`IssueKind`; the reader catches it and counts it here.

DataLoader workers are separate processes, so plain counters would stay in the workers. The counts live in a small
shared-memory tensor with one row per process (row 0: the process that built the dataset; row ``1 + worker_id``:
each worker), so no two processes ever write the same cell and no lock is needed. The tensor reaches the workers by
fork inheritance or by torch's shared-memory pickling (spawn/forkserver); plain ``pickle``/``deepcopy`` copies it.
Under DDP, :meth:`DataIssues.reduce` sums the counts over ranks.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

from namc.data.errors import IssueKind, RecordError

__all__ = ["DataIssues", "IssueKind", "RecordError"]

logger = logging.getLogger(__name__)


_KINDS = list(IssueKind)
_OK = len(_KINDS)  # column of accepted samples


class DataIssues:
    """Counts skipped (and accepted) samples by :class:`IssueKind`.

    Args:
        name: what is being read, used in log lines and the summary.
        max_workers: DataLoader workers that get their own row; a worker beyond that counts into a local copy and
            warns once (its counts then stay in that worker and are logged there).
        max_examples: how many issues of each kind are logged at WARNING level (and kept for the summary) per process.
    """

    def __init__(self, name: str = "data", max_workers: int = 64, max_examples: int = 5) -> None:
        self.name = name
        self.max_examples = max_examples
        self._counts = torch.zeros(max_workers + 1, len(_KINDS) + 1, dtype=torch.int64).share_memory_()
        self._examples: dict[str, list[str]] = {}
        self._overflow_warned = False

    def _row(self) -> torch.Tensor:
        info = get_worker_info()
        if info is None:
            return self._counts[0]
        row = info.id + 1
        if row >= self._counts.shape[0]:
            if not self._overflow_warned:
                logger.warning(
                    "%s: worker %d has no shared counter row; its issues are only logged", self.name, info.id
                )
                self._overflow_warned = True
                self._counts = self._counts.clone()
            return self._counts[0]
        return self._counts[row]

    def add(self, kind: IssueKind | str, where: str, detail: str = "", n: int = 1) -> None:
        """Counts ``n`` skipped samples (one by default) of one kind at one place.

        Args:
            kind: the :class:`IssueKind` (or its value).
            where: file and line / entry / key, e.g. ``"manifest.jsonl:17"``.
            detail: the error message.
            n: how many samples this issue lost; 0 records (and logs) damage that lost no sample.
        """
        kind = IssueKind(kind)
        self._row()[_KINDS.index(kind)] += n
        examples = self._examples.setdefault(kind.value, [])
        message = f"{where}: {detail}" if detail else where
        if len(examples) < self.max_examples:
            examples.append(message)
            logger.warning("%s: skipped (%s) %s", self.name, kind.value, message)
        else:
            logger.debug("%s: skipped (%s) %s", self.name, kind.value, message)

    def add_ok(self, n: int = 1) -> None:
        """Counts ``n`` accepted samples."""
        self._row()[_OK] += n

    def reset(self) -> None:
        """Zeroes all counts (e.g. at the start of an epoch)."""
        self._counts.zero_()
        self._examples.clear()

    def _totals(self) -> torch.Tensor:
        return self._counts.sum(dim=0)  # (kinds + 1,)

    @property
    def counts(self) -> dict[str, int]:
        """Skipped samples by kind (kinds with a zero count omitted)."""
        totals = self._totals().tolist()
        return {k.value: int(totals[i]) for i, k in enumerate(_KINDS) if totals[i]}

    @property
    def ok(self) -> int:
        return int(self._totals()[_OK])

    @property
    def skipped(self) -> int:
        return int(self._totals()[:_OK].sum())

    @property
    def seen(self) -> int:
        return self.ok + self.skipped

    @property
    def skip_rate(self) -> float:
        return self.skipped / self.seen if self.seen else 0.0

    @property
    def examples(self) -> dict[str, list[str]]:
        """The first issues of each kind recorded in this process."""
        return {k: list(v) for k, v in self._examples.items()}

    def summary(self) -> str:
        """One line of totals plus one line per kind with its first examples, e.g.
        ``"corpus: skipped 2 of 200 samples (1.00%): corrupt_image=2"``."""
        head = f"{self.name}: skipped {self.skipped} of {self.seen} samples ({100 * self.skip_rate:.2f}%)"
        if not self.skipped and not self._examples:
            return head
        lines = [head + ": " + ", ".join(f"{k}={v}" for k, v in self.counts.items())] if self.skipped else [head]
        for kind, examples in self._examples.items():
            for e in examples:
                lines.append(f"  {kind}: {e}")
        return "\n".join(lines)

    def reduce(self) -> DataIssues:
        """A copy whose counts are summed over DDP ranks (the local counts when torch.distributed is not initialised).

        Every rank must call it (it is a collective).
        """
        totals = self._totals().clone()
        if dist.is_available() and dist.is_initialized():
            device = torch.device("cpu")
            if dist.get_backend() == "nccl":
                device = torch.device("cuda", torch.cuda.current_device())
            totals = totals.to(device)
            dist.all_reduce(totals, op=dist.ReduceOp.SUM)
            totals = totals.cpu()
        out = DataIssues(self.name, max_workers=0, max_examples=self.max_examples)
        out._counts[0] = totals
        out._examples = {k: list(v) for k, v in self._examples.items()}
        return out

    def merge(self, other: DataIssues) -> None:
        """Adds another counter's totals and examples into this one (row 0)."""
        self._counts[0] += other._totals()
        for k, v in other._examples.items():
            mine = self._examples.setdefault(k, [])
            mine.extend(v[: max(0, self.max_examples - len(mine))])

    def __repr__(self) -> str:
        return f"DataIssues(name={self.name!r}, ok={self.ok}, skipped={self.counts})"
