"""The ``diffusers`` backend of the edit-pair engines: local Hugging Face diffusers pipelines.

- :class:`DiffusersPairGenerator`: Img-Diff's replacement pairs, a text-to-image pipeline with Prompt-to-Prompt
  (:mod:`namc.curate.edits.p2p`);
- :class:`DiffusersInpainter`: Img-Diff's removal, an inpainting pipeline;
- :class:`DiffusersEditor`: MED's micro-edits, an instruction-editing pipeline (InstructPix2Pix).

``model:`` is a folder in the diffusers layout (``model_index.json``, one folder per component) or
``hf-hub:org/name[@revision]`` resolved in the local Hugging Face cache only (:func:`resolve_pipeline_folder`);
weights load from safetensors only. Built by :func:`namc.curate.edits.backends.build` (``backend: diffusers``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image
from tqdm.auto import tqdm

from namc.curate.edits.base import BackendError, GenerationFailed, Result, Throughput
from namc.curate.edits.options import (
    check_batch,
    check_masks,
    chunks,
    first_line,
    flag_option,
    number_option,
    pair_images,
    string_option,
)
from namc.jsonl import loads

__all__ = [
    "EDIT_PIPELINES",
    "P2P_PIPELINES",
    "DiffusersEditor",
    "DiffusersInpainter",
    "DiffusersPairGenerator",
    "resolve_pipeline_folder",
]

log = logging.getLogger(__name__)

#: the Hub files of a diffusers pipeline: configs, safetensors weights, tokenizer vocabularies (never a pickle)
HUB_PREFIX = "hf-hub:"
PIPELINE_FILE_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model")
_DTYPES = ("float32", "float16", "bfloat16")
#: pipeline classes whose UNet and batch layout Prompt-to-Prompt supports
P2P_PIPELINES = ("StableDiffusionPipeline", "StableDiffusionXLPipeline")
EDIT_PIPELINES = ("StableDiffusionInstructPix2PixPipeline", "StableDiffusionXLInstructPix2PixPipeline")
# per role: (steps, guidance_scale); text-to-image and inpainting as Img-Diff's released code and diffusers' SD
# defaults (50, 7.5), instruction editing as diffusers' InstructPix2Pix (100 steps, 7.5, image guidance 1.5)
_ROLE_DEFAULTS = {"pairs": (50, 7.5), "inpaint": (50, 7.5), "edit": (100, 7.5)}

# ---------------------------------------------------------------------------------------------- diffusers loading


def resolve_pipeline_folder(model: str) -> Path:
    """The local folder of a diffusers pipeline: ``model`` itself, or the cached snapshot of ``hf-hub:org/name``.

    Hub ids come from the local Hugging Face cache only (``HF_HUB_CACHE`` / ``HF_HOME``): nothing is downloaded.

    Raises:
        BackendError: a missing folder, a folder without ``model_index.json``, a malformed Hub id, or a Hub model
            that is not in the cache; the message says what to download and where to put it.
    """
    if model.startswith(HUB_PREFIX):
        repo_id, revision = _parse_hub_id(model)
        folder = _cached_snapshot(model, repo_id, revision)
    else:
        folder = Path(model).expanduser()
        if not folder.is_dir():
            raise BackendError(
                f"edits backend: model folder {folder} does not exist; put a diffusers pipeline folder there "
                "(`hf download ORG/NAME --local-dir PATH`) or name one in the Hugging Face cache as hf-hub:ORG/NAME"
            )
    if not (folder / "model_index.json").is_file():
        raise BackendError(
            f"edits backend: {model}: {folder} is not a diffusers pipeline folder (no model_index.json); point model: "
            "at the folder that pipeline.save_pretrained() writes or `hf download ORG/NAME` fetches"
        )
    return folder


def _parse_hub_id(spec: str) -> tuple[str, str | None]:
    """``hf-hub:org/name[@revision]`` -> ``(org/name, revision or None)``, checked as the Hub and git check them.

    :func:`namc.models.hub.parse_hub_id`'s rules, written here because importing ``namc.models`` loads open_clip and
    timm, seconds that a diffusers backend does not need.
    """
    from huggingface_hub.utils import validate_repo_id

    from namc.paths import check_revision

    repo_id, at, revision = spec[len(HUB_PREFIX) :].partition("@")
    owner, slash, name = repo_id.partition("/")
    try:
        if not (owner and slash and name) or "/" in name or (at and not revision):
            raise ValueError("expected hf-hub:org/name or hf-hub:org/name@revision")
        validate_repo_id(repo_id)  # HFValidationError, a ValueError: characters the Hub does not allow
        if revision:  # it names a file under the cache's refs/: '..' or an absolute path would read one outside it
            check_revision(revision, spec)
    except ValueError as err:
        raise BackendError(f"edits backend: model: not a Hub model id: {spec!r}: {str(err).splitlines()[0]}") from None
    return repo_id, revision or None


def _cached_snapshot(spec: str, repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    from namc.paths import PathEscapeError, contained

    cache = Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE).expanduser()
    rev = f" --revision {revision}" if revision else ""
    include = " ".join(f"--include '{p}'" for p in PIPELINE_FILE_PATTERNS)
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache,
            allow_patterns=list(PIPELINE_FILE_PATTERNS),
            local_files_only=True,  # the local cache only: a run never downloads weights
        )
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        raise BackendError(
            f"edits backend: {spec}: diffusers pipeline {repo_id} (revision {revision or 'main'}) is not in the "
            f"Hugging Face cache {cache}; run `hf download {repo_id}{rev} {include} --cache-dir {cache}` on a machine "
            "with network access, or set HF_HUB_CACHE to a cache that holds it"
        ) from None
    snapshots = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    try:  # the snapshot must lie inside the repo's own folder, whatever a ref file in the cache said
        path = contained(snapshots, Path(folder).name, f"{spec}: snapshot")
    except PathEscapeError as err:
        raise BackendError(f"edits backend: {err}") from None
    if path.resolve() != Path(folder).resolve():
        raise BackendError(f"edits backend: {spec}: the cache resolved {repo_id} to {folder}, outside {snapshots}")
    return path


def _pipeline_class(folder: Path) -> str:
    try:
        name = loads((folder / "model_index.json").read_text(encoding="utf-8")).get("_class_name")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as err:
        raise BackendError(f"edits backend: {folder / 'model_index.json'}: unreadable: {first_line(err)}") from None
    if not isinstance(name, str):
        raise BackendError(f"edits backend: {folder / 'model_index.json'} names no pipeline class (_class_name)")
    return name


def _dtype_kwarg(dtype: Any) -> dict[str, Any]:
    """``dtype=`` where diffusers takes it, else the older ``torch_dtype=`` (deprecated where ``dtype`` exists)."""
    try:
        from diffusers.utils.deprecation_utils import _resolve_dtype  # noqa: F401 (present where dtype= is taken)
    except ImportError:
        return {"torch_dtype": dtype}
    return {"dtype": dtype}


def _torch_device(name: str | None) -> Any:
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise BackendError(f"edits backend: device {name!r} is not a torch device (cpu, cuda, cuda:1, mps)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BackendError(f"edits backend: device {name} asked for but torch sees no CUDA device; set device: cpu")
    return device


class _DiffusersBackend:
    """What the three diffusers backends share: options, loading, seeding, batching, progress and counters.

    Keys: ``model`` (a folder or ``hf-hub:org/name[@revision]``, required), ``device`` (default ``cuda`` when
    available, else ``cpu``), ``dtype`` (``float32`` | ``float16`` | ``bfloat16``; default ``float16`` on CUDA,
    ``float32`` elsewhere), ``steps``, ``guidance_scale``, ``batch_size`` (items per pipeline call, default 4),
    ``height`` / ``width`` (default: the pipeline's own), ``negative_prompt`` and ``progress`` (a tqdm bar over the
    items of a call that spans several pipeline calls; default true).

    Seeds: item ``i`` draws its noise from ``torch.Generator("cpu").manual_seed(seeds[i])``, so an item's image
    depends on its seed alone, not on its batch or device. The safety checker's NSFW flag, where the pipeline has
    one, is ``GenerationFailed("nsfw")``; running out of accelerator memory halves the batch, and a single item that
    still does not fit is ``GenerationFailed("out_of_memory")``.
    """

    role = "pairs"

    def __init__(self, section: Mapping[str, Any]) -> None:
        import torch

        model = string_option(section, "model", None)
        if not model:
            raise BackendError("edits backend diffusers: model: is required (a pipeline folder or hf-hub:ORG/NAME)")
        self.model = model
        self.device = _torch_device(string_option(section, "device", None))
        dtype = string_option(section, "dtype", "float16" if self.device.type == "cuda" else "float32")
        if dtype not in _DTYPES:
            raise BackendError(f"edits backend: dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        self.dtype = getattr(torch, dtype)
        steps, guidance = _ROLE_DEFAULTS[self.role]
        self.steps = number_option(section, "steps", steps, 1, 1000, integer=True)
        self.guidance_scale = float(number_option(section, "guidance_scale", guidance, 0.0, 100.0))
        self.batch_size = number_option(section, "batch_size", 4, 1, 1024, integer=True)
        self.height = number_option(section, "height", None, 8, 8192, integer=True)
        self.width = number_option(section, "width", None, 8, 8192, integer=True)
        for key in ("height", "width"):
            if getattr(self, key) is not None and getattr(self, key) % 8:
                raise BackendError(f"edits backend: {key} must be a multiple of 8, got {getattr(self, key)}")
        self.negative_prompt = string_option(section, "negative_prompt", None)
        self.progress = flag_option(section, "progress", True)
        self.folder = resolve_pipeline_folder(model)
        self.class_name = _pipeline_class(self.folder)
        self.pipe = self._load()
        self.pipe.set_progress_bar_config(disable=True)  # per-step bars of every call would flood the log
        self.throughput = Throughput()

    def _auto_class(self) -> Any:  # pragma: no cover - each role overrides it
        raise NotImplementedError

    def _load(self) -> Any:
        try:
            cls = self._auto_class()
        except ImportError:
            raise BackendError(
                "edits backend diffusers needs the diffusers and transformers packages: pip install 'namc[edits]'"
            ) from None
        try:
            pipe = cls.from_pretrained(
                self.folder, **_dtype_kwarg(self.dtype), use_safetensors=True, local_files_only=True
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as err:
            raise BackendError(
                f"edits backend: {self.model}: cannot load a pipeline for {self.role} from {self.folder} "
                f"(model_index.json names {self.class_name}): {first_line(err)}"
            ) from None
        return pipe.to(self.device)

    def _generators(self, seeds: Sequence[int]) -> list[Any]:
        import torch

        return [torch.Generator("cpu").manual_seed(int(s)) for s in seeds]

    def _size(self) -> dict[str, int]:
        return {k: v for k, v in (("height", self.height), ("width", self.width)) if v is not None}

    def _run(self, n: int, call: Callable[[range], list[Any]]) -> list[Any]:
        """Calls ``call`` on chunks of ``batch_size`` items, halving a chunk that runs out of memory."""
        import torch

        out: list[Any] = []
        parts = list(chunks(n, self.batch_size))
        bar = tqdm(
            total=n, desc=f"{self.role} ({self.class_name})", unit="item", leave=False,
            disable=not self.progress or len(parts) <= 1,
        )  # fmt: skip
        pending = parts[::-1]
        while pending:
            chunk = pending.pop()
            try:
                with torch.inference_mode():
                    out.extend(call(chunk))
            except torch.OutOfMemoryError as err:
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                if len(chunk) > 1:
                    half = len(chunk) // 2
                    log.warning("%s: out of memory at %d items per call; retrying in halves", self.model, len(chunk))
                    pending.extend([range(chunk.start + half, chunk.stop), range(chunk.start, chunk.start + half)])
                    continue
                out.append(GenerationFailed("out_of_memory", first_line(err)))
            bar.update(len(chunk))
        bar.close()
        return out

    def _run_by_size(self, call: Callable[..., list[Any]], images: Sequence[Any], *columns: Sequence[Any]) -> list[Any]:
        """:meth:`_run` over the items grouped by image size (a pipeline call renders one size), in input order."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i, img in enumerate(images):
            groups.setdefault(img.size, []).append(i)
        results: list[Any] = [None] * len(images)
        for idx in groups.values():
            done = self._run(len(idx), lambda r, idx=idx: call(*([c[idx[i]] for i in r] for c in (images, *columns))))
            for i, res in zip(idx, done, strict=True):
                results[i] = res
        return results

    @staticmethod
    def _flags(output: Any, n: int) -> list[bool]:
        flags = getattr(output, "nsfw_content_detected", None)
        return [bool(f) for f in flags] if flags is not None else [False] * n


