"""Checks on a :class:`~namc.models.config.NAMCConfig` before anything is built from it.

A model folder's ``config.json``, a checkpoint's namc entry and a recipe's model section are untrusted input: a NaN
dropout, a negative width, an unknown timm model, a keyword argument that makes timm read another file, or
``fdg_layers: 1000000`` (minutes of allocation, then ``MemoryError``) must each be one line naming the file and the
key, not a traceback from deep inside torch. :func:`check_config` checks, in this order:

1. types and ranges of every field (positive widths and counts, probabilities in [0, 1], finite floats);
2. choices (``tokenizer``, ``masking``, ``nim_loss``, ``rec_loss``, ``fusion``);
3. ``vqgan_ddconfig`` and ``grid_kwargs`` against allow-lists of the keyword arguments namc hands to taming's
   ``Encoder`` and to ``timm.create_model`` (anything else, e.g. ``pretrained_cfg_overlay``, is refused);
4. model names: ``grid_model`` must be a timm architecture, ``clip_model`` (when pre-training) an open_clip config;
5. the parameters the config would build, estimated from the config (the grid encoder is built on the meta
   device, which allocates nothing): at most :data:`DEFAULT_MAX_PARAMETERS`, or ``NAMC_MAX_PARAMETERS`` from the
   environment, or the ``max_parameters`` argument.

Every problem is a :class:`~namc.models.files.ConfigError` (a ``ValueError``) reading ``"<where>: <key>: <problem>"``.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from namc.models.files import ConfigError

if TYPE_CHECKING:
    from namc.models.config import NAMCConfig

__all__ = ["DEFAULT_MAX_PARAMETERS", "MAX_PARAMETERS_ENV", "check_config", "estimate_parameters", "max_parameters"]

DEFAULT_MAX_PARAMETERS = 2_000_000_000  # 8 GB of fp32 weights: 7x namc_base (about 290M with its CLIP and VQGAN)
MAX_PARAMETERS_ENV = "NAMC_MAX_PARAMETERS"
_MAX_INT = 2**31 - 1  # no count or width of a real model comes near this; it keeps the estimate in float range
_WIDE = 8192  # a width above this is what makes a layer term large, so the message names ``dim``

# field -> (smallest, largest) value of the integer fields; the parameter estimate bounds the rest
_INT_RANGES: dict[str, tuple[int, int]] = {
    "image_size": (8, 8192),
    "vocab_size": (1, _MAX_INT),
    "grid_out_index": (0, 4),  # timm feature levels: stem, then 4 stages
    "vqgan_n_embed": (1, _MAX_INT),
    "vqgan_embed_dim": (1, _MAX_INT),
    "dim": (1, _MAX_INT),
    "heads": (1, _MAX_INT),
    "mir_layers": (1, _MAX_INT),
    "fdg_layers": (1, _MAX_INT),
    "max_caption_len": (2, _MAX_INT),
    "max_new_tokens": (1, _MAX_INT),
}
# field -> (smallest, largest, whether the smallest is excluded) of the float fields; all must be finite
_FLOAT_RANGES: dict[str, tuple[float, float, bool]] = {
    "p_img": (0.0, 1.0, False),
    "p_txt": (0.0, 1.0, False),
    "dropout": (0.0, 1.0, False),
    "tau": (0.0, 1e6, True),
    "nim_token_loss": (0.0, 1e6, False),
    "mlp_ratio": (0.0, 64.0, True),
}
_BOOLS = (
    "pretraining",
    "use_nim",
    "denoised_image",
    "denoised_text",
    "grid_trainable",
    "use_mir",
    "tie_embeddings",
    "ignore_masked_targets",
)
_OPTIONAL_STRS = ("clip_pretrained", "grid_pretrained", "vqgan_pretrained")
_CHOICES: dict[str, tuple[str, ...]] = {
    "tokenizer": ("clip_bpe", "word"),
    "masking": ("noise", "random"),
    "nim_loss": ("sdm", "infonce"),
    "rec_loss": ("discrete", "l1", "l2"),
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int_in(lo: int, hi: int) -> Callable[[Any], str | None]:
    """A check that a value is an integer in [lo, hi]; returns the problem or None."""

    def check(value: Any) -> str | None:
        if not _is_int(value):
            return f"must be an integer, got {type(value).__name__} {value!r}"
        return None if lo <= value <= hi else f"must be between {lo} and {hi}, got {value}"

    return check


def _probability(value: Any) -> str | None:
    if not _is_number(value) or not math.isfinite(value) or not 0 <= value <= 1:
        return f"must be a probability in [0, 1], got {value!r}"
    return None


def _one_of(*choices: Any) -> Callable[[Any], str | None]:
    return lambda value: None if value in choices and type(value) is type(choices[0]) else f"must be one of {choices}"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, got {value!r}"


def _int_list(length: tuple[int, int], item: tuple[int, int]) -> Callable[[Any], str | None]:
    """A check that a value is a list of ``length`` integers, each in ``item``."""

    def check(value: Any) -> str | None:
        ok = isinstance(value, (list, tuple)) and length[0] <= len(value) <= length[1]
        if not ok or not all(_is_int(v) and item[0] <= v <= item[1] for v in value):
            return f"must be a list of {length[0]} to {length[1]} integers in [{item[0]}, {item[1]}], got {value!r}"
        return None

    return check


# The keyword arguments a recipe may hand to timm.create_model for the grid encoder (timm's ResNet family, what
# GridEncoder builds); anything else, e.g. pretrained_cfg_overlay (another weights file) or act_layer (a callable
# by name), is refused.
GRID_KWARGS: dict[str, Callable[[Any], str | None]] = {
    "layers": _int_list((1, 8), (1, 64)),
    "cardinality": _int_in(1, 256),
    "base_width": _int_in(1, 1024),
    "stem_width": _int_in(1, 1024),
    "stem_type": _one_of("", "deep", "deep_tiered"),
    "output_stride": _one_of(8, 16, 32),
    "avg_down": _boolean,
    "replace_stem_pool": _boolean,
    "zero_init_last": _boolean,
    "drop_rate": _probability,
    "drop_path_rate": _probability,
    "drop_block_rate": _probability,
}
# The keys of taming's Encoder configuration (what VQGANTokenizer builds; taming ignores unknown keys silently, so
# an unknown one is refused here); RGB images, so in_channels is 3.
DDCONFIG_KEYS: dict[str, Callable[[Any], str | None]] = {
    "ch": _int_in(32, 4096),
    "out_ch": _int_in(1, 4096),
    "ch_mult": _int_list((1, 8), (1, 64)),
    "num_res_blocks": _int_in(0, 16),
    "attn_resolutions": _int_list((0, 16), (1, 8192)),
    "dropout": _probability,
    "resamp_with_conv": _boolean,
    "in_channels": _one_of(3),
    "resolution": _int_in(1, 8192),
    "z_channels": _int_in(1, 65536),
    "double_z": _boolean,
}
_DDCONFIG_REQUIRED = ("ch", "out_ch", "ch_mult", "num_res_blocks", "attn_resolutions", "in_channels", "resolution")


def max_parameters() -> float:
    """The parameter limit: ``NAMC_MAX_PARAMETERS`` from the environment (e.g. ``5e9``), else 2e9.

    Raises:
        ConfigError: the variable is set but not a positive number.
    """
    raw = os.environ.get(MAX_PARAMETERS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_PARAMETERS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{MAX_PARAMETERS_ENV}={raw!r} is not a positive number (e.g. 5e9)")
    return value


def _check_fields(cfg: NAMCConfig, where: str) -> None:
    """Types, ranges and choices of the scalar fields."""
    for key, (lo, hi) in _INT_RANGES.items():
        problem = _int_in(lo, hi)(getattr(cfg, key))
        if problem:
            raise ConfigError(f"{where}: {key}: {problem}")
    for key, (lo, hi, open_lo) in _FLOAT_RANGES.items():
        value = getattr(cfg, key)
        ok = _is_number(value) and math.isfinite(value) and (lo < value if open_lo else lo <= value) and value <= hi
        if not ok:
            bounds = f"{'(' if open_lo else '['}{lo:g}, {hi:g}]"
            raise ConfigError(f"{where}: {key}: must be a finite number in {bounds}, got {value!r}")
    for key in _BOOLS:
        if not isinstance(getattr(cfg, key), bool):
            raise ConfigError(f"{where}: {key}: must be true or false, got {getattr(cfg, key)!r}")
    for key in ("name", "clip_model", "grid_model", *_OPTIONAL_STRS):
        value = getattr(cfg, key)
        if not (isinstance(value, str) and value) and not (value is None and key in _OPTIONAL_STRS):
            raise ConfigError(f"{where}: {key}: must be a non-empty string, got {value!r}")
    for key, choices in _CHOICES.items():
        if getattr(cfg, key) not in choices:
            raise ConfigError(f"{where}: {key}: must be one of {choices}, got {getattr(cfg, key)!r}")
    ngram = cfg.nim_token_ngram
    if ngram is not None and not (_is_int(ngram) and 1 <= ngram <= 16):
        raise ConfigError(f"{where}: nim_token_ngram: must be null or an integer in [1, 16], got {ngram!r}")
    if cfg.dim % cfg.heads:
        raise ConfigError(f"{where}: dim: {cfg.dim} is not a multiple of heads ({cfg.heads})")


def _check_mapping(value: Any, rules: Mapping[str, Callable[[Any], str | None]], key: str, where: str) -> None:
    """A dict field against an allow-list of keys, each with its check."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key}: must be an object, got {type(value).__name__}")
    unknown = sorted(str(k) for k in value if k not in rules)
    if unknown:
        raise ConfigError(f"{where}: {key}: unknown or disallowed keys {unknown}; allowed: {sorted(rules)}")
    for name, item in value.items():
        problem = rules[name](item)
        if problem:
            raise ConfigError(f"{where}: {key}.{name}: {problem}")


