"""LightningModules: a thin training shell around :class:`namc.NAMC` (pre-training and fine-tuning).

The network is a plain ``nn.Module`` built by the registry (``create_model``) or loaded from a saved model; the
modules only add optimisation, logging, checkpoint bookkeeping and evaluation:

- :class:`PretrainModule` runs ``L = L_NIM + L_MIR + L_FDG`` (Eq. 2) and logs ``train/loss``, ``train/nim``,
  ``train/mir``, ``train/fdg`` and the mask fractions. The ablation switches of Tables 6-8 and Fig. 3 are plain init
  arguments, passed on as :class:`~namc.models.namc.NAMCConfig` overrides (image-order swapping, appendix B.3, is
  the corpus datamodule's ``swap_prob``: it acts in the collator). Masks are drawn from a generator seeded by
  (seed, epoch, batch, rank), and under DDP the NIM negatives are gathered from every rank with gradient.
- :class:`FinetuneModule` trains MIR + FDG on benchmark captions (NIM dropped), initialised from a pre-training
  checkpoint / saved folder or from scratch; validation and test generate captions (greedy, at most 23 tokens,
  appendix F) and score them with :mod:`namc.eval.captions` (``val/cider`` is CIDEr-D x100).

Optimisation (appendix F): Adam; pre-training NIM lr 1e-4 with a cosine decay to 1e-5, MIR + FDG 3e-4 to 1e-4;
fine-tuning 2e-4 (the paper gives no minimum for fine-tuning; we decay to 1e-4, the pre-training MIR/FDG minimum).
Warm-up is optional (linear, ``warmup_steps``). The schedule steps per optimiser step over
``trainer.estimated_stepping_batches``.

Reproducibility: before every training step torch's global RNG (dropout) is reseeded from (seed, epoch, batch,
rank), NIM's masks come from a generator seeded the same way, and the datamodule draws its data-side randomness
(shuffling, reference captions, image swapping) from (seed, epoch) without the global RNG. A run resumed from an
epoch-end checkpoint (``--ckpt_path``) therefore ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from namc.eval.noise import auroc, noise_scores
from namc.lit.checkpoints import NAMC_KEY, load_namc, namc_checkpoint_entry, same_tokenizer, tokenizer_from_dict
from namc.ops.distributed import all_gather_with_grad, broadcast_object, distributed_ready, gather_objects
from namc.models import create_model
from namc.models.namc import NAMC
from namc.text.tokenizer import CaptionTokenizer

__all__ = ["CosineSchedule", "FinetuneModule", "NAMCModule", "PretrainModule"]

logger = logging.getLogger(__name__)

# Part weights a preset may load (NAMCConfig fields) and where a user gets each file.
_PART_HINTS = {
    "clip_pretrained": "CLIP ViT-B/16 in open_clip layout: convert OpenAI's ViT-B-16.pt once with "
    "`python tools/convert_openai_clip.py ViT-B-16.pt weights/clip_vit_b16.safetensors`",
    "grid_pretrained": "ImageNet ResNet-101 (torchvision's resnet101-63fe2227.pth or timm's resnet101.tv_in1k "
    "model.safetensors)",
    "vqgan_pretrained": "taming-transformers' VQGAN f16-16384 last.ckpt (vqgan_imagenet_f16_16384)",
}
_METRIC_LOG_NAMES = {
    "BLEU-1": "bleu1",
    "BLEU-2": "bleu2",
    "BLEU-3": "bleu3",
    "BLEU-4": "bleu4",
    "METEOR": "meteor",
    "ROUGE-L": "rouge_l",
    "CIDEr-D": "cider",
    "SPICE": "spice",
}


def _memoised(
    cache: dict[str, torch.Tensor],
    keys: list[str],
    compute: Callable[[torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
) -> torch.Tensor:
    """``cache[key]`` stacked for ``keys``, on the device of ``inputs``; the missing ones computed once.

    Args:
        cache: key -> value (kept on the CPU).
        keys: (B,) keys of the batch.
        compute: (M, ...) inputs -> (M, ...) values, run without gradient on the inputs of the missing keys.
        inputs: (B, ...) inputs of the batch.
    """
    missing = [i for i, key in enumerate(keys) if key not in cache]
    if missing:
        with torch.no_grad():
            values = compute(inputs[torch.tensor(missing, device=inputs.device)]).cpu()
        for j, i in enumerate(missing):
            cache[keys[i]] = values[j]
    return torch.stack([cache[key] for key in keys]).to(inputs.device)


class CosineSchedule:
    """LR multiplier for ``LambdaLR``: linear warm-up, then a half cosine from 1 down to ``min_ratio``.

    A callable object (not a lambda) so ``LambdaLR.state_dict()`` stores its plain attributes.

    Args:
        total_steps: optimiser steps of the whole run.
        warmup_steps: steps of linear warm-up from 0 (0: none).
        min_ratio: final lr / initial lr (e.g. 1e-5 / 1e-4 = 0.1 for NIM, appendix F).
    """

    def __init__(self, total_steps: int, warmup_steps: int = 0, min_ratio: float = 0.0) -> None:
        self.total_steps = max(int(total_steps), 1)
        self.warmup_steps = max(int(warmup_steps), 0)
        self.min_ratio = float(min_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


_EVALUATORS: dict[bool, Any] = {}


def caption_evaluator(spice: bool = False) -> Any:
    """A process-wide :class:`~namc.eval.captions.CaptionEvaluator`: its METEOR JVM starts once per process, not at
    every validation (it stops at interpreter exit)."""
    if spice not in _EVALUATORS:
        import atexit

        from namc.eval.captions import CaptionEvaluator

        _EVALUATORS[spice] = CaptionEvaluator(spice=spice)
        atexit.register(_EVALUATORS[spice].close)
    return _EVALUATORS[spice]


def _check_part_files(overrides: dict[str, Any]) -> None:
    """Fail early, naming the config key and where to get the file, when a pretrained part is missing."""
    for key, hint in _PART_HINTS.items():
        value = overrides.get(key)
        if value and not Path(value).is_file():
            raise FileNotFoundError(
                f"model.init_args.overrides.{key}: {value} not found. Expected {hint}. namc never downloads weights: "
                "put the file there or change the path in the config."
            )


def _global_seed(seed: int | None) -> int:
    if seed is not None:
        return int(seed)
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def _mix(*values: int) -> int:
    """A deterministic 63-bit seed from a few integers."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2))) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


