"""Frozen ResNet grid features: the image view that MIR masks, reconstructs and compares (paper section 3.2.2).

The paper uses the 14 x 14 x 1024 grid of a frozen, ImageNet-pretrained ResNet-101 (layer3, stride 16) at 224 px,
"pre-extracted" (appendix E.2). :class:`GridEncoder` computes it on the fly from a timm ``features_only`` ResNet,
so the same module serves training from pixels and feature pre-extraction.

Dimension letters: B batch, H/W image height/width, h/w grid height/width (H / stride), N = h * w grid cells,
C feature channels.
"""

from __future__ import annotations

from pathlib import Path

import timm
import torch
from torch import nn

from namc.models.io import load_state_dict, load_strict

__all__ = ["GridEncoder", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class GridEncoder(nn.Module):
    """A (frozen) timm ResNet cut at one stage, returning its feature map as a sequence of grid cells.

    Args:
        model_name: A timm ResNet-family architecture (``"resnet101"`` in the paper).
        out_index: Which timm feature level to return: 0 stem (stride 2), 1..4 layer1..layer4 (strides 4, 8, 16,
            32). The paper's layer3 grid is ``out_index=3``.
        pretrained: Path to ImageNet weights in torchvision or timm layout (keys ``conv1.weight``, ``bn1.*``,
            ``layer1.*`` ... ``layer4.*``, ``fc.*``; ``.pth``/``.bin`` or ``.safetensors``). Keys of the stages
            that ``features_only`` pruned (e.g. ``layer4.*`` and ``fc.*`` for ``out_index=3``) are ignored; any
            other mismatch is an error. ``None`` keeps timm's random initialisation (tests, tiny presets).
        frozen: Freeze the encoder: no parameter requires grad, forward runs under ``torch.no_grad()``, and the
            module stays in eval mode (BatchNorm uses its running statistics) whatever ``.train()`` says.
        model_kwargs: Extra keyword arguments for ``timm.create_model`` (e.g. ``dict(layers=[1, 1, 1, 1])``).
    """

    def __init__(
        self,
        model_name: str = "resnet101",
        out_index: int = 3,
        pretrained: str | Path | None = None,
        frozen: bool = True,
        model_kwargs: dict | None = None,
    ) -> None:
        super().__init__()
        model_kwargs = dict(model_kwargs or {})
        self.model_name = model_name
        self.out_index = out_index
        self.frozen = frozen
        self.backbone = timm.create_model(
            model_name, pretrained=False, features_only=True, out_indices=(out_index,), **model_kwargs
        )
        # channels-last convolutions: about 25% faster training on a CPU (oneDNN), and the (B, C, h, w) output is
        # then already laid out as the (B, h*w, C) sequence forward returns
        self.backbone.to(memory_format=torch.channels_last)
        self.out_channels: int = self.backbone.feature_info.channels()[0]
        self.stride: int = self.backbone.feature_info.reduction()[0]
        # Normalisation constants are part of the architecture, not weights: keep them out of the state dict.
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

        if pretrained is not None:
            self.load_pretrained(pretrained, model_kwargs)
        self.set_frozen(frozen)

    def load_pretrained(self, path: str | Path, model_kwargs: dict | None = None) -> None:
        """Load full-classifier ImageNet weights (torchvision or timm layout) into the cut backbone.

        Args:
            path: The checkpoint file.
            model_kwargs: The ``timm.create_model`` keyword arguments the backbone was built with.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            WeightsError: the file is unreadable, or a key the backbone needs is missing or mis-shaped, or the file
                has keys that belong to no part of the full architecture.
        """
        state_dict = load_state_dict(
            path,
            hint=(
                f"ImageNet weights for the {self.model_name} grid encoder (torchvision or timm layout, e.g. "
                "torchvision's resnet101-63fe2227.pth or timm's resnet101.tv_in1k model.safetensors)"
            ),
        )
        # The stages features_only dropped are the full model's top-level children the cut backbone lacks; build
        # the full model on the meta device (no memory, no init cost) just to list them.
        with torch.device("meta"):
            full = timm.create_model(self.model_name, pretrained=False, **(model_kwargs or {}))
        kept = {name for name, _ in self.backbone.named_children()}
        pruned = {name for name, _ in full.named_children()} - kept
        load_strict(
            self.backbone,
            state_dict,
            what=f"{self.model_name} grid encoder (feature level {self.out_index}) from {path}",
            ignore_unexpected=lambda key: key.split(".", 1)[0] in pruned,
        )

    def set_frozen(self, frozen: bool) -> GridEncoder:
        """Freeze (no gradients, always eval) or unfreeze the encoder."""
        self.frozen = frozen
        self.requires_grad_(not frozen)
        return self.train(self.training)

    def train(self, mode: bool = True) -> GridEncoder:
        """Set training mode; a frozen encoder stays in eval mode so its BatchNorm statistics never change."""
        return super().train(mode and not self.frozen)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) pixels in [0, 1] -> ImageNet-normalised, channels-last (what the backbone takes)."""
        return ((images - self.mean) / self.std).contiguous(memory_format=torch.channels_last)

    def grid_size(self, image_size: int) -> int:
        """Grid cells per side for a square ``image_size`` input (14 for ResNet layer3 at 224 px).

        Args:
            image_size: Image side in pixels; must be a multiple of :attr:`stride`.

        Returns:
            ``image_size // stride``; the number of grid cells N is its square.
        """
        if image_size % self.stride:
            raise ValueError(f"image size {image_size} is not a multiple of the grid stride {self.stride}")
        return image_size // self.stride

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Encode images into grid features.

        Args:
            images: (B, 3, H, W) RGB in [0, 1]; H and W multiples of :attr:`stride`.

        Returns:
            (B, N, C) features, N = (H / stride) * (W / stride) cells in row-major order, C = :attr:`out_channels`.
        """
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images of shape (B, 3, H, W), got {tuple(images.shape)}")
        H, W = images.shape[-2:]
        if H % self.stride or W % self.stride:
            raise ValueError(f"image size {H}x{W} is not a multiple of the grid stride {self.stride}")
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            x = self.normalize(images)
            features = self.backbone(x)[0]  # (B, C, h, w)
        return features.flatten(2).transpose(1, 2)  # (B, C, h, w) -> (B, h*w, C)
