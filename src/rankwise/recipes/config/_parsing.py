"""Expected user errors and the guarded YAML reader of the config layer."""

from __future__ import annotations

import copy
from typing import Any


class UserError(ValueError):
    """An expected user error (bad config, run directory, checkpoint): the CLI prints one line, exits 2."""


class ConfigError(UserError):
    """A config key or value is invalid (the message names the dotted key)."""


#: the largest config file read (bytes); a bigger one is refused before it is parsed
MAX_CONFIG_BYTES = 1_000_000
#: the deepest nesting of mappings/lists in a YAML config, ``--set`` value or ``-O`` option
MAX_YAML_DEPTH = 64
#: the most values (scalars, mappings, lists) a YAML document may expand to, aliases expanded
MAX_YAML_VALUES = 100_000


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (an error message stays one readable line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _yaml_children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: Any, where: str) -> None:
    """Refuse a composed YAML node graph that expands beyond the documented limits, or into itself.

    Iterative post-order walk, each distinct node once: linear in the file, whatever the aliases.
    """
    import yaml

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        k = id(node)
        if done:
            kids = _yaml_children(node)
            size[k] = 1 + sum(size[id(c)] for c in kids)
            nesting = 0 if isinstance(node, yaml.ScalarNode) else 1  # depth counts mappings and lists
            depth[k] = nesting + max((depth[id(c)] for c in kids), default=0)
            on_path.discard(k)
            if size[k] > MAX_YAML_VALUES:
                raise ConfigError(
                    f"{where}: the YAML expands to more than {MAX_YAML_VALUES:,} values through its aliases "
                    "(an alias bomb?); rankwise refuses it"
                )
            if depth[k] > MAX_YAML_DEPTH:
                raise ConfigError(f"{where}: the YAML is nested deeper than {MAX_YAML_DEPTH} levels (aliases expanded)")
            continue
        if k in size:
            continue
        if k in on_path:
            raise ConfigError(f"{where}: the YAML holds a recursive alias (a value that contains itself)")
        on_path.add(k)
        stack.append((node, True))
        stack.extend((c, False) for c in _yaml_children(node) if id(c) not in size)


def _yaml_problem(e: Exception) -> str:
    """A YAML error as one line: the problem and its line/column, never a snippet of the text."""
    import yaml

    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{e.problem or e.context or 'invalid YAML'}{where}"
    return type(e).__name__


def parse_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)`` within the documented limits; any problem is a one-line :class:`ConfigError`.

    ``where`` names the source in the message (a file, ``--set key``). Refused: more than
    :data:`MAX_CONFIG_BYTES` bytes, nesting deeper than :data:`MAX_YAML_DEPTH`, more than
    :data:`MAX_YAML_VALUES` values once aliases are expanded (an alias bomb), a recursive alias, a
    tag of a Python object (``!!python/object``: the safe loader constructs plain data only).
    """
    import yaml

    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: the YAML is larger than {MAX_CONFIG_BYTES:,} bytes")
    try:
        level = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):  # iterative: no recursion on deep input
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                level += 1
                if level > MAX_YAML_DEPTH:
                    raise ConfigError(f"{where}: the YAML is nested deeper than {MAX_YAML_DEPTH} levels")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                level -= 1
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            return None
        _check_expansion(node, where)
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: invalid YAML: {_yaml_problem(e)}") from None
    except RecursionError:  # pragma: no cover - the depth limit comes first
        raise ConfigError(f"{where}: the YAML is nested too deeply") from None


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out
