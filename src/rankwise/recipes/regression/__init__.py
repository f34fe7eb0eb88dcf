"""The regression recipe family: deep imbalanced regression (``dir``), regressor re-training (``rrt``)
and Rank-N-Contrast (``rnc``), one network and one prediction path.

* :mod:`~rankwise.recipes.regression.net` -- :class:`DIRNet` (plain torch: backbone, head, the DIR loss
  stack's state), the LDS / FDS / ordinal-head helpers and the evaluation outputs
  (:func:`write_evaluation`: shot metrics, ``predictions.npz``, plots);
* :mod:`~rankwise.recipes.regression.predict` -- the prediction loop, on the device and at the
  precision the run's Lightning Trainer would predict with, without Lightning;
* :mod:`~rankwise.recipes.regression.recipe` -- the options and recipe classes (``DIROptions``,
  ``DIRRecipe``, ``RRTOptions``, ``RRTRecipe``) and the build / fit / evaluate helpers;
* :mod:`~rankwise.recipes.regression.dir` -- registers ``dir`` and ``rrt``;
* :mod:`~rankwise.recipes.regression.module` -- the Lightning module that trains the network
  (:class:`DIRRegressor`), imported only by training;
* :mod:`~rankwise.recipes.regression.rnc` -- Rank-N-Contrast pretraining (Lightning), registers ``rnc``.

This package's ``__init__`` imports nothing: importing one module (e.g. the network's helpers, which
the brain-age recipe shares) registers no recipe and imports no Lightning.
"""
