"""Brain-age estimation from T1 MRI (``recipe: brain_age``): TSAN's two stages, or SFCN.

TSAN (Cheng et al., "Brain Age Estimation From MRI Using Cascade Networks With Ranking Loss", IEEE
TMI 2021), ``model.backbone: scale_dense``:

* stage 1 (``RUN_DIR/stage1/``, ``trainer.max_epochs``): :class:`~rankwise.models.ScaleDense` on
  ``(volume, sex)`` with the task loss ``loss.kind`` (MSE in the paper) plus ``loss.regularizers``
  on the predicted ages -- the paper's ``lambda * (L_r + beta * L_d)`` is the ``spearman`` term
  (weight lambda, any soft ranker: ``sodeep`` as the authors, ``isotonic``, ``neuralsort``) and the
  ``pairwise_difference`` term (weight lambda * beta, ``pairs: random`` as the authors or ``all``);
* stage 2 (``task.stages: 2``, ``RUN_DIR/checkpoints/``, ``task.stage2_epochs`` at
  ``task.stage2_lr``): :class:`~rankwise.models.TSANSecondStage` on the volume, sex and stage 1's
  prediction discretized with :func:`rankwise.discretize_age` (``task.step``); stage 1 is frozen
  (eval mode, no gradient); the task loss applies to the residual (target ``age - discretized``),
  the regularizers to the final age.

SFCN (Peng et al., Medical Image Analysis 2021), ``model.backbone: sfcn``: one stage, KL loss between
the predicted age-bin distribution and Gaussian soft labels (``task.sfcn_sigma``), plus any
regularizers on the expected age.

Ordinal heads (``loss.name``: an ordinal loss of the registry, one whose entry has an
:class:`~rankwise._registry.OrdinalHead`: ``coral``, ``corn``, ``cdw_ce``, ``dldl``, ...; one stage): the
network's final layers are replaced by the loss's head (:func:`~rankwise.recipes.regression.net.ordinal_head_module`)
on the features they received -- ScaleDense's ``end_fc`` on the ``(B, 40)`` (with sex) features, over the
classes of :meth:`~rankwise._binning.LabelClasses.fit` on the training ages with ``task.class_width``;
SFCN's final 1^3 convolution on the pooled features, over SFCN's own age bins. The class map is the
buffer ``label_class_map`` of the checkpoint; predictions are the decoded classes' ages
(:func:`~rankwise.recipes.regression.net.decode_ordinal`, as the DIR recipes), so evaluation, the bias
corrections and ``rankwise predict`` are those of the regression.

The DIR recipes' imbalanced-regression mechanisms, on ScaleDense's one stage (``task.stages: 1``):
``task.lds`` weights the task loss per sample (:func:`~rankwise.recipes.regression.net.lds_buffers` /
:func:`~rankwise.recipes.regression.net.lds_sample_weights`, 1-year age bins); ``loss.name`` may be a registry
loss of predictions and targets (``balanced_mse``, ``dist_loss``; a loss with parameters gets its own
optimizer group, :func:`~rankwise.recipes.regression.net.loss_param_groups`); regularizers whose registry entry
takes ``features`` (``ranksim``, ``ordinal_entropy``) see :meth:`ScaleDense.features`, the penultimate
``(B, 40)`` (with sex) that the final layers or an ordinal head receive. SFCN and TSAN's second stage
take none of them (one ``ConfigError`` naming the key). The test metrics add the DIR recipes' shot-group
MAE (``mae_many`` / ``mae_medium`` / ``mae_few``: :func:`~rankwise.recipes.regression.net.shot_metrics`) and
``qwk`` / ``exact_acc`` of the 1-year age classes.

Under DDP (``--devices N --strategy ddp``) the regularizers are built with ``distributed="auto"``:
the Spearman and age-difference losses see the **global** batch (``N * data.batch_size``; a SoDeep
sorter ranks the bundled lengths 32/64/128, any other length goes to the term's ``fallback`` ranker), the task
loss is averaged by DDP.

Before training, a training step's memory, measured on the machine for the network and grid
(:mod:`rankwise.recipes.brain_age.memory`), is checked against the available memory: a step that
would not fit is one ``error:`` line naming both and the ``data.batch_size`` that fits.

Each stage trains a :class:`~rankwise.recipes.brain_age.module.BrainAgeModule`; its validation MAE selects
the stage's ``best.ckpt``. Evaluation: MAE, RMSE, Pearson r, Spearman rho,
R^2, brain-age gap (BAG) mean/SD and corr(BAG, age), before and after the bias correction
(:func:`rankwise.correct_age_bias`, ``"gap"`` and ``"prediction"``, fitted on the validation set and
applied to the test set), MAE per decade; ``predictions.csv`` (subject, site, split, age,
predictions) and plots. A brain-age study's tables (:mod:`rankwise.recipes.brain_age.study`): the
bias-corrected test gap per site (``study.site_column``) and per group against a reference group
(``study.group_column``, ``study.reference_group``: Cohen's d, Welch / Mann-Whitney p, AUC), optionally
harmonised across sites by ComBat fitted on the training split (``study.harmonize: combat``), in
``metrics.json["study"]``, ``RUN_DIR/report.md`` and the tables ``rankwise train`` / ``evaluate`` print.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from rankwise._fileio import atomic_open
from rankwise.models.volumetric import ScaleDense
from rankwise.recipes.brain_age.module import BrainAgeModule
from rankwise.recipes.common import regression_loaders, to_builtin
from rankwise.recipes.config import Config, ConfigError, LDSConfig, Options, check_lds
from rankwise.recipes.datamodules import LoaderData
from rankwise.recipes.loss_terms import check_loss_config, ordinal_head_of
from rankwise.recipes.registry import Recipe, register_recipe
from rankwise.recipes.regression.net import note_label_classes, run_shot_thresholds, shot_metrics
from rankwise.recipes.rundir import Run
from rankwise.recipes.stages import Stage, plot_stage_curves, stage_log

__all__ = ["BrainAgeOptions", "BrainAgeRecipe"]

_NETWORKS = ("scale_dense", "sfcn")
#: test metrics of the CLI tables (the report lists all of them)
TABLE_METRICS = (
    "mae",
    "mae_many",
    "mae_medium",
    "mae_few",
    "qwk",
    "pearson",
    "corr_bag_age",
    "corr_bag_age_gap",
    "stage1_mae",
    "epoch_seconds",
)
Table = tuple[list[str], list[list[str]]]


class BrainAgeOptions(Options):
    """TSAN's stages (``model.backbone: scale_dense``) or SFCN (``sfcn``); losses in the ``loss`` section."""

    stages: int = Field(
        2, description="TSAN: 1 (ScaleDense only) or 2 (+ the second stage on its discretized ages)", ge=1, le=2
    )
    step: float = Field(5.0, description="TSAN: discretisation step of the stage-1 ages fed to stage 2 (years)", gt=0)
    stage2_epochs: int | None = Field(None, description="TSAN: epochs of stage 2 (default trainer.max_epochs)", ge=1)
    stage2_lr: float = Field(1e-5, description="TSAN: learning rate of stage 2", gt=0)
    sfcn_sigma: float = Field(1.0, description="SFCN: SD (years) of the Gaussian soft age labels", gt=0)
    class_width: float = Field(
        1.0,
        description="ScaleDense with an ordinal `loss.name`: width (years) of the age classes, bins from the "
        "youngest training age (integer ages: one class per year); SFCN's classes are its own bins",
        gt=0,
    )
    montage: int = Field(3, description="preprocessed test volumes shown in plots/inputs_montage.png", ge=0)
    init_age_bias: bool = Field(
        True,
        description="TSAN: start the stage-1 output bias at the mean training age and stage 2 at the discretized "
        "stage-1 age (its last layer zeroed), else PyTorch's default initialisation",
    )
    lds: LDSConfig = Field(
        default_factory=LDSConfig,
        description="ScaleDense, one stage: label-distribution reweighting / smoothing of the task loss (the "
        "DIR recipes' `task.lds`), over 1-year age bins of the training ages",
    )
    age_scale: float | None = Field(
        1.0,
        description="TSAN: stage 1 predicts age / age_scale (years; 1: the authors' raw ages; null: the SD of the "
        "training ages, i.e. standardised targets); losses and metrics stay in years",
        gt=0,
    )


