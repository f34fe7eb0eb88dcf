"""The recipe lookup the config layer is handed: ``recipes(name) -> Recipe`` (it never imports the registry)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankwise.recipes.config._parsing import ConfigError
from rankwise.recipes.config._sections import Config

#: what a config-layer function that resolves ``recipe:`` takes as ``recipes``: the recipe registry's
#: look-up ``name -> Recipe`` (``rankwise.recipes.get_recipe``), ``ValueError`` for an unknown name
RecipeLookup = Callable[[str], Any]


def check_lookup(recipes: Any) -> RecipeLookup:
    """``recipes`` itself, once it is a callable (else a ``TypeError`` naming the argument)."""
    if not callable(recipes):
        raise TypeError(
            "`recipes` must be the recipe look-up `name -> Recipe` (rankwise.recipes.get_recipe), "
            f"got {type(recipes).__name__}"
        )
    return recipes


def default_recipe() -> str:
    return str(Config.model_fields["recipe"].default)


def lookup_recipe(name: Any, recipes: RecipeLookup) -> Any:
    """The recipe ``name`` through ``recipes``; a name that is no string or not registered: a ``ConfigError``."""
    if not isinstance(name, str):
        raise ConfigError(f"`recipe` must be a string, got {name!r}")
    try:
        return check_lookup(recipes)(name)
    except ValueError as e:
        raise ConfigError(f"`recipe`: {e}") from None
