"""Tiny random region-tool models in the official layouts, and a shapes-world multimodal LLM for the Img-Diff tests.

Each builder writes what a user downloads (an open_clip state dict; a transformers folder with ``config.json``,
``model.safetensors`` and the processor's files) so the tests load them through namc's own loading code.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from namc.data.synthetic.scene import COLORS

#: a tiny ViT-B/32-shaped open_clip config; the vocabulary is the real tokenizer's, so its ids fit
TINY_CLIP: dict[str, Any] = {
    "embed_dim": 16,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 1, "layers": 1},
}

_WORDS = ["a", "an", "the", "small", "large", "red", "blue", "green", "gray", "yellow", "metal", "rubber"]
_WORDS += ["cube", "sphere", "cylinder", "object", "image", "of", "is"]


def tiny_clip(folder: Path) -> Path:
    """A random tiny CLIP as ``open_clip_model.safetensors`` (open_clip's key layout)."""
    import open_clip
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = open_clip.CLIP(**TINY_CLIP)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def _bert_tokenizer(folder: Path) -> Any:
    from transformers import BertTokenizerFast

    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", *_WORDS]) + "\n")
    return BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True, bos_token="[DEC]")


def tiny_blip(folder: Path) -> Path:
    """A random tiny ``BlipForImageTextRetrieval`` folder with its ``BlipProcessor``."""
    from transformers import BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor, BlipProcessor

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _bert_tokenizer(folder)
    config = BlipConfig(
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "encoder_hidden_size": 32,
            "max_position_embeddings": 32,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "sep_token_id": tokenizer.sep_token_id,
            "eos_token_id": tokenizer.sep_token_id,
        },
        projection_dim=16,
        image_text_hidden_size=16,
    )
    BlipForImageTextRetrieval(config).eval().save_pretrained(folder)
    BlipProcessor(BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer).save_pretrained(folder)
    return folder


def tiny_sam(folder: Path) -> Path:
    """A random tiny ``SamModel`` folder (128 px input) with its ``SamProcessor``."""
    from transformers import SamConfig, SamImageProcessor, SamModel, SamProcessor

    torch.manual_seed(0)
    config = SamConfig(
        vision_config={
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "mlp_dim": 64,
            "image_size": 128,
            "patch_size": 16,
            "output_channels": 32,
            "window_size": 4,
            "global_attn_indexes": [1],
            "num_pos_feats": 16,
        },
        prompt_encoder_config={"hidden_size": 32, "image_size": 128, "patch_size": 16, "mask_input_channels": 4},
        mask_decoder_config={
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "mlp_dim": 64,
            "iou_head_hidden_dim": 32,
        },
    )
    folder.mkdir(parents=True, exist_ok=True)
    SamModel(config).eval().save_pretrained(folder)
    processor = SamImageProcessor(
        size={"longest_edge": 128},
        pad_size={"height": 128, "width": 128},
        mask_size={"longest_edge": 32},
        mask_pad_size={"height": 32, "width": 32},
    )
    SamProcessor(processor).save_pretrained(folder)
    return folder


def add_snapshot(cache: Path, repo_id: str, folder: Path, commit: str = "c" * 40) -> Path:
    """``folder``'s files as the ``main`` snapshot of ``repo_id`` in a Hub cache, in the layout ``snapshot_download``
    leaves (``blobs/``, ``snapshots/<commit>/`` links, ``refs/main``)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in sorted(folder.iterdir()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


# ---------------------------------------------------------------------------------------------------------------
# A shapes-world multimodal LLM: answers Img-Diff's prompts from the images and texts it is sent
# ---------------------------------------------------------------------------------------------------------------

_NAME = re.compile(r"(small|large) (\w+) (rubber|metal) (cube|sphere|cylinder)")


def _colour_word(image: Image.Image) -> str | None:
    """The CLEVR colour nearest to the most saturated pixels of a crop, or None for bare floor."""
    rgb = np.asarray(image, dtype=np.float32).reshape(-1, 3)  # (N, 3)
    sat = rgb.max(axis=1) - rgb.min(axis=1)
    if (sat > 40).sum() < 4:
        grey = rgb[np.abs(rgb - rgb.mean(axis=1, keepdims=True)).max(axis=1) < 6]
        return "gray" if len(grey) and (grey.mean() < 110) else None
    top = rgb[sat >= np.quantile(sat, 0.7)].mean(axis=0)
    return min(COLORS, key=lambda c: float(np.square(np.array(COLORS[c]) - top).sum()))


def shapes_answer(text: str, images: list[bytes]) -> str:
    """What a careful MLLM answers to Img-Diff's prompts in the shapes world (an ``answer`` of
    ``tests/llm_server.py``): an object replacement for a caption, a difference sentence from the two region captions
    in the prompt, or a one-phrase caption (its colour) of a crop or of the bounding box named in the prompt."""
    if "Caption:" in text:
        caption = text.rsplit("Caption:", 1)[-1].strip().splitlines()[0]
        m = _NAME.search(caption)
        if m is None:
            return "I'm sorry, I cannot find an object to replace."
        color = "yellow" if m.group(2) != "yellow" else "cyan"
        shape = {"cube": "sphere", "sphere": "cylinder", "cylinder": "cube"}[m.group(4)]
        new = f"{m.group(1)} {color} {m.group(3)} {shape}"
        return json.dumps({"original": m.group(0), "replacement": new, "caption": caption.replace(m.group(0), new)})
    if "Describe the difference" in text:
        m = re.search(r"the first image shows (.+?) and the second image shows (.+?)\. Describe", text)
        if m is None:
            return ""
        return f"The difference is that the left image has {m.group(1)} where the right image has {m.group(2)}."
    if len(images) != 1:
        return "The first image shows one object, while the second image shows another."
    image = Image.open(io.BytesIO(images[0])).convert("RGB")
    box = re.search(r"\[([\d.]+), ([\d.]+), ([\d.]+), ([\d.]+)\]", text)
    if box:
        w, h = image.size
        x0, y0, x1, y1 = (float(v) for v in box.groups())
        image = image.crop(
            (round(x0 * w), round(y0 * h), max(round(x1 * w), round(x0 * w) + 1), max(round(y1 * h), round(y0 * h) + 1))
        )
    colour = _colour_word(image)
    return f"a {colour} object" if colour else "nothing"