def _check_parts(cfg: NAMCConfig, where: str) -> None:
    """The nested configurations (allow-lists) and the registered fusion blocks."""
    _check_mapping(cfg.grid_kwargs, GRID_KWARGS, "grid_kwargs", where)
    _check_mapping(cfg.vqgan_ddconfig, DDCONFIG_KEYS, "vqgan_ddconfig", where)
    missing = [k for k in (*_DDCONFIG_REQUIRED, "z_channels") if k not in cfg.vqgan_ddconfig]
    if missing:
        raise ConfigError(f"{where}: vqgan_ddconfig: missing keys {missing}")
    if cfg.vqgan_ddconfig.get("double_z", True):
        raise ConfigError(f"{where}: vqgan_ddconfig.double_z: must be false (a VQGAN, not a KL autoencoder)")
    from namc.models.fusion import list_fusions

    if cfg.fusion not in list_fusions():
        raise ConfigError(f"{where}: fusion: unknown MIR fusion {cfg.fusion!r}; registered: {list_fusions()}")


# ------------------------------------------------------------------------------------------------ the estimate


def _block(dim: int, mlp_ratio: float) -> int:
    """Parameters of namc's transformer layer: self- and cross-attention (q, kv, out), a feed-forward, 4 LayerNorms."""
    hidden = int(dim * mlp_ratio)
    return 2 * (4 * dim * dim + 4 * dim) + 2 * dim * hidden + hidden + dim + 8 * dim


