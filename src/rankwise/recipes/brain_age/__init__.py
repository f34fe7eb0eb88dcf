"""The ``brain_age`` recipe: brain-age estimation from T1 MRI (TSAN's two stages, or SFCN).

* :mod:`~rankwise.recipes.brain_age.recipe` -- the recipe (registered as ``brain_age``), its ``task``
  options, the config checks, the stages, evaluation with the bias corrections and ``rankwise predict``;
* :mod:`~rankwise.recipes.brain_age.module` -- the Lightning module of one training stage;
* :mod:`~rankwise.recipes.brain_age.memory` -- a training step's measured memory and time, the check
  before training and the own-data route's batch size;
* :mod:`~rankwise.recipes.brain_age.study` -- a study's tables (the test gap per site and group, ComBat
  on the training split, ``RUN_DIR/report.md``) and the preprocessing of a raw cohort for prediction;
* :mod:`~rankwise.recipes.brain_age.plots` -- the evaluation plots.

The package imports none of them (the recipe registry imports the recipe on first look-up).
"""
