"""The field reference (``rankwise config``, the documentation site), read from the JSON schema."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, get_args, get_origin

from pydantic import BaseModel

from rankwise.recipes.config._lookup import RecipeLookup, check_lookup
from rankwise.recipes.config._sections import OPTIONAL_SECTIONS, Config, is_model, unwrap

# --------------------------------------------------------------------------------------------------
# field reference (generated from the JSON schema of the models)


class FieldDoc(NamedTuple):
    key: str
    type: str
    default: Any
    doc: str
    range: str


_JSON_TYPES = {"number": "float", "integer": "int", "boolean": "bool", "string": "str", "null": "null"}
_BOUNDS = (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<="))


def _schema_type(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " | ".join(repr(e) for e in prop["enum"])
    if "const" in prop:
        return repr(prop["const"])
    if "anyOf" in prop:
        return " | ".join(_schema_type(p) for p in prop["anyOf"])
    if "$ref" in prop:  # a nested model: its name (e.g. the entries of loss.regularizers)
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    kind = prop.get("type")
    if kind == "array":
        return f"list[{_schema_type(prop.get('items', {}))}]"
    if kind == "object":
        return "dict[str, Any]"
    return _JSON_TYPES.get(str(kind), "Any")


def _schema_range(prop: dict[str, Any]) -> str:
    for sub in (prop, prop.get("items") or {}, *prop.get("anyOf", ())):
        rng = ", ".join(f"{sym} {sub[b]:g}" for b, sym in _BOUNDS if b in sub)
        if rng:
            return rng
    return ""


def _schema_fields(
    schema: dict[str, Any], defs: dict[str, Any], model: type[BaseModel], prefix: str
) -> Iterator[FieldDoc]:
    """Every leaf field of a model's JSON schema: dotted key, type, default, description, range."""
    for name, prop in schema.get("properties", {}).items():
        key = f"{prefix}.{name}" if prefix else name
        tp = unwrap(model.model_fields[name].annotation)
        if "$ref" in prop and is_model(tp):  # a nested section
            yield from _schema_fields(defs[prop["$ref"].rsplit("/", 1)[-1]], defs, tp, key)
            continue
        if "default" in prop:
            default = prop["default"]
        else:  # a default_factory (not in the schema) or a required field
            default = model.model_fields[name].get_default(call_default_factory=True)
        items = prop.get("items") or {}
        yield FieldDoc(key, _schema_type(prop), default, str(prop.get("description", "")), _schema_range(prop))
        if "$ref" in items and get_origin(tp) is list and is_model(get_args(tp)[0]):
            elem = get_args(tp)[0]
            yield from _schema_fields(defs[items["$ref"].rsplit("/", 1)[-1]], defs, elem, f"{key}[]")


def model_fields_doc(model: type[BaseModel], prefix: str = "") -> list[FieldDoc]:
    """The reference rows of ``model`` (a section or a recipe's options), read from its JSON schema."""
    schema = model.model_json_schema()
    return list(_schema_fields(schema, schema.get("$defs", {}), model, prefix))


def _param_doc(fn: Any, name: str) -> str:
    """The description of parameter ``name`` in ``fn``'s docstring (``name``: ..., ``name (type): ...``, or
    ````name````: ...), else in the docstring of a class it names with :class:`...` in its module."""
    import inspect
    import re
    import sys

    docs = [inspect.getdoc(fn) or ""]
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    for ref in re.findall(r":class:`~?([\w.]+)`", docs[0]):
        target = getattr(module, ref.rsplit(".", 1)[-1], None)
        if target is not None:
            docs.append(inspect.getdoc(target) or "")
    n = re.escape(name)
    patterns = (
        rf"^\s*(?:\*\s*)?{n}(?:\s*\([^)]*\))?\s*:\s*(.+)$",  # Google style: name (type): text
        rf"``{n}``\s*:\s*([^;]+)",  # ``name``: text
        rf"(?:^\s*|Options:\s*|,\s*)``{n}``\s*\(((?:[^()]|\([^()]*\))+)\)",  # Options: ``name`` (text), ...
    )
    for doc in docs:
        for pat in patterns:
            m = re.search(pat, doc, flags=re.MULTILINE)
            if m:
                return " ".join(m.group(1).split()).rstrip(".;")
    return ""


