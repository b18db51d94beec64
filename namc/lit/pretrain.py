"""Pre-training as a LightningModule: :class:`PretrainModule` runs ``L = L_NIM + L_MIR + L_FDG`` (Eq. 2) through
:func:`namc.objectives.pretrain_step` and logs ``train/loss``, ``train/nim``, ``train/mir``, ``train/fdg``, the mask
fractions and, on validation, NIM's noise AUROC."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from namc.data.corpus.targets import check_targets
from namc.eval.noise import auroc, noise_scores
from namc.lit.modules import NAMCModule, _check_part_files, _memoised, _mix, _tokenizer_arg
from namc.models import create_model
from namc.models.files import file_digest
from namc.objectives import PRETRAIN_LR, pretrain_step
from namc.ops.distributed import all_gather_with_grad, distributed_ready, gather_objects
from namc.text.tokenizer import CaptionTokenizer

__all__ = ["PretrainModule"]


class PretrainModule(NAMCModule):
    """NAMC pre-training (section 3.3): ``L = L_NIM + L_MIR + L_FDG``.

    Args:
        model: a registered preset (``namc_tiny``, ``namc_base``).
        tokenizer: the caption tokenizer; LightningCLI links it from the datamodule (built from the corpus for word
            presets). None: the preset's default.
        use_nim: the NIM alignment loss and noise masking (off: no L_NIM, and masks become random at p_I / p_T
            unless ``masking="none"``).
        use_mir: the MIR reconstruction loss (Table 6 "- MIR": off). A corpus of free-text descriptions (appendix
            B.2's conventional prompt, :mod:`namc.data.corpus.records`) needs both off: it trains FDG only (Table 11).
        masking: ``"noise"`` (NM), ``"random"`` (Fig. 3 baseline: every position at p_I / p_T) or ``"none"`` (no
            masking at all: the paper's "without NIM" of Table 6 / Table 10, with ``use_nim=False``; the model is
            built as random masking at p_I = p_T = 0, so nothing is ever masked).
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
        lr_nim: float = PRETRAIN_LR["nim"].lr,
        min_lr_nim: float = PRETRAIN_LR["nim"].min_lr,
        lr: float = PRETRAIN_LR["mir_fdg"].lr,
        min_lr: float = PRETRAIN_LR["mir_fdg"].min_lr,
        warmup_steps: int = 0,
        weight_decay: float = 0.0,
        gather_negatives: bool = True,
        cache_codes: bool = False,
        cache_grids: bool = False,
        seed: int | None = None,
    ) -> None:
        super().__init__(seed)
        self.save_hyperparameters(ignore=["tokenizer"])
        if masking == "none":  # Bernoulli(0) never masks; the model layer knows only "noise" and "random"
            masking, p_img, p_txt = "random", 0.0, 0.0
        switches = dict(
            use_nim=use_nim,
            use_mir=use_mir,
            masking=masking,
            p_img=p_img,
            p_txt=p_txt,
            nim_loss=nim_loss,
            nim_token_loss=nim_token_loss,
            nim_token_ngram=nim_token_ngram,
            rec_loss=rec_loss,
            denoised_image=denoised_image,
            denoised_text=denoised_text,
        )
        overrides = dict(overrides or {})
        clash = sorted(set(switches) & set(overrides))
        if clash:
            raise ValueError(f"{clash} are init arguments of PretrainModule: set them there, not in overrides")
        if overrides.get("pretraining") is False:
            raise ValueError("pre-training needs pretraining=True")
        _check_part_files(overrides)
        self.model = create_model(model, tokenizer=_tokenizer_arg(tokenizer, overrides), **switches, **overrides)
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
        if stage in ("fit", "validate") and getattr(dm, "precomputed", False):
            self._check_precomputed([getattr(dm, "train_path", None), getattr(dm, "val_path", None)])
        if stage == "fit" and hasattr(dm, "free_text_example"):  # the first record, before any step
            self._check_free_text(dm.free_text_example())

    def _check_free_text(self, pair_id: str | None) -> None:
        """A free-text description (appendix B.2, ``pair_id``; None: none seen) has no halves for NIM and MIR and no
        order to exchange: pre-training on one is FDG only, as Table 11's "without NIM and MIR"."""
        if pair_id is None:
            return
        c = self.model.config
        on = [f"model.init_args.{k}" for k in ("use_nim", "use_mir") if getattr(c, k)]
        dm = self._datamodule()
        if getattr(dm, "swap_prob", 0.0) > 0:
            on.append("data.init_args.swap_prob")
        if on:
            raise ValueError(
                f"pair {pair_id!r} has a free-text description (no template halves, appendix B.2), which pre-trains "
                f"FDG only: turn off {' and '.join(on)} (false / 0)"
            )

    def _check_batch(self, batch: dict[str, Any]) -> None:
        """:meth:`_check_free_text` for a corpus whose free-text records come after its first."""
        flags = batch.get("free_text")
        if flags is not None and bool(flags.any()):
            self._check_free_text(batch["ids"][int(flags.nonzero()[0, 0])])

    def _check_precomputed(self, corpora: list[str | None]) -> None:
        """The corpus's precomputed targets come from this model's frozen VQGAN and grid encoder (before training,
        not as a wrong loss or an out-of-range code deep in the run)."""
        corpora = [p for p in corpora if p is not None and Path(p).is_dir() and any(Path(p).glob("*.targets.json"))]
        if not corpora:
            return
        c = self.model.config
        digest = {}
        for key in ("vqgan_pretrained", "grid_pretrained"):
            path = getattr(c, key)
            digest[key] = file_digest(Path(path))["sha256"] if path and Path(path).is_file() else None
        grid_used = not c.grid_trainable
        for corpus in corpora:
            check_targets(
                corpus,
                c.vqgan_n_embed,
                digest["vqgan_pretrained"],
                c.grid_model if grid_used else None,
                digest["grid_pretrained"],
                c.image_size,
            )

    def _generator(self, batch_idx: int, stage: int) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(_mix(self.seed, stage, self.current_epoch, batch_idx, self.global_rank))
        return g

    def _with_cache(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Add memoised VQGAN codes and grids (the missing ones computed once) when ``cache_codes`` /
        ``cache_grids`` are on. Codes and grids the batch already carries (``namc data precompute``) are used as
        they are, except grids when the grid encoder trains (its output then changes)."""
        h, c = self.hparams, self.model.config
        if c.grid_trainable and batch.get("grid1") is not None:
            batch = {k: v for k, v in batch.items() if k not in ("grid1", "grid2")}
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
        self._check_batch(batch)
        gather = all_gather_with_grad if (self.hparams.gather_negatives and distributed_ready()) else None
        generator = self._generator(self._epoch_batch(batch_idx), 0)
        out = pretrain_step(self.model, self._with_cache(batch), generator, gather)
        B = batch["image1"].shape[0]
        self.log("train/loss", out["loss"].detach(), prog_bar=True, batch_size=B)
        for key in ("nim", "mir", "fdg", "img_mask_frac", "txt_mask_frac"):
            self.log(f"train/{key}", out[key], batch_size=B)
        return out

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._check_batch(batch)
        out = pretrain_step(self.model, self._with_cache(batch), self._generator(batch_idx, 1), None)
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
