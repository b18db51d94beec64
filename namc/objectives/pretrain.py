"""Pre-training objective over a :class:`~namc.models.namc.NAMC`: ``L = L_NIM + L_MIR + L_FDG`` (Eq. 2).

Dimension letters: B pairs, N grid positions (n_I), C grid channels, D width, E NIM embedding width, L description
tokens, T caption tokens.

Each term is its own function over the model and the (2B, ...) stack of both images / both descriptions, so an
ablation or a new objective can reuse or replace one term; :func:`pretrain_step` composes them in the paper's order:
NIM masks (section 3.2.1) -> L_NIM on the denoised inputs (appendix E.1) -> L_MIR on the masked grid (Eq. 18) ->
E_MIR by co-attention -> L_FDG on the denoised implicit-change description (section 3.2.3).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from namc import ops
from namc.models.namc import NAMC
from namc.objectives.caption import caption_loss

__all__ = ["contrastive_term", "fdg_term", "mir_term", "nim_term", "pretrain_step", "token_alignment_term"]

Gather = Callable[[torch.Tensor], torch.Tensor]


def token_alignment_term(
    model: NAMC, images: torch.Tensor, text: torch.Tensor, words: torch.Tensor
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Token-level alignment on the unmasked inputs (``nim_token_loss``; not in the paper) and Eq. 1's relevance.

    Args:
        images: (2B, 3, H, W) first images then second images.
        text: (2B, L) their descriptions.
        words: (2B, L) bool, the word tokens.

    Returns:
        the weighted loss and ``(r_img, r_txt)`` (no gradient), which noise masking reuses.
    """
    c, nim = model.config, model.nim
    assert nim is not None and nim.token_logit is not None
    B = images.shape[0] // 2
    _, h_img = nim.encode_image(images)  # (2B, N, E)
    _, h_txt = nim.encode_text(text, model.tokenizer.eos_id)  # (2B, L, E)
    scale, bias = nim.token_logit[0].exp(), nim.token_logit[1]
    loss = images.new_zeros(())
    for half in (slice(None, B), slice(B, None)):  # a pair's two images look alike: pair them per half
        loss = loss + ops.token_sigmoid_loss(
            h_img[half], h_txt[half], words[half], scale, bias, text[half], c.nim_token_ngram
        )
    with torch.no_grad():
        relevance = ops.token_relevance(h_img, h_txt, words)
    return c.nim_token_loss * loss, relevance


def contrastive_term(
    model: NAMC, img: torch.Tensor, txt: torch.Tensor, ids: torch.Tensor, gather: Gather | None
) -> torch.Tensor:
    """SDM (or InfoNCE, Table 7) between (B, E) image and text embeddings of one subset; identical texts in the
    (gathered) batch are positives too."""
    if gather is not None:
        img, txt, ids = gather(img), gather(txt), gather(ids.float())
    same = (ids[:, None, :] == ids[None, :, :]).all(dim=-1)  # (G, G) identical texts are positives
    if model.config.nim_loss == "sdm":
        return ops.sdm_loss(img, txt, same, model.config.tau)
    return ops.info_nce_loss(img, txt, model.config.tau)