def _fusion(name: str, dim: int) -> int:
    """MIR's fusion block: the paper's concat + FC, the difference's FC, or about 11 D^2 for the larger registered
    blocks (MDP)."""
    return {"concat": 2 * dim * dim + dim, "difference": dim * dim + dim}.get(name, 12 * dim * dim)


def _clip_block(width: int, mlp_ratio: float) -> int:
    """Parameters of an open_clip residual attention block (in_proj, out_proj, MLP, 2 LayerNorms)."""
    hidden = int(width * mlp_ratio)
    return 4 * width * width + 4 * width + 2 * width * hidden + hidden + width + 4 * width


def _clip_config(name: str, where: str) -> dict[str, Any]:
    import open_clip

    import namc.models.clip_configs  # noqa: F401  (registers namc's own CLIP configs with open_clip)

    cfg = open_clip.get_model_config(name)
    vision = (cfg or {}).get("vision_cfg", {})
    if cfg is None or not _is_int(vision.get("layers")):
        raise ConfigError(
            f"{where}: clip_model: {name!r} is not an open_clip ViT config (open_clip.list_models() lists them, "
            "plus namc-tiny-clip)"
        )
    return cfg


def _clip_parameters(cfg: NAMCConfig, where: str, dim: int) -> int:
    """NIM's CLIP towers, with the text vocabulary grown to ``vocab_size`` ([MASK]), from open_clip's config, and
    MIR's projection of their text embeddings to ``dim``."""
    clip = _clip_config(cfg.clip_model, where)
    vision, text, embed = clip["vision_cfg"], clip["text_cfg"], int(clip["embed_dim"])
    w, patch, size = int(vision["width"]), int(vision["patch_size"]), int(vision["image_size"])
    positions = (size // patch) ** 2 + 1
    total = 3 * patch * patch * w + w + positions * w + 4 * w + w * embed + w  # patches, [CLS], positions, LNs, e_msk
    total += int(vision["layers"]) * _clip_block(w, float(vision.get("mlp_ratio", 4.0)))
    tw = int(text.get("width", 512))
    total += max(cfg.vocab_size, int(text.get("vocab_size", 0))) * tw + int(text.get("context_length", 77)) * tw
    total += int(text.get("layers", 12)) * _clip_block(tw, float(text.get("mlp_ratio", 4.0))) + 2 * tw + tw * embed
    return total + 3 + embed * dim + dim  # logit_scale, the token logit's scale and bias, MIR's text projection


def _vqgan_parameters(ddconfig: Mapping[str, Any], n_embed: int, embed_dim: int) -> int:
    """taming's Encoder (convolutions, ResNet blocks, attention where the resolution is listed), quant_conv and the
    codebook."""
    ch, mult, blocks = ddconfig["ch"], list(ddconfig["ch_mult"]), ddconfig["num_res_blocks"]
    z = ddconfig["z_channels"]

    def res(cin: int, cout: int) -> int:
        return 2 * cin + 9 * cin * cout + cout + 2 * cout + 9 * cout * cout + cout + (cin * cout + cout) * (cin != cout)

    def attn(c: int) -> int:
        return 2 * c + 4 * (c * c + c)

    total, resolution, c = 27 * ch + ch, ddconfig["resolution"], ch
    for level, m in enumerate(mult):
        for _ in range(blocks):
            total += res(c, ch * m) + (attn(ch * m) if resolution in ddconfig["attn_resolutions"] else 0)
            c = ch * m
        if level != len(mult) - 1:
            total, resolution = total + 9 * c * c + c, resolution // 2
    total += 2 * res(c, c) + attn(c) + 2 * c + 9 * c * z + z
    return total + z * embed_dim + embed_dim + n_embed * embed_dim


@functools.lru_cache(maxsize=64)
def _grid(model: str, out_index: int, kwargs: tuple[tuple[str, Any], ...]) -> tuple[int, int, int]:
    """(parameters, channels, stride) of the timm grid encoder, built on the meta device (no memory, no init)."""
    import timm
    import torch

    with torch.device("meta"):
        net = timm.create_model(
            model,
            pretrained=False,
            features_only=True,
            out_indices=(out_index,),
            **{k: list(v) if isinstance(v, tuple) else v for k, v in kwargs},
        )
    return sum(p.numel() for p in net.parameters()), net.feature_info.channels()[0], net.feature_info.reduction()[0]


def _grid_parameters(cfg: NAMCConfig, where: str) -> tuple[int, int, int]:
    import timm

    if not timm.is_model(cfg.grid_model.split(".", 1)[0]):
        raise ConfigError(
            f"{where}: grid_model: {cfg.grid_model!r} is not a timm model (timm.list_models() lists them)"
        )
    kwargs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in cfg.grid_kwargs.items()))
    try:
        return _grid(cfg.grid_model, cfg.grid_out_index, kwargs)
    except Exception as err:  # whatever timm raises for these arguments is one line naming the key
        first = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"{where}: grid_model: timm cannot build {cfg.grid_model!r} at feature level {cfg.grid_out_index} with "
            f"grid_kwargs {cfg.grid_kwargs}: {type(err).__name__}: {first}"
        ) from None


