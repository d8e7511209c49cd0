"""Recipes: TOML files that name a model, a variant and its options, and the export,
verify and bench settings to use (``attnx export --recipe NAME|PATH``).

The recipes shipped with attnx live next to this module (package data); see
docs/recipes.md for the schema. This package never imports torch.
"""

from __future__ import annotations

from attnx.recipes.loader import (
    BenchSettings,
    ExportSettings,
    Recipe,
    VerifySettings,
    load_recipe,
    recipe_names,
    recipe_path,
    resolve,
    summaries,
)

__all__ = [
    "BenchSettings",
    "ExportSettings",
    "Recipe",
    "VerifySettings",
    "load_recipe",
    "recipe_names",
    "recipe_path",
    "resolve",
    "summaries",
]
