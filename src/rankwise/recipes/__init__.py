"""Training recipes: a recipe registry, typed configs + presets, one run lifecycle, reports.

Public API (imported lazily, so ``import rankwise.recipes`` does not import Lightning)::

    from rankwise.recipes import load_config, train, evaluate, predict, write_predictions, compare
    cfg = load_config("abalone_ranksim_lds", overrides=["trainer.max_epochs=50"])
    result = train(cfg, out="runs/my_run")       # RunResult(run_dir, metrics, config)
    evaluate("runs/my_run")                      # metrics dict, rewrites metrics.json + plots
    cols = predict("runs/my_run", "new.csv")     # the file's columns + "prediction"
    write_predictions(cols, "new_predictions.csv")
    compare(["abalone_vanilla", "abalone_lds"], seeds=[0, 1, 2], out="runs/cmp")

A config names its recipe (``recipe: sort``); :func:`get_recipe` / :func:`list_recipes` /
:func:`register_recipe` manage the registry (see :mod:`rankwise.recipes.registry` and
docs/recipes.md). The command line (``rankwise ...``) in :mod:`rankwise.cli` is a thin layer over
these.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Config": "config",
    "ConfigError": "config",
    "UserError": "config",
    "config_fields": "registry",
    "config_from_dict": "registry",
    "config_to_dict": "config",
    "list_presets": "config",
    "load_config": "registry",
    "Recipe": "registry",
    "get_recipe": "registry",
    "list_recipes": "registry",
    "register_recipe": "registry",
    "NonFiniteLossError": "common",
    "CheckpointError": "rundir",
    "RunDirError": "rundir",
    "RunTerminated": "rundir",
    "RunResult": "runner",
    "CompareResult": "runner",
    "train": "runner",
    "evaluate": "runner",
    "predict": "runner",
    "write_predictions": "runner",
    "compare": "runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"rankwise.recipes.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'rankwise.recipes' has no attribute {name!r}")
