"""The ``namc`` console script: a thin dispatcher that imports only what the command needs.

::

    namc describe first.png second.png --model DIR   # core install
    namc benchmark ...                             # core install: throughput (namc.eval.throughput)
    namc data ...                                  # core install: corpus and shapes-world tools (namc.data.cli)
    namc convert-clip ViT-B-16.pt clip.safetensors # core install: OpenAI's CLIP as open_clip safetensors
    namc export onnx MODEL_DIR OUT_DIR             # ONNX files for ONNX Runtime / OpenVINO (the [deploy] extra)
    namc eval predictions.json references.json     # caption metrics (pycocoevalcap: the [train] extra)
    namc fit | validate | test | predict --config ...   # LightningCLI (the [train] extra)
    namc demo [--fast]                             # shapes world end to end (the [train] extra)
    namc curate embed|pairs|caption|describe|...   # corpus curation (the [curate] extra)
    namc experiment run STUDY.yaml                 # ablation studies over seeds (the [train] extra)
    namc analyze reconstruction|relevance ...      # Table 9, Figures 6-8 (the [train] extra)

``namc describe``, ``namc benchmark`` and ``namc convert-clip`` work with the core install alone (no Lightning,
jsonargparse, pycocoevalcap, TensorBoard or matplotlib is imported); the training commands say which extra to install
when it is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence

from namc._version import __version__

__all__ = ["main"]

_USAGE = """usage: namc COMMAND [ARGS]

Training and evaluation (LightningCLI; `namc COMMAND --help` for every option; needs namc[train]):
  fit        train: --config configs/pretrain/namc_base.yaml or configs/finetune/<benchmark>.yaml
  validate   score a checkpoint on the validation split (--ckpt_path)
  test       score a checkpoint on the test split (--ckpt_path)
  predict    caption the test split or a list of image pairs (--data.init_args.predict_pairs FILE)
  demo       shapes world end to end on a CPU: pre-train, fine-tune, evaluate, report (--fast: about a minute)

Other commands:
  describe   caption a pair of image files (or a list of pairs, --pairs) with a saved model
  data       build and inspect corpora and the shapes world (namc data --help)
  eval       caption metrics of a predictions file (namc eval --help)
  benchmark  throughput: generated tokens/s, parameters, memory (namc benchmark --help)
  convert-clip  OpenAI's CLIP checkpoint (ViT-B-16.pt) as the open_clip .safetensors file namc loads
  export     a saved model as ONNX files for ONNX Runtime and OpenVINO (namc export onnx MODEL_DIR OUT_DIR; needs
             namc[deploy]); `namc describe --backend onnxruntime|openvino` captions with them

Building a pre-training corpus (namc curate --help; needs namc[curate], and namc[train] for embed):
  curate     embed images, mine similar pairs, caption and describe pairs with an LLM server, filter, audit

Studies and analyses (needs namc[train]):
  experiment run a study (variants x seeds) of fit/test runs and aggregate it (namc experiment --help)
  analyze    reconstruction quality (Table 9), relevance and co-attention pictures (namc analyze --help)

  --version  print the version
"""

# command -> (module whose main(argv) runs it, the extra it needs or None)
_COMMANDS: dict[str, tuple[str, str | None]] = {
    "describe": ("namc.describe_cli", None),
    "benchmark": ("namc.eval.throughput", None),
    "data": ("namc.data.cli", None),
    "convert-clip": ("namc.convert_cli", None),
    "export": ("namc.export_cli", "deploy"),
    "eval": ("namc.eval.captions", "train"),
    "demo": ("namc.lit.demo", "train"),
    "curate": ("namc.curate.cli", "curate"),
    "experiment": ("namc.experiment.cli", "train"),
    "analyze": ("namc.eval.analysis.cli", "train"),
    **{name: ("namc.lit.cli", "train") for name in ("fit", "validate", "test", "predict")},
}
# what each extra brings: a command whose extra is missing names the first of these that does not import
_EXTRA_MODULES = {
    "train": ("lightning", "jsonargparse", "pycocoevalcap"),
    "curate": ("faiss", "sklearn", "webdataset", "pyarrow", "openai"),
    "deploy": ("onnx", "onnxruntime"),  # what `namc export` needs; describe's --backend openvino names its own
}


def _missing_extra(extra: str | None) -> str | None:
    for name in _EXTRA_MODULES.get(extra or "", ()):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or blocked install counts as missing
            found = False
        if not found:
            return name
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``namc`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"namc {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in _COMMANDS:
        print(f"namc: unknown command {command!r}\n\n{_USAGE}", file=sys.stderr)
        return 2
    module, extra = _COMMANDS[command]
    missing = _missing_extra(extra)
    if missing is not None:
        print(
            f'namc {command}: needs the [{extra}] extra ({missing} is not installed): pip install "namc[{extra}]"',
            file=sys.stderr,
        )
        return 2
    run = importlib.import_module(module).main
    return int(run(argv if module == "namc.lit.cli" else rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
