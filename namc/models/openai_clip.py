"""OpenAI's CLIP checkpoint (e.g. ``ViT-B-16.pt``) as an open_clip-layout ``.safetensors`` state dict.

namc initialises its NIM dual encoders from CLIP ViT-B/16 (paper section 3.2.1) and reads weights only through
safetensors or ``torch.load(weights_only=True)``. OpenAI distributes CLIP as a TorchScript archive, which neither
reads, so ``namc convert-clip ViT-B-16.pt clip_vit_b16.safetensors`` converts it once (:mod:`namc.convert_cli`), and
the output is the CLIP ``pretrained`` path. The result loads strictly into
``open_clip.create_model("ViT-B-16-quickgelu")``: OpenAI's models were trained with QuickGELU, and the plain
``ViT-B-16`` config uses GELU, which would silently compute something else.

Security: a TorchScript input is opened with ``torch.jit.load``, which deserialises the archive's TorchScript code.
Convert only the file you downloaded yourself from OpenAI's official CLIP release (the URLs are listed in
``open_clip.pretrained``, tag ``openai``). A plain state dict in OpenAI's layout (``torch.save(model.state_dict())``,
optionally under ``state_dict`` / with a ``module.`` prefix) is read with the safe loader instead.

The conversion uses open_clip's own helper for OpenAI state dicts (``build_model_from_openai_state_dict``: infers the
architecture, drops the ``input_resolution`` / ``context_length`` / ``vocab_size`` entries, loads strictly), casts
OpenAI's float16 weights to float32 (exact), and checks the result strictly against the target open_clip config
before writing it.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import open_clip
import torch
from open_clip.model import CustomTextCLIP, build_model_from_openai_state_dict, convert_to_custom_text_state_dict

from namc.models.io import WeightsError, load_state_dict, load_strict, save_safetensors

__all__ = ["DEFAULT_MODEL", "convert", "is_torchscript", "read_openai_state_dict"]

DEFAULT_MODEL = "ViT-B-16-quickgelu"


def is_torchscript(path: Path) -> bool:
    """Whether ``path`` is a TorchScript archive (a zip with a ``constants.pkl`` record, as torch checks it)."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("/constants.pkl") or name == "constants.pkl" for name in archive.namelist())


def read_openai_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read an OpenAI-layout CLIP state dict from a TorchScript archive or a plain checkpoint.

    Args:
        path: OpenAI's ``ViT-B-16.pt`` (TorchScript) or a saved OpenAI-layout state dict.

    Returns:
        ``name -> tensor`` in OpenAI's layout (``visual.*``, ``transformer.*``, ``token_embedding.weight``, ...).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"OpenAI CLIP checkpoint not found at {path}; download ViT-B-16.pt from OpenAI's CLIP release "
            "(URL in open_clip.pretrained, tag 'openai') and pass its path"
        )
    if is_torchscript(path):
        # TorchScript code is deserialised here: only for the file downloaded from OpenAI (see module docstring).
        return dict(torch.jit.load(str(path), map_location="cpu").state_dict())
    return load_state_dict(path, hint="OpenAI CLIP checkpoint")


def convert(src: str | Path, dst: str | Path, model_name: str = DEFAULT_MODEL) -> dict[str, torch.Tensor]:
    """Convert an OpenAI CLIP checkpoint into an open_clip ``model_name`` state dict and write it as safetensors.

    Args:
        src: OpenAI checkpoint (TorchScript archive or plain OpenAI-layout state dict).
        dst: Output ``.safetensors`` path.
        model_name: open_clip config the result must load into strictly.

    Returns:
        The written state dict (float32).

    Raises:
        FileNotFoundError: ``src`` does not exist.
        WeightsError: the checkpoint does not fit ``model_name`` (names the keys).
    """
    openai_sd = read_openai_state_dict(src)
    try:
        # open_clip's helper infers the architecture from the weights and loads them with strict=True.
        source = build_model_from_openai_state_dict(dict(openai_sd), quick_gelu=True, cast_dtype=None)
    except (KeyError, RuntimeError) as exc:
        raise WeightsError(f"{src} is not an OpenAI CLIP state dict open_clip can read: {exc}") from exc
    source.float()  # OpenAI stores linear / conv / attention weights in float16; float32 holds them exactly
    state_dict = source.state_dict()

    target = open_clip.create_model(model_name, pretrained=None)
    if isinstance(target, CustomTextCLIP):  # text tower under `text.` in custom-text configs
        state_dict = convert_to_custom_text_state_dict(state_dict)
    load_strict(target, state_dict, what=f"OpenAI CLIP from {src} into open_clip {model_name!r}")
    state_dict = target.state_dict()
    save_safetensors(state_dict, dst, metadata={"source": Path(src).name, "open_clip_model": model_name})
    return state_dict
