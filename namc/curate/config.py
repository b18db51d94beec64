"""The curation pipeline's one YAML file: every ``namc curate`` step reads its own section of it.

``configs/curate/pipeline.yaml`` names the sources, the model weights, the thresholds and the output folders once::

    workdir: work/corpus                 # every step's outputs go under it unless a step names its own
    sources:
      - {name: ip2p, kind: ip2p_folder, root: /data/ip2p/clip-filtered-dataset}
      - {name: cc3m, kind: webdataset, root: "/data/cc3m/{00000..00331}.tar", captions: /data/recap.jsonl}
    embed: {clip_weights: ..., dino_weights: ..., batch_size: 64}
    pairs: {k: 10, tau_max: 0.95, tau_min: 0.78}
    describe: {base_url: http://127.0.0.1:8000/v1, model: Qwen/Qwen2-VL-7B-Instruct, concurrency: 64}

A step's command-line flags override its section; ``--print_config`` prints the section the step will run with (as
YAML, flags applied) and exits. Top-level keys (``workdir``, ``sources``) are visible to every step that declares
them as options. A key the step does not know is an error naming the file, the section and the key, so a typo in the
YAML never silently falls back to a default.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from namc.yamltext import YAMLTextError, load_yaml

__all__ = ["ConfigError", "add_config_arguments", "load_section", "parse_with_config"]

SHARED_KEYS = ("workdir", "sources")


class ConfigError(ValueError):
    """A pipeline YAML that cannot be used (the message names the file)."""


def load_section(path: str | Path, section: str) -> dict[str, Any]:
    """The ``section`` mapping of a pipeline YAML, with the shared top-level keys added (section keys win)."""
    path = Path(path)
    try:
        data = load_yaml(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError, YAMLTextError) as err:
        raise ConfigError(f"{path}: not a readable YAML file: {str(err).splitlines()[0]}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    body = data.get(section) or {}
    if not isinstance(body, dict):
        raise ConfigError(f"{path}: section {section!r} must be a mapping, got {type(body).__name__}")
    shared = {key: data[key] for key in SHARED_KEYS if key in data}
    return {**shared, **body}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--config FILE`` and ``--print_config`` to a step's parser."""
    parser.add_argument("--config", type=Path, default=None, help="pipeline YAML; this step reads its own section")
    parser.add_argument(
        "--print_config", action="store_true", help="print this step's settings (YAML, flags applied) and exit"
    )


def _dests(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest not in ("help", "config", "print_config")}


def _spellings(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--max-side`` and ``--max_side`` name the same option: rewrite each flag to the spelling the parser has.

    The steps follow LightningCLI (``--print_config``, ``--trainer.devices``) and ``namc data`` (``--shard-size``);
    accepting both spellings everywhere means a user never has to remember which step uses which.
    """
    known = {opt.replace("_", "-"): opt for action in parser._actions for opt in action.option_strings}
    out = []
    for token in argv:
        if token == "--":
            out.extend(argv[len(out) :])
            break
        if token.startswith("--"):
            flag, eq, value = token.partition("=")
            flag = known.get(flag.replace("_", "-"), flag)
            token = flag + eq + value
        out.append(token)
    return out


def parse_with_config(parser: argparse.ArgumentParser, argv: Sequence[str] | None, section: str) -> argparse.Namespace:
    """Parses ``argv`` with defaults taken from ``section`` of ``--config``: defaults < YAML < flags.

    A YAML value goes through the option's ``type`` like a flag would, so a path in the YAML becomes a ``Path``
    exactly as on the command line. The YAML's errors end the process as argparse's own do: an unknown key or an
    unreadable file is ``parser.error`` (usage and one line on stderr, exit status 2), and ``--print_config`` prints
    the settings and exits 0, like ``--help``.
    """
    argv = _spellings(parser, list(sys.argv[1:] if argv is None else argv))
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=Path, default=None)
    first, _ = pre.parse_known_args(argv)
    actions = _dests(parser)
    if first.config is not None:
        try:
            values = load_section(first.config, section)
        except ConfigError as err:
            parser.error(str(err))
        defaults = {}
        for key, value in values.items():
            dest = key.replace("-", "_")
            if dest not in actions:
                if key in SHARED_KEYS:
                    continue  # a shared key this step does not use
                known = ", ".join(sorted(actions))
                parser.error(f"{first.config}: section {section!r} has unknown key {key!r} (known: {known})")
            action = actions[dest]
            if action.nargs in ("+", "*") and value is not None and not isinstance(value, list):
                value = [value]  # one file given as a scalar for a list option
            if action.type is not None and value is not None:
                try:
                    value = [action.type(v) for v in value] if isinstance(value, list) else action.type(value)
                except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
                    parser.error(f"{first.config}: {section}.{key}: {value!r}: {err}")
            if action.choices is not None and value is not None:
                bad = [v for v in (value if isinstance(value, list) else [value]) if v not in action.choices]
                if bad:
                    parser.error(f"{first.config}: {section}.{key}: {bad[0]!r} is not one of {list(action.choices)}")
            defaults[dest] = value
        parser.set_defaults(**defaults)
        # options the YAML supplies are no longer required on the command line
        for dest in defaults:
            actions[dest].required = False
    args = parser.parse_args(argv)
    if args.print_config:
        settings = {
            dest: (str(v) if isinstance(v, Path) else v)
            for dest, v in vars(args).items()
            if dest not in ("config", "print_config")
        }
        settings = {
            k: ([str(x) if isinstance(x, Path) else x for x in v] if isinstance(v, list) else v)
            for k, v in settings.items()
        }
        print(yaml.safe_dump({section: settings}, sort_keys=False), end="")
        parser.exit(0)
    return args
