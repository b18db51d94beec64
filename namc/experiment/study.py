"""A study file: a base recipe (pre-training and fine-tuning LightningCLI configs, the data), named variants (sets of
overrides), seeds and the metrics to collect; see ``docs/experiments.md`` and ``configs/experiments/``.

::

    name: table6
    title: "Table 6: effects of combining modules"
    recipe: {pretrain: configs/demo/pretrain.yaml, finetune: configs/demo/finetune.yaml}
    data:
      shapes: {corpus_pairs: 400, corpus_val_pairs: 100, benchmark_pairs: 300, image_size: 64, seed: 0}
      pretrain: {}            # dotted overrides of the pre-training config (a real corpus: data.init_args.train)
      finetune: {}            # likewise for fine-tuning (a real benchmark: data.init_args.name / root)
    scale: {pretrain: {trainer.max_epochs: 4}, finetune: {trainer.max_epochs: 12}}
    fast: {shapes: {...}, scale: {...}}   # what --fast replaces
    seeds: [0, 1, 2, 3, 4]
    reference: namc
    variants:
      namc: {}
      no_mir: {pretrain: {model.init_args.use_mir: false}, tags: {model: "- MIR"}}
      scratch: {pretrain: null}            # no pre-training stage: fine-tune from random weights
    metrics: [test/CIDEr-D, test/BLEU-4, pretrain/noise_auroc]
    plot: {x: p, series: masking}          # optional: a line plot over a numeric tag

Overrides are ``{"dotted.key": value}`` (``model.init_args.use_mir``) or nested mappings; they are applied in the
order recipe < data < scale < variant. Unknown top-level keys are errors that name the file.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from namc.yamltext import YAMLTextError, load_yaml

__all__ = ["Study", "StudyError", "Variant", "check_model_section", "config_hash", "load_study", "set_dotted"]

_TOP_KEYS = {
    "name",
    "title",
    "description",
    "recipe",
    "data",
    "scale",
    "fast",
    "seeds",
    "reference",
    "variants",
    "metrics",
    "plot",
}
_VARIANT_KEYS = {"pretrain", "finetune", "tags", "description"}
STAGES = ("pretrain", "finetune")
_MAX_YAML_BYTES = 4 * 1024 * 1024  # a study or recipe is a few kB


class StudyError(ValueError):
    """A malformed study file (the message names the file and the key)."""


@dataclass
class Variant:
    """One arm of a study: overrides of each stage; ``pretrain is None`` skips pre-training."""

    name: str
    pretrain: dict[str, Any] | None
    finetune: dict[str, Any]
    tags: dict[str, Any] = field(default_factory=dict)
    description: str = ""


@dataclass
class Study:
    """A parsed study file (see the module docstring)."""

    path: Path
    name: str
    title: str
    recipe: dict[str, dict[str, Any]]  # stage -> base LightningCLI config
    shapes: dict[str, Any] | None
    data: dict[str, dict[str, Any]]  # stage -> overrides
    scale: dict[str, dict[str, Any]]
    seeds: list[int]
    reference: str
    variants: list[Variant]
    metrics: list[str]
    plot: dict[str, str] | None = None
    description: str = ""

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    def stage_config(
        self, variant: Variant, stage: str, generated: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """The stage's LightningCLI config with the overrides applied in the order ``generated`` (the paths of a
        generated shapes world) < data < scale < variant (no output paths or seed yet: :mod:`namc.experiment.runner`
        adds them); None when the variant skips the stage."""
        own = variant.pretrain if stage == "pretrain" else variant.finetune
        if own is None:
            return None
        cfg = copy.deepcopy(self.recipe[stage])
        for overrides in (generated or {}, self.data.get(stage, {}), self.scale.get(stage, {}), own):
            apply_overrides(cfg, overrides)
        return cfg


def set_dotted(cfg: dict[str, Any], key: str, value: Any) -> None:
    """``cfg["a"]["b"]["c"] = value`` for ``key = "a.b.c"``, creating mappings on the way."""
    parts = key.split(".")
    node = cfg
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = copy.deepcopy(value)


def apply_overrides(cfg: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Apply ``{"dotted.key": value}`` overrides in order; a nested mapping value under a plain key merges."""
    for key, value in overrides.items():
        if "." not in key and isinstance(value, dict) and isinstance(cfg.get(key), dict):
            apply_overrides(cfg[key], value)
        else:
            set_dotted(cfg, key, value)


