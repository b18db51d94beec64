"""Shapes world: a fast, seeded, procedural CLEVR-like generator of image pairs (PIL + numpy, no renderer).

One module per job:

- :mod:`~namc.data.synthetic.scene`: objects, views, random scenes and :func:`make_pair`, with CLEVR's attributes;
- :mod:`~namc.data.synthetic.render`: :func:`render_scene`;
- :mod:`~namc.data.synthetic.language`: change / no-change captions, relations, the halves of a description;
- :mod:`~namc.data.synthetic.noise`: injected noise phrases and their word labels, :func:`corpus_record`;
- :mod:`~namc.data.synthetic.writers`: :func:`generate_benchmark` (the CLEVR-Change layout) and
  :func:`generate_corpus` (a pre-training manifest), in a process pool.

Everything derives from ``(seed, stream, index)`` through its own ``random.Random``, so a pair's bytes do not
depend on the number of worker processes.
"""

from namc.data.synthetic.language import change_captions, no_change_captions
from namc.data.synthetic.noise import corpus_record
from namc.data.synthetic.render import render_scene
from namc.data.synthetic.scene import (
    CHANGE_TYPES,
    COLORS,
    MATERIALS,
    NO_CHANGE,
    SHAPES,
    SIZES,
    ShapeObject,
    ShapesPair,
    View,
    make_pair,
)
from namc.data.synthetic.writers import generate_benchmark, generate_corpus

__all__ = [
    "CHANGE_TYPES",
    "COLORS",
    "MATERIALS",
    "NO_CHANGE",
    "SHAPES",
    "SIZES",
    "ShapeObject",
    "ShapesPair",
    "View",
    "change_captions",
    "corpus_record",
    "generate_benchmark",
    "generate_corpus",
    "make_pair",
    "no_change_captions",
    "render_scene",
]
