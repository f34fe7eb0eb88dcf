"""Generated pages of the documentation site (run by ``tools/mkdocs_hooks.py`` at build time).

* :func:`api_pages` -- the API reference: one page per public module, one ``::: name`` block
  (mkdocstrings) per name of the module's ``__all__``, so a new public name appears by itself.
  A name re-exported by several modules is documented once, on its home page (the first module
  of :data:`API_MODULES` that defines it), and linked from the others.
* :func:`config_reference` -- every preset and every config field (dotted key, type, default,
  meaning) read from the JSON schema of the configuration models of ``rankwise.recipes``.

All return Markdown; they import rankwise (the ``train`` extra for the config reference).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

REPO = Path(__file__).resolve().parents[1]

#: the public modules of the API reference, in the order of its pages
API_MODULES = (
    "rankwise",
    "rankwise.ops",
    "rankwise.losses",
    "rankwise.imbalanced",
    "rankwise.data",
    "rankwise.models",
    "rankwise.distributed",
    "rankwise.sodeep",
)


# --------------------------------------------------------------------------------------------------
# API reference


def api_page_path(module: str) -> str:
    return f"reference/{module}.md"


def public_names(module: str) -> list[str]:
    """The module's ``__all__`` (every public module of rankwise declares one)."""
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None)
    if names is None:
        raise ValueError(f"{module} has no __all__: its public names cannot be listed")
    return list(names)


def api_identifier(module: str, name: str) -> str:
    """The path mkdocstrings documents ``module.name`` under (also its anchor).

    A name the module provides lazily (through a module ``__getattr__``, so that importing the
    module does not import an optional dependency) cannot be found by static analysis there: it is
    documented under the module that defines it.
    """
    mod = importlib.import_module(module)
    if name in vars(mod):
        return f"{module}.{name}"
    obj = getattr(mod, name)
    return f"{obj.__module__}.{obj.__qualname__}"


def _home(module: str, name: str) -> str:
    """The module whose page documents ``module.name``."""
    obj = getattr(importlib.import_module(module), name)
    if inspect.ismodule(obj):
        return obj.__name__ if obj.__name__ in API_MODULES else module
    defined_in = getattr(obj, "__module__", None) or ""
    candidates = [
        m for m in API_MODULES[1:] if name in public_names(m) and getattr(importlib.import_module(m), name) is obj
    ]
    for m in candidates:
        if defined_in == m or defined_in.startswith(m + "."):
            return m
    return candidates[0] if candidates else module


def _summary(obj: Any) -> str:
    doc = inspect.getdoc(obj) if (callable(obj) or inspect.ismodule(obj)) else None
    if not doc:
        return ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ")
    return _strip_roles(first)


def _strip_roles(text: str) -> str:
    """Sphinx roles -> Markdown code spans (summaries in tables)."""
    text = re.sub(r":math:`([^`]*)`", r"`\1`", text)
    return re.sub(r":(?:func|class|meth|mod|data|attr|obj|exc):`~?([^`]*)`", r"`\1`", text).replace("|", "\\|")


def api_pages() -> dict[str, str]:
    """``{path under docs/: markdown}`` of the API reference (an index page plus one page per module)."""
    pages: dict[str, str] = {}
    index = [
        "# API reference",
        "",
        "Generated from the docstrings. Every function is also available as an `nn.Module` twin "
        "holding its options, and most are registered by name (`rankwise.list_ops()`, "
        "`rankwise.list_losses()`, `rankwise.data.list_datasets()`, `rankwise.models.list_backbones()`).",
        "",
        "| module | |",
        "|---|---|",
    ]
    for module in API_MODULES:
        mod = importlib.import_module(module)
        index.append(f"| [`{module}`]({module}.md) | {_summary(mod)} |")
        lines = [f"# `{module}`", "", f"::: {module}", "    options:", "      members: false"]
        lines += ["      show_root_heading: false", ""]
        here, elsewhere = [], []
        for name in public_names(module):
            (here if _home(module, name) == module else elsewhere).append(name)
        for name in here:
            obj = getattr(mod, name)
            if inspect.ismodule(obj):
                continue
            lines += [f"::: {api_identifier(module, name)}", ""]
        if elsewhere:
            lines += ["## Re-exported names", "", "| name | documented in | |", "|---|---|---|"]
            for name in elsewhere:
                home = _home(module, name)
                obj = getattr(mod, name)
                if inspect.ismodule(obj):
                    link = f"[`{home}`]({home}.md)"
                else:
                    link = f"[`{home}.{name}`]({home}.md#{api_identifier(home, name)})"
                lines.append(f"| `{module}.{name}` | {link} | {_summary(obj)} |")
            lines.append("")
        pages[api_page_path(module)] = "\n".join(lines)
    pages["reference/index.md"] = "\n".join(index) + "\n"
    return pages


# --------------------------------------------------------------------------------------------------
# configuration reference


