"""MIR fusion blocks: how the two co-attended image streams become one memory ``E_MIR`` for FDG.

Dimension letters: B pairs, N grid positions, D width.

A fusion block is an ``nn.Module`` built as ``cls(dim)`` whose forward takes the final (B, N, D) states of the two
streams, ``forward(x1, x2) -> (B, N, D)``. A block that sets ``multi_scale = True`` also receives ``layers``: the
list of (x1, x2) outputs of every MIR layer (before MIR's final LayerNorm), for blocks that fuse several depths. A
block that mixes positions and sets ``attends = True`` also receives ``keep1`` and ``keep2`` in pre-training:
(B, N) bool, True where a position of that image may be read (False: NIM masked it as noise; None when nothing is
masked), so that, as MIR's co-attention, it never reads a masked position (section 3.2.2).
Register a block with ``@register_fusion("name")`` and pick it with ``NAMCConfig.fusion = "name"`` (like timm's
``get_attn``): the block is one class and one registry line.

``concat`` is the paper's: ``E_MIR = FC([Y1; Y2])`` (section 3.2.2). It *is* an ``nn.Linear(2D, D)`` so its
parameters keep the names every saved model has (``mir.fuse.weight``, ``mir.fuse.bias``); it stays the default.

``difference`` is MED's Eq. 7 objective as a fusion: the text decoder reads the feature difference ``I(x) - I(x^)``
of the two images (MED paper, section 4.3), here ``E_MIR = FC(Y1 - Y2)`` over the co-attended streams
(:class:`DifferenceFusion`), so a study can set the difference alone against the paper's concatenation.

``mdp`` is M3Diff's Multi-scale Differential Perception block (OmniDiff paper, section 4.2): gating, a projected
difference, attention over the difference and a gated sum over scales (the MIR layers), then the same FC
(:class:`MDPFusion`; the preset ``namc_base_mdp`` uses it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from namc.models.layers import Attention, Block, ensure_attendable, residual

__all__ = ["ConcatFusion", "DifferenceFusion", "MDPFusion", "create_fusion", "list_fusions", "register_fusion"]

_FUSIONS: dict[str, type[nn.Module]] = {}


def register_fusion(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: make a fusion block available as ``NAMCConfig.fusion = name``."""

    def add(cls: type[nn.Module]) -> type[nn.Module]:
        if name in _FUSIONS:
            raise ValueError(f"a fusion block named {name!r} is already registered ({_FUSIONS[name].__name__})")
        _FUSIONS[name] = cls
        return cls

    return add


def list_fusions() -> list[str]:
    """Names of the registered fusion blocks."""
    return sorted(_FUSIONS)


def create_fusion(name: str, dim: int) -> nn.Module:
    """Build the fusion block ``name`` for width ``dim``."""
    if name not in _FUSIONS:
        raise ValueError(f"unknown MIR fusion {name!r}; registered: {list_fusions()}")
    return _FUSIONS[name](dim)


@register_fusion("concat")
class ConcatFusion(nn.Linear):
    """The paper's fusion: concatenate the two streams per position and project back to D (an FC, section 3.2.2)."""

    multi_scale = False

    def __init__(self, dim: int) -> None:
        super().__init__(2 * dim, dim)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(torch.cat([x1, x2], dim=-1))  # (B, N, 2D) -> (B, N, D)


def _heads_for(dim: int) -> int:
    """Attention heads of the MDP block: 64-wide heads where D allows it (12 at D = 768, like MIR), else one."""
    return dim // 64 if dim >= 64 and dim % 64 == 0 else 1


