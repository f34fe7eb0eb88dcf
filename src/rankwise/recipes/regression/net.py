"""The deep-imbalanced-regression network and its evaluation outputs, in plain torch (no Lightning).

:class:`DIRNet` is backbone -> features -> linear head, plus the state of the DIR loss stack
(the LDS weight table, FDS statistics, the parameters of a learned task loss or regularizer):
exactly the tensors of a ``dir`` / ``rrt`` / ``rnc`` checkpoint. The Lightning module that trains
it, :class:`rankwise.recipes.regression.module.DIRRegressor`, adds only the training loop's steps;
evaluation and prediction rebuild this network from the saved config, load the checkpoint's state
dict into it (``torch.load(weights_only=True)``, every key and shape checked) and predict with
:func:`rankwise.recipes.regression.predict.predict`, without Lightning. :func:`write_evaluation`
turns the test and validation predictions into the many/medium/few-shot metrics,
``predictions.npz`` and the plots. The ordinal-head helpers are shared with the brain-age recipe.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rankwise._binning import LabelClasses, label_bins_np, snap_floor, snap_floor_np
from rankwise._fileio import atomic_open
from rankwise.recipes.common import build_backbone, to_builtin
from rankwise.recipes.config import Config
from rankwise.recipes.loss_terms import build_regularizers, build_task_loss, ordinal_head_of

__all__ = [
    "DIRNet",
    "check_ordinal_options",
    "class_counts",
    "class_map_buffer",
    "decode_ordinal",
    "fit_label_classes",
    "label_classes_of",
    "lds_buffers",
    "lds_sample_weights",
    "lds_weight_table",
    "loss_param_groups",
    "make_fds",
    "note_label_classes",
    "ordinal_head_module",
    "ordinal_loss_tensors",
    "ordinal_prior_bias",
    "run_shot_thresholds",
    "shot_metrics",
    "write_evaluation",
]


def lds_weight_table(
    train_labels: np.ndarray, bin_width: float, *, reweight: str, lds: bool, kernel: str, ks: int, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin weights ``(bins, weights)`` from ``rankwise.imbalanced.lds_weights`` on the full train labels.

    The per-sample weights only depend on the label's bin, so they are stored as a small table
    (sorted integer bins ``floor(y / bin_width)`` and their weight) and looked up for each batch.
    """
    from rankwise.imbalanced import lds_weights

    labels = np.asarray(train_labels, dtype=np.float64).reshape(-1)
    w = lds_weights(
        labels,
        bin_width=bin_width,
        reweight=reweight,  # type: ignore[arg-type]
        lds=lds,
        kernel=kernel,  # type: ignore[arg-type]
        ks=ks,
        sigma=sigma,
    )
    w = w.detach().cpu().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    bins = label_bins_np(labels, bin_width)  # the binning rule of lds_weights / FDS / shot metrics
    ubins, inv = np.unique(bins, return_inverse=True)
    table = np.bincount(inv, weights=w) / np.bincount(inv)
    return ubins, table


