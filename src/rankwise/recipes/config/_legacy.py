"""Configs in former layouts (saved in run directories before the recipe registry) read at the current places."""

from __future__ import annotations

import copy
from typing import Any

from rankwise.recipes.config._lookup import default_recipe, lookup_recipe
from rankwise.recipes.config._parsing import ConfigError, deep_merge, short
from rankwise.recipes.config._sections import FDSConfig, LDSConfig

# --------------------------------------------------------------------------------------------------
# legacy layouts (configs saved in run directories before the recipe registry)

_LEGACY_REGULARIZERS = {"pairwise": "pairwise_difference"}


#: places of the pre-registry layout that belonged to one recipe: place -> (its recipe, its key in
#: ``task``; "" merges a mapping into ``task``), registered by the recipe registry
#: (:func:`register_legacy_place`); the config layer itself knows no recipe
_LEGACY_PLACES: dict[str, tuple[str, str]] = {}


def register_legacy_place(place: str, recipe: str, key: str = "") -> None:
    """Configs of the pre-registry layout held ``place`` (a dotted key) for ``recipe``: :func:`upgrade_legacy`
    moves its value to ``task.<key>`` (``key=""``: a mapping merged into ``task``) for that recipe and drops
    it for the others."""
    _LEGACY_PLACES[place] = (recipe, key)


def _pop_place(out: dict[str, Any], place: str) -> tuple[bool, Any]:
    *parents, last = place.split(".")
    node: Any = out
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        return False, None
    return True, node.pop(last)


def upgrade_legacy(raw: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the pre-registry layout into the current one (a copy; current layouts pass unchanged).

    ``run.recipe`` -> ``recipe``; the places registered with :func:`register_legacy_place` (a
    recipe's options saved outside ``task``, e.g. ``run.init_checkpoint``) -> ``task`` of their
    recipe; ``loss.regularizers`` as a ``{name: {weight, options}}`` mapping -> a list; a saved
    default ``loss`` section of a recipe that does not read it is dropped, and the recipe's own
    ``upgrade_legacy(raw)`` (when it has one) rewrites the rest of its old options (e.g. an optimizer
    name saved in ``task``); ``loss.lds`` / ``loss.fds`` -> ``task.lds`` / ``task.fds`` (the options
    of the recipes that read them; a saved default is dropped); ``run.plots`` / ``tsne`` /
    ``plot_samples`` / ``many_shot`` / ``few_shot`` -> ``report.*``.
    """
    out = copy.deepcopy(raw)
    run = out.get("run")
    legacy_recipe = isinstance(run, dict) and "recipe" in run
    if isinstance(run, dict) and legacy_recipe:
        out.setdefault("recipe", run.pop("recipe"))
    name = out.get("recipe", default_recipe())
    for place, (owner, key) in _LEGACY_PLACES.items():
        found, value = _pop_place(out, place)
        if not found or owner != name:
            continue
        moved = value if not key else {key: value}
        if isinstance(moved, dict):
            out["task"] = {**moved, **(out.get("task") or {})}
    loss = out.get("loss")
    if isinstance(loss, dict) and isinstance(loss.get("regularizers"), dict):
        loss["regularizers"] = [
            {"name": _LEGACY_REGULARIZERS.get(str(k), str(k)), **(v or {})} for k, v in loss["regularizers"].items()
        ]
    recipe = _legacy_recipe(name) if legacy_recipe else None
    if recipe is not None:
        if "loss" not in getattr(recipe, "uses", ()):
            out.pop("loss", None)  # old run directories saved the (unused) default loss section of every recipe
        upgrade = getattr(recipe, "upgrade_legacy", None)
        if upgrade is not None:
            upgrade(out)
    _move_sections(out)
    return out


def upgrade_saved(raw: dict[str, Any]) -> dict[str, Any]:
    """A config saved in a run directory (``config.yaml``), upgraded to the current layout: :func:`upgrade_legacy`,
    then its recipe's ``upgrade_saved(raw)`` (when it has one: options an earlier version saved and the
    recipe no longer reads)."""
    out = upgrade_legacy(raw)
    recipe = _legacy_recipe(out.get("recipe", default_recipe()))
    upgrade = getattr(recipe, "upgrade_saved", None)
    if upgrade is not None:
        upgrade(out)
    return out


def _legacy_recipe(name: Any) -> Any:
    """The recipe of an old config (None when unknown: :func:`config_from_dict` reports it)."""
    try:
        return lookup_recipe(name)
    except (ConfigError, RuntimeError):
        return None


#: keys that moved: ``loss.lds`` / ``loss.fds`` to the options of the recipes that read them (``task``),
#: the plot and shot-group options of ``run`` to ``report``
MOVED = {
    ("loss", "lds"): ("task", "lds"),
    ("loss", "fds"): ("task", "fds"),
    **{("run", k): ("report", k) for k in ("plots", "tsne", "plot_samples", "many_shot", "few_shot")},
}
_MOVED_DEFAULTS = {("loss", "lds"): LDSConfig, ("loss", "fds"): FDSConfig}


def current_key(key: str) -> str:
    """The dotted ``key`` at its current place (``run.tsne`` -> ``report.tsne``; others unchanged)."""
    parts = key.split(".")
    new = MOVED.get(tuple(parts[:2]))  # type: ignore[arg-type]
    return ".".join([*new, *parts[2:]]) if new is not None and len(parts) >= 2 else key


def _is_default(section: Any, value: Any) -> bool:
    """Whether the raw mapping ``value`` only spells defaults of the model ``section`` (a saved, unused section)."""
    if value is None or value == {}:
        return True
    if not isinstance(value, dict) or not set(value) <= set(section.model_fields):
        return False
    return all(section.model_fields[k].get_default(call_default_factory=True) == v for k, v in value.items())


def _move_sections(out: dict[str, Any]) -> None:
    """Move the keys of :data:`MOVED` in place; a moved value replaces one at the new place (it came later,
    e.g. from ``--set``). A saved default ``loss.lds``/``loss.fds`` is dropped (the recipe may not read it)."""
    for (sec, key), (new_sec, new_key) in MOVED.items():
        old = out.get(sec)
        if not isinstance(old, dict) or key not in old:
            continue
        value = old.pop(key)
        model = _MOVED_DEFAULTS.get((sec, key))
        if model is not None and _is_default(model, value):
            continue
        target = out.get(new_sec)
        if target is None:
            target = out[new_sec] = {}
        if not isinstance(target, dict):
            raise ConfigError(f"`{new_sec}` must be a mapping, got {type(target).__name__} {short(target)}")
        prev = target.get(new_key)
        target[new_key] = deep_merge(prev, value) if isinstance(prev, dict) and isinstance(value, dict) else value
