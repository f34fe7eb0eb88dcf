"""The recipe lookup of the config layer (installed by the recipe registry, which it never imports)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankwise.recipes.config._parsing import ConfigError
from rankwise.recipes.config._sections import Config

#: the recipe registry's lookup ``name -> Recipe``: :mod:`rankwise.recipes.registry` installs it when
#: it is imported (the package imports it), so this module never imports a recipe or the registry
_recipe_lookup: Callable[[str], Any] | None = None


def set_recipe_lookup(lookup: Callable[[str], Any]) -> None:
    """Install the function that resolves a config's ``recipe`` name (called by the recipe registry)."""
    global _recipe_lookup
    _recipe_lookup = lookup


def get_recipe(name: str) -> Any:
    """The registered recipe ``name`` through the installed lookup (``ValueError`` if unknown)."""
    if _recipe_lookup is None:  # pragma: no cover - the package imports the registry first
        raise RuntimeError("no recipe registry is installed (import rankwise.recipes)")
    return _recipe_lookup(name)


def default_recipe() -> str:
    return str(Config.model_fields["recipe"].default)


def lookup_recipe(name: Any) -> Any:
    if not isinstance(name, str):
        raise ConfigError(f"`recipe` must be a string, got {name!r}")
    try:
        return get_recipe(name)
    except ValueError as e:
        raise ConfigError(f"`recipe`: {e}") from None
