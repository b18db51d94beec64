"""Losses of NAMC (section 3.3, appendix E) and the ablation alternatives of Table 7.

Dimension letters: B local batch, G gathered batch (all ranks), D embedding width, N positions, V classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from namc.ops.relevance import relevance_from_similarity


def _kl_to_targets(logits: torch.Tensor, targets: torch.Tensor, eps: float) -> torch.Tensor:
    """Mean over rows of ``KL(softmax(logits) || targets)``."""
    p = logits.softmax(dim=1)
    kl = p * (logits.log_softmax(dim=1) - torch.log(targets + eps))
    return kl.sum(dim=1).mean()


def sdm_loss(
    img_emb: torch.Tensor, txt_emb: torch.Tensor, positives: torch.Tensor, tau: float = 0.02, eps: float = 1e-8
) -> torch.Tensor:
    """Similarity-distribution matching loss of Jiang & Ye (CVPR 2023), appendix E.1, Eqs. 13-15, one subset.

    ``p_i = softmax_j(cos(e_I_i, e_T_j) / tau)``, ``q_i = y_i / |y_i|``, ``L = KL(p || q)`` image-to-text plus the
    symmetric text-to-image term. Identical texts in a batch are positives (``positives`` says so). The paper does not
    give ``tau``; 0.02 is the value of Jiang & Ye's released code (logit scale 50).

    Args:
        img_emb: (B, D) image [CLS] embeddings.
        txt_emb: (B, D) text [EOS] embeddings (row i is the text paired with image i).
        positives: (B, B) bool ``y``; ``y[i, j]`` when image i is paired with text j. The diagonal must be True.
        tau: temperature.
        eps: added inside the log of the target distribution, where it is 0.

    Returns:
        scalar ``L_i2t + L_t2i`` (Eq. 15).
    """
    logits = F.normalize(img_emb, dim=-1) @ F.normalize(txt_emb, dim=-1).T / tau  # (B, B)
    y = positives.to(logits.dtype)
    q_i2t = y / y.sum(dim=1, keepdim=True)
    q_t2i = y.T / y.T.sum(dim=1, keepdim=True)
    return _kl_to_targets(logits, q_i2t, eps) + _kl_to_targets(logits.T, q_t2i, eps)


def info_nce_loss(img_emb: torch.Tensor, txt_emb: torch.Tensor, tau: float = 0.02) -> torch.Tensor:
    """Symmetric InfoNCE (CLIP) loss, the NIM ablation of Table 7.

    Args:
        img_emb: (B, D) image embeddings.
        txt_emb: (B, D) text embeddings; row i is the positive of image i. Only the diagonal is positive:
            duplicate texts count as negatives, which is the difference from :func:`sdm_loss`.
        tau: temperature.

    Returns:
        scalar ``(CE_i2t + CE_t2i) / 2``.
    """
    logits = F.normalize(img_emb, dim=-1) @ F.normalize(txt_emb, dim=-1).T / tau  # (B, B)
    target = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def masked_token_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """MIR discrete reconstruction loss, Eq. 18, over masked positions only (appendix E.2).

    The head runs only on masked positions (BEiT), so the caller passes the gathered rows.

    Args:
        logits: (M, V) predictions for the M masked positions of the batch.
        targets: (M,) ground-truth VQGAN codes.

    Returns:
        scalar mean cross-entropy; 0 (with a graph) when nothing is masked.
    """
    if targets.numel() == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits.float(), targets)


def masked_regression_loss(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, kind: str) -> torch.Tensor:
    """L1 / L2 regression onto the raw grid features at masked positions, the MIR ablation of Table 7.

    Args:
        pred: (B, N, C) reconstructed features.
        target: (B, N, C) raw features ``X``.
        mask: (B, N) bool, True where masked.
        kind: ``"l1"`` or ``"l2"``.

    Returns:
        scalar mean over masked elements; 0 (with a graph) when nothing is masked.
    """
    if kind not in ("l1", "l2"):
        raise ValueError(f"kind must be 'l1' or 'l2', got {kind!r}")
    if not mask.any():
        return pred.sum() * 0.0
    p, t = pred[mask].float(), target[mask].float()  # (M, C)
    return F.l1_loss(p, t) if kind == "l1" else F.mse_loss(p, t)


def caption_ce(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """FDG next-token cross-entropy (section 3.3) over positions whose target is not ``ignore_index``.

    Args:
        logits: (B, T, V) next-token logits.
        targets: (B, T) target ids; padding and excluded positions hold ``ignore_index``.
        ignore_index: the id to skip.

    Returns:
        scalar mean over counted positions; 0 (with a graph) when none counts.
    """
    if not (targets != ignore_index).any():
        return logits.sum() * 0.0
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=ignore_index)


def ngram_presence(ids: torch.Tensor, valid: torch.Tensor, n: int) -> torch.Tensor:
    """Whether each word of each description also occurs, with the same ``n - 1`` tokens before it, in another.

    Args:
        ids: (B, L) token ids (a [SOS] at position 0 is context for the first word).
        valid: (B, L) bool, True for real words.
        n: n-gram length (1: the word alone; 2: the word and the token before it).

    Returns:
        (Bi, Bj, L) bool: ``[i, j, l]`` is True where word ``l`` of description ``j`` ends an n-gram that also ends
        at a real word of description ``i`` (always True for ``i == j`` at real words).
    """
    if n < 1:
        raise ValueError(f"n-gram length must be at least 1, got {n}")
    # same[i, j, l, m]: position l of j and position m of i hold the same n-gram, m a real word of i
    same = (ids[None, :, :, None] == ids[:, None, None, :]) & valid[:, None, None, :]  # (Bi, Bj, L, L)
    for k in range(1, n):
        before = F.pad(ids, (k, 0), value=-1)[:, :-k]  # (B, L): the token k positions earlier (-1 before the start)
        same &= before[None, :, :, None] == before[:, None, None, :]
    return same.any(dim=-1) & valid[None]


def token_sigmoid_loss(
    h_img: torch.Tensor,
    h_txt: torch.Tensor,
    txt_valid: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
    ids: torch.Tensor | None = None,
    ngram: int | None = None,
) -> torch.Tensor:
    """Token-level sigmoid alignment of patches and words across a batch (not in the paper; see below).

    For every image ``i`` and description ``j`` of the batch (description ``i`` is image ``i``'s), each word of
    ``j`` is scored by its Eq. 1 relevance to image ``i`` (the best cosine over ``i``'s patches), and each patch of
    ``i`` by its best cosine over ``j``'s words. Every score is a binary logit ``scale * cos + bias``, as in SigLIP
    (Zhai et al., 2023) but per token. The labels:

    - patches: whether ``i`` and ``j`` are a pair;
    - words, with ``ngram=None``: whether ``i`` and ``j`` are a pair. A word that names something in its image learns a
      high relevance there; a word whose content is in no particular image is pushed to the base rate. So are words
      that are true of most images ("a", "small"), which then look as irrelevant as noise;
    - words, with ``ngram=n``: whether image ``i``'s description uses the same n-gram (the word and the ``ngram - 1``
      tokens before it, :func:`ngram_presence`). The score then estimates whether a description of image ``i``
      would say this word here: words true of most images ("a small") score high everywhere, words tied to
      what an image shows ("a red") score high where it shows it, and words that descriptions use at random
      (hallucinations, whose n-grams recur only by chance) score low. The context makes the same word in a
      hallucinated phrase ("near a") and in a real one ("of a") two targets, which a causal text tower can tell
      apart. The own pair is always a positive, noise included: the labels are as noisy as the corpus.

    Eq. 1 relies on the word-patch alignment of a pre-trained CLIP; this term gives it to a randomly initialised
    NIM (the CPU demo).

    Args:
        h_img: (B, N, D) patch embeddings.
        h_txt: (B, L, D) token embeddings.
        txt_valid: (B, L) bool, True for real words.
        scale: () positive logit scale.
        bias: () logit bias.
        ids: (B, L) token ids of the descriptions; needed for n-gram labels.
        ngram: n-gram length of the word labels, or None for pair labels.

    Returns:
        The mean over both directions of the per-token binary cross-entropy. Positives and negatives are not
        re-balanced: the base rate is what pushes words that match nothing in particular to low scores.
    """
    s = torch.einsum("ind,jld->ijnl", F.normalize(h_img, dim=-1), F.normalize(h_txt, dim=-1))  # (Bi, Bj, N, L)
    patch_scores, word_scores = relevance_from_similarity(s, txt_valid[None])  # (Bi, Bj, N), (Bi, Bj, L)
    B = h_img.shape[0]
    pairs = torch.eye(B, dtype=s.dtype, device=s.device)[:, :, None]  # (Bi, Bj, 1): 1 for the pairs
    if ngram is None:
        word_target = pairs  # (Bi, Bj, 1)
    elif ids is None:
        raise ValueError("n-gram word labels need the token ids (ids=)")
    else:
        word_target = ngram_presence(ids, txt_valid, ngram).to(s.dtype)  # (Bi, Bj, L)

    def bce(scores: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        logits = scale * scores + bias
        loss = F.binary_cross_entropy_with_logits(logits, target.expand_as(scores), reduction="none")
        return (loss * weight).sum() / weight.sum().clamp_min(1)

    word_w = txt_valid[None].to(s.dtype).expand_as(word_scores)  # (Bi, Bj, L)
    patch_w = txt_valid.any(dim=1)[None, :, None].to(s.dtype).expand_as(patch_scores)  # (Bi, Bj, N): texts with words
    return (bce(word_scores, word_target, word_w) + bce(patch_scores, pairs, patch_w)) / 2
