"""Registered presets. ``namc_base`` is the paper (appendix F); ``namc_tiny`` is a CPU-sized model of the same
architecture for tests, the demo and CPU experiments."""

from __future__ import annotations

import copy

from namc.models.config import NAMCConfig
from namc.models.registry import register_model
from namc.models.vqgan import VQGAN_TINY_F8_64


@register_model
def namc_base() -> NAMCConfig:
    """The paper's model: CLIP ViT-B/16, ResNet-101 layer3, VQGAN f16-16384, D 768, 12 heads, 2 + 2 layers."""
    return NAMCConfig(name="namc_base")


@register_model
def namc_base_mdp() -> NAMCConfig:
    """``namc_base`` with M3Diff's MDP block as MIR's fusion (``fusion="mdp"``, :class:`~namc.models.fusion.MDPFusion`;
    OmniDiff paper, section 4.2) instead of the paper's concat + FC."""
    return NAMCConfig(name="namc_base_mdp", fusion="mdp")


@register_model
def namc_tiny() -> NAMCConfig:
    """A CPU model with the paper's structure: 64 px, 8 x 8 grid, D 128, 4 heads, 2 + 2 layers, word vocabulary.

    The three grids agree at 8 x 8: a tiny CLIP ViT with 8 px patches, ResNet-18 ``layer2`` (stride 8, 128 channels)
    and a 4-level (f8) VQGAN with 64 codes.
    """
    return NAMCConfig(
        name="namc_tiny",
        image_size=64,
        tokenizer="word",
        clip_model="namc-tiny-clip",
        grid_model="resnet18",
        grid_out_index=2,
        vqgan_ddconfig=copy.deepcopy(VQGAN_TINY_F8_64["ddconfig"]),
        vqgan_n_embed=VQGAN_TINY_F8_64["n_embed"],
        vqgan_embed_dim=VQGAN_TINY_F8_64["embed_dim"],
        dim=128,
        heads=4,
        mlp_ratio=4.0,
        dropout=0.1,
        max_caption_len=64,
    )
