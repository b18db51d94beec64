"""Frozen ResNet grid features: the image view that MIR masks, reconstructs and compares (paper section 3.2.2).

The paper uses the 14 x 14 x 1024 grid of a frozen, ImageNet-pretrained ResNet-101 (layer3, stride 16) at 224 px,
"pre-extracted" (appendix E.2). :class:`GridEncoder` computes it on the fly from a timm ``features_only`` ResNet,
so the same module serves training from pixels and feature pre-extraction.

Dimension letters: B batch, H/W image height/width, h/w grid height/width (H / stride), N = h * w grid cells,
C feature channels.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
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

    def fold_batchnorm(self) -> int:
        """Fold every BatchNorm into the convolution that feeds it, for inference with a frozen encoder.

        A frozen encoder's BatchNorm uses fixed running statistics, so ``bn(conv(x))`` is one convolution with the
        weights ``w * g / sqrt(var + eps)`` and bias ``b' = (b - mean) * g / sqrt(var + eps) + beta``: the separate
        normalisation pass (about 9% of namc_base's end-to-end time on a CPU) disappears. Pairs are a ``Conv2d``
        child registered immediately before a ``BatchNorm2d`` child of the same module (timm's ResNet stem,
        ``convN``/``bnN`` of every block, the ``downsample`` sequence); the BatchNorm becomes ``nn.Identity``. The
        result equals the unfolded encoder up to float rounding (tests/test_precision.py); the weights stay
        channels-last. Changes this module in place: fold an inference copy (:mod:`namc.models.precision`), not a
        model you will save (its state dict loses the ``bn*`` keys).

        Returns:
            how many BatchNorm layers were folded.

        Raises:
            ValueError: the encoder is trainable (its statistics would still change).
        """
        if not self.frozen:
            raise ValueError("fold_batchnorm needs a frozen grid encoder (BatchNorm statistics must be fixed)")
        from torch.nn.utils.fusion import fuse_conv_bn_eval

        folded = 0
        for module in list(self.backbone.modules()):
            children = list(module.named_children())
            for (name, conv), (bn_name, bn) in zip(children, children[1:]):
                if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d) and bn.track_running_stats:
                    setattr(module, name, fuse_conv_bn_eval(conv.eval(), bn.eval()))
                    setattr(module, bn_name, nn.Identity())
                    folded += 1
        self.backbone.to(memory_format=torch.channels_last)
        return folded

    def fuse_onednn(self) -> int:
        """Run the folded backbone's convolutions with their ReLUs and residual additions fused into single oneDNN
        calls, in the convolutions' current dtype (:func:`namc.models.onednn.fuse_resnet`). Call it after
        :meth:`fold_batchnorm` (and after casting the convolutions) on an inference copy: the fused encoder cannot
        be trained, saved or copied.

        Returns:
            how many convolutions run fused (0 where this torch build lacks the kernels).
        """
        if any(isinstance(m, nn.BatchNorm2d) for m in self.backbone.modules()):
            raise ValueError("fuse_onednn needs a folded encoder: call fold_batchnorm first")
        from namc.models.onednn import fuse_resnet

        return fuse_resnet(self.backbone)

    def int8_peaks(self, batches: Iterable[torch.Tensor]) -> list[list[float]]:
        """Calibrate a static int8 grid: the largest activation of every block (input, each inner convolution,
        output; :func:`namc.models.qconv.calibrate_resnet`) over ``batches`` of (B, 3, H, W) images in [0, 1], seen
        by a folded, fused fp32 copy of this frozen encoder (the one :meth:`quantize_int8` quantises)."""
        from namc.models.qconv import calibrate_resnet

        twin = copy.deepcopy(self).eval()
        twin.fold_batchnorm()
        if not twin.fuse_onednn():
            raise RuntimeError("static int8 needs oneDNN's fused convolutions, which this torch build lacks")

        def normalized(images: torch.Tensor) -> torch.Tensor:
            if images.ndim != 4 or images.shape[1] != 3:
                raise ValueError(f"calibration images must be (B, 3, H, W), got {tuple(images.shape)}")
            return twin._normalize(images.float())

        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            return calibrate_resnet(twin.backbone, (normalized(images) for images in batches))

    def quantize_int8(self, peaks: list[list[float]], ceiling: int | None = None) -> int:
        """Run the blocks of this folded, fused fp32 encoder in static int8 (:func:`namc.models.qconv.quantize_resnet`)
        with activation scales from :meth:`int8_peaks`, and the stem and its max-pool with the pixels' scale from
        the normalisation (:class:`namc.models.qconv.QuantStem`). Inference only, like :meth:`fuse_onednn`.
        ``ceiling``: the largest activation code (:func:`namc.models.qconv.code_ceiling`: 255 with VNNI, else 127).

        Returns:
            how many convolutions now run in int8 (0 where this torch build lacks the kernels).
        """
        from namc.models.qconv import quantize_resnet

        lowest, highest = (0 - self.mean) / self.std, (1 - self.mean) / self.std  # normalised pixels of [0, 1]
        pixel_peak = float(torch.maximum(lowest.abs(), highest.abs()).max())
        return quantize_resnet(self.backbone, peaks, pixel_peak, ceiling)

    def _normalize(self, images: torch.Tensor) -> torch.Tensor:
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
            x = self._normalize(images)
            features = self.backbone(x)[0]  # (B, C, h, w)
        return features.flatten(2).transpose(1, 2)  # (B, C, h, w) -> (B, h*w, C)
