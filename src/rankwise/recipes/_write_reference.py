"""``python -m rankwise.recipes._write_reference``: write the stored field reference of the built-in recipes
(``recipes/config/reference.json``, read by ``rankwise config RECIPE``; a test checks that it is current).
It lives outside the config layer, which never imports the recipe registry."""

from __future__ import annotations


def main() -> None:
    from rankwise.recipes.config._reference import REFERENCE_FILE, reference_text
    from rankwise.recipes.registry import get_recipe, list_recipes

    REFERENCE_FILE.write_text(reference_text(list_recipes(), recipes=get_recipe), encoding="utf-8")
    print(f"wrote {REFERENCE_FILE}")


if __name__ == "__main__":
    main()
