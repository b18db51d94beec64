"""A real OpenAI-compatible chat-completions server for tests and benchmarks (127.0.0.1, a random free port).

It speaks ``POST /v1/chat/completions`` as the ``openai`` client sends it (JSON body, ``messages`` whose content is
a string or a list of ``text`` / ``image_url`` parts with ``data:`` URLs, which are base64-decoded and checked for
an image signature: a bad one is a 400) and answers a proper ``chat.completion`` object with ``usage``.

Scripting, per request: the request's text may hold a directive ``[[a,b,c]]``; attempt ``k`` of the same request
(same text and images) gets action ``k`` (the last one repeats). Actions:

- ``ok``: a template-following description (the ``answer`` callable's, by default :data:`DEFAULT_ANSWER`);
- ``off``: an off-template one; ``empty``: an empty message;
- ``429`` or ``429:S``: HTTP 429 with ``Retry-After: S`` (default 0); ``500``: HTTP 500;
- ``slow``: the ``ok`` answer after ``slow_seconds`` (past the client's timeout in the tests);
- ``drop``: close the connection without answering;
- ``garbled``: HTTP 200, ``application/json``, a body that is not JSON; ``cut``: an answer that ends in half an
  emoji (a lone surrogate, ``\ud83d``, as JSON can carry it); ``nousage``: usage counts that are not numbers;
- ``huge``: a 200 whose message is ``huge_chars`` characters long, whatever ``max_tokens`` the request set (a
  server that ignores the cap);
- ``drip``: the ``ok`` answer sent one byte every ``drip_seconds`` (headers at once), so that no single read waits
  long but the whole answer takes minutes.

A request without a directive gets ``ok``. ``latency`` delays every answer (the benchmark's 2 s server).
``max_tokens_seen`` lists the ``max_tokens`` of every request, in arrival order (None where a request had none).

Answers for ``namc eval lmm`` and ``namc eval judge``: :func:`labelled_answer` answers a pair with the caption
labelled for its two images (by :func:`pair_digest`), :func:`judge_answer` a judge prompt with the judgement scripted
for the prediction it holds.

Run standalone (``python tests/llm_server.py --latency 2``): prints the port on the first line, serves until killed;
``--labels FILE`` (a JSON ``{pair_digest: caption}``) answers with labelled captions.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import hashlib
import json
import re
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_ANSWER = (
    "The difference between the two images is that the first image shows a small red metal cube left of a large "
    "gray sphere, while the second image shows a small blue metal cube left of a large gray sphere."
)
OFF_TEMPLATE_ANSWER = "In the second picture the cube has turned blue."
_DIRECTIVE = re.compile(r"\[\[([^\]]*)\]\]")
_SIGNATURES = (b"\x89PNG", b"\xff\xd8", b"GIF8", b"RIFF")


def pair_digest(images: list[bytes]) -> str:
    """The SHA-256 of a request's image bytes, first image first: the key of :func:`labelled_answer`'s labels."""
    return hashlib.sha256(b"".join(hashlib.sha256(x).digest() for x in images)).hexdigest()


def labelled_answer(labels: dict[str, str], default: str = "unlabelled pair") -> Callable[[str, list[bytes]], str]:
    """An ``answer``: the caption labelled for the request's two images (:func:`pair_digest`), else ``default``."""
    return lambda text, images: labels.get(pair_digest(images), default)


_JUDGED = re.compile(r"\nPrediction:\n(.*?)\n\nAnswer with", re.S)


def judge_answer(scripts: dict[str, list[Any]]) -> Callable[[str, list[bytes]], str]:
    """An ``answer`` for namc's judge prompt: the k-th request about a prediction gets ``scripts[prediction][k]``
    (the last one repeats); a dict is sent as JSON, a string as it is (a malformed judgement). A prediction without
    a script gets a judgement of no changes at all."""
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def answer(text: str, images: list[bytes]) -> str:
        match = _JUDGED.search(text)
        prediction = match.group(1).strip() if match else ""
        steps = scripts.get(prediction) or [{"reference_changes": [], "prediction_changes": []}]
        with lock:
            k = calls[prediction]
            calls[prediction] += 1
        step = steps[min(k, len(steps) - 1)]
        return step if isinstance(step, str) else json.dumps(step)

    return answer


class RequestInvalid(ValueError):
    pass


class _Server(ThreadingHTTPServer):
    request_queue_size = 512  # listen backlog: the default 5 refuses connections at concurrency 64
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client killed mid-request is expected here
            super().handle_error(request, client_address)


def parse_request(body: dict[str, Any]) -> tuple[str, list[bytes]]:
    """``(text, images)`` of a chat request; raises :class:`RequestInvalid` where the protocol is not followed."""
    if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise RequestInvalid("'model' (string) and 'messages' (non-empty list) are required")
    texts: list[str] = []
    images: list[bytes] = []
    for message in body["messages"]:
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant"):
            raise RequestInvalid("every message needs a role of system/user/assistant")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        if not isinstance(content, list):
            raise RequestInvalid("content must be a string or a list of parts")
        for part in content:
            if part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("type") == "image_url" and isinstance(part.get("image_url"), dict):
                url = part["image_url"].get("url", "")
                head, _, data = url.partition(",")
                if not (head.startswith("data:image/") and head.endswith(";base64")):
                    raise RequestInvalid(f"image_url must be a base64 data URL of an image, got {url[:40]!r}")
                try:
                    raw = base64.b64decode(data, validate=True)
                except (binascii.Error, ValueError):
                    raise RequestInvalid("image_url data is not valid base64") from None
                if not raw.startswith(_SIGNATURES):
                    raise RequestInvalid("image_url data is not an image")
                images.append(raw)
            else:
                raise RequestInvalid(f"unknown content part {str(part)[:60]!r}")
    return "\n".join(texts), images


