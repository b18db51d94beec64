"""Running many chat requests into a :class:`~namc.llm.store.ResultStore`: bounded, resumable, counted.

:func:`run_jobs` pulls jobs from an iterator (so 770K pairs never sit in memory: at most ``2 * concurrency`` jobs
are queued), builds each job's messages in a worker thread (reading and base64-encoding images must not stall the
event loop), sends it through :class:`~namc.llm.client.LLMClient` and appends the result the moment it
arrives. Every input item ends in exactly one bucket of :class:`RunSummary`:

- ``resumed``: finished in an earlier run (skipped);
- ``ok``: answered (``retried_ok`` of them after at least one failed attempt);
- ``failed``: recorded in the store with its error, by kind (``rate_limit``/``server_error``/``timeout``/
  ``connection`` after ``max_attempts``, ``http_4xx``, ``bad_response``, ``too_long``, or bad input: ``missing_image``,
  ``corrupt_image``, ``oversized_image``, ``missing_field``, or ``bad_input`` for any other error while building
  the request);
- ``skipped``: input lines that are not items (``malformed_line``, ``duplicate_id``), by kind; not in the store.

so ``resumed + ok + failed + skipped`` equals the number of input lines (:meth:`RunSummary.check`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from namc.jsonl import loads
from namc.llm.client import ClientConfig, LLMClient, RequestFailed
from namc.llm.images import BadInput
from namc.llm.store import ResultStore

__all__ = ["Job", "RunSummary", "run_jobs"]

logger = logging.getLogger(__name__)


@dataclass
class Job:
    """One request to make.

    ``build()`` returns the chat messages (it reads images, so it runs in a worker thread) and may raise
    :class:`~namc.llm.images.BadInput`; ``fields`` are copied into the stored result, beside ``status``,
    ``text`` or ``error``.
    """

    id: str
    build: Callable[[], list[dict[str, Any]]]
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunSummary:
    """What one run did with every input line (see the module docstring)."""

    lines: int = 0
    resumed: int = 0
    ok: int = 0
    retried_ok: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    torn_bytes: int = 0
    corrupt_lines: int = 0
    seconds: float = 0.0

    def check(self) -> None:
        """Raises AssertionError unless every input line is in exactly one bucket."""
        total = self.resumed + self.ok + sum(self.failed.values()) + sum(self.skipped.values())
        if total != self.lines:
            raise AssertionError(f"summary does not add up: {total} outcomes for {self.lines} input lines")

    def to_dict(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "resumed": self.resumed,
            "ok": self.ok,
            "retried_ok": self.retried_ok,
            "failed": dict(self.failed),
            "skipped": dict(self.skipped),
            "retries": dict(self.retries),
            "attempts": self.attempts,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "torn_bytes": self.torn_bytes,
            "corrupt_lines": self.corrupt_lines,
            "seconds": round(self.seconds, 3),
        }

    def format(self) -> str:
        def kinds(c: Counter[str]) -> str:
            return " (" + ", ".join(f"{k}={v}" for k, v in sorted(c.items())) + ")" if c else ""

        rate = self.ok / self.seconds if self.seconds > 0 else 0.0
        return "\n".join(
            [
                f"{self.lines} input lines: {self.ok} answered ({self.retried_ok} after retries), "
                f"{sum(self.failed.values())} failed{kinds(self.failed)}, {self.resumed} done in an earlier run, "
                f"{sum(self.skipped.values())} skipped{kinds(self.skipped)}",
                f"{self.attempts} requests, {sum(self.retries.values())} retries{kinds(self.retries)}; tokens: "
                f"{self.prompt_tokens} prompt + {self.completion_tokens} completion; {self.seconds:.1f} s "
                f"({rate:.2f} answers/s)",
            ]
            + ([f"dropped a torn last line of {self.torn_bytes} bytes (killed run)"] if self.torn_bytes else [])
            + ([f"{self.corrupt_lines} corrupt result lines ignored (items redone)"] if self.corrupt_lines else [])
        )


async def _worker(
    queue: asyncio.Queue[Job | None],
    client: LLMClient,
    store: ResultStore,
    summary: RunSummary,
    bar: tqdm,
) -> None:
    while (job := await queue.get()) is not None:
        base = {store.id_field: job.id, **job.fields}
        try:
            try:
                messages = await asyncio.to_thread(job.build)
            except BadInput:
                raise
            except Exception as err:  # an unforeseen decoder error: this item fails, the run goes on
                raise BadInput("bad_input", f"{type(err).__name__}: {err}") from err
            done = await client.complete(messages)
        except BadInput as err:
            store.append({**base, "status": "failed", "error_kind": err.kind, "error": str(err), "attempts": 0})
            summary.failed[err.kind] += 1
        except RequestFailed as err:
            store.append(
                {**base, "status": "failed", "error_kind": err.kind, "error": err.message, "attempts": err.attempts}
            )
            summary.failed[err.kind] += 1
            summary.retries.update(err.retried)
        else:
            store.append(
                {
                    **base,
                    "status": "ok",
                    "text": done.text,
                    "model": client.config.model,
                    "attempts": done.attempts,
                    "finish_reason": done.finish_reason,
                    "usage": {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens},
                }
            )
            summary.ok += 1
            summary.retried_ok += done.attempts > 1
            summary.retries.update(done.retried)
            summary.prompt_tokens += done.prompt_tokens
            summary.completion_tokens += done.completion_tokens
        bar.update(1)


async def _run(
    jobs: Iterable[Job], store: ResultStore, config: ClientConfig, summary: RunSummary, bar: tqdm, seed: int | None
) -> None:
    async with LLMClient(config, seed=seed) as client:
        queue: asyncio.Queue[Job | None] = asyncio.Queue(maxsize=2 * config.concurrency)
        workers = [asyncio.create_task(_worker(queue, client, store, summary, bar)) for _ in range(config.concurrency)]

        async def feed() -> None:
            for job in jobs:  # the iterator counts resumed / skipped lines itself
                await queue.put(job)
            for _ in workers:
                await queue.put(None)

        tasks = [asyncio.create_task(feed()), *workers]
        try:
            # a worker that raises (the results file cannot be written: disk full) stops the whole run at once
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            summary.attempts = client.stats["attempts"]


def run_jobs(
    jobs: Iterable[Job],
    store: ResultStore,
    config: ClientConfig,
    summary: RunSummary,
    total: int | None = None,
    progress: bool = True,
    desc: str = "requests",
    seed: int | None = None,
) -> RunSummary:
    """Runs every job of ``jobs`` (an iterator that may also count resumed / skipped lines into ``summary`` and
    advance the bar through ``summary``'s owner) and returns ``summary`` filled in.

    Args:
        jobs: the requests still to make, streamed.
        store: the opened results store.
        config: client settings.
        summary: counts; ``lines``, ``resumed`` and ``skipped`` are the caller's, the rest is filled here.
        total: items to make requests for, for the progress bar's ETA (None: unknown).
        progress: show a tqdm bar (stderr) with rate and ETA.
        desc: the bar's label.
        seed: seeds the retry jitter.
    """
    start = time.perf_counter()
    summary.torn_bytes, summary.corrupt_lines = store.torn_bytes, store.corrupt_lines
    with tqdm(total=total, desc=desc, unit="req", disable=not progress, dynamic_ncols=True, smoothing=0.1) as bar:
        asyncio.run(_run(jobs, store, config, summary, bar, seed))
    summary.seconds = time.perf_counter() - start
    return summary


def read_jsonl_objects(
    path: Any, summary: RunSummary, id_field: str, seen: set[str] | None = None, unique: bool = True
) -> Iterable[tuple[int, dict[str, Any]]]:
    """``(line_number, object)`` of a JSONL input, counting lines that are not JSON objects with a string
    ``id_field`` as ``skipped["malformed_line"]`` (logged with the file and line) and, with ``unique``, later lines
    reusing an id as ``skipped["duplicate_id"]`` (``seen``: ids of earlier files, to keep ids unique across several);
    without it every line is yielded (a reader where the last line of an id wins)."""
    seen = set() if seen is None else seen
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            summary.lines += 1
            try:
                obj = loads(raw)  # bounded: depth, length, duplicate keys; a byte-order mark is dropped
                if not isinstance(obj, dict) or not isinstance(obj.get(id_field), str) or not obj[id_field].strip():
                    raise ValueError(f"not a JSON object with a string {id_field!r}")
            except ValueError as err:  # JSONError (not UTF-8, not JSON, too deep or long) is a ValueError
                summary.skipped["malformed_line"] += 1
                logger.warning("%s line %d: skipped: %s", path, number, str(err)[:200])
                continue
            if unique and obj[id_field] in seen:
                summary.skipped["duplicate_id"] += 1
                logger.warning("%s line %d: skipped: %s %r already seen", path, number, id_field, obj[id_field])
                continue
            seen.add(obj[id_field])
            yield number, obj
