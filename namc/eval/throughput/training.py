"""Training throughput: pre-training (or fine-tuning) steps/s on a synthetic batch, and what the paper's run costs.

A step is forward + backward + Adam step + zeroing the gradients, with the objectives of :mod:`namc.objectives` and
the paper's learning rates (:data:`~namc.objectives.PRETRAIN_LR`, :data:`~namc.objectives.FINETUNE_LR`, appendix F).
The pre-training estimate is the paper's run (770K pairs, section 3.1.1, x 20 epochs, appendix F) at the measured
pairs/s, on this device and on the paper's 8 devices at linear scaling.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from namc.data.collate import CaptionCollator, PretrainCollator
from namc.eval.throughput.settings import (
    PRETRAIN_DEVICES,
    PRETRAIN_EPOCHS,
    PRETRAIN_PAIRS,
    BenchmarkSettings,
)
from namc.eval.throughput.timing import peak_memory, summarize, time_calls
from namc.models.namc import NAMC
from namc.objectives import FINETUNE_LR, PRETRAIN_LR, finetune_step, optimizer_groups, pretrain_step
from namc.text.template import VERBS

__all__ = ["run_training", "synthetic_pretrain_batch"]

logger = logging.getLogger(__name__)

# words for synthetic descriptions: in the tiny presets' word vocabulary and ordinary English for CLIP's BPE
_SYNTHETIC_WORDS = (
    "a",
    "small",
    "large",
    "red",
    "blue",
    "green",
    "gray",
    "brown",
    "purple",
    "cyan",
    "yellow",
    "rubber",
    "metal",
    "shiny",
    "matte",
    "cube",
    "sphere",
    "cylinder",
    "block",
    "ball",
    "object",
    "left",
    "right",
    "of",
    "behind",
    "in",
    "front",
    "next",
    "to",
    "near",
    "the",
    "with",
    "on",
)


def synthetic_pretrain_batch(
    model: NAMC, batch_size: int, gen: torch.Generator, words_per_half: int = 12, with_codes: bool = True
) -> dict[str, Any]:
    """A pre-training batch built by the real :class:`~namc.data.collate.PretrainCollator` from synthetic items:
    random images in [0, 1], template descriptions of ``words_per_half`` words per half, verbs from the paper's
    list, and (``with_codes``) random VQGAN codes as packed shards carry them."""
    cfg = model.config
    n = model.grid_size**2

    def pick(options: Sequence[str]) -> str:
        return options[int(torch.randint(len(options), (), generator=gen))]

    def half() -> str:
        return " ".join(pick(_SYNTHETIC_WORDS) for _ in range(words_per_half))

    items = []
    for i in range(batch_size):
        item = {
            "id": f"synthetic-{i}",
            "image1": torch.rand(3, cfg.image_size, cfg.image_size, generator=gen),
            "image2": torch.rand(3, cfg.image_size, cfg.image_size, generator=gen),
            "verb1": pick(VERBS),
            "desc1": half(),
            "verb2": pick(VERBS),
            "desc2": half(),
        }
        if with_codes:
            item["codes1"] = torch.randint(cfg.vqgan_n_embed, (n,), generator=gen)
            item["codes2"] = torch.randint(cfg.vqgan_n_embed, (n,), generator=gen)
        items.append(item)
    return PretrainCollator(model.tokenizer, max_caption_len=cfg.max_caption_len)(items)


def _synthetic_caption_batch(model: NAMC, batch_size: int, gen: torch.Generator) -> dict[str, Any]:
    """A fine-tuning batch from the real :class:`~namc.data.collate.CaptionCollator`: random images, captions of
    8 to 15 words."""
    size = model.config.image_size
    items = [
        {
            "image1": torch.rand(3, size, size, generator=gen),
            "image2": torch.rand(3, size, size, generator=gen),
            "captions": [" ".join(_SYNTHETIC_WORDS[: 8 + i % 8])],
        }
        for i in range(batch_size)
    ]
    return CaptionCollator(model.tokenizer, model.config.max_caption_len)(items)


def _train_step(
    model: NAMC, batch: dict[str, Any], settings: BenchmarkSettings, device: torch.device, pretrain: bool
) -> Callable[[], None]:
    """One optimiser step over ``batch`` as a closure: Adam over the paper's parameter groups; half precision runs
    under ``torch.autocast`` with fp32 weights (float16 with a gradient scaler)."""
    dtype = getattr(torch, settings.dtype)
    # Adam ignores the groups' extra "name" and "min_lr" keys (the cosine schedule's); the harness times no schedule
    optimizer = torch.optim.Adam(optimizer_groups(model.param_groups(), PRETRAIN_LR if pretrain else FINETUNE_LR))
    use_amp = dtype != torch.float32
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    step_gen = torch.Generator(device=device).manual_seed(settings.seed)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=use_amp):
            out = pretrain_step(model, batch, generator=step_gen) if pretrain else finetune_step(model, batch)
        if scaler is not None:
            scaler.scale(out["loss"]).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            out["loss"].backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _pretrain_estimate(pairs_per_s: dict[str, Any]) -> dict[str, Any]:
    """Hours of the paper's pre-training run at the measured pairs/s (median, fastest and slowest step), on this
    device and on the paper's 8 (data parallel at this per-device batch, linear scaling: an upper bound on speed)."""
    total = PRETRAIN_PAIRS * PRETRAIN_EPOCHS
    hours = total / pairs_per_s["median"] / 3600
    return {
        "pairs": PRETRAIN_PAIRS,
        "epochs": PRETRAIN_EPOCHS,
        "devices": PRETRAIN_DEVICES,
        "hours_on_devices": hours / PRETRAIN_DEVICES,
        "hours": hours,
        "hours_min": total / pairs_per_s["max"] / 3600,
        "hours_max": total / pairs_per_s["min"] / 3600,
    }


def run_training(model: NAMC, settings: BenchmarkSettings, device: torch.device) -> dict[str, Any]:
    """Time pre-training steps (forward + backward + Adam); a model without NIM times fine-tuning steps instead.

    Learning rates are the paper's (appendix F: NIM 1e-4, MIR + FDG 3e-4; fine-tuning 2e-4), from
    :mod:`namc.objectives.optim`; half precision runs under ``torch.autocast`` with fp32 weights (float16 with a
    gradient scaler). The model is left in eval mode.
    """
    batch_size = settings.train_batch_size
    gen = torch.Generator().manual_seed(settings.seed + 1)
    model.float().train()
    pretrain = model.nim is not None and model.vqgan is not None
    if pretrain:
        batch = synthetic_pretrain_batch(model, batch_size, gen, with_codes=not settings.train_vqgan)
    else:
        batch = _synthetic_caption_batch(model, batch_size, gen)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    step = _train_step(model, batch, settings, device, pretrain)
    logger.info("training: %s, batch %d", "pretrain" if pretrain else "finetune", batch_size)
    times, _ = time_calls(step, device, settings.train_warmup, settings.train_steps)
    with peak_memory(device) as mem:
        step()
    model.eval()
    pairs = summarize([batch_size / t for t in times])
    return {
        "kind": "pretrain" if pretrain else "finetune",
        "batch_size": batch_size,
        "vqgan_in_step": bool(pretrain and settings.train_vqgan),
        "autocast_dtype": settings.dtype if settings.dtype != "float32" else None,
        "time_s": summarize(times),
        "steps_per_s": summarize([1 / t for t in times]),
        "pairs_per_s": pairs,
        "peak_memory": mem,
        "pretrain_estimate": _pretrain_estimate(pairs) if pretrain else None,
    }
