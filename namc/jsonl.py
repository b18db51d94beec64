"""JSON in and out: one bounded reader for every JSON text namc reads, and one writer for JSONL lines.

Every JSON or JSONL file namc reads may come from elsewhere (a corpus, a model folder, a server's answer), so
:func:`loads` refuses what Python's own decoder would take at any cost or take silently:

- nesting deeper than ``max_depth`` (Python's decoder recurses, and a line of 10,000 nested arrays ends it with a
  ``RecursionError``); checked before decoding, by counting brackets outside strings;
- text longer than ``max_chars`` (the caller's cap on one line or file);
- an object with the same key twice (the decoder keeps the last value without a word: a record's ``id`` replaced,
  captions dropped).

Each is a :class:`JSONError` (a ``ValueError``) whose message says what is wrong and where; callers prefix the file
and line. A UTF-8 byte-order mark at the start is accepted.

namc writes its JSONL files (manifests, pair lists, LLM results, captions) with ``ensure_ascii=False``, so that
descriptions read as text. But JSON can carry a lone UTF-16 surrogate (``"\\ud83d"``: an emoji cut in half by a
server that stopped mid-answer, or one in an input file), which Python decodes into a ``str`` that cannot be encoded
as UTF-8: writing it would fail deep in a long run. :func:`json_line` writes such an object with ``\\u`` escapes
instead (the same JSON value, in ASCII), and every other object as before.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_LINE_CHARS", "JSONError", "json_line", "loads"]

MAX_DEPTH = 64  # deeper than any file namc writes or reads (a config or record nests 3-5 levels)
MAX_LINE_CHARS = 64 * 1024 * 1024  # one JSONL record; a real one is a few kB (an LLM answer is capped far below)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class JSONError(ValueError):
    """A JSON text namc will not decode: invalid, too deep, too long, or with a duplicate key."""


def _depth_over(text: str, max_depth: int) -> bool:
    """Whether ``text`` nests arrays / objects deeper than ``max_depth`` (brackets inside strings do not count).

    Each pass deletes the innermost empty pairs, one level everywhere, at C speed; brackets left after
    ``max_depth`` passes are deeper (or do not match, which the decoder then reports)."""
    if text.count("[") + text.count("{") <= max_depth:  # cannot nest deeper: the common case
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    for _ in range(max_depth):
        if not brackets:
            return False
        brackets = brackets.replace("[]", "").replace("{}", "")
    return bool(brackets)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise JSONError(f"duplicate key {dup!r} in one object")
    return out


def loads(
    text: str | bytes,
    *,
    max_depth: int = MAX_DEPTH,
    max_chars: int | None = MAX_LINE_CHARS,
    unique_keys: bool = True,
) -> Any:
    """The value of the JSON ``text``, within bounds.

    Args:
        text: JSON, as ``str`` or UTF-8 ``bytes`` (a leading byte-order mark is dropped).
        max_depth: the deepest nesting of arrays and objects accepted.
        max_chars: the longest text accepted (None: any).
        unique_keys: refuse an object that names one key twice.

    Raises:
        JSONError: invalid JSON (with line and column), not UTF-8, too long, too deep or a duplicate key.
    """
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as err:
            raise JSONError(f"not UTF-8: byte 0x{text[err.start]:02x} at offset {err.start}") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if max_chars is not None and len(text) > max_chars:
        raise JSONError(f"{len(text):,} characters, over the limit of {max_chars:,}")
    deep = _depth_over(text, max_depth)
    try:
        if deep:
            json.loads(text)  # mismatched brackets are invalid JSON, reported as such
            raise RecursionError
        return json.loads(text, object_pairs_hook=_unique_keys if unique_keys else None)
    except json.JSONDecodeError as err:
        raise JSONError(f"invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    except RecursionError:
        raise JSONError(f"nested deeper than {max_depth} levels") from None


def json_line(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, **kwargs) + "\\n"``, escaped to ASCII where that would not be valid
    UTF-8 (a lone surrogate); reads back to the same value either way."""
    text = json.dumps(obj, ensure_ascii=False, **kwargs)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(obj, ensure_ascii=True, **kwargs)
    return text + "\n"