class _CrossAttention(nn.Module):
    """Pre-LN residual cross-attention ``x + Attn(LN(x), LN(context))`` (Eq. 6's CA, without an FFN)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_query = nn.LayerNorm(dim)
        self.ln_context = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)

    def forward(self, x: torch.Tensor, context: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        return residual(x, self.attn(self.ln_query(x), self.ln_context(context), key_mask=key_mask))  # (B, T, D)


@register_fusion("difference")
class DifferenceFusion(nn.Linear):
    """MED's Eq. 7 as a fusion: the first stream minus the second, projected by an FC, ``FC(Y1 - Y2)``. Only what
    differs between the two co-attended images reaches the decoder; a position where both agree contributes the FC's
    bias alone. The order is the pair's (before minus after), as Eq. 7's ``I(x) - I(x^)`` (original minus edited)."""

    multi_scale = False

    def __init__(self, dim: int) -> None:
        super().__init__(dim, dim)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x1 - x2)  # (B, N, D)


@register_fusion("mdp")
class MDPFusion(nn.Module):
    """M3Diff's Multi-scale Differential Perception (MDP) block (OmniDiff paper, section 4.2, Eqs. 1-8) as a fusion.

    Per scale i (one MIR layer's two streams ``F_1^i``, ``F_2^i``, each (B, N, D)):

    - gating (Eq. 1-2): ``lambda_1 = sigmoid(W_m [F_1 || F_2])``, ``lambda_2 = sigmoid(W_m [F_2 || F_1])`` (one
      ``W_m`` in R^{D x 2D} for both orders, channel concatenation), ``F^_k = F_k * lambda_k``;
    - difference (Eq. 3): ``dF = W_p [F^_1 || F^_2 || (F^_1 - F^_2)]``, ``W_p`` in R^{D x 3D};
    - attention over the difference (Eq. 4-5): ``dF_sa = SA(dF)``, ``dF_ca = MLP(CA(dF_sa, [F_1 ; F_2 ; dF_sa]))``
      where ``[. ; .]`` joins token sets (the keys/values are 3N tokens); Eq. 6: ``F~_k = CA(F_k, [F_k ; dF_ca])``
      for k = 1, 2 with one shared CA;
    - multi-scale integration (Eq. 7-8): ``Score^i = sigmoid(MLP(mean_tokens(F~_1^i || F~_2^i || dF^i)))`` in
      (0, 1)^D per pair, ``F'_k = sum_i Score^i * F~_k^i`` (a sigmoid per scale, not a softmax over scales, as
      written).

    namc's reading, where namc differs from M3Diff's setting:

    - **Scales.** M3Diff taps SigLIP layers 17, 20, 23 and 26 of its vision encoder; namc has no such stack in MIR's
      path (the grid comes from one ResNet stage). The scales here are the outputs of every MIR co-attention layer
      (``layers``, 2 for ``namc_base``): the shallower ones pass through this block's own LayerNorm (MIR's residual
      stream before its final LayerNorm), the deepest one is MIR's output ``(x1, x2)`` itself (after its final
      LayerNorm). The interaction layers are what MIR has at several depths: low layers hold more of each image's
      own grid, the last one more of the cross-image interaction. (With a one-layer MIR there is one scale and
      ``ln_scale`` gets no gradient: under DDP that needs ``find_unused_parameters``.)
    - **Shared weights across scales.** The paper writes ``W_m``, ``W_p``, SA, CA and the MLPs without a layer
      index, and its MDP "comprises two stacked transformer layers": one set of weights serves every scale (read
      here as the two layers: Eq. 4-5 = a pre-LN transformer layer SA -> CA -> MLP, Eq. 6 = a pre-LN CA layer).
      The block is built as ``cls(dim)`` and so does not know MIR's depth; shared weights also let one block serve
      any number of MIR layers.
    - **Sublayers** are pre-LN and residual like namc's other layers (:class:`~namc.models.layers.Block`), with
      64-wide heads (12 at D = 768) and no dropout (a fusion block has no config of its own). The linear maps have
      biases (the paper writes only the weights). ``Score``'s MLP is ``3D -> D -> D`` with a GELU.
    - **Masked positions** (pre-training). MIR's co-attention never reads a position NIM masked (section 3.2.2), and
      neither does this block: a difference token ``dF[n]`` is clean where both images' position n is, the
      attention of Eqs. 4-6 reads only clean tokens (``F_k`` where image k is unmasked, ``dF`` where both are), and
      Eq. 7's mean runs over the positions clean in both images. So ``E_MIR`` at those positions does not depend on
      the masked content, as with ``concat``. Without masks (fine-tuning, inference) nothing changes.
    - **Output.** M3Diff hands ``F'_1`` and ``F'_2`` to its language model as two image-token sets; namc's FDG reads
      one (B, N, D) memory, so the two refined streams are fused by the paper's (NAMC's) own rule, an FC over their
      concatenation (section 3.2.2): ``E_MIR = W_o [F'_1 || F'_2]``.
    """

    multi_scale = True
    attends = True

    def __init__(self, dim: int) -> None:
        super().__init__()
        heads = _heads_for(dim)
        self.ln_scale = nn.LayerNorm(dim)  # the shallower MIR layers' residual streams (the last one is MIR's output)
        self.gate = nn.Linear(2 * dim, dim)  # W_m (Eq. 1)
        self.diff = nn.Linear(3 * dim, dim)  # W_p (Eq. 3)
        self.diff_layer = Block(dim, heads, mlp_ratio=4.0, dropout=0.0)  # SA -> CA -> MLP (Eq. 4-5)
        self.fuse_back = _CrossAttention(dim, heads)  # CA of Eq. 6
        self.score = nn.Sequential(nn.Linear(3 * dim, dim), nn.GELU(), nn.Linear(dim, dim))  # MLP of Eq. 7
        self.out = nn.Linear(2 * dim, dim)  # E_MIR = W_o [F'_1 || F'_2] (section 3.2.2's FC)

    def perceive(
        self, f1: torch.Tensor, f2: torch.Tensor, keep: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One scale: Eqs. 1-6.

        Args:
            f1: (B, N, D) ``F_1^i``.
            f2: (B, N, D) ``F_2^i``.
            keep: (B, N) bool masks of the positions of image 1 and image 2 that may be read (None: all).

        Returns:
            ``(F~_1, F~_2, dF)``, each (B, N, D).
        """
        B, N, _ = f1.shape
        lam1 = torch.sigmoid(self.gate(torch.cat([f1, f2], dim=-1)))  # (B, N, D), Eq. 1
        lam2 = torch.sigmoid(self.gate(torch.cat([f2, f1], dim=-1)))  # (B, N, D)
        g1, g2 = f1 * lam1, f2 * lam2  # Eq. 2
        delta = self.diff(torch.cat([g1, g2, g1 - g2], dim=-1))  # (B, N, D), Eq. 3
        keys_sa = keys_ca = keys_back = None  # the key masks of Eqs. 4, 5 and 6 (None: every key)
        if keep is not None:
            both = keep[0] & keep[1]  # (B, N): dF[n] reads both images' position n
            keys_sa = ensure_attendable(both)
            keys_ca = ensure_attendable(torch.cat([keep[0], keep[1], both], dim=1))  # (B, 3N)
            keys_back = ensure_attendable(torch.cat([torch.cat([k, both], dim=1) for k in keep], dim=0))  # (2B, 2N)
        blk = self.diff_layer
        d_sa = blk.self_attend(delta, key_mask=keys_sa)  # (B, N, D), Eq. 4
        d_ca = blk.cross_attend(d_sa, torch.cat([f1, f2, d_sa], dim=1), key_mask=keys_ca)  # keys (B, 3N, D), Eq. 5
        d_ca = blk.feed_forward(d_ca)  # Eq. 5's MLP
        queries = torch.cat([f1, f2], dim=0)  # (2B, N, D): both streams through the one CA of Eq. 6
        context = torch.cat([torch.cat([f1, d_ca], dim=1), torch.cat([f2, d_ca], dim=1)], dim=0)  # (2B, 2N, D)
        refined = self.fuse_back(queries, context, key_mask=keys_back)  # (2B, N, D)
        return refined[:B], refined[B:], delta

    def forward(
        self,
        x1: torch.Tensor,
        x2: torch.Tensor,
        layers: list[tuple[torch.Tensor, torch.Tensor]],
        keep1: torch.Tensor | None = None,
        keep2: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``E_MIR`` from MIR's output and its per-layer streams.

        Args:
            x1: (B, N, D) MIR's output for image 1 (after its final LayerNorm): the deepest scale.
            x2: (B, N, D) likewise for image 2.
            layers: ``[(x1_l, x2_l), ...]``, every MIR layer's output (before the final LayerNorm), shallow to
                deep; all but the last are the shallower scales (the last is ``(x1, x2)`` before the LayerNorm).
            keep1, keep2: (B, N) bool, the positions of each image that may be read (None: all; see the class).

        Returns:
            (B, N, D) ``E_MIR``.
        """
        scales = [(self.ln_scale(a), self.ln_scale(b)) for a, b in layers[:-1]] + [(x1, x2)]
        keep = weight_n = None
        if keep1 is not None or keep2 is not None:
            every = torch.ones(x1.shape[:2], dtype=torch.bool, device=x1.device)
            keep = (every if keep1 is None else keep1, every if keep2 is None else keep2)
            both = ensure_attendable(keep[0] & keep[1]).to(x1.dtype)  # (B, N)
            weight_n = (both / both.sum(dim=1, keepdim=True)).unsqueeze(-1)  # (B, N, 1): Eq. 7's mean, clean only
        fused1 = fused2 = None
        for f1, f2 in scales:
            t1, t2, delta = self.perceive(f1, f2, keep)
            tokens = torch.cat([t1, t2, delta], dim=-1)  # (B, N, 3D)
            pooled = tokens.mean(dim=1) if weight_n is None else (tokens * weight_n).sum(dim=1)  # (B, 3D), Phi_Mean
            weight = torch.sigmoid(self.score(pooled)).unsqueeze(1)  # (B, 1, D), Score^i of Eq. 7
            fused1 = weight * t1 if fused1 is None else fused1 + weight * t1  # Eq. 8
            fused2 = weight * t2 if fused2 is None else fused2 + weight * t2
        return self.out(torch.cat([fused1, fused2], dim=-1))  # (B, N, 2D) -> (B, N, D)
