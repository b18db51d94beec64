"""NAMCConfig: everything needed to rebuild a NAMC model; a saved model's ``config.json`` is this as JSON.

A model folder, a checkpoint or a recipe is untrusted input, so :meth:`NAMCConfig.validate` checks a config before
anything is built (:mod:`namc.models.validate` holds the rules): types, ranges, known model names, the keyword
arguments that reach timm and taming, and an estimate of the parameters it would allocate, at most
:data:`~namc.models.validate.DEFAULT_MAX_PARAMETERS` unless ``NAMC_MAX_PARAMETERS`` (or ``max_parameters=``) says
otherwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from namc.models.validate import check_config, estimate_parameters

__all__ = ["NAMCConfig"]


@dataclass
class NAMCConfig:
    """Everything needed to rebuild a NAMC model; saved as ``config.json``.

    The defaults are the paper's (appendix F): CLIP ViT-B/16 at 224 px, ResNet-101 layer3 (14 x 14 x 1024), VQGAN
    f16-16384, D 768, 12 heads, 2 MIR + 2 FDG layers, ``p_I = 0.2``, ``p_T = 0.15`` (section 4.2.1).
    """

    name: str = "namc_base"
    image_size: int = 224
    tokenizer: str = "clip_bpe"  # "clip_bpe" or "word"
    vocab_size: int = 49409
    pretraining: bool = True  # build the NIM towers and the VQGAN tokenizer
    # NIM (section 3.2.1)
    clip_model: str = "ViT-B-16-quickgelu"
    clip_pretrained: str | None = None
    p_img: float = 0.2
    p_txt: float = 0.15
    masking: str = "noise"  # "noise" (NM) or "random" (Fig. 3 ablation)
    nim_loss: str = "sdm"  # "sdm" (Jiang & Ye 2023) or "infonce" (Table 7)
    tau: float = 0.02
    # weight of a token-level alignment term added to L_NIM (namc.ops.token_sigmoid_loss; not in the paper): a
    # pre-trained CLIP already aligns patches and words, a randomly initialised NIM (the CPU demo) does not
    nim_token_loss: float = 0.0
    # labels of its words: n-gram presence in the image's own description (see token_sigmoid_loss); None: pairs
    nim_token_ngram: int | None = 2
    use_nim: bool = True
    denoised_image: bool = True  # Table 8
    denoised_text: bool = True  # Table 8
    # MIR (section 3.2.2)
    grid_model: str = "resnet101"
    grid_out_index: int = 3
    grid_kwargs: dict[str, Any] = field(default_factory=dict)
    grid_pretrained: str | None = None
    grid_trainable: bool = False  # the paper keeps the ResNet frozen ("pre-extracted"); train it without weights
    vqgan_ddconfig: dict[str, Any] = field(
        default_factory=lambda: dict(
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
    )
    vqgan_n_embed: int = 16384
    vqgan_embed_dim: int = 256
    vqgan_pretrained: str | None = None
    use_mir: bool = True  # the reconstruction loss (Table 6 "- MIR" turns it off)
    rec_loss: str = "discrete"  # "discrete", "l1", "l2" (Table 7)
    fusion: str = "concat"  # MIR's fusion block (namc.models.fusion); "concat" + FC is the paper's
    # MIR encoder and FDG decoder (appendix F)
    dim: int = 768
    heads: int = 12
    mir_layers: int = 2
    fdg_layers: int = 2
    mlp_ratio: float = 4.0
    dropout: float = 0.1
    max_caption_len: int = 160
    tie_embeddings: bool = True
    ignore_masked_targets: bool = True  # [MASK] positions of the denoised description are not FDG targets
    max_new_tokens: int = 23  # appendix F

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NAMCConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown NAMC config keys {unknown}; valid keys: {sorted(known)}")
        return cls(**data)

    def validate(self, where: str = "NAMCConfig", max_parameters: float | None = None) -> None:
        """Check every field before anything is built (:func:`namc.models.validate.check_config`).

        Args:
            where: what the config came from, for the message (a file, a checkpoint entry, a recipe key).
            max_parameters: the most parameters the config may build (default: ``NAMC_MAX_PARAMETERS`` from the
                environment, else 2e9).

        Raises:
            ConfigError: one line ``"<where>: <key>: <problem>"``.
        """
        check_config(self, where, max_parameters)

    def estimate_parameters(self) -> int:
        """The parameters this config would build, estimated without building it (see :mod:`namc.models.validate`).

        Raises:
            ConfigError: the config names a model that cannot be built (an unknown CLIP or grid model).
        """
        return estimate_parameters(self)
