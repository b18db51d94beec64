"""FDG: the fine-grained description generator, a 2-layer transformer decoder over E_MIR (section 3.2.3).

Dimension letters: B batch, K beams, T tokens, N memory positions (n_I), D width, V vocabulary, H heads.

Decoding encodes each pair once, caches the cross-attention keys/values of the memory and the self-attention
keys/values of the prefix (:class:`~namc.models.layers.KVCache`), projects only the last position onto the
vocabulary, and drops finished rows from the batch. Greedy with at most 23 new tokens is the paper's setting
(appendix F); beam search is ours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from namc.models.layers import Block, KVCache


class FDG(nn.Module):
    """Transformer decoder with cross-attention to the MIR output.

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

    def __init__(
        self,
        vocab_size: int,
        dim: int = 768,
        heads: int = 12,
        layers: int = 2,
        max_len: int = 160,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
        mlp_ratio: float = 4.0,
        dropout: float = 0.1,
        tie_embeddings: bool = True,
    ) -> None:
        super().__init__()
        self.pad_id, self.bos_id, self.eos_id, self.max_len = pad_id, bos_id, eos_id, max_len
        self.heads = heads
        self.tok = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.tok.weight, std=0.02)
        self.pos = nn.Parameter(torch.zeros(max_len, dim))
        nn.init.normal_(self.pos, std=0.02)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        # tied: the output projection reuses the input embedding (no parameter of its own, one tensor on disk)
        self.lm_head = None if tie_embeddings else nn.Linear(dim, vocab_size, bias=False)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Project (..., D) decoder states onto the (..., V) vocabulary."""
        x = self.ln_f(x)
        return F.linear(x, self.tok.weight) if self.lm_head is None else self.lm_head(x)

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
    ) -> torch.Tensor:
        """One incremental step: (B, 1) new tokens at ``position`` -> (B, V) logits of the next token."""
        x = self.tok(tokens) + self.pos[position : position + 1]  # (B, 1, D)
        for block, cache, kv in zip(self.blocks, caches, cross_kv):
            x = block.self_attend(x, cache=cache)
            x = block.cross_attend(x, key_mask=memory_mask, kv=kv)
            x = block.feed_forward(x)
        return self.logits(x[:, -1])  # (B, V)

    def _start(self, memory: torch.Tensor, max_new_tokens: int):
        if max_new_tokens + 1 > self.max_len:
            raise ValueError(f"max_new_tokens={max_new_tokens} needs {max_new_tokens + 1} positions > {self.max_len}")
        B, _, D = memory.shape
        caches = [
            KVCache(B, self.heads, max_new_tokens + 1, D // self.heads, memory.device, memory.dtype)
            for _ in self.blocks
        ]
        cross_kv = [block.context_kv(memory) for block in self.blocks]  # each 2 x (B, H, N, E)
        return caches, cross_kv

    @torch.inference_mode()
    def generate(
        self,
        memory: torch.Tensor,
        max_new_tokens: int = 23,
        num_beams: int = 1,
        memory_mask: torch.Tensor | None = None,
        length_penalty: float = 1.0,
    ) -> torch.Tensor:
        """Generate token ids for every memory row.

        Args:
            memory: (B, N, D) E_MIR.
            max_new_tokens: the most tokens generated after [BOS] (23 in the paper, appendix F), [EOS] included.
            num_beams: 1 for greedy; more for beam search.
            memory_mask: (B, N) bool, True where memory may be attended.
            length_penalty: beam hypotheses are ranked by ``sum log p / length ** length_penalty``.

        Returns:
            (B, T) generated ids without [BOS], ending with [EOS] where one was produced, padded with ``pad_id``.
        """
        if num_beams > 1:
            return self._beam_search(memory, max_new_tokens, num_beams, memory_mask, length_penalty)
        B = memory.shape[0]
        caches, cross_kv = self._start(memory, max_new_tokens)
        out = torch.full((B, max_new_tokens), self.pad_id, dtype=torch.long, device=memory.device)
        rows = torch.arange(B, device=memory.device)  # original row of each active row
        tokens = torch.full((B, 1), self.bos_id, dtype=torch.long, device=memory.device)
        for t in range(max_new_tokens):
            logits = self._step(tokens, t, caches, cross_kv, memory_mask)  # (b, V)
            nxt = logits.argmax(dim=-1)  # (b,)
            out[rows, t] = nxt
            done = nxt == self.eos_id
            if bool(done.all()):
                break
            if bool(done.any()):  # drop finished rows: the remaining steps run on fewer rows
                keep = (~done).nonzero().squeeze(1)
                rows, nxt = rows[keep], nxt[keep]
                for cache in caches:
                    cache.select(keep)
                cross_kv = [(k.index_select(0, keep), v.index_select(0, keep)) for k, v in cross_kv]
                if memory_mask is not None:
                    memory_mask = memory_mask.index_select(0, keep)
            tokens = nxt[:, None]
        return out[:, : _used_length(out, self.pad_id)]

    def _beam_search(
        self,
        memory: torch.Tensor,
        max_new_tokens: int,
        num_beams: int,
        memory_mask: torch.Tensor | None,
        length_penalty: float,
    ) -> torch.Tensor:
        B, K = memory.shape[0], num_beams
        device = memory.device
        memory = memory.repeat_interleave(K, dim=0)  # (B*K, N, D)
        if memory_mask is not None:
            memory_mask = memory_mask.repeat_interleave(K, dim=0)
        caches, cross_kv = self._start(memory, max_new_tokens)
        seqs = torch.full((B * K, max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        scores = torch.zeros(B, K, device=device)
        scores[:, 1:] = float("-inf")  # all beams start identical: keep only one alive at first
        finished = torch.zeros(B * K, dtype=torch.bool, device=device)
        lengths = torch.zeros(B * K, device=device)
        tokens = torch.full((B * K, 1), self.bos_id, dtype=torch.long, device=device)
        for t in range(max_new_tokens):
            logp = F.log_softmax(self._step(tokens, t, caches, cross_kv, memory_mask).float(), dim=-1)  # (BK, V)
            V = logp.shape[-1]
            # a finished beam can only extend itself by padding, at no cost
            logp[finished] = float("-inf")
            logp[finished, self.pad_id] = 0.0
            total = (scores.view(-1, 1) + logp).view(B, K * V)  # (B, K*V)
            top, idx = total.topk(K, dim=1)  # (B, K)
            origin = (idx // V + torch.arange(B, device=device)[:, None] * K).view(-1)  # (B*K,) parent rows
            nxt = (idx % V).view(-1)
            seqs = seqs[origin]
            seqs[:, t] = nxt
            was_finished = finished[origin]
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
        return out[:, : _used_length(out, self.pad_id)]


def _used_length(ids: torch.Tensor, pad_id: int) -> int:
    """Columns up to the last non-padding token in any row (at least 1)."""
    used = (ids != pad_id).any(dim=0).nonzero()
    return int(used.max()) + 1 if used.numel() else 1
