"""The one place that reads (and writes) model files: weights, saved model folders, namc's Lightning checkpoints.

Every pretrained part of namc (CLIP towers, the ResNet grid encoder, the VQGAN tokenizer, a trained NAMC) reads
its weights through :func:`load_state_dict` and loads them through :func:`load_strict`:

- safetensors files are read with ``safetensors``; anything else with ``torch.load(weights_only=True)``, so no
  checkpoint can run code on this machine;
- wrapper layouts are undone in one function, :func:`clean_state_dict`;
- a missing, unexpected (and not explicitly ignored) or mis-shaped key is an error that names the key; nothing is
  loaded with ``strict=False``.

A saved model is a folder (``config.json`` + ``model.safetensors`` + tokenizer files + ``README.md``,
:func:`read_config` / :func:`write_config`); its ``config.json`` records the SHA-256 of the other files, checked by
:func:`verify_folder` (:mod:`namc.models.files`). A Lightning ``.ckpt`` written by :mod:`namc.lit` carries, beside
Lightning's own entries, one ``"namc"`` entry of plain data: the model's :class:`~namc.models.config.NAMCConfig` as
a dict, its tokenizer as a dict and the namc version (:func:`checkpoint_entry`). Everything is read with
``torch.load(weights_only=True)``. An unreadable config is a :class:`ConfigError` naming the file and the line and
column or key; an unreadable weights file is a :class:`WeightsError` naming the file.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from namc.models.config import NAMCConfig
from namc.models.files import (
    FILES_KEY,
    LIGHTNING_CALLBACK_KEYS,
    ConfigError,
    WeightsError,
    atomic_write_text,
    check_fields,
    check_files,
    describe_load_error,
    load_error_advice,
    read_json,
)
from namc.models.hub import resolve_model_path
from namc.text.tokenizer import TOKENIZER_FILE, CaptionTokenizer, tokenizer_from_dict, tokenizer_to_dict

logger = logging.getLogger(__name__)

__all__ = [
    "CONFIG_FILE",
    "NAMC_KEY",
    "WEIGHTS_FILE",
    "ConfigError",
    "WeightsError",
    "checkpoint_entry",
    "checkpoint_state_dict",
    "clean_state_dict",
    "load_state_dict",
    "load_strict",
    "read_checkpoint",
    "read_config",
    "read_tokenizer",
    "save_safetensors",
    "verify_folder",
    "write_config",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
NAMC_KEY = "namc"  # namc's entry in a Lightning checkpoint
# Config fields naming the files a fresh model's pretrained parts are read from; a saved model does not need them.
_PART_PATHS = ("clip_pretrained", "grid_pretrained", "vqgan_pretrained")

# How many offending key names an error message lists before it says "... and N more".
_MAX_LISTED_KEYS = 8

# Prefixes that wrappers add in front of every key: DataParallel / DistributedDataParallel (`module.`), a
# LightningModule holding the network as `self.model` (`model.`), torch.compile's OptimizedModule (`_orig_mod.`).
_WRAPPER_PREFIXES = ("module.", "model.", "_orig_mod.")


def _list_keys(keys: list[str]) -> str:
    """Format the first few keys and a count, e.g. ``3 keys: a, b, c``."""
    shown = ", ".join(keys[:_MAX_LISTED_KEYS])
    more = f" ... and {len(keys) - _MAX_LISTED_KEYS} more" if len(keys) > _MAX_LISTED_KEYS else ""
    return f"{len(keys)} key{'s' if len(keys) != 1 else ''}: {shown}{more}"


def clean_state_dict(obj: Mapping[str, object], *, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Undo the wrapper layouts of a loaded checkpoint and return a plain ``name -> tensor`` state dict.

    1. A top-level ``state_dict`` entry is unwrapped: Lightning checkpoints (taming's ``last.ckpt`` among them)
       keep the weights there beside ``global_step``, ``optimizer_states``, ...
    2. A wrapper prefix (``module.``, ``model.``, ``_orig_mod.``) is stripped, repeatedly, but only when EVERY key
       carries it. A prefix that every key shares was added by a wrapper (DDP, a LightningModule's ``self.model``,
       ``torch.compile``) around the whole network; a prefix on only some keys is a real submodule name (a network
       with a child called ``model`` next to others) and must stay, or the keys would no longer match.

    Args:
        obj: What ``torch.load`` / ``safetensors`` returned.
        source: Where ``obj`` came from, for error messages.

    Returns:
        The state dict, keys with the wrapper prefix removed, values tensors.

    Raises:
        WeightsError: ``obj`` is not a mapping of names to tensors (after unwrapping).
    """
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping):
        raise WeightsError(f"{source} holds a {type(obj).__name__}, not a state dict (a mapping of names to tensors)")
    not_tensors = [str(k) for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise WeightsError(f"{source} is not a state dict of tensors; non-tensor entries: {_list_keys(not_tensors)}")
    state_dict = {str(k): v for k, v in obj.items()}

    stripped = True
    while stripped and state_dict:
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in state_dict):
                logger.debug("%s: stripping the wrapper prefix %r shared by all %d keys", source, prefix, len(obj))
                state_dict = {k[len(prefix) :]: v for k, v in state_dict.items()}
                stripped = True
    return state_dict


