"""The ``namc`` console script: LightningCLI for training and evaluation, plus a few plain commands.

::

    namc fit --config configs/finetune/clevr_change.yaml [--trainer.max_epochs 5 ...] [--ckpt_path last.ckpt]
    namc validate | test | predict --config ... --ckpt_path best.ckpt
    namc fit --config configs/pretrain/namc_base.yaml --print_config
    namc demo [--fast] [--out runs/demo]           # shapes world: pre-train, fine-tune, evaluate, report
    namc describe first.png second.png --model runs/demo/namc_model
    namc data ...                                  # corpus / shapes world tools (namc.data.cli)
    namc eval predictions.json references.json     # caption metrics (namc.eval.captions)
    namc benchmark ...                             # throughput (namc.eval.benchmark)

Values both the model and the data need are linked, so a config states each once: the model's preset (or the
``pretrained`` folder / checkpoint it starts from) fixes the data's image size, caption lengths and tokenizer kind,
and the tokenizer the datamodule builds or loads is handed to the model.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from namc.lit.datamodules import NAMCDataModule
from namc.lit.modules import NAMCModule

__all__ = ["NAMCCLI", "describe_main", "main"]

logger = logging.getLogger(__name__)

_LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
_USAGE = """usage: namc COMMAND [ARGS]

Training and evaluation (LightningCLI; `namc COMMAND --help` for every option):
  fit        train: --config configs/pretrain/namc_base.yaml or configs/finetune/<benchmark>.yaml
  validate   score a checkpoint on the validation split (--ckpt_path)
  test       score a checkpoint on the test split (--ckpt_path)
  predict    caption the test split or a list of image pairs (--data.init_args.predict_pairs FILE)

Other commands:
  demo       shapes world end to end on a CPU: pre-train, fine-tune, evaluate, report (--fast: about a minute)
  describe   caption one pair of image files with a saved model: namc describe A.png B.png --model DIR
  data       build and inspect corpora and the shapes world (namc data --help)
  eval       caption metrics of a predictions file (namc eval --help)
  benchmark  throughput: generated tokens/s, parameters, memory (namc benchmark --help)
