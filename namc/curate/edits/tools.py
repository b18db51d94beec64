"""The region tools of Img-Diff (``002``, section 18.3): image and text similarity, image-text matching, segmentation.

Each tool is a small class with one job, built by a ``load_*`` function from a local folder, a weights file or an
``hf-hub:`` id in the local Hugging Face cache (looked up with ``local_files_only``: namc never downloads); a
missing one is a :class:`~namc.curate.edits.base.BackendError` whose one line says what to download and where to put
it:

- :class:`ClipScorer` (open_clip): cosine similarity of two images (the Image Similarity Filter: pair band
  [0.9, 0.98], crops < 0.85 differ) and of two texts (the Captions Similarity Filter: < 0.85 differ). The paper's
  model is ``clip-vit-base-patch32``: open_clip's ``ViT-B-32`` with tag ``openai``, file
  ``open_clip_pytorch_model.bin`` (or ``open_clip_model.safetensors``) of ``timm/vit_base_patch32_clip_224.openai``.
- :class:`BlipMatcher` (transformers ``BlipForImageTextRetrieval``): the ITM head's probability that a crop shows
  a text (boxes > 0.35, captions > 0.4; removal > 0.35 with the object, < 0.2 without). The paper's model:
  ``Salesforce/blip-itm-large-coco``.
- :class:`SamSegmenter` (transformers ``mask-generation`` with ``SamModel``): automatic masks and their boxes. The
  paper runs FastSAM-x (conf 0.05, IoU 0.5); FastSAM's package (ultralytics) is AGPL-3.0, so namc drives SAM
  (Apache-2.0, ``facebook/sam-vit-base``) with the same thresholds: ``pred_iou_thresh`` 0.05 and box NMS at IoU 0.5.

Stand-ins for renders whose truth is known (the shapes world, hand-made test images), built from the same sections:
:class:`PixelSimilarity` (structural similarity of pixels; a text similarity of word overlap),
:class:`ForegroundSegmenter` (connected components of what differs from the per-row floor colour) and
:class:`ShapesMatcher` (whether a crop holds a shapes-world object the text names).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from namc.curate.edits.base import BackendError

__all__ = [
    "BLIP_HINT",
    "CROP_KEY",
    "CLIP_HINT",
    "SAM_HINT",
    "BlipMatcher",
    "Box",
    "ClipScorer",
    "ForegroundSegmenter",
    "Matcher",
    "PixelSimilarity",
    "SamSegmenter",
    "Segmenter",
    "ShapesMatcher",
    "Similarity",
    "box_iou",
    "check_tools",
    "build_matcher",
    "build_segmenter",
    "build_similarity",
    "crop",
    "load_blip",
    "load_clip",
    "load_sam",
    "nms",
]

logger = logging.getLogger(__name__)

Box = tuple[int, int, int, int]  # (x0, y0, x1, y1) pixels, ends exclusive
CROP_KEY = "namc_crop"  # where a crop came from, in its image.info

CLIP_HINT = (
    "download open_clip_pytorch_model.bin (or open_clip_model.safetensors) of timm/vit_base_patch32_clip_224.openai "
    "(the paper's clip-vit-base-patch32) and set clip_weights to its path"
)
BLIP_HINT = (
    "download Salesforce/blip-itm-large-coco (huggingface-cli download Salesforce/blip-itm-large-coco) and set "
    "blip to its folder or to hf-hub:Salesforce/blip-itm-large-coco"
)
SAM_HINT = (
    "download facebook/sam-vit-base (huggingface-cli download facebook/sam-vit-base) and set sam to its folder or to "
    "hf-hub:facebook/sam-vit-base"
)


# ---------------------------------------------------------------------------------------------------------------
# Boxes
# ---------------------------------------------------------------------------------------------------------------


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``(x0, y0, x1, y1)`` boxes (0 for empty ones)."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, w) * max(0.0, h)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def nms(boxes: Sequence[Box], scores: Sequence[float], iou: float) -> list[int]:
    """Greedy non-maximum suppression: indices of the kept boxes, best score first; a box whose IoU with a kept
    one is *above* ``iou`` is dropped (the paper's IoU 0.5 de-duplication)."""
    keep: list[int] = []
    for i in sorted(range(len(boxes)), key=lambda k: -scores[k]):
        if all(box_iou(boxes[i], boxes[j]) <= iou for j in keep):
            keep.append(i)
    return keep


def crop(image: Image.Image, box: Sequence[int]) -> Image.Image:
    """The crop of ``box`` (clipped to the image); ``info[CROP_KEY]`` records ``x0,y0,x1,y1,W,H`` of the source."""
    w, h = image.size
    x0, y0, x1, y1 = (max(0, min(int(v), lim)) for v, lim in zip(box, (w, h, w, h), strict=True))
    x1, y1 = max(x1, min(x0 + 1, w)), max(y1, min(y0 + 1, h))
    out = image.crop((x0, y0, x1, y1))
    out.info[CROP_KEY] = f"{x0},{y0},{x1},{y1},{w},{h}"
    return out


# ---------------------------------------------------------------------------------------------------------------
# Protocols
# ---------------------------------------------------------------------------------------------------------------


class Similarity(Protocol):
    def image_similarity(self, a: Sequence[Image.Image], b: Sequence[Image.Image]) -> list[float]: ...

    def text_similarity(self, a: Sequence[str], b: Sequence[str]) -> list[float]: ...


class Matcher(Protocol):
    def match(self, images: Sequence[Image.Image], texts: Sequence[str]) -> list[float]: ...


class Segmenter(Protocol):
    def segment(self, image: Image.Image) -> list[tuple[Box, float]]: ...


# ---------------------------------------------------------------------------------------------------------------
# Hub references
# ---------------------------------------------------------------------------------------------------------------


def _resolve(source: str | Path | None, hint: str, what: str) -> str:
    """A local folder, or the snapshot folder of an ``hf-hub:`` id in the local cache; BackendError otherwise."""
    if source is None or str(source).strip() == "":
        raise BackendError(f"{what}: no model given; {hint}")
    text = str(source)
    if text.startswith("hf-hub:"):
        from namc.models.hub import parse_hub_id

        try:
            from huggingface_hub import snapshot_download
            from huggingface_hub.errors import LocalEntryNotFoundError
        except ImportError:  # pragma: no cover - transformers requires huggingface_hub
            raise BackendError(f"{what}: huggingface_hub is missing; pip install 'namc[edits]'") from None
        try:
            repo_id, revision = parse_hub_id(text)
        except ValueError as err:
            raise BackendError(f"{what}: {err}") from None
        try:  # the cache is read where HF_HUB_CACHE points now, not where it pointed when huggingface_hub loaded
            cache = os.environ.get("HF_HUB_CACHE") or None
            return snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True)
        except (LocalEntryNotFoundError, OSError, ValueError):
            raise BackendError(f"{what}: {text} is not in the local Hugging Face cache; {hint}") from None
    path = Path(text).expanduser()
    if not path.exists():
        raise BackendError(f"{what}: no folder or file at {path}; {hint}")
    return str(path)