def _terms(cfg: NAMCConfig, where: str) -> list[tuple[str, str, int]]:
    """(key, what, parameters) of each part of the model, the key being the field that makes the part large."""
    d, r = cfg.dim, cfg.mlp_ratio
    grid, channels, stride = _grid_parameters(cfg, where)
    positions = max(1, cfg.image_size // stride) ** 2
    layer_key = "dim" if d > _WIDE else None
    terms = [
        (layer_key or "fdg_layers", f"{cfg.fdg_layers} FDG layers of width {d}", cfg.fdg_layers * _block(d, r)),
        (layer_key or "mir_layers", f"{cfg.mir_layers} MIR layers of width {d}", cfg.mir_layers * _block(d, r)),
        (
            "vocab_size",
            f"{cfg.vocab_size} token embeddings of width {d}",
            cfg.vocab_size * d * (2 - cfg.tie_embeddings),
        ),
        ("max_caption_len", f"{cfg.max_caption_len} caption positions of width {d}", cfg.max_caption_len * d),
        ("image_size", f"{positions} grid positions of width {d}", positions * d),
        ("dim", f"MIR's grid projection and fusion at width {d}", channels * (d + 2) + _fusion(cfg.fusion, d)),
        ("grid_model", f"the {cfg.grid_model} grid encoder", grid),
    ]
    if cfg.pretraining:
        head = cfg.vqgan_n_embed if cfg.rec_loss == "discrete" else channels
        terms += [
            ("clip_model", f"the {cfg.clip_model} CLIP towers", _clip_parameters(cfg, where, d)),
            ("vqgan_ddconfig", "the VQGAN encoder", _vqgan_parameters(cfg.vqgan_ddconfig, 0, cfg.vqgan_embed_dim)),
            ("vqgan_n_embed", f"a codebook of {cfg.vqgan_n_embed} codes", cfg.vqgan_n_embed * cfg.vqgan_embed_dim),
            ("vqgan_n_embed", f"MIR's {head}-way reconstruction head", (d + 1) * head),
        ]
    return terms


def estimate_parameters(cfg: NAMCConfig, where: str = "NAMCConfig") -> int:
    """The parameters ``cfg`` would build, from its fields (within about 10% of ``num_parameters()['total']``).

    Raises:
        ConfigError: an unknown grid or CLIP model, or grid arguments timm refuses.
    """
    return sum(n for _, _, n in _terms(cfg, where))


def check_config(cfg: NAMCConfig, where: str = "NAMCConfig", limit: float | None = None) -> None:
    """Check ``cfg`` before anything is built from it (see the module docstring).

    Args:
        cfg: the config.
        where: what it came from, e.g. ``"model/config.json"``; every message starts with it.
        limit: the most parameters it may build (default :func:`max_parameters`).

    Raises:
        ConfigError: ``"<where>: <key>: <problem>"``.
    """
    _check_fields(cfg, where)
    _check_parts(cfg, where)
    limit = max_parameters() if limit is None else limit
    terms = _terms(cfg, where)
    total = sum(n for _, _, n in terms)
    if total > limit:
        key, what, _ = max(terms, key=lambda t: t[2])
        raise ConfigError(
            f"{where}: {key}: {what} would build an estimated {_count(total)} parameters, over the limit of "
            f"{_count(limit)}; "
            f"lower it, or raise the limit with {MAX_PARAMETERS_ENV}=<count> (e.g. 5e9) if the model is meant to be "
            "that large"
        )


def _count(n: float) -> str:
    """A parameter count in short scientific notation: ``7.1e12``, ``2e9``."""
    mantissa, exponent = f"{n:.1e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def known_fields() -> set[str]:
    """The NAMCConfig fields the checks above cover (a test keeps it equal to the dataclass's fields)."""
    nested = {"grid_kwargs", "vqgan_ddconfig", "fusion", "nim_token_ngram", "name", "clip_model", "grid_model"}
    return {*_INT_RANGES, *_FLOAT_RANGES, *_BOOLS, *_OPTIONAL_STRS, *_CHOICES, *nested}