"""


def quiet_warnings() -> None:
    """Silence deprecation noise that jsonargparse >= 4.49 emits through LightningCLI."""
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"jsonargparse.*")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"jsonargparse.*")
    warnings.filterwarnings("ignore", message=r".*jsonargparse.*", category=DeprecationWarning)
    # the frozen ResNet grid and VQGAN stay in eval mode on purpose (their BatchNorm statistics must not change)
    warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    # `namc` passes its arguments on to LightningCLI explicitly (main(argv) is also called from Python)
    warnings.filterwarnings("ignore", message=r"LightningCLI's args parameter is intended")
    # the corpus stream's __len__ is exact: every reader yields the same count (namc.lit.datamodules._EvenStream)
    warnings.filterwarnings("ignore", message=r"Your `IterableDataset` has `__len__` defined")
    try:
        from jsonargparse import JsonargparseDeprecationWarning  # type: ignore[attr-defined]

        warnings.filterwarnings("ignore", category=JsonargparseDeprecationWarning)
    except ImportError:
        pass


# ------------------------------------------------------------------------------------------------ links


def _init_args(model: Any) -> dict[str, Any]:
    """The ``init_args`` of a parsed ``model`` (a Namespace with ``class_path``/``init_args``) as a dict."""
    init = getattr(model, "init_args", None)
    if init is None:
        return {}
    return dict(init.as_dict() if hasattr(init, "as_dict") else vars(init))


def model_settings(model: Any) -> Any:
    """The :class:`NAMCConfig` a parsed ``model`` section will build (the pretrained one's when it can be read).

    An unreadable ``pretrained`` path falls back to the preset, so ``--print_config`` works before the files exist;
    the module itself reports the missing file when it is built.
    """
    from namc.models import model_config

    args = _init_args(model)
    pretrained = args.get("pretrained")
    if pretrained:
        path = Path(pretrained)
        try:
            return _saved_config(str(path.resolve()), path.stat().st_mtime)
        except (FileNotFoundError, ValueError, OSError):
            pass
    return model_config(args.get("model") or "namc_tiny", **dict(args.get("overrides") or {}))


@functools.lru_cache(maxsize=8)
def _saved_config(path: str, mtime: float) -> Any:
    """A saved model's config, read once per parse (every link asks for it)."""
    from namc.lit.checkpoints import read_model_config

    return read_model_config(path)


def link_image_size(model: Any) -> int:
    """The image side the model expects (``data.init_args.image_size``)."""
    return int(model_settings(model).image_size)


def link_max_caption_len(model: Any) -> int:
    """The most caption ids FDG can read (``data.init_args.max_caption_len``)."""
    return int(model_settings(model).max_caption_len)


def clip_context_length(clip_model: str) -> int:
    """The text context length of an open_clip config (77 for ViT-B/16; 48 for namc's tiny CLIP)."""
    import open_clip

    import namc.models.encoders  # noqa: F401  (registers namc's CLIP configs)

    cfg = open_clip.get_model_config(clip_model)
    return int(cfg["text_cfg"].get("context_length", 77)) if cfg else 77


def link_max_text_len(model: Any) -> int:
    """The CLIP text context length of the model's NIM text tower."""
    return clip_context_length(model_settings(model).clip_model)


def link_tokenizer(model: Any) -> str:
    """``pretrained`` (its tokenizer is reused) or the preset's tokenizer kind (``word`` / ``clip_bpe``)."""
    pretrained = _init_args(model).get("pretrained")
    return str(pretrained) if pretrained else str(model_settings(model).tokenizer)


class NAMCCLI(LightningCLI):
    """LightningCLI over :mod:`namc.lit` modules and :mod:`namc.lit.datamodules`, with the links above.

    ``model`` and ``data`` take ``class_path``/``init_args`` (subclass mode): :class:`~namc.lit.PretrainModule` or
    :class:`~namc.lit.FinetuneModule`, and :class:`~namc.lit.datamodules.CorpusDataModule` or
    :class:`~namc.lit.datamodules.BenchmarkDataModule`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("model_class", NAMCModule)
        kwargs.setdefault("datamodule_class", NAMCDataModule)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("model", "data.init_args.image_size", compute_fn=link_image_size, apply_on="parse")
        parser.link_arguments("model", "data.init_args.tokenizer", compute_fn=link_tokenizer, apply_on="parse")
        parser.link_arguments(
            "model", "data.init_args.max_caption_len", compute_fn=link_max_caption_len, apply_on="parse"
        )
        parser.link_arguments("model", "data.init_args.max_text_len", compute_fn=link_max_text_len, apply_on="parse")
        parser.link_arguments("data.caption_tokenizer", "model.init_args.tokenizer", apply_on="instantiate")


def run_lightning(args: Sequence[str] | dict[str, Any], run: bool = True) -> Any:
    """Run (or, with ``run=False``, only build) the LightningCLI with ``args`` (a list of strings or a dict)."""
    quiet_warnings()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return NAMCCLI(args=args, run=run)


# ------------------------------------------------------------------------------------------------ describe


def describe_main(argv: Sequence[str] | None = None) -> int:
    """``namc describe A.png B.png --model DIR``: caption what changed from the first image to the second."""
    parser = argparse.ArgumentParser(prog="namc describe", description="Caption the change between two image files.")
    parser.add_argument("image1", help="the first ('before') image")
    parser.add_argument("image2", help="the second ('after') image")
    parser.add_argument("--model", required=True, help="a save_pretrained folder (or a namc .ckpt)")
    parser.add_argument("--beams", type=int, default=1, help="beam width (1: greedy, as the paper)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="longest caption (default: the model's, 23)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    args = parser.parse_args(argv)

    import torch

    from namc.data.transforms import ImageTransform
    from namc.lit.checkpoints import load_namc

    try:
        model = load_namc(args.model, pretraining=False).to(args.device).eval()
        transform = ImageTransform(model.config.image_size)
        images = []
        for path in (args.image1, args.image2):
            if not Path(path).is_file():
                raise FileNotFoundError(f"image not found: {path}")
            try:
                images.append(transform.load(path)[None].to(args.device))  # (1, 3, H, W)
            except (OSError, SyntaxError, ValueError) as err:
                raise ValueError(f"cannot read image {path}: {err}") from err
    except (FileNotFoundError, ValueError) as err:
        print(f"namc describe: error: {err}", file=sys.stderr)
        return 2
    with torch.inference_mode():
        caption = model.generate(images[0], images[1], args.max_new_tokens, args.beams)[0]
    print(caption)
    return 0


# ------------------------------------------------------------------------------------------------ main


def _dispatch(module: str, argv: list[str], what: str) -> int:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and module.startswith(err.name):
            print(f"namc {what}: not available in this installation ({module} is missing)", file=sys.stderr)
            return 2
        raise
    status = mod.main(argv)
    return int(status or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``namc`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        return _dispatch("namc.lit.demo", rest, "demo")
    if command == "describe":
        return describe_main(rest)
    if command == "data":
        return _dispatch("namc.data.cli", rest, "data")
    if command == "eval":
        return _dispatch("namc.eval.captions", rest, "eval")
    if command == "benchmark":
        return _dispatch("namc.eval.benchmark", rest, "benchmark")
    if command not in _LIGHTNING_COMMANDS and not command.startswith("-"):
        print(f"namc: unknown command {command!r}\n\n{_USAGE}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    run_lightning(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
