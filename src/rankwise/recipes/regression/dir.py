"""Deep imbalanced regression (``recipe: dir``) and its last-layer re-training (``recipe: rrt``): registers them.

:class:`~rankwise.recipes.regression.module.DIRRegressor`: backbone -> features -> linear head. The task
loss is the registered loss ``loss.name`` (``loss.kind: l1`` is shorthand for ``regression_l1``), with
optional per-sample LDS weights from the full training labels; FDS smooths the features;
``loss.regularizers`` add weighted losses from the registry on the features or the predictions
(see :mod:`rankwise.recipes.loss_terms`); feature regularizers (RankSim, ConR) see the encoder
output before FDS smoothing, as in the RankSim paper and code. Validation MAE selects ``checkpoints/best.ckpt``, which
is evaluated on the val and test sets with the many/medium/few-shot metrics
(``metrics.json``: ``test``, ``val``), predictions (``predictions.npz``) and plots.

``rrt`` (Regressor Re-Training, Yang et al. 2021) loads a trained run (``task.init_checkpoint``),
freezes its encoder and re-trains the head (re-initialized with ``task.reset_head``) with the
config's loss (typically LDS weights).

The recipes' classes are :class:`~rankwise.recipes.regression.recipe.DIRRecipe` and
:class:`~rankwise.recipes.regression.recipe.RRTRecipe`. This module imports no Lightning.
"""

from __future__ import annotations

from rankwise.recipes.registry import register_recipe
from rankwise.recipes.regression.recipe import DIRRecipe, RRTRecipe

__all__: list[str] = []

register_recipe(DIRRecipe())
register_recipe(RRTRecipe())
