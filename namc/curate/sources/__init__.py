"""Image sources of the curation pipeline: one reader per published layout, chosen by ``kind`` in the YAML.

=================  ====================================================================  =============
kind               layout                                                                yields
=================  ====================================================================  =============
``ip2p_folder``    InstructPix2Pix clip-filtered-dataset folders (``prompt.json``, seeds)  pairs
``ip2p_parquet``   ``timbrooks/instructpix2pix-clip-filtered`` parquet files                pairs
``spot_the_diff``  Spot-the-Diff (``annotations/``, ``resized_images/``)                   pairs
``webdataset``     img2dataset WebDataset shards (``KEY.jpg``/``.txt``/``.json``), CC3M    single images
``image_tsv``      a folder of images + ``IMAGE<TAB>CAPTION`` file, CC3M                   single images
``image_folder``   any folder of images (recursive; ``.txt`` beside an image = caption)   single images
=================  ====================================================================  =============

Each module's docstring says where its layout was checked. :func:`iter_source` runs a reader and joins the source's
optional captions JSONL (:mod:`.captions`).
"""

from __future__ import annotations

from collections.abc import Iterator

from namc.curate.sources import cc3m, folder, ip2p, spot_the_diff  # noqa: F401  (register the kinds)
from namc.curate.sources.base import SOURCE_KINDS, ImageItem, PairItem, SourceSpec, check_image, register_source
from namc.curate.sources.captions import read_captions
from namc.data.issues import DataIssues

__all__ = [
    "SOURCE_KINDS",
    "ImageItem",
    "PairItem",
    "SourceSpec",
    "check_image",
    "iter_source",
    "read_captions",
    "register_source",
]


def iter_source(spec: SourceSpec, issues: DataIssues) -> Iterator[ImageItem | PairItem]:
    """The items of one source, with captions from ``spec.captions`` joined by key (full key, then the key within
    the source); a caption from the file replaces the source's own (``caption1``/``caption2`` of a pair are joined
    from ``<pair key>/1`` and ``<pair key>/2``)."""
    captions = read_captions(spec.captions, issues) if spec.captions else {}
    prefix = spec.name + "/"

    def find(key: str) -> str | None:
        return captions.get(key) or captions.get(key[len(prefix) :] if key.startswith(prefix) else key)

    for item in SOURCE_KINDS[spec.kind](spec, issues):
        if captions:
            if isinstance(item, ImageItem):
                item.caption = find(item.key) or item.caption
            else:
                item.caption1 = find(item.key + "/1") or item.caption1
                item.caption2 = find(item.key + "/2") or item.caption2
        yield item