def config_hash(*parts: Any) -> str:
    """The first 12 hex digits of the SHA-256 of the parts' canonical JSON."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _mapping(value: Any, where: str, path: Path) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise StudyError(f"{path}: {where} must be a mapping, got {type(value).__name__}")
    return value


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    """A YAML mapping; a missing, oversized, unreadable or too deeply nested file is a :class:`StudyError`."""
    if not path.is_file():
        raise StudyError(f"{what} {path} does not exist")
    size = path.stat().st_size
    if size > _MAX_YAML_BYTES:
        raise StudyError(f"{path}: {size:,} bytes, over the limit of {_MAX_YAML_BYTES:,} for a {what}")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (YAMLTextError, UnicodeDecodeError) as err:
        raise StudyError(f"{path}: not a readable YAML file: {err}") from None
    if not isinstance(data, dict):
        raise StudyError(f"{path}: expected a mapping at the top level")
    return data


def _recipe_path(value: str, study: Path) -> Path:
    """A recipe path: absolute, relative to the study file, or relative to the working directory."""
    p = Path(value)
    if p.is_absolute():
        return p
    for base in (study.parent, Path.cwd()):
        if (base / p).is_file():
            return base / p
    # configs/experiments/x.yaml -> the repository root is two levels up
    return study.parent.parent.parent / p


def _variants(raw: dict[str, Any], recipe: dict[str, dict[str, Any]], path: Path) -> list[Variant]:
    """The study's variants, each checked (known keys, mappings, a pretrain recipe where one pre-trains)."""
    variants_raw = _mapping(raw.get("variants"), "variants", path)
    if not variants_raw:
        raise StudyError(f"{path}: no variants")
    variants = []
    for name, spec in variants_raw.items():
        spec = _mapping(spec, f"variants.{name}", path)
        bad = sorted(set(spec) - _VARIANT_KEYS)
        if bad:
            raise StudyError(f"{path}: variants.{name}: unknown key(s) {bad}; allowed: {sorted(_VARIANT_KEYS)}")
        pre = spec.get("pretrain", {})
        if pre is not None and "pretrain" not in recipe:
            raise StudyError(f"{path}: variants.{name} pre-trains but the recipe has no pretrain config")
        variants.append(
            Variant(
                str(name),
                None if pre is None else dict(_mapping(pre, f"variants.{name}.pretrain", path)),
                dict(_mapping(spec.get("finetune"), f"variants.{name}.finetune", path)),
                dict(_mapping(spec.get("tags"), f"variants.{name}.tags", path)),
                str(spec.get("description", "")),
            )
        )
    return variants


