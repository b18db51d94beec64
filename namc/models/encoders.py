"""NIM's dual encoders: an open_clip CLIP model whose towers also return per-token embeddings.

Dimension letters: B batch, N patches, L text tokens, W tower width, E shared (projected) embedding width.

We drive open_clip's own modules (``conv1``, ``class_embedding``, ``transformer``, ``ln_post``, ``proj`` and the
text tower's ``token_embedding``, ``transformer``, ``ln_final``, ``text_projection``) so that CLIP checkpoints load
unchanged, and add what NAMC needs between them:

- a learnable ``e_msk`` that replaces masked patch embeddings after the patchify convolution and before the
  positional embedding (the "denoised image", section 3.2.1);
- per-token embeddings of both towers in the shared space (patch tokens after ``ln_post`` times ``proj``, text
  tokens after ``ln_final`` times ``text_projection``), where Eq. 1 is computed;
- [EOS] pooling at the position of the [EOS] id. open_clip pools text at ``argmax(ids)``, which assumes [EOS] has
  the largest id; our [MASK] id (49408) is larger, so we locate [EOS] explicitly.
"""

from __future__ import annotations

import copy
import logging
import math

import open_clip
import torch
from torch import nn

import namc.models.clip_configs  # noqa: F401  (registers namc's own CLIP configs with open_clip)
from namc.models.io import load_state_dict, load_strict

logger = logging.getLogger(__name__)

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

CLIP_HINT = (
    "an open_clip-layout CLIP state dict (.safetensors, or a .bin/.pt state dict readable with weights_only=True). "
    "For the paper's ViT-B/16 download OpenAI's ViT-B-16.pt and convert it once with "
    "`namc convert-clip ViT-B-16.pt clip_vit_b16.safetensors`, or use open_clip's "
    "`open_clip_model.safetensors` of `timm/vit_base_patch16_clip_224.openai`."
)


