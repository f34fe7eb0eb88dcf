"""``python -m rankwise.recipes.config``: write the stored field reference of the built-in recipes
(:data:`rankwise.recipes.config._reference.REFERENCE_FILE`, read by ``rankwise config RECIPE``)."""

from __future__ import annotations


def main() -> None:
    from rankwise.recipes.config._reference import REFERENCE_FILE, reference_text
    from rankwise.recipes.registry import list_recipes

    REFERENCE_FILE.write_text(reference_text(list_recipes()), encoding="utf-8")
    print(f"wrote {REFERENCE_FILE}")


if __name__ == "__main__":
    main()
