"""LightningCLI for training and evaluation: ``namc fit | validate | test | predict`` (dispatched by :mod:`namc.cli`).

::

    namc fit --config configs/finetune/clevr_change.yaml [--trainer.max_epochs 5 ...] [--ckpt_path last.ckpt]
    namc validate | test | predict --config ... --ckpt_path best.ckpt
    namc fit --config configs/pretrain/namc_base.yaml --print_config

Values both the model and the data need are linked, so a config states each once: the model's preset (or the
``pretrained`` folder / checkpoint it starts from) fixes the data's image size, caption lengths and tokenizer kind,
and the tokenizer the datamodule builds or loads is handed to the model.

Checkpoints are loaded safely: ``--ckpt_path`` is read with ``weights_only=True`` (set explicitly, so neither an
environment variable nor Lightning's defaults can turn unpickling on). ``--weights_only false`` and an
``http(s)://`` ``--ckpt_path`` (Lightning downloads it and unpickles it with code execution enabled unless told
otherwise) are refused before anything is built, unless ``--allow_unsafe_checkpoint true`` says the file is trusted.

Run as a program, a command runs as a job under :mod:`namc.lit.supervisor`: when it ends, by success or by a failing
DDP rank, every process it started (ranks, DataLoader workers, the fork server, the resource tracker) has ended too.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonargparse
import yaml
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from namc.backends.qlinear import int8_kernels
from namc.lit.datamodules import NAMCDataModule
from namc.lit.modules import NAMCModule
from namc.lit.supervisor import fork_job, should_supervise
from namc.models import model_config
from namc.models.io import WeightsError, read_checkpoint, read_config
from namc.yamltext import YAMLTextError, check_size

__all__ = [
    "NAMCCLI",
    "CheckpointFileError",
    "UnsafeCheckpointError",
    "check_checkpoint_readable",
    "check_checkpoint_safety",
    "main",
    "run_lightning",
]

logger = logging.getLogger(__name__)


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
    # the corpus stream's __len__ is exact: every reader yields the same count (namc.data.views.EvenStream)
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
    return read_config(path)


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


class UnsafeCheckpointError(ValueError):
    """A checkpoint option that would unpickle a file with code execution enabled, without the user's consent."""


class CheckpointFileError(ValueError):
    """A local ``--ckpt_path`` that is missing or does not load (the message names it)."""


_ALLOW_UNSAFE = "allow_unsafe_checkpoint"


def check_checkpoint_safety(config: Any) -> None:
    """Refuse unsafe checkpoint loading in a parsed subcommand config; make the safe default explicit.

    ``weights_only=False`` and an ``http(s)`` ``ckpt_path`` raise :class:`UnsafeCheckpointError` unless
    ``allow_unsafe_checkpoint`` is set; otherwise an unset ``weights_only`` becomes ``True``.
    """
    ckpt_path = config.get("ckpt_path")
    weights_only = config.get("weights_only")
    remote = isinstance(ckpt_path, str) and ckpt_path.lower().startswith(("http://", "https://"))
    if config.get(_ALLOW_UNSAFE):
        if remote or weights_only is False:
            logger.warning("--%s: %s may be unpickled with code execution enabled", _ALLOW_UNSAFE, ckpt_path)
        return
    if remote:
        raise UnsafeCheckpointError(
            f"refusing --ckpt_path {ckpt_path}: Lightning downloads a remote checkpoint and, unless told otherwise, "
            "unpickles it with code execution enabled, so a file from the network can run code on this machine. "
            "Download it, check where it came from, and pass the local file (read with weights_only=True); or, if "
            f"you trust it, add --{_ALLOW_UNSAFE} true"
        )
    if weights_only is False:
        raise UnsafeCheckpointError(
            "refusing --weights_only false: it unpickles the checkpoint with code execution enabled, so the file can "
            "run code on this machine (namc's own checkpoints load with weights_only=True). If, and only if, you "
            f"trust the file, add --{_ALLOW_UNSAFE} true"
        )
    if "weights_only" in config and weights_only is None:
        config["weights_only"] = True


_CKPT_KEYWORDS = ("last", "best", "hpc", "registry")  # ckpt_path values Lightning resolves itself