def load_state_dict(path: str | Path, *, hint: str = "") -> dict[str, torch.Tensor]:
    """Read a checkpoint file safely and return its cleaned state dict.

    ``.safetensors`` files are read with safetensors; every other file with
    ``torch.load(path, map_location="cpu", weights_only=True)``. The result goes through :func:`clean_state_dict`.

    Args:
        path: The checkpoint file.
        hint: What the file is and where to get it, e.g. ``"the ResNet-101 ImageNet weights (timm resnet101.tv_in1k,
            or torchvision's resnet101-63fe2227.pth)"``; it is quoted when the file is missing.

    Returns:
        The state dict (on CPU), keys without wrapper prefixes.

    Raises:
        FileNotFoundError: ``path`` does not exist (the message says where it was looked for and quotes ``hint``).
        WeightsError: the file exists but cannot be read as weights (corrupt, or a pickle that needs objects the
            safe loader refuses); the message names the file, the cause and, where one exists, a conversion.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        what = f"{hint}: " if hint else ""
        raise FileNotFoundError(
            f"{what}no checkpoint file at {path} (resolved: {path.resolve()}). Pretrained weights are never downloaded"
            " by namc; download the file yourself and pass its local path."
        )
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            obj = load_file(str(path), device="cpu")
        else:
            with torch.serialization.safe_globals(LIGHTNING_CALLBACK_KEYS), warnings.catch_warnings():
                # torch warns before refusing a TorchScript archive; the error below says what to do instead
                warnings.filterwarnings("ignore", message=".*looks like a TorchScript archive")
                obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any failure to read the file becomes one error type that names the file
        raise WeightsError(
            f"cannot read checkpoint {path}: {describe_load_error(exc)}.{load_error_advice(path, exc)}"
        ) from exc
    state_dict = clean_state_dict(obj, source=str(path))
    logger.debug("read %d tensors from %s", len(state_dict), path)
    return state_dict


def load_strict(
    module: nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    *,
    what: str,
    ignore_unexpected: Callable[[str], bool] | None = None,
) -> None:
    """Load ``state_dict`` into ``module``, refusing any key or shape mismatch.

    Missing keys, unexpected keys (unless ``ignore_unexpected(key)`` is true) and shape mismatches are all
    collected first and reported together in one :class:`WeightsError`; only then is
    ``module.load_state_dict(..., strict=True)`` called with the keys the module owns. The one tolerated gap is a
    BatchNorm ``num_batches_tracked`` counter that pre-0.4 checkpoints lack (PyTorch fills it in itself).

    Args:
        module: The module to fill.
        state_dict: ``name -> tensor``, usually from :func:`load_state_dict`.
        what: What is being loaded and from where, e.g. ``"ResNet-101 grid encoder from /ckpt/resnet101.pth"``.
        ignore_unexpected: Predicate for checkpoint keys the module is known not to have (a decoder, a loss, a
            classifier head pruned by ``features_only``); those are dropped without error.

    Raises:
        WeightsError: naming ``what`` and the offending keys (first few, and the count).
    """
    expected = module.state_dict()
    missing = [k for k in expected if k not in state_dict and not _is_legacy_batchnorm_counter(module, k)]
    unexpected = [k for k in state_dict if k not in expected]
    ignored = {k for k in unexpected if ignore_unexpected is not None and ignore_unexpected(k)}
    unexpected = [k for k in unexpected if k not in ignored]
    mismatched = [
        f"{k} (checkpoint {tuple(state_dict[k].shape)}, model {tuple(v.shape)})"
        for k, v in expected.items()
        if k in state_dict and state_dict[k].shape != v.shape
    ]
    problems = []
    if missing:
        problems.append(f"missing {_list_keys(missing)}")
    if unexpected:
        problems.append(f"unexpected {_list_keys(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatch in {_list_keys(mismatched)}")
    if problems:
        raise WeightsError(f"cannot load {what}: " + "; ".join(problems))
    if ignored:
        logger.info(
            "%s: ignoring %d checkpoint keys the model does not use (e.g. %s)", what, len(ignored), min(ignored)
        )
    module.load_state_dict({k: state_dict[k] for k in expected if k in state_dict}, strict=True)
    logger.info("loaded %s (%d tensors)", what, len(expected))


def _is_legacy_batchnorm_counter(module: nn.Module, key: str) -> bool:
    """Whether ``key`` is a BatchNorm ``num_batches_tracked`` counter, which older checkpoints do not have.

    Checkpoints written before PyTorch 0.4 (torchvision's original ImageNet ResNets, and timm's ``tv_in1k`` copies
    of them) lack the counter. BatchNorm's own ``_load_from_state_dict`` fills it in for such files, and the counter
    is not a weight (BatchNorm reads it only when ``momentum=None``), so its absence is not an error.
    """
    owner, _, leaf = key.rpartition(".")
    if leaf != "num_batches_tracked":
        return False
    try:
        return isinstance(module.get_submodule(owner), nn.modules.batchnorm._BatchNorm)
    except AttributeError:
        return False


def save_safetensors(
    state_dict: Mapping[str, torch.Tensor], path: str | Path, *, metadata: dict[str, str] | None = None
) -> None:
    """Write a state dict as a safetensors file.

    safetensors refuses non-contiguous tensors and tensors that share memory (tied weights, views); every tensor
    is written as its own contiguous CPU copy, so loading gives independent tensors (re-tie after loading where
    the model ties weights).

    Args:
        state_dict: ``name -> tensor``.
        path: The output file (parents are created).
        metadata: Optional string metadata stored in the file header.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    tensors = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().cpu().contiguous()
        if tensor.numel() > 0:
            pointer = tensor.untyped_storage().data_ptr()
            if pointer in seen:  # shares memory with a tensor already written
                tensor = tensor.clone()
            seen.add(tensor.untyped_storage().data_ptr())
        tensors[name] = tensor
    save_file(tensors, str(path), metadata=metadata)


