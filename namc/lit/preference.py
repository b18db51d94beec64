"""Preference fine-tuning as a LightningModule: :class:`PreferenceModule`, DPO (Eq. 2) with a fixed pool of negatives
or ADPO (Eq. 4-7, Algorithm 1) with the adversarial hard-negative retriever (seed paper 003).

It starts from a fine-tuned namc model (a ``save_pretrained`` folder or a FinetuneModule ``.ckpt``) and keeps a
frozen copy of it as the reference pi_ref. The copy is *not* a submodule: it is not in the state dict, so it is not
saved twice in the checkpoints, never reaches the optimiser or DDP, and stays in eval mode; it is rebuilt from
``pretrained`` (the strict loader, :func:`namc.models.load_model`) whenever the module is built, and a checkpoint
records the SHA-256 of its weights, so resuming against a changed ``pretrained`` file is an error. ``.to()`` moves
it with the module.

Each training step (Algorithm 1, one Monte Carlo sample per pair):

1. E_MIR of the pairs under pi_ref; K candidate negatives per pair (:class:`~namc.lit.negatives.NegativePool`:
   other training captions and / or rule-made counterfactuals, positives excluded);
2. T' drawn uniformly (``negatives: pool``, DPO with a fixed pool) or from q_phi at temperature tau (``negatives:
   retriever``, ADPO; :class:`~namc.objectives.retriever.NegativeRetriever`);
3. the DPO margin M and loss -log sigma(M) (:mod:`namc.objectives.preference`); for ADPO, the REINFORCE loss of
   the retriever with reward R = -log sigma(M) and a leave-one-out baseline. Both losses are summed: the policy
   gets no gradient from the REINFORCE term (its reward is a constant) and the retriever none from the DPO term
   (T' is a discrete sample), so one optimiser with two parameter groups performs both updates of Algorithm 1.

Logged: ``train/loss``, ``train/dpo``, ``train/margin``, ``train/reward`` (R, the policy's loss per pair),
``train/pref_acc`` (M > 0: pi_theta prefers T over T' more than pi_ref does), ``train/logp_acc`` (pi_theta gives T a
higher length-normalised log-probability than T'), ``train/entropy`` (of the sampling distribution, nats; log K
for the uniform pool) and ``train/neg_counterfactual`` (share of drawn negatives that are counterfactuals). Validation
and test caption the pairs and score them as fine-tuning does (:class:`~namc.lit.finetune.FinetuneModule`).

DDP: every rank draws its own candidates and samples with a generator seeded by (seed, epoch, batch, rank); the
baseline is the local batch's; the retriever's parameters are used at every step (plain ``ddp`` needs that).
"""

from __future__ import annotations

import copy
import hashlib
import logging
from typing import Any

import torch

from namc.data.idc.base import NO_CHANGE
from namc.lit.finetune import FinetuneModule
from namc.lit.modules import _mix
from namc.lit.negatives import CANDIDATE_SOURCES, NegativePool
from namc.models.namc import NAMC
from namc.objectives.optim import PREFERENCE_LR
from namc.objectives.preference import (
    dpo_loss,
    dpo_margin,
    dpo_reward,
    leave_one_out_baseline,
    preference_logprobs,
    reinforce_loss,
)
from namc.objectives.retriever import NegativeRetriever
from namc.ops.sequence import used_length
from namc.text.tokenizer import CaptionTokenizer

__all__ = ["PREFERENCE_LR", "PreferenceModule"]

logger = logging.getLogger(__name__)

_ENTRY = "namc_preference"