def _signature_fields(
    fn: Any, prefix: str, owner: str, skip: tuple[str, ...] = (), documented: Any = None
) -> list[FieldDoc]:
    """One row per keyword option of ``fn`` (its signature): ``prefix.NAME``, type, default, description."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return []
    out = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in skip or p.name == "self":
            continue
        tp = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", str(p.annotation))
        tp = "Any" if p.annotation is p.empty else str(tp).replace("typing.", "")
        default = p.default if p.default is not p.empty else _Required
        doc = _param_doc(fn, p.name) or (_param_doc(documented, p.name) if documented is not None else "")
        out.append(FieldDoc(f"{prefix}.{p.name}", tp, default, f"{owner}{': ' + doc if doc else ''}", ""))
    return out


class _RequiredType:
    def __repr__(self) -> str:
        return "(required)"


_Required = _RequiredType()


def _recipe_components(recipe: str) -> dict[str, list[str]]:
    """The datasets, backbones and losses the recipe's bundled presets name (``data.name``, ...)."""
    from rankwise.recipes.config._loading import list_presets, load_raw

    found: dict[str, list[str]] = {"data": [], "model": [], "loss": [], "regularizers": []}

    def add(kind: str, name: Any) -> None:
        if isinstance(name, str) and name and name not in found[kind]:
            found[kind].append(name)

    for name in list_presets():
        raw = load_raw(name)
        if raw.get("recipe", "dir") != recipe:
            continue
        add("data", (raw.get("data") or {}).get("name"))
        add("model", (raw.get("model") or {}).get("backbone"))
        loss = raw.get("loss") or {}
        add("loss", loss.get("name"))
        for reg in loss.get("regularizers") or []:
            add("regularizers", (reg or {}).get("name") if isinstance(reg, dict) else None)
    return found


def component_fields(recipe: str) -> list[FieldDoc]:
    """The options inside the dict fields of ``recipe``'s config: ``data.options.KEY`` of each dataset,
    ``model.options.KEY`` of each backbone, ``loss.options.KEY`` of each task loss and
    ``loss.regularizers.NAME.options.KEY`` of each regularizer that the recipe's bundled presets use
    (read from the signature of the loader, the backbone factory or the loss's module twin)."""
    from rankwise.data import DATASETS
    from rankwise.losses import get_loss_entry
    from rankwise.models import BACKBONES

    def built(name: str) -> Any:
        entry = get_loss_entry(name)
        return (entry.module if entry.module is not None else entry.fn), tuple(entry.inputs or {}), entry.fn

    found = _recipe_components(recipe)
    out: list[FieldDoc] = []
    for name in found["data"]:
        out += _signature_fields(DATASETS.get(name), "data.options", f"dataset {name}")
    for name in found["model"]:
        out += _signature_fields(BACKBONES.get(name), "model.options", f"backbone {name}")
    for name in found["loss"]:
        fn, inputs, doc = built(name)
        out += _signature_fields(fn, "loss.options", f"loss {name}", (*inputs, "train_labels", "num_classes"), doc)
    for name in found["regularizers"]:
        fn, inputs, doc = built(name)
        out += _signature_fields(
            fn, f"loss.regularizers.{name}.options", f"regularizer {name}", (*inputs, "train_labels"), doc
        )
    return out