class LLMServer:
    """The server, in a background thread. Use as a context manager; ``url`` is the ``/v1`` base URL.

    Args:
        answer: ``(text, images) -> str``, the ``ok`` answer (default :data:`DEFAULT_ANSWER`).
        latency: seconds added to every answer.
        slow_seconds: how long a ``slow`` answer takes.
        huge_chars: the length of a ``huge`` answer.
        drip_seconds: the pause before each byte of a ``drip`` answer.
    """

    def __init__(
        self,
        answer: Callable[[str, list[bytes]], str] | None = None,
        latency: float = 0.0,
        slow_seconds: float = 1.0,
        port: int = 0,
        huge_chars: int = 20_000_000,
        drip_seconds: float = 1.0,
    ) -> None:
        self.answer = answer or (lambda text, images: DEFAULT_ANSWER)
        self.latency = latency
        self.slow_seconds = slow_seconds
        self.huge_chars = huge_chars
        self.drip_seconds = drip_seconds
        self.max_tokens_seen: list[Any] = []
        self.stopping = threading.Event()  # ends drip answers when the server shuts down
        self.actions: Counter[str] = Counter()  # what was done, by action
        self.images_seen = 0
        self.last_auth: str | None = None  # the Authorization header of the last request
        self._attempts: Counter[str] = Counter()
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"owner": self})
        self.httpd = _Server(("127.0.0.1", port), handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> LLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def next_action(self, text: str, images: list[bytes]) -> str:
        match = _DIRECTIVE.search(text)
        if match is None:
            action = "ok"
        else:
            steps = [s.strip() for s in match.group(1).split(",") if s.strip()] or ["ok"]
            key = hashlib.sha256(text.encode() + b"".join(images)).hexdigest()
            with self._lock:
                k = self._attempts[key]
                self._attempts[key] += 1
            action = steps[min(k, len(steps) - 1)]
        with self._lock:
            self.actions[action.split(":")[0]] += 1
            self.images_seen += len(images)
        return action


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client (httpx) expects
    disable_nagle_algorithm = True  # headers and body go out separately: without this, delayed ACKs add ~40 ms
    owner: LLMServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: dict[str, Any] | bytes, headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout): nothing to answer
            self.close_connection = True

    def _drip(self, data: bytes) -> None:
        """Sends ``data`` as a 200 answer, one byte every ``drip_seconds``, until done or the client gives up."""
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.flush()
            for k in range(len(data)):
                if self.owner.stopping.wait(self.owner.drip_seconds):
                    break
                self.wfile.write(data[k : k + 1])
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up: the point of the test
            pass
        self.close_connection = True

    def _error(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, {"error": {"message": message, "type": kind, "code": status}}, headers)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._error(404, f"no route {self.path}", "not_found")
        try:
            body = json.loads(raw)
            text, images = parse_request(body)
        except (json.JSONDecodeError, RequestInvalid, AttributeError) as err:
            return self._error(400, f"invalid request: {err}", "invalid_request_error")
        server = self.owner
        server.last_auth = self.headers.get("Authorization")
        with server._lock:
            server.max_tokens_seen.append(body.get("max_tokens"))
        action = server.next_action(text, images)
        if server.latency:
            time.sleep(server.latency)
        if action == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if action.startswith("429"):
            wait = action.partition(":")[2] or "0"
            return self._error(429, "rate limited", "rate_limit_error", {"Retry-After": wait})
        if action == "500":
            return self._error(500, "internal error", "server_error")
        if action == "slow":
            time.sleep(server.slow_seconds)
        if action == "garbled":
            return self._send(200, b'{"id": "chatcmpl-1", "choices": [{"index"')
        content = {"off": OFF_TEMPLATE_ANSWER, "empty": "", "huge": "x" * server.huge_chars}.get(action)
        if content is None:
            content = server.answer(text, images)
        if action == "cut":
            content += " \ud83d"
        prompt_tokens: Any = len(text.split()) + 64 * len(images)
        completion_tokens: Any = len(content.split())
        if action == "nousage":
            prompt_tokens = completion_tokens = "n/a"
        answer = {
            "id": f"chatcmpl-{hashlib.md5(raw).hexdigest()[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        if action == "drip":
            return self._drip(json.dumps(answer).encode())
        self._send(200, answer)
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description="a scriptable OpenAI-compatible test server on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--labels", help="a JSON {pair_digest: caption}: answer each pair with its labelled caption")
    args = parser.parse_args()
    answer = None
    if args.labels:
        with open(args.labels, encoding="utf-8") as f:
            answer = labelled_answer(json.load(f))
    server = LLMServer(answer=answer, latency=args.latency, port=args.port)
    print(server.port, flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