def check_checkpoint_readable(ckpt_path: Any) -> None:
    """A local ``--ckpt_path`` that is missing or does not load is one line naming the file (not a traceback that
    names none, after the model and data were set up); Lightning's keywords and URLs are left to Lightning."""
    if not isinstance(ckpt_path, str) or ckpt_path in _CKPT_KEYWORDS or ":" in ckpt_path.split("/")[0]:
        return
    try:
        read_checkpoint(ckpt_path)
    except (FileNotFoundError, WeightsError) as err:
        raise CheckpointFileError(str(err)) from None
    except ValueError:  # a Lightning checkpoint without namc's entry: Lightning says what it makes of it
        pass


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
        # every checkpoint is written atomically (a kill during a save leaves the previous one whole)
        kwargs.setdefault("trainer_defaults", {"plugins": [{"class_path": "namc.lit.callbacks.AtomicCheckpointIO"}]})
        super().__init__(*args, **kwargs)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand:  # before Lightning reads the checkpoint's hyper-parameters or anything is built
            check_checkpoint_safety(self.config[subcommand])
            check_checkpoint_readable(self.config[subcommand].get("ckpt_path"))

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            f"--{_ALLOW_UNSAFE}",
            type=bool,
            default=False,
            help="Allow --weights_only false and an http(s) --ckpt_path, which unpickle the checkpoint with code "
            "execution enabled: only for files you trust",
        )
        parser.link_arguments("model", "data.init_args.image_size", compute_fn=link_image_size, apply_on="parse")
        parser.link_arguments("model", "data.init_args.tokenizer", compute_fn=link_tokenizer, apply_on="parse")
        parser.link_arguments(
            "model", "data.init_args.max_caption_len", compute_fn=link_max_caption_len, apply_on="parse"
        )
        parser.link_arguments("model", "data.init_args.max_text_len", compute_fn=link_max_text_len, apply_on="parse")
        parser.link_arguments("data.caption_tokenizer", "model.init_args.tokenizer", apply_on="instantiate")


def bound_config_yaml() -> None:
    """Bound the YAML loader of jsonargparse (which reads ``--config`` files and option values) as namc's own YAML is
    (:mod:`namc.yamltext`): a config whose aliases expand past the budget (the "billion laughs") or that nests past
    Python's recursion is refused in one line, where jsonargparse would walk the expanded tree for minutes. The
    loader's own parsing (its number and value rules) is kept."""
    plain = jsonargparse.get_loader("yaml")
    if getattr(plain, "bounded", False):
        return

    def bounded(text: str) -> Any:
        try:
            value = plain(text)
        except RecursionError:
            raise YAMLTextError("nested too deeply") from None
        check_size(value)
        return value

    bounded.bounded = True
    jsonargparse.set_loader("yaml", bounded, exceptions=(yaml.YAMLError, YAMLTextError))


def config_files(argv: Sequence[str]) -> list[Path]:
    """The files ``--config PATH`` / ``--config=PATH`` name in ``argv`` (a value that is not a file is left to
    jsonargparse, which also takes a config as a YAML string)."""
    values = [b for a, b in zip(argv, argv[1:], strict=False) if a == "--config"]
    values += [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    return [Path(v) for v in values if Path(v).is_file()]


def run_lightning(args: Sequence[str] | dict[str, Any], run: bool = True) -> Any:
    """Run (or, with ``run=False``, only build) the LightningCLI with ``args`` (a list of strings or a dict)."""
    quiet_warnings()
    bound_config_yaml()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return NAMCCLI(args=args, run=run)


# ------------------------------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    """``namc fit | validate | test | predict ...``: run the LightningCLI (``namc.cli`` dispatches here)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if should_supervise():  # the job runs in a session of its own, which ends with it (namc.lit.supervisor)
        code = fork_job(argv)
        if code is not None:  # the supervisor, after the job and what it started have ended
            return code
    command = argv[0] if argv else "fit"
    try:  # a wrong NAMC_INT8_KERNELS is one line now, not a traceback at the first int8 evaluation of a long run
        int8_kernels()
    except (ValueError, RuntimeError) as err:
        print(f"namc {command}: error: {err}", file=sys.stderr)
        return 2
    for path in config_files(argv):  # one line naming the file, before LightningCLI's usage text
        try:
            bound_config_yaml()
            jsonargparse.get_loader("yaml")(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as err:
            print(f"namc {command}: error: {path}: {' '.join(str(err).split())}", file=sys.stderr)
            return 2
    try:
        run_lightning(argv)
    except (UnsafeCheckpointError, CheckpointFileError) as err:
        print(f"namc {command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
