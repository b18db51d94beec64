"""What the LightningModules share: a thin training shell around :class:`namc.NAMC` (:class:`NAMCModule`).

The two stages are :class:`~namc.lit.pretrain.PretrainModule` and :class:`~namc.lit.finetune.FinetuneModule`.

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

Optimisation (appendix F, stated once in :mod:`namc.objectives.optim`): Adam; pre-training NIM lr 1e-4 with a
cosine decay to 1e-5, MIR + FDG 3e-4 to 1e-4; fine-tuning 2e-4 (the paper gives no minimum for fine-tuning; we decay
to 1e-4, the pre-training MIR/FDG minimum). Warm-up is optional (linear, ``warmup_steps``). The schedule steps
per optimiser step over ``trainer.estimated_stepping_batches``.

Reproducibility: before every training step torch's global RNG (dropout) is reseeded from (seed, epoch, batch,
rank), NIM's masks come from a generator seeded the same way, and the datamodule draws its data-side randomness
(shuffling, reference captions, image swapping) from (seed, epoch) without the global RNG; its training loader saves
its place in the epoch in every checkpoint (:class:`namc.data.views.ResumableLoader`). A run killed at any step and
resumed from its last checkpoint (``--ckpt_path``) therefore ends with the same weights, bit for bit, as an
uninterrupted one (``tests/test_resume.py``).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import CombinedLoader

from namc._version import __version__
from namc.models.io import NAMC_KEY, checkpoint_entry
from namc.models.namc import NAMC
from namc.objectives.optim import adam_with_cosine
from namc.text.tokenizer import CaptionTokenizer, same_tokenizer, tokenizer_from_dict

__all__ = ["NAMCModule", "caption_evaluator"]

logger = logging.getLogger(__name__)

# Part weights a preset may load (NAMCConfig fields) and where a user gets each file.
_PART_HINTS = {
    "clip_pretrained": "CLIP ViT-B/16 in open_clip layout: convert OpenAI's ViT-B-16.pt once with "
    "`namc convert-clip ViT-B-16.pt weights/clip_vit_b16.safetensors`",
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


def _tokenizer_arg(tokenizer: CaptionTokenizer | None, overrides: dict[str, Any]) -> CaptionTokenizer | str | None:
    """What ``create_model`` gets as ``tokenizer``: the datamodule's (LightningCLI links it), which must be of the kind
    an ``overrides.tokenizer`` names (``word`` / ``clip_bpe``; popped from ``overrides``), or that kind."""
    kind = overrides.pop("tokenizer", None)
    if tokenizer is None or kind is None:
        return tokenizer if tokenizer is not None else kind
    if tokenizer.kind != kind:
        raise ValueError(
            f"overrides.tokenizer is {kind!r}, but the tokenizer given is a {tokenizer.kind!r} one: "
            f"build the datamodule with tokenizer={kind!r} (the CLI links the two)"
        )
    return tokenizer


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
        self._loader_states: list[dict[str, Any]] | None = None  # the training loaders' saved positions
        self._mid_epoch = False  # the loaded checkpoint was saved in the middle of an epoch

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

    def _slot_keys(self, batch: dict[str, Any], slot: str) -> list[str]:
        """Memo keys of image ``slot`` ("1" or "2") of each pair of the batch, per split: a training pair and a
        validation pair may share an id (the shapes world numbers both corpora from 0), and must not share codes."""
        stage = self._trainer.state.stage if self._trainer is not None else None
        split = "validate" if stage == "sanity_check" else str(getattr(stage, "value", stage))
        return [f"{split}\x00{k}\x00{slot}" for k in batch["ids"]]

    def _check_grid_cache(self, cache_grids: bool) -> None:
        if cache_grids and self.model.config.grid_trainable:
            raise ValueError("cache_grids memoises the grid encoder's output, which grid_trainable changes: pick one")

    def _cached_grid(self, batch: dict[str, Any], slot: str) -> torch.Tensor:
        """(B, N, C) frozen grid of image ``slot`` of each pair, computed once per pair id (``cache_grids``)."""
        return _memoised(self._grids, self._slot_keys(batch, slot), self.model.grid, batch["image" + slot])

    # -------------------------------------------------------------------------------------------- hooks

    def _set_data_epoch(self) -> None:
        dm = self._datamodule()
        if dm is not None and hasattr(dm, "set_epoch"):
            dm.set_epoch(self.current_epoch)

    def on_train_start(self) -> None:
        # a resumed run skips on_train_epoch_start of the epoch it re-enters, and Lightning settles which epoch that
        # is (the next one, after a checkpoint of an epoch's last batch) only after building the loader
        self._set_data_epoch()
        self._restore_loader_states()

    def _restore_loader_states(self) -> None:
        """Hand the training loaders their saved positions (Lightning 2.6 does not, see :meth:`on_load_checkpoint`).

        The loaders start iterating at their first batch, after this hook; loading the same state twice (where
        Lightning did hand it over) is harmless.
        """
        states, self._loader_states = self._loader_states, None
        if self.trainer.ckpt_path is None:  # a checkpoint loaded for another run than this resume
            return
        if not states:
            if self._mid_epoch:
                logger.warning(
                    "%s was saved in the middle of an epoch without the data position (by an older namc, or with a "
                    "loader without state): the epoch's data starts again, so this run will not match an "
                    "uninterrupted one",
                    self.trainer.ckpt_path,
                )
            return
        loaders = [
            dl for dl in CombinedLoader(self.trainer.train_dataloader).flattened if hasattr(dl, "load_state_dict")
        ]
        if len(loaders) != len(states):
            raise ValueError(
                f"the checkpoint {self.trainer.ckpt_path} holds the positions of {len(states)} training loader(s), "
                f"this run has {len(loaders)}: resume with the data settings it was saved with"
            )
        for loader, state in zip(loaders, states):
            loader.load_state_dict(state)

    def on_train_epoch_start(self) -> None:
        self._set_data_epoch()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # dropout draws from torch's global RNG: seed it per step so a resumed run replays the same masks
        torch.manual_seed(_mix(self.seed, self.current_epoch, self._epoch_batch(batch_idx), self.global_rank, 1))

    def _epoch_batch(self, batch_idx: int) -> int:
        """The index in its epoch of the training batch at hand, as the training loader counts it.

        It seeds the masks and dropout, so it must not change with resuming. Lightning's ``batch_idx`` does (2.6):
        a run resumed from a checkpoint of an epoch's last batch leaves its epoch counters one short, and a later
        resume from one of its checkpoints restarts ``batch_idx`` at 0 mid-epoch. The loader's count
        (:class:`~namc.data.views.ResumableLoader`) survives any number of resumes.
        """
        trainer = self._trainer
        loader = trainer.train_dataloader if trainer is not None else None
        batches = getattr(loader, "batches", 0)
        return batches - 1 if isinstance(batches, int) and batches > 0 else batch_idx

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[NAMC_KEY] = checkpoint_entry(self.model.config, self.model.tokenizer, __version__)
        if self.model.training_shortlist is not None:  # a fine-tuned model's training captions' tokens (load_model)
            checkpoint[NAMC_KEY]["shortlist"] = self.model.training_shortlist.to_dict()

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
        # configure_optimizers asks for trainer.estimated_stepping_batches, which makes Lightning build the training
        # loader before it restores the checkpoint, and then (2.6) it never gives that loader the position it saved
        # in the checkpoint (fit_loop.setup_data returns early): keep it for on_train_start
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        self._loader_states = fit_loop.get("state_dict", {}).get("combined_loader") or None
        progress = fit_loop.get("epoch_loop.batch_progress", {})
        self._mid_epoch = bool(progress.get("current", {}).get("processed")) and not progress.get("is_last_batch")

    def _adam(self, groups: list[dict[str, Any]], warmup_steps: int, weight_decay: float) -> dict[str, Any]:
        """Adam over ``groups`` (``name``, ``params``, ``lr``, ``min_lr``) with a per-group cosine schedule per step."""
        groups = [g for g in groups if g["params"]]
        total = self.trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise ValueError("the cosine schedule needs a finite run length: set trainer.max_steps or max_epochs")
        optimizer, scheduler = adam_with_cosine(groups, int(total), warmup_steps, weight_decay)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
