"""An async chat-completions client over the official ``openai`` package, with retries we count ourselves.

Any OpenAI-compatible endpoint works: vLLM (``vllm serve Qwen/Qwen2-VL-7B-Instruct`` serves the paper's model at
``http://HOST:8000/v1``), SGLang, llama.cpp's server, or the OpenAI API itself. The openai client's own retries are
off (``max_retries=0``): :meth:`LLMClient.complete` retries here, so every attempt and its outcome is counted.

Outcomes of one request (the documented behaviour that the tests check):

======================  ==========================================================================================
what happened           what :meth:`LLMClient.complete` does
======================  ==========================================================================================
HTTP 200                returns a :class:`Completion` (an empty message is a completion too: the filter rejects
                        it as ``empty``; the server would answer the same at temperature 0)
HTTP 429                retries after ``max(Retry-After, backoff)``; counted as ``rate_limit``
HTTP 5xx                retries after the backoff; counted as ``server_error``
timeout                 retries; counted as ``timeout``. ``timeout`` seconds is a deadline for the whole answer
                        (connect, headers and body), not a per-read limit: a server that drips one byte a
                        second is cut off at the deadline like one that never answers
dropped connection      retries (connection refused/reset, server closed without answering); ``connection``
other HTTP 4xx          no retry (a bad request stays bad): raises :class:`RequestFailed` (``http_4xx``)
malformed 200 body      no retry: raises :class:`RequestFailed` (``bad_response``)
answer over a cap       no retry (at temperature 0 the server answers the same): raises :class:`RequestFailed`
                        (``too_long``): a body over ``max_response_bytes`` (reading stops there, nothing more is
                        buffered) or a message over ``max_answer_chars`` characters
======================  ==========================================================================================

Every request carries ``max_tokens``, the server-side cap on the answer; the two caps above are the client's own
bounds for a server that ignores it.

After ``max_attempts`` attempts a retryable failure raises :class:`RequestFailed` with the last error.

Backoff is exponential with full jitter: attempt ``k`` (0-based) waits ``uniform(0, min(backoff_max,
backoff_base * 2**k))``, and at least the server's ``Retry-After`` (capped at ``backoff_max``). ``rpm`` spaces
request starts at least ``60 / rpm`` seconds apart across all concurrent callers (a retry is a request too).
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import openai

from namc.jsonl import JSONError, loads

__all__ = ["ClientConfig", "Completion", "LLMClient", "RateLimiter", "RequestFailed", "backoff_delay"]

#: failure kinds that are retried
RETRYABLE = ("rate_limit", "server_error", "timeout", "connection")


@dataclass
class ClientConfig:
    """Settings of :class:`LLMClient` (every ``namc curate`` step that talks to a server exposes them as options).

    ``api_key_env`` names the environment variable that holds the key: keys never come from files or flags. A local
    server (vLLM without ``--api-key``) needs none; the placeholder ``"EMPTY"`` is sent then, as vLLM's docs do.
    """

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "Qwen/Qwen2-VL-7B-Instruct"
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 16
    timeout: float = 120.0
    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    rpm: float | None = None
    max_tokens: int = 512
    temperature: float = 0.0
    seed: int | None = 0
    max_answer_chars: int = 8192  # a 512-token answer is ~2,000 characters; a longer one ignored max_tokens
    max_response_bytes: int = 1 << 20  # the JSON body of the longest accepted answer, escapes included, is far less

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.max_attempts < 1:
            raise ValueError("concurrency and max_attempts must be >= 1")
        if self.max_tokens < 1 or self.max_answer_chars < 1 or self.max_response_bytes < 1:
            raise ValueError("max_tokens, max_answer_chars and max_response_bytes must be >= 1")
        if self.timeout <= 0 or self.backoff_base < 0 or self.backoff_max < 0:
            raise ValueError("timeout must be > 0 and the backoff times >= 0")
        if self.rpm is not None and self.rpm <= 0:
            raise ValueError("rpm must be > 0 (or None for no limit)")


@dataclass
class Completion:
    """One successful answer: its text, token usage and the attempts it took (failures before it by kind)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    attempts: int
    retried: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None


class RequestFailed(Exception):
    """A request that ended without an answer: ``kind`` (``rate_limit``, ``timeout``, ``http_4xx`` ...), the last
    error's message, the attempts made and the failures by kind."""

    def __init__(self, kind: str, message: str, attempts: int, retried: dict[str, int]) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.attempts, self.retried = kind, message, attempts, retried


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random, retry_after: float | None = None) -> float:
    """Seconds to wait before retry ``attempt + 1``: full jitter over ``min(cap, base * 2**attempt)``, at least the
    server's Retry-After (capped at ``cap``)."""
    delay = rng.uniform(0.0, min(cap, base * (2.0**attempt)))
    if retry_after is not None:
        delay = max(delay, min(cap, retry_after))
    return delay


def _retry_after(err: openai.APIStatusError) -> float | None:
    value = err.response.headers.get("retry-after") if err.response is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # an HTTP date
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def classify(err: BaseException) -> tuple[str, float | None]:
    """``(kind, retry_after)`` of an exception raised by the openai client."""
    if isinstance(err, openai.APITimeoutError):  # a subclass of APIConnectionError: test it first
        return "timeout", None
    if isinstance(err, openai.APIConnectionError):
        return "connection", None
    if isinstance(err, openai.APIStatusError):
        if err.status_code == 429:
            return "rate_limit", _retry_after(err)
        if err.status_code >= 500:
            return "server_error", _retry_after(err)
        return "http_4xx", None
    return "bad_response", None


