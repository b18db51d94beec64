"""Prompt-to-Prompt (Hertz et al. 2022, arXiv:2208.01626) as a diffusers attention processor: Img-Diff's pairs.

Img-Diff (``002``) renders a caption and its object-replaced twin with SDXL and Prompt-to-Prompt, so that the two
images share layout, style and background and differ in the replaced object. The two prompts of a pair are denoised
as one batch from the same initial latent; inside every attention layer of the UNet the target's attention maps are
overwritten with the source's during the first steps:

- cross-attention (pixels -> tokens), for the first ``cross_replace_steps`` fraction of the steps: the target's map
  over its tokens becomes ``M_src @ W`` (``W``: :func:`token_mapper`), so the new word attends where the old word
  did (the paper's word swap, section 3.2: ``Edit(M_t, M*_t, t)`` is the source's ``M_t`` while ``t >= tau``, the
  target's own ``M*_t`` after);
- self-attention (pixels -> pixels), for the first ``self_replace_steps`` fraction: the target's map is the source's
  (Prompt-to-Prompt's released code does this to keep the geometry), only in layers with at most
  ``self_replace_max_tokens`` query positions: the coarse layers hold the layout, and replacing the fine ones too
  copies texture and leaves no room for the new object.

Choices where the papers leave one open (``002`` prints no Prompt-to-Prompt settings):

- the defaults ``cross_replace_steps=0.8`` and ``self_replace_steps=0.4`` are the Prompt-to-Prompt notebook's word
  swap settings (Img-Diff's released code uses its "refine" edit with 1.0 / 0.4; refine is what the mapper below does
  for inserted words);
- token alignment: the two token sequences (77 positions, padding included) are aligned by longest matching blocks
  (:class:`difflib.SequenceMatcher`). Equal tokens map one to one. A replaced span of the same token count maps one
  to one (word swap); of a different count, each target token receives the source span's summed map divided by the
  target span's length (the rule of Prompt-to-Prompt's released ``get_replacement_mapper``, which keeps the word's
  attention mass). Target tokens with no source (an inserted word) keep their own attention (the paper's
  refinement, section 3.2); source tokens with no target are dropped. So prompts of different word counts work too;
- ``self_replace_max_tokens = 32 ** 2``, as the diffusers community Prompt-to-Prompt pipeline (whose interface,
  ``edit_type`` / ``n_self_replace`` / ``n_cross_replace``, Img-Diff's released code calls); the original notebook's
  ``16 ** 2`` would share no self-attention at all in SDXL at 1024 px, whose attention layers are 64 ** 2 and 32 ** 2;
- a step counts from 0; replacement is active while ``step < int(fraction * num_steps)`` (Prompt-to-Prompt's released
  code floors it too);
- with classifier-free guidance the unconditional half of the batch is left alone, as in Prompt-to-Prompt's released
  code (its prompts are equal anyway).

Works with every ``UNet2DConditionModel`` (SD 1.x, 2.x and SDXL: the key length is the 77 tokens of the first
tokenizer, and SDXL's two encoders share positions). Attention is computed explicitly only in the layers and steps
that replace a map; everywhere else it is ``torch.nn.functional.scaled_dot_product_attention``.

Legend: P pairs, H heads, Q query positions, S source tokens, T target tokens (S = T = the key length, 77).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["P2PController", "P2PAttnProcessor", "P2PSettings", "prompt_to_prompt", "token_mapper"]


@dataclass(frozen=True)
class P2PSettings:
    """How much of the denoising shares attention (fractions of the steps) and where self-attention is shared.

    ``cross_replace_steps = self_replace_steps = 0`` turns sharing off: the pair is then two generations from the
    same latent.
    """

    cross_replace_steps: float = 0.8
    self_replace_steps: float = 0.4
    self_replace_max_tokens: int = 32**2

    def __post_init__(self) -> None:
        for name in ("cross_replace_steps", "self_replace_steps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a fraction of the steps in [0, 1], got {value!r}")
        if not isinstance(self.self_replace_max_tokens, int) or self.self_replace_max_tokens < 1:
            raise ValueError(
                f"self_replace_max_tokens must be a positive integer, got {self.self_replace_max_tokens!r}"
            )


def token_mapper(source: Sequence[int], target: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The cross-attention mapper of one prompt pair (the module docstring gives the alignment rule).

    Args:
        source: the source prompt's token ids, padded (length S).
        target: the target prompt's token ids, padded (length T).

    Returns:
        ``(W, mapped)``: ``W`` (S, T) float, the target's map is ``M_src @ W``; ``mapped`` (T,) bool, the target
        tokens that take the source's attention (the others keep their own).
    """
    weights = torch.zeros(len(source), len(target))
    mapped = torch.zeros(len(target), dtype=torch.bool)
    matcher = difflib.SequenceMatcher(None, list(source), list(target), autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal" or (op == "replace" and i2 - i1 == j2 - j1):
            for k in range(i2 - i1):
                weights[i1 + k, j1 + k] = 1.0
            mapped[j1:j2] = True
        elif op == "replace":  # a word that tokenizes to a different count: spread the source span's mass evenly
            weights[i1:i2, j1:j2] = 1.0 / (j2 - j1)
            mapped[j1:j2] = True
        # "insert": new target tokens keep their own attention; "delete": source tokens without a target are dropped
    return weights, mapped


class P2PController:
    """The shared state of one Prompt-to-Prompt generation: the pairs' mappers and the current step.

    The pipeline's batch holds the prompts as ``[source_0, target_0, source_1, target_1, ...]`` (2P prompts);
    :meth:`step_end` is the pipeline's ``callback_on_step_end``.

    Args:
        weights: (P, S, T) the :func:`token_mapper` matrices.
        mapped: (P, T) the tokens that take the source's attention.
        num_steps: the number of denoising steps.
        settings: the fractions and the self-attention size limit.
    """

    def __init__(self, weights: torch.Tensor, mapped: torch.Tensor, num_steps: int, settings: P2PSettings) -> None:
        self.weights = weights
        self.mapped = mapped
        self.pairs = weights.shape[0]
        self.settings = settings
        self.cross_steps = int(settings.cross_replace_steps * num_steps)
        self.self_steps = int(settings.self_replace_steps * num_steps)
        self.step = 0
        self.replaced = {"cross": 0, "self": 0}  # attention calls that replaced a map (for tests and logs)

    def step_end(self, pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        """diffusers' ``callback_on_step_end``: the next call belongs to step ``step + 1``."""
        self.step = step + 1
        return {}

    def replaces(self, is_cross: bool, queries: int) -> bool:
        """Whether an attention call of this kind and query length replaces the target's map at the current step."""
        if is_cross:
            return self.step < self.cross_steps
        return self.step < self.self_steps and queries <= self.settings.self_replace_max_tokens

    def edit(self, probs: torch.Tensor, is_cross: bool) -> torch.Tensor:
        """Replaces the targets' maps in ``probs`` (B, H, Q, K), B = 2P or 4P (unconditional half first: left alone)."""
        B, H, Q, K = probs.shape
        if B not in (2 * self.pairs, 4 * self.pairs):
            raise ValueError(f"Prompt-to-Prompt: a batch of {B} in attention, expected {2 * self.pairs} or twice that")
        start = B - 2 * self.pairs
        pairs = probs[start:].view(self.pairs, 2, H, Q, K)  # (P, 2, H, Q, K)
        source, target = pairs[:, 0], pairs[:, 1]
        if is_cross:
            if K != self.weights.shape[1]:
                raise ValueError(
                    f"Prompt-to-Prompt: {K} text tokens in cross-attention, the mapper has {self.weights.shape[1]}"
                )
            weights = self.weights.to(probs.device, probs.dtype)
            swapped = torch.einsum("phqs,pst->phqt", source, weights)  # (P, H, Q, T)
            keep = self.mapped.to(probs.device)[:, None, None, :]  # (P, 1, 1, T)
            new_target = torch.where(keep, swapped, target)
        else:
            new_target = source
        edited = torch.stack([source, new_target], dim=1).view(2 * self.pairs, H, Q, K)
        self.replaced["cross" if is_cross else "self"] += 1
        return torch.cat([probs[:start], edited], dim=0)


class P2PAttnProcessor:
    """diffusers' ``AttnProcessor`` with the controller's replacement between the softmax and the value product."""

    def __init__(self, controller: P2PController) -> None:
        self.controller = controller

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        temb: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channel, height * width).transpose(1, 2)  # (B, Q, C)
        is_cross = encoder_hidden_states is not None
        B, Q, _ = hidden_states.shape
        context = encoder_hidden_states if is_cross else hidden_states
        attention_mask = attn.prepare_attention_mask(attention_mask, context.shape[1], B)
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        query = attn.to_q(hidden_states)
        if not is_cross:
            context = hidden_states
        elif attn.norm_cross:
            context = attn.norm_encoder_hidden_states(context)
        key, value = attn.to_k(context), attn.to_v(context)
        query, key, value = (attn.head_to_batch_dim(x) for x in (query, key, value))  # (B*H, Q or K, d)
        if self.controller.replaces(is_cross, Q):
            probs = attn.get_attention_scores(query, key, attention_mask)  # (B*H, Q, K)
            probs = self.controller.edit(probs.view(B, attn.heads, Q, -1), is_cross).view(B * attn.heads, Q, -1)
            hidden_states = torch.bmm(probs, value)
        else:
            hidden_states = F.scaled_dot_product_attention(
                query, key, value, attn_mask=attention_mask, scale=attn.scale
            )
        hidden_states = attn.batch_to_head_dim(hidden_states)  # (B, Q, H*d)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))  # linear, dropout
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch, channel, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


def pair_mappers(tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights (P, S, T), mapped (P, T))`` of the prompt pairs, tokenized as the pipeline tokenizes them."""
    length = tokenizer.model_max_length
    ids = tokenizer(
        [p for pair in pairs for p in pair], padding="max_length", max_length=length, truncation=True
    ).input_ids
    maps = [token_mapper(ids[2 * k], ids[2 * k + 1]) for k in range(len(pairs))]
    return torch.stack([w for w, _ in maps]), torch.stack([m for _, m in maps])


@contextmanager
def prompt_to_prompt(
    unet: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], num_steps: int, settings: P2PSettings
) -> Iterator[P2PController]:
    """Installs :class:`P2PAttnProcessor` in every attention layer of ``unet`` for one generation, then restores
    the processors it had.

    Args:
        unet: a diffusers ``UNet2DConditionModel``.
        tokenizer: the pipeline's (first) tokenizer.
        pairs: ``(source, target)`` prompts, in the batch order ``source_0, target_0, source_1, ...``.
        num_steps: the denoising steps of the generation.
        settings: the replacement fractions.

    Yields:
        the controller; pass ``controller.step_end`` as the pipeline's ``callback_on_step_end``.
    """
    weights, mapped = pair_mappers(tokenizer, pairs)
    controller = P2PController(weights, mapped, num_steps, settings)
    saved = unet.attn_processors
    unet.set_attn_processor(P2PAttnProcessor(controller))
    try:
        yield controller
    finally:
        unet.set_attn_processor(saved)
