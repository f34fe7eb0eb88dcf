"""The field reference (``rankwise config``, the documentation site), read from the JSON schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, get_args, get_origin

from pydantic import BaseModel

from rankwise.recipes.config._lookup import get_recipe
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


def config_fields(recipe: str | None = None) -> list[FieldDoc]:
    """Every config field (dotted key, type, default, one-line description, range), from the JSON schema.

    With ``recipe``, the ``task.*`` fields of that recipe's options and only the sections it reads.
    """
    out = [d for d in model_fields_doc(Config) if d.key != "task"]
    if recipe is not None:
        r = get_recipe(recipe)
        out = [d for d in out if d.key.split(".")[0] not in OPTIONAL_SECTIONS or d.key.split(".")[0] in r.uses]
        out += model_fields_doc(r.options, "task")
    return out
