"""Table 9 (paper appendix A.2): how close MIR's reconstructions are to the VQGAN's, and both to the raw image.

MIR predicts a VQGAN code at every masked grid cell (Eq. 18). Decoding codes back to pixels needs the VQGAN's
decoder half: :class:`VQGANDecoder` is taming's ``Decoder`` + ``post_quant_conv`` + the codebook, loaded strictly from
the same ``last.ckpt`` whose encoder half :class:`~namc.models.vqgan.VQGANTokenizer` loads (``decoder.*``,
``post_quant_conv.*``, ``quantize.embedding.weight``). Two images are decoded per input: one from the VQGAN's own
codes and one where MIR's predictions replace them at the masked cells; PSNR (Hore and Ziou 2010) and SSIM (Wang et
al. 2004) are then measured on the f x f pixel patch of every masked cell with ``skimage.metrics`` (imported inside
:func:`patch_metrics`), for MIR vs VQGAN, VQGAN vs raw and MIR vs raw: the three rows of Table 9.

Dimension letters: B images, N grid cells (h * w), f the VQGAN factor, H = h * f, W = w * f, D codebook width.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from taming.modules.diffusionmodules.model import Decoder
from torch import nn

from namc.models.io import load_state_dict, load_strict

__all__ = ["TABLE9_ROWS", "VQGANDecoder", "mir_codes", "patch_metrics", "reconstruction_table"]

#: (reconstructed, reference) pairs of Table 9, in its order
TABLE9_ROWS = (("mir", "vqgan"), ("vqgan", "raw"), ("mir", "raw"))
_USED_PREFIXES = ("decoder.", "post_quant_conv.", "quantize.embedding.")


class VQGANDecoder(nn.Module):
    """VQGAN codes -> images: codebook lookup, ``post_quant_conv``, taming's ``Decoder``; frozen, eval mode.

    Args:
        ddconfig: the taming configuration of the checkpoint (the tokenizer's, e.g. ``NAMCConfig.vqgan_ddconfig``).
        n_embed: codebook size V.
        embed_dim: codebook width D.
        pretrained: the taming checkpoint (``last.ckpt``, a bare state dict or ``.safetensors``); its decoder half
            is loaded strictly (the encoder half and the training loss are ignored). None: random weights (tests).
    """

    def __init__(self, ddconfig: dict, n_embed: int, embed_dim: int, pretrained: str | Path | None = None) -> None:
        super().__init__()
        ddconfig = copy.deepcopy(dict(ddconfig))
        self.ddconfig = ddconfig
        self.decoder = Decoder(**ddconfig)
        self.post_quant_conv = nn.Conv2d(embed_dim, ddconfig["z_channels"], 1)
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(n_embed, embed_dim)  # taming's VectorQuantizer2 key layout
        if pretrained is not None:
            state = load_state_dict(pretrained, hint="the taming VQGAN checkpoint (last.ckpt) whose codes MIR predicts")
            load_strict(
                self,
                state,
                what=f"VQGAN decoder from {pretrained}",
                ignore_unexpected=lambda key: not key.startswith(_USED_PREFIXES),
            )
        self.requires_grad_(False)
        self.eval()

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ddconfig["ch_mult"]) - 1)

    def train(self, mode: bool = True) -> VQGANDecoder:
        return super().train(False)

    @torch.no_grad()
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, N) codes of a square h x h grid -> (B, 3, h f, h f) images in [0, 1]."""
        B, N = codes.shape
        h = math.isqrt(N)
        if h * h != N:
            raise ValueError(f"{N} codes do not form a square grid")
        z = self.quantize.embedding(codes).view(B, h, h, -1).permute(0, 3, 1, 2)  # (B, N, D) -> (B, D, h, w)
        return ((self.decoder(self.post_quant_conv(z)) + 1) / 2).clamp(0, 1)  # taming decodes to [-1, 1]


@torch.no_grad()
def mir_codes(model: Any, batch: dict[str, Any], generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """MIR's predicted codes at NIM's masked cells, as in pre-training (section 3.2.2).

    Args:
        model: a pre-training NAMC (NIM, VQGAN and MIR's head present).
        batch: a :class:`~namc.data.collate.PretrainCollator` batch.
        generator: seeds the masks.

    Returns:
        ``images`` (2B, 3, H, W), ``vqgan`` (2B, N) the tokenizer's codes, ``mir`` (2B, N) the same with MIR's argmax
        at masked cells, ``mask`` (2B, N) bool.
    """
    if model.nim is None or model.vqgan is None or model.config.rec_loss != "discrete":
        raise ValueError("Table 9 needs a pre-training model with discrete MIR reconstruction (rec_loss='discrete')")
    images = torch.cat([batch["image1"], batch["image2"]])  # (2B, 3, H, W)
    text = torch.cat([batch["desc1"], batch["desc2"]])  # (2B, L)
    _, real = model.text_masks(text)
    img_mask, txt_mask = model.noise_masks(images, text, generator)  # (2B, N), (2B, L)
    text_in = text.masked_fill(txt_mask, model.tokenizer.mask_id) if model.config.denoised_text else text
    _, txt_tok = model.nim.encode_text(text_in, model.tokenizer.eos_id)  # (2B, L, E)
    x = model.mir.embed(model.grid(images), img_mask)  # (2B, N, D)
    logits = model.mir.head(model.mir.reconstruct(x, txt_tok, real))  # (2B, N, V)
    vq = model.vqgan(images)  # (2B, N)
    return {"images": images, "vqgan": vq, "mir": torch.where(img_mask, logits.argmax(-1), vq), "mask": img_mask}


def _patches(images: torch.Tensor, mask: torch.Tensor, f: int) -> list[np.ndarray]:
    """The (f, f, 3) pixel patches of every masked cell, image by image, row-major."""
    B, _, H, W = images.shape
    w = W // f
    out = []
    arr = images.detach().float().cpu().permute(0, 2, 3, 1).numpy()  # (B, 3, H, W) -> (B, H, W, 3)
    for b, n in mask.nonzero().tolist():
        r, c = divmod(n, w)
        out.append(arr[b, r * f : (r + 1) * f, c * f : (c + 1) * f])
    return out


def patch_metrics(recon: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor, f: int) -> dict[str, float]:
    """Mean PSNR (dB) and SSIM over the masked f x f patches (images in [0, 1], data range 1).

    PSNR of an identical patch is infinite: such patches count as 100 dB so that a mean stays finite (reported in
    ``identical``). SSIM uses a 7 x 7 window (skimage's default), smaller when ``f < 7``.

    Args:
        recon, reference: (B, 3, H, W) in [0, 1].
        mask: (B, N) bool, N = (H / f) * (W / f).
        f: patch side in pixels.
    """
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    a, b = _patches(recon, mask, f), _patches(reference, mask, f)
    if not a:
        return {"psnr": math.nan, "ssim": math.nan, "patches": 0, "identical": 0}
    win = min(7, f if f % 2 else f - 1)
    psnr, ssim, same = [], [], 0
    for x, y in zip(a, b):
        if np.array_equal(x, y):
            same += 1
            psnr.append(100.0)
        else:
            psnr.append(float(peak_signal_noise_ratio(y, x, data_range=1.0)))
        ssim.append(float(structural_similarity(y, x, data_range=1.0, channel_axis=-1, win_size=win)))
    return {"psnr": float(np.mean(psnr)), "ssim": float(np.mean(ssim)), "patches": len(a), "identical": same}


def reconstruction_table(
    decoder: VQGANDecoder, images: torch.Tensor, vqgan: torch.Tensor, mir: torch.Tensor, mask: torch.Tensor
) -> dict[str, dict[str, float]]:
    """Table 9's three rows (``"mir_vs_vqgan"``, ``"vqgan_vs_raw"``, ``"mir_vs_raw"``) for one set of images."""
    views = {"raw": images.float().cpu(), "vqgan": decoder(vqgan).cpu(), "mir": decoder(mir).cpu()}
    H = images.shape[-1]
    f = H // math.isqrt(mask.shape[1])
    return {f"{a}_vs_{b}": patch_metrics(views[a], views[b], mask.cpu(), f) for a, b in TABLE9_ROWS}