def config_fields(recipe: str | None = None, *, recipes: RecipeLookup | None = None) -> list[FieldDoc]:
    """Every config field (dotted key, type, default, one-line description, range), from the JSON schema.

    With ``recipe``, the ``task.*`` fields of that recipe's options, only the sections it reads, and after
    each dict field (``data.options``, ``model.options``, ``loss.options``, a regularizer's ``options``)
    the options inside it of the datasets, backbones and losses its presets use (:func:`component_fields`).
    The rows of a built-in recipe are read from :data:`REFERENCE_FILE`, written from these same
    sources (``python -m rankwise.recipes._write_reference``; a test checks that it is current), so
    that ``rankwise config RECIPE`` imports no recipe and no torch.
    """
    if recipe is not None:
        stored = _stored_rows(recipe)
        if stored is not None:
            return stored
    return live_config_fields(recipe, recipes=recipes)


#: the reference rows of every built-in recipe (:func:`write_reference` writes it)
REFERENCE_FILE = Path(__file__).with_name("reference.json")
#: how a required field's default is stored: pydantic's marker (a section field) or a signature's
_REQUIRED_MARKS = {"pydantic": "(required: pydantic)", "signature": "(required)"}


def _stored_default(value: Any) -> str:
    from pydantic_core import PydanticUndefined

    if value is PydanticUndefined:
        return _REQUIRED_MARKS["pydantic"]
    if value is _Required:
        return _REQUIRED_MARKS["signature"]
    text = repr(value)
    if _read_default(text) != value or type(_read_default(text)) is not type(value):
        raise ValueError(f"`default` {text} does not read back as a Python literal; the reference cannot store it")
    return text


def _read_default(text: str) -> Any:
    if text == _REQUIRED_MARKS["pydantic"]:
        from pydantic_core import PydanticUndefined

        return PydanticUndefined
    if text == _REQUIRED_MARKS["signature"]:
        return _Required
    return ast.literal_eval(text)


def _stored_rows(recipe: str) -> list[FieldDoc] | None:
    """The rows of ``recipe`` in :data:`REFERENCE_FILE` (``None`` where it holds none)."""
    if not REFERENCE_FILE.is_file():
        return None
    rows = json.loads(REFERENCE_FILE.read_text(encoding="utf-8"))["recipes"].get(recipe)
    if rows is None:
        return None
    return [FieldDoc(key, tp, _read_default(default), doc, rng) for key, tp, default, doc, rng in rows]


def reference_text(names: list[str], *, recipes: RecipeLookup) -> str:
    """The JSON of :data:`REFERENCE_FILE`: :func:`live_config_fields` of each recipe of ``names``."""
    out = {
        name: [
            [f.key, f.type, _stored_default(f.default), f.doc, f.range]
            for f in live_config_fields(name, recipes=recipes)
        ]
        for name in names
    }
    note = "written by `python -m rankwise.recipes._write_reference` from the recipes, datasets, models and losses"
    lines = [f'{{"note": {json.dumps(note)}, "recipes": {{']
    for i, (name, rows) in enumerate(out.items()):
        lines.append(f" {json.dumps(name)}: [")
        lines += [
            f"  {json.dumps(r, ensure_ascii=False)}{',' if j < len(rows) - 1 else ''}" for j, r in enumerate(rows)
        ]
        lines.append(" ]" + ("," if i < len(out) - 1 else ""))
    return "\n".join([*lines, "}}"]) + "\n"


def live_config_fields(recipe: str | None = None, *, recipes: RecipeLookup | None = None) -> list[FieldDoc]:
    """:func:`config_fields` read from the recipe, its presets and the signatures of their components
    (imports the recipe and the datasets, backbones and losses it uses)."""
    out = [d for d in model_fields_doc(Config) if d.key != "task"]
    if recipe is not None:
        r = check_lookup(recipes)(recipe)
        out = [d for d in out if d.key.split(".")[0] not in OPTIONAL_SECTIONS or d.key.split(".")[0] in r.uses]
        inner = component_fields(recipe)
        merged: list[FieldDoc] = []
        for d in out:
            merged.append(d)
            if d.key == "loss.regularizers[].options":
                merged += [f for f in inner if f.key.startswith("loss.regularizers.")]
            elif d.key in ("data.options", "model.options", "loss.options"):
                merged += [f for f in inner if f.key.startswith(d.key + ".")]
        out = merged + model_fields_doc(r.options, "task")
    return out