class RateLimiter:
    """Spaces request starts ``60 / rpm`` seconds apart (``rpm=None``: no limit). Shared by all callers."""

    def __init__(self, rpm: float | None) -> None:
        self.interval = 60.0 / rpm if rpm else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()

    def reserve(self, now: float) -> float:
        """Claims the next start slot at or after ``now``; returns how long to wait for it."""
        start = max(now, self._next)
        self._next = start + self.interval
        return start - now

    async def wait(self) -> None:
        if not self.interval:
            return
        async with self._lock:
            delay = self.reserve(time.monotonic())
        if delay > 0:
            await asyncio.sleep(delay)


def _tokens(value: object) -> int:
    """A usage count as the server wrote it; 0 where it wrote none or no number (usage is bookkeeping only)."""
    try:
        return max(0, int(value or 0))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


async def _read_capped(response: Any, max_bytes: int) -> bytes:
    """The body of a streamed response, reading no further than ``max_bytes`` (decompressed) bytes.

    Raises:
        RequestFailed: ``too_long`` once the body passes ``max_bytes``.
    """
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.iter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise RequestFailed("too_long", f"the answer's body passed {max_bytes:,} bytes (reading stopped)", 1, {})
        chunks.append(chunk)
    return b"".join(chunks)


def _completion(body: bytes, max_chars: int) -> Completion:
    """The :class:`Completion` of a chat-completion body, read through namc's bounded JSON reader.

    Raises:
        RequestFailed: ``bad_response`` for a body that is not a chat completion, ``too_long`` for a message over
            ``max_chars`` characters.
    """
    try:
        data = loads(body)
    except JSONError as err:
        raise RequestFailed("bad_response", f"unreadable answer: {err}", 1, {}) from None
    try:
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError) as err:
        raise RequestFailed("bad_response", f"no choices[0].message in the answer: {err!r}", 1, {}) from None
    if not isinstance(text, str):
        raise RequestFailed("bad_response", f"the answer's content is a {type(text).__name__}, not text", 1, {})
    if len(text) > max_chars:
        raise RequestFailed("too_long", f"an answer of {len(text):,} characters, over the cap of {max_chars:,}", 1, {})
    # a lone surrogate ("\ud83d": an emoji cut in half) is no character: U+FFFD, so the text is valid UTF-8
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    usage = data.get("usage") if isinstance(data, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    finish = choice.get("finish_reason")
    return Completion(
        text=text,
        prompt_tokens=_tokens(usage.get("prompt_tokens")),
        completion_tokens=_tokens(usage.get("completion_tokens")),
        attempts=1,
        finish_reason=finish if isinstance(finish, str) else None,
    )


class LLMClient:
    """Chat completions with bounded concurrency, retries, an optional rate limit and usage accounting.

    Use inside a running event loop (``async with LLMClient(cfg) as client``). ``stats`` counts attempts,
    failures by kind and tokens over the client's life.

    Args:
        config: the settings.
        seed: seeds the backoff jitter (reproducible tests).
    """

    def __init__(self, config: ClientConfig, seed: int | None = None) -> None:
        self.config = config
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        self._client = openai.AsyncOpenAI(
            api_key=key or "EMPTY", base_url=config.base_url, timeout=config.timeout, max_retries=0
        )
        self._sem = asyncio.Semaphore(config.concurrency)
        self._limiter = RateLimiter(config.rpm)
        self._rng = random.Random(seed)
        self.stats: Counter[str] = Counter()

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    async def _once(self, messages: list[dict[str, Any]]) -> Completion:
        c = self.config
        extra: dict[str, Any] = {} if c.seed is None else {"seed": c.seed}
        # httpx's timeout bounds each read, so a drip of one byte a second would never trip it: one deadline instead
        async with asyncio.timeout(c.timeout):
            async with self._client.chat.completions.with_streaming_response.create(
                model=c.model, messages=messages, max_tokens=c.max_tokens, temperature=c.temperature, **extra
            ) as response:
                body = await _read_capped(response, c.max_response_bytes)
        return _completion(body, c.max_answer_chars)

    async def complete(self, messages: list[dict[str, Any]]) -> Completion:
        """One chat completion, retried as the module docstring says.

        Args:
            messages: OpenAI chat messages (text and ``image_url`` parts).

        Raises:
            RequestFailed: after ``max_attempts`` retryable failures, or at once for a non-retryable one.
        """
        c = self.config
        retried: Counter[str] = Counter()
        for attempt in range(c.max_attempts):
            await self._limiter.wait()
            async with self._sem:
                self.stats["attempts"] += 1
                try:
                    done = await self._once(messages)
                except RequestFailed as err:
                    self.stats["failed." + err.kind] += 1
                    raise RequestFailed(err.kind, err.message, attempt + 1, dict(retried)) from None
                except openai.OpenAIError as err:
                    kind, retry_after = classify(err)
                    message = f"{type(err).__name__}: {err}"
                except TimeoutError:
                    kind, retry_after = "timeout", None
                    message = f"no complete answer within the {c.timeout:g} s deadline"
                else:
                    done.attempts, done.retried = attempt + 1, dict(retried)
                    self.stats["completions"] += 1
                    self.stats["prompt_tokens"] += done.prompt_tokens
                    self.stats["completion_tokens"] += done.completion_tokens
                    return done
            self.stats["error." + kind] += 1
            if kind not in RETRYABLE or attempt + 1 == c.max_attempts:
                self.stats["failed." + kind] += 1
                raise RequestFailed(kind, message[:500], attempt + 1, dict(retried))
            retried[kind] += 1
            self.stats["retries"] += 1
            await asyncio.sleep(backoff_delay(attempt, c.backoff_base, c.backoff_max, self._rng, retry_after))
        raise AssertionError("unreachable")  # pragma: no cover
