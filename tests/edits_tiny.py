"""Tiny random diffusers pipelines, saved in the official layout, for the edit-pair engines' tests.

Every builder makes real diffusers / transformers components from small configs (random weights), assembles the
pipeline class a user's weights would use and writes it with ``save_pretrained`` (``model_index.json``, one folder
per component, safetensors), so that a test loads it through :func:`namc.curate.edits.backends.build` exactly as a
downloaded model is loaded. Images are 32x32 (16x16 latents: the VAE downsamples by 2); two steps are enough.

- :func:`text_to_image` (``StableDiffusionPipeline``) and :func:`text_to_image_xl` (``StableDiffusionXLPipeline``);
- :func:`inpainting` (``StableDiffusionInpaintPipeline``, a 9-channel UNet: latents, mask, masked-image latents);
- :func:`instruct_pix2pix` (``StableDiffusionInstructPix2PixPipeline``, an 8-channel UNet: latents, image latents).

The CLIP tokenizer is a byte-level BPE whose vocabulary holds every byte (alone and word-final) plus a few whole
words (:data:`WORDS`), written as ``vocab.json`` / ``merges.txt`` into the folder.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

SIZE = 32  #: image side, pixels
#: words that tokenize to one token; any other word becomes one token per character
WORDS = ("a", "photo", "of", "red", "blue", "cat", "dog", "on", "the", "table", "background", "nothing", "8k")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / CLIP's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def tokenizer(folder: Path) -> Any:
    """A CLIP tokenizer over a tiny BPE vocabulary, written into ``folder`` and loaded from it."""
    from transformers import CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    chars = list(_bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for token in [*chars, *(c + "</w>" for c in chars)]:
        vocab.setdefault(token, len(vocab))
    merges: list[str] = []
    for word in WORDS:  # left to right: 'c a', 'ca t</w>'
        pieces = [*word[:-1], word[-1] + "</w>"]
        while len(pieces) > 1:
            merges.append(f"{pieces[0]} {pieces[1]}")
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
            vocab.setdefault(pieces[0], len(vocab))
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(dict.fromkeys(merges)) + "\n", encoding="utf-8")
    return CLIPTokenizer(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"), model_max_length=77)


def _tokenizer() -> Any:
    with tempfile.TemporaryDirectory() as tmp:  # the pipeline's save_pretrained writes its own copy
        return tokenizer(Path(tmp))


def _text_encoder(vocab_size: int, projection: bool = False) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=2,
        projection_dim=32,
        max_position_embeddings=77,
        bos_token_id=vocab_size - 2,
        eos_token_id=vocab_size - 1,
        pad_token_id=vocab_size - 1,
    )
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config).eval()


def _vae() -> Any:
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=(8, 8),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        norm_num_groups=4,
        sample_size=SIZE,
    ).eval()


def _unet(in_channels: int, **extra: Any) -> Any:
    from diffusers import UNet2DConditionModel

    config: dict[str, Any] = {
        "block_out_channels": (8, 16),
        "layers_per_block": 1,
        "sample_size": SIZE // 2,
        "in_channels": in_channels,
        "out_channels": 4,
        "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
        "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"),
        "cross_attention_dim": 32,
        "attention_head_dim": 2,
        "norm_num_groups": 4,
    }
    config.update(extra)
    return UNet2DConditionModel(**config).eval()


def _scheduler() -> Any:
    from diffusers import DDIMScheduler

    return DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )


def _save(pipe: Any, folder: Path) -> Path:
    pipe.save_pretrained(folder)  # safetensors, model_index.json, one folder per component
    return folder


def _safety_checker() -> tuple[Any, Any]:
    """A tiny ``StableDiffusionSafetyChecker`` whose thresholds flag every image, and its image processor."""
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig, CLIPImageProcessor

    config = CLIPConfig(
        text_config={"hidden_size": 32, "intermediate_size": 37, "num_attention_heads": 2, "num_hidden_layers": 1},
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "image_size": SIZE,
            "patch_size": 8,
        },  # fmt: skip
        projection_dim=32,
    )
    checker = StableDiffusionSafetyChecker(config).eval()
    with torch.no_grad():  # flagged when cos(image, concept) - weight > 0: a weight of -2 flags any image
        checker.concept_embeds_weights.fill_(-2.0)
    processor = CLIPImageProcessor(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE})
    return checker, processor


def text_to_image(folder: Path, seed: int = 0, flag_everything: bool = False) -> Path:
    """A tiny ``StableDiffusionPipeline`` (SD 1.x layout, DDIM) saved into ``folder``; no safety checker, or with
    ``flag_everything`` one that flags every image as NSFW."""
    from diffusers import StableDiffusionPipeline

    torch.manual_seed(seed)
    tok = _tokenizer()
    checker, processor = _safety_checker() if flag_everything else (None, None)
    pipe = StableDiffusionPipeline(
        vae=_vae(),
        text_encoder=_text_encoder(len(tok)),
        tokenizer=tok,
        unet=_unet(4),
        scheduler=_scheduler(),
        safety_checker=checker,
        feature_extractor=processor,
        requires_safety_checker=flag_everything,
    )
    return _save(pipe, folder)


def text_to_image_xl(folder: Path, seed: int = 0) -> Path:
    """A tiny ``StableDiffusionXLPipeline`` (two text encoders, ``text_time`` conditions) saved into ``folder``."""
    from diffusers import StableDiffusionXLPipeline

    torch.manual_seed(seed)
    tok = _tokenizer()
    unet = _unet(
        4,
        cross_attention_dim=64,  # the two encoders' hidden states, concatenated: 32 + 32
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + 32,  # six size/crop numbers + the pooled projection
        use_linear_projection=True,
    )
    pipe = StableDiffusionXLPipeline(
        vae=_vae(),
        text_encoder=_text_encoder(len(tok)),
        text_encoder_2=_text_encoder(len(tok), projection=True),
        tokenizer=tok,
        tokenizer_2=tok,
        unet=unet,
        scheduler=_scheduler(),
        force_zeros_for_empty_prompt=True,
    )
    return _save(pipe, folder)


def inpainting(folder: Path, seed: int = 0) -> Path:
    """A tiny ``StableDiffusionInpaintPipeline`` (9 input channels) saved into ``folder``."""
    from diffusers import StableDiffusionInpaintPipeline

    torch.manual_seed(seed)
    tok = _tokenizer()
    pipe = StableDiffusionInpaintPipeline(
        vae=_vae(),
        text_encoder=_text_encoder(len(tok)),
        tokenizer=tok,
        unet=_unet(9),
        scheduler=_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    return _save(pipe, folder)


def instruct_pix2pix(folder: Path, seed: int = 0) -> Path:
    """A tiny ``StableDiffusionInstructPix2PixPipeline`` (8 input channels) saved into ``folder``."""
    from diffusers import StableDiffusionInstructPix2PixPipeline

    torch.manual_seed(seed)
    tok = _tokenizer()
    pipe = StableDiffusionInstructPix2PixPipeline(
        vae=_vae(),
        text_encoder=_text_encoder(len(tok)),
        tokenizer=tok,
        unet=_unet(8),
        scheduler=_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    return _save(pipe, folder)
