"""FDG: the fine-grained description generator, a 2-layer transformer decoder over E_MIR (section 3.2.3).

Dimension letters: B batch, K beams, T tokens, N memory positions (n_I), D width, V vocabulary, H heads.

Decoding encodes each pair once, caches the cross-attention keys/values of the memory and the self-attention
keys/values of the prefix (:class:`~namc.models.layers.KVCache`), projects only the last position onto the
vocabulary (or onto a shortlist's rows, :mod:`namc.models.shortlist`), and drops finished rows from the batch.
Greedy with at most 23 new tokens is the paper's setting (appendix F); beam search is ours. The naive decoder the
throughput harness compares against (no cache, every prefix position re-run and projected at every step) lives with
the harness, in :mod:`namc.eval.throughput`.

Both searches take their step from :meth:`FDG.decoding`: here the blocks' modules, one position at a time. A
faster step (fused matrices, int8, CUDA graphs) is a runtime's business (:mod:`namc.backends`), which overrides
:meth:`FDG.decoding` and :meth:`FDG.pick` in a subclass. Finished rows are dropped once they are a quarter of the
batch (not at every [EOS]), which amortises the copies of the caches that each drop makes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from namc import ops
from namc.models.layers import Block, KVCache
from namc.models.shortlist import Shortlist

#: One decoding step: ``(tokens (b,), position, caches, cross_kv, memory_mask) -> (b, V)`` next-token logits, or
#: (b, S) over a shortlist.
Step = Callable[..., torch.Tensor]


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
        self.ln_f = nn.LayerNorm(c.dim)
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
        shortlist: Shortlist | None = None,
    ) -> torch.Tensor:
        """One incremental step: (b,) new tokens at ``position`` -> (b, V) logits of the next token; (b, S) over a
        ``shortlist``."""
        x = self.tok(tokens[:, None]) + self.pos[position : position + 1]  # (b, 1, D)
        for block, cache, kv in zip(self.blocks, caches, cross_kv):
            x = block.self_attend(x, cache=cache)
            x = block.cross_attend(x, key_mask=memory_mask, kv=kv)
            x = block.feed_forward(x)
        logits = self.logits(x[:, -1])  # (b, V)
        return logits if shortlist is None else shortlist.columns(logits)

    def decoding(
        self, memory: torch.Tensor, max_new_tokens: int, shortlist: Shortlist | None = None
    ) -> tuple[list[KVCache], list[tuple[torch.Tensor, torch.Tensor]], Step]:
        """What one generation over (B, N, D) ``memory`` decodes with: each layer's self-attention cache, its
        cross-attention keys and values (2 x (B, H, N, E)), and the step."""
        if max_new_tokens + 1 > self.max_len:
            raise ValueError(f"max_new_tokens={max_new_tokens} needs {max_new_tokens + 1} positions > {self.max_len}")
        B, _, D = memory.shape
        caches = [
            KVCache(B, self.heads, max_new_tokens + 1, D // self.heads, memory.device, memory.dtype)
            for _ in self.blocks
        ]

        def step(tokens, position, caches, cross_kv, memory_mask):
            return self._step(tokens, position, caches, cross_kv, memory_mask, shortlist)

        return caches, self.cross_kv(memory), step

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The greedy pick of (b, V) logits: the first index of each row's largest value (a NaN counting as the
        largest), ``argmax``'s rule."""
        return logits.max(dim=-1).indices

    def cross_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's cross-attention keys and values of (B, N, D) ``memory``, 2 x (B, H, N, E), contiguous: once
        per generation."""
        return [tuple(t.contiguous() for t in block.context_kv(memory)) for block in self.blocks]

    def _shortlist(self, vocabulary: Shortlist | Iterable[int] | None) -> Shortlist | None:
        if vocabulary is None:
            return None
        if isinstance(vocabulary, Shortlist):
            return vocabulary.fits(self.tok.weight.shape[0])
        return Shortlist(vocabulary, self.tok.weight.shape[0], self.eos_id)

    def _vocab(self) -> tuple[torch.Tensor, None]:
        return (self.tok.weight if self.lm_head is None else self.lm_head.weight, None)

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
        caches, cross_kv, step = self.decoding(memory, max_new_tokens, shortlist)
        out = torch.full((B, max_new_tokens), self.pad_id, dtype=torch.long, device=memory.device)
        rows = torch.arange(B, device=memory.device)  # original row of each row still in the batch
        finished = torch.zeros(B, dtype=torch.bool, device=memory.device)  # rows in the batch that produced [EOS]
        tokens = torch.full((B,), self.bos_id, dtype=torch.long, device=memory.device)
        for t in range(max_new_tokens):
            logits = step(tokens, t, caches, cross_kv, memory_mask)  # (b, V or S)
            nxt = self.pick(logits)
            nxt = (nxt if shortlist is None else shortlist.to_vocabulary(nxt)).masked_fill(finished, self.pad_id)
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
            tokens = nxt
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
        caches, cross_kv, step = self.decoding(memory, max_new_tokens, shortlist)
        seqs = torch.full((B * K, max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        scores = torch.zeros(B, K, device=device)
        scores[:, 1:] = float("-inf")  # all beams start identical: keep only one alive at first
        finished = torch.zeros(B * K, dtype=torch.bool, device=device)
        lengths = torch.zeros(B * K, device=device)
        tokens = torch.full((B * K,), self.bos_id, dtype=torch.long, device=device)
        for t in range(max_new_tokens):
            logits = step(tokens, t, caches, cross_kv, memory_mask)  # (BK, V or S)
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
            tokens = nxt
        normed = scores.view(-1) / lengths.clamp_min(1.0) ** length_penalty
        best = normed.view(B, K).argmax(dim=1) + torch.arange(B, device=device) * K  # (B,)
        out = seqs[best]
        return out[:, : ops.used_length(out, self.pad_id)]