# ------------------------------------------------------------------------------------------ stages


def _loaders(run: Run) -> tuple[Any, Any, Any]:
    return regression_loaders(run.data, run.cfg)


def _stage(run: Run, module: BrainAgeModule, name: str, epochs: int, *, last: bool) -> Stage:
    """A TSAN / SFCN training stage: best = lowest validation MAE, handed on to the next stage (the
    ``last`` stage's is tested from its checkpoint)."""
    # stage 2 holds the frozen stage-1 network in eval mode on purpose
    quiet = [r"Found \d+ module\(s\) in eval mode"]
    hand_on: Literal["best"] | None = None if last else "best"
    data = LoaderData(*_loaders(run))
    return Stage(name, module, data, epochs=epochs, monitor="val/mae", hand_on=hand_on, quiet=quiet)


def _two_stages(run: Run) -> bool:
    return run.cfg.model.backbone == "scale_dense" and run.cfg.task.stages == 2


def _second(run: Run, first: BrainAgeModule, *, init: bool = False) -> BrainAgeModule:
    """TSAN's second stage on the (trained, now frozen) first-stage network.

    With ``init`` and ``task.init_age_bias`` the last layer of both residual heads is zeroed, so that
    training starts from the discretized stage-1 age (residual 0) instead of a random offset of
    several years (the discretized age enters ``dis_fc`` in years).
    """
    second = BrainAgeModule(run.cfg, stage="second", first=first.net, age_scale=first.age_scale)
    if init and run.cfg.task.init_age_bias:
        with torch.no_grad():
            for name in ("end_fc_with_gender", "end_fc_without_gender"):
                last: nn.Linear = getattr(second.net, name)[-1]  # type: ignore[assignment]
                last.weight.zero_()
                last.bias.zero_()
    return second


