"""A real OpenAI-compatible images server for tests (127.0.0.1, a random free port); it speaks chat too.

:class:`ImagesServer` is :class:`llm_server.LLMServer` (``POST /v1/chat/completions``, with all its directives) plus:

- ``POST /v1/images/generations``: a JSON body (``model``, ``prompt``, ``n``, ``size``, ``response_format``, and
  ``seed`` where the client sends one) -> ``{"created", "data": [{"b64_json": PNG}]}``. The image is deterministic:
  a noise background drawn from the seed (0 when none) and a square whose place comes from the seed and whose
  colour comes from the prompt, so two prompts with one seed give two images that differ only in the square;
- ``POST /v1/images/edits``: ``multipart/form-data`` as the official client sends it (``image`` and optional
  ``mask`` files, ``prompt``, ``model``, ``size``, ...). The answer is the input image with the area to edit (the
  mask's fully transparent pixels, OpenAI's convention; the whole image without a mask) painted in the prompt's
  colour. An ``image`` that is not a PNG, or a mask of another size, is a 400, as the OpenAI API answers.

Directives ``[[a,b,c]]`` in the prompt script attempt ``k`` of the same request, as in ``llm_server``: ``ok``,
``429[:S]``, ``500``, ``slow``, ``drop``, ``garbled`` (200 with a body that is not JSON), ``empty`` (200 with no
image), ``badb64`` (``b64_json`` that is not base64), ``notimage`` (base64 of bytes that are no image) and
``refuse`` (400 ``content_policy_violation``, the OpenAI API's refusal). ``requests`` lists what each images
request carried (route, model, prompt, seed, size, response_format, whether it had a mask).

Run standalone (``python tests/images_server.py``): prints the port on the first line, serves until killed.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import email.parser
import email.policy
import hashlib
import io
import json
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_server import LLMServer, RequestInvalid, _Handler  # noqa: E402

_SIZE = re.compile(r"(\d{1,4})x(\d{1,4})")
DEFAULT_SIZE = (64, 64)
REFUSAL = "Your request was rejected as a result of our safety system."


def prompt_colour(prompt: str) -> tuple[int, int, int]:
    """The colour a prompt paints (directives excluded, so a retried request paints the same)."""
    digest = hashlib.sha256(re.sub(r"\[\[[^\]]*\]\]", "", prompt).strip().encode()).digest()
    return digest[0], digest[1], digest[2]


def generated_image(prompt: str, seed: int, size: tuple[int, int]) -> Image.Image:
    """The deterministic image ``/images/generations`` answers (see the module docstring)."""
    w, h = size
    rng = np.random.default_rng(seed)
    pixels = rng.integers(96, 160, size=(h, w, 3), dtype=np.uint8)  # (H, W, 3)
    side = max(1, min(w, h) // 3)
    x0, y0 = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
    pixels[y0 : y0 + side, x0 : x0 + side] = prompt_colour(prompt)
    return Image.fromarray(pixels)


def edited_image(image: Image.Image, mask: Image.Image | None, prompt: str) -> Image.Image:
    """The input with the area to edit (alpha 0 in ``mask``; everything without one) in the prompt's colour."""
    pixels = np.array(image.convert("RGB"))  # (H, W, 3)
    area = np.ones(pixels.shape[:2], bool) if mask is None else np.array(mask.convert("RGBA"))[..., 3] == 0
    pixels[area] = prompt_colour(prompt)
    return Image.fromarray(pixels)


def _png_b64(img: Image.Image) -> str:
    out = io.BytesIO()
    img.save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode("ascii")


def parse_multipart(content_type: str, body: bytes) -> tuple[dict[str, str], dict[str, bytes]]:
    """``(fields, files)`` of a ``multipart/form-data`` body; raises :class:`RequestInvalid` if it is not one."""
    if not content_type.startswith("multipart/form-data"):
        raise RequestInvalid(f"expected multipart/form-data, got {content_type!r}")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise RequestInvalid("the body is not multipart")
    fields: dict[str, str] = {}
    files: dict[str, bytes] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if not name:
            raise RequestInvalid("a form part without a name")
        if part.get_filename() is not None:
            files[str(name).removesuffix("[]")] = payload
        else:
            fields[str(name)] = payload.decode("utf-8")
    return fields, files