def _device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# ---------------------------------------------------------------------------------------------------------------
# CLIP (open_clip)
# ---------------------------------------------------------------------------------------------------------------


class ClipScorer:
    """Cosine similarities of CLIP features (images through the visual tower, texts through the text tower).

    Args:
        model: an ``open_clip.CLIP`` in eval mode.
        transform: open_clip's eval preprocessing of the weights.
        tokenizer: open_clip's tokenizer of the config.
        device: where the model runs.
        batch_size: images or texts per forward.
    """

    def __init__(self, model: Any, transform: Any, tokenizer: Any, device: torch.device, batch_size: int = 32) -> None:
        self.model, self.transform, self.tokenizer = model, transform, tokenizer
        self.device, self.batch_size = device, batch_size

    @torch.inference_mode()
    def image_features(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """``(B, D)`` unit-norm image features."""
        out = []
        for i in range(0, len(images), self.batch_size):
            x = torch.stack([self.transform(im.convert("RGB")) for im in images[i : i + self.batch_size]])
            out.append(self.model.encode_image(x.to(self.device), normalize=True).float().cpu())  # (b, D)
        return torch.cat(out) if out else torch.zeros(0, 1)

    @torch.inference_mode()
    def text_features(self, texts: Sequence[str]) -> torch.Tensor:
        """``(B, D)`` unit-norm text features."""
        out = []
        for i in range(0, len(texts), self.batch_size):
            tokens = self.tokenizer(list(texts[i : i + self.batch_size]))  # (b, context_length)
            out.append(self.model.encode_text(tokens.to(self.device), normalize=True).float().cpu())  # (b, D)
        return torch.cat(out) if out else torch.zeros(0, 1)

    def image_similarity(self, a: Sequence[Image.Image], b: Sequence[Image.Image]) -> list[float]:
        fa, fb = self.image_features(a), self.image_features(b)
        return (fa * fb).sum(-1).tolist()

    def text_similarity(self, a: Sequence[str], b: Sequence[str]) -> list[float]:
        fa, fb = self.text_features(a), self.text_features(b)
        return (fa * fb).sum(-1).tolist()


def load_clip(
    weights: str | Path | None,
    clip_model: str | Mapping[str, Any] = "ViT-B-32",
    tag: str | None = "openai",
    device: str | None = None,
    batch_size: int = 32,
) -> ClipScorer:
    """A :class:`ClipScorer` of an open_clip-layout state dict, loaded strictly through namc's one loader.

    Args:
        weights: ``open_clip_pytorch_model.bin`` / ``open_clip_model.safetensors`` (see :data:`CLIP_HINT`).
        clip_model: an open_clip config name, or a config dict of the same form (tests build tiny ones).
        tag: open_clip's pretrained tag (QuickGELU and the normalisation); None: the config's own.
        device: ``cpu``, ``cuda``, ... (default: CUDA when present).
        batch_size: images or texts per forward.
    """
    if weights is None or not Path(weights).expanduser().is_file():
        raise BackendError(f"CLIP weights: no file at {weights}; {CLIP_HINT}")
    import copy

    import open_clip
    from open_clip.pretrained import get_pretrained_cfg

    from namc.models.io import load_state_dict, load_strict

    if isinstance(clip_model, str):
        cfg = open_clip.get_model_config(clip_model)
        if cfg is None:
            raise BackendError(f"CLIP: unknown open_clip config {clip_model!r}; see open_clip.list_models()")
    else:
        cfg = dict(clip_model)
    cfg = copy.deepcopy(cfg)
    pretrained = get_pretrained_cfg(clip_model, tag) if tag is not None and isinstance(clip_model, str) else {}
    if pretrained:
        cfg["quick_gelu"] = bool(pretrained.get("quick_gelu", cfg.get("quick_gelu", False)))
    for key in ("custom_text", "hf_tokenizer_name", "tokenizer_kwargs"):
        cfg.pop(key, None)
    model = open_clip.CLIP(**cfg)
    path = Path(weights).expanduser()
    load_strict(model, load_state_dict(path, hint=CLIP_HINT), what=f"CLIP from {path}")
    dev = _device(device)
    model = model.eval().requires_grad_(False).to(dev)
    transform = open_clip.image_transform(
        cfg["vision_cfg"]["image_size"],
        is_train=False,
        mean=pretrained.get("mean"),
        std=pretrained.get("std"),
        interpolation=pretrained.get("interpolation"),
        resize_mode=pretrained.get("resize_mode"),
    )
    context = int(cfg.get("text_cfg", {}).get("context_length", 77))
    tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=context)
    return ClipScorer(model, transform, tokenizer, dev, batch_size)