def first_module(run: Run) -> BrainAgeModule:
    """The run's first-stage module (ScaleDense or SFCN; with an ordinal loss, its head over the age classes)."""
    d = run.model_data  # the trained age scale, bins and classes, also on data changed since training
    labels = d.train_labels
    return BrainAgeModule(
        run.cfg,
        stage="first",
        age_scale=resolve_age_scale(run.cfg, labels),
        train_labels=labels,
        bin_width=d.bin_width,
    )


def resolve_age_scale(cfg: Config, train_labels: Any) -> float:
    """``task.age_scale``, or for ``null`` the SD of the training ages (1 for SFCN and the ordinal heads,
    which classify)."""
    if cfg.model.backbone == "sfcn" or ordinal_head_of(cfg.loss) is not None:
        return 1.0
    if cfg.task.age_scale is not None:
        return float(cfg.task.age_scale)
    sd = float(np.std(np.asarray(train_labels, dtype=np.float64)))
    return sd if sd > 0 else 1.0


def _stage_dirs(run: Run) -> tuple[str, str | None]:
    """Checkpoint folders of stage 1 and stage 2 (the last stage uses the main ``checkpoints``)."""
    if _two_stages(run):
        return "stage1", ""
    return "", None


# ------------------------------------------------------------------------------------------ evaluation


def _predict(run: Run, module: BrainAgeModule, loader: Any, name: str, stage: str) -> tuple[np.ndarray, np.ndarray]:
    outs, _ = run.predict(module, loader, name, stage)
    pred = torch.cat([o["pred"] for o in outs]).cpu().double().numpy()
    label = torch.cat([o["label"] for o in outs]).cpu().double().numpy()
    return pred, label


#: the bias corrections of :func:`rankwise.correct_age_bias` that evaluation and prediction apply
CORRECTIONS = ("gap", "prediction")


def _bias_corrected(
    pred: np.ndarray, age: np.ndarray, fit_pred: np.ndarray, fit_age: np.ndarray
) -> dict[str, np.ndarray]:
    """Each of :data:`CORRECTIONS` fitted on ``(fit_pred, fit_age)`` (the validation set) and applied to
    ``(pred, age)``; NaN where no line fits (e.g. constant validation predictions) and, for ``"gap"``, which
    subtracts a line in the chronological age, where ``age`` is NaN (unknown). ``"prediction"`` inverts
    the fitted line and does not use ``age``."""
    import warnings

    from rankwise.brain_age import BiasCorrectionWarning, correct_age_bias
    from rankwise.recipes.common import DataDefaultsWarning

    known = np.isfinite(age)
    out: dict[str, np.ndarray] = {}
    said: list[str] = []  # each reason once, as a `warning:` line
    for method in CORRECTIONS:
        values = np.full(pred.shape, np.nan)
        rows = known if method == "gap" else np.ones_like(known)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", BiasCorrectionWarning)
                values[rows] = correct_age_bias(
                    pred[rows],
                    np.where(known, age, 0.0)[rows],  # unknown ages reach only "prediction", which ignores them
                    fit_pred=fit_pred,
                    fit_age=fit_age,
                    method=method,  # type: ignore[arg-type]
                )
            said += [f"{w.message} (the validation set)" for w in caught]
        except ValueError as e:  # no line fits: NaN
            said.append(f"no {method!r} bias correction: {e}")
        out[method] = values
    for message in dict.fromkeys(said):
        warnings.warn(message, DataDefaultsWarning, stacklevel=2)
    return out


