"""namc.curate.prompts and namc.llm: the paper's prompts, the client's retries against a real HTTP server
(tests/llm_server.py), the rate limiter and backoff, and the SIGKILL-safe results store."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import sys
from pathlib import Path

import pytest
from PIL import Image

from namc.curate.prompts import (
    CC3M_PROMPT,
    CONVENTIONAL_PROMPT,
    IP2P_PROMPT,
    STD_PROMPT,
    TEMPLATE,
    PromptError,
    describe_prompt,
    prompt_kind,
)
from namc.llm import ClientConfig, LLMClient, RequestFailed, ResultStore, image_message
from namc.llm.client import RateLimiter, backoff_delay
from namc.llm.store import last_results

sys.path.insert(0, str(Path(__file__).parent))
from llm_server import DEFAULT_ANSWER, LLMServer  # noqa: E402

FIXTURE = Path(__file__).parent / "data" / "namc_prompts.txt"
SEED = Path(__file__).resolve().parents[2] / "shared" / "seeds" / "001_eff51b0b5e081add.txt"


def _fixture() -> dict[str, str]:
    out, key = {}, None
    for line in FIXTURE.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("[") and line.endswith("]"):
            key = line[1:-1]
        else:
            out[key] = line
    return out


# ------------------------------------------------------------------------------------------------ prompts


def test_prompts_are_the_papers_words() -> None:
    paper = _fixture()
    assert STD_PROMPT == paper["std"]
    assert IP2P_PROMPT == paper["ip2p"]
    assert CC3M_PROMPT == paper["cc3m"] == paper["cc3m_section_3_1_2"]
    assert TEMPLATE == paper["template"]
    assert CONVENTIONAL_PROMPT == paper["conventional"]
    if SEED.is_file():  # the fixture itself is a verbatim copy of the paper's text
        lines = set(SEED.read_text(encoding="utf-8").splitlines())
        assert all(text in lines for text in paper.values())


def test_describe_prompt_per_source() -> None:
    kind, text = describe_prompt("Spot-the-Diff", "A red car parks.", "No car.", difference="the car is gone")
    assert kind == "std"
    assert text == paper_fill(STD_PROMPT, ["A red car parks", "No car"], difference="the car is gone")
    kind, text = describe_prompt("ip2p", "a cat", "a dog", instruction="turn the cat into a dog")
    assert (
        kind == "ip2p"
        and "Here is the prompt: turn the cat into a dog. First image could be described as: a cat." in text
    )
    kind, text = describe_prompt("my_folder", "cap {caption} one", "cap {template} two")
    assert kind == "cc3m" and prompt_kind("CC3M") == "cc3m"
    # a source named by its kind (no name given), or by a name of the user's: the pair's fields decide
    assert prompt_kind("ip2p_folder") == prompt_kind("ip2p_parquet") == "ip2p" and prompt_kind("spot_the_diff") == "std"
    assert describe_prompt("pix2pix", "a cat", "a dog", instruction="make it a dog")[0] == "ip2p"
    assert prompt_kind("my_diffs", difference="the car is gone") == "std" and prompt_kind("my_diffs", " ") == "cc3m"
    # one pass: placeholder text inside a caption is inserted verbatim, the real slots are all filled
    assert "described as: cap {caption} one. Second image could be described as: cap {template} two." in text
    assert text.endswith(f"'{TEMPLATE}'.")
    with pytest.raises(PromptError, match="difference"):
        describe_prompt("std", "a", "b")
    with pytest.raises(PromptError, match="instruction"):
        describe_prompt("instruct_pix2pix", "a", "b", difference="x")
    with pytest.raises(PromptError, match="caption2"):
        describe_prompt("cc3m", "a", "  ")


def paper_fill(prompt: str, captions: list[str], **values: str) -> str:
    """Fills by plain sequential replacement (safe here: the values hold no braces)."""
    out = prompt.replace("{caption}", captions[0], 1).replace("{caption}", captions[1], 1)
    for k, v in values.items():
        out = out.replace("{" + k + "}", v)
    return out.replace("{template}", TEMPLATE)


# ------------------------------------------------------------------------------------------------ client


def _png(color: tuple[int, int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _config(url: str, **kw) -> ClientConfig:
    args = dict(
        base_url=url, model="test-vlm", concurrency=8, timeout=0.4, max_attempts=3, backoff_base=0.01, backoff_max=0.05
    )
    return ClientConfig(**{**args, **kw})


async def _ask_all(config: ClientConfig, texts: list[str]) -> tuple[list[object], dict]:
    async with LLMClient(config, seed=0) as client:
        urls = [_png((200, 0, 0)), _png((0, 0, 200))]
        outs = await asyncio.gather(*(client.complete(image_message(t, urls)) for t in texts), return_exceptions=True)
        return outs, dict(client.stats)


@pytest.mark.parametrize(
    "directive, outcome, attempts, retried",
    [
        ("", "ok", 1, {}),
        ("[[429:0.02,ok]]", "ok", 2, {"rate_limit": 1}),
        ("[[500,500,ok]]", "ok", 3, {"server_error": 2}),
        ("[[slow,ok]]", "ok", 2, {"timeout": 1}),
        ("[[drop,ok]]", "ok", 2, {"connection": 1}),
        ("[[empty]]", "empty", 1, {}),
        ("[[off]]", "off", 1, {}),
        ("[[429]]", "rate_limit", 3, {"rate_limit": 2}),
        ("[[500]]", "server_error", 3, {"server_error": 2}),
        ("[[slow]]", "timeout", 3, {"timeout": 2}),
        ("[[drop]]", "connection", 3, {"connection": 2}),
        ("[[garbled]]", "bad_response", 1, {}),  # a 200 whose body is not JSON: not retried, not a crash
    ],
)
def test_each_failure_kind_has_its_outcome(directive: str, outcome: str, attempts: int, retried: dict) -> None:
    with LLMServer(slow_seconds=0.8) as server:
        (out,), stats = asyncio.run(_ask_all(_config(server.url), [f"describe {directive}"]))
    if outcome in ("ok", "empty", "off"):
        assert not isinstance(out, BaseException), out
        expected = {"ok": DEFAULT_ANSWER, "empty": ""}.get(outcome)
        assert out.text == expected if expected is not None else out.text.startswith("In the second picture")
        assert (out.attempts, out.retried) == (attempts, retried)
        assert out.completion_tokens == len(out.text.split()) and out.prompt_tokens > 0
        assert stats["completions"] == 1
    else:
        assert isinstance(out, RequestFailed), out
        assert (out.kind, out.attempts, out.retried) == (outcome, attempts, retried)
        assert stats["failed." + outcome] == 1
    assert stats["attempts"] == attempts
    assert server.images_seen == 2 * attempts  # every attempt carried both images as data URLs


def test_client_error_is_not_retried_and_bad_image_urls_are_refused() -> None:
    with LLMServer() as server:
        bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]

        async def go() -> RequestFailed:
            async with LLMClient(_config(server.url), seed=0) as client:
                with pytest.raises(RequestFailed) as err:
                    await client.complete(bad)
                return err.value

        err = asyncio.run(go())
    assert err.kind == "http_4xx" and err.attempts == 1 and "data URL" in err.message


def test_concurrent_requests_and_token_totals() -> None:
    with LLMServer(latency=0.01) as server:
        texts = [f"pair {i} [[500,ok]]" if i % 3 == 0 else f"pair {i}" for i in range(24)]
        outs, stats = asyncio.run(_ask_all(_config(server.url, concurrency=4), texts))
    assert all(o.text == DEFAULT_ANSWER for o in outs)
    assert stats["attempts"] == 24 + 8 and stats["retries"] == 8
    assert stats["completion_tokens"] == 24 * len(DEFAULT_ANSWER.split())
    assert stats["prompt_tokens"] == sum(o.prompt_tokens for o in outs)


def test_api_key_comes_from_the_named_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAMC_TEST_LLM_KEY", "sk-test-123")
    monkeypatch.delenv("NAMC_UNSET_KEY", raising=False)
    with LLMServer() as server:
        asyncio.run(_ask_all(_config(server.url, api_key_env="NAMC_TEST_LLM_KEY"), ["hi"]))
        assert server.last_auth == "Bearer sk-test-123"
        asyncio.run(_ask_all(_config(server.url, api_key_env="NAMC_UNSET_KEY"), ["hi"]))
        assert server.last_auth == "Bearer EMPTY"  # a local server needs no key


def test_backoff_is_bounded_jittered_and_honours_retry_after() -> None:
    rng = random.Random(0)
    for attempt in range(8):
        d = backoff_delay(attempt, 0.5, 10.0, rng)
        assert 0.0 <= d <= min(10.0, 0.5 * 2**attempt)
    assert backoff_delay(0, 0.5, 10.0, rng, retry_after=3.0) >= 3.0
    assert backoff_delay(0, 0.5, 10.0, rng, retry_after=100.0) == 10.0  # capped
    delays = {backoff_delay(5, 1.0, 60.0, random.Random(s)) for s in range(5)}
    assert len(delays) == 5  # jitter: no two clients retry in lockstep


def test_rate_limiter_spaces_request_starts() -> None:
    limiter = RateLimiter(rpm=60)  # one start per second
    assert limiter.reserve(100.0) == 0.0
    assert limiter.reserve(100.0) == 1.0
    assert limiter.reserve(100.5) == 1.5  # third slot at 102.0
    assert limiter.reserve(110.0) == 0.0
    assert RateLimiter(None).reserve(5.0) == 0.0 and RateLimiter(None).interval == 0.0


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        ClientConfig(concurrency=0)
    with pytest.raises(ValueError):
        ClientConfig(rpm=0)


# ------------------------------------------------------------------------------------------------ store


def _result(i: int, status: str = "ok") -> dict:
    return {"id": f"p{i}", "status": status, "text": f"answer {i}\nwith a newline"}


def test_store_resumes_and_drops_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with ResultStore(path) as store:
        for i in range(3):
            store.append(_result(i))
        store.append(_result(3, "failed"))
    whole = path.read_bytes()
    assert whole.count(b"\n") == 4  # the newline inside a text is escaped, one line per result
    torn = json.dumps(_result(4)).encode()[:25]  # SIGKILL mid-write: no newline at the end
    path.write_bytes(whole + torn)
    with ResultStore(path) as store:
        assert store.done == {"p0", "p1", "p2", "p3"} and store.failed == {"p3"}
        assert store.torn_bytes == len(torn)
        assert path.read_bytes() == whole  # truncated back to the last complete line
        store.append(_result(4))
        assert store.forget_failed() == 1 and "p3" not in store.done
        store.append(_result(3))  # retried, now ok: the last line wins
    where, corrupt = last_results(path)
    assert list(where) == ["p0", "p1", "p2", "p4", "p3"] and corrupt == 0
    with ResultStore(path) as store:
        assert store.failed == set() and len(store.done) == 5


def test_store_skips_and_counts_a_corrupt_complete_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    good = json.dumps(_result(0)) + "\n"
    path.write_bytes(good.encode() + b'{"id": "p1", "status": "ok", "te\n' + b"\xff\xfe not utf8\n" + b"[1, 2]\n")
    with ResultStore(path) as store:
        assert store.done == {"p0"} and store.corrupt_lines == 3 and store.torn_bytes == 0
    assert last_results(path)[1] == 3
