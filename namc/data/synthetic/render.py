"""Rendering a shapes-world scene with PIL and numpy (no renderer): :func:`render_scene`.

Shapes are drawn as a square with a top face (cube), a disc (sphere) and an upright can with elliptical caps
(cylinder); rubber is flat, metal gets radial shading with a specular highlight. Objects are drawn back to front on
a floor gradient, supersampled for antialiasing.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

from namc.data.synthetic.scene import COLORS, RADIUS, ShapeObject, View

__all__ = ["render_scene"]

_NO_JITTER = View()  # frozen: safe to share as a default


def _supersample(image_size: int) -> int:
    return 4 if image_size <= 128 else 2 if image_size <= 384 else 1


@functools.lru_cache(maxsize=8)
def _background(side: int) -> Image.Image:
    """A vertical floor gradient (lighter far away), as in CLEVR's renders."""
    t = np.linspace(0.0, 1.0, side, dtype=np.float32)[:, None, None]  # (side, 1, 1)
    top, bottom = np.array([189, 189, 184], np.float32), np.array([148, 148, 145], np.float32)
    rows = top + (bottom - top) * t  # (side, 1, 3)
    return Image.fromarray(np.repeat(rows, side, axis=1).round().astype(np.uint8), mode="RGB")  # (side, side, 3)


def _scaled(rgb: tuple[int, int, int], factor: float) -> tuple[int, int, int]:
    return tuple(min(255, max(0, round(c * factor))) for c in rgb)  # type: ignore[return-value]


def _faces(
    shape: str, cx: float, cy: float, r: float
) -> list[tuple[str, list[float] | list[tuple[float, float]], float]]:
    """The faces of a shape as (kind, geometry, light factor), back to front; kind is "ellipse" or "polygon"."""
    if shape == "sphere":
        return [("ellipse", [cx - r, cy - r, cx + r, cy + r], 1.0)]
    if shape == "cube":  # front square, a lighter top face and a darker right face (a cabinet projection)
        a, t = 0.78 * r, 0.4 * r
        x, y = cx - 0.18 * r, cy + 0.18 * r
        front = [(x - a, y - a), (x + a, y - a), (x + a, y + a), (x - a, y + a)]
        top = [(x - a, y - a), (x + a, y - a), (x + a + t, y - a - t), (x - a + t, y - a - t)]
        side = [(x + a, y - a), (x + a + t, y - a - t), (x + a + t, y + a - t), (x + a, y + a)]
        return [("polygon", top, 1.3), ("polygon", side, 0.72), ("polygon", front, 1.0)]
    w, h = 0.72 * r, 0.8 * r  # cylinder: an upright can with elliptical caps
    e = 0.34 * w
    body = [(cx - w, cy - h), (cx + w, cy - h), (cx + w, cy + h), (cx - w, cy + h)]
    return [
        ("ellipse", [cx - w, cy + h - e, cx + w, cy + h + e], 1.0),
        ("polygon", body, 1.0),
        ("ellipse", [cx - w, cy - h - e, cx + w, cy - h + e], 1.3),
    ]


def _metal_layer(size: tuple[int, int], hx: float, hy: float, r: float, base: tuple[int, int, int]) -> Image.Image:
    """A radial gradient (dark rim to bright centre at (hx, hy)) with a white specular spot."""
    layer = Image.new("RGB", size, _scaled(base, 0.35))
    draw = ImageDraw.Draw(layer)
    steps = 7
    for k in range(steps):
        rad = 2.2 * r * (1 - k / steps)
        draw.ellipse([hx - rad, hy - rad, hx + rad, hy + rad], fill=_scaled(base, 0.35 + 0.9 * (k + 1) / steps))
    spot = 0.22 * r
    draw.ellipse([hx - spot, hy - spot, hx + spot, hy + spot], fill=(250, 250, 250))
    return layer


def _draw(canvas: Image.Image, draw: ImageDraw.ImageDraw, obj: ShapeObject, view: View, ss: int) -> None:
    side = canvas.size[0]
    cx = (0.5 + (obj.x - 0.5) * view.scale + view.dx) * side
    cy = (0.6 + (obj.y - 0.6) * view.scale + view.dy) * side
    r = RADIUS[obj.size] * view.scale * side
    draw.ellipse([cx - 0.9 * r, cy + 0.55 * r, cx + 1.4 * r, cy + 1.15 * r], fill=(0, 0, 0, 60))  # contact shadow
    base = COLORS[obj.color]
    faces = _faces(obj.shape, cx, cy, r)
    outline_width = max(1, ss // 2)
    if obj.material == "rubber":
        for kind, geom, light in faces:
            fill, outline = _scaled(base, light), _scaled(base, 0.55 * light)
            getattr(draw, kind)(geom, fill=fill, outline=outline, width=outline_width)
        return
    x0, y0 = int(cx - 1.6 * r), int(cy - 1.6 * r)
    size = (int(3.2 * r) + 2, int(3.2 * r) + 2)
    layer = _metal_layer(size, cx - x0 - 0.3 * r, cy - y0 - 0.35 * r, r, base)
    mask = Image.new("L", size, 0)
    mdraw = ImageDraw.Draw(mask)
    for kind, geom, _ in faces:
        if kind == "ellipse":
            ex0, ey0, ex1, ey1 = geom  # type: ignore[misc]
            mdraw.ellipse([ex0 - x0, ey0 - y0, ex1 - x0, ey1 - y0], fill=255)
        else:
            mdraw.polygon([(gx - x0, gy - y0) for gx, gy in geom], fill=255)  # type: ignore[misc]
    canvas.paste(layer, (x0, y0), mask)
    for kind, geom, light in faces:  # outlines keep the faces (and the shape) readable
        getattr(draw, kind)(geom, outline=_scaled(base, 0.45 * light), width=outline_width)


def render_scene(objects: Sequence[ShapeObject], image_size: int, view: View = _NO_JITTER) -> Image.Image:
    """Renders objects (back to front) on a gradient floor, antialiased by supersampling.

    Args:
        objects: the scene.
        image_size: side of the square RGB output.
        view: global jitter (shift, scale, brightness).
    """
    ss = _supersample(image_size)
    canvas = _background(image_size * ss).copy()
    draw = ImageDraw.Draw(canvas, "RGBA")  # RGBA fills blend (shadows)
    for obj in sorted(objects, key=lambda o: o.y):
        _draw(canvas, draw, obj, view, ss)
    if view.brightness != 1.0:
        lut = np.clip(np.rint(np.arange(256) * view.brightness), 0, 255).astype(np.uint8).tolist()
        canvas = canvas.point(lut * 3)
    return canvas.reduce(ss) if ss > 1 else canvas
