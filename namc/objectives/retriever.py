"""ADPO's adversarial hard-negative retriever q_phi(T' | X1, X2) (seed paper 003, section 4.2-4.4).

Dimension letters: B pairs, N grid positions, D E_MIR width, K candidates per pair, T caption tokens, E the
retriever's width.

The paper describes a "similarity-based retriever" whose logits over a random candidate set of size |N| (16 to
256; 128 best) are sharpened by a temperature tau (about 2) before sampling (Figure 4). Our reading, for a
captioner without a text encoder of its own at inference: a small scorer

    s(X, T') = <W_p mean_N(E_MIR(X1, X2)), W_t mean_tokens(Emb(T'))> / sqrt(E),   q_phi = softmax_K(s / tau)

over the pair's E_MIR (given without gradient: the retriever never trains the captioner) and a bag-of-words
embedding of each candidate, whose word table starts as a copy of the captioner's FDG word embeddings. Candidates
that are positives of the pair (``valid`` False) get probability 0 and are never drawn (the paper filters
annotated positives out of the pool, section 5). Sampling takes an explicit ``torch.Generator``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["NegativeRetriever"]


class NegativeRetriever(nn.Module):
    """q_phi: scores K candidate captions for each pair and samples one at temperature ``tau``.

    Args:
        vocab_size: caption vocabulary size.
        memory_dim: D, the width of E_MIR.
        dim: E, the width of the scorer (default D).
        pad_id: the padding id (and [BOS] / [EOS] are ordinary tokens of the bag).
        tau: the temperature (ADPO: about 2).
    """

    def __init__(self, vocab_size: int, memory_dim: int, dim: int | None = None, pad_id: int = 0, tau: float = 2.0):
        super().__init__()
        if tau <= 0:
            raise ValueError("the retriever's temperature tau must be positive")
        dim = dim or memory_dim
        self.tau = float(tau)
        self.pad_id = pad_id
        self.word = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        self.text_proj = nn.Linear(dim, dim)
        self.pair_norm = nn.LayerNorm(memory_dim)
        self.pair_proj = nn.Linear(memory_dim, dim)
        self.dim = dim

    @torch.no_grad()
    def init_words(self, weight: torch.Tensor) -> None:
        """Start the word table from (V, E) embeddings (the captioner's FDG word embeddings)."""
        if weight.shape != self.word.weight.shape:
            raise ValueError(
                f"word embeddings of shape {tuple(weight.shape)} for a table of {tuple(self.word.weight.shape)}"
            )
        self.word.weight.copy_(weight)
        self.word.weight[self.pad_id].zero_()

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """(..., T) caption ids -> (..., E) mean of the embeddings of the non-padding tokens, projected."""
        keep = (ids != self.pad_id).unsqueeze(-1).float()  # (..., T, 1)
        bag = (self.word(ids) * keep).sum(-2) / keep.sum(-2).clamp_min(1)  # (..., E)
        return self.text_proj(bag)

    def logits(self, memory: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Tempered scores s / tau of every candidate; -inf where ``valid`` is False.

        Args:
            memory: (B, N, D) E_MIR of the pairs (detached here).
            candidates: (B, K, T) candidate ids.
            valid: (B, K) bool, False for positives of the pair and for padding slots.

        Returns:
            (B, K) logits of q_phi.
        """
        if not bool(valid.any(dim=1).all()):
            raise ValueError("a pair has no valid negative candidate (every candidate is one of its positives)")
        pair = self.pair_proj(self.pair_norm(memory.detach().mean(dim=1)))  # (B, E)
        text = self.embed_text(candidates)  # (B, K, E)
        scores = torch.einsum("be,bke->bk", pair, text) / math.sqrt(self.dim)  # (B, K)
        return (scores / self.tau).masked_fill(~valid, float("-inf"))

    @staticmethod
    def sample(
        logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draw one candidate per pair from softmax(logits).

        Args:
            logits: (B, K) from :meth:`logits` (-inf = never drawn).
            generator: a CPU generator (the draw happens on the CPU so it is the same on every device).

        Returns:
            ``(index, log_q, entropy)``: (B,) drawn slots, their log-probability (with gradient) and the entropy of
            each pair's distribution (nats).
        """
        log_p = torch.log_softmax(logits, dim=-1)  # (B, K)
        probs = log_p.detach().exp().float().cpu()
        index = torch.multinomial(probs, 1, generator=generator)[:, 0].to(logits.device)  # (B,)
        log_q = log_p.gather(1, index[:, None])[:, 0]
        p = log_p.exp()
        entropy = -(p * log_p.masked_fill(p == 0, 0.0)).sum(dim=-1)
        return index, log_q, entropy.detach()