class NAMCModule(pl.LightningModule):
    """What pre-training and fine-tuning share: checkpoint entries, the optimiser, epoch seeding, export."""

    model: NAMC

    def __init__(self, seed: int | None = None) -> None:
        super().__init__()
        self._seed = seed
        self._grids: dict[str, torch.Tensor] = {}  # memoised frozen grids (cache_grids), by pair id and slot

    # -------------------------------------------------------------------------------------------- helpers

    @property
    def tokenizer(self) -> CaptionTokenizer:
        return self.model.tokenizer

    @property
    def seed(self) -> int:
        return _global_seed(self._seed)

    def export(self, directory: str | Path) -> Path:
        """Save the network as a ``from_pretrained`` folder (config.json, model.safetensors, tokenizer.json)."""
        return self.model.save_pretrained(directory)

    def _datamodule(self) -> Any:
        trainer = self._trainer
        return getattr(trainer, "datamodule", None) if trainer is not None else None

    @staticmethod
    def _slot_keys(batch: dict[str, Any], slot: str) -> list[str]:
        """Memo keys of image ``slot`` ("1" or "2") of each pair of the batch."""
        return [f"{k}\x00{slot}" for k in batch["ids"]]

    def _check_grid_cache(self, cache_grids: bool) -> None:
        if cache_grids and self.model.config.grid_trainable:
            raise ValueError("cache_grids memoises the grid encoder's output, which grid_trainable changes: pick one")

    def _cached_grid(self, batch: dict[str, Any], slot: str) -> torch.Tensor:
        """(B, N, C) frozen grid of image ``slot`` of each pair, computed once per pair id (``cache_grids``)."""
        return _memoised(self._grids, self._slot_keys(batch, slot), self.model.grid, batch["image" + slot])

    # -------------------------------------------------------------------------------------------- hooks

    def on_train_epoch_start(self) -> None:
        dm = self._datamodule()
        if dm is not None and hasattr(dm, "set_epoch"):
            dm.set_epoch(self.current_epoch)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # dropout draws from torch's global RNG: seed it per step so a resumed run replays the same masks
        torch.manual_seed(_mix(self.seed, self.current_epoch, batch_idx, self.global_rank, 1))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[NAMC_KEY] = namc_checkpoint_entry(self.model)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        entry = checkpoint.get(NAMC_KEY)
        if entry is None:
            raise ValueError("this checkpoint has no 'namc' entry: it was not written by namc.lit")
        stored = tokenizer_from_dict(entry["tokenizer"])
        if not same_tokenizer(stored, self.model.tokenizer):
            raise ValueError(
                "the checkpoint's tokenizer differs from the one this run built from its data (the vocabulary of a "
                "word tokenizer is built from the training texts): resume with the same data, or fine-tune from the "
                "checkpoint with `model.init_args.pretrained`"
            )

    def _adam(self, groups: list[dict[str, Any]], warmup_steps: int, weight_decay: float) -> dict[str, Any]:
        """Adam over ``groups`` (``params``, ``lr``, ``min_lr``) with a per-group cosine schedule per step."""
        groups = [g for g in groups if g["params"]]
        total = self.trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise ValueError("the cosine schedule needs a finite run length: set trainer.max_steps or max_epochs")
        optimizer = torch.optim.Adam(
            [{"params": g["params"], "lr": g["lr"], "name": g["name"]} for g in groups], weight_decay=weight_decay
        )
        lambdas = [CosineSchedule(int(total), warmup_steps, g["min_lr"] / g["lr"]) for g in groups]
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class PretrainModule(NAMCModule):
    """NAMC pre-training (section 3.3): ``L = L_NIM + L_MIR + L_FDG``.

    Args:
        model: a registered preset (``namc_tiny``, ``namc_base``).
        tokenizer: the caption tokenizer; LightningCLI links it from the datamodule (built from the corpus for word
            presets). None: the preset's default.
        use_nim: the NIM alignment loss and noise masking (Table 6 "- NIM": off, masks become random).
        use_mir: the MIR reconstruction loss (Table 6 "- MIR": off).
        masking: ``"noise"`` (NM) or ``"random"`` (Fig. 3 baseline).
        p_img: image masking ratio p_I (0.2, section 4.2.1).
        p_txt: text masking ratio p_T (0.15).
        nim_loss: ``"sdm"`` or ``"infonce"`` (Table 7).
        nim_token_loss: weight of the token-level alignment term added to L_NIM
            (:func:`namc.ops.token_sigmoid_loss`; not in the paper, 0 = off). For a NIM that starts from random
            weights, which lacks the patch-word alignment a pre-trained CLIP brings (the CPU demo).
        nim_token_ngram: its word labels: whether the image's own description has the same n-gram ending there
            (2: the word and the one before it), or None: whether image and description are a pair.
        rec_loss: ``"discrete"`` (VQGAN codes), ``"l1"`` or ``"l2"`` (Table 7).
        denoised_image: NIM aligns the masked image (Table 8).
        denoised_text: NIM aligns, and FDG generates, the masked description (Table 8).
        overrides: further :class:`~namc.models.namc.NAMCConfig` fields (e.g. ``clip_pretrained``, ``dim``).
        lr_nim: NIM initial lr (1e-4, appendix F).
        min_lr_nim: NIM final lr (1e-5).
        lr: MIR + FDG initial lr (3e-4).
        min_lr: MIR + FDG final lr (1e-4).
        warmup_steps: linear warm-up steps (0: none, as the paper says nothing of one).
        weight_decay: Adam's L2 penalty (0: plain Adam).
        gather_negatives: under DDP, contrast against the negatives of every rank (the global batch).
        cache_codes: memoise the frozen VQGAN's codes per pair id in memory (small corpora whose shards carry no
            precomputed codes; needs ``swap_prob = 0``).
        cache_grids: memoise the frozen ResNet grid of every image per pair id in memory (the paper pre-extracts
            them; N x C floats per image, e.g. 64 x 128 for ``namc_tiny``; small corpora only; needs
            ``swap_prob = 0`` and a frozen grid encoder).
        seed: base seed of the masks and of the per-epoch reseeding (default: ``seed_everything``'s).
    """

    def __init__(
        self,
        model: str = "namc_tiny",
        tokenizer: CaptionTokenizer | None = None,
        use_nim: bool = True,
        use_mir: bool = True,
        masking: str = "noise",
        p_img: float = 0.2,
        p_txt: float = 0.15,
        nim_loss: str = "sdm",
        nim_token_loss: float = 0.0,
        nim_token_ngram: int | None = 2,
        rec_loss: str = "discrete",
        denoised_image: bool = True,
        denoised_text: bool = True,
        overrides: dict[str, Any] | None = None,
        lr_nim: float = 1e-4,
        min_lr_nim: float = 1e-5,
        lr: float = 3e-4,
        min_lr: float = 1e-4,
        warmup_steps: int = 0,
        weight_decay: float = 0.0,
        gather_negatives: bool = True,
        cache_codes: bool = False,
        cache_grids: bool = False,
        seed: int | None = None,
    ) -> None:
        super().__init__(seed)
        self.save_hyperparameters(ignore=["tokenizer"])
        switches = dict(
            use_nim=use_nim, use_mir=use_mir, masking=masking, p_img=p_img, p_txt=p_txt, nim_loss=nim_loss,
            nim_token_loss=nim_token_loss, nim_token_ngram=nim_token_ngram, rec_loss=rec_loss,
            denoised_image=denoised_image, denoised_text=denoised_text,
        )  # fmt: skip
        overrides = dict(overrides or {})
        clash = sorted(set(switches) & set(overrides))
        if clash:
            raise ValueError(f"{clash} are init arguments of PretrainModule: set them there, not in overrides")
        if overrides.get("pretraining") is False:
            raise ValueError("pre-training needs pretraining=True")
        _check_part_files(overrides)
        self.model = create_model(model, tokenizer=tokenizer, **switches, **overrides)
        self._check_grid_cache(cache_grids)
        self._codes: dict[str, torch.Tensor] = {}
        self._val_scores: list[torch.Tensor] = []
        self._val_labels: list[torch.Tensor] = []

    def setup(self, stage: str) -> None:
        dm = self._datamodule()
        h = self.hparams
        if (h.cache_codes or h.cache_grids) and getattr(dm, "swap_prob", 0.0) > 0:
            raise ValueError(
                "cache_codes / cache_grids memoise per pair id, which image swapping breaks: set swap_prob: 0"
            )

    def _generator(self, batch_idx: int, stage: int) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(_mix(self.seed, stage, self.current_epoch, batch_idx, self.global_rank))
        return g

    def _with_cache(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Add memoised VQGAN codes and grids (the missing ones computed once) when ``cache_codes`` /
        ``cache_grids`` are on."""
        h, c = self.hparams, self.model.config
        extra: dict[str, torch.Tensor] = {}
        for slot in ("1", "2"):
            if h.cache_codes and c.use_mir and c.rec_loss == "discrete" and batch.get("codes" + slot) is None:
                keys, images = self._slot_keys(batch, slot), batch["image" + slot]
                extra["codes" + slot] = _memoised(self._codes, keys, self.model.vqgan, images).long()  # (B, N)
            if h.cache_grids and batch.get("grid" + slot) is None:
                extra["grid" + slot] = self._cached_grid(batch, slot)  # (B, N, C)
        return {**batch, **extra}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, torch.Tensor]:
        """One pre-training step; returns ``loss`` and the detached parts (``outputs`` of ``on_train_batch_end``)."""
        gather = all_gather_with_grad if (self.hparams.gather_negatives and distributed_ready()) else None
        out = self.model.pretrain_step(self._with_cache(batch), self._generator(batch_idx, 0), gather)
        B = batch["image1"].shape[0]
        self.log("train/loss", out["loss"].detach(), prog_bar=True, batch_size=B)
        for key in ("nim", "mir", "fdg", "img_mask_frac", "txt_mask_frac"):
            self.log(f"train/{key}", out[key], batch_size=B)
        return out

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        out = self.model.pretrain_step(self._with_cache(batch), self._generator(batch_idx, 1), None)
        B = batch["image1"].shape[0]
        for key in ("loss", "nim", "mir", "fdg"):
            self.log(f"val/{key}", out[key], batch_size=B, sync_dist=True, prog_bar=key == "loss")
        scores, labels = noise_scores(self.model, batch)
        self._val_scores.append(scores)
        self._val_labels.append(labels)

    def on_validation_epoch_end(self) -> None:
        local = (torch.cat(self._val_scores), torch.cat(self._val_labels)) if self._val_scores else None
        self._val_scores, self._val_labels = [], []
        parts = [p for p in gather_objects(local) if p is not None]
        if not parts:
            return
        scores = torch.cat([p[0] for p in parts])
        labels = torch.cat([p[1] for p in parts])
        value = auroc(scores, labels)
        if not math.isnan(value):
            self.log("val/noise_auroc", value, prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> dict[str, Any]:
        h = self.hparams
        groups = self.model.param_groups()
        return self._adam(
            [
                {"name": "nim", "params": groups["nim"], "lr": h.lr_nim, "min_lr": h.min_lr_nim},
                {"name": "mir_fdg", "params": groups["mir_fdg"], "lr": h.lr, "min_lr": h.min_lr},
            ],
            h.warmup_steps,
            h.weight_decay,
        )


class FinetuneModule(NAMCModule):
    """Fine-tuning of MIR + FDG on an IDC benchmark (section 4), with caption metrics on validation and test.

    Args:
        model: a registered preset; ignored when ``pretrained`` is given (the saved config wins).
        tokenizer: the caption tokenizer (LightningCLI links it from the datamodule, which reads it from
            ``pretrained`` when that is set, else builds it from the benchmark's training captions).
        pretrained: a pre-training Lightning ``.ckpt`` or a ``save_pretrained`` folder to start from; NIM, the
            VQGAN and MIR's reconstruction head are dropped. None: train from scratch (the no-pre-training baseline).
        overrides: :class:`~namc.models.namc.NAMCConfig` fields for a model built from scratch.
        lr: initial lr of MIR + FDG (2e-4, appendix F).
        min_lr: final lr of the cosine decay (1e-4; the paper gives none for fine-tuning).
        warmup_steps: linear warm-up steps.
        weight_decay: Adam's L2 penalty.
        max_new_tokens: longest generated caption (23, appendix F).
        num_beams: 1 = greedy (the paper).
        cache_grids: memoise the frozen ResNet grid of every image in memory (the paper pre-extracts them); for
            small datasets only.
        grid_trainable: train the grid encoder too (None: as the model's config says; the paper keeps its
            ImageNet ResNet frozen, a randomly initialised one, as in the CPU demo, is better trained).
        spice: try SPICE in the metrics (reported "unavailable" when its jars are missing).
        seed: base seed of the per-epoch reseeding (default: ``seed_everything``'s).
    """

    def __init__(
        self,
        model: str = "namc_tiny",
        tokenizer: CaptionTokenizer | None = None,
        pretrained: str | None = None,
        overrides: dict[str, Any] | None = None,
        lr: float = 2e-4,
        min_lr: float = 1e-4,
        warmup_steps: int = 0,
        weight_decay: float = 0.0,
        max_new_tokens: int = 23,
        num_beams: int = 1,
        cache_grids: bool = False,
        grid_trainable: bool | None = None,
        spice: bool = False,
        seed: int | None = None,
    ) -> None:
        super().__init__(seed)
        self.save_hyperparameters(ignore=["tokenizer"])
        if pretrained is not None:
            if overrides:
                raise ValueError("a pretrained model fixes the architecture: leave overrides empty with pretrained")
            net = load_namc(pretrained, pretraining=False)
            if tokenizer is not None and not same_tokenizer(tokenizer, net.tokenizer):
                raise ValueError(
                    f"the tokenizer given to FinetuneModule differs from the one saved with {pretrained}: the data "
                    "must be tokenized with the pretrained model's tokenizer (LightningCLI links it; in Python build "
                    f"the datamodule with tokenizer={str(pretrained)!r})"
                )
            if net.config.name != model:
                logger.info("fine-tuning %s from %s (model=%r is ignored)", net.config.name, pretrained, model)
        else:
            overrides = dict(overrides or {})
            _check_part_files(overrides)
            net = create_model(model, tokenizer=tokenizer, **{"pretraining": False, **overrides})
            if net.config.pretraining:
                net.drop_pretraining_modules()
        if grid_trainable is not None and grid_trainable != net.config.grid_trainable:
            net.grid.set_frozen(not grid_trainable)
            net.config = dataclasses.replace(net.config, grid_trainable=grid_trainable)
        self.model = net
        self._check_grid_cache(cache_grids)
        self._outputs: dict[str, list[tuple[str, str, list[str], str | None]]] = {}
        self.scores: dict[str, dict[str, Any]] = {}

    # -------------------------------------------------------------------------------------------- data

    def _grids_of(self, batch: dict[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Memoised (B, N, C) grids of both images when ``cache_grids`` is on, else (None, None)."""
        if not self.hparams.cache_grids:
            return None, None
        return self._cached_grid(batch, "1"), self._cached_grid(batch, "2")

    def training_step(self, batch: dict[str, Any] | None, batch_idx: int) -> torch.Tensor | None:
        if batch is None:  # every item of the batch was unreadable (counted by the dataset)
            return None
        grid1, grid2 = self._grids_of(batch)
        out = self.model.finetune_step({**batch, "grid1": grid1, "grid2": grid2})
        self.log("train/loss", out["loss"].detach(), prog_bar=True, batch_size=batch["image1"].shape[0])
        return out["loss"]

    # -------------------------------------------------------------------------------------------- evaluation

    def _generate(self, batch: dict[str, Any], stage: str) -> list[str]:
        grid1, grid2 = self._grids_of(batch)
        ids = self.model.generate_ids(
            batch["image1"], batch["image2"], self.hparams.max_new_tokens, self.hparams.num_beams, grid1, grid2
        )  # (B, T)
        captions = [self.tokenizer.decode(row.tolist()) for row in ids]
        store = self._outputs.setdefault(stage, [])
        store.extend(zip(batch["ids"], captions, batch["references"], batch["change_types"]))
        return captions

    def _eval_step(self, batch: dict[str, Any] | None, stage: str) -> None:
        if batch is None:
            return
        B = batch["image1"].shape[0]
        grid1, grid2 = self._grids_of(batch)
        out = self.model.finetune_step({**batch, "grid1": grid1, "grid2": grid2})
        self.log(f"{stage}/loss", out["loss"], batch_size=B, sync_dist=True)
        self._generate(batch, stage)

    def validation_step(self, batch: dict[str, Any] | None, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any] | None, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._finish("val")

    def on_test_epoch_end(self) -> None:
        self._finish("test")

    def _finish(self, stage: str) -> None:
        local = self._outputs.pop(stage, [])
        if self.trainer.sanity_checking:
            return
        merged: dict[str, tuple[str, list[str], str | None]] = {}
        for part in gather_objects(local):  # a DistributedSampler pads with repeats: keep one per id
            for key, caption, refs, ctype in part:
                merged.setdefault(key, (caption, refs, ctype))
        log_dir = self.trainer.log_dir  # a collective under DDP: every rank asks, before rank 0 works alone
        scores = None
        if self.global_rank == 0 and merged:
            scores = self._score(stage, merged, log_dir)
        scores = broadcast_object(scores)
        if scores is None:
            return
        self.scores[stage] = scores
        for name, value in scores["overall"].items():
            if isinstance(value, float):
                # every rank holds rank 0's value: sync_dist averages identical numbers (and keeps Lightning quiet)
                self.log(
                    f"{stage}/{_METRIC_LOG_NAMES.get(name, name)}", value, prog_bar=name == "CIDEr-D", sync_dist=True
                )
        for ctype, per in scores.get("per_type", {}).items():
            if isinstance(per.get("CIDEr-D"), float):
                self.log(f"{stage}/cider_{ctype}", per["CIDEr-D"], sync_dist=True)

    def _score(
        self, stage: str, merged: dict[str, tuple[str, list[str], str | None]], log_dir: str | None
    ) -> dict[str, Any]:
        from namc.eval.captions import write_results

        predictions = {k: v[0] for k, v in merged.items()}
        references = {k: v[1] for k, v in merged.items()}
        types = {k: v[2] for k, v in merged.items()}
        change_types = types if all(t is not None for t in types.values()) else None
        scores = caption_evaluator(self.hparams.spice).evaluate(predictions, references, change_types=change_types)
        if log_dir is not None:
            name = f"{stage}_epoch{self.current_epoch:03d}.json" if stage == "val" else f"{stage}.json"
            path = write_results(Path(log_dir) / "captions" / name, predictions, references, scores)
            logger.info("%s captions and scores written to %s", stage, path)
        return scores

    def predict_step(self, batch: dict[str, Any] | None, batch_idx: int) -> list[dict[str, str]]:
        if batch is None:
            return []
        grid1, grid2 = self._grids_of(batch)
        ids = self.model.generate_ids(
            batch["image1"], batch["image2"], self.hparams.max_new_tokens, self.hparams.num_beams, grid1, grid2
        )  # (B, T)
        return [{"id": k, "caption": self.tokenizer.decode(row.tolist())} for k, row in zip(batch["ids"], ids)]

    def configure_optimizers(self) -> dict[str, Any]:
        h = self.hparams
        groups = self.model.param_groups()
        return self._adam(
            [{"name": "mir_fdg", "params": groups["mir_fdg"], "lr": h.lr, "min_lr": h.min_lr}],
            h.warmup_steps,
            h.weight_decay,
        )