# ---------------------------------------------------------------------------------------------------------------
# BLIP image-text matching (transformers)
# ---------------------------------------------------------------------------------------------------------------


class BlipMatcher:
    """BLIP's image-text matching head: ``softmax(itm_logits)[:, 1]``, the probability that the image shows the text.

    Args:
        model: a ``BlipForImageTextRetrieval``.
        processor: its ``BlipProcessor``.
        device: where the model runs.
        batch_size: pairs per forward.
    """

    def __init__(self, model: Any, processor: Any, device: torch.device, batch_size: int = 16) -> None:
        self.model, self.processor, self.device, self.batch_size = model, processor, device, batch_size

    @torch.inference_mode()
    def match(self, images: Sequence[Image.Image], texts: Sequence[str]) -> list[float]:
        out: list[float] = []
        for i in range(0, len(images), self.batch_size):
            batch = self.processor(
                images=[im.convert("RGB") for im in images[i : i + self.batch_size]],
                text=list(texts[i : i + self.batch_size]),
                return_tensors="pt",
                padding=True,
                truncation=True,
            ).to(self.device)
            logits = self.model(**batch, use_itm_head=True).itm_score  # (b, 2)
            out.extend(torch.softmax(logits.float(), dim=-1)[:, 1].tolist())
        return out