def _evaluate_module(run: Run, module: BrainAgeModule, name: str, stage: str, *, write: bool) -> dict[str, Any]:
    """Val/test metrics of checkpoint ``<stage dir>/<name>.ckpt`` (Lightning loads it into ``module``) with both
    bias corrections fitted on val; with ``write``, predictions.csv + plots."""
    from rankwise.brain_age import brain_age_metrics

    _, val_dl, test_dl = _loaders(run)
    val_pred, val_age = _predict(run, module, val_dl, name, stage)
    test_pred, test_age = _predict(run, module, test_dl, name, stage)
    corrected = _bias_corrected(test_pred, test_age, val_pred, val_age)
    test = brain_age_metrics(test_pred, test_age)
    flat = {k: v for k, v in test.items() if not isinstance(v, dict)}
    flat |= _shot_and_class_metrics(run, test_pred, test_age)
    for method, values in corrected.items():
        if not np.isfinite(values).all():  # no correction fits (e.g. constant validation predictions)
            flat[f"corr_bag_age_{method}"] = flat[f"mae_{method}"] = None
            continue
        m = brain_age_metrics(test_pred, test_age, corrected=values)["corrected"]
        flat[f"corr_bag_age_{method}"] = m["corr_bag_age"]
        flat[f"mae_{method}"] = m["mae"]
    many, few = run_shot_thresholds(run.cfg, run.data)
    out = {
        "test": flat,
        "val": {k: v for k, v in brain_age_metrics(val_pred, val_age).items() if not isinstance(v, dict)},
        "mae_by_decade": test.get("mae_by_decade", {}),
        "shot_thresholds": {"many": many, "few": few},
    }
    if write:
        from rankwise.recipes.brain_age.study import study_metrics, train_eval_dataset, write_study_report

        def predict_train() -> tuple[np.ndarray, np.ndarray]:
            from rankwise.recipes.common import eval_loader

            loader = eval_loader(train_eval_dataset(run.data.train), run.data, run.cfg)
            return _predict(run, module, loader, name, stage)

        study = study_metrics(run, predict_train, (val_pred, val_age), (test_pred, test_age))
        if study is not None:
            out["study"] = study
        _write_predictions(run, val_pred, val_age, test_pred, test_age, corrected)
        write_study_report(run, to_builtin(out))
    return to_builtin(out)


def _shot_and_class_metrics(run: Run, pred: np.ndarray, age: np.ndarray) -> dict[str, Any]:
    """The DIR recipes' shot-group MAE (:func:`~rankwise.recipes.regression.net.shot_metrics`: 1-year age bins,
    many-shot above ``report.many_shot`` training subjects, few-shot below ``report.few_shot``, else the
    cohort's own thresholds) and the class metrics of the 1-year age classes (QWK, exact accuracy)."""
    m = shot_metrics(pred, age, run.data, run.cfg)
    out: dict[str, Any] = {}
    for group in ("many", "medium", "few"):
        out[f"mae_{group}"] = m[group]["mae"]
        out[f"n_{group}"] = m[group]["count"]
    ordinal = m.get("ordinal") or {}
    out["qwk"] = ordinal.get("qwk")
    out["exact_acc"] = ordinal.get("exact_acc")
    return out


def _write_predictions(
    run: Run,
    val_pred: np.ndarray,
    val_age: np.ndarray,
    test_pred: np.ndarray,
    test_age: np.ndarray,
    corrected: dict[str, np.ndarray],
) -> None:
    import csv

    meta = run.data.meta
    path = run.results / "predictions.csv"
    with atomic_open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["subject", "site", "split", "age", "pred", "pred_corrected_gap", "pred_corrected_prediction"])
        for split, pred, age in (("val", val_pred, val_age), ("test", test_pred, test_age)):
            subjects = meta.get(f"{split}_subjects", [""] * len(age))
            sites = meta.get(f"{split}_sites", [""] * len(age))
            for i in range(len(age)):
                gap = corrected["gap"][i] if split == "test" else ""
                pr = corrected["prediction"][i] if split == "test" else ""
                w.writerow([subjects[i], sites[i], split, f"{age[i]:.3f}", f"{pred[i]:.6f}", _fmt(gap), _fmt(pr)])
    pdir = run.plots_dir
    if pdir is not None:
        from rankwise.recipes.brain_age import plots

        title = f"{run.cfg.run.name} (seed {run.cfg.run.seed})"
        plots.plot_pred_vs_age(test_pred, test_age, pdir / "pred_vs_age.png", title=title)
        plots.plot_bag_vs_age(test_pred, test_age, corrected, pdir / "bag_vs_age.png", title=title)
        plots.plot_mae_by_decade(test_pred, test_age, pdir / "mae_by_decade.png", title=title)
        if run.cfg.task.montage > 0:
            plots.plot_montage(run.data.test, pdir / "inputs_montage.png", n=run.cfg.task.montage)
        plot_stage_curves(run, stage_log(run, "stage1"), "stage1", "stage 1")