def lds_buffers(lds: Any, train_labels: Any, bin_width: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(lds_bins, lds_table)`` buffers of a module reweighting its task loss with ``task.lds``
    (an :class:`~rankwise.recipes.config.LDSConfig`): :func:`lds_weight_table` on the full training
    labels as int64 bins and float32 weights; both empty when ``lds.reweight`` is ``"none"``."""
    if lds.reweight == "none":
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.float32)
    if train_labels is None:
        raise ValueError("`train_labels` are required when `task.lds.reweight` is not 'none'")
    b, t = lds_weight_table(
        train_labels, bin_width, reweight=lds.reweight, lds=lds.lds, kernel=lds.kernel, ks=lds.ks, sigma=lds.sigma
    )
    return torch.as_tensor(b, dtype=torch.int64), torch.as_tensor(t, dtype=torch.float32)


def lds_sample_weights(y: torch.Tensor, bins: torch.Tensor, table: torch.Tensor, bin_width: float) -> torch.Tensor:
    """The weight of each label ``y`` in the table of :func:`lds_buffers` (lookup by bin ``floor(y /
    bin_width)``; 1 for a bin the training labels do not have), in ``y``'s dtype."""
    b = snap_floor(y.detach(), bin_width).long()  # the binning rule of lds_weights (any dtype)
    idx = torch.searchsorted(bins, b).clamp_(max=bins.numel() - 1)
    w = table[idx]
    return torch.where(bins[idx] == b, w, torch.ones_like(w)).to(y.dtype)


def loss_param_groups(module: nn.Module, task_loss: nn.Module, lr: float | None) -> list[dict[str, Any]]:
    """The optimizer parameter groups of ``module``: its trainable parameters, and those of its
    ``task_loss`` (e.g. Balanced MSE's learnable noise) as a group of their own with learning rate
    ``lr`` (``loss.lr``; ``None``: the optimizer's)."""
    loss_params = [p for p in task_loss.parameters() if p.requires_grad]
    ids = {id(p) for p in loss_params}
    groups: list[dict[str, Any]] = [
        {"params": [p for p in module.parameters() if p.requires_grad and id(p) not in ids]}
    ]
    if loss_params:
        group: dict[str, Any] = {"params": loss_params}
        if lr is not None:
            group["lr"] = lr
        groups.append(group)
    return groups


def make_fds(feature_dim: int, f: Any, *, bin_width: float, label_range: tuple[float, float]) -> nn.Module:
    """``rankwise.imbalanced.FDS`` over the bins covering ``label_range`` (options ``f``: an ``FDSConfig``)."""
    from rankwise.imbalanced import FDS

    lo = snap_floor_np(np.array(label_range[0]), bin_width) * bin_width
    hi = (snap_floor_np(np.array(label_range[1]), bin_width) + 1) * bin_width
    return FDS(
        feature_dim,
        bin_width=bin_width,
        label_range=(float(lo), float(hi)),
        kernel=f.kernel,
        ks=f.ks,
        sigma=f.sigma,
        momentum=f.momentum,
        start_update=f.start_update,
        start_smooth=f.start_smooth,
    )


# ------------------------------------------------------------------ ordinal heads (shared with brain_age)


def ordinal_prior_bias(counts: torch.Tensor, ordinal: Any, *, layer: str = "linear") -> torch.Tensor:
    """The initial biases of an ordinal head: the log-odds its logits have when they ignore the input.

    From the training labels' class ``counts`` (``(K,)``), with one pseudo-count per class: a class
    head gets the log prior ``log p_c``; a threshold head with the shared weights of CORAL
    (``layer="coral"``) ``logit P(y > k)``; the conditional threshold heads (CORN, CONDOR)
    ``logit P(y > k | y > k - 1)``. The regressor's bias starts at the mean label for the same reason.
    """
    p = (counts + 1.0) / (counts.sum() + counts.numel())
    if ordinal.outputs == "classes":
        return torch.log(p)
    above = (1.0 - torch.cumsum(p, 0))[:-1].clamp(1e-6, 1 - 1e-6)  # P(y > k), k = 0..K-2
    if layer == "coral":
        return torch.logit(above)
    at_least = torch.cat([torch.ones(1, dtype=p.dtype), above[:-1]])  # P(y > k - 1)
    return torch.logit((above / at_least).clamp(1e-6, 1 - 1e-6))


def train_classes(lc: LabelClasses, train_labels: Any) -> torch.Tensor:
    """The classes of ``lc`` of the training labels (int64 ``(N,)``)."""
    return lc.classes(torch.as_tensor(np.asarray(train_labels, dtype=np.float64)).reshape(-1))


def class_counts(lc: LabelClasses, train_labels: Any) -> torch.Tensor:
    """How many training labels fall in each class of ``lc`` (float64 ``(K,)``)."""
    return torch.bincount(train_classes(lc, train_labels), minlength=lc.num_classes).to(torch.float64)


def ordinal_head_module(
    ordinal: Any, in_features: int, num_classes: int, *, counts: torch.Tensor | None = None
) -> nn.Module:
    """The head an ordinal loss trains (its :class:`~rankwise._registry.OrdinalHead`) on ``in_features``
    features for ``num_classes`` classes: :class:`~rankwise.models.CoralLayer` for ``layer="coral"``, else
    an ``nn.Linear`` of ``K`` (class logits) or ``K - 1`` (threshold logits) outputs. With the training
    labels' class ``counts`` its biases start from their distribution (:func:`ordinal_prior_bias`), as
    the regressor's bias starts at the mean label: the head need not learn the thresholds' offsets first."""
    head: nn.Module
    bias: torch.Tensor
    if ordinal.layer == "coral":
        from rankwise.models import CoralLayer

        coral = CoralLayer(in_features, num_classes)
        head, bias = coral, coral.coral_bias
    else:
        linear = nn.Linear(in_features, ordinal.num_outputs(num_classes))
        head, bias = linear, linear.bias
    if counts is not None:
        with torch.no_grad():
            bias.copy_(ordinal_prior_bias(counts, ordinal, layer=ordinal.layer).to(bias.dtype))
    return head


def fit_label_classes(train_labels: Any, width: float, loss: str | None) -> LabelClasses:
    """:meth:`LabelClasses.fit` for the ordinal task loss ``loss``; a ``ConfigError`` (one line) when the
    training labels cannot make two classes."""
    from rankwise.recipes.config import ConfigError

    try:
        return LabelClasses.fit(np.asarray(train_labels, dtype=np.float64), width)
    except ValueError as e:
        raise ConfigError(f"`loss.name` {loss}: {e}") from None


def check_ordinal_options(task_loss: Any, ordinal: Any, num_classes: int) -> None:
    """Call the ordinal task loss once on a two-sample batch of the data's ``num_classes`` classes, so that
    options it checks only against ``K`` (a soft-label distribution's parameters, a weight per class) are
    one ``ConfigError`` naming ``loss.options`` before training instead of an error at the first step."""
    from rankwise.recipes.config import ConfigError

    logits = torch.zeros(2, ordinal.num_outputs(num_classes))
    classes = torch.tensor([0, num_classes - 1])
    try:
        with torch.no_grad():
            task_loss(ordinal_loss_tensors(task_loss, logits, classes, num_classes))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"`loss.options` of {task_loss.name!r} for the data's {num_classes} classes: {e}") from None