class DiffusersPairGenerator(_DiffusersBackend):
    """Img-Diff's replacement pairs: a text-to-image pipeline with Prompt-to-Prompt (:mod:`namc.curate.edits.p2p`).

    The folder's pipeline class is loaded through ``AutoPipelineForText2Image``; Prompt-to-Prompt needs
    ``StableDiffusionPipeline`` or ``StableDiffusionXLPipeline`` (SD 1.x / 2.x / SDXL). Both prompts of a pair start
    from the same latent (two generators seeded with the pair's seed) and are denoised as one batch. Extra keys:
    ``p2p`` (default true; false: the pair is two generations from the same latent, with any text-to-image
    pipeline), ``cross_replace_steps`` (0.8), ``self_replace_steps`` (0.4), ``self_replace_max_tokens`` (1024).
    Defaults: 50 steps, guidance 7.5 (Img-Diff's released code: SDXL base, 50 steps, 7.5).
    """

    role = "pairs"

    def __init__(self, section: Mapping[str, Any]) -> None:
        from namc.curate.edits.p2p import P2PSettings

        self.p2p = flag_option(section, "p2p", True)
        try:
            self.settings = P2PSettings(
                cross_replace_steps=section.get("cross_replace_steps", 0.8),
                self_replace_steps=section.get("self_replace_steps", 0.4),
                self_replace_max_tokens=section.get("self_replace_max_tokens", 32**2),
            )
        except ValueError as err:
            raise BackendError(f"edits backend: {err}") from None
        super().__init__(section)
        unet, vae = getattr(self.pipe, "unet", None), getattr(self.pipe, "vae", None)
        if unet is not None and vae is not None and unet.config.in_channels != vae.config.latent_channels:
            raise BackendError(
                f"edits backend: {self.model}: its UNet takes {unet.config.in_channels} input channels, an inpainting "
                f"or editing model ({self.class_name}), not a text-to-image one; name a text-to-image pipeline"
            )
        if self.p2p and type(self.pipe).__name__ not in P2P_PIPELINES:
            raise BackendError(
                f"edits backend: {self.model}: Prompt-to-Prompt needs one of {', '.join(P2P_PIPELINES)}, the folder "
                f"holds {type(self.pipe).__name__}; use such a model or set p2p: false"
            )

    def _auto_class(self) -> Any:
        from diffusers import AutoPipelineForText2Image

        return AutoPipelineForText2Image

    def _call(self, prompts: Sequence[tuple[str, str]], seeds: Sequence[int]) -> list[Any]:
        from namc.curate.edits.p2p import prompt_to_prompt

        pipe = self.pipe
        flat = [p for pair in prompts for p in pair]  # source_0, target_0, source_1, ...
        kwargs: dict[str, Any] = dict(
            prompt=flat,
            num_inference_steps=self.steps,
            guidance_scale=self.guidance_scale,
            # one generator per image, the pair's seed twice: both prompts start from the same latent
            generator=self._generators([s for s in seeds for _ in range(2)]),
            output_type="pil",
            **self._size(),
        )
        if self.negative_prompt is not None:
            kwargs["negative_prompt"] = [self.negative_prompt] * len(flat)
        if self.p2p:
            with prompt_to_prompt(pipe.unet, pipe.tokenizer, prompts, self.steps, self.settings) as controller:
                output = pipe(**kwargs, callback_on_step_end=controller.step_end)
        else:
            output = pipe(**kwargs)
        flags = self._flags(output, len(flat))
        results: list[Any] = []
        for k in range(len(prompts)):
            if flags[2 * k] or flags[2 * k + 1]:
                results.append(GenerationFailed("nsfw", "the pipeline's safety checker flagged an image of the pair"))
            else:
                results.append((output.images[2 * k], output.images[2 * k + 1]))
        return results

    def generate_pairs(
        self, prompts: Sequence[tuple[str, str]], seeds: Sequence[int]
    ) -> list[tuple[Image.Image, Image.Image] | GenerationFailed]:
        """One ``(source image, target image)`` per prompt pair (or a failure), in order; ``seeds[i]`` fixes pair i."""
        check_batch("generate_pairs", prompts, seeds)
        started = time.perf_counter()
        results = self._run(len(prompts), lambda r: self._call([prompts[i] for i in r], [seeds[i] for i in r]))
        self.throughput.record(pair_images(results), started)
        return results