def load_blip(source: str | Path | None, device: str | None = None, batch_size: int = 16) -> BlipMatcher:
    """A :class:`BlipMatcher` from a folder in the official layout (``config.json``, ``model.safetensors``, the
    processor's files) or an ``hf-hub:`` id in the local cache (see :data:`BLIP_HINT`)."""
    path = _resolve(source, BLIP_HINT, "BLIP")
    try:
        from transformers import BlipForImageTextRetrieval, BlipProcessor
    except ImportError:
        raise BackendError("BLIP: transformers is not installed; pip install 'namc[edits]'") from None
    try:
        processor = BlipProcessor.from_pretrained(path, local_files_only=True)
        model = BlipForImageTextRetrieval.from_pretrained(path, local_files_only=True, use_safetensors=True)
    except (OSError, ValueError) as err:
        raise BackendError(f"BLIP: cannot load {path}: {str(err).splitlines()[0]}; {BLIP_HINT}") from None
    dev = _device(device)
    return BlipMatcher(model.eval().requires_grad_(False).to(dev), processor, dev, batch_size)


# ---------------------------------------------------------------------------------------------------------------
# SAM automatic masks (transformers)
# ---------------------------------------------------------------------------------------------------------------


class SamSegmenter:
    """SAM's automatic mask generation (a grid of point prompts), each mask reduced to its box and score.

    Args:
        generator: a transformers ``mask-generation`` pipeline.
        conf: the lowest predicted-IoU score a mask keeps (the paper's FastSAM confidence 0.05).
        iou: box NMS threshold across masks (the paper's 0.5).
        points_per_batch: point prompts per forward of the mask decoder.
        points_per_side: the prompt grid's side (SAM's default 32).
        min_area: masks smaller than this many pixels are dropped (specks).
    """

    def __init__(
        self,
        generator: Any,
        conf: float = 0.05,
        iou: float = 0.5,
        points_per_batch: int = 64,
        points_per_side: int = 32,
        min_area: int = 16,
    ) -> None:
        self.generator, self.conf, self.iou = generator, conf, iou
        self.points_per_batch, self.points_per_side, self.min_area = points_per_batch, points_per_side, min_area

    def segment(self, image: Image.Image) -> list[tuple[Box, float]]:
        out = self.generator(
            image.convert("RGB"),
            points_per_batch=self.points_per_batch,
            points_per_crop=self.points_per_side,
            pred_iou_thresh=self.conf,
            stability_score_thresh=0.0,  # the paper filters by confidence alone
            crops_nms_thresh=self.iou,
        )
        boxes: list[Box] = []
        scores: list[float] = []
        for mask, score in zip(out["masks"], out["scores"], strict=True):
            m = np.asarray(mask, dtype=bool)  # (H, W)
            if m.sum() < self.min_area:
                continue
            ys, xs = np.nonzero(m)
            boxes.append((int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1))
            scores.append(float(score))
        return [(boxes[i], scores[i]) for i in nms(boxes, scores, self.iou)]