def load_study(path: str | Path, fast: bool = False, recipes: bool = True) -> Study:
    """Read and check a study file; ``fast`` applies its ``fast`` section (smaller data and schedules); without
    ``recipes`` the recipe files are not read (what a report needs).

    Raises:
        StudyError: a missing file, an unknown key, a missing recipe, an unknown reference variant.
    """
    path = Path(path)
    raw = _read_yaml(path, "study file")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise StudyError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(_TOP_KEYS)}")
    recipe_raw = _mapping(raw.get("recipe"), "recipe", path)
    if "finetune" not in recipe_raw:
        raise StudyError(f"{path}: recipe.finetune (a LightningCLI config file or mapping) is required")
    recipe: dict[str, dict[str, Any]] = {}
    for stage in STAGES:
        value = recipe_raw.get(stage)
        if value is None or not recipes:
            recipe[stage] = {} if value is not None else recipe.get(stage, {})
            if value is None:
                recipe.pop(stage, None)
            continue
        recipe[stage] = value if isinstance(value, dict) else _read_yaml(_recipe_path(str(value), path), "recipe")
    data = _mapping(raw.get("data"), "data", path)
    shapes = data.get("shapes")
    scale = _mapping(raw.get("scale"), "scale", path)
    if fast:
        fast_raw = _mapping(raw.get("fast"), "fast", path)
        if shapes is not None:
            shapes = {**shapes, **_mapping(fast_raw.get("shapes"), "fast.shapes", path)}
        scale = {s: {**scale.get(s, {}), **fast_raw.get("scale", {}).get(s, {})} for s in STAGES}
    variants = _variants(raw, recipe, path)
    reference = str(raw.get("reference", variants[0].name))
    if reference not in {v.name for v in variants}:
        raise StudyError(f"{path}: reference {reference!r} is not a variant")
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise StudyError(f"{path}: seeds must be a non-empty list of integers")
    metrics = raw.get("metrics", ["test/CIDEr-D"])
    plot = raw.get("plot")
    if plot is not None and not (isinstance(plot, dict) and "x" in plot):
        raise StudyError(f"{path}: plot must be a mapping with an 'x' tag (and optionally 'series')")
    study = Study(
        path=path,
        name=str(raw.get("name", path.stem)),
        title=str(raw.get("title", raw.get("name", path.stem))),
        recipe=recipe,
        shapes=None if shapes is None else dict(shapes),
        data={s: _mapping(data.get(s), f"data.{s}", path) for s in STAGES},
        scale={s: _mapping(scale.get(s), f"scale.{s}", path) for s in STAGES},
        seeds=list(dict.fromkeys(seeds)),
        reference=reference,
        variants=variants,
        metrics=[str(m) for m in metrics],
        plot=plot,
        description=str(raw.get("description", "")),
    )
    if recipes:
        _check_models(study)
    return study


def _check_models(study: Study) -> None:
    """Check the model of every stage of every variant before any run starts."""
    for variant in study.variants:
        # fine-tuning after pre-training loads the pre-trained model, whose config pre-training checks
        for stage in STAGES if variant.pretrain is None else ("pretrain",):
            where = f"{study.path}: variants.{variant.name}.{stage}"
            check_model_section(study.stage_config(variant, stage), where)


# init arguments of the modules whose model a recipe describes; FinetuneModule's own max_new_tokens / grid_trainable
# are settings of the module, not of the model it builds
_MODULES = {"PretrainModule": True, "FinetuneModule": False}


def check_model_section(cfg: dict[str, Any] | None, where: str) -> None:
    """Check the model a stage's LightningCLI config would build (:meth:`NAMCConfig.validate`), before any run.

    ``model.init_args`` of a ``PretrainModule`` or ``FinetuneModule``: the preset ``model``, its ``overrides`` and
    (pre-training) the switches that are :class:`NAMCConfig` fields. A stage that starts from a ``pretrained``
    model, or another module class, is not checked here (loading the model checks its config).

    Raises:
        StudyError: one line naming ``where`` and the key.
    """
    model = (cfg or {}).get("model")
    if not isinstance(model, dict):
        return
    module = str(model.get("class_path", "")).rsplit(".", 1)[-1]
    init = model.get("init_args") or {}
    if module not in _MODULES or not isinstance(init, dict) or init.get("pretrained"):
        return
    from namc.models import model_config
    from namc.models.config import NAMCConfig

    fields = set(NAMCConfig.__dataclass_fields__)
    switches = {k: v for k, v in init.items() if k in fields} if _MODULES[module] else {"pretraining": False}
    if switches.get("masking") == "none":  # PretrainModule builds "no masking" as random masking at p = 0
        switches.update(masking="random", p_img=0.0, p_txt=0.0)
    overrides = init.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise StudyError(f"{where}: model.init_args.overrides must be a mapping, got {type(overrides).__name__}")
    try:
        config = model_config(str(init.get("model", "namc_tiny")), **{**switches, **overrides})
        config.validate(f"{where} model")
    except (TypeError, ValueError) as err:  # model_config's unknown preset / keys, validate's ConfigError
        raise StudyError(f"{where}: {err}" if not str(err).startswith(where) else str(err)) from None