def nim_term(
    model: NAMC,
    images: torch.Tensor,
    text: torch.Tensor,
    text_in: torch.Tensor,
    img_mask: torch.Tensor,
    gather: Gather | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """L_NIM: align denoised images with denoised descriptions, per subset (section 3.3, appendix E.1).

    Args:
        images: (2B, 3, H, W); text: (2B, L) raw description ids (they decide which texts are identical);
        text_in: (2B, L) the description the text tower reads (denoised or raw, Table 8);
        img_mask: (2B, N) NIM's image mask.

    Returns:
        the loss (0 when ``use_nim`` is off) and (2B, L, E) text token embeddings, which MIR's reconstruction reads.
    """
    c, nim = model.config, model.nim
    B = images.shape[0] // 2
    txt_eos, txt_tok = nim.encode_text(text_in, model.tokenizer.eos_id)  # (2B, E), (2B, L, E)
    loss = images.new_zeros(())
    if c.use_nim:
        img_cls, _ = nim.encode_image(images, img_mask if c.denoised_image else None)
        loss = loss + contrastive_term(model, img_cls[:B], txt_eos[:B], text[:B], gather)
        loss = loss + contrastive_term(model, img_cls[B:], txt_eos[B:], text[B:], gather)
    return loss, txt_tok


def mir_term(
    model: NAMC,
    x: torch.Tensor,
    grid: torch.Tensor,
    images: torch.Tensor,
    img_mask: torch.Tensor,
    txt_tok: torch.Tensor,
    real: torch.Tensor,
    codes: torch.Tensor | None,
) -> torch.Tensor:
    """L_MIR: reconstruct the masked grid positions (Eq. 18, masked positions only) as VQGAN codes, or regress the
    grid features (L1 / L2, Table 7).

    Args:
        x: (2B, N, D) masked image embedding; grid: (2B, N, C) raw grid features; images: (2B, 3, H, W), tokenized
        by the frozen VQGAN when ``codes`` (2B, N) are not precomputed; img_mask: (2B, N); txt_tok: (2B, L, E) NIM's
        text tokens; real: (2B, L) bool, the tokens up to [EOS].
    """
    y = model.mir.reconstruct(x, txt_tok, real)  # (2B, N, D)
    if model.config.rec_loss == "discrete":
        if codes is None:
            codes = model.vqgan(images)  # (2B, N), frozen
        return ops.masked_token_ce(model.mir.head(y[img_mask]), codes[img_mask])
    # the target X is a fixed feature: a grid encoder that trains (grid_trainable) must not move it towards the
    # prediction, which would lower the loss without any reconstruction
    return ops.masked_regression_loss(model.mir.head(y), grid.detach(), img_mask, model.config.rec_loss)


def fdg_term(model: NAMC, batch: dict[str, Any], memory: torch.Tensor, txt_mask: torch.Tensor) -> torch.Tensor:
    """L_FDG: teacher forcing on the denoised implicit-change description (section 3.2.3).

    A caption word copied from a [MASK]ed description word is [MASK]ed too and, with ``ignore_masked_targets``
    (our reading), is not a target.
    """
    c = model.config
    B = memory.shape[0]
    caption = batch["caption"]  # (B, T)
    masked_pos = torch.zeros_like(caption, dtype=torch.bool)
    if c.denoised_text:
        for src, m in ((batch["caption_src1"], txt_mask[:B]), (batch["caption_src2"], txt_mask[B:])):
            hit = m.gather(1, src.clamp_min(0)) & (src >= 0)  # (B, T)
            masked_pos |= hit
        caption = caption.masked_fill(masked_pos, model.tokenizer.mask_id)
    return caption_loss(model, caption, memory, ignore=masked_pos if c.ignore_masked_targets else None)


def _stacked(batch: dict[str, Any], key: str) -> torch.Tensor | None:
    first = batch.get(f"{key}1")
    return None if first is None else torch.cat([first, batch[f"{key}2"]])


def pretrain_step(
    model: NAMC, batch: dict[str, Any], generator: torch.Generator | None = None, gather: Gather | None = None
) -> dict[str, torch.Tensor]:
    """One pre-training forward pass, ``L = L_NIM + L_MIR + L_FDG`` (Eq. 2).

    Args:
        model: a NAMC built with ``pretraining=True``.
        batch: ``image1``, ``image2`` (B, 3, H, W) in [0, 1]; ``desc1``, ``desc2`` (B, L) ids of the two
            "[object description]" halves with [SOS]/[EOS]; ``caption`` (B, T) ids of the whole implicit-change
            description; ``caption_src1``, ``caption_src2`` (B, T) index into ``desc1``/``desc2`` of the token
            copied at each caption position, -1 elsewhere; optional ``codes1``, ``codes2`` (B, N) precomputed
            VQGAN codes and ``grid1``, ``grid2`` (B, N, C) pre-extracted grid features.
            :class:`namc.data.collate.PretrainCollator` builds it.
        generator: seeds the mask sampling.
        gather: all-gathers a (B, ...) tensor across ranks with gradient (DDP); None on one process.

    Returns:
        ``loss``, ``nim``, ``mir``, ``fdg`` (scalars) and ``img_mask_frac``, ``txt_mask_frac`` (detached).
    """
    if model.nim is None or model.vqgan is None:
        raise RuntimeError("pretrain_step needs a model built with pretraining=True")
    c = model.config
    B = batch["image1"].shape[0]
    images = _stacked(batch, "image")  # (2B, 3, H, W)
    text = _stacked(batch, "desc")  # (2B, L)
    words, real = model.text_masks(text)
    loss_tok, relevance = images.new_zeros(()), None
    if c.use_nim and c.nim_token_loss > 0:
        loss_tok, relevance = token_alignment_term(model, images, text, words)
    img_mask, txt_mask = model.noise_masks(images, text, generator, relevance)  # (2B, N), (2B, L)
    text_msk = text.masked_fill(txt_mask, model.tokenizer.mask_id)

    loss_nim, txt_tok = nim_term(model, images, text, text_msk if c.denoised_text else text, img_mask, gather)
    loss_nim = loss_tok + loss_nim

    grid = _stacked(batch, "grid")  # (2B, N, C) pre-extracted, or
    if grid is None:
        grid = model.grid(images)  # (2B, N, C), frozen
    x = model.mir.embed(grid, img_mask)  # (2B, N, D)
    loss_mir = images.new_zeros(())
    if c.use_mir:
        loss_mir = mir_term(model, x, grid, images, img_mask, txt_tok, real, _stacked(batch, "codes"))
    memory = model.mir.interact(x[:B], x[B:], img_mask[:B], img_mask[B:])  # (B, N, D)

    loss_fdg = fdg_term(model, batch, memory, txt_mask)
    return {
        "loss": loss_nim + loss_mir + loss_fdg,
        "nim": loss_nim.detach(),
        "mir": loss_mir.detach(),
        "fdg": loss_fdg.detach(),
        "img_mask_frac": img_mask.float().mean(),
        "txt_mask_frac": (txt_mask.sum() / words.sum().clamp_min(1)).float(),
    }
