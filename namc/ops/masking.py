"""Noise masking (paper section 3.2.1): mask probabilities from irrelevance, and reproducible sampling.

Dimension letters: B batch, K positions (image patches or text tokens).
"""

from __future__ import annotations

import torch


def mask_probabilities(irrelevance: torch.Tensor, p: float, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Noise-masking probabilities ``P = p + IR - mean(IR)``, section 3.2.1.

    The mean is taken per sample over valid entries only, so padding does not shift it. Positions that are not
    valid get probability 0 (padding, [SOS] and [EOS] are never masked). The result is clamped to [0, 1] so it is
    a probability (the paper leaves this implicit).

    Args:
        irrelevance: (B, K) ``IR = 1 - R``.
        p: the masking ratio (paper defaults: ``p_I = 0.2``, ``p_T = 0.15``, section 4.2.1).
        valid: (B, K) bool, positions that may be masked; all positions when None.

    Returns:
        (B, K) probabilities in [0, 1].
    """
    if valid is None:
        valid = torch.ones_like(irrelevance, dtype=torch.bool)
    w = valid.to(irrelevance.dtype)
    count = w.sum(dim=1, keepdim=True).clamp_min(1.0)  # (B, 1)
    mean = (irrelevance * w).sum(dim=1, keepdim=True) / count  # (B, 1)
    probs = (p + irrelevance - mean).clamp(0.0, 1.0)
    return probs * w


def random_mask_probabilities(valid: torch.Tensor, p: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random-masking ablation (Fig. 3): every valid position has probability ``p``.

    Args:
        valid: (B, K) bool.
        p: the masking ratio.
        dtype: dtype of the result.

    Returns:
        (B, K) probabilities: ``p`` where valid, else 0.
    """
    return valid.to(dtype) * p


def sample_mask(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw a binary mask ``M ~ Bernoulli(P)``; True (1) means masked.

    Args:
        probs: (B, K) probabilities in [0, 1].
        generator: a seeded ``torch.Generator`` on ``probs.device`` for reproducible masks.

    Returns:
        (B, K) bool mask.
    """
    u = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=torch.float32)
    return u < probs.float()
