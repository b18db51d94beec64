"""The ``openai`` backend of the edit-pair engines: an OpenAI-compatible images endpoint (:class:`OpenAIImages`).

``images.generate`` makes pairs, ``images.edit`` inpaints (with a mask) and edits (without), through the official
``openai`` client; the image comes back as ``b64_json`` and is decoded under a pixel cap. Built by
:func:`namc.curate.edits.backends.build` (``backend: openai``).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import random
import re
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from PIL import Image
from tqdm.auto import tqdm

from namc.curate.edits.base import BackendError, GenerationFailed, Result, Throughput
from namc.curate.edits.options import (
    check_batch,
    check_masks,
    first_line,
    flag_option,
    number_option,
    pair_images,
    string_option,
)

__all__ = ["OpenAIImages"]

MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS  # PIL's own decompression-bomb limit, as namc.data.transforms
_SIZE = re.compile(r"(auto|\d{1,5}x\d{1,5})")


def _png(img: Image.Image) -> bytes:
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def _openai_mask(mask: Image.Image) -> Image.Image:
    """OpenAI's edit mask: an RGBA PNG whose fully transparent pixels are the area to repaint (ours: white, >= 128)."""
    rgba = Image.new("RGBA", mask.size, (0, 0, 0, 255))
    rgba.putalpha(Image.eval(mask.convert("L"), lambda v: 0 if v >= 128 else 255))
    return rgba


