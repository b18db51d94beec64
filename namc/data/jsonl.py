"""One JSON line for a JSONL file, readable as UTF-8 whatever strings it holds.

namc writes its JSONL files (manifests, pair lists, LLM results, captions) with ``ensure_ascii=False``, so that
descriptions read as text. But JSON can carry a lone UTF-16 surrogate (``"\\ud83d"``: an emoji cut in half by a
server that stopped mid-answer, or one in an input file), which Python decodes into a ``str`` that cannot be encoded
as UTF-8: writing it would fail deep in a long run. :func:`json_line` writes such an object with ``\\u`` escapes
instead (the same JSON value, in ASCII), and every other object as before.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_line"]


def json_line(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, **kwargs) + "\\n"``, escaped to ASCII where that would not be valid
    UTF-8 (a lone surrogate); reads back to the same value either way."""
    text = json.dumps(obj, ensure_ascii=False, **kwargs)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(obj, ensure_ascii=True, **kwargs)
    return text + "\n"
