"""Fine-tuning as a LightningModule: :class:`FinetuneModule` trains MIR + FDG on benchmark captions (NIM dropped),
initialised from a pre-training checkpoint / saved folder or from scratch; validation and test generate captions
(greedy, at most 23 tokens, appendix F) and score them with :mod:`namc.eval.captions` (``val/cider`` is CIDEr-D
x100)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from pathlib import Path
from typing import Any

import torch

from namc.backends.compile import compile  # noqa: A004 - namc.compile
from namc.backends.precision import calibrate_int8, check_precision, int8_calibration, set_int8_calibration
from namc.lit.modules import _METRIC_LOG_NAMES, NAMCModule, _check_part_files, _tokenizer_arg, caption_evaluator
from namc.models import create_model, load_model
from namc.objectives import FINETUNE_LR, finetune_step
from namc.ops.distributed import broadcast_object, gather_objects
from namc.text.tokenizer import CaptionTokenizer, same_tokenizer

__all__ = ["FinetuneModule"]

logger = logging.getLogger(__name__)


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
        max_new_tokens: longest generated caption (23, appendix F; OmniDiff's long captions need more). Written into
            the model's config, so the exported model generates as long by default; at most ``max_caption_len - 1``.
        num_beams: 1 = greedy (the paper).
        inference_precision: ``fp32``, ``bf16`` or ``int8`` (CPU only): the precision the validation, test and
            predict captions are generated in (:mod:`namc.backends.precision`; losses and training stay as the
            Trainer's ``precision`` says). With ``namc eval --compare`` this measures what a precision changes:
            ``namc test ... --model.init_args.inference_precision bf16``.
        inference_shortlist: generate the validation, test and predict captions over ``model.training_shortlist``
            (the tokens of the training captions, :mod:`namc.models.shortlist`): faster decoding for a large (BPE)
            vocabulary; ``namc eval --compare`` against a run without it measures what it changes. Fitting always
            records the list (the exported model keeps it, ``shortlist.json``); a test or predict run over a model
            without one builds it from the datamodule's training captions.
        int8_calibration_pairs: with ``int8``, the first this many pairs of the datamodule's training split (both
            images of each) calibrate the static int8 grid (:func:`namc.backends.precision.calibrate_int8`) before the
            first int8 captions, and again whenever the grid's weights changed (a trainable grid), replacing a
            calibration the ``pretrained`` folder carried; 0: the grid runs in fp32; a datamodule without a
            benchmark training split: the ``pretrained`` folder's calibration where it has one, else fp32. The
            exported model keeps the calibration (``int8_calibration.json``).
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
        lr: float = FINETUNE_LR["mir_fdg"].lr,
        min_lr: float = FINETUNE_LR["mir_fdg"].min_lr,
        warmup_steps: int = 0,
        weight_decay: float = 0.0,
        max_new_tokens: int = 23,
        num_beams: int = 1,
        inference_precision: str = "fp32",
        inference_shortlist: bool = False,
        int8_calibration_pairs: int = 64,
        cache_grids: bool = False,
        grid_trainable: bool | None = None,
        spice: bool = False,
        seed: int | None = None,
    ) -> None:
        super().__init__(seed)
        check_precision(inference_precision)
        if int8_calibration_pairs < 0:
            raise ValueError(f"int8_calibration_pairs must be >= 0, got {int8_calibration_pairs}")
        self.save_hyperparameters(ignore=["tokenizer"])
        if pretrained is not None:
            if overrides:
                raise ValueError("a pretrained model fixes the architecture: leave overrides empty with pretrained")
            net = load_model(pretrained, pretraining=False)
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
            tokenizer_arg = _tokenizer_arg(tokenizer, overrides)
            net = create_model(model, tokenizer=tokenizer_arg, **{"pretraining": False, **overrides})
            if net.config.pretraining:
                net.drop_pretraining_modules()
        if grid_trainable is not None and grid_trainable != net.config.grid_trainable:
            net.grid.set_frozen(not grid_trainable)
            net.config = dataclasses.replace(net.config, grid_trainable=grid_trainable)
        if not 0 < max_new_tokens < net.config.max_caption_len:
            raise ValueError(
                f"max_new_tokens must be in [1, {net.config.max_caption_len - 1}] (FDG has max_caption_len = "
                f"{net.config.max_caption_len} positions, [BOS] included), got {max_new_tokens}"
            )
        if max_new_tokens != net.config.max_new_tokens:  # the exported model then generates as long (OmniDiff)
            net.config = dataclasses.replace(net.config, max_new_tokens=max_new_tokens)
        # e_M replaces masked grid features, and fine-tuning masks nothing: freeze it, or DDP stops at the first step
        # on a parameter without gradient (plain `ddp` needs every trainable parameter used)
        net.mir.e_m.requires_grad_(False)
        self.model = net
        self._check_grid_cache(cache_grids)
        self._outputs: dict[str, list[tuple[str, str, list[str], str | None]]] = {}
        self.scores: dict[str, dict[str, Any]] = {}

    # -------------------------------------------------------------------------------------------- data

    def setup(self, stage: str) -> None:
        texts = getattr(self._datamodule(), "vocabulary_texts", None)  # a benchmark's training captions
        if stage == "fit":  # this data's list, never one a pretrained folder brought from another fine-tuning
            self.model.training_shortlist = None
        if self.model.training_shortlist is None and (stage == "fit" or self.hparams.inference_shortlist):
            if texts is not None:
                self.model.training_shortlist = self.model.shortlist(texts())
                logger.info("training shortlist: %s", self.model.training_shortlist)
            elif self.hparams.inference_shortlist:
                raise ValueError(
                    "inference_shortlist: the model has no training_shortlist and the datamodule no "
                    "training captions to build one from"
                )

    def _grids_of(self, batch: dict[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Memoised (B, N, C) grids of both images when ``cache_grids`` is on, else (None, None)."""
        if not self.hparams.cache_grids:
            return None, None
        return self._cached_grid(batch, "1"), self._cached_grid(batch, "2")

    def training_step(self, batch: dict[str, Any] | None, batch_idx: int) -> torch.Tensor | None:
        if batch is None:  # every item of the batch was unreadable (counted by the dataset)
            return None
        grid1, grid2 = self._grids_of(batch)
        out = finetune_step(self.model, {**batch, "grid1": grid1, "grid2": grid2})
        self.log("train/loss", out["loss"].detach(), prog_bar=True, batch_size=batch["image1"].shape[0])
        return out["loss"]

    # -------------------------------------------------------------------------------------------- evaluation

    def _generate_ids(self, batch: dict[str, Any]) -> torch.Tensor:
        """(B, T) caption ids of a batch, at ``inference_precision`` (in a low precision from the pixels: the
        memoised grids are the fp32 grid encoder's)."""
        h = self.hparams
        if h.inference_precision == "int8":
            peaks = int8_calibration(self.model)
            if not h.int8_calibration_pairs:
                set_int8_calibration(self.model, None)  # 0: the fp32 grid, over a pretrained folder's calibration too
            elif peaks is None or peaks is not getattr(self, "_int8_peaks", None):  # none, stale, or not this run's
                self._calibrate_int8(h.int8_calibration_pairs)
                self._int8_peaks = int8_calibration(self.model)
        vocabulary = self.model.training_shortlist if h.inference_shortlist else None
        if h.inference_precision == "fp32":  # the eager model, over the memoised grids
            grid1, grid2 = self._grids_of(batch)
            return self.model.generate_ids(
                batch["image1"], batch["image2"], h.max_new_tokens, h.num_beams, grid1, grid2, vocabulary=vocabulary
            )
        device = self.model.fdg.tok.weight.device
        backend = "cpu" if device.type == "cpu" else "torch"  # torch: autocast over the model, no graphs to rebuild
        captioner = compile(self.model, backend, h.inference_precision)  # the cpu backend keeps its copy per model
        return captioner.generate_ids(batch["image1"], batch["image2"], h.max_new_tokens, h.num_beams, vocabulary)

    def _calibrate_int8(self, pairs: int) -> None:
        """Calibrate the static int8 grid on the first ``pairs`` readable pairs of the training split, in dataset
        order (no sampler is touched: a resumed run's data order stays as it was)."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if not hasattr(datamodule, "split"):
            if not getattr(self, "_warned_int8", False):
                logger.warning("int8: no benchmark training split to calibrate the grid on; the grid runs in fp32")
                self._warned_int8 = True
            return
        train = datamodule.split("train")
        items = (train[i] for i in range(len(train)))
        chosen = list(itertools.islice((it for it in items if it is not None), pairs))  # unreadable: skipped, counted
        device = self.model.fdg.tok.weight.device
        batches = [
            torch.stack([item[key] for item in chosen[i : i + 16]]).to(device)
            for i in range(0, len(chosen), 16)
            for key in ("image1", "image2")
        ]
        calibrate_int8(self.model, batches)
        logger.info("int8: grid calibrated on %d training pairs", len(chosen))

    def _generate(self, batch: dict[str, Any], stage: str) -> list[str]:
        ids = self._generate_ids(batch)  # (B, T)
        captions = [self.tokenizer.decode(row.tolist()) for row in ids]
        store = self._outputs.setdefault(stage, [])
        store.extend(zip(batch["ids"], captions, batch["references"], batch["change_types"]))
        return captions

    def _eval_step(self, batch: dict[str, Any] | None, stage: str) -> None:
        if batch is None:
            return
        B = batch["image1"].shape[0]
        grid1, grid2 = self._grids_of(batch)
        out = finetune_step(self.model, {**batch, "grid1": grid1, "grid2": grid2})
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
            fitting = self._trainer is not None and self.trainer.state.fn == "fit"
            # `namc validate` (epoch 0 to Lightning, in the fit run's log folder) must not replace epoch 0's file
            name = f"{stage}_epoch{self.current_epoch:03d}.json" if stage == "val" and fitting else f"{stage}.json"
            path = write_results(Path(log_dir) / "captions" / name, predictions, references, scores)
            logger.info("%s captions and scores written to %s", stage, path)
        return scores

    def predict_step(self, batch: dict[str, Any] | None, batch_idx: int) -> list[dict[str, str]]:
        if batch is None:
            return []
        ids = self._generate_ids(batch)  # (B, T)
        return [{"id": k, "caption": self.tokenizer.decode(row.tolist())} for k, row in zip(batch["ids"], ids)]

    def configure_optimizers(self) -> dict[str, Any]:
        h = self.hparams
        groups = self.model.param_groups()
        return self._adam(
            [{"name": "mir_fdg", "params": groups["mir_fdg"], "lr": h.lr, "min_lr": h.min_lr}],
            h.warmup_steps,
            h.weight_decay,
        )
