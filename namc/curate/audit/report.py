"""The audit's static HTML report: pairs side by side, flagged words highlighted, one self-contained file.

Images are embedded as ``data:`` URLs of small JPEG thumbnails (so the file opens anywhere, offline, and can be
mailed), every text goes through :func:`html.escape` (descriptions are LLM output: a ``<script>`` in one is shown,
never run), and the page has no JavaScript. A word's highlight strength follows its irrelevance; its exact score is
in the ``title`` tooltip.

The page's size is bounded whatever the manifest holds: at most :data:`MAX_WORDS_SHOWN` words per half and
:data:`MAX_FIELD_CHARS` characters of an id, a source or a word are shown (the rest is counted, not rendered), so a
few runaway descriptions cannot turn a page of 200 pairs into gigabytes.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from typing import Any

from PIL import Image

from namc.data.transforms import open_image, to_rgb

__all__ = ["MAX_FIELD_CHARS", "MAX_WORDS_SHOWN", "render_html", "thumbnail_url"]

MAX_WORDS_SHOWN = 200  # a template half is a few dozen words; a reader skims, never reads 200 words of one half
MAX_FIELD_CHARS = 200  # an id, a source name or one word

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table.sum td{padding:2px 10px}
.pair{border-top:1px solid #ccc;padding:.8em 0;display:flex;gap:1em;align-items:flex-start}
.pair img{width:160px;height:auto;border:1px solid #999}
.txt{max-width:60em;line-height:1.6}
.w{padding:0 1px}
mark{background:rgba(230,40,40,var(--a));border-radius:3px;padding:0 2px}
.meta{color:#666;font-size:.85em}
"""


def thumbnail_url(data: bytes, side: int = 160) -> str:
    """A JPEG ``data:`` URL of an image, longer side at most ``side`` pixels ("" if it does not decode)."""
    try:
        img = to_rgb(open_image(data))
    except (OSError, SyntaxError, ValueError):
        return ""
    img.thumbnail((side, side), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def _short(text: str) -> str:
    """``text`` escaped, cut at :data:`MAX_FIELD_CHARS` characters (an ellipsis marks the cut)."""
    return html.escape(text if len(text) <= MAX_FIELD_CHARS else text[:MAX_FIELD_CHARS] + "\u2026")


def _words(words: Sequence[str], scores: Sequence[float | None], threshold: float) -> str:
    parts = []
    for word, score in zip(words[:MAX_WORDS_SHOWN], scores):
        w = _short(word)
        if score is None:
            parts.append(f'<span class="w" title="not scored (past the context)">{w}</span>')
        elif score >= threshold:
            alpha = min(1.0, 0.25 + 0.75 * (score - threshold) / max(1e-6, 2.0 - threshold))
            parts.append(f'<mark style="--a:{alpha:.2f}" title="irrelevance {score:.3f}">{w}</mark>')
        else:
            parts.append(f'<span class="w" title="irrelevance {score:.3f}">{w}</span>')
    if len(words) > MAX_WORDS_SHOWN:
        parts.append(f'<span class="meta">[{len(words) - MAX_WORDS_SHOWN:,} more words not shown]</span>')
    return " ".join(parts)


def _img(url: str, alt: str) -> str:
    if not url:
        return f'<span class="meta">[{html.escape(alt)}: not readable]</span>'
    return f'<img src="{url}" alt="{html.escape(alt)}">'


def render_html(
    title: str, summary: dict[str, Any], pairs: Sequence[dict[str, Any]], threshold: float, total_pairs: int
) -> str:
    """The report page.

    Args:
        title: the page title (escaped).
        summary: key -> value rows shown at the top (escaped).
        pairs: per pair ``{"id", "source", "verb1", "words1", "scores1", "verb2", "words2", "scores2",
            "flagged_fraction", "thumb1", "thumb2"}`` (thumbnails as ``data:`` URLs), most flagged first.
        threshold: the flag threshold (highlight from here).
        total_pairs: how many pairs were audited (the page shows ``len(pairs)`` of them).
    """
    rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>" for k, v in summary.items())
    body = []
    for p in pairs:
        first = _words(p["words1"], p["scores1"], threshold)
        second = _words(p["words2"], p["scores2"], threshold)
        body.append(
            '<div class="pair">'
            f"{_img(p['thumb1'], 'first image')}{_img(p['thumb2'], 'second image')}"
            '<div class="txt">'
            f'<div class="meta">{_short(p["id"])} &middot; {_short(p["source"])} &middot; '
            f"{100 * p['flagged_fraction']:.0f}% of words flagged</div>"
            f"<div><b>first image {_short(p['verb1'])}</b> {first}</div>"
            f"<div><b>second image {_short(p['verb2'])}</b> {second}</div>"
            "</div></div>"
        )
    shown = f"showing the {len(pairs)} most flagged of {total_pairs} pairs"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f'<h1>{html.escape(title)}</h1><table class="sum">{rows}</table>'
        f'<p class="meta">Highlighted: words whose NIM irrelevance 1 - R_T (Eq. 1) is at least '
        f"{threshold:.3f}; hover a word for its score. {html.escape(shown)}.</p>" + "".join(body) + "</body></html>\n"
    )
