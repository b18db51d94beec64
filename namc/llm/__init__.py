"""Talking to a multimodal LLM server at scale: an async client with counted retries, a resumable results store,
and a job runner: ``namc curate caption | describe``, the edit-pair engines' MLLM stages, ``namc eval lmm`` and
``namc eval judge`` are built from these (the ``[curate]`` extra: the official ``openai`` package).

- :mod:`~namc.llm.client`: :class:`LLMClient` over ``openai.AsyncOpenAI`` (retries, backoff, rate limit);
- :mod:`~namc.llm.store`: :class:`ResultStore`, the append-only JSONL that survives SIGKILL;
- :mod:`~namc.llm.images`: images as ``data:`` URLs, chat messages;
- :mod:`~namc.llm.runner`: :func:`run_jobs` and :class:`RunSummary`.
"""

from __future__ import annotations

import argparse
import logging

from namc.llm.client import ClientConfig, Completion, LLMClient, RequestFailed
from namc.llm.images import BadInput, data_url, image_message
from namc.llm.runner import Job, RunSummary, run_jobs
from namc.llm.store import ResultStore

__all__ = [
    "BadInput",
    "ClientConfig",
    "Completion",
    "Job",
    "LLMClient",
    "RequestFailed",
    "ResultStore",
    "RunSummary",
    "add_client_arguments",
    "configure_logging",
    "client_config",
    "data_url",
    "image_message",
    "run_jobs",
]


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """The server options every LLM step shares (YAML keys: the option names with ``_``)."""
    d = ClientConfig()
    g = parser.add_argument_group("server (any OpenAI-compatible chat-completions endpoint, e.g. `vllm serve`)")
    g.add_argument("--base-url", default=d.base_url, help=f"the server's /v1 URL (default {d.base_url})")
    g.add_argument("--model", default=d.model, help=f"model name the server serves (default {d.model}, the paper's)")
    g.add_argument(
        "--api-key-env",
        default=d.api_key_env,
        help=f"environment variable holding the API key (default {d.api_key_env}; unset is fine for a local server; "
        "keys are never read from flags or files)",
    )
    g.add_argument("--concurrency", type=int, default=d.concurrency, help="requests in flight at once")
    g.add_argument(
        "--timeout", type=float, default=d.timeout, help="seconds for a whole answer (a deadline, not per read)"
    )
    g.add_argument("--max-attempts", type=int, default=d.max_attempts, help="attempts per item before it is failed")
    g.add_argument("--backoff-base", type=float, default=d.backoff_base, help="first retry waits up to this (s)")
    g.add_argument("--backoff-max", type=float, default=d.backoff_max, help="longest wait between attempts (s)")
    g.add_argument("--rpm", type=float, default=None, help="at most this many requests per minute (default: no limit)")
    g.add_argument("--max-tokens", type=int, default=d.max_tokens, help="most generated tokens per answer")
    g.add_argument(
        "--max-answer-chars",
        type=int,
        default=d.max_answer_chars,
        help=f"a longer answer is failed as too_long, not stored (default {d.max_answer_chars})",
    )
    g.add_argument(
        "--max-response-bytes",
        type=int,
        default=d.max_response_bytes,
        help=f"stop reading an answer's body past this many bytes: too_long (default {d.max_response_bytes})",
    )
    g.add_argument("--temperature", type=float, default=d.temperature)
    g.add_argument("--seed", type=int, default=d.seed, help="sampling seed sent to the server, and the jitter's seed")


def client_config(args: argparse.Namespace) -> ClientConfig:
    """The :class:`ClientConfig` of parsed :func:`add_client_arguments` options."""
    return ClientConfig(
        base_url=args.base_url,
        model=args.model,
        api_key_env=args.api_key_env,
        concurrency=args.concurrency,
        timeout=args.timeout,
        max_attempts=args.max_attempts,
        backoff_base=args.backoff_base,
        backoff_max=args.backoff_max,
        rpm=args.rpm,
        max_tokens=args.max_tokens,
        max_answer_chars=args.max_answer_chars,
        max_response_bytes=args.max_response_bytes,
        temperature=args.temperature,
        seed=args.seed,
    )


def configure_logging() -> None:
    """INFO lines on stderr for a command that talks to a server, without httpx's one line per request."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
