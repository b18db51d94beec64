"""NAMC: NIM + MIR + FDG composed into one module (paper section 3, Figure 2).

Dimension letters: B pairs, N grid positions (n_I), C grid channels, D width, L description tokens, T caption
tokens, V vocabulary.

The model holds the forward pieces (``relevance``, ``noise_masks``, ``encode_pair``, ``generate``); the training
objectives are functions over it in :mod:`namc.objectives`. Pre-training runs all three modules; fine-tuning and
inference use the ResNet grid, the MIR interaction path and FDG only (section 4: "the NIM module is employed only
during the pre-training"). A model built with ``pretraining=False`` has no NIM towers and no VQGAN at all;
:meth:`NAMC.drop_pretraining_modules` turns a pre-trained model into one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from namc import ops
from namc._version import __version__
from namc.models.calibration import CALIBRATION_FILE, GridCalibration, load_calibration, save_calibration
from namc.models.card import CARD_FILE, check_card, model_card
from namc.models.config import NAMCConfig
from namc.models.encoders import ClipDualEncoder
from namc.models.fdg import FDG, FDGConfig
from namc.models.files import atomic_write_text, record_files
from namc.models.grid import GridEncoder
from namc.models.hub import resolve_model_path
from namc.models.inputs import check_inputs
from namc.models.io import (
    WEIGHTS_FILE,
    load_state_dict,
    load_strict,
    read_config,
    read_tokenizer,
    save_safetensors,
    verify_folder,
    write_config,
)
from namc.models.mir import MIR, MIRConfig
from namc.models.shortlist import SHORTLIST_FILE, Shortlist, load_shortlist, save_shortlist
from namc.models.skip_init import skip_random_init
from namc.models.vqgan import VQGANTokenizer
from namc.text.tokenizer import TOKENIZER_FILE, CaptionTokenizer

logger = logging.getLogger(__name__)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


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
            self.nim.check_image_size(c.image_size)
            text_dim = self.nim.embed_dim
        mir = MIRConfig(
            in_channels=self.grid.out_channels,
            num_positions=n,
            dim=c.dim,
            heads=c.heads,
            layers=c.mir_layers,
            text_dim=text_dim,
            codebook_size=c.vqgan_n_embed if c.pretraining else 0,
            rec_loss=c.rec_loss,
            mlp_ratio=c.mlp_ratio,
            dropout=c.dropout,
            fusion=c.fusion,
        )
        self.mir = MIR(mir)
        fdg = FDGConfig(
            vocab_size=c.vocab_size,
            dim=c.dim,
            heads=c.heads,
            layers=c.fdg_layers,
            max_len=c.max_caption_len,
            pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            mlp_ratio=c.mlp_ratio,
            dropout=c.dropout,
            tie_embeddings=c.tie_embeddings,
        )
        self.fdg = FDG(fdg)
        # the tokens of the captions the model was fine-tuned on (FinetuneModule; kept by save_pretrained and
        # checkpoints): pass it as ``vocabulary=`` to decode over it (namc.models.shortlist); None: no list
        self.training_shortlist: Shortlist | None = None
        # activation peaks of the grid for a runtime's static int8 grid (namc.models.calibration; kept by
        # save_pretrained, not by checkpoints): data only, a runtime reads them; None: uncalibrated
        self.grid_calibration: GridCalibration | None = None

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

    def text_masks(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L) description ids -> ``(words, real)`` (B, L) bool: the word tokens strictly between [SOS] and
        [EOS] (the only ones Eq. 1 scores and noise masking may mask), and the real tokens up to [EOS]."""
        ar = torch.arange(ids.shape[1], device=ids.device)[None]  # (1, L)
        eos = ops.first_index(ids, self.tokenizer.eos_id)[:, None]  # (B, 1)
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
        words, _ = self.text_masks(text)
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
        words, _ = self.text_masks(text)
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
        vocabulary: Shortlist | Iterable[int] | None = None,
    ) -> torch.Tensor:
        """Caption ids (B, T) for image pairs (greedy by default, at most ``config.max_new_tokens``) in eager
        PyTorch, in the model's dtype; ``vocabulary``: the only tokens to generate (:mod:`namc.models.shortlist`),
        None for all. ``namc.compile(model, backend=..., precision=...)`` runs the same on a faster runtime.

        Raises:
            ValueError: what :func:`~namc.models.inputs.check_inputs` refuses (batches of other sizes, shapes or
                dtypes; ``max_new_tokens`` or ``num_beams`` below 1).
        """
        rows = check_inputs(self.config.image_size, (images_1, images_2, grid_1, grid_2), max_new_tokens, num_beams)
        if rows == 0:
            return torch.zeros(0, 0, dtype=torch.long, device=self.fdg.tok.weight.device)
        dtype = self.fdg.pos.dtype  # float64 or float16 pixels run in the activations' dtype
        x = [None if t is None else t.to(dtype) for t in (images_1, images_2, grid_1, grid_2)]
        memory = self.encode_pair(*x)
        n = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        return self.fdg.generate(memory, n, num_beams, vocabulary=vocabulary)

    def shortlist(self, captions: Iterable[str]) -> Shortlist:
        """The tokens of ``captions`` (say, the captions the model was fine-tuned on) as a shortlist for
        ``vocabulary=`` (:mod:`namc.models.shortlist`): decoding projects onto those rows of the vocabulary only."""
        return Shortlist.from_captions(captions, self.tokenizer)

    def generate(
        self,
        images_1: torch.Tensor,
        images_2: torch.Tensor,
        max_new_tokens: int | None = None,
        num_beams: int = 1,
        vocabulary: Shortlist | Iterable[int] | None = None,
    ) -> list[str]:
        """Describe what changed from each first image to its second image.

        Call ``model.eval()`` first (``from_pretrained`` returns an eval-mode model); dropout is active otherwise.
        This is the plain eager model; ``namc.compile(model, backend=..., precision=...)`` returns a captioner with
        the same ``generate`` on a faster runtime and in bf16 or int8 (:mod:`namc.backends.compile`).

        Args:
            images_1: (B, 3, H, W) in [0, 1], ``config.image_size`` square.
            images_2: (B, 3, H, W) in [0, 1].
            max_new_tokens: at most this many generated tokens (default ``config.max_new_tokens``, 23).
            num_beams: 1 for greedy (the paper); more for beam search.
            vocabulary: the only tokens to write, e.g. ``model.shortlist(training_captions)`` or a fine-tuned
                model's ``model.training_shortlist`` (:mod:`namc.models.shortlist`); None (default): the whole
                vocabulary.

        Returns:
            one caption per pair.
        """
        ids = self.generate_ids(images_1, images_2, max_new_tokens, num_beams, vocabulary=vocabulary)
        return [self.tokenizer.decode(row.tolist()) for row in ids]

    # ------------------------------------------------------------------------------------------ persistence

    def save_pretrained(self, directory: str | Path, card: Mapping[str, Any] | None = None) -> Path:
        """Write a complete model folder: ``model.safetensors``, the tokenizer files, ``config.json``, a model
        card ``README.md``, where the model has a ``grid_calibration`` for its grid's weights
        ``int8_calibration.json`` (:mod:`namc.models.calibration`), and where the model has a ``training_shortlist``
        ``shortlist.json``.

        ``config.json`` records the size and SHA-256 of every other file the model is rebuilt from
        (:mod:`namc.models.files`), so :meth:`from_pretrained` notices a damaged or replaced file; it is written
        after them, through a rename, so an interrupted save never leaves a config that vouches for missing files.

        Args:
            directory: the folder (created if needed; the files of an earlier save there are replaced).
            card: optional model-card data: ``training_data``, ``metrics``, ``notes``, ``license``
                (:mod:`namc.models.card`).

        Returns:
            ``directory`` as a Path.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        check_card(card or {})  # an unknown card key fails before anything is written
        cfg = dataclasses.replace(self.config, clip_pretrained=None, grid_pretrained=None, vqgan_pretrained=None)
        partial = directory / f".{WEIGHTS_FILE}.partial"
        save_safetensors(self.state_dict(), partial)
        os.replace(partial, directory / WEIGHTS_FILE)
        self.tokenizer.save(directory)
        bpe = json.loads((directory / TOKENIZER_FILE).read_text()).get("bpe")  # a CLIP BPE copies its vocabulary
        calibration = save_calibration(self.grid_calibration, self.grid, directory)  # a static int8 grid's scales
        shortlist = save_shortlist(self.training_shortlist, directory)
        extra = [name for name in (bpe, calibration, shortlist) if isinstance(name, str)]
        files = record_files(directory, [WEIGHTS_FILE, TOKENIZER_FILE, *extra])
        write_config(directory, cfg, __version__, files)
        tokenizer = f"{cfg.tokenizer}, {self.tokenizer.vocab_size} ids"
        readme = model_card(cfg.to_dict(), self.num_parameters(), tokenizer, files, __version__, card)
        atomic_write_text(directory / CARD_FILE, readme)
        return directory

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, map_location: str | torch.device = "cpu", verify: bool = True
    ) -> NAMC:
        """Rebuild a model saved by :meth:`save_pretrained` (strict: every key must match); returns it in eval mode.

        Args:
            directory: the model folder.
            map_location: the device the model goes to.
            verify: first check every file against the SHA-256 that ``config.json`` records (about a second per
                GB); ``False`` skips it. A folder saved before namc recorded digests loads unchecked either way.

        Raises:
            FileNotFoundError: the folder or one of its files is missing.
            ConfigError: ``config.json`` or ``tokenizer.json`` is unreadable (the message names the file and where).
            WeightsError: a file does not match its recorded digest, or the weights do not fit the config.
        """
        directory = resolve_model_path(directory)
        if directory.is_file():
            raise ValueError(
                f"{directory} is a file: from_pretrained takes a folder written by save_pretrained (namc.load_model "
                "also reads a namc .ckpt)"
            )
        config = read_config(directory)
        checked = verify_folder(directory) if verify else None
        if checked == []:
            logger.info("%s records no SHA-256 digests (saved before namc recorded them): not verified", directory)
        tokenizer = read_tokenizer(directory)
        with skip_random_init():  # every weight comes from the file, loaded strictly below
            model = cls(config, tokenizer)
        sd = load_state_dict(directory / WEIGHTS_FILE, hint="the model.safetensors written by save_pretrained")
        load_strict(model, sd, what=f"NAMC weights from {directory}")
        model = model.to(map_location).eval()
        unrecorded = [
            name
            for name in (CALIBRATION_FILE, SHORTLIST_FILE)
            if checked and name not in checked and (directory / name).exists()
        ]
        for name in unrecorded:
            logger.warning("%s: %s is not recorded in config.json: ignored", directory, name)
        if CALIBRATION_FILE not in unrecorded:
            model.grid_calibration = load_calibration(model.grid, directory)
        if SHORTLIST_FILE not in unrecorded:
            model.training_shortlist = load_shortlist(directory, model.tokenizer)
        return model
