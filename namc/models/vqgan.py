"""Frozen VQGAN tokenizer: the discrete targets of masked image reconstruction (paper section 3.2.2, appendix E.2).

MIR predicts, at each masked grid cell, the VQGAN codebook index of that cell (a softmax over V codes, V = 16384 for
the f16-16384 ImageNet model). Only the encoder half of the VQGAN is needed: ``encoder -> quant_conv -> nearest
codebook entry``. The modules come from ``taming.modules`` (``taming.models.vqgan`` itself does not import with
current Lightning) and keep taming's attribute names, so the official ``last.ckpt`` keys load unchanged.

Dimension letters: B batch, H/W image height/width, f downsampling factor, h/w code grid (H / f, W / f),
N = h * w codes, D codebook embedding width.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import torch
from taming.modules.diffusionmodules.model import Encoder
from taming.modules.vqvae.quantize import VectorQuantizer2
from torch import nn

from namc.models.io import load_state_dict, load_strict

__all__ = ["VQGANTokenizer", "VQGAN_F16_16384", "VQGAN_F16_1024", "VQGAN_TINY_F8_64"]

_F16_DDCONFIG = dict(
    double_z=False,
    z_channels=256,
    resolution=256,
    in_channels=3,
    out_ch=3,
    ch=128,
    ch_mult=[1, 1, 2, 2, 4],
    num_res_blocks=2,
    attn_resolutions=[16],
    dropout=0.0,
)
# taming-transformers' ImageNet VQGANs (configs of `vqgan_imagenet_f16_16384` / `_f16_1024`): f = 16, so a 224 px
# image gives the 14 x 14 = 196 codes that match the ViT-B/16 patches and the ResNet layer3 grid (DESIGN section 1).
VQGAN_F16_16384 = dict(ddconfig=copy.deepcopy(_F16_DDCONFIG), n_embed=16384, embed_dim=256)
VQGAN_F16_1024 = dict(ddconfig=copy.deepcopy(_F16_DDCONFIG), n_embed=1024, embed_dim=256)
# A random-weight stand-in for CPU presets and tests: f = 8 (64 px -> 8 x 8 codes), ch 32 (taming's GroupNorm(32)
# needs channel counts that are multiples of 32), no res blocks in the down levels (one per level would cost 6x the
# FLOPs, mostly at full resolution: 3.8 vs 0.6 GFLOP for 16 images), so the codes come from conv_in, the three
# strided downsampling convs and taming's fixed middle (two res blocks and one attention block at 8 x 8).
VQGAN_TINY_F8_64 = dict(
    ddconfig=dict(
        double_z=False,
        z_channels=32,
        resolution=64,
        in_channels=3,
        out_ch=3,
        ch=32,
        ch_mult=[1, 1, 1, 1],
        num_res_blocks=0,
        attn_resolutions=[],
        dropout=0.0,
    ),
    n_embed=64,
    embed_dim=32,
)

# Latent vectors per nearest-code search: bounds the (vectors x V) distance matrix (4096 x 16384 floats = 256 MiB).
_MAX_SEARCH_VECTORS = 4096

# Checkpoint keys of a full taming VQModel that the tokenizer does not use (the image decoder and the training loss:
# LPIPS and the patch discriminator).
_UNUSED_PREFIXES = ("decoder.", "post_quant_conv.", "loss.")


class VQGANTokenizer(nn.Module):
    """Images -> VQGAN codebook indices, always frozen and in eval mode.

    Args:
        ddconfig: taming ``Encoder`` configuration (``ch``, ``ch_mult``, ``num_res_blocks``, ``attn_resolutions``,
            ``z_channels``, ``resolution``, ``in_channels``, ``double_z``, ...), as in taming's YAML configs.
        n_embed: Codebook size V.
        embed_dim: Codebook embedding width D.
        pretrained: Path to a taming checkpoint (official ``last.ckpt`` with a ``state_dict`` entry, or a bare state
            dict / ``.safetensors`` with the same keys). ``encoder.*``, ``quant_conv.*`` and ``quantize.*`` are
            loaded strictly; ``decoder.*``, ``post_quant_conv.*`` and ``loss.*`` are ignored. ``None`` keeps the
            random initialisation (tests, tiny presets).
    """

    def __init__(self, ddconfig: dict, n_embed: int, embed_dim: int, pretrained: str | Path | None = None) -> None:
        super().__init__()
        ddconfig = copy.deepcopy(dict(ddconfig))
        if ddconfig.get("double_z", True):
            raise ValueError("a VQGAN encoder has double_z=False (double_z is for KL autoencoders)")
        widths = [ddconfig["ch"] * m for m in ddconfig["ch_mult"]]
        if any(w % 32 for w in widths):
            raise ValueError(f"taming's GroupNorm(32) needs channel widths that are multiples of 32, got {widths}")
        self.ddconfig = ddconfig
        self.encoder = Encoder(**ddconfig)
        self.quant_conv = nn.Conv2d(ddconfig["z_channels"], embed_dim, 1)
        # beta only weights the commitment loss, which a frozen tokenizer never uses; 0.25 as in taming's VQModel.
        self.quantize = VectorQuantizer2(n_embed, embed_dim, beta=0.25)
        if pretrained is not None:
            self.load_pretrained(pretrained)
        self.requires_grad_(False)
        self.eval()

    @property
    def codebook_size(self) -> int:
        """Number of codebook entries V (the MIR classification width)."""
        return self.quantize.n_e

    @property
    def downsample(self) -> int:
        """Downsampling factor f: one code per f x f pixels (one halving per level after the first)."""
        return 2 ** (len(self.ddconfig["ch_mult"]) - 1)

    def grid_size(self, image_size: int) -> int:
        """Codes per side for a square ``image_size`` input (14 for f16 at 224 px).

        Args:
            image_size: Image side in pixels; must be a multiple of :attr:`downsample`.

        Returns:
            ``image_size // downsample``; the number of codes N is its square.
        """
        if image_size % self.downsample:
            raise ValueError(f"image size {image_size} is not a multiple of the VQGAN factor {self.downsample}")
        return image_size // self.downsample

    def load_pretrained(self, path: str | Path) -> None:
        """Load the encoder half of a taming VQGAN checkpoint.

        Args:
            path: ``last.ckpt`` (Lightning layout), a bare state dict, or a ``.safetensors`` file.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            WeightsError: unreadable file, or a missing / mis-shaped / unknown key.
        """
        state_dict = load_state_dict(
            path,
            hint=(
                f"the VQGAN tokenizer checkpoint (taming-transformers, {self.codebook_size} codes; e.g. "
                "vqgan_imagenet_f16_16384/checkpoints/last.ckpt from the taming-transformers README)"
            ),
        )
        load_strict(
            self,
            state_dict,
            what=f"VQGAN tokenizer (f{self.downsample}, {self.codebook_size} codes) from {path}",
            ignore_unexpected=lambda key: key.startswith(_UNUSED_PREFIXES),
        )

    def train(self, mode: bool = True) -> VQGANTokenizer:
        """The tokenizer is frozen: it stays in eval mode whatever ``mode`` is."""
        return super().train(False)

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Tokenize images.

        Args:
            images: (B, 3, H, W) RGB in [0, 1]; H and W multiples of :attr:`downsample`.

        Returns:
            (B, N) int64 codebook indices, N = (H / f) * (W / f) in row-major order.
        """
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images of shape (B, 3, H, W), got {tuple(images.shape)}")
        B, _, H, W = images.shape
        if H % self.downsample or W % self.downsample:
            raise ValueError(f"image size {H}x{W} is not a multiple of the VQGAN factor {self.downsample}")
        # The codes are MIR's targets: computed in the weights' own precision, never under a caller's autocast
        # (bf16-mixed training), whose bf16 encoder and distances pick other codes than `namc data precompute` stores
        # (0.6% of the tiny test VQGAN's codes; more among 16,384 codes).
        with _without_autocast(images.device):
            z = self.quant_conv(self.encoder(images.to(self.quant_conv.weight.dtype) * 2.0 - 1.0))  # taming: [-1, 1]
            # The nearest-code search holds a (vectors x V) distance matrix: 128 images x 196 codes x 16384 entries
            # is 1.6 GB per temporary, so search a few images at a time.
            images_per_chunk = max(1, _MAX_SEARCH_VECTORS // (z.shape[2] * z.shape[3]))
            # VectorQuantizer2 flattens each chunk as (b h w) before the search, so indices come out row-major.
            indices = torch.cat([self.quantize(chunk)[2][2] for chunk in z.split(images_per_chunk)])  # (B*h*w,)
        return indices.view(B, -1)  # (B*h*w,) -> (B, N)


def _without_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off on ``device`` (CPU or CUDA; other devices have none to turn off)."""
    if device.type in ("cpu", "cuda"):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()