# ------------------------------------------------------------------------------------------------ saved models


def write_config(
    directory: Path, config: NAMCConfig, version: str, files: Mapping[str, Mapping[str, Any]] | None = None
) -> None:
    """Write ``config.json`` atomically: the config, the namc version that wrote it and the digests of ``files``."""
    data: dict[str, Any] = {"namc_version": version, **config.to_dict()}
    if files is not None:
        data[FILES_KEY] = dict(files)
    atomic_write_text(directory / CONFIG_FILE, json.dumps(data, indent=2))


def checkpoint_entry(config: NAMCConfig, tokenizer: CaptionTokenizer, version: str) -> dict[str, Any]:
    """The ``checkpoint["namc"]`` entry of a Lightning checkpoint: config, tokenizer and version, all plain data."""
    return {"config": config.to_dict(), "tokenizer": tokenizer_to_dict(tokenizer), "version": version}


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a Lightning checkpoint safely (``weights_only=True``) and check it holds a namc entry.

    Raises:
        FileNotFoundError: no file at ``path``.
        WeightsError: the file cannot be read safely (corrupt, truncated, a pickle of Python objects).
        ValueError: the file is not a namc Lightning checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no saved model at {path}: expected a save_pretrained folder or a namc .ckpt")
    if path.suffix == ".safetensors":
        raise ValueError(
            f"{path} holds weights only: pass the folder that holds it with config.json and tokenizer.json "
            "(as written by save_pretrained)"
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # tensors paged in only when used
    except Exception as exc:  # any failure to read the file becomes one error type that names the file
        raise WeightsError(
            f"cannot read checkpoint {path}: {describe_load_error(exc)}.{load_error_advice(path, exc)}"
        ) from exc
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get(NAMC_KEY), dict) or "state_dict" not in ckpt:
        raise ValueError(
            f"{path} is not a namc Lightning checkpoint (no '{NAMC_KEY}' entry): pass a .ckpt written by `namc fit` "
            "or a folder written by save_pretrained"
        )
    return ckpt


