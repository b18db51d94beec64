"""``namc curate COMMAND``: a lazy dispatcher over the curation steps, each a module with ``main(argv)``.

From image collections to a packed corpus::

    namc curate index --config configs/curate/pipeline.yaml        # sources -> images.jsonl, source_pairs.jsonl
    namc curate embed --config configs/curate/pipeline.yaml        # CLIP ViT-L/14 + DINOv2 features (Lightning)
    namc curate pairs --config configs/curate/pipeline.yaml        # appendix D.1: kNN, candidates, clustering
    namc curate caption ...                                        # one paragraph per image from an LLM server
    namc curate describe ...                                       # appendix D.2: one description per pair
    namc curate audit ...                                          # NIM's word-level noise scores, HTML report
    namc data pack ... && namc data precompute ...                 # shards, then VQGAN codes beside them
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# command -> (module whose main(argv) runs it, one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "index": ("namc.curate.index", "list the sources' images (to mine) and pairs (ready); bad images skipped, counted"),
    "embed": ("namc.lit.embed", "CLIP ViT-L/14 and DINOv2 ViT-L/14 image features as float16 .npy shards (Lightning)"),
    "pairs": ("namc.curate.mining", "mine similar pairs from the features (appendix D.1): kNN, candidates, clusters"),
    "caption": ("namc.curate.caption", "one fine-grained caption per image from an OpenAI-compatible server"),
    "describe": ("namc.curate.describe", "one change description per pair (appendix D.2 prompts), resumable"),
    "filter": ("namc.curate.filtering", "validate descriptions against the template: manifest, rejects, Table 14"),
    "audit": ("namc.curate.audit", "score every description word by NIM's irrelevance: JSONL, HTML, filtered manifest"),
    "replace": ("namc.curate.edits.replace", "Img-Diff: an LLM swaps an object in a caption; both rendered as a pair"),
    "regions": ("namc.curate.edits.regions", "Img-Diff's Difference Area Generator: the boxes where a pair differs"),
    "region-captions": (
        "namc.curate.edits.region_captions",
        "Img-Diff: caption each box in both images, then the pair",
    ),
    "remove": ("namc.curate.edits.remove", "Img-Diff: inpaint an object away; pairs and red-box multiple choices"),
    "edit": ("namc.curate.edits.med", "MED: filter, instruct one of 11 micro-edits, edit, check, caption, judge"),
    "questions": ("namc.curate.edits.questions", "MED: four-option questions of the edited pairs (namc eval choice)"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "usage: namc curate COMMAND [ARGS]  (namc curate COMMAND --help)\n\n" + "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"namc curate: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = COMMANDS[command][0]
    if module.startswith("namc.lit"):
        try:
            importlib.import_module("lightning")
        except ImportError:
            print(
                f'namc curate {command}: needs the [train] extra as well: pip install "namc[train,curate]"',
                file=sys.stderr,
            )
            return 2
    return int(importlib.import_module(module).main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