def _fmt(v: Any) -> str:
    return "" if isinstance(v, str) else f"{float(v):.6f}"


def _predict_cohort(run: Run, path: Path, checkpoint: str | None) -> dict[str, Any]:
    """:meth:`BrainAgeRecipe.predict_file`."""
    from torch.utils.data import DataLoader

    from rankwise.data.nifti import NiftiPreprocessing, load_nifti_cohort
    from rankwise.recipes.common import loader_workers, warn_data_notes
    from rankwise.recipes.predict_data import extend_columns, require_checkpoint, target_column

    cfg = run.cfg
    if cfg.data.name != "nifti":
        raise ConfigError(
            f"recipe 'brain_age' predicts from a `nifti` run's CSV, but the run's `data.name` is {cfg.data.name!r}"
        )
    dir1, _ = _stage_dirs(run)
    name = checkpoint or "best"
    two = _two_stages(run)
    for ckpt, stage in [("best", dir1), (name, "")] if two else [(name, dir1)]:
        require_checkpoint(run, ckpt, stage)  # before the new volumes are preprocessed
    first = first_module(run)
    # the training run's preprocessing, whole (its data's meta, as data.json records it)
    prep = NiftiPreprocessing.from_dict(run.data.meta["preprocessing"])
    cohort = load_nifti_cohort(
        path,
        target=target_column(cfg) or "age",
        preprocessing=prep,
        grid=run.data.meta.get("shape"),
        require_sex=first.uses_sex,
    )
    warn_data_notes(cohort)
    new_dl = DataLoader(
        cohort.dataset, batch_size=cfg.data.eval_batch_size, shuffle=False, **loader_workers(cfg.data.num_workers)
    )
    _, val_dl, _ = _loaders(run)
    stage1: np.ndarray | None = None
    module, stage = first, dir1
    if two:  # as evaluate: stage 1's best (the weights stage 2 was trained on), then stage 2's `name`
        stage1, _ = _predict(run, first, new_dl, "best", dir1)
        module, stage = _second(run, first), ""
    val_pred, val_age = _predict(run, module, val_dl, name, stage)
    pred, _ = _predict(run, module, new_dl, name, stage)
    age = cohort.ages
    corrected = _bias_corrected(pred, age, val_pred, val_age)
    computed: dict[str, np.ndarray] = {} if stage1 is None else {"stage1_prediction": stage1}
    computed["gap"] = pred - age
    computed |= {f"prediction_corrected_{m}": corrected[m] for m in CORRECTIONS}
    computed |= {f"gap_corrected_{m}": corrected[m] - age for m in CORRECTIONS}
    computed["prediction"] = pred  # last, as every recipe's `rankwise predict` output
    return extend_columns(cohort.columns, computed)


def _devices(cfg: Config) -> int:
    d = cfg.trainer.devices
    return len(d) if isinstance(d, (list, tuple)) else int(d) if str(d).isdigit() and int(d) > 0 else 1


def _sodeep_terms(cfg: Config) -> list[Any]:
    """The ``spearman`` regularizers that rank with a bundled SoDeep sorter (no ``sorter`` of their own)."""
    return [
        reg
        for reg in cfg.loss.regularizers
        if reg.name == "spearman" and (reg.options or {}).get("ranker") == "sodeep" and reg.weight != 0
        if (reg.options or {}).get("sorter") is None and (reg.options or {}).get("model", "gru") != "exact"
    ]


