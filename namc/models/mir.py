"""MIR: masked image reconstruction and cross-image interaction (section 3.2.2, appendix E.2).

Dimension letters: B batch (pairs), N grid positions (n_I), C grid channels, D width, L text tokens, V codebook.

One masked image encoder ``E_M`` (2 layers of self-attention -> cross-attention -> FFN) serves two paths:

- reconstruction: ``E_M(X^M_i, K/V = E_T(T^msk_i))`` -> FC -> softmax over the VQGAN codebook, loss on masked
  positions only (pre-training);
- interaction (co-attention): the two image streams run through the same layers side by side; in every layer each
  stream's self-attention output queries the other stream's self-attention output (ViLBERT-style co-attention; the
  paper says only "the key and value ... come from the other image feature"), masked positions are excluded as keys
  in both self- and cross-attention, and the two outputs are fused back to D (E_MIR) by a fusion block
  (:mod:`namc.models.fusion`; the paper's is an FC over their concatenation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from namc.models.fusion import create_fusion
from namc.models.layers import Block, ensure_attendable


@dataclass(frozen=True)
class MIRConfig:
    """The shape of a MIR module.

    Args:
        in_channels: grid feature channels C (1024 for ResNet-101 layer3).
        num_positions: grid positions n_I (196 at 224 px).
        dim: width D (768 in the paper).
        heads: attention heads (12).
        layers: encoder layers (2, appendix B.1).
        text_dim: width of NIM's projected text tokens, projected to D for the reconstruction cross-attention;
            None for a model without pre-training modules.
        codebook_size: V, the VQGAN codebook (16384 for f16-16384); 0 for no discrete head.
        rec_loss: ``"discrete"`` (the paper), or ``"l1"`` / ``"l2"`` regression onto X (Table 7 ablations).
        mlp_ratio: FFN hidden width over D.
        dropout: dropout in the encoder.
        fusion: the block that fuses the two streams into E_MIR (:mod:`namc.models.fusion`; ``concat``: the paper).
    """

    in_channels: int
    num_positions: int
    dim: int = 768
    heads: int = 12
    layers: int = 2
    text_dim: int | None = None
    codebook_size: int = 16384
    rec_loss: str = "discrete"
    mlp_ratio: float = 4.0
    dropout: float = 0.1
    fusion: str = "concat"


class MIR(nn.Module):
    """Masked image embedding, the shared masked image encoder, the fusion block and the reconstruction head."""

    def __init__(self, config: MIRConfig) -> None:
        super().__init__()
        if config.rec_loss not in ("discrete", "l1", "l2"):
            raise ValueError(f"rec_loss must be 'discrete', 'l1' or 'l2', got {config.rec_loss!r}")
        c = self.config = config
        in_channels, dim = c.in_channels, c.dim
        self.rec_loss = c.rec_loss
        self.e_m = nn.Parameter(torch.zeros(in_channels))  # e_M, replaces masked grid features
        nn.init.normal_(self.e_m, std=0.02)
        # a 1x1 convolution on the h x w grid is this per-position linear map C -> D
        self.proj = nn.Linear(in_channels, dim)
        self.pos = nn.Parameter(torch.zeros(c.num_positions, dim))
        nn.init.normal_(self.pos, std=0.02)
        self.blocks = nn.ModuleList(Block(dim, c.heads, c.mlp_ratio, c.dropout) for _ in range(c.layers))
        self.ln_out = nn.LayerNorm(dim)
        self.fuse = create_fusion(c.fusion, dim)
        self.memory_dtype: torch.dtype | None = None  # E_MIR cast to it (an int8 copy's bf16 MIR: fp32 for FDG)
        self.text_proj = nn.Linear(c.text_dim, dim) if c.text_dim else None
        out = c.codebook_size if c.rec_loss == "discrete" else in_channels
        self.head = nn.Linear(dim, out) if (c.text_dim and out) else None

    def embed(self, grid: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Masked image embedding ``X^M -> 1x1 conv -> + positions``.

        Args:
            grid: (B, N, C) raw grid features X.
            mask: (B, N) bool, True where masked (replaced by ``e_M``).

        Returns:
            (B, N, D) embedding ``\\hat X^M``.
        """
        if grid.shape[1:] != (self.pos.shape[0], self.proj.in_features):
            raise ValueError(
                f"MIR expects grid features of shape (B, {self.pos.shape[0]}, {self.proj.in_features}), got "
                f"{tuple(grid.shape)}: are the images at the model's image size (model.config.image_size)?"
            )
        grid = grid.to(self.pos.dtype)  # features in any float dtype (a bf16 copy's grid ahead of an fp32 MIR)
        if mask is not None:
            w = mask.unsqueeze(-1).type_as(grid)  # (B, N, 1)
            grid = grid * (1 - w) + self.e_m.to(grid.dtype) * w
        return self.proj(grid) + self.pos

    def reconstruct(self, x: torch.Tensor, text: torch.Tensor, text_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Reconstruction path ``E_M(\\hat X^M, K/V = E_T(T^msk))``.

        Args:
            x: (B, N, D) masked image embedding; every position attends to every position (BEiT).
            text: (B, L, text_dim) NIM token embeddings of the denoised description.
            text_mask: (B, L) bool, True for real tokens (padding excluded).

        Returns:
            (B, N, D) encoder output ``\\hat Y``.
        """
        if self.text_proj is None:
            raise RuntimeError("this MIR was built without a text projection (text_dim=None): no reconstruction")
        context = self.text_proj(text)  # (B, L, D)
        for block in self.blocks:
            x = block(x, context, context_mask=text_mask)
        return self.ln_out(x)

    def interact(
        self,
        x1: torch.Tensor,
        x2: torch.Tensor,
        mask1: torch.Tensor | None = None,
        mask2: torch.Tensor | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """Co-attention path: ``E_MIR = FC([E_M(X1, X2); E_M(X2, X1)])``.

        Both streams run as one (2B, N, D) batch through the shared layers: self-attention, then a swap of the two
        halves so each stream's cross-attention reads the other stream, then the FFN.

        Args:
            x1: (B, N, D) embedding of the first image.
            x2: (B, N, D) embedding of the second image.
            mask1: (B, N) bool, True where image 1 is masked (never attended); None for no mask (fine-tuning).
            mask2: (B, N) likewise for image 2.
            return_weights: also return each layer's attention weights (``self``, ``cross``: (2B, H, N, N)).

        Returns:
            (B, N, D) ``E_MIR`` (and the weights when asked).
        """
        B = x1.shape[0]
        x = torch.cat([x1, x2], dim=0)  # (2B, N, D)
        keep = None
        if mask1 is not None or mask2 is not None:
            m1 = mask1 if mask1 is not None else torch.zeros(x1.shape[:2], dtype=torch.bool, device=x1.device)
            m2 = mask2 if mask2 is not None else torch.zeros(x2.shape[:2], dtype=torch.bool, device=x2.device)
            keep = ensure_attendable(~torch.cat([m1, m2], dim=0))  # (2B, N) True = may be attended
        swapped = None if keep is None else torch.cat([keep[B:], keep[:B]], dim=0)
        weights: list[dict[str, torch.Tensor]] = []
        states: list[tuple[torch.Tensor, torch.Tensor]] = []  # after every layer, for multi-scale fusion blocks
        multi_scale = getattr(self.fuse, "multi_scale", False)
        for block in self.blocks:
            out = block.self_attend(x, key_mask=keep, need_weights=return_weights)
            x, w_self = out if return_weights else (out, None)
            other = torch.cat([x[B:], x[:B]], dim=0)  # (2B, N, D): stream 1 reads stream 2 and back
            out = block.cross_attend(x, other, key_mask=swapped, need_weights=return_weights)
            x, w_cross = out if return_weights else (out, None)
            x = block.feed_forward(x)
            if return_weights:
                weights.append({"self": w_self, "cross": w_cross})
            if multi_scale:
                states.append((x[:B], x[B:]))
        x = self.ln_out(x)
        extra: dict[str, object] = {"layers": states} if multi_scale else {}
        if keep is not None and getattr(self.fuse, "attends", False):  # a block that mixes positions: not the masked
            extra.update(keep1=keep[:B], keep2=keep[B:])
        fused = self.fuse(x[:B], x[B:], **extra)  # (B, N, D)
        if self.memory_dtype is not None:
            fused = fused.to(self.memory_dtype)
        return (fused, weights) if return_weights else fused