def _open_png(data: bytes, what: str) -> Image.Image:
    if not data.startswith(b"\x89PNG"):
        raise RequestInvalid(f"{what} must be a PNG")
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except (OSError, ValueError) as err:
        raise RequestInvalid(f"{what} does not decode: {err}") from None
    return img


class ImagesServer(LLMServer):
    """The chat server of ``llm_server`` plus the two images routes. A context manager; ``url`` is the ``/v1`` URL.

    Args:
        slow_seconds: how long a ``slow`` answer takes (past the client's timeout in the tests).
        **kwargs: the rest of :class:`llm_server.LLMServer`'s arguments.
    """

    def __init__(self, slow_seconds: float = 1.0, **kwargs: Any) -> None:
        super().__init__(slow_seconds=slow_seconds, **kwargs)
        self.requests: list[dict[str, Any]] = []
        self.httpd.RequestHandlerClass = type("Handler", (_ImagesHandler,), {"owner": self})


class _ImagesHandler(_Handler):
    owner: ImagesServer

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        route = self.path.rstrip("/")
        if not route.endswith(("/images/generations", "/images/edits")):
            return super().do_POST()
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        server = self.owner
        server.last_auth = self.headers.get("Authorization")
        try:
            if route.endswith("/generations"):
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise RequestInvalid("the body must be a JSON object")
                fields, image, mask = {k: v for k, v in body.items()}, None, None
            else:
                fields, files = parse_multipart(self.headers.get("Content-Type", ""), raw)
                if "image" not in files:
                    raise RequestInvalid("'image' (a file) is required")
                image = _open_png(files["image"], "image")
                mask = _open_png(files["mask"], "mask") if "mask" in files else None
                if mask is not None and mask.size != image.size:
                    raise RequestInvalid(f"the mask is {mask.size}, the image {image.size}: they must match")
            prompt, model = fields.get("prompt"), fields.get("model")
            if not isinstance(prompt, str) or not prompt or not isinstance(model, str):
                raise RequestInvalid("'prompt' and 'model' (strings) are required")
            seed = int(fields.get("seed", 0))
            size_field = fields.get("size")
            match = _SIZE.fullmatch(size_field) if isinstance(size_field, str) else None
            if size_field not in (None, "auto") and match is None:
                raise RequestInvalid(f"size must be WxH or auto, got {size_field!r}")
        except (json.JSONDecodeError, UnicodeDecodeError, RequestInvalid, ValueError, TypeError) as err:
            return self._error(400, f"invalid request: {err}", "invalid_request_error")
        size = (int(match.group(1)), int(match.group(2))) if match else (image.size if image else DEFAULT_SIZE)
        with server._lock:
            server.requests.append(
                {
                    "route": "edits" if image is not None else "generations",
                    "model": model,
                    "prompt": prompt,
                    "seed": fields.get("seed"),
                    "size": size_field,
                    "response_format": fields.get("response_format"),
                    "mask": mask is not None,
                }
            )
        action = server.next_action(f"{prompt}\n{seed}", [raw] if image is not None else [])
        return self._act(action, prompt, seed, size, image, mask, fields.get("response_format"))

    def _act(
        self,
        action: str,
        prompt: str,
        seed: int,
        size: tuple[int, int],
        image: Image.Image | None,
        mask: Image.Image | None,
        response_format: Any,
    ) -> None:
        server = self.owner
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
        if action == "refuse":
            error = {"message": REFUSAL, "type": "image_generation_user_error", "param": None}
            return self._send(400, {"error": {**error, "code": "content_policy_violation"}})
        if action == "slow":
            time.sleep(server.slow_seconds)
        if action == "garbled":
            return self._send(200, b'{"created": 1, "data": [{"b64_json"')
        if response_format not in (None, "b64_json"):
            return self._error(400, "this server answers b64_json only", "invalid_request_error")
        if image is None:
            out = generated_image(prompt, seed, size)
        else:
            out = edited_image(image, mask, prompt)
            if out.size != size:
                out = out.resize(size, Image.Resampling.NEAREST)
        b64 = {
            "badb64": "not base64 at all!",
            "notimage": base64.b64encode(b"these bytes are no image").decode(),
        }.get(action) or _png_b64(out)
        data = [] if action == "empty" else [{"b64_json": b64, "revised_prompt": None}]
        self._send(200, {"created": int(time.time()), "data": data})
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description="a scriptable OpenAI-compatible images + chat server on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    server = ImagesServer(latency=args.latency, port=args.port)
    print(server.port, flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