def load_sam(source: str | Path | None, device: str | None = None, **kwargs: Any) -> SamSegmenter:
    """A :class:`SamSegmenter` from a SAM folder in the official layout or an ``hf-hub:`` id in the local cache
    (see :data:`SAM_HINT`); ``kwargs`` go to :class:`SamSegmenter` (``conf``, ``iou``, ``points_per_batch``, ...)."""
    path = _resolve(source, SAM_HINT, "SAM")
    try:
        from transformers import pipeline
    except ImportError:
        raise BackendError("SAM: transformers is not installed; pip install 'namc[edits]'") from None
    dev = _device(device)
    try:
        generator = pipeline("mask-generation", model=path, device=dev, model_kwargs={"use_safetensors": True})
    except (OSError, ValueError) as err:
        raise BackendError(f"SAM: cannot load {path}: {str(err).splitlines()[0]}; {SAM_HINT}") from None
    return SamSegmenter(generator, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Stand-ins for renders with a known truth
# ---------------------------------------------------------------------------------------------------------------


def _ssim(x: Image.Image, y: Image.Image, window: int = 7) -> float:
    """Mean SSIM (Wang et al. 2004, uniform ``window`` x ``window`` windows, K1 = 0.01, K2 = 0.03) over the R, G and
    B channels (grey alone misses a colour change between equally bright colours), ``y`` resized to ``x``'s size."""
    from scipy.ndimage import uniform_filter

    a = np.asarray(x.convert("RGB"), dtype=np.float64) / 255.0  # (H, W, 3)
    b = np.asarray(y.convert("RGB").resize(x.size, Image.Resampling.BILINEAR), dtype=np.float64) / 255.0
    w = (max(1, min(window, a.shape[0], a.shape[1])),) * 2 + (1,)  # windows within each channel
    mu_a, mu_b = uniform_filter(a, w), uniform_filter(b, w)
    var_a = uniform_filter(a * a, w) - mu_a**2
    var_b = uniform_filter(b * b, w) - mu_b**2
    cov = uniform_filter(a * b, w) - mu_a * mu_b
    c1, c2 = 0.01**2, 0.03**2
    ssim = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return float(ssim.mean())


class PixelSimilarity:
    """Mean windowed colour SSIM of two images, and the Jaccard overlap of two texts' words: a model-free stand-in on
    CLIP's cosine scale (an image pair that differs in one object of the shapes world scores about 0.9-0.97, as
    CLIP's does for Img-Diff's pairs; unrelated crops score far below 0.85)."""

    def __init__(self, window: int = 7) -> None:
        self.window = window

    def image_similarity(self, a: Sequence[Image.Image], b: Sequence[Image.Image]) -> list[float]:
        return [_ssim(x, y, self.window) for x, y in zip(a, b, strict=True)]

    def text_similarity(self, a: Sequence[str], b: Sequence[str]) -> list[float]:
        out = []
        for x, y in zip(a, b, strict=True):
            wx, wy = set(x.lower().strip(" .").split()), set(y.lower().strip(" .").split())
            out.append(len(wx & wy) / len(wx | wy) if wx | wy else 1.0)
        return out


class ForegroundSegmenter:
    """Connected components of the pixels that differ from the floor by more than ``tol`` (0-255): on a plain grey
    floor every object (with its shadow) is one component. The floor of a row is the median of its grey, bright
    pixels (interpolated from the nearest rows where objects hide it). Score: the component's share of its box."""

    def __init__(self, tol: float = 12.0, min_area: int = 16) -> None:
        self.tol, self.min_area = tol, min_area

    def floor(self, rgb: np.ndarray) -> np.ndarray:
        """``(H, 1, 3)`` floor colour per row of an ``(H, W, 3)`` image."""
        grey = (rgb.max(axis=2) - rgb.min(axis=2) < 10) & (rgb.mean(axis=2) > 110)  # (H, W)
        rows = np.flatnonzero(grey.sum(axis=1) >= 4)
        if rows.size == 0:
            return np.median(rgb, axis=1, keepdims=True)
        med = np.stack([np.median(rgb[r][grey[r]], axis=0) for r in rows])  # (R, 3)
        ys = np.arange(rgb.shape[0])
        return np.stack([np.interp(ys, rows, med[:, c]) for c in range(3)], axis=1)[:, None, :]

    def segment(self, image: Image.Image) -> list[tuple[Box, float]]:
        from scipy import ndimage

        rgb = np.asarray(image.convert("RGB"), dtype=np.float32)  # (H, W, 3)
        fg = np.abs(rgb - self.floor(rgb)).max(axis=2) > self.tol  # (H, W)
        labels, _ = ndimage.label(fg)
        out: list[tuple[Box, float]] = []
        for k, sl in enumerate(ndimage.find_objects(labels), start=1):
            area = int((labels[sl] == k).sum())
            if area < self.min_area:
                continue
            ys, xs = sl
            box = (xs.start, ys.start, xs.stop, ys.stop)
            out.append((box, area / ((xs.stop - xs.start) * (ys.stop - ys.start))))
        return out


class ShapesMatcher:
    """Image-text matching for shapes-world crops: the largest share of a named object's footprint inside the crop,
    where the crop's scene (``image.info``, kept by :func:`crop`) holds an object whose name contains every
    attribute word of the text; 0 when none does."""

    def match(self, images: Sequence[Image.Image], texts: Sequence[str]) -> list[float]:
        from namc.curate.edits.shapes import crop_scene_share

        return [crop_scene_share(im, text) for im, text in zip(images, texts, strict=True)]


# ---------------------------------------------------------------------------------------------------------------
# Building from a YAML section
# ---------------------------------------------------------------------------------------------------------------


KINDS = {"similarity": ("clip", "pixels"), "matcher": ("blip", "shapes", "none"), "segmenter": ("sam", "foreground")}
_DEFAULTS = {"similarity": "clip", "matcher": "blip", "segmenter": "sam"}


def check_tools(section: Mapping[str, Any]) -> None:
    """Raises ValueError for a tool kind namc does not know, before any model is loaded."""
    for key, kinds in KINDS.items():
        kind = section.get(key, _DEFAULTS[key])
        if kind not in kinds:
            hint = " (FastSAM's ultralytics is AGPL-3.0: namc drives SAM)" if kind == "fastsam" else ""
            raise ValueError(f"{key} must be one of {', '.join(kinds)}, got {kind!r}{hint}")


def build_similarity(section: Mapping[str, Any]) -> Similarity:
    """``similarity: clip`` (``clip_weights``, ``clip_model``, ``clip_tag``, ``device``) or ``pixels``."""
    kind = section.get("similarity", "clip")
    if kind == "pixels":
        return PixelSimilarity()
    if kind == "clip":
        return load_clip(
            section.get("clip_weights"),
            section.get("clip_model", "ViT-B-32"),
            section.get("clip_tag", "openai"),
            section.get("device"),
        )
    raise ValueError(f"similarity must be clip or pixels, got {kind!r}")


def build_matcher(section: Mapping[str, Any]) -> Matcher:
    """``matcher: blip`` (``blip``: folder or ``hf-hub:`` id, ``device``) or ``shapes``."""
    kind = section.get("matcher", "blip")
    if kind == "shapes":
        return ShapesMatcher()
    if kind == "blip":
        return load_blip(section.get("blip", "hf-hub:Salesforce/blip-itm-large-coco"), section.get("device"))
    raise ValueError(f"matcher must be blip or shapes, got {kind!r}")


def build_segmenter(section: Mapping[str, Any], conf: float = 0.05, iou: float = 0.5) -> Segmenter:
    """``segmenter: sam`` (``sam``: folder or ``hf-hub:`` id, ``points_per_batch``, ``points_per_side``,
    ``device``) or ``foreground``."""
    kind = section.get("segmenter", "sam")
    if kind == "foreground":
        return ForegroundSegmenter()
    if kind == "sam":
        return load_sam(
            section.get("sam", "hf-hub:facebook/sam-vit-base"),
            section.get("device"),
            conf=conf,
            iou=iou,
            points_per_batch=int(section.get("points_per_batch", 64)),
            points_per_side=int(section.get("points_per_side", 32)),
        )
    raise ValueError(f"segmenter must be sam or foreground, got {kind!r}")
