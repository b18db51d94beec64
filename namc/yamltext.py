"""YAML in: one bounded reader for the YAML files namc reads (study files, recipes, the curation pipeline; the
training configs of ``namc fit --config`` go through jsonargparse's loader, bounded by :func:`check_size` in
:mod:`namc.lit.cli`).

A YAML file may come from elsewhere (a shared study, a pipeline config), and PyYAML's ``safe_load`` takes silently
what namc must refuse:

- **aliases that expand without bound**: ``safe_load`` shares an anchored node between its aliases, so nine levels
  of ten aliases (the "billion laughs") load in microseconds, but anything that walks the result as a tree (hashing a
  config as JSON, writing it out) visits 10^9 values; the loaded value is walked once here with a budget of
  ``max_values`` and refused past it (recursive aliases included);
- **a key twice in one mapping**: the last value wins without a word (an override silently lost); refused with the
  line of the second one (merge keys ``<<`` still override as YAML defines);
- **nesting deeper than Python's recursion allows**: PyYAML composes recursively; a ``RecursionError`` becomes the
  same one-line error.

Each is a :class:`YAMLTextError` (a ``ValueError``) whose message says what is wrong; callers prefix the file.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_VALUES", "YAMLTextError", "check_size", "load_yaml"]

MAX_VALUES = 1_000_000  # values of the expanded tree; a study or pipeline file holds a few hundred


class YAMLTextError(ValueError):
    """A YAML text namc will not use: invalid, a duplicate key, nested too deeply, or expanding past the budget."""


def _loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise YAMLTextError(f"duplicate key {key!r} on line {key_node.start_mark.line + 1}")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, Loader.construct_mapping)
    return Loader


def check_size(data: Any, max_values: int = MAX_VALUES) -> None:
    """Walks ``data`` as a tree (shared nodes visited once per reference), refusing more than ``max_values``."""
    budget = max_values
    stack = [data]
    while stack:
        value = stack.pop()
        budget -= 1
        if budget < 0:
            raise YAMLTextError(f"expands to more than {max_values:,} values (aliases of aliases?)")
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def load_yaml(text: str, max_values: int = MAX_VALUES) -> Any:
    """The value of a YAML document, refused as described in the module docstring."""
    import yaml

    try:
        data = yaml.load(text, Loader=_loader())  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise YAMLTextError("nested too deeply") from None
    except yaml.MarkedYAMLError as err:
        where = f" on line {err.problem_mark.line + 1}" if err.problem_mark is not None else ""
        raise YAMLTextError(f"{err.problem or err.context}{where}") from None
    except yaml.YAMLError as err:
        raise YAMLTextError(" ".join(str(err).split())) from None
    check_size(data, max_values)
    return data