def class_map_buffer(lc: LabelClasses) -> torch.Tensor:
    """The float64 ``[lo, width, K]`` of a class map: the state-dict buffer ``label_class_map``, so that a
    checkpoint decodes with the classes it was trained on."""
    return torch.tensor([lc.lo, lc.width, lc.num_classes], dtype=torch.float64)


def decode_ordinal(ordinal: Any, logits: torch.Tensor, class_map: torch.Tensor) -> torch.Tensor:
    """An ordinal head's prediction in the label's units: the label of the decoded class position (the
    ``predict`` of the loss's :class:`~rankwise._registry.OrdinalHead`; a fractional position from an
    expectation interpolates), ``lo + (position + 1/2) width`` of ``class_map``, in ``logits``' dtype."""
    position = ordinal.predict(logits).to(class_map.dtype)
    return (class_map[0] + (position + 0.5) * class_map[1]).to(logits.dtype)


def label_classes_of(y: torch.Tensor, class_map: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The int64 classes ``0..K-1`` of labels ``y`` under ``class_map`` (clipped; NaN: 0); no host sync."""
    c = torch.nan_to_num(snap_floor(y, class_map[1], class_map[0]), nan=0.0)  # type: ignore[arg-type]
    return c.clamp(0, num_classes - 1).to(torch.int64)


def ordinal_loss_tensors(
    task_loss: Any, logits: torch.Tensor, classes: torch.Tensor, num_classes: int
) -> dict[str, torch.Tensor]:
    """The roles an ordinal task loss takes: ``logits``, ``classes`` and, when it declares them, ``levels``
    (:func:`rankwise.losses.levels_from_labels`, in the logits' dtype)."""
    out: dict[str, torch.Tensor] = {"logits": logits, "classes": classes}
    if "levels" in task_loss.inputs.values():
        from rankwise.losses import levels_from_labels

        out["levels"] = levels_from_labels(classes, num_classes).to(logits.dtype)
    return out


def note_label_classes(run: Any, name: str | None, lc: LabelClasses | None) -> None:
    """The class map of an ordinal head, once (rank 0), as a ``DataNote`` (the CLI's ``note:`` line)."""
    if lc is None or not run.is_global_zero:
        return
    import warnings

    from rankwise.recipes.common import DataNote

    warnings.warn(f"ordinal head {name}: {lc.describe()}", DataNote, stacklevel=3)


class DIRNet(nn.Module):
    """Backbone -> features -> head, with the state of the DIR loss stack of ``cfg.loss``.

    The head is a linear regressor, or, when the task loss is ordinal (its registry entry has an
    :class:`~rankwise._registry.OrdinalHead`: CORAL, CORN, CDW-CE, ...), a head of ``K`` or ``K - 1``
    logits over the classes of :class:`~rankwise._binning.LabelClasses` fitted on the training labels
    (the map is a buffer of the state dict). Either way :meth:`forward` predicts in the label's units:
    an ordinal head's class (or expected class) is mapped back to the label it stands for.

    Args:
        cfg: the run's typed :class:`~rankwise.recipes.config.Config`.
        input_dim: tabular input width (``RegressionData.input_dim``).
        bin_width: label bin width (LDS/FDS buckets).
        train_labels: the FULL training labels (LDS weight table, FDS label range); the weight
            table is a buffer of the state dict.
        meta: ``RegressionData.meta`` (extra backbone options).
        freeze_backbone: train only the head (RRT, RnC linear probe); the backbone stays in eval mode.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        input_dim: int | None = None,
        bin_width: float = 1.0,
        train_labels: np.ndarray | None = None,
        meta: dict[str, Any] | None = None,
        freeze_backbone: bool = False,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.bin_width = float(bin_width)
        self.backbone, self.feature_dim = build_backbone(cfg.model, meta=meta, input_dim=input_dim)
        self._label_mean = float(np.mean(train_labels)) if train_labels is not None and len(train_labels) else 0.0
        #: the ordinal head of the task loss (``None``: a linear regressor) and the label classes it predicts
        self.ordinal = ordinal_head_of(cfg.loss)
        self.label_classes: LabelClasses | None = None
        self._class_counts: torch.Tensor | None = None
        if self.ordinal is not None:
            if train_labels is None:
                raise ValueError("`train_labels` are required for an ordinal task loss (they define the classes)")
            self.label_classes = fit_label_classes(train_labels, self.bin_width, cfg.loss.name)
            self.register_buffer("label_class_map", class_map_buffer(self.label_classes))
            self._class_counts = class_counts(self.label_classes, train_labels)
        self.head = self._make_head()
        self.use_weights = cfg.task.lds.reweight != "none"
        bins, table = lds_buffers(cfg.task.lds, train_labels, self.bin_width)
        self.register_buffer("lds_bins", bins)
        self.register_buffer("lds_table", table)
        self.fds: nn.Module | None = None
        if cfg.task.fds.enabled:
            lo, hi = (0.0, 1.0) if train_labels is None else (float(np.min(train_labels)), float(np.max(train_labels)))
            self.fds = make_fds(self.feature_dim, cfg.task.fds, bin_width=self.bin_width, label_range=(lo, hi))
        self.freeze_backbone = bool(freeze_backbone)
        if self.freeze_backbone:
            self.backbone.requires_grad_(False)
        #: the task loss from the registry (``loss.name``, or ``regression_<kind>`` for ``loss.kind``)
        labels = None if train_labels is None else torch.as_tensor(np.asarray(train_labels, dtype=np.float64))
        k = None if self.label_classes is None else self.label_classes.num_classes
        tc = None if self.label_classes is None else train_classes(self.label_classes, train_labels)
        self.task_loss = build_task_loss(cfg.loss, train_labels=labels, num_classes=k, train_classes=tc)
        if self.ordinal is not None and self.label_classes is not None:
            check_ordinal_options(self.task_loss, self.ordinal, self.label_classes.num_classes)
        self.regularizers = build_regularizers(cfg.loss.regularizers, train_labels=labels)

    def sample_weights(self, y: torch.Tensor) -> torch.Tensor | None:
        """LDS/reweighting weight of each label (table lookup by bin ``floor(y / bin_width)``)."""
        if not self.use_weights:
            return None
        bins: torch.Tensor = self.lds_bins  # type: ignore[assignment]
        table: torch.Tensor = self.lds_table  # type: ignore[assignment]
        return lds_sample_weights(y, bins, table, self.bin_width)

    def _make_head(self) -> nn.Module:
        """A new head: linear regressor (bias at the mean label), or the ordinal loss's head of logits."""
        if self.ordinal is None or self.label_classes is None:
            head = nn.Linear(self.feature_dim, 1)
            with torch.no_grad():  # start from the mean label: the regressor need not learn the offset first
                head.bias.fill_(self._label_mean)
            return head
        return ordinal_head_module(
            self.ordinal, self.feature_dim, self.label_classes.num_classes, counts=self._class_counts
        )

    def features(self, x: Any) -> torch.Tensor:
        f = self.backbone(x)
        return f.flatten(1) if f.dim() > 2 else f

    def head_outputs(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(prediction, logits)`` of the head on ``feats``: the prediction in the label's units, and an
        ordinal head's logits (``None`` for the regressor). An ordinal prediction is the label of the
        decoded class (the ``predict`` of the loss's :class:`~rankwise._registry.OrdinalHead`)."""
        out = self.head(feats)
        if self.ordinal is None:
            return out.squeeze(-1), None
        cmap: torch.Tensor = self.label_class_map  # type: ignore[assignment]
        return decode_ordinal(self.ordinal, out, cmap), out

    def label_class(self, y: torch.Tensor) -> torch.Tensor:
        """The int64 classes ``0..K-1`` of labels ``y`` (an ordinal head's targets); no host sync."""
        if self.label_classes is None:
            raise ValueError("the regressor has no label classes (its task loss is not ordinal)")
        cmap: torch.Tensor = self.label_class_map  # type: ignore[assignment]
        return label_classes_of(y, cmap, self.label_classes.num_classes)

    def forward(self, x: Any) -> torch.Tensor:
        return self.head_outputs(self.features(x))[0]

    def predict_batch(self, batch: Any) -> dict[str, torch.Tensor]:
        """``pred``, ``label`` and ``features`` (float32) of one ``(x, y)`` batch; FDS is a training-time smoothing."""
        x, y = batch
        feats = self.features(x)
        pred = self.head_outputs(feats)[0]
        return {"pred": pred.float(), "label": y.reshape(-1).float(), "features": feats.float()}

    def reset_head(self) -> None:
        """A fresh head (as built), on the current head's device and dtype."""
        ref = next(self.head.parameters())
        self.head.load_state_dict(self._make_head().to(device=ref.device, dtype=ref.dtype).state_dict())

    def param_groups(self) -> list[dict[str, Any]]:
        """Trainable parameters; a task loss with parameters gets its own group (lr ``loss.lr``)."""
        return loss_param_groups(self, self.task_loss, self.cfg.loss.lr)


def run_shot_thresholds(cfg: Config, data: Any) -> tuple[float, float]:
    """``(many_shot, few_shot)`` of a run: ``report.many_shot`` / ``report.few_shot``, else the dataset's own."""
    from rankwise.recipes.common import shot_thresholds

    many, few = shot_thresholds(data)
    r = cfg.report
    return (many if r.many_shot is None else r.many_shot), (few if r.few_shot is None else r.few_shot)


def shot_metrics(preds: np.ndarray, labels: np.ndarray, data: Any, cfg: Config) -> dict[str, Any]:
    """``rankwise.imbalanced.regression_metrics`` of predictions, with the run's shot thresholds, and
    under ``"ordinal"`` the metrics of the label classes (:func:`class_metrics`)."""
    from rankwise.imbalanced import regression_metrics

    many, few = run_shot_thresholds(cfg, data)
    out = regression_metrics(
        torch.as_tensor(preds),
        torch.as_tensor(labels),
        np.asarray(data.train_labels),
        many_shot=many,
        few_shot=few,
        bin_width=data.bin_width,
    )
    out = to_builtin(out)
    ordinal = class_metrics(preds, labels, data.train_labels, data.bin_width)
    if ordinal is not None:
        out["ordinal"] = ordinal
    return out


def class_metrics(
    preds: np.ndarray, labels: np.ndarray, train_labels: np.ndarray, bin_width: float
) -> dict[str, Any] | None:
    """The ordinal metrics of predictions as classes: ``num_classes``, exact and off-by-one accuracy, quadratic
    weighted kappa and Kendall's tau of :func:`rankwise.metrics.ordinal_metrics` on the class positions of
    the predictions (``(p - lo) / width - 1/2``: rounded to the nearest class, halves to even, for the
    accuracies and the kappa, which clips them to the classes; as they are for Kendall) against the
    labels' classes, and the RMSE in label units; the classes are those of
    :meth:`~rankwise._binning.LabelClasses.fit` on the training labels, the same for every method of a
    run's data. ``None`` when the training labels make a single class."""
    from rankwise.metrics import ordinal_metrics

    try:
        lc = LabelClasses.fit(np.asarray(train_labels), bin_width)
    except ValueError:
        return None
    p, y = torch.as_tensor(np.asarray(preds, dtype=np.float64)), torch.as_tensor(np.asarray(labels, dtype=np.float64))
    position = (p - lc.lo) / lc.width - 0.5  # the class position of each prediction (an integer at a class)
    m = ordinal_metrics(position, lc.classes(y).double(), num_classes=lc.num_classes)
    out = {"num_classes": lc.num_classes, **{k: m[k] for k in ("exact_acc", "off_by_one_acc", "qwk", "kendall")}}
    out["rmse"] = float(torch.sqrt(torch.mean((p - y) ** 2))) if p.numel() else float("nan")
    # an undefined value (no test rows, constant predictions for Kendall) is None, as regression_metrics' are
    return to_builtin({k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in out.items()})


#: the plots of :func:`write_evaluation` (functions of the test predictions and training labels only)
_PLOTS = ("label_histogram.png", "per_label_mae.png", "similarity.png", "tsne.png")


def _same_predictions(path: Path, test: dict[str, np.ndarray], data: Any) -> bool:
    """Whether ``predictions.npz`` at ``path`` holds exactly these test predictions, labels and training labels."""
    try:
        with np.load(path, allow_pickle=False) as old:
            return (
                np.array_equal(old["pred"], test["pred"])
                and np.array_equal(old["label"], test["label"])
                and np.array_equal(old["train_labels"], np.asarray(data.train_labels, dtype=np.float64))
                and float(old["bin_width"]) == float(data.bin_width)
            )
    except (OSError, KeyError, ValueError):
        return False


def write_evaluation(
    run: Any, test: dict[str, np.ndarray], val: dict[str, np.ndarray], checkpoint: Path
) -> dict[str, Any]:
    """Val/test shot metrics of a run's predictions; writes ``predictions.npz`` and, when the test
    predictions differ from the saved ones (or a plot is missing), the plots. ``checkpoint``: the
    evaluated file (recorded in the metrics relative to the run directory)."""
    cfg, data = run.cfg, run.data
    thresholds = run_shot_thresholds(cfg, data)
    metrics = {
        "test": shot_metrics(test["pred"], test["label"], data, cfg),
        "val": shot_metrics(val["pred"], val["label"], data, cfg),
        "checkpoint": str(checkpoint.relative_to(run.dir)),
        "shot_thresholds": dict(zip(("many", "few"), thresholds)),
    }
    r = cfg.report
    rng = np.random.default_rng(0)
    n = len(test["label"])
    sample = np.sort(rng.choice(n, size=min(n, r.plot_samples), replace=False)) if n else np.zeros(0, dtype=int)
    unchanged = _same_predictions(run.results / "predictions.npz", test, data)
    with atomic_open(run.results / "predictions.npz", "wb") as fh:
        np.savez_compressed(
            fh,
            pred=test["pred"],
            label=test["label"],
            train_labels=np.asarray(data.train_labels, dtype=np.float64),
            bin_width=data.bin_width,
            label_axis=getattr(data, "label_axis", "label"),
            sample=sample,
            features=test["features"][sample],
        )
    pdir = run.plots_dir
    if pdir is not None and unchanged and all((pdir / f).is_file() for f in _PLOTS[: 4 if r.tsne else 3]):
        pdir = None  # the plots are functions of these predictions: those on disk are up to date
    if pdir is not None:
        from rankwise.recipes import reports

        title = f"{cfg.run.name} (seed {cfg.run.seed})"
        label = getattr(data, "label_axis", "label")
        reports.plot_label_histogram(
            data.train_labels,
            data.bin_width,
            pdir / "label_histogram.png",
            many_shot=thresholds[0],
            few_shot=thresholds[1],
            test_labels=data.test_labels,
            label=label,
        )
        reports.plot_per_label_mae(
            test["pred"],
            test["label"],
            data.train_labels,
            data.bin_width,
            pdir / "per_label_mae.png",
            title=f"per-label test MAE: {title}",
            label=label,
        )
        feats, labs = test["features"][sample], test["label"][sample]
        reports.plot_similarity_heatmap(
            feats, labs, pdir / "similarity.png", title=f"feature similarity: {title}", label=label
        )
        if r.tsne:
            reports.plot_tsne(feats, labs, pdir / "tsne.png", seed=cfg.run.seed, title=f"t-SNE: {title}", label=label)
    return metrics