class DiffusersInpainter(_DiffusersBackend):
    """Img-Diff's removal: an inpainting pipeline (``AutoPipelineForInpainting``: SD / SDXL inpainting folders, and
    plain SD / SDXL / SDXL-turbo folders, which diffusers inpaints by blending latents; Img-Diff uses SDXL-turbo).

    Extra keys: ``strength`` (default 1.0: the masked area is repainted from noise) and ``keep_unmasked`` (default
    true: outside the mask the output is the input, pixel for pixel, so the VAE's round trip cannot add differences
    that the pair's captions would not mention; Img-Diff: "the rest of the image remains unchanged"). Items are
    rendered at ``height`` x ``width`` (default: the input's size rounded down to a multiple of 8) and returned at the
    input's size; items of different sizes go to separate pipeline calls.
    """

    role = "inpaint"

    def __init__(self, section: Mapping[str, Any]) -> None:
        self.strength = float(number_option(section, "strength", 1.0, 0.01, 1.0))
        self.keep_unmasked = flag_option(section, "keep_unmasked", True)
        super().__init__(section)

    def _auto_class(self) -> Any:
        from diffusers import AutoPipelineForInpainting

        return AutoPipelineForInpainting

    def _call(
        self, images: list[Image.Image], masks: list[Image.Image], prompts: list[str], seeds: list[int]
    ) -> list[Any]:
        w, h = images[0].size
        size = self._size() or {"height": max(8, h // 8 * 8), "width": max(8, w // 8 * 8)}
        kwargs: dict[str, Any] = {}
        if self.negative_prompt is not None:
            kwargs["negative_prompt"] = [self.negative_prompt] * len(prompts)
        output = self.pipe(
            prompt=list(prompts),
            image=[im.convert("RGB") for im in images],
            mask_image=[m.convert("L") for m in masks],
            strength=self.strength,
            num_inference_steps=self.steps,
            guidance_scale=self.guidance_scale,
            generator=self._generators(seeds),
            output_type="pil",
            **size,
            **kwargs,
        )
        results: list[Any] = []
        for img, mask, out, flagged in zip(images, masks, output.images, self._flags(output, len(images)), strict=True):
            if flagged:
                results.append(GenerationFailed("nsfw", "the pipeline's safety checker flagged the inpainted image"))
                continue
            out = out.convert("RGB").resize(img.size, Image.Resampling.BICUBIC) if out.size != img.size else out
            results.append(Image.composite(out, img.convert("RGB"), mask.convert("L")) if self.keep_unmasked else out)
        return results

    def inpaint(
        self, images: Sequence[Image.Image], masks: Sequence[Image.Image], prompts: Sequence[str], seeds: Sequence[int]
    ) -> list[Result]:
        """``images[i]`` with the white area of ``masks[i]`` repainted from ``prompts[i]``, seeded by ``seeds[i]``."""
        check_batch("inpaint", images, masks, prompts, seeds)
        check_masks(images, masks)
        started = time.perf_counter()
        results = self._run_by_size(self._call, images, masks, prompts, seeds)
        self.throughput.record(results, started)
        return results


class DiffusersEditor(_DiffusersBackend):
    """MED's editor: an instruction-editing pipeline (``StableDiffusionInstructPix2PixPipeline`` or its SDXL
    version), ``images[i]`` edited by ``instructions[i]``.

    MED (``004``) used Gemini Flash 2.0, a remote model (the ``openai`` backend reaches such a server); InstructPix2Pix
    is the local open model that follows the same kind of instruction. Extra key: ``image_guidance_scale`` (default
    1.5, diffusers' and the InstructPix2Pix paper's). Defaults: 100 steps, guidance 7.5 (diffusers'). The output has
    the input's size; items of different sizes go to separate pipeline calls.
    """

    role = "edit"

    def __init__(self, section: Mapping[str, Any]) -> None:
        self.image_guidance_scale = float(number_option(section, "image_guidance_scale", 1.5, 0.0, 100.0))
        super().__init__(section)

    def _auto_class(self) -> Any:
        import diffusers

        if self.class_name not in EDIT_PIPELINES:
            raise BackendError(
                f"edits backend: {self.model}: an instruction-editing pipeline ({', '.join(EDIT_PIPELINES)}) is needed "
                f"for edit, model_index.json names {self.class_name}; e.g. `hf download timbrooks/instruct-pix2pix`"
            )
        return getattr(diffusers, self.class_name)

    def _call(self, images: list[Image.Image], instructions: list[str], seeds: list[int]) -> list[Any]:
        kwargs: dict[str, Any] = {}
        if self.negative_prompt is not None:
            kwargs["negative_prompt"] = [self.negative_prompt] * len(instructions)
        output = self.pipe(
            prompt=list(instructions),
            image=[im.convert("RGB") for im in images],
            num_inference_steps=self.steps,
            guidance_scale=self.guidance_scale,
            image_guidance_scale=self.image_guidance_scale,
            generator=self._generators(seeds),
            output_type="pil",
            **kwargs,
        )
        results: list[Any] = []
        for img, out, flagged in zip(images, output.images, self._flags(output, len(images)), strict=True):
            if flagged:
                results.append(GenerationFailed("nsfw", "the pipeline's safety checker flagged the edited image"))
            else:
                results.append(
                    out.convert("RGB").resize(img.size, Image.Resampling.BICUBIC) if out.size != img.size else out
                )
        return results

    def edit(self, images: Sequence[Image.Image], instructions: Sequence[str], seeds: Sequence[int]) -> list[Result]:
        """``images[i]`` edited by ``instructions[i]``, seeded by ``seeds[i]``."""
        check_batch("edit", images, instructions, seeds)
        started = time.perf_counter()
        results = self._run_by_size(self._call, images, instructions, seeds)
        self.throughput.record(results, started)
        return results