def type_name(tp: Any) -> str:
    """A readable name of a field annotation (``"a" | "b"``, ``int | None``, ``dict[str, Any]``)."""
    origin = get_origin(tp)
    if tp is Any:
        return "any"
    if tp is type(None):
        return "None"
    if origin is Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(tp))
    if origin in (dict, list, tuple):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in get_args(tp))}]"
    if dataclasses.is_dataclass(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


@dataclasses.dataclass
class FieldRow:
    key: str
    type: str
    default: str
    doc: str
    range: str = ""


def _format_default(value: Any) -> str:
    from pydantic_core import PydanticUndefined

    if value is PydanticUndefined:
        return "(required)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def section_fields(cls: type, prefix: str) -> list[FieldRow]:
    """Rows of every field of the config model ``cls``, nested sections flattened, read from its JSON
    schema (``rankwise.recipes.config.model_fields_doc``: the same rows as ``config_fields``)."""
    from rankwise.recipes.config import model_fields_doc

    return [FieldRow(d.key, d.type, _format_default(d.default), d.doc, d.range) for d in model_fields_doc(cls, prefix)]


def config_sections() -> list[tuple[str, type]]:
    """``(dotted prefix, model)`` of every options model: the config's shared sections, then each
    registered recipe's ``task`` options."""
    from rankwise.recipes import config, registry

    out: list[tuple[str, type]] = []
    for name, f in config.Config.model_fields.items():
        if isinstance(f.annotation, type) and issubclass(f.annotation, config.Section):
            out.append((name, f.annotation))
    seen: set[type] = set()
    for name in registry.list_recipes():
        cls = registry.get_recipe(name).options
        if cls not in seen:
            seen.add(cls)
            out.append(("task", cls))
    return out


def _recipes_of(task_cls: type) -> list[str]:
    from rankwise.recipes import registry

    return [r for r in registry.list_recipes() if registry.get_recipe(r).options is task_cls]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(rows: list[FieldRow]) -> list[str]:
    out = ["| key | type | default | range | meaning |", "|---|---|---|---|---|"]
    for r in rows:
        default = f"`{_cell(r.default)}`" if r.default else ""
        rng = f"`{_cell(r.range)}`" if r.range else ""
        out.append(f"| `{r.key}` | `{_cell(r.type)}` | {default} | {rng} | {_cell(_strip_roles(r.doc))} |")
    return out


def presets() -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, description, raw YAML of the preset file)`` of every bundled preset."""
    from rankwise.recipes import config

    out = []
    for name, description in config.list_presets().items():
        path = config.preset_path(name)
        raw = config.parse_yaml(path.read_text(encoding="utf-8"), f"preset {name}") or {}
        out.append((name, description, raw))
    return out


def config_reference() -> str:
    """The Markdown page listing every preset and every config field."""
    import yaml

    from rankwise.recipes import config, load_config

    lines = [
        "# Presets and configuration reference",
        "",
        "Generated from the typed configuration of `rankwise.recipes` (`rankwise.recipes.config`) "
        "and the bundled presets when this site was built. A config file is YAML with the "
        "sections below; `extends: PRESET_OR_FILE` starts from another config, and "
        "`rankwise train CONFIG --set key=value` overrides one field (the value is parsed as YAML). "
        "Unknown keys and bad values are rejected with the dotted key and the valid choices.",
        "",
        "## Presets",
        "",
        "`rankwise presets` lists them; `rankwise train NAME` runs one. Each preset file is shown "
        "as written (`extends` names the preset it starts from).",
        "",
        "| preset | recipe | description |",
        "|---|---|---|",
    ]
    all_presets = presets()
    for name, description, _raw in all_presets:
        recipe = load_config(name).recipe
        lines.append(f"| [`{name}`](#preset-{name}) | `{recipe}` | {_cell(description)} |")
    lines.append("")
    for name, _description, raw in all_presets:
        text = yaml.safe_dump(raw, sort_keys=False, width=100, allow_unicode=True).rstrip()
        lines += [
            f'<a id="preset-{name}"></a>',
            f'??? example "`{name}`"',
            "    ```yaml",
            *(f"    {line}" for line in text.splitlines()),
            "    ```",
            "",
        ]
    lines += ["## Configuration fields", "", "### Top level", ""]
    top = [r for r in section_fields(config.Config, "") if "." not in r.key]
    lines += [*_table(top), ""]
    for prefix, cls in config_sections():
        doc = _strip_roles((inspect.getdoc(cls) or "").replace("\n", " "))
        if prefix == "task":
            recipes = ", ".join(f"`{r}`" for r in _recipes_of(cls))
            lines += [f"### `task` of the recipes {recipes} ({cls.__name__})", "", doc, ""]
        else:
            lines += [f"### `{prefix}`", "", doc, ""]
        lines += [*_table(section_fields(cls, prefix)), ""]
    return "\n".join(lines)