def checkpoint_state_dict(ckpt: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The NAMC weights of a LightningModule state dict (the module holds the network as ``self.model``)."""
    return {k[len("model.") :]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}


def _config_from(data: Any, where: str, max_parameters: float | None = None) -> NAMCConfig:
    """A checked :class:`NAMCConfig` from decoded JSON, every problem a :class:`ConfigError` naming ``where`` and the
    key (:meth:`NAMCConfig.validate`: types, ranges, model names, the parameters it would build).

    A saved model holds every weight, so the pretrained-part paths its config names (a training checkpoint records
    the files its training started from) are dropped: a model file never makes namc read a file outside it.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object of config keys, got {type(data).__name__}")
    data = {k: v for k, v in data.items() if k not in ("namc_version", FILES_KEY)}
    check_fields(data, NAMCConfig, where)
    named = {k: data[k] for k in _PART_PATHS if data.get(k) is not None}
    if named:
        logger.debug("%s: not reading the pretrained parts it names (the saved weights replace them): %s", where, named)
    config = NAMCConfig(**{**data, **dict.fromkeys(_PART_PATHS)})
    config.validate(where, max_parameters)
    return config


def _folder_config(directory: Path) -> dict[str, Any]:
    cfg_path = directory / CONFIG_FILE
    if not cfg_path.is_file():
        raise FileNotFoundError(
            f"{cfg_path} not found: a NAMC model folder holds {CONFIG_FILE}, {WEIGHTS_FILE} and tokenizer.json, "
            "as written by model.save_pretrained(dir) or `namc fit` / `namc demo`"
        )
    return read_json(cfg_path)


def read_config(path: str | Path, max_parameters: float | None = None) -> NAMCConfig:
    """The checked :class:`NAMCConfig` of a saved model: a ``save_pretrained`` folder or a namc ``.ckpt``.

    The config is validated before anything is built from it (:meth:`NAMCConfig.validate`); its pretrained-part
    paths are ``None`` (the saved weights replace them).

    Args:
        path: the folder, a Hub id or the ``.ckpt`` file.
        max_parameters: the most parameters the config may build (default: ``NAMC_MAX_PARAMETERS``, else 2e9).

    Raises:
        FileNotFoundError: no config there.
        ConfigError: ``config.json`` is not UTF-8 or not JSON or too deeply nested (the message names the line and
            column), or has an unknown key, a value of the wrong type or out of range, an unknown model name, or
            would build more parameters than allowed (the message names the key).
    """
    path = resolve_model_path(path)
    if not (path.is_file() or path.suffix == ".ckpt"):
        return _config_from(_folder_config(path), str(path / CONFIG_FILE), max_parameters)
    where = f"{path} ['{NAMC_KEY}']['config']"
    return _config_from(read_checkpoint(path)[NAMC_KEY].get("config"), where, max_parameters)


def verify_folder(directory: str | Path) -> list[str]:
    """Check the files of a model folder against the SHA-256 digests its ``config.json`` records.

    Returns:
        The names of the files checked (empty for a folder saved before namc recorded digests).

    Raises:
        WeightsError: a recorded file is missing or differs (the message names it and both digests).
    """
    directory = Path(directory)
    return check_files(directory, _folder_config(directory).get(FILES_KEY), directory / CONFIG_FILE)


def read_tokenizer(path: str | Path) -> CaptionTokenizer:
    """The tokenizer of a saved model: a folder with ``tokenizer.json`` or a namc ``.ckpt``.

    Raises:
        FileNotFoundError: no tokenizer there.
        ConfigError: ``tokenizer.json`` (or the checkpoint's tokenizer entry) is unreadable.
    """
    path = resolve_model_path(path)
    if path.is_dir():
        file = path / TOKENIZER_FILE
        if not file.is_file():
            raise FileNotFoundError(f"no {TOKENIZER_FILE} in {path}: expected a folder written by save_pretrained")
        data, where, directory = read_json(file), str(file), path
    elif path.is_file():
        data, where, directory = read_checkpoint(path)[NAMC_KEY].get("tokenizer"), f"{path} ['{NAMC_KEY}']", None
    else:
        raise FileNotFoundError(
            f"saved model not found at {path}: expected a save_pretrained folder (config.json, model.safetensors, "
            "tokenizer.json) or a Lightning .ckpt written by `namc fit`; run the pre-training first "
            "(`namc fit --config configs/pretrain/namc_base.yaml` exports runs/pretrain_namc_base/model)"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a tokenizer object, got {type(data).__name__}")
    try:
        return tokenizer_from_dict(data, where=where, directory=directory)
    except (KeyError, TypeError, OSError) as err:
        raise ConfigError(f"{where}: not a namc tokenizer ({type(err).__name__}: {err})") from None
    except ValueError as err:
        raise ConfigError(str(err)) from None
