"""The resumable multi-stage machinery of MED's steps (``namc curate edit``, ``namc curate questions``).

A step is a chain of stages over the items of one input JSONL. Each stage keeps its own append-only results store
(:class:`~namc.llm.ResultStore`, ``STAGE.jsonl``: one line per item it finished, written the moment the
result arrives), so a run killed at any moment loses at most the items in flight, and a rerun asks each stage only
for the items it has not finished. Stages run one after the other, each over every item that passed all earlier
stages.

What an item *is* at any time is a pure function of the input line and the stores: :func:`trace` replays the stored
results through each stage's ``accept`` (which parses an answer and returns the fields it adds, or raises
:class:`Rejected` with a counter key), and stops at the first stage that has no result for the item (pending), that
recorded a failure (rejected by the failure's kind: ``server_error``, ``missing_image``, ``unsupported_instruction``
...), or whose ``accept`` rejects it. So the outputs and the counts are rebuilt from the stores at the end of every
run: a resumed run writes byte for byte what an uninterrupted one writes, and changing a threshold (``accept``'s
business) needs no new request.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from namc.curate.edits.med_prompts import AnswerError
from namc.llm import ClientConfig, Job, ResultStore, RunSummary, run_jobs
from namc.llm.runner import logger as runner_logger
from namc.llm.runner import read_jsonl_objects
from namc.llm.store import last_results, read_at

__all__ = ["InputItems", "Outcome", "Rejected", "Stage", "StageBook", "StageRun", "funnel", "run_llm_stage", "trace"]

logger = logging.getLogger(__name__)

State = dict[str, Any]


class Rejected(Exception):
    """An item a stage does not pass on; ``reason`` is its counter key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


@dataclass(frozen=True)
class Stage:
    """One stage of a step.

    Attributes:
        name: the results file's stem and the summary's key.
        accept: ``(state, stored ok result) -> fields to add``; raises :class:`Rejected` or
            :class:`~namc.curate.edits.med_prompts.AnswerError` to stop the item here.
        messages: ``state -> chat messages`` for a stage that asks the LLM server (None: the step runs it itself).
        store: the store it reads (default ``name``): a filter over another stage's stored values (MED's CLIP
            similarity over the edit stage's records) is a stage of its own in the counts, without a file.
    """

    name: str
    accept: Callable[[State, dict[str, Any]], State]
    messages: Callable[[State], list[dict[str, Any]]] | None = None
    store: str | None = None

    @property
    def source(self) -> str:
        return self.store or self.name


@dataclass
class Outcome:
    """Where an item stands: ``status`` ``done`` (passed every stage), ``rejected`` or ``pending`` at ``stage``."""

    status: str
    stage: str | None
    state: State
    reason: str = ""
    detail: str = ""


class StageBook:
    """Read access to every stage's stored results: ``{id: byte offset of its last line}`` per store and one open
    file each, so a lookup reads one line and memory holds ids only."""

    def __init__(self, folder: Path, names: Sequence[str]) -> None:
        self.folder = folder
        self._index: dict[str, dict[str, int]] = {}
        self._files: dict[str, BinaryIO] = {}
        for name in names:
            self.refresh(name)

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.jsonl"

    def refresh(self, name: str) -> None:
        """Re-reads one store (after its stage ran)."""
        if name in self._files:
            self._files.pop(name).close()
        path = self.path(name)
        if not path.exists():
            self._index[name] = {}
            return
        self._index[name], _ = last_results(path)
        self._files[name] = open(path, "rb")  # noqa: SIM115 (closed by close() or refresh())

    def get(self, name: str, key: str) -> dict[str, Any] | None:
        offset = self._index.get(name, {}).get(key)
        return None if offset is None else read_at(self._files[name], offset)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> StageBook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def trace(state: State, key: str, stages: Sequence[Stage], book: StageBook, retry: str | None = None) -> Outcome:
    """Replays ``key``'s stored results through ``stages`` (see the module docstring).

    Args:
        state: the item's fields from the input line (copied, not changed).
        key: the item's id in the stores.
        stages: the step's stages, in order.
        book: the stores.
        retry: a stage whose recorded failures count as pending (``--retry-failed`` while that stage runs).
    """
    state = dict(state)
    for stage in stages:
        result = book.get(stage.source, key)
        if result is None or (result.get("status") != "ok" and stage.name == retry):
            return Outcome("pending", stage.name, state)
        if result.get("status") != "ok":
            kind = str(result.get("error_kind") or "failed")
            return Outcome("rejected", stage.name, state, kind, str(result.get("error") or ""))
        try:
            state.update(stage.accept(state, result))
        except (Rejected, AnswerError) as err:
            return Outcome("rejected", stage.name, state, err.reason, str(err))
    return Outcome("done", None, state)