def _weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of a module's state dict (names, shapes, dtypes and bytes), in key order."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class PreferenceModule(FinetuneModule):
    """DPO / ADPO preference fine-tuning of a fine-tuned namc captioner (see the module docstring).

    Args:
        pretrained: the fine-tuned model to start from and to keep as the reference (a ``save_pretrained`` folder or
            a FinetuneModule ``.ckpt``).
        tokenizer: the caption tokenizer (LightningCLI links the datamodule's, read from ``pretrained``).
        negatives: ``pool`` (DPO: T' uniform over the candidate set) or ``retriever`` (ADPO: T' ~ q_phi).
        candidates: ``captions``, ``counterfactuals`` or ``both`` (:class:`~namc.lit.negatives.NegativePool`).
        num_candidates: K = |N|, candidates per pair (ADPO: 128 best of 16 / 64 / 128 / 256).
        beta: the DPO temperature of Eq. 2.
        tau: the retriever's sampling temperature (ADPO: about 2).
        sft_weight: weight of an extra next-token loss on T (0: the paper's pure DPO loss).
        lr: the captioner's (MIR + FDG) initial lr.
        min_lr: its final lr (cosine).
        retriever_lr: the retriever's lr (constant; ADPO: 1e-4).
        model: the preset name (ignored: ``pretrained`` fixes the architecture).
        Other arguments: as :class:`FinetuneModule`.
    """

    def __init__(
        self,
        pretrained: str,
        tokenizer: CaptionTokenizer | None = None,
        negatives: str = "retriever",
        candidates: str = "both",
        num_candidates: int = 128,
        beta: float = 0.1,
        tau: float = 2.0,
        sft_weight: float = 0.0,
        lr: float = PREFERENCE_LR["policy"],
        min_lr: float = PREFERENCE_LR["policy"] / 10,
        retriever_lr: float = PREFERENCE_LR["retriever"],
        warmup_steps: int = 0,
        weight_decay: float = 0.0,
        max_new_tokens: int = 23,
        num_beams: int = 1,
        cache_grids: bool = False,
        spice: bool = False,
        seed: int | None = None,
        model: str = "namc_tiny",
    ) -> None:
        if negatives not in ("pool", "retriever"):
            raise ValueError(f"negatives must be 'pool' (DPO) or 'retriever' (ADPO), got {negatives!r}")
        if candidates not in CANDIDATE_SOURCES:
            raise ValueError(f"candidates must be one of {CANDIDATE_SOURCES}, got {candidates!r}")
        if beta <= 0:
            raise ValueError("beta must be positive")
        super().__init__(
            model=model,
            tokenizer=tokenizer,
            pretrained=pretrained,
            lr=lr,
            min_lr=min_lr,
            warmup_steps=warmup_steps,
            weight_decay=weight_decay,
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            cache_grids=cache_grids,
            spice=spice,
            seed=seed,
        )
        self.save_hyperparameters(ignore=["tokenizer"])
        reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        object.__setattr__(self, "_reference", reference)  # not a submodule: not saved, not trained, not in DDP
        self._reference_digest: str | None = None
        self.retriever: NegativeRetriever | None = None
        if negatives == "retriever":
            c = self.model.config
            self.retriever = NegativeRetriever(c.vocab_size, c.dim, c.dim, self.tokenizer.pad_id, tau)
            self.retriever.init_words(self.model.fdg.tok.weight)
        self.pool: NegativePool | None = None

    @property
    def reference(self) -> NAMC:
        """The frozen reference pi_ref (a copy of the starting model)."""
        return self._reference

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> PreferenceModule:
        super()._apply(fn, *args, **kwargs)
        self._reference._apply(fn, *args, **kwargs)  # .to(device) / .half() move the reference too
        return self

    def reference_digest(self) -> str:
        if self._reference_digest is None:
            self._reference_digest = _weights_digest(self._reference)
        return self._reference_digest

    # -------------------------------------------------------------------------------------------- data

    def setup(self, stage: str) -> None:
        super().setup(stage)  # the training shortlist of this data
        if stage != "fit" or self.pool is not None:
            return
        dm = self._datamodule()
        if dm is None or not hasattr(dm, "split"):
            raise ValueError("PreferenceModule needs a BenchmarkDataModule (its training split gives the negatives)")
        entries = dm.split("train").entries
        positives = {e[0]: e[3] for e in entries}
        no_change = [e[0] for e in entries if e[4] == NO_CHANGE]  # "no change" captions are true of every such pair
        h = self.hparams
        self.pool = NegativePool(
            positives,
            self.tokenizer,
            self.model.config.max_caption_len,
            h.candidates,
            h.num_candidates,
            interchangeable=no_change,
        )
        logger.info(
            "negative pool: %d distinct training captions, source %s, K %d",
            len(self.pool.texts),
            h.candidates,
            h.num_candidates,
        )

    def _generator(self, batch_idx: int) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(_mix(self.seed, self.current_epoch, self._epoch_batch(batch_idx), self.global_rank, 3))
        return g

    def _shared_grids(self, batch: dict[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(B, N, C) grids both models read when the grid encoder is frozen (it is the same in both); else None."""
        if self.hparams.cache_grids:
            return self._grids_of(batch)
        if self.model.config.grid_trainable:
            return None, None
        with torch.no_grad():
            B = batch["image1"].shape[0]
            grid = self.model.grid(torch.cat([batch["image1"], batch["image2"]]))  # (2B, N, C)
        return grid[:B], grid[B:]

    # -------------------------------------------------------------------------------------------- training

    def training_step(self, batch: dict[str, Any] | None, batch_idx: int) -> torch.Tensor | None:
        if batch is None:
            return None
        if self.pool is None:
            raise RuntimeError("the negative pool is built in setup('fit'): train through a Trainer")
        h = self.hparams
        B = batch["image1"].shape[0]
        g = self._generator(batch_idx)
        grid1, grid2 = self._shared_grids(batch)
        with torch.no_grad():
            ref_memory = self._reference.encode_pair(batch["image1"], batch["image2"], grid1, grid2)  # (B, N, D)
        cand, valid, is_cf = self.pool.candidates(batch["ids"], g)  # (B, K, T), (B, K), (B, K)
        cand, valid = cand.to(self.device), valid.to(self.device)
        if self.retriever is not None:
            logits = self.retriever.logits(ref_memory, cand, valid)  # (B, K)
        else:
            logits = torch.zeros(valid.shape, device=self.device).masked_fill(~valid, float("-inf"))
        index, log_q, entropy = NegativeRetriever.sample(logits, g)  # (B,)
        negative = cand[torch.arange(B, device=self.device), index]  # (B, T)
        negative = negative[:, : used_length(negative, self.tokenizer.pad_id)]
        lp = preference_logprobs(
            self.model, self._reference, {**batch, "grid1": grid1, "grid2": grid2}, negative, ref_memory
        )
        margin = dpo_margin(lp["policy_pos"], lp["policy_neg"], lp["ref_pos"], lp["ref_neg"], h.beta)  # (B,)
        loss_dpo = dpo_loss(margin).mean()
        loss = loss_dpo
        reward = dpo_reward(margin)
        if self.retriever is not None:
            loss_r = reinforce_loss(log_q, reward, leave_one_out_baseline(reward))
            loss = loss + loss_r
            self.log("train/reinforce", loss_r.detach(), batch_size=B)
        n_pos = (batch["caption"][:, 1:] != self.tokenizer.pad_id).sum(1).clamp_min(1)
        n_neg = (negative[:, 1:] != self.tokenizer.pad_id).sum(1).clamp_min(1)
        if h.sft_weight > 0:
            loss = loss + h.sft_weight * (-lp["policy_pos"] / n_pos).mean()
        logs = {
            "train/loss": loss.detach(),
            "train/dpo": loss_dpo.detach(),
            "train/margin": margin.detach().mean(),
            "train/reward": reward.mean(),
            "train/pref_acc": (margin.detach() > 0).float().mean(),
            "train/logp_acc": (lp["policy_pos"].detach() / n_pos > lp["policy_neg"].detach() / n_neg).float().mean(),
            "train/entropy": entropy.mean(),
            "train/neg_counterfactual": is_cf[torch.arange(B), index.cpu()].float().mean(),
        }
        for name, value in logs.items():
            self.log(name, value, prog_bar=name in ("train/loss", "train/pref_acc"), batch_size=B)
        return loss

    # -------------------------------------------------------------------------------------------- checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[_ENTRY] = {"reference": str(self.hparams.pretrained), "reference_sha256": self.reference_digest()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        entry = checkpoint.get(_ENTRY)
        if entry is None:
            return  # e.g. a FinetuneModule checkpoint given as --ckpt_path: nothing to check against
        if entry.get("reference_sha256") != self.reference_digest():
            raise ValueError(
                f"the reference model of this checkpoint ({entry.get('reference')}) differs from the one loaded from "
                f"{self.hparams.pretrained}: resume with the pretrained model the run started from"
            )

    def configure_optimizers(self) -> dict[str, Any]:
        h = self.hparams
        groups = [{"name": "mir_fdg", "params": self.model.param_groups()["mir_fdg"], "lr": h.lr, "min_lr": h.min_lr}]
        if self.retriever is not None:
            params = list(self.retriever.parameters())
            groups.append({"name": "retriever", "params": params, "lr": h.retriever_lr, "min_lr": h.retriever_lr})
        return self._adam(groups, h.warmup_steps, h.weight_decay)