class OpenAIImages:
    """An OpenAI-compatible images endpoint (the OpenAI API, or a local server that speaks it) as a
    :class:`~namc.curate.edits.base.PairGenerator`, :class:`~namc.curate.edits.base.Inpainter` or
    :class:`~namc.curate.edits.base.Editor`, through the official client's ``images.generate`` / ``images.edit``.

    Keys: ``base_url`` (default ``https://api.openai.com/v1``), ``model`` (required), ``api_key_env`` (the
    environment variable holding the key, default ``OPENAI_API_KEY``; unset: the placeholder ``EMPTY``, as local
    servers take), ``size`` (``WxH`` or ``auto``; default: the server's; for inpaint and edit, the input's size when
    it is not set), ``timeout`` (seconds per request read, default 120), ``max_attempts`` (default 5),
    ``concurrency`` (requests in flight, default 4), ``send_seed`` (default false: the OpenAI API takes no seed; true
    sends each item's seed as ``seed``, which local servers honour), ``response_format`` (default ``b64_json``; null
    omits it, for models that always answer base64), ``max_pixels`` (decoding cap, default PIL's),
    ``backoff_base`` / ``backoff_max`` (seconds, default 1 / 60), ``progress`` (a tqdm bar for a batch of more
    requests than ``concurrency``; default true).

    A remote generator cannot share attention between the two prompts of a pair: pairs are two independent
    generations (with the same seed where the server takes one), so they differ more than Prompt-to-Prompt pairs and
    Img-Diff's similarity filter [0.9, 0.98] keeps fewer. ``images.edit`` takes our mask as OpenAI's: transparent
    where to repaint. Outcomes per item, like :mod:`namc.llm.client`: 429, 5xx, timeouts and dropped
    connections are retried with jittered exponential backoff (at least the server's Retry-After), then
    ``GenerationFailed(kind)``; a 400 ``content_policy_violation`` (or a moderation block) is ``refused``; another
    4xx is ``http_4xx``; an answer without a decodable image is ``bad_output``; an image over the pixel cap is
    ``oversized_output``.
    """

    def __init__(self, section: Mapping[str, Any], role: str, seed: int | None = None) -> None:
        try:
            import openai
        except ImportError:
            raise BackendError("edits backend openai needs the openai package: pip install 'namc[curate]'") from None
        self.role = role
        model = string_option(section, "model", None)
        if not model:
            raise BackendError("edits backend openai: model: is required (the images model the server serves)")
        self.model = model
        self.base_url = string_option(section, "base_url", "https://api.openai.com/v1")
        self.api_key_env = string_option(section, "api_key_env", "OPENAI_API_KEY")
        size = string_option(section, "size", None)
        if size is not None and not _SIZE.fullmatch(size):
            raise BackendError(f"edits backend: size must be WIDTHxHEIGHT (e.g. 1024x1024) or auto, got {size!r}")
        self.size = size
        self.timeout = float(number_option(section, "timeout", 120.0, 0.001, 86_400))
        self.max_attempts = number_option(section, "max_attempts", 5, 1, 100, integer=True)
        self.concurrency = number_option(section, "concurrency", 4, 1, 256, integer=True)
        self.send_seed = flag_option(section, "send_seed", False)
        self.progress = flag_option(section, "progress", True)
        self.response_format = string_option(section, "response_format", "b64_json")
        if self.response_format not in (None, "b64_json"):
            raise BackendError("edits backend: response_format must be b64_json or null (image URLs are not fetched)")
        self.max_pixels = number_option(section, "max_pixels", MAX_IMAGE_PIXELS, 1, 1 << 40, integer=True)
        self.backoff_base = float(number_option(section, "backoff_base", 1.0, 0.0, 3600))
        self.backoff_max = float(number_option(section, "backoff_max", 60.0, 0.0, 3600))
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        self._client = openai.OpenAI(
            api_key=key or "EMPTY", base_url=self.base_url, timeout=self.timeout, max_retries=0
        )
        self._rng = random.Random(seed)
        self.throughput = Throughput()
        self.retries: Counter[str] = Counter()  # retried failures by kind
        self._lock = threading.Lock()  # the worker threads share the counter

    def close(self) -> None:
        self._client.close()

    # one request ---------------------------------------------------------------------------------------------

    def _decode(self, response: Any) -> Image.Image | GenerationFailed:
        data = getattr(response, "data", None)
        b64 = getattr(data[0], "b64_json", None) if data else None
        if not isinstance(b64, str) or not b64:
            return GenerationFailed("bad_output", "the answer holds no b64_json image")
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            return GenerationFailed("bad_output", "the answer's b64_json is not base64")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own cap below decides
            try:
                img = Image.open(io.BytesIO(raw))
                if img.width * img.height > self.max_pixels:
                    return GenerationFailed(
                        "oversized_output",
                        f"a {img.width}x{img.height} image, over the cap of {self.max_pixels} pixels",
                    )
                img.load()
            except Image.DecompressionBombError as err:
                return GenerationFailed("oversized_output", first_line(err))
            except (OSError, SyntaxError, ValueError, EOFError) as err:
                return GenerationFailed("bad_output", f"the answer's image does not decode: {first_line(err)}")
        return img.convert("RGB")

    def _classify(self, err: BaseException) -> tuple[str, float | None]:
        import openai

        from namc.llm.client import classify

        if isinstance(err, openai.APIStatusError) and 400 <= err.status_code < 500 and err.status_code != 429:
            body = err.body if isinstance(err.body, dict) else {}
            inner = body.get("error", body) if isinstance(body, dict) else {}
            code = f"{inner.get('code', '')} {inner.get('type', '')} {err.message}" if isinstance(inner, dict) else ""
            if re.search(r"content_policy|moderation|safety", code, re.IGNORECASE):
                return "refused", None
        return classify(err)

    def _request(self, call: Callable[[], Any]) -> Image.Image | GenerationFailed:
        """One item: ``call`` retried as the class docstring says."""
        import openai

        from namc.llm.client import RETRYABLE, backoff_delay

        for attempt in range(self.max_attempts):
            try:
                response = call()
            except openai.OpenAIError as err:
                kind, retry_after = self._classify(err)
                message = first_line(err)
            except ValueError as err:  # a 200 whose body is not JSON (json.JSONDecodeError)
                return GenerationFailed("bad_output", f"the answer is not JSON: {first_line(err)}")
            else:
                return self._decode(response)
            if kind not in RETRYABLE or attempt + 1 == self.max_attempts:
                return GenerationFailed(kind, message)
            with self._lock:
                self.retries[kind] += 1
            time.sleep(backoff_delay(attempt, self.backoff_base, self.backoff_max, self._rng, retry_after))
        raise AssertionError("unreachable")  # pragma: no cover

    def _options(self, seed: int, size: str | None) -> dict[str, Any]:
        options: dict[str, Any] = {"model": self.model, "n": 1}
        if self.response_format:
            options["response_format"] = self.response_format
        if size:
            options["size"] = size
        if self.send_seed:
            options["extra_body"] = {"seed": int(seed)}
        return options

    def _generate(self, prompt: str, seed: int) -> Image.Image | GenerationFailed:
        return self._request(lambda: self._client.images.generate(prompt=prompt, **self._options(seed, self.size)))

    def _edit(
        self, image: Image.Image, mask: Image.Image | None, prompt: str, seed: int
    ) -> Image.Image | GenerationFailed:
        files: dict[str, Any] = {"image": ("image.png", _png(image.convert("RGB")), "image/png")}
        if mask is not None:
            files["mask"] = ("mask.png", _png(_openai_mask(mask)), "image/png")
        size = self.size or f"{image.width}x{image.height}"
        result = self._request(lambda: self._client.images.edit(prompt=prompt, **files, **self._options(seed, size)))
        if isinstance(result, Image.Image) and result.size != image.size:
            result = result.resize(image.size, Image.Resampling.BICUBIC)
        return result

    def _map(self, fn: Callable[..., Any], *columns: Sequence[Any]) -> list[Any]:
        """``fn`` over the items, ``concurrency`` at a time, in input order (a progress bar past one round)."""
        n = len(columns[0])
        with ThreadPoolExecutor(self.concurrency) as pool:
            done = tqdm(pool.map(fn, *columns), total=n, desc=f"{self.role} ({self.model})", unit="image",
                        leave=False, disable=not self.progress or n <= self.concurrency)  # fmt: skip
            return list(done)

    # the protocols -------------------------------------------------------------------------------------------

    def generate_pairs(
        self, prompts: Sequence[tuple[str, str]], seeds: Sequence[int]
    ) -> list[tuple[Image.Image, Image.Image] | GenerationFailed]:
        """Both prompts of each pair generated with the pair's seed (sent only with ``send_seed``); a pair with a
        failed image is that failure."""
        check_batch("generate_pairs", prompts, seeds)
        started = time.perf_counter()
        flat = self._map(self._generate, [p for pair in prompts for p in pair], [s for s in seeds for _ in range(2)])
        results: list[tuple[Image.Image, Image.Image] | GenerationFailed] = []
        for k in range(len(prompts)):
            a, b = flat[2 * k], flat[2 * k + 1]
            results.append(a if isinstance(a, GenerationFailed) else b if isinstance(b, GenerationFailed) else (a, b))
        self.throughput.record(pair_images(results), started)
        return results

    def inpaint(
        self, images: Sequence[Image.Image], masks: Sequence[Image.Image], prompts: Sequence[str], seeds: Sequence[int]
    ) -> list[Result]:
        """``images.edit`` with the mask (transparent where to repaint) and the prompt, per item."""
        check_batch("inpaint", images, masks, prompts, seeds)
        check_masks(images, masks)
        started = time.perf_counter()
        results = self._map(self._edit, images, masks, prompts, seeds)
        self.throughput.record(results, started)
        return results

    def edit(self, images: Sequence[Image.Image], instructions: Sequence[str], seeds: Sequence[int]) -> list[Result]:
        """``images.edit`` without a mask: the instruction is the prompt."""
        check_batch("edit", images, instructions, seeds)
        started = time.perf_counter()
        results = self._map(lambda im, p, s: self._edit(im, None, p, s), images, instructions, seeds)
        self.throughput.record(results, started)
        return results
