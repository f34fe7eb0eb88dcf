"""Expected user errors and the guarded YAML reader of the config layer."""

from __future__ import annotations

import copy
import functools
import re
from typing import Any, ClassVar


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


#: the implicit types of plain scalars in the YAML 1.2 core schema: (tag, pattern, first characters)
_CORE_SCHEMA = (
    ("tag:yaml.org,2002:null", r"null|Null|NULL|~|", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"true|True|TRUE|false|False|FALSE", list("tTfF")),
    ("tag:yaml.org,2002:int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", list("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
        list("-+.0123456789"),
    ),
)


def _core_resolvers(cls: Any) -> None:
    for tag, pattern, first in _CORE_SCHEMA:
        cls.add_implicit_resolver(tag, re.compile(rf"(?:{pattern})\Z"), first)


@functools.cache
def _loader() -> Any:
    """A safe loader that types plain scalars by the YAML 1.2 core schema (and keeps the ``<<`` merge key)."""
    import yaml

    def construct(kind: str, convert: Any) -> Any:
        def build(loader: Any, node: Any) -> Any:
            text = loader.construct_scalar(node)
            try:
                return convert(text)
            except (ValueError, KeyError):
                raise yaml.constructor.ConstructorError(
                    None, None, f"{text!r} is not {kind} of YAML 1.2", node.start_mark
                ) from None

        return build

    def to_int(text: str) -> int:
        body = text.lstrip("+-")
        sign = -1 if text.startswith("-") else 1
        if body[:2] in ("0o", "0x"):
            return sign * int(body[2:], 8 if body[1] == "o" else 16)
        if not body.isascii() or not body.isdigit():
            raise ValueError(text)
        return sign * int(body, 10)  # 010 is ten: YAML 1.2 has no leading-zero octal

    def to_float(text: str) -> float:
        special = {".inf": float("inf"), "+.inf": float("inf"), "-.inf": float("-inf"), ".nan": float("nan")}
        if text.lower() in special:
            return special[text.lower()]
        if "_" in text or not re.fullmatch(_CORE_SCHEMA[3][1], text):
            raise ValueError(text)
        return float(text)

    class CoreLoader(yaml.SafeLoader):
        yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, Any]]]] = {
            k: [r for r in v if r[0] == "tag:yaml.org,2002:merge"]
            for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
            if any(r[0] == "tag:yaml.org,2002:merge" for r in v)
        }

    _core_resolvers(CoreLoader)
    CoreLoader.add_constructor("tag:yaml.org,2002:int", construct("an integer", to_int))
    CoreLoader.add_constructor("tag:yaml.org,2002:float", construct("a float", to_float))
    CoreLoader.add_constructor(
        "tag:yaml.org,2002:bool", construct("a boolean", lambda t: {"true": True, "false": False}[t.lower()])
    )
    return CoreLoader


@functools.cache
def _dumper() -> Any:
    """A safe dumper that quotes every string a YAML 1.2 *or* a YAML 1.1 reader would type otherwise."""
    import yaml

    class CoreDumper(yaml.SafeDumper):
        yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, Any]]]] = {}

    _core_resolvers(CoreDumper)  # first: how a value of rankwise's own types is written and read back
    for first, resolvers in yaml.SafeDumper.yaml_implicit_resolvers.items():
        CoreDumper.yaml_implicit_resolvers.setdefault(first, []).extend(resolvers)
    return CoreDumper


def dump_yaml(data: Any) -> str:
    """``data`` as YAML that :func:`parse_yaml` reads back to equal values, keys in their order.

    A string that a YAML reader would take for another type (``no``, ``2024``, ``1:30``, ``1e3``,
    ``null``) is quoted, whether that reader follows YAML 1.2 or YAML 1.1.
    """
    import yaml

    return str(yaml.dump(data, Dumper=_dumper(), sort_keys=False, allow_unicode=True))


def parse_yaml(text: str, where: str) -> Any:
    """Read YAML ``text`` by the YAML 1.2 core schema, within the documented limits; any problem is a
    one-line :class:`ConfigError`.

    Plain scalars are typed as YAML 1.2 types them: integers are decimal (``010`` is 10), ``0o17``
    (octal) or ``0x1f`` (hexadecimal); floats ``1.5``, ``1e3``, ``.inf``, ``.nan``; booleans only
    ``true``/``false`` (also ``True``, ``TRUE``, ...); null ``null``, ``~`` or nothing; everything
    else is a string: ``yes``, ``no``, ``on``, ``off``, ``1:30``, ``2024-01-31``, ``1_000``. The
    merge key ``<<`` is kept. ``where`` names the source in the message (a file, ``--set key``).
    Refused: more than :data:`MAX_CONFIG_BYTES` bytes, nesting deeper than :data:`MAX_YAML_DEPTH`,
    more than :data:`MAX_YAML_VALUES` values once aliases are expanded (an alias bomb), a recursive
    alias, a tag of a Python object (``!!python/object``: only plain data is constructed).
    """
    if text in _PARSED:  # the same text parses to the same data (a copy: callers may change it)
        return copy.deepcopy(_PARSED[text])
    out = _parse_yaml(text, where)
    if len(text) <= _PARSED_MAX_CHARS:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[text] = copy.deepcopy(out)
    return out


#: parsed YAML texts (successes only) -> their data; `rankwise config RECIPE` and `rankwise presets`
#: read every bundled preset's `extends:` chain, whose shared files would be parsed again each time
_PARSED: dict[str, Any] = {}
_PARSED_MAX = 512
#: longest text kept (a bundled preset is a few kB)
_PARSED_MAX_CHARS = 65_536


def _parse_yaml(text: str, where: str) -> Any:
    import yaml

    loader = _loader()
    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: the YAML is larger than {MAX_CONFIG_BYTES:,} bytes")
    try:
        level = 0
        for event in yaml.parse(text, Loader=loader):  # iterative: no recursion on deep input
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                level += 1
                if level > MAX_YAML_DEPTH:
                    raise ConfigError(f"{where}: the YAML is nested deeper than {MAX_YAML_DEPTH} levels")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                level -= 1
        node = yaml.compose(text, Loader=loader)
        if node is None:
            return None
        _check_expansion(node, where)
        return yaml.load(text, Loader=loader)  # a SafeLoader subclass
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