def _check_sodeep_batch(cfg: Config, n_train: int | None = None, *, note: bool = True) -> None:
    """A bundled SoDeep sorter ranks sequences of one length: every training batch (global under DDP; the one
    batch of a training split smaller than it) must be one of them, or the term names a ``fallback`` ranker;
    with a fallback that some batch uses, a ``note:`` line (once) names the lengths and the fallback."""
    from rankwise.sodeep import BUNDLED_SEQ_LENS

    devices = _devices(cfg)
    batch = cfg.data.batch_size * devices
    lengths = {batch} if n_train is None or n_train > cfg.data.batch_size else {n_train}
    others = sorted(n for n in lengths if n not in BUNDLED_SEQ_LENS and n > 1)
    if not others:
        return
    for reg in _sodeep_terms(cfg):
        fallback = (reg.options or {}).get("fallback")
        if fallback is None:
            what = (
                f"data.batch_size={cfg.data.batch_size} x {devices} device(s) = {batch}"
                if others == [batch]
                else f"the {n_train} training subjects (one batch, fewer than data.batch_size={cfg.data.batch_size})"
            )
            raise ConfigError(
                f"`loss.regularizers.spearman.options.ranker` 'sodeep' uses a bundled sorter of length "
                f"{list(BUNDLED_SEQ_LENS)}, which the training batch must equal (the authors' sorter has the "
                f"batch's length); got {what}: set `data.batch_size` to one of them, "
                "`loss.regularizers.spearman.options.fallback=isotonic` (the ranker of the other lengths) or "
                "another ranker (isotonic, neuralsort)"
            )
        if n_train is not None and note:
            import warnings

            from rankwise.recipes.common import DataNote

            warnings.warn(
                f"`loss.regularizers.spearman`: the bundled SoDeep sorters rank batches of "
                f"{', '.join(map(str, BUNDLED_SEQ_LENS))}; the training batches of {', '.join(map(str, others))} "
                f"rank with its fallback {fallback!r} (its default options)",
                DataNote,
                stacklevel=2,
            )


def _decodes_with_gradient(ordinal: Any) -> bool:
    """Whether an ordinal head's decoded prediction has a gradient (an expectation) or not (a class)."""
    return bool(ordinal.predict(torch.zeros(1, 3, requires_grad=True)).requires_grad)


def _one_scale_dense_stage(cfg: Config) -> bool:
    return cfg.model.backbone == "scale_dense" and cfg.task.stages == 1


def _check_task_loss(cfg: Config) -> None:
    """``loss.name``: an ordinal loss (one stage; regularizers on the ages need a decoder with a gradient)
    or a regression loss of the registry on ScaleDense's ages (one stage)."""
    from rankwise.losses import get_loss_entry

    name = cfg.loss.name
    if name is None:
        return
    ordinal = ordinal_head_of(cfg.loss)
    if ordinal is None:  # a regression loss on predictions and targets (check_loss_config checked its inputs)
        if cfg.model.backbone == "sfcn":
            raise ConfigError(
                f"`loss.name: {name}` is a loss of predicted ages, which SFCN does not regress (it trains the KL "
                "of its age bins to soft labels, `task.sfcn_sigma`): use `model.backbone: scale_dense` with "
                "`task.stages: 1`, or an ordinal loss over SFCN's bins"
            )
        if cfg.task.stages != 1:
            raise ConfigError(
                f"`loss.name: {name}` trains ScaleDense's one stage: set `task.stages: 1`, got "
                f"`task.stages: {cfg.task.stages}` (TSAN's second stage regresses a residual with `loss.kind`)"
            )
        return
    if cfg.task.stages != 1:
        raise ConfigError(
            f"`loss.name: {name}` (an ordinal head) trains one stage: set `task.stages: 1`, got "
            f"`task.stages: {cfg.task.stages}` (TSAN's second stage regresses a residual)"
        )
    if _decodes_with_gradient(ordinal):
        return
    for reg in cfg.loss.regularizers:
        if reg.weight != 0 and "predictions" in (get_loss_entry(reg.name).inputs or {}).values():
            raise ConfigError(
                f"`loss.regularizers.{reg.name}` applies to the predicted ages, which the `loss.name: {name}` "
                "head decodes as a class (no gradient), so it would train nothing: use an ordinal loss "
                "predicted by the expectation (dldl, mean_variance) or remove the regularizer"
            )


