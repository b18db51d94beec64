"""The two image encoders of pair mining (appendix D.1, Eq. 3): CLIP ViT-L/14 (open_clip) and DINOv2 ViT-L/14 (timm).

Appendix D.1: "We use ViT-L-14 as the CLIP image encoder and a large backbone size for the DINOv2 image encoder."
Each encoder is built from its architecture's own code (``open_clip.CLIP``, timm's ``vit_large_patch14_dinov2``),
reads a local weights file through namc's one strict loader (:func:`namc.models.io.load_state_dict` /
:func:`~namc.models.io.load_strict`: safetensors or ``torch.load(weights_only=True)``, every key accounted for) and
brings the preprocessing its weights were trained with:

- **CLIP** (``clip``): the official file is open_clip's ``open_clip_pytorch_model.bin`` (or
  ``open_clip_model.safetensors``) of the Hub repository open_clip itself names for the weights' pretrained tag:
  ``timm/vit_large_patch14_clip_224.openai`` for tag ``openai`` (OpenAI's weights, the default),
  ``laion/CLIP-ViT-L-14-laion2B-s32B-b82K`` for ``laion2b_s32b_b82k``, ... (``open_clip.list_pretrained()``). Keys:
  ``visual.*`` (``visual.conv1.weight``, ``visual.transformer.resblocks.N.*``, ``visual.proj``) plus the text tower
  (``token_embedding.weight``, ``transformer.*``, ``text_projection``, ``logit_scale``). The whole CLIP is built and
  loaded strictly, so a file of another architecture fails with the offending keys named; only the image tower is
  kept. The feature is ``visual(x)``: the projected [CLS] (768-d). What the keys do not show comes from open_clip's
  pretrained config of the tag (:func:`open_clip.pretrained.get_pretrained_cfg`): QuickGELU for ``openai`` (GELU
  for LAION's), and the normalisation (OpenAI mean / std; LAION's ``laion2b_s32b_b82k``: 0.5 / 0.5). Preprocessing
  is open_clip's own eval transform with those values (:func:`open_clip.image_transform`: bicubic resize of the
  shorter side to 224, centre crop, normalise).
- **DINOv2** (``dino``): timm's ``model.safetensors`` of ``timm/vit_large_patch14_dinov2.lvd142m`` (keys
  ``cls_token``, ``pos_embed`` (1, 1370, 1024) for 518 px, ``patch_embed.proj.*``, ``blocks.N.{norm1, attn.qkv,
  attn.proj, ls1.gamma, norm2, mlp.fc1, mlp.fc2, ls2.gamma}``, ``norm.*``). The model is built at the image size
  the file's ``pos_embed`` was trained at (518 px for the official file), loaded strictly, then resized to the
  embedding resolution with timm's ``set_input_size`` (bicubic resampling of ``pos_embed``, as timm does when it
  loads these weights at another size). The feature is the final-norm [CLS] token (1024-d), as DINOv2's linear
  evaluation reads it. Preprocessing is timm's eval transform with DINOv2's evaluation recipe: bicubic resize to
  256, centre crop 224, ImageNet mean / std.

Images reach the encoders as RGB PIL images that :func:`namc.data.transforms.open_image` decoded (pixel cap checked
from the header first) and :func:`~namc.data.transforms.to_rgb` converted (grey, palette, alpha and 16-bit images
become 8-bit RGB, namc's one policy), so every image is judged by the same rules as in the rest of namc.

Tests use tiny widths of the same architectures (:data:`TINY_CLIP_CONFIG`, :data:`TINY_DINO_KWARGS`), saved in the
official layouts and loaded through this same code path.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import open_clip
import timm
import torch
from open_clip.pretrained import get_pretrained_cfg
from PIL import Image
from torch import nn

from namc.models.io import load_state_dict, load_strict

__all__ = [
    "ENCODER_HINTS",
    "TINY_CLIP_CONFIG",
    "TINY_DINO_KWARGS",
    "ImageEncoder",
    "build_clip",
    "build_dino",
    "build_encoder",
]

logger = logging.getLogger(__name__)

# What to download, and where it comes from, quoted when a weights file is missing.
ENCODER_HINTS = {
    "clip": "CLIP ViT-L/14 in open_clip layout: open_clip_pytorch_model.bin (or open_clip_model.safetensors) from the "
    "Hub repository timm/vit_large_patch14_clip_224.openai (OpenAI weights, tag openai) or "
    "laion/CLIP-ViT-L-14-laion2B-s32B-b82K (tag laion2b_s32b_b82k)",
    "dino": "DINOv2 ViT-L/14: model.safetensors from the Hub repository timm/vit_large_patch14_dinov2.lvd142m",
}

# Tiny widths of the same architectures, for tests: a ViT-L/14-shaped CLIP config dict (patch 14) and timm DINOv2
# keyword overrides. Weights saved from these have the official key layouts.
TINY_CLIP_CONFIG: dict[str, Any] = {
    "embed_dim": 32,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 56, "layers": 2, "width": 64, "head_width": 32, "patch_size": 14},
    "text_cfg": {"context_length": 16, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1},
}
TINY_DINO_KWARGS: dict[str, Any] = {"embed_dim": 48, "depth": 2, "num_heads": 2}

DINO_ARCH = "vit_large_patch14_dinov2"
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_DINO_CROP_PCT = 224 / 256  # DINOv2's evaluation transform: resize 256, centre crop 224


@dataclass
class ImageEncoder:
    """A frozen image encoder and its preprocessing.

    Attributes:
        name: ``clip`` or ``dino`` (the features folder's name).
        model: ``(B, 3, S, S)`` preprocessed images -> ``(B, dim)`` features (not normalised).
        transform: RGB PIL image -> ``(3, S, S)`` float tensor, the encoder's own eval preprocessing.
        dim: feature width.
        description: what was built and from which file (meta.json's ``model``).
    """

    name: str
    model: nn.Module
    transform: Callable[[Image.Image], torch.Tensor]
    dim: int
    description: str


def _file_label(weights: str | Path | None) -> str:
    """The weights file's name (not its folder: a moved file still names the same model), or 'random weights'."""
    return Path(weights).name if weights is not None else "random weights"


def _check_file(path: str | Path | None, name: str) -> Path:
    if path is None or not Path(path).expanduser().is_file():
        where = f"no file at {path}" if path is not None else "no weights file given"
        raise FileNotFoundError(
            f"{name} weights: {where}. Download {ENCODER_HINTS[name]} and pass its local path "
            f"(--{name}_weights, or {name}_weights in the embed section of the pipeline YAML); namc never downloads"
        )
    return Path(path).expanduser()


def build_clip(
    weights: str | Path | None,
    clip_model: str | dict[str, Any] = "ViT-L-14",
    tag: str | None = "openai",
    image_size: int | None = None,
) -> ImageEncoder:
    """The CLIP image tower from an open_clip-layout state dict, loaded strictly.

    Args:
        weights: the state dict file (see the module docstring). None builds random weights (benchmarks only).
        clip_model: an open_clip config name, or a config dict of the same form (tests: :data:`TINY_CLIP_CONFIG`).
        tag: open_clip's pretrained tag of the weights (``openai``, ``laion2b_s32b_b82k``, ...): sets QuickGELU and
            the normalisation; None: the config's activation and OpenAI's mean / std.
        image_size: input side (default: the config's, 224 for ViT-L/14).

    Raises:
        FileNotFoundError: ``weights`` names no file (the message says what to download).
        namc.models.io.WeightsError: a missing, unexpected or mis-shaped key.
    """
    if isinstance(clip_model, str):
        cfg = open_clip.get_model_config(clip_model)
        if cfg is None:
            raise ValueError(f"unknown open_clip config {clip_model!r}; see open_clip.list_models()")
        label = clip_model
    else:
        cfg, label = clip_model, "CLIP (config dict)"
    cfg = copy.deepcopy(cfg)
    pretrained: dict[str, Any] = {}
    if tag is not None:
        name = clip_model if isinstance(clip_model, str) else ""
        pretrained = get_pretrained_cfg(name, tag)
        if not pretrained:
            tags = open_clip.list_pretrained_tags_by_model(name) if name else []
            raise ValueError(f"open_clip knows no pretrained tag {tag!r} for {name or 'a config dict'} (tags: {tags})")
        cfg["quick_gelu"] = bool(pretrained.get("quick_gelu", cfg.get("quick_gelu", False)))
        label = f"{label} {tag}"
    for key in ("custom_text", "hf_tokenizer_name", "tokenizer_kwargs"):
        cfg.pop(key, None)
    clip = open_clip.CLIP(**cfg)
    if weights is not None:
        path = _check_file(weights, "clip")
        load_strict(clip, load_state_dict(path, hint=ENCODER_HINTS["clip"]), what=f"{label} from {path}")
    visual = clip.visual.eval().requires_grad_(False)
    size = image_size or cfg["vision_cfg"]["image_size"]
    transform = open_clip.image_transform(  # resize the shorter side, centre crop, the weights' normalisation
        size,
        is_train=False,
        mean=pretrained.get("mean"),
        std=pretrained.get("std"),
        interpolation=pretrained.get("interpolation"),
        resize_mode=pretrained.get("resize_mode"),
    )
    return ImageEncoder("clip", visual, transform, int(cfg["embed_dim"]), f"{label} ({_file_label(weights)})")


def _trained_size(state_dict: dict[str, torch.Tensor], patch: int, prefix_tokens: int) -> int:
    """The square image size whose patch grid fits the checkpoint's ``pos_embed`` (518 for the official file)."""
    pos = state_dict.get("pos_embed")
    if pos is None or pos.ndim != 3:
        return 518
    side = math.isqrt(pos.shape[1] - prefix_tokens)
    return side * patch


def build_dino(
    weights: str | Path | None,
    image_size: int = 224,
    arch_kwargs: dict[str, Any] | None = None,
) -> ImageEncoder:
    """timm's DINOv2 ViT-L/14 from its ``model.safetensors``, loaded strictly, resized to ``image_size``.

    Args:
        weights: timm's state dict file (see the module docstring). None builds random weights (benchmarks only).
        image_size: input side (a multiple of 14; 224 by DINOv2's evaluation recipe).
        arch_kwargs: overrides of the architecture (tests: :data:`TINY_DINO_KWARGS`).

    Raises:
        FileNotFoundError: ``weights`` names no file (the message says what to download).
        namc.models.io.WeightsError: a missing, unexpected or mis-shaped key.
    """
    kwargs = dict(arch_kwargs or {})
    sd = None
    path = None
    if weights is not None:
        path = _check_file(weights, "dino")
        sd = load_state_dict(path, hint=ENCODER_HINTS["dino"])
    trained = _trained_size(sd, 14, 1) if sd is not None else 518
    model = timm.create_model(DINO_ARCH, pretrained=False, num_classes=0, img_size=trained, **kwargs)
    if sd is not None:
        load_strict(model, sd, what=f"DINOv2 {DINO_ARCH} from {path}")
    if image_size != trained:
        model.set_input_size(img_size=image_size)  # bicubic resampling of pos_embed, as timm's own loader does
    model.eval().requires_grad_(False)
    transform = timm.data.create_transform(
        input_size=(3, image_size, image_size),
        interpolation="bicubic",
        crop_pct=_DINO_CROP_PCT,
        crop_mode="center",
        mean=_IMAGENET_MEAN,
        std=_IMAGENET_STD,
    )
    label = DINO_ARCH + (f" {kwargs}" if kwargs else "")
    return ImageEncoder("dino", model, transform, int(model.num_features), f"{label} ({_file_label(weights)})")


def build_encoder(name: str, weights: str | Path | None, **kwargs: Any) -> ImageEncoder:
    """``build_clip`` or ``build_dino`` by name."""
    if name == "clip":
        return build_clip(weights, **kwargs)
    if name == "dino":
        return build_dino(weights, **kwargs)
    raise ValueError(f"unknown encoder {name!r}: choose clip or dino")