class ClipDualEncoder(nn.Module):
    """CLIP image and text towers with masked inputs and per-token outputs.

    Args:
        model_name: an open_clip config name (e.g. ``"ViT-B-16-quickgelu"``; OpenAI weights need QuickGELU) or one
            of namc's configs in ``clip_configs/`` (``"namc-tiny-clip"``).
        vocab_size: rows of the text token embedding, [MASK] included. CLIP's BPE has 49,408 ids; the extra
            [MASK] row is appended after the checkpoint loads and initialised to the mean embedding.
        pretrained: path of a CLIP state dict in open_clip layout, or None for random initialisation.
        token_logit: add the learnable ``(log scale, bias)`` of :func:`namc.ops.token_sigmoid_loss` as
            ``token_logit`` (initialised to scale 20, bias -10).
    """

    def __init__(
        self, model_name: str, vocab_size: int, pretrained: str | None = None, token_logit: bool = False
    ) -> None:
        super().__init__()
        cfg = open_clip.get_model_config(model_name)
        if cfg is None:
            raise ValueError(f"unknown open_clip config {model_name!r}; see open_clip.list_models()")
        cfg = copy.deepcopy(cfg)
        sd = load_state_dict(pretrained, hint=CLIP_HINT) if pretrained else None
        # build with the checkpoint's own vocabulary so it loads strictly, then append rows ([MASK])
        base_vocab = sd["token_embedding.weight"].shape[0] if sd and "token_embedding.weight" in sd else vocab_size
        cfg["text_cfg"]["vocab_size"] = base_vocab
        for key in ("custom_text", "hf_tokenizer_name", "tokenizer_kwargs"):
            cfg.pop(key, None)
        self.clip = open_clip.CLIP(**cfg)
        visual = self.clip.visual
        if visual.attn_pool is not None or visual.final_ln_after_pool or visual.pool_type != "tok":
            raise ValueError(f"{model_name}: only class-token ViT CLIP towers are supported")
        if sd is not None:
            load_strict(self.clip, sd, what=f"CLIP {model_name} from {pretrained}")
        if vocab_size != base_vocab:
            self._grow_vocab(vocab_size)
        self.clip.logit_scale.requires_grad_(False)  # unused: the NIM losses use a fixed temperature
        width = visual.conv1.out_channels
        self.e_msk = nn.Parameter(torch.zeros(width))
        nn.init.normal_(self.e_msk, std=0.02)
        self.token_logit = nn.Parameter(torch.tensor([math.log(20.0), -10.0])) if token_logit else None
        self.register_buffer("mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(CLIP_STD).view(1, 3, 1, 1), persistent=False)
        self.embed_dim = cfg["embed_dim"]
        self.context_length = self.clip.context_length
        self.patch_size = visual.patch_size[0]

    def _grow_vocab(self, vocab_size: int) -> None:
        old = self.clip.token_embedding
        if vocab_size < old.num_embeddings:
            raise ValueError(
                f"the tokenizer has {vocab_size} ids but the CLIP checkpoint's vocabulary has {old.num_embeddings}: "
                "pretrained CLIP towers need the CLIP BPE tokenizer (tokenizer='clip_bpe')"
            )
        new = nn.Embedding(vocab_size, old.embedding_dim)
        with torch.no_grad():
            new.weight[: old.num_embeddings] = old.weight
            new.weight[old.num_embeddings :] = old.weight.mean(dim=0)
        self.clip.token_embedding = new
        self.clip.vocab_size = vocab_size

    def grid_size(self, image_size: int) -> int:
        return image_size // self.patch_size

    def check_image_size(self, image_size: int) -> None:
        """Raises ValueError unless the image tower's positional embedding has one position per patch of an image of
        ``image_size`` px (open_clip's towers are built for their own image size, plus [CLS])."""
        n = image_size // self.patch_size
        positions = self.clip.visual.positional_embedding.shape[0] - 1
        if n * n != positions:
            raise ValueError(
                f"NIM's CLIP image tower has {positions} patch positions ({math.isqrt(positions)} x "
                f"{math.isqrt(positions)} patches of {self.patch_size} px), an image of {image_size} px has {n} x {n}: "
                "pre-training reads images at the CLIP tower's own size"
            )

    def encode_image(
        self, images: torch.Tensor, patch_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Image tower.

        Args:
            images: (B, 3, H, W) in [0, 1].
            patch_mask: (B, N) bool; True patches are replaced by ``e_msk`` (the denoised image ``I^msk``).

        Returns:
            ``(cls, tokens)``: (B, E) projected [CLS] and (B, N, E) projected patch tokens ``H_I``.
        """
        v = self.clip.visual
        x = v.conv1((images - self.mean) / self.std)  # (B, W, h, w)
        x = x.flatten(2).transpose(1, 2)  # (B, N, W)
        if patch_mask is not None:
            w = patch_mask.unsqueeze(-1).type_as(x)  # (B, N, 1)
            x = x * (1 - w) + self.e_msk.to(x.dtype) * w
        cls = v.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)  # (B, 1, W)
        x = torch.cat([cls, x], dim=1) + v.positional_embedding.to(x.dtype)  # (B, 1 + N, W)
        x = v.transformer(v.ln_pre(x))
        x = v.ln_post(x) @ v.proj  # (B, 1 + N, E)
        return x[:, 0], x[:, 1:]

    def encode_text(self, ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Text tower (causal, as CLIP).

        Args:
            ids: (B, L) token ids ``[SOS] words [EOS] pad...``, L <= the context length; [MASK] ids allowed.
            eos_id: the [EOS] id, where the sentence embedding is pooled.

        Returns:
            ``(eos, tokens)``: (B, E) projected [EOS] embedding and (B, L, E) projected token embeddings ``H_T``.
        """
        c = self.clip
        L = ids.shape[1]
        if L > self.context_length:
            raise ValueError(f"text of {L} tokens exceeds the CLIP context length {self.context_length}")
        x = c.token_embedding(ids) + c.positional_embedding[:L]  # (B, L, W)
        x = c.transformer(x, attn_mask=c.attn_mask[:L, :L])
        x = c.ln_final(x) @ c.text_projection  # (B, L, E)
        eos_pos = (ids == eos_id).int().argmax(dim=1)  # (B,) first [EOS]
        return x[torch.arange(x.shape[0], device=x.device), eos_pos], x
