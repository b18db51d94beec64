"""FDG: the fine-grained description generator, a 2-layer transformer decoder over E_MIR (section 3.2.3).

Dimension letters: B batch, K beams, T tokens, N memory positions (n_I), D width, V vocabulary, H heads.

Decoding encodes each pair once, caches the cross-attention keys/values of the memory and the self-attention
keys/values of the prefix (:class:`~namc.models.layers.KVCache`), projects only the last position onto the
vocabulary (or onto a shortlist's rows, :mod:`namc.models.shortlist`), and drops finished rows from the batch.
Greedy with at most 23 new tokens is the paper's setting (appendix F); beam search is ours. The naive decoder the
throughput harness compares against (no cache, every prefix position re-run and projected at every step) lives with
the harness, in :mod:`namc.eval.throughput`.

In eval mode the incremental step takes a fused path (:class:`~namc.models.layers.StepWeights`): one (3D x D)
projection gives the self-attention query, key and value, the hidden states stay (b, D) instead of (b, 1, D), the
cross-attention keys/values are made contiguous once, and on a CPU the large skinny products run through oneDNN
(:func:`~namc.models.onednn.dense`). In training mode (dropout active) the step runs the blocks' modules unchanged, so
sampling with dropout behaves as before. Finished rows are dropped once they are a quarter of the batch (not at
every [EOS]), which amortises the copies of the caches that each drop makes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from namc import ops
from namc.models import onednn
from namc.models.compiled_step import CompiledStep
from namc.models.layers import Block, KVCache, LayerNorm, attend_step, cache_dtype
from namc.models.layers import StepWeights as _StepWeights
from namc.models.packed_step import fp32_step_weights
from namc.models.qlinear import int8_linear, int8_worthwhile
from namc.models.shortlist import Shortlist, greedy_ids
from namc.thresholds import CROSS_KV_BF16_MIN  # read at each call: patchable here


@dataclasses.dataclass(frozen=True)
class FDGConfig:
    """The shape of an FDG decoder.

    Args:
        vocab_size: V.
        dim: width D (768).
        heads: attention heads (12).
        layers: decoder layers (2, appendix B.1).
        max_len: the most positions (prompt [BOS] included) the decoder can see.
        pad_id: padding id (targets at padding are ignored).
        bos_id: the first input token.
        eos_id: generation stops at it.
        mlp_ratio: FFN width over D.
        dropout: dropout.
        tie_embeddings: share the input embedding with the output projection (saves V x D parameters).
    """

    vocab_size: int
    dim: int = 768
    heads: int = 12
    layers: int = 2
    max_len: int = 160
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    mlp_ratio: float = 4.0
    dropout: float = 0.1
    tie_embeddings: bool = True


class FDG(nn.Module):
    """Transformer decoder with cross-attention to the MIR output."""

    def __init__(self, config: FDGConfig) -> None:
        super().__init__()
        c = self.config = config
        self.pad_id, self.bos_id, self.eos_id, self.max_len = c.pad_id, c.bos_id, c.eos_id, c.max_len
        self.heads = c.heads
        self.tok = nn.Embedding(c.vocab_size, c.dim)
        nn.init.normal_(self.tok.weight, std=0.02)
        self.pos = nn.Parameter(torch.zeros(c.max_len, c.dim))
        nn.init.normal_(self.pos, std=0.02)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c.dim, c.heads, c.mlp_ratio, c.dropout) for _ in range(c.layers))
        self.ln_f = LayerNorm(c.dim)
        # tied: the output projection reuses the input embedding (no parameter of its own, one tensor on disk)
        self.lm_head = None if c.tie_embeddings else nn.Linear(c.dim, c.vocab_size, bias=False)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Project (..., D) decoder states onto the (..., V) vocabulary."""
        x = self.ln_f(x)
        return F.linear(x.to(self.tok.weight.dtype), self.tok.weight) if self.lm_head is None else self.lm_head(x)

    def forward(
        self, tokens: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Teacher-forced logits for every position.

        Args:
            tokens: (B, T) input ids starting with [BOS]; padding after a sequence's end is fine (causal).
            memory: (B, N, D) E_MIR.
            memory_mask: (B, N) bool, True where memory may be attended; None for all.

        Returns:
            (B, T, V) next-token logits.
        """
        T = tokens.shape[1]
        if T > self.max_len:
            raise ValueError(f"{T} decoder positions exceed max_len={self.max_len}")
        x = self.drop(self.tok(tokens) + self.pos[:T])  # (B, T, D)
        for block in self.blocks:
            x = block(x, memory, context_mask=memory_mask, causal=True)
        return self.logits(x)

    # ----------------------------------------------------------------------------------------------- decoding

    def _step(
        self,
        tokens: torch.Tensor,
        position: int,
        caches: list[KVCache],
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        memory_mask: torch.Tensor | None,
        fused: list[_StepWeights] | None = None,
        shortlist: Shortlist | None = None,
    ) -> torch.Tensor:
        """One incremental step: (B, 1) new tokens at ``position`` -> (B, V) logits of the next token; (B, S) over a
        ``shortlist`` (the fused path: ``fused`` projects onto its rows already)."""
        if fused is not None:
            return self._fused_step(tokens[:, 0], position, caches, cross_kv, memory_mask, fused)
        x = self.tok(tokens) + self.pos[position : position + 1]  # (B, 1, D)
        for block, cache, kv in zip(self.blocks, caches, cross_kv):
            x = block.self_attend(x, cache=cache)
            x = block.cross_attend(x, key_mask=memory_mask, kv=kv)
            x = block.feed_forward(x)
        logits = self.logits(x[:, -1])  # (B, V)
        return logits if shortlist is None else shortlist.columns(logits)

    def _fused_step(
        self,
        tokens: torch.Tensor,
        position: int,
        caches: list[KVCache],
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        memory_mask: torch.Tensor | None,
        fused: list[_StepWeights],
    ) -> torch.Tensor:
        """Eval-mode step on (b,) tokens with (b, D) states; the same maths as the module path without dropout."""
        x = F.embedding(tokens, self.tok.weight) + self.pos[position]  # (b, D)
        return self._fused_layers(x, caches, cross_kv, memory_mask, fused)

    def _fused_layers(
        self,
        x: torch.Tensor,
        caches: list[KVCache],
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        memory_mask: torch.Tensor | None,
        fused: list[_StepWeights],
    ) -> torch.Tensor:
        """The eval step's layers on (b, D) input states -> (b, V) logits; each cache's keys are attended under its
        ``mask`` (None: all it returns; :class:`~namc.models.static_decode.StaticKVCache` masks the slots ahead)."""
        b, D = x.shape
        mask = None if memory_mask is None else memory_mask[:, None, None, :]  # (b, 1, 1, N)
        kv_dtype = cross_kv[0][0].dtype  # bf16 in a bf16 or int8 copy (FDG.pack_step)
        for block, cache, (k_mem, v_mem), w in zip(self.blocks, caches, cross_kv, fused):
            H, E = block.self_attn.heads, block.self_attn.head_dim
            qkv = onednn.dense(block.ln_self(x), *w.qkv).view(b, 3, H, 1, E)  # (b, 3, H, 1, E)
            k, v = cache.append(qkv[:, 1], qkv[:, 2])  # 2 x (b, H, t, E)
            y = attend_step(qkv[:, 0], k, v, cache.mask)  # (b, H, 1, E)
            x = x + onednn.dense(y.view(b, D), *w.self_out)  # (b, D)
            q = onednn.dense(block.ln_cross(x), *w.cross_q).view(b, H, 1, E)
            y = attend_step(q.to(kv_dtype), k_mem, v_mem, mask).to(q.dtype)  # (b, H, 1, E); int8: casts
            x = x + onednn.dense(y.view(b, D), *w.cross_out)  # (b, D)
            x = x + onednn.dense(block.ffn[1](onednn.dense(block.ln_ffn(x), *w.ffn_in)), *w.ffn_out)
        return onednn.dense(self.ln_f(x), *fused[-1].vocab)  # (b, V)

    def _start(
        self, memory: torch.Tensor, max_new_tokens: int, shortlist: Shortlist | None = None
    ) -> tuple[list[KVCache], list[tuple[torch.Tensor, torch.Tensor]], list[_StepWeights] | None]:
        """Caches, cross-attention keys/values (each 2 x (B, H, N, E), contiguous) and fused step weights (the
        vocabulary projection onto ``shortlist``'s rows only where one is given)."""
        if max_new_tokens + 1 > self.max_len:
            raise ValueError(f"max_new_tokens={max_new_tokens} needs {max_new_tokens + 1} positions > {self.max_len}")
        B, _, D = memory.shape
        compiled = "_compiled_step" in self.__dict__  # a compiled graph lays its weights out itself
        fused = None if self.training else self.step_weights(1 if compiled else B)
        dtype = cache_dtype(memory, fused)
        caches = [
            KVCache(B, self.heads, max_new_tokens + 1, D // self.heads, memory.device, dtype) for _ in self.blocks
        ]
        if fused is not None and compiled and onednn.is_packed(fused[0].vocab[0]):
            # a compiled graph cannot take oneDNN's opaque tensors: compile over the plain weights
            fused = [_StepWeights.of(block, self._vocab()) for block in self.blocks]
        if fused is not None and shortlist is not None:
            fused = self.shortlisted(fused, shortlist)
        return caches, self.cross_kv(memory), fused

    def shortlisted(self, fused: list[_StepWeights], shortlist: Shortlist) -> list[_StepWeights]:
        """``fused`` with the vocabulary projection onto ``shortlist``'s rows (:mod:`namc.models.shortlist`)."""
        head = shortlist.head(fused[-1].vocab, self._vocab()[0])
        return [dataclasses.replace(w, vocab=head) for w in fused]

    def _shortlist(self, vocabulary: Shortlist | Iterable[int] | None) -> Shortlist | None:
        if vocabulary is None:
            return None
        if isinstance(vocabulary, Shortlist):
            return vocabulary.fits(self.tok.weight.shape[0])
        return Shortlist(vocabulary, self.tok.weight.shape[0], self.eos_id)

    def cross_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's cross-attention keys and values of (B, N, D) ``memory``, 2 x (B, H, N, E), contiguous: once
        per generation. An int8 copy keeps them in bf16 from ``CROSS_KV_BF16_MIN`` elements of memory up (below,
        fp32's fused SDPA kernel is as fast or faster; :meth:`pack_step`)."""
        big = not self.training and memory.numel() >= CROSS_KV_BF16_MIN
        kv_dtype = getattr(self, "_cross_kv_dtype", None) if big else None
        return [
            tuple(
                t.contiguous() if kv_dtype in (None, t.dtype) else t.to(kv_dtype, memory_format=torch.contiguous_format)
                for t in block.context_kv(memory)
            )
            for block in self.blocks
        ]

    def step_weights(self, rows: int = 1) -> list[_StepWeights]:
        """The eval step's matrices per layer: those :meth:`pack_step` prepared, else the live parameters (large fp32
        ones reordered for oneDNN for a generation of ``rows`` rows, :mod:`namc.models.packed_step`)."""
        return getattr(self, "_packed_step", None) or fp32_step_weights(self, rows)

    def _vocab(self) -> tuple[torch.Tensor, None]:
        return (self.tok.weight if self.lm_head is None else self.lm_head.weight, None)

    def pack_step(self, precision: str) -> None:
        """Keep the eval step's matrices (the vocabulary projection included) in a form prepared once, for an
        inference copy (:mod:`namc.models.precision`) whose weights no longer change.

        - ``"int8"``: dynamic int8 layers (per-channel weight scales, activations quantised per call).
        - ``"bf16"``: on a CPU with oneDNN, the bf16 matrices reordered once into oneDNN's blocked layout
          (``torch.ops.mkldnn._reorder_linear_weight``); fp32 ones (too small to gain from bf16,
          :func:`~namc.models.onednn.bf16_worthwhile`) stay. A plain bf16 weight is reordered at every call, which
          for namc_base's 49409 x 768 vocabulary costs more than the product from batch 8. Without oneDNN, or where
          it has no bf16 here (:func:`~namc.models.onednn.bf16_supported`), nothing changes.

        The prefill (cross-attention keys/values of the memory, once per generation) stays in the weights' dtype in
        bf16 and becomes a dynamic int8 layer in int8, since in fp32 it would be a large share of int8 decoding. In
        int8, where oneDNN has bf16 on this CPU (its own check), the keys/values it writes are kept in bf16 from a
        memory of :data:`~namc.thresholds.CROSS_KV_BF16_MIN` elements up (namc_base's from 7 pairs), and each
        step's cross-attention reads them in bf16 as two batched products (:func:`~namc.models.layers.attend_one`):
        that attention is bound by reading the keys/values, so half the bytes pay from there, and fp32's fused
        kernel is as fast below. With AMX the int8 prefill runs in bf16 on the tiles, as MIR does, writing bf16 keys
        / values at any size (figures in docs/performance.md)."""
        if precision not in ("int8", "bf16"):
            raise ValueError(f"pack_step packs 'int8' or 'bf16' weights, not {precision!r}")
        vocab = self._vocab()
        packed = [_StepWeights.of(block, vocab) for block in self.blocks]
        if precision == "bf16" and not (
            vocab[0].device.type == "cpu" and onednn.linear_available() and onednn.bf16_supported()
        ):
            return
        packed = _StepWeights.each_matrix(packed, lambda weight, bias: _StepWeights.packed(weight, bias, precision))
        if precision == "int8":
            bf16_kv = onednn.amx_bf16() and onednn.bf16_supported() and onednn.linear_available()
            for attn in (block.cross_attn for block in self.blocks):  # the prefill (bf16 with AMX, as MIR)
                if isinstance(attn.kv, nn.Linear) and bf16_kv and onednn.bf16_worthwhile(attn.kv.weight):
                    attn.kv = onednn.OneDNNLinear(attn.kv.weight, attn.kv.bias, torch.bfloat16)
                elif isinstance(attn.kv, nn.Linear) and int8_worthwhile(attn.kv.weight):
                    attn.kv = int8_linear(attn.kv.weight, attn.kv.bias)
            if vocab[0].device.type == "cpu" and onednn.bf16_supported():
                self._cross_kv_dtype = torch.bfloat16
        self._packed_step = packed

    def compile_step(self, freeze: bool = True, **options) -> None:
        """``torch.compile(**options)`` of the eval-mode greedy step (``dynamic=True`` by default) of fp32 or bf16
        weights (an int8 copy's raises ``ValueError``); ``freeze``: the weights as constants of the compiled code,
        compiled again after they change (:mod:`namc.models.compiled_step`). Generations that compile are slow."""
        self._compiled_step = CompiledStep(self, freeze, options)

    def uncompile_step(self) -> None:
        """Undo :meth:`compile_step`: the eval step runs eagerly again."""
        self.__dict__.pop("_compiled_step", None)

    def _step_fn(self, fused: list[_StepWeights]) -> Callable[..., torch.Tensor]:
        compiled = self.__dict__.get("_compiled_step")
        return self._fused_step if compiled is None else compiled.for_generation(fused)

    @torch.inference_mode()
    def generate(
        self,
        memory: torch.Tensor,
        max_new_tokens: int = 23,
        num_beams: int = 1,
        memory_mask: torch.Tensor | None = None,
        length_penalty: float = 1.0,
        vocabulary: Shortlist | Iterable[int] | None = None,
    ) -> torch.Tensor:
        """Generate token ids for every memory row.

        Args:
            memory: (B, N, D) E_MIR.
            max_new_tokens: the most tokens generated after [BOS] (23 in the paper, appendix F), [EOS] included.
            num_beams: 1 for greedy; more for beam search.
            memory_mask: (B, N) bool, True where memory may be attended.
            length_penalty: beam hypotheses are ranked by ``sum log p / length ** length_penalty``.
            vocabulary: the only tokens to generate, [EOS] always among them (:mod:`namc.models.shortlist`; build
                a :class:`~namc.models.shortlist.Shortlist` once to reuse its prepared matrices); None: all.

        Returns:
            (B, T) generated ids without [BOS], ending with [EOS] where one was produced, padded with ``pad_id``.
        """
        shortlist = self._shortlist(vocabulary)
        if num_beams > 1:
            return self._beam_search(memory, max_new_tokens, num_beams, memory_mask, length_penalty, shortlist)
        B = memory.shape[0]
        caches, cross_kv, fused = self._start(memory, max_new_tokens, shortlist)
        step = self._step_fn(fused) if fused is not None else None
        out = torch.full((B, max_new_tokens), self.pad_id, dtype=torch.long, device=memory.device)
        rows = torch.arange(B, device=memory.device)  # original row of each row still in the batch
        finished = torch.zeros(B, dtype=torch.bool, device=memory.device)  # rows in the batch that produced [EOS]
        tokens = torch.full((B, 1), self.bos_id, dtype=torch.long, device=memory.device)
        for t in range(max_new_tokens):
            if step is not None:
                logits = step(tokens[:, 0], t, caches, cross_kv, memory_mask, fused)  # (b, V)
            else:
                logits = self._step(tokens, t, caches, cross_kv, memory_mask, shortlist=shortlist)  # (b, V)
            nxt = greedy_ids(logits, shortlist).masked_fill(finished, self.pad_id)  # (b,)
            out[rows, t] = nxt
            finished |= nxt == self.eos_id
            n_done = int(finished.sum())  # the step's one host synchronisation
            if n_done == finished.shape[0]:
                break
            # Drop finished rows once they are a quarter of the batch: every drop copies the caches and the
            # cross-attention keys/values (2 x 2 x N x D floats per row and layer) of the rows kept, so dropping in
            # groups amortises the copies; finished rows kept meanwhile only produce padding that is never read.
            if 4 * n_done >= finished.shape[0]:
                keep = (~finished).nonzero().squeeze(1)
                rows, nxt, finished = rows[keep], nxt[keep], finished[keep]
                for cache in caches:
                    cache.select(keep)
                cross_kv = [(k.index_select(0, keep), v.index_select(0, keep)) for k, v in cross_kv]
                if memory_mask is not None:
                    memory_mask = memory_mask.index_select(0, keep)
            tokens = nxt[:, None]
        return out[:, : ops.used_length(out, self.pad_id)]

    def _beam_search(
        self,
        memory: torch.Tensor,
        max_new_tokens: int,
        num_beams: int,
        memory_mask: torch.Tensor | None,
        length_penalty: float,
        shortlist: Shortlist | None = None,
    ) -> torch.Tensor:
        B, K = memory.shape[0], num_beams
        device = memory.device
        memory = memory.repeat_interleave(K, dim=0)  # (B*K, N, D)
        if memory_mask is not None:
            memory_mask = memory_mask.repeat_interleave(K, dim=0)
        caches, cross_kv, fused = self._start(memory, max_new_tokens, shortlist)
        seqs = torch.full((B * K, max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        scores = torch.zeros(B, K, device=device)
        scores[:, 1:] = float("-inf")  # all beams start identical: keep only one alive at first
        finished = torch.zeros(B * K, dtype=torch.bool, device=device)
        lengths = torch.zeros(B * K, device=device)
        tokens = torch.full((B * K, 1), self.bos_id, dtype=torch.long, device=device)
        for t in range(max_new_tokens):
            logits = self._step(tokens, t, caches, cross_kv, memory_mask, fused, shortlist)  # (BK, V or S)
            logp = F.log_softmax(logits.float(), dim=-1)  # (BK, V or S)
            V = logp.shape[-1]
            # a finished beam can only extend itself by padding (column 0, made padding below), at no cost
            logp[finished] = float("-inf")
            logp[finished, 0] = 0.0
            total = (scores.view(-1, 1) + logp).view(B, K * V)  # (B, K*V)
            top, idx = total.topk(K, dim=1)  # (B, K)
            origin = (idx // V + torch.arange(B, device=device)[:, None] * K).view(-1)  # (B*K,) parent rows
            nxt = (idx % V).view(-1)
            nxt = nxt if shortlist is None else shortlist.to_vocabulary(nxt)
            was_finished = finished[origin]
            nxt = nxt.masked_fill(was_finished, self.pad_id)
            seqs = seqs[origin]
            seqs[:, t] = nxt
            lengths = lengths[origin] + (~was_finished).float()
            finished = was_finished | (nxt == self.eos_id)
            scores = top
            for cache in caches:
                cache.select(origin)
            if bool(finished.all()):
                break
            tokens = nxt[:, None]
        normed = scores.view(-1) / lengths.clamp_min(1.0) ** length_penalty
        best = normed.view(B, K).argmax(dim=1) + torch.arange(B, device=device) * K  # (B,)
        out = seqs[best]
        return out[:, : ops.used_length(out, self.pad_id)]
