"""The CLIP4IDC peer of the throughput harness: CLIP4IDC's captioning architecture and decoding loop, random weights.

The paper's Table 5 compares NAMC with CLIP4IDC (Guo et al., 2022; 173.7M parameters). This module rebuilds that
model's inference path from the facts of the public code (sushizixin/CLIP4IDC: ``modules/module_clip.py``,
``modules/modeling.py``, ``modules/decoder-base/decoder_config.json``, ``main_task_caption.py``), written here:

- **Visual encoder**: the CLIP ViT-B/32 of open_clip (``open_clip.create_model("ViT-B-32")``, random weights; the
  full CLIP model, text tower included, as CLIP4IDC holds it). Each image runs through the patch embedding and the
  first 9 of the 12 transformer layers on its own ("intra" layers); then the two images' 2 x 50 tokens are joined,
  each side adds a learned before/after embedding, a joint positional embedding and a LayerNorm, and the last 3
  layers (the cross encoder: "inter" layers) run over all 100 tokens. ``ln_post`` and the 768 -> 512 projection
  give the (B, 100, 512) visual memory. Both images are encoded once per caption.
- **Caption model** (``modules/module_decoder.py``'s ``DecoderModel``): a 3-layer post-LN transformer encoder over
  the visual memory (the cross encoder; width 512, 8 heads, FFN 2048, GELU), then 3 post-LN decoder layers with
  causal self-attention, decoder layer i attending to encoder layer i's output; word and position embeddings
  shared with CLIP's text tower (49,408 x 512 and 77 x 512) followed by LayerNorm; the output head is a 512 x 512
  transform, GELU, LayerNorm and the projection onto the vocabulary with the word-embedding matrix (tied) plus a
  bias. With the full CLIP model this counts 173.7M parameters, Table 5's figure.
- **Decoding** (``beam_decode`` with one beam): at every step ``DecoderModel.forward`` re-runs the cross encoder
  over the visual memory and the decoder over the whole prefix, with no key/value cache, projects every position
  onto the 49,408-word vocabulary and keeps the last one.

Speed-ups of namc over this peer are measured in the same process, on the same images, with the same number of
generated tokens, in interleaved calls (:mod:`.inference`).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable

import open_clip
import torch
import torch.nn.functional as F
from torch import nn

from namc.backends import onednn
from namc.backends.onednn import OneDNNLinear
from namc.backends.qlinear import DynamicLinear, int8_forms
from namc.backends.step import InplaceGELU as GELU
from namc.backends.step import ThreadedLayerNorm as LayerNorm
from namc.backends.step import attend_sized

__all__ = [
    "PAPER_PARAMETERS",
    "CLIP4IDCPeer",
    "OneDNNLinear",
    "ProjectedAttention",
    "linear_form",
    "namc_norms",
    "peer_at",
]

PAPER_PARAMETERS = 173_700_000  # Table 5 of the NAMC paper
BOS_ID, EOS_ID = 49406, 49407  # CLIP BPE's <|startoftext|> and <|endoftext|>


class CLIP4IDCPeer(nn.Module):
    """CLIP4IDC's captioning model (random weights) with its greedy decoding loop.

    Args:
        intra_layers: ViT layers run on each image alone before the two are joined (CLIP4IDC's default, 9).
        decoder_layers: cross-encoder and caption-decoder layers (3 each).
        decoder_heads: decoder attention heads (8).
        decoder_ffn: decoder feed-forward width (2048).
    """

    def __init__(
        self, intra_layers: int = 9, decoder_layers: int = 3, decoder_heads: int = 8, decoder_ffn: int = 2048
    ) -> None:
        super().__init__()
        self.clip = open_clip.create_model("ViT-B-32", pretrained=None)
        visual = self.clip.visual
        width = visual.conv1.out_channels  # 768
        tokens = visual.positional_embedding.shape[0]  # 50 = 7 x 7 patches + class token
        dim = self.clip.token_embedding.weight.shape[1]  # 512
        self.image_size = visual.conv1.kernel_size[0] * math.isqrt(tokens - 1)
        self.intra_layers = intra_layers
        scale = width**-0.5
        self.bef_embedding = nn.Parameter(scale * torch.randn(width))
        self.aft_embedding = nn.Parameter(scale * torch.randn(width))
        self.joint_positional_embedding = nn.Parameter(scale * torch.randn(2 * tokens, width))
        self.ln_mid = nn.LayerNorm(width)
        self.emb_norm = nn.LayerNorm(dim)
        self.cross = nn.ModuleList(_EncoderLayer(dim, decoder_heads, decoder_ffn) for _ in range(decoder_layers))
        self.decoder = nn.ModuleList(
            nn.TransformerDecoderLayer(dim, decoder_heads, decoder_ffn, 0.0, "gelu", batch_first=True)
            for _ in range(decoder_layers)
        )
        self.transform = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim))
        self.head = nn.Linear(dim, self.clip.token_embedding.weight.shape[0])
        self.head.weight = self.clip.token_embedding.weight  # tied, as BERT's prediction head
        self.max_len = self.clip.positional_embedding.shape[0]
        self.eos_id = EOS_ID
        self.register_buffer("vocab_ids", None, persistent=False)  # the shortlist, restrict_vocabulary

    def restrict_vocabulary(self, ids: torch.Tensor) -> None:
        """Project onto the (S,) vocabulary ``ids`` only, as namc's shortlists (:mod:`namc.models.shortlist`): the
        head keeps those rows of the tied embedding (untied copies) and their biases; the greedy pick is mapped
        back to the vocabulary. Before :func:`peer_at`, which converts the new head like the others."""
        ids = ids.to(self.head.weight.device)
        head = nn.Linear(self.head.in_features, ids.numel(), device=ids.device, dtype=self.head.weight.dtype)
        with torch.no_grad():
            head.weight.copy_(self.head.weight.index_select(0, ids))
            head.bias.copy_(self.head.bias.index_select(0, ids))
        self.head, self.vocab_ids = head, ids

    def num_parameters(self) -> dict[str, int]:
        """``total`` (every distinct parameter, as Table 5 counts) and ``inference`` (what captioning runs: the
        visual tower, the shared embeddings and the decoder; CLIP's text transformer is held but not run)."""
        total = sum(p.numel() for p in self.parameters())
        text = [self.clip.transformer, self.clip.ln_final]
        unused = sum(p.numel() for m in text for p in m.parameters()) + self.clip.text_projection.numel()
        return {"total": total, "inference": total - unused - self.clip.logit_scale.numel()}

    def encode(self, images_1: torch.Tensor, images_2: torch.Tensor) -> torch.Tensor:
        """(B, 3, 224, 224) before/after images in [0, 1] -> (B, 100, 512) visual memory (9 intra + 3 inter)."""
        visual = self.clip.visual
        B = images_1.shape[0]
        x = torch.cat([images_1, images_2]).to(visual.conv1.weight.dtype)  # (2B, 3, H, W); the int8 peer's on AMX: bf16
        mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(open_clip.OPENAI_DATASET_STD, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
        x = visual.conv1((x - mean) / std).flatten(2).transpose(1, 2)  # (2B, 49, 768)
        cls = visual.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = visual.ln_pre(torch.cat([cls, x], dim=1) + visual.positional_embedding.to(x.dtype))  # (2B, 50, 768)
        blocks = visual.transformer.resblocks
        for block in blocks[: self.intra_layers]:
            x = block(x)
        x = torch.cat([x[:B] + self.bef_embedding, x[B:] + self.aft_embedding], dim=1)  # (B, 100, 768)
        x = self.ln_mid(x + self.joint_positional_embedding)
        for block in blocks[self.intra_layers :]:
            x = block(x)
        return visual.ln_post(x) @ visual.proj  # (B, 100, 512), in the dtype of the cross encoder (logits casts)

    def logits(self, tokens: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """(B, T) prefix over (B, S, 512) memory -> (B, T, V): the cross encoder re-run over the memory, the
        decoder over the prefix, every position projected onto the vocabulary (``DecoderModel.forward``)."""
        T = tokens.shape[1]
        memory = memory.to(self.cross[0].norm1.weight.dtype)  # the cross encoder's dtype (int8 peer on AMX: bf16)
        x = self.emb_norm(F.embedding(tokens, self.clip.token_embedding.weight) + self.clip.positional_embedding[:T])
        causal = torch.triu(torch.full((T, T), float("-inf"), dtype=x.dtype, device=x.device), 1)
        for encoder_layer, decoder_layer in zip(self.cross, self.decoder):
            memory = encoder_layer(memory)  # (B, S, 512): encoder layer i feeds decoder layer i
            x = decoder_layer(x, memory, tgt_mask=causal)
        return self.head(self.transform(x))

    @torch.inference_mode()
    def decode(self, memory: torch.Tensor, max_new_tokens: int = 23) -> torch.Tensor:
        """Greedy decoding from the visual memory, the prefix re-run at every step; (B, T) ids without [BOS]."""
        if max_new_tokens + 1 > self.max_len:
            raise ValueError(f"max_new_tokens={max_new_tokens} needs {max_new_tokens + 1} positions > {self.max_len}")
        B = memory.shape[0]
        tokens = torch.full((B, 1), BOS_ID, dtype=torch.long, device=memory.device)
        finished = torch.zeros(B, dtype=torch.bool, device=memory.device)
        for _ in range(max_new_tokens):
            nxt = self.logits(tokens, memory)[:, -1].argmax(dim=-1)  # (B,)
            nxt = (nxt if self.vocab_ids is None else self.vocab_ids[nxt]).masked_fill(finished, 0)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            finished |= nxt == self.eos_id
            if bool(finished.all()):
                break
        return tokens[:, 1:]

    @torch.inference_mode()
    def generate_ids(self, images_1: torch.Tensor, images_2: torch.Tensor, max_new_tokens: int = 23) -> torch.Tensor:
        """End to end from pixels: encode the pair once, then :meth:`decode`."""
        return self.decode(self.encode(images_1, images_2), max_new_tokens)


class _EncoderLayer(nn.Module):
    """Post-LN encoder layer of the cross encoder (UniVL's ``EncoderLayer``): self-attention, residual, LayerNorm,
    GELU feed-forward, residual, LayerNorm. (``nn.TransformerEncoderLayer``'s fused eval path reads its linear
    weights as tensors, which the int8 peer's quantised layers are not.)"""

    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x, x, x, need_weights=False)[0])
        return self.norm2(x + self.ffn(x))


def peer_at(peer: CLIP4IDCPeer, precision: str) -> CLIP4IDCPeer:
    """A copy of the peer with every linear map converted as namc's own are for ``precision``, the attention projections
    included (:class:`ProjectedAttention`): ``int8``, dynamic int8 layers
    (:class:`~namc.backends.qlinear.DynamicLinear`); ``bf16``, bf16 weights prepacked for oneDNN, as namc's bf16
    decoding step keeps them (:meth:`~namc.backends.step.FusedFDG.pack_step`; a plain bf16 weight is reordered at
    every call); ``fp32``, the peer itself in eager PyTorch, as namc's fp32 is its model core. So the peer is
    measured on the same kernels as namc. On a CPU with AMX the int8 peer runs its products over the visual memory in
    bf16 (:func:`_memory_side_to_bf16`). Where this torch has no oneDNN linear kernel (or off the CPU) bf16 is plain
    bf16 weights; where oneDNN has no bf16 on this CPU, bf16 is fp32, as namc's bf16 copy is
    there (:func:`~namc.backends.onednn.bf16_supported`)."""
    on_cpu = peer.head.weight.device.type == "cpu"
    onednn_ok = on_cpu and onednn.linear_available()
    if precision == "bf16" and on_cpu and not onednn.bf16_supported():
        precision = "fp32"
    if precision == "fp32":
        return peer
    if precision == "int8":
        bf16_memory = onednn_ok and onednn.amx_bf16()  # as namc's int8 copy on AMX
        forms = int8_forms(peer)
        if bf16_memory:
            memory_side = {id(m) for part in (peer.clip.visual, peer.cross) for m in part.modules()}
            forms = {key: form for key, form in forms.items() if key not in memory_side}
        twin, linear = copy.deepcopy(peer, forms).eval(), DynamicLinear
        if bf16_memory:
            _memory_side_to_bf16(twin)
    else:
        twin = copy.deepcopy(peer).eval().to(torch.bfloat16)
        if not onednn_ok:
            return twin
        linear = functools.partial(OneDNNLinear, dtype=torch.bfloat16)
    return namc_norms(_convert(twin, linear))


def _memory_side_to_bf16(peer: CLIP4IDCPeer) -> None:
    """What the peer computes from the images alone in bf16 on oneDNN's prepacked kernel, in place: the ViT, its
     before / after / joint embeddings and their LayerNorm (once per pair) and the cross encoder over the visual
     memory (at every step, as CLIP4IDC decodes) and the decoder's keys / values of that memory (its queries and
     output in dynamic int8). The int8 peer on a CPU with AMX, where namc's int8 copy runs MIR and its cross-attention
     keys / values in bf16 (:func:`namc.backends.precision.mir_in_bf16`, :meth:`FusedFDG.pack_step
    `): on the tiles bf16 runs products of hundreds of rows faster than PyTorch's
     dynamic int8."""
    for param in (peer.bef_embedding, peer.aft_embedding, peer.joint_positional_embedding):
        param.data = param.data.to(torch.bfloat16)
    bf16 = functools.partial(OneDNNLinear, dtype=torch.bfloat16)
    for part in (peer.clip.visual, peer.ln_mid, peer.cross):
        _convert(part.to(torch.bfloat16), bf16)
    for layer in peer.decoder:  # before _convert, which leaves a ProjectedAttention as it is
        layer.multihead_attn = ProjectedAttention(layer.multihead_attn, DynamicLinear, cross=True, kv_linear=bf16)


def _convert(twin: nn.Module, linear: Callable[[torch.Tensor, torch.Tensor | None], nn.Module]) -> nn.Module:
    """``twin`` with each attention and plain ``nn.Linear`` in the form ``linear(weight, bias)`` makes."""
    for module in list(twin.modules()):
        for name, child in module.named_children():
            if isinstance(child, nn.MultiheadAttention):  # the decoder layers' multihead_attn attend to the memory
                cross = isinstance(module, nn.TransformerDecoderLayer) and name == "multihead_attn"
                setattr(module, name, ProjectedAttention(child, linear, cross=cross))
            elif type(child) is nn.Linear:  # bf16 and fp32 (int8's are DynamicLinear already)
                setattr(
                    module, name, linear(child.weight.detach(), None if child.bias is None else child.bias.detach())
                )
    return twin


def namc_norms(twin: nn.Module) -> nn.Module:
    """``twin`` (an inference copy) with its LayerNorms and GELUs as namc's
    (:class:`~namc.backends.step.ThreadedLayerNorm`, :class:`~namc.backends.step.InplaceGELU`): the same values, on one
    thread where the input is small and OpenMP's idle threads sleep, as namc's decoding step runs them. The decoder
    layers' GELU is a function; it becomes the module."""
    for module in list(twin.modules()):
        for name, child in module.named_children():
            if type(child) in (nn.LayerNorm, open_clip.transformer.LayerNorm):  # the same maths where dtypes agree
                norm = LayerNorm(child.normalized_shape, child.eps, child.elementwise_affine, child.bias is not None)
                norm.load_state_dict(child.state_dict())
                setattr(module, name, norm.to(child.weight.dtype) if child.weight is not None else norm)
            elif type(child) is nn.GELU:
                setattr(module, name, GELU(child.approximate))
        if isinstance(module, nn.TransformerDecoderLayer) and module.activation is F.gelu:
            module.activation = GELU()
    return twin


def linear_form(peer: CLIP4IDCPeer, encoder: bool = False) -> str:
    """What the peer's decoding linear maps (or, with ``encoder``, its image encoder's) run as, one of
    :data:`~namc.eval.throughput.settings.LINEAR_FORMS` (the report's ``peer.linear_maps`` and
    ``peer.encoder_linear_maps``): plain ``F.linear`` in the weights' dtype, oneDNN's kernel (:class:`OneDNNLinear`)
    or dynamic int8."""
    head = peer.clip.visual.transformer.resblocks[0].mlp.c_fc if encoder else peer.head
    if isinstance(head, DynamicLinear):
        return "int8_dynamic"
    if isinstance(head, OneDNNLinear):
        kind = "onednn_bf16" if head.weight.dtype == torch.bfloat16 else "onednn_fp32"
        return f"{kind}_prepacked" if onednn.is_packed(head.weight) else kind
    return "bf16" if head.weight.dtype == torch.bfloat16 else "fp32"


class ProjectedAttention(nn.Module):
    """``nn.MultiheadAttention`` with its input and output projections as the linear maps ``linear(weight, bias)``
    makes: dynamic int8 for the int8 peer, oneDNN's bf16 or fp32 linear kernel for the others.

    PyTorch's dynamic flow, and so :func:`~namc.backends.qlinear.quantize_linears`, leaves ``nn.MultiheadAttention``
    in fp32: its input projection is a bare weight and its output projection a ``NonDynamicallyQuantizableLinear``.
    In the peer those are a third of every layer's multiply-adds (four 768 x 768 or 512 x 512 maps per layer against
    the feed-forward's eight), while every attention projection of namc's int8 copy is int8: an int8 peer that kept
    them in fp32 encoded 1.65-1.75x and decoded 1.58-1.84x slower than this form. The three projections of a
    self-attention run as one product, or, with ``cross``, the query's as one and the keys and values of the memory
    as another; the attention itself runs through ``F.scaled_dot_product_attention`` in the activations' dtype, as
    namc's. It takes the calls the peer makes (``batch_first`` or not, the queries as keys and values or, with
    ``cross``, keys and values from one other tensor, ``attn_mask``, ``need_weights=False``). ``kv_linear``, with
    ``cross``: the form of the keys' and values' projection, where it differs from ``linear``'s."""

    def __init__(
        self,
        attention: nn.MultiheadAttention,
        linear: Callable[[torch.Tensor, torch.Tensor], nn.Module],
        cross: bool = False,
        kv_linear: Callable[[torch.Tensor, torch.Tensor], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        if not attention._qkv_same_embed_dim or attention.in_proj_bias is None or attention.dropout:
            raise ValueError(
                "ProjectedAttention takes an nn.MultiheadAttention with one input projection, biases, no dropout"
            )
        width, self.heads, self.batch_first = attention.embed_dim, attention.num_heads, attention.batch_first
        weight, bias = attention.in_proj_weight.detach(), attention.in_proj_bias.detach()
        self.cross = cross
        if cross:  # the form of each call is known when built: one conversion of the input projection, not two
            self.q, self.kv = linear(weight[:width], bias[:width]), (kv_linear or linear)(weight[width:], bias[width:])
        else:
            self.qkv = linear(weight, bias)
        self.out = linear(attention.out_proj.weight.detach(), attention.out_proj.bias.detach())

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, None]:
        if key_padding_mask is not None or need_weights or key is not value or (key is query) == self.cross:
            raise NotImplementedError(
                "ProjectedAttention: no key padding mask, no weights, keys and values from one tensor, the queries "
                "themselves for a self-attention and another tensor for a cross-attention"
            )
        if not self.batch_first:
            query, key = query.transpose(0, 1), key.transpose(0, 1)
        if self.cross:  # the int8 peer's keys / values of the memory are bf16 on AMX (peer_at): so its attention
            q, (k, v) = self.q(query), self.kv(key).chunk(2, dim=-1)
            q = q.to(k.dtype)
        else:
            q, k, v = self.qkv(query).chunk(3, dim=-1)
        B, L, D = q.shape

        def heads(x: torch.Tensor) -> torch.Tensor:  # (B, S, D) -> (B, H, S, D / H)
            return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        causal = is_causal and attn_mask is None
        x = attend_sized(
            F.scaled_dot_product_attention, heads(q), heads(k), heads(v), attn_mask=attn_mask, is_causal=causal
        )
        x = self.out(x.transpose(1, 2).reshape(B, L, D).to(query.dtype))
        return (x if self.batch_first else x.transpose(0, 1)), None