@dataclass
class StageRun:
    """What one stage did in this run: items finished (``ok``, ``failed`` by kind) and the seconds it took."""

    items: int = 0
    ok: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        rate = self.items / self.seconds if self.seconds > 0 else None
        return {
            "items": self.items,
            "ok": self.ok,
            "failed": dict(self.failed),
            "seconds": round(self.seconds, 3),
            "items_per_s": rate,
            **self.extra,
        }


def pending_items(
    items: Callable[[], Iterator[tuple[str, State]]], stages: Sequence[Stage], index: int, book: StageBook, retry: bool
) -> Iterator[tuple[str, State]]:
    """The items whose trace stops, pending, at ``stages[index]``, with their states."""
    name = stages[index].name
    for key, state in items():
        out = trace(state, key, stages[: index + 1], book, retry=name if retry else None)
        if out.status == "pending" and out.stage == name:
            yield key, out.state


def run_llm_stage(
    items: Callable[[], Iterator[tuple[str, State]]],
    stages: Sequence[Stage],
    index: int,
    book: StageBook,
    config: ClientConfig,
    retry_failed: bool = False,
    progress: bool = True,
    seed: int | None = None,
) -> StageRun:
    """Sends every item pending at ``stages[index]`` to the server, appending each answer to the stage's store."""
    stage = stages[index]
    assert stage.messages is not None
    todo = sum(1 for _ in pending_items(items, stages, index, book, retry_failed))
    run = StageRun()
    if todo == 0:
        return run
    build = stage.messages

    def jobs() -> Iterator[Job]:
        for key, state in pending_items(items, stages, index, book, retry_failed):
            yield Job(key, lambda state=state: build(state), {"stage": stage.name})

    summary = RunSummary()
    started = time.perf_counter()
    with ResultStore(book.path(stage.name)) as store:
        if retry_failed:
            store.forget_failed()
        run_jobs(jobs(), store, config, summary, total=todo, progress=progress, desc=stage.name, seed=seed)
    book.refresh(stage.name)
    run.seconds = time.perf_counter() - started
    run.ok, run.failed = summary.ok, summary.failed
    run.items = summary.ok + sum(summary.failed.values())
    run.extra = {"retries": dict(summary.retries), "tokens": summary.prompt_tokens + summary.completion_tokens}
    return run


class InputItems:
    """The items of an input JSONL, read afresh on every call (a step walks its input once per stage, so nothing
    but ids is ever held): ``(id, convert(line object))``. Malformed lines and repeated ids are logged on the first
    walk only and counted into ``skipped`` by every complete walk.

    Args:
        path: the JSONL file.
        id_field: the key of an item.
        convert: the line object -> the item's state.
        limit: stop after this many items (a trial run).
    """

    def __init__(
        self, path: Path, id_field: str, convert: Callable[[str, dict[str, Any]], State], limit: int | None = None
    ) -> None:
        self.path, self.id_field, self.convert, self.limit = path, id_field, convert, limit
        self.skipped: Counter[str] = Counter()
        self._walks = 0

    def __call__(self) -> Iterator[tuple[str, State]]:
        summary = RunSummary()
        quiet = self._walks > 0
        self._walks += 1
        if quiet:
            runner_logger.addFilter(_drop)
        try:
            for n, (_, obj) in enumerate(read_jsonl_objects(self.path, summary, self.id_field)):
                if self.limit is not None and n >= self.limit:
                    return
                key = obj[self.id_field]
                yield key, self.convert(key, obj)
            self.skipped = Counter(summary.skipped)
        finally:
            if quiet:
                runner_logger.removeFilter(_drop)


def _drop(record: logging.LogRecord) -> bool:
    return False


def funnel(outcomes: Sequence[Outcome], stages: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per stage: items that reached it, that it passed on, rejected by reason, still pending."""
    out: dict[str, dict[str, Any]] = {s: {"in": 0, "kept": 0, "rejected": Counter(), "pending": 0} for s in stages}
    for o in outcomes:
        last = len(stages) if o.stage is None else stages.index(o.stage)
        for s in stages[:last]:
            out[s]["in"] += 1
            out[s]["kept"] += 1
        if o.stage is not None:
            out[o.stage]["in"] += 1
            if o.status == "rejected":
                out[o.stage]["rejected"][o.reason] += 1
            else:
                out[o.stage]["pending"] += 1
    return {s: {**v, "rejected": dict(sorted(v["rejected"].items()))} for s, v in out.items()}