def _check_one_stage_options(cfg: Config) -> None:
    """Feature regularizers (RankSim, Ordinal Entropy) and ``task.lds`` fit ScaleDense's one stage only:
    SFCN has no such features and a stage 2 would train without them."""
    from rankwise.losses import get_loss_entry
    from rankwise.recipes.loss_terms import task_loss_name

    where = (
        "SFCN's (`model.backbone: sfcn`)"
        if cfg.model.backbone == "sfcn"
        else f"TSAN's two stages (`task.stages: {cfg.task.stages}`)"
    )
    for reg in cfg.loss.regularizers:
        if reg.weight != 0 and "features" in (get_loss_entry(reg.name).inputs or {}).values():
            if not _one_scale_dense_stage(cfg):
                raise ConfigError(
                    f"`loss.regularizers.{reg.name}` applies to ScaleDense's penultimate features, which only "
                    f"its one stage trains (`model.backbone: scale_dense`, `task.stages: 1`), not {where}"
                )
    lds = cfg.task.lds
    check_lds(lds)
    if lds.reweight == "none":
        return
    if not _one_scale_dense_stage(cfg):
        raise ConfigError(
            f"`task.lds.reweight: {lds.reweight}` reweights the task loss of ScaleDense's one stage "
            f"(`model.backbone: scale_dense`, `task.stages: 1`), not {where}"
        )
    name = task_loss_name(cfg.loss)
    if "weights" not in (get_loss_entry(name).inputs or {}).values():
        raise ConfigError(
            f"`task.lds.reweight: {lds.reweight}` weights the task loss per sample, but `{name}` takes no "
            "per-sample weights: set `task.lds.reweight: none` or use a weighted loss (`loss.kind: l1`, mse, huber)"
        )


