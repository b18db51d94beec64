"""NAMC: NIM + MIR + FDG composed into one module (paper section 3, Figure 2).

Dimension letters: B pairs, N grid positions (n_I), C grid channels, D width, L description tokens, T caption
tokens, V vocabulary.

Pre-training (``pretrain_step``) runs all three modules; fine-tuning and inference use the ResNet grid, the MIR
interaction path and FDG only (section 4: "the NIM module is employed only during the pre-training"). A model
built with ``pretraining=False`` has no NIM towers and no VQGAN at all; :meth:`NAMC.drop_pretraining_modules` turns a
pre-trained model into one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from namc import ops
from namc.models._weights import load_state_dict, load_strict, save_safetensors
from namc.models.encoders import ClipDualEncoder
from namc.models.fdg import FDG
from namc.models.grid import GridEncoder
from namc.models.mir import MIR
from namc.models.vqgan import VQGANTokenizer
from namc.text.tokenizer import CaptionTokenizer, load_tokenizer

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class NAMCConfig:
    """Everything needed to rebuild a NAMC model; saved as ``config.json``.

    The defaults are the paper's (appendix F): CLIP ViT-B/16 at 224 px, ResNet-101 layer3 (14 x 14 x 1024), VQGAN
    f16-16384, D 768, 12 heads, 2 MIR + 2 FDG layers, ``p_I = 0.2``, ``p_T = 0.15`` (section 4.2.1).
    """

    name: str = "namc_base"
    image_size: int = 224
    tokenizer: str = "clip_bpe"  # "clip_bpe" or "word"
    vocab_size: int = 49409
    pretraining: bool = True  # build the NIM towers and the VQGAN tokenizer
    # NIM (section 3.2.1)
    clip_model: str = "ViT-B-16-quickgelu"
    clip_pretrained: str | None = None
    p_img: float = 0.2
    p_txt: float = 0.15
    masking: str = "noise"  # "noise" (NM) or "random" (Fig. 3 ablation)
    nim_loss: str = "sdm"  # "sdm" (Jiang & Ye 2023) or "infonce" (Table 7)
    tau: float = 0.02
    # weight of a token-level alignment term added to L_NIM (namc.ops.token_sigmoid_loss; not in the paper): a
    # pre-trained CLIP already aligns patches and words, a randomly initialised NIM (the CPU demo) does not
    nim_token_loss: float = 0.0
    # labels of its words: n-gram presence in the image's own description (see token_sigmoid_loss); None: pairs
    nim_token_ngram: int | None = 2
    use_nim: bool = True
    denoised_image: bool = True  # Table 8
    denoised_text: bool = True  # Table 8
    # MIR (section 3.2.2)
    grid_model: str = "resnet101"
    grid_out_index: int = 3
    grid_kwargs: dict[str, Any] = field(default_factory=dict)
    grid_pretrained: str | None = None
    grid_trainable: bool = False  # the paper keeps the ResNet frozen ("pre-extracted"); train it without weights
    vqgan_ddconfig: dict[str, Any] = field(
        default_factory=lambda: dict(
            double_z=False, z_channels=256, resolution=256, in_channels=3, out_ch=3, ch=128,
            ch_mult=[1, 1, 2, 2, 4], num_res_blocks=2, attn_resolutions=[16], dropout=0.0,
        )
    )  # fmt: skip
    vqgan_n_embed: int = 16384
    vqgan_embed_dim: int = 256
    vqgan_pretrained: str | None = None
    use_mir: bool = True  # the reconstruction loss (Table 6 "- MIR" turns it off)
    rec_loss: str = "discrete"  # "discrete", "l1", "l2" (Table 7)
    # MIR encoder and FDG decoder (appendix F)
    dim: int = 768
    heads: int = 12
    mir_layers: int = 2
    fdg_layers: int = 2
    mlp_ratio: float = 4.0
    dropout: float = 0.1
    max_caption_len: int = 160
    tie_embeddings: bool = True
    ignore_masked_targets: bool = True  # [MASK] positions of the denoised description are not FDG targets
    max_new_tokens: int = 23  # appendix F

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NAMCConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown NAMC config keys {unknown}; valid keys: {sorted(known)}")
        return cls(**data)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _first_index(ids: torch.Tensor, value: int) -> torch.Tensor:
    """(B,) position of the first ``value`` in each row of (B, L) ``ids`` (L - 1 when absent)."""
    hit = ids == value
    pos = hit.int().argmax(dim=1)
    return torch.where(hit.any(dim=1), pos, torch.full_like(pos, ids.shape[1] - 1))


class NAMC(nn.Module):
    """The NAMC captioner.

    Args:
        config: the model's :class:`NAMCConfig`.
        tokenizer: the caption tokenizer shared by the NIM text tower and FDG; ``config.vocab_size`` must match.
    """

    def __init__(self, config: NAMCConfig, tokenizer: CaptionTokenizer) -> None:
        super().__init__()
        _check_choice("masking", config.masking, ("noise", "random"))
        _check_choice("nim_loss", config.nim_loss, ("sdm", "infonce"))
        _check_choice("rec_loss", config.rec_loss, ("discrete", "l1", "l2"))
        if tokenizer.vocab_size != config.vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids, config.vocab_size is {config.vocab_size}")
        self.config = config
        self.tokenizer = tokenizer
        c = config
        self.grid = GridEncoder(
            c.grid_model, c.grid_out_index, c.grid_pretrained, frozen=not c.grid_trainable, model_kwargs=c.grid_kwargs
        )
        self.grid_size = self.grid.grid_size(c.image_size)
        n = self.grid_size**2
        self.nim: ClipDualEncoder | None = None
        self.vqgan: VQGANTokenizer | None = None
        text_dim = None
        if c.pretraining:
            self.nim = ClipDualEncoder(c.clip_model, c.vocab_size, c.clip_pretrained, token_logit=c.nim_token_loss > 0)
            self.vqgan = VQGANTokenizer(c.vqgan_ddconfig, c.vqgan_n_embed, c.vqgan_embed_dim, c.vqgan_pretrained)
            grids = {
                "CLIP patches": self.nim.grid_size(c.image_size),
                "ResNet grid": self.grid_size,
                "VQGAN codes": c.image_size // self.vqgan.downsample,
            }
            if len(set(grids.values())) != 1:
                raise ValueError(f"the three views of an image must share one grid at {c.image_size} px: {grids}")
            text_dim = self.nim.embed_dim
        self.mir = MIR(
            self.grid.out_channels, n, c.dim, c.heads, c.mir_layers, text_dim,
            c.vqgan_n_embed if c.pretraining else 0, c.rec_loss, c.mlp_ratio, c.dropout,
        )  # fmt: skip
        self.fdg = FDG(
            c.vocab_size, c.dim, c.heads, c.fdg_layers, c.max_caption_len, tokenizer.pad_id, tokenizer.bos_id,
            tokenizer.eos_id, c.mlp_ratio, c.dropout, c.tie_embeddings,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------ parameters

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Trainable parameters by optimiser group: ``nim`` (lr 1e-4 -> 1e-5) and ``mir_fdg`` (3e-4 -> 1e-4).

        ``mir_fdg`` also holds the grid encoder's parameters when ``grid_trainable`` is set.
        """
        nim = [p for p in self.nim.parameters() if p.requires_grad] if self.nim is not None else []
        rest = [p for m in (self.grid, self.mir, self.fdg) for p in m.parameters() if p.requires_grad]
        return {"nim": nim, "mir_fdg": rest}

    def num_parameters(self) -> dict[str, int]:
        """Parameter counts by module; ``inference`` is what captioning uses (grid + MIR + FDG, heads excluded)."""
        count = lambda m: sum(p.numel() for p in m.parameters()) if m is not None else 0  # noqa: E731
        mir_train_only = sum(
            p.numel() for m in (self.mir.head, self.mir.text_proj) if m is not None for p in m.parameters()
        )
        out = {
            "nim": count(self.nim),
            "vqgan": count(self.vqgan),
            "grid": count(self.grid),
            "mir": count(self.mir),
            "mir_pretrain_heads": mir_train_only,
            "fdg": count(self.fdg),
            "fdg_embeddings": self.fdg.tok.weight.numel() + self.fdg.pos.numel(),
        }
        out["inference"] = out["grid"] + out["mir"] - mir_train_only + out["fdg"]
        out["total"] = sum(p.numel() for p in self.parameters())
        return out

    def drop_pretraining_modules(self) -> NAMC:
        """Remove NIM, the VQGAN and MIR's reconstruction head/text projection for fine-tuning and inference."""
        self.nim = None
        self.vqgan = None
        self.mir.head = None
        self.mir.text_proj = None
        self.config = dataclasses.replace(self.config, pretraining=False)
        return self

    # ------------------------------------------------------------------------------------------ NIM

    def _text_masks(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L) ids -> (words, real): word tokens strictly between [SOS] and [EOS]; real tokens up to [EOS]."""
        ar = torch.arange(ids.shape[1], device=ids.device)[None]  # (1, L)
        eos = _first_index(ids, self.tokenizer.eos_id)[:, None]  # (B, 1)
        return (ar > 0) & (ar < eos), ar <= eos

    @torch.no_grad()
    def relevance(self, images: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """NIM relevance of every patch and word (Eq. 1) on unmasked inputs.

        Args:
            images: (B, 3, H, W) in [0, 1].
            text: (B, L) description ids ``[SOS] words [EOS] pad``.

        Returns:
            ``(r_img, r_txt)``: (B, N) and (B, L); non-word positions of ``r_txt`` are 0.
        """
        if self.nim is None:
            raise RuntimeError("this model has no NIM module (pretraining=False)")
        _, h_img = self.nim.encode_image(images)
        _, h_txt = self.nim.encode_text(text, self.tokenizer.eos_id)
        words, _ = self._text_masks(text)
        return ops.token_relevance(h_img, h_txt, words)

    def noise_masks(
        self,
        images: torch.Tensor,
        text: torch.Tensor,
        generator: torch.Generator | None = None,
        relevance: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """NIM output (section 3.2.1): image mask (B, N) and text mask (B, L), True = masked.

        Noise masking uses ``P = p + IR - mean(IR)``; ``masking="random"`` (or ``use_nim=False``) uses ``P = p``.
        ``relevance`` passes ``(r_img, r_txt)`` already computed (otherwise :meth:`relevance` computes them).
        """
        c = self.config
        words, _ = self._text_masks(text)
        if c.masking == "noise" and c.use_nim:
            r_img, r_txt = relevance if relevance is not None else self.relevance(images, text)
            p_img = ops.mask_probabilities(1 - r_img, c.p_img)
            p_txt = ops.mask_probabilities(1 - r_txt, c.p_txt, words)
        else:
            n = self.grid_size**2
            p_img = ops.random_mask_probabilities(
                torch.ones(images.shape[0], n, dtype=torch.bool, device=images.device), c.p_img
            )
            p_txt = ops.random_mask_probabilities(words, c.p_txt)
        return ops.sample_mask(p_img, generator), ops.sample_mask(p_txt, generator)

    def _nim_loss(self, img: torch.Tensor, txt: torch.Tensor, ids: torch.Tensor, gather) -> torch.Tensor:
        if gather is not None:
            img, txt, ids = gather(img), gather(txt), gather(ids.float())
        same = (ids[:, None, :] == ids[None, :, :]).all(dim=-1)  # (G, G) identical texts are positives
        if self.config.nim_loss == "sdm":
            return ops.sdm_loss(img, txt, same, self.config.tau)
        return ops.info_nce_loss(img, txt, self.config.tau)

    # ------------------------------------------------------------------------------------------ steps

    def pretrain_step(
        self,
        batch: dict[str, Any],
        generator: torch.Generator | None = None,
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """One pre-training forward pass, ``L = L_NIM + L_MIR + L_FDG`` (Eq. 2).

        Args:
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
        if self.nim is None or self.vqgan is None:
            raise RuntimeError("pretrain_step needs a model built with pretraining=True")
        c = self.config
        B = batch["image1"].shape[0]
        images = torch.cat([batch["image1"], batch["image2"]])  # (2B, 3, H, W)
        text = torch.cat([batch["desc1"], batch["desc2"]])  # (2B, L)
        words, real = self._text_masks(text)
        eos_id = self.tokenizer.eos_id
        zero = images.new_zeros(())
        loss_tok, relevance = zero, None
        if c.use_nim and c.nim_token_loss > 0:  # token-level alignment on the unmasked inputs (not in the paper)
            assert self.nim.token_logit is not None
            _, h_img = self.nim.encode_image(images)  # (2B, N, E)
            _, h_txt = self.nim.encode_text(text, eos_id)  # (2B, L, E)
            scale, bias = self.nim.token_logit[0].exp(), self.nim.token_logit[1]
            for half in (slice(None, B), slice(B, None)):  # a pair's two images look alike: pair them per half
                loss_tok = loss_tok + ops.token_sigmoid_loss(
                    h_img[half], h_txt[half], words[half], scale, bias, text[half], c.nim_token_ngram
                )
            loss_tok = c.nim_token_loss * loss_tok
            with torch.no_grad():
                relevance = ops.token_relevance(h_img, h_txt, words)
        img_mask, txt_mask = self.noise_masks(images, text, generator, relevance)  # (2B, N), (2B, L)
        text_msk = text.masked_fill(txt_mask, self.tokenizer.mask_id)

        # NIM: align denoised images with denoised descriptions (section 3.3, appendix E.1)
        text_in = text_msk if c.denoised_text else text
        txt_eos, txt_tok = self.nim.encode_text(text_in, eos_id)  # (2B, E), (2B, L, E)
        loss_nim = loss_tok
        if c.use_nim:
            img_cls, _ = self.nim.encode_image(images, img_mask if c.denoised_image else None)
            loss_nim = loss_nim + self._nim_loss(img_cls[:B], txt_eos[:B], text[:B], gather)
            loss_nim = loss_nim + self._nim_loss(img_cls[B:], txt_eos[B:], text[B:], gather)

        # MIR: reconstruct masked grid positions as VQGAN codes (Eq. 18, masked positions only)
        if batch.get("grid1") is not None:
            grid = torch.cat([batch["grid1"], batch["grid2"]])  # (2B, N, C) pre-extracted
        else:
            grid = self.grid(images)  # (2B, N, C), frozen
        x = self.mir.embed(grid, img_mask)  # (2B, N, D)
        loss_mir = zero
        if c.use_mir:
            y = self.mir.reconstruct(x, txt_tok, real)  # (2B, N, D)
            if c.rec_loss == "discrete":
                if "codes1" in batch and batch["codes1"] is not None:
                    codes = torch.cat([batch["codes1"], batch["codes2"]])  # (2B, N)
                else:
                    codes = self.vqgan(images)  # (2B, N), frozen
                loss_mir = ops.masked_token_ce(self.mir.head(y[img_mask]), codes[img_mask])
            else:
                loss_mir = ops.masked_regression_loss(self.mir.head(y), grid, img_mask, c.rec_loss)
        memory = self.mir.interact(x[:B], x[B:], img_mask[:B], img_mask[B:])  # (B, N, D)

        # FDG: teacher forcing on the denoised implicit-change description (section 3.2.3)
        caption = batch["caption"]  # (B, T)
        masked_pos = torch.zeros_like(caption, dtype=torch.bool)
        if c.denoised_text:
            for src, m in ((batch["caption_src1"], txt_mask[:B]), (batch["caption_src2"], txt_mask[B:])):
                hit = m.gather(1, src.clamp_min(0)) & (src >= 0)  # (B, T)
                masked_pos |= hit
            caption = caption.masked_fill(masked_pos, self.tokenizer.mask_id)
        loss_fdg = self._caption_loss(caption, memory, ignore=masked_pos if c.ignore_masked_targets else None)
        loss = loss_nim + loss_mir + loss_fdg
        return {
            "loss": loss,
            "nim": loss_nim.detach(),
            "mir": loss_mir.detach(),
            "fdg": loss_fdg.detach(),
            "img_mask_frac": img_mask.float().mean(),
            "txt_mask_frac": (txt_mask.sum() / words.sum().clamp_min(1)).float(),
        }

    def _caption_loss(
        self, caption: torch.Tensor, memory: torch.Tensor, ignore: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Next-token CE of (B, T) ``caption`` ([BOS] ... [EOS] pad) given memory; padding after [EOS] ignored."""
        inputs, targets = caption[:, :-1], caption[:, 1:].clone()  # (B, T - 1)
        ar = torch.arange(targets.shape[1], device=caption.device)[None]
        eos = _first_index(targets, self.tokenizer.eos_id)[:, None]
        skip = ar > eos
        if ignore is not None:
            skip |= ignore[:, 1:]
        targets[skip] = -100
        return ops.caption_ce(self.fdg(inputs, memory), targets)

    def finetune_step(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """One fine-tuning forward pass: MIR interaction + FDG on a reference caption (no masks, no NIM).

        Args:
            batch: ``image1``, ``image2`` (B, 3, H, W) in [0, 1]; ``caption`` (B, T) ids ``[BOS] ... [EOS] pad``;
                optional ``grid1``, ``grid2`` (B, N, C) pre-extracted grid features.

        Returns:
            ``loss`` and ``fdg`` (the same scalar).
        """
        memory = self.encode_pair(batch["image1"], batch["image2"], batch.get("grid1"), batch.get("grid2"))
        loss = self._caption_loss(batch["caption"], memory)
        return {"loss": loss, "fdg": loss.detach()}

    # ------------------------------------------------------------------------------------------ inference

    def encode_pair(
        self,
        images_1: torch.Tensor | None,
        images_2: torch.Tensor | None,
        grid_1: torch.Tensor | None = None,
        grid_2: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """E_MIR of image pairs without masks: ResNet grid -> embedding -> co-attention -> fusion.

        Args:
            images_1: (B, 3, H, W) in [0, 1] (ignored when ``grid_1`` is given).
            images_2: (B, 3, H, W) in [0, 1].
            grid_1: (B, N, C) pre-extracted grid features of the first images, optional.
            grid_2: (B, N, C) likewise for the second images.

        Returns:
            (B, N, D) memory for FDG.
        """
        if grid_1 is None or grid_2 is None:
            B = images_1.shape[0]
            grid = self.grid(torch.cat([images_1, images_2]))  # (2B, N, C)
            grid_1, grid_2 = grid[:B], grid[B:]
        return self.mir.interact(self.mir.embed(grid_1), self.mir.embed(grid_2))

    @torch.inference_mode()
    def generate_ids(
        self,
        images_1: torch.Tensor | None,
        images_2: torch.Tensor | None,
        max_new_tokens: int | None = None,
        num_beams: int = 1,
        grid_1: torch.Tensor | None = None,
        grid_2: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Caption ids (B, T) for image pairs (greedy by default, at most ``config.max_new_tokens``)."""
        memory = self.encode_pair(images_1, images_2, grid_1, grid_2)
        return self.fdg.generate(memory, max_new_tokens or self.config.max_new_tokens, num_beams)

    def generate(
        self,
        images_1: torch.Tensor,
        images_2: torch.Tensor,
        max_new_tokens: int | None = None,
        num_beams: int = 1,
    ) -> list[str]:
        """Describe what changed from each first image to its second image.

        Call ``model.eval()`` first (``from_pretrained`` returns an eval-mode model); dropout is active otherwise.

        Args:
            images_1: (B, 3, H, W) in [0, 1], ``config.image_size`` square.
            images_2: (B, 3, H, W) in [0, 1].
            max_new_tokens: at most this many generated tokens (default ``config.max_new_tokens``, 23).
            num_beams: 1 for greedy (the paper); more for beam search.

        Returns:
            one caption per pair.
        """
        ids = self.generate_ids(images_1, images_2, max_new_tokens, num_beams)
        return [self.tokenizer.decode(row.tolist()) for row in ids]

    @torch.inference_mode()
    def generate_reference(
        self, images_1: torch.Tensor, images_2: torch.Tensor, max_new_tokens: int | None = None
    ) -> torch.Tensor:
        """Naive greedy decoding for comparison: every step re-encodes both images, re-runs the decoder over the
        whole prefix without a cache and projects every position onto the vocabulary (how the CLIP4IDC reference
        code decodes). Returns the same (B, T) ids as :meth:`generate_ids` with ``num_beams=1``.
        """
        steps = max_new_tokens or self.config.max_new_tokens
        B = images_1.shape[0]
        tokens = torch.full((B, 1), self.tokenizer.bos_id, dtype=torch.long, device=images_1.device)
        finished = torch.zeros(B, dtype=torch.bool, device=images_1.device)
        for _ in range(steps):
            memory = self.encode_pair(images_1, images_2)
            logits = self.fdg(tokens, memory)  # (B, t, V): every position projected
            nxt = logits[:, -1].argmax(dim=-1)
            nxt = nxt.masked_fill(finished, self.tokenizer.pad_id)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            finished |= nxt == self.tokenizer.eos_id
            if bool(finished.all()):
                break
        out = tokens[:, 1:]
        used = (out != self.tokenizer.pad_id).any(dim=0).nonzero()
        return out[:, : int(used.max()) + 1 if used.numel() else 1]

    # ------------------------------------------------------------------------------------------ persistence

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``config.json``, ``model.safetensors`` and the tokenizer files to ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        cfg = dataclasses.replace(self.config, clip_pretrained=None, grid_pretrained=None, vqgan_pretrained=None)
        (directory / CONFIG_FILE).write_text(json.dumps({"namc_version": _version(), **cfg.to_dict()}, indent=2))
        save_safetensors(self.state_dict(), directory / WEIGHTS_FILE)
        self.tokenizer.save(directory)
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, map_location: str | torch.device = "cpu") -> NAMC:
        """Rebuild a model saved by :meth:`save_pretrained` (strict: every key must match); returns it in eval mode."""
        directory = Path(directory)
        cfg_path = directory / CONFIG_FILE
        if not cfg_path.is_file():
            raise FileNotFoundError(
                f"{cfg_path} not found: a NAMC model folder holds {CONFIG_FILE}, {WEIGHTS_FILE} and tokenizer.json, "
                "as written by model.save_pretrained(dir) or `namc fit` / `namc demo`"
            )
        data = json.loads(cfg_path.read_text())
        data.pop("namc_version", None)
        config = NAMCConfig.from_dict(data)
        model = cls(config, load_tokenizer(directory))
        sd = load_state_dict(directory / WEIGHTS_FILE, hint="the model.safetensors written by save_pretrained")
        load_strict(model, sd, what=f"NAMC weights from {directory}")
        return model.to(map_location).eval()


def _version() -> str:
    from namc import __version__

    return __version__