class BrainAgeRecipe(Recipe):
    """TSAN (two stages) or SFCN brain-age estimation on a ``nifti`` cohort."""

    name = "brain_age"
    predict_reads_data = True  # the bias corrections fit the validation predictions
    description = "brain age from T1 MRI: TSAN's two stages (ScaleDense + second stage) with ranking losses, or SFCN"
    options: type = BrainAgeOptions
    uses = frozenset({"loss", "study"})
    learns: Literal["regression", "classification"] = "regression"
    report_kind = "brain_age"

    def prediction_input(
        self, run_dir: Path, path: Path, preprocess_out: str | Path | None, *, on_scan: Any = None
    ) -> Path:
        """A raw cohort CSV preprocessed with the run's template into ``preprocess_out`` first
        (:func:`~rankwise.recipes.brain_age.study.preprocess_for_run`); a preprocessed one as it is."""
        from rankwise.recipes.brain_age.study import preprocess_for_run

        return preprocess_for_run(run_dir, path, preprocess_out, on_scan=on_scan)

    def check(self, cfg: Config) -> None:
        if cfg.model.backbone not in _NETWORKS:
            raise ConfigError(
                f"`model.backbone` of recipe 'brain_age' must be one of {list(_NETWORKS)}, got {cfg.model.backbone!r}"
            )
        if cfg.model.backbone == "sfcn" and cfg.task.stages != 1:
            raise ConfigError("`task.stages` must be 1 with `model.backbone: sfcn` (SFCN has one stage)")
        if cfg.loss.kind not in ("mse", "l1", "huber"):
            raise ConfigError(f"`loss.kind` of recipe 'brain_age' must be mse, l1 or huber, got {cfg.loss.kind!r}")
        check_loss_config(cfg.loss)
        _check_task_loss(cfg)
        _check_one_stage_options(cfg)
        _check_sodeep_batch(cfg)

    def method(self, cfg: Config) -> str:
        if cfg.loss.name is not None:
            return f"{'sfcn' if cfg.model.backbone == 'sfcn' else 'scale_dense'}_{cfg.loss.name}"
        if cfg.model.backbone == "sfcn":
            return "sfcn"
        return "tsan" if cfg.task.stages == 2 else "scale_dense"

    def fit(self, run: Run) -> dict[str, Any]:
        cfg = run.cfg
        data = run.data
        modality = getattr(data, "modality", None)
        if modality != "volumes":
            raise ConfigError(f"recipe 'brain_age' needs a volume dataset (`data.name: nifti`), got {modality!r}")
        _check_sodeep_batch(cfg, len(data.train_labels), note=run.is_global_zero)
        from rankwise.recipes.brain_age.study import check_study

        check_study(run)  # the report's site / group columns, before training
        if "shape" in data.meta and cfg.trainer.memory_check:  # before training: one error line, not the kernel's kill
            from rankwise.recipes.brain_age.memory import check_memory

            check_memory(cfg, data.meta["shape"])
        first = first_module(run)
        note_label_classes(run, cfg.loss.name, first.label_classes)
        if cfg.task.init_age_bias and isinstance(first.net, ScaleDense) and first.ordinal is None:
            mean_age = float(np.mean(data.train_labels)) / first.age_scale
            with torch.no_grad():
                for head in (first.net.end_fc_with_gender, first.net.end_fc_without_gender):
                    bias: torch.Tensor = head[1].bias  # type: ignore[assignment]
                    bias.fill_(mean_age)
        if first.uses_sex and not data.meta.get("has_sex", False):
            raise ConfigError(
                f"{data.meta.get('source', 'the CSV')}: the network uses sex (`model.options.use_sex`) but some rows "
                "have no `sex` value; fill them or set `model.options.use_sex=false`"
            )
        dir1, _ = _stage_dirs(run)
        # every process trains every stage (under DDP stage 2 trains on all of them), each stage
        # starting from the best weights of the one before; rank 0 evaluates at the end
        two = _two_stages(run)
        stages: list[Any] = [_stage(run, first, dir1, cfg.trainer.max_epochs, last=not two)]
        if two:
            epochs2 = cfg.task.stage2_epochs or cfg.trainer.max_epochs
            stages.append(lambda _: _stage(run, _second(run, first, init=True), "", epochs2, last=True))
        done = run.run_stages(stages)
        secs = [s for r in done for s in r.epoch_seconds]
        return run.rank_zero(self._test, run, [r.module for r in done], secs)

    def _test(self, run: Run, modules: list[BrainAgeModule], secs: list[float]) -> dict[str, Any]:
        dir1, _ = _stage_dirs(run)
        if len(modules) == 1:
            metrics = _evaluate_module(run, modules[0], "best", dir1, write=True)
        else:
            stage1 = _evaluate_module(run, modules[0], "best", dir1, write=False)  # the frozen stage-1 weights
            metrics = self._evaluate_second(run, modules[1], stage1, "best")
        metrics["test"]["epoch_seconds"] = float(np.mean(secs)) if secs else float("nan")
        return metrics

    def _evaluate_second(
        self, run: Run, second: BrainAgeModule, stage1: dict[str, Any], checkpoint: str
    ) -> dict[str, Any]:
        metrics = _evaluate_module(run, second, checkpoint, "", write=True)
        for key in ("mae", "pearson", "corr_bag_age", "corr_bag_age_gap"):
            metrics["test"][f"stage1_{key}"] = stage1["test"][key]
        metrics["stage1"] = stage1
        return metrics

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        first = first_module(run)
        dir1, _ = _stage_dirs(run)
        name = checkpoint or "best"
        if not _two_stages(run):
            return _evaluate_module(run, first, name, dir1, write=True)
        stage1 = _evaluate_module(run, first, "best", dir1, write=False)  # loads stage 1's best into `first`
        return self._evaluate_second(run, _second(run, first), stage1, name)

    def predict_file(self, run: Run, path: Path, checkpoint: str | None) -> dict[str, Any]:
        """Predicted ages of a new cohort's CSV (the training CSV's columns, ``age`` optional) from the run's
        checkpoint (``checkpoint``: ``best``/``last`` of the last stage, None: ``best``, as :meth:`evaluate`).

        The volumes go through the run's preprocessing (the :class:`~rankwise.data.NiftiPreprocessing` of
        its data's ``meta["preprocessing"]``: its grid, intensity rule and cache; a crop that cuts
        into the brains is a ``warning:`` line); the bias corrections are fitted on the run's validation
        predictions as in :meth:`evaluate`. Columns, one value per CSV row in its order: the CSV's own
        columns as read (text), then ``stage1_prediction`` (TSAN with two stages), ``gap`` (the
        prediction minus the age), ``prediction_corrected_<method>`` and ``gap_corrected_<method>`` for
        each of :data:`CORRECTIONS` (``gap`` needs the age, ``prediction`` does not) and ``prediction``
        (years): float64 arrays, NaN where they need an unknown age. A computed name that the CSV
        already has gets ``_1`` (``_2``, ...).
        """
        return _predict_cohort(run, Path(path), checkpoint)

    def tables(self, results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Table]:
        from rankwise.recipes.brain_age.study import group_rows, site_rows
        from rankwise.recipes.reports import scalar_table_rows

        header, rows = scalar_table_rows(results)
        keep = [i for i, h in enumerate(header) if h in ("method", "seeds", "train s", *TABLE_METRICS)]
        out = [([header[i] for i in keep], [[r[i] for i in keep] for r in rows])]
        runs = [r for rs in results.values() for r in rs]
        study = runs[0].get("study") if len(runs) == 1 else None  # one run: its site and group tables
        if study:
            if study.get("site_column"):
                out.append(site_rows(study))
            if study.get("group_column"):
                out.append(group_rows(study))
        return out

    def summary(self, metrics: Mapping[str, Any]) -> str:
        t = metrics["test"]
        return f"test MAE {t['mae']:.3f}, r {t['pearson']:.3f}, corr(BAG, age) {t['corr_bag_age']:.3f}"


register_recipe(BrainAgeRecipe())
