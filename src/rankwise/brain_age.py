r"""Brain-age utilities: TSAN's age discretisation, the bias correction of the brain-age gap, metrics.

* :func:`discretize_age` -- the rule of TSAN's second stage (Cheng et al., IEEE TMI 2021): the
  nearest multiple of ``step``, halves rounded up;
* :func:`correct_age_bias` -- remove the regression-to-the-mean bias of predicted ages, fitted on
  data the model was not trained on ("gap": Smith et al. 2019, Beheshti et al. 2019;
  "prediction": Cole et al. 2018, de Lange & Cole 2020);
* :func:`brain_age_metrics` -- MAE, RMSE, Pearson r, Spearman rho, R^2, the brain-age gap (BAG) mean
  and SD, corr(BAG, age) and the MAE per age decade;
* :func:`gap_by_site`, :func:`gap_by_group` -- the gap per site, and per group against a reference group
  (Cohen's d, Welch and Mann-Whitney p-values, AUC);
* :func:`combat_fit` -- ComBat's site harmonisation (Johnson et al. 2007; Fortin et al. 2018), fitted on
  one set of subjects and applied (:meth:`ComBat.apply`) to others of the same sites.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from typing import Any, Literal

import numpy as np
import torch

from rankwise._stats import average_ranks, pearson_np

__all__ = [
    "COMBAT_MAX_ITER",
    "COMBAT_TOL",
    "FLAT_RELATIVE",
    "MIN_FIT_SUBJECTS",
    "BiasCorrectionWarning",
    "ComBat",
    "brain_age_metrics",
    "combat_fit",
    "correct_age_bias",
    "discretize_age",
    "gap_by_group",
    "gap_by_site",
]

#: a bias correction fitted on fewer subjects warns (:class:`BiasCorrectionWarning`) that its line is uncertain
MIN_FIT_SUBJECTS = 10
#: values whose range is at most this fraction of their magnitude (at least 1) count as constant
FLAT_RELATIVE = 1e-4


class BiasCorrectionWarning(UserWarning):
    """A bias correction that was fitted, but on too few subjects to trust its line."""


def discretize_age(age: torch.Tensor, step: float = 5) -> torch.Tensor:
    r"""Round ages to the nearest multiple of ``step``, halves up (TSAN's second-stage input).

    .. math::
        d(a) = s \lfloor a / s \rfloor + s\,[\,a \bmod s \ge s / 2\,]

    with :math:`\bmod` the floored remainder (as Python's ``%``), which is the authors'
    ``discretize_age``: ``2.5 -> 5``, ``2.4 -> 0``, ``-2.5 -> 0``, ``-2.6 -> -5`` with ``step=5``.
    The result carries no gradient (it is piecewise constant).

    Shape:
        - age: any shape, floating or integer; output: the same shape, floating (integer ages -> float32).

    Example:
        >>> discretize_age(torch.tensor([42.4, 42.5, 47.6, 63.0]))
        tensor([40., 45., 50., 65.])
    """
    if not isinstance(age, torch.Tensor):
        raise TypeError(f"`age` must be a torch.Tensor, got {type(age).__name__}")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not (math.isfinite(step) and step > 0):
        raise ValueError(f"`step` must be a finite number > 0, got {step!r}")
    a = age.detach()
    if not a.is_floating_point():
        a = a.float()
    q = torch.div(a, step, rounding_mode="floor")
    r = torch.remainder(a, step)
    return torch.where(r < step / 2, q * step, (q + 1) * step)


def _as_1d(x: Any, name: str) -> np.ndarray:
    """``x`` (a tensor, array or sequence of real numbers) as a flat float64 array; strings, bools and other
    non-numbers are a ``TypeError`` naming ``name``, NaN/inf a ``ValueError``."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"`{name}` must be a tensor or array of real numbers, got a tensor of {x.dtype}")
        arr = x.detach().cpu().double().numpy().reshape(-1)
    elif isinstance(x, np.ndarray) and x.dtype.kind != "O":
        if x.dtype.kind not in "iuf":
            raise TypeError(f"`{name}` must be a tensor or array of real numbers, got an array of {x.dtype}")
        arr = x.astype(np.float64).reshape(-1)
    else:
        try:
            items = np.asarray(x, dtype=object).reshape(-1)
        except ValueError:  # ragged nesting
            raise TypeError(
                f"`{name}` must be a tensor or array of real numbers, got a ragged {type(x).__name__}"
            ) from None
        bad = next((v for v in items if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real)), None)
        if bad is not None:
            raise TypeError(
                f"`{name}` must be a tensor or array of real numbers, got {type(x).__name__} holding {bad!r}"
            )
        arr = items.astype(np.float64)
    if not np.isfinite(arr).all():
        raise ValueError(f"`{name}` must be finite, got NaN or inf values")
    return arr


def _check_spread(v: np.ndarray, name: str, consequence: str) -> None:
    """A ``ValueError`` when ``v`` varies by at most :data:`FLAT_RELATIVE` of its magnitude."""
    scale = max(1.0, float(np.abs(v).max()))
    spread = float(np.ptp(v))
    if spread <= FLAT_RELATIVE * scale:
        raise ValueError(
            f"`{name}` varies by {spread:.3g} only (values up to {scale:.4g}; at most {FLAT_RELATIVE:g} of it "
            f"counts as constant): {consequence}"
        )


def _linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares ``y = slope * x + intercept`` and the slope's standard error (NaN for 2 points)."""
    xc = x - x.mean()
    sxx = float((xc * xc).sum())
    slope = float((xc * (y - y.mean())).sum() / sxx)
    intercept = float(y.mean() - slope * x.mean())
    n = x.size
    if n <= 2:
        return slope, intercept, math.nan
    resid = y - (slope * x + intercept)
    return slope, intercept, math.sqrt(float((resid * resid).sum()) / (n - 2) / sxx)


def correct_age_bias(
    pred: Any,
    age: Any,
    *,
    fit_pred: Any,
    fit_age: Any,
    method: Literal["gap", "prediction"] = "gap",
) -> Any:
    r"""Bias-corrected predicted ages, the linear correction fitted on ``(fit_pred, fit_age)``.

    Predicted ages regress to the mean of the training ages, so the brain-age gap
    :math:`\mathrm{BAG} = \hat a - a` correlates negatively with age. Both corrections fit a line on
    a fitting set (the validation set: never the set being evaluated, whose ages would leak into
    its own correction) and apply it to ``(pred, age)``:

    * ``"gap"`` (Smith et al. 2019; Beheshti et al. 2019): fit :math:`\mathrm{BAG} = \alpha a + \beta`,
      return :math:`\hat a - (\alpha a + \beta)` -- uses the chronological age of each subject;
    * ``"prediction"`` (Cole et al. 2018; de Lange & Cole 2020): fit :math:`\hat a = \alpha a + \beta`,
      return :math:`(\hat a - \beta) / \alpha`.

    Returns a float64 tensor when ``pred`` is a tensor, else a float64 numpy array, shaped as ``pred``.

    The fit must be determined, else a ``ValueError`` says why: at least 2 subjects; ``fit_age`` and
    ``fit_pred`` each varying by more than :data:`FLAT_RELATIVE` of their magnitude (constant
    predictions carry no age signal: the correction would turn float rounding into ages); for
    ``"prediction"``, which divides by the fitted slope, a slope larger than twice its standard error.
    Fitted on fewer than :data:`MIN_FIT_SUBJECTS` subjects, it warns (:class:`BiasCorrectionWarning`)
    with their number. Strings, bools and other non-numbers are a ``TypeError``.

    Shape:
        - pred, age: :math:`(N,)` (any shape with N elements); fit_pred, fit_age: :math:`(M,)`.

    Example:
        >>> import numpy as np
        >>> fit_age = np.linspace(20.0, 80.0, 10)
        >>> fit_pred = 0.5 * fit_age + 25  # shrunk towards the mean age 50
        >>> correct_age_bias(np.array([35.0, 65.0]), np.array([20.0, 80.0]), fit_pred=fit_pred, fit_age=fit_age,
        ...                  method="prediction")
        array([20., 80.])
    """
    if method not in ("gap", "prediction"):
        raise ValueError(f"`method` must be 'gap' or 'prediction', got {method!r}")
    p, a = _as_1d(pred, "pred"), _as_1d(age, "age")
    fp, fa = _as_1d(fit_pred, "fit_pred"), _as_1d(fit_age, "fit_age")
    if p.size != a.size:
        raise ValueError(f"`pred` and `age` must have the same number of elements, got {p.size} and {a.size}")
    if fp.size != fa.size:
        raise ValueError(f"`fit_pred` and `fit_age` must have the same number of elements, got {fp.size} and {fa.size}")
    if fa.size < 2:
        raise ValueError(f"`fit_age` must hold at least 2 subjects to fit the correction, got {fa.size}")
    _check_spread(fa, "fit_age", "the fitted line is not determined")
    _check_spread(fp, "fit_pred", "the predictions carry no age signal to correct")
    if method == "gap":
        slope, intercept, _ = _linear_fit(fa, fp - fa)
        out = p - (slope * a + intercept)
    else:
        slope, intercept, se = _linear_fit(fa, fp)
        undetermined = abs(slope) <= 2 * se if math.isfinite(se) else slope == 0  # se: NaN for 2 subjects
        if undetermined:
            raise ValueError(
                f"the fitted slope of `fit_pred` on `fit_age`, {slope:.3g} +- {se:.2g} (standard error), is not "
                "distinguishable from 0: the predictions carry no age signal to divide by"
            )
        out = (p - intercept) / slope
    if fa.size < MIN_FIT_SUBJECTS:
        warnings.warn(
            f"the bias correction is fitted on only {fa.size} subjects (fewer than {MIN_FIT_SUBJECTS}): its line is "
            "uncertain",
            BiasCorrectionWarning,
            stacklevel=2,
        )
    if isinstance(pred, torch.Tensor):
        return torch.as_tensor(out, dtype=torch.float64, device=pred.device).reshape(pred.shape)
    return out.reshape(np.shape(pred))


def _corr(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r; NaN where it is undefined (fewer than 2 values, a constant)."""
    r = pearson_np(x, y)
    return math.nan if r is None else r


def brain_age_metrics(pred: Any, age: Any, *, corrected: Any = None) -> dict[str, Any]:
    r"""Brain-age metrics of predictions ``pred`` against chronological ``age``.

    ``mae``, ``rmse``, ``pearson`` (the PCC of TSAN's paper), ``spearman``, ``r2``
    (:math:`1 - SS_{res} / SS_{tot}`), ``bag_mean`` / ``bag_sd`` (BAG = pred - age, SD with ddof 1),
    ``corr_bag_age``, ``mae_by_decade`` (``{"20-29": mae, ...}``), ``n``. With ``corrected`` (the
    bias-corrected predictions of :func:`correct_age_bias`), the same BAG numbers of the corrected
    ages under ``corrected``. Correlations of constant inputs are NaN.

    Example:
        >>> m = brain_age_metrics([30.0, 52.0, 70.0], [32.0, 50.0, 71.0])
        >>> round(m["mae"], 3), m["mae_by_decade"]
        (1.667, {'30-39': 2.0, '50-59': 2.0, '70-79': 1.0})
    """
    p, a = _as_1d(pred, "pred"), _as_1d(age, "age")
    if p.size != a.size:
        raise ValueError(f"`pred` and `age` must have the same number of elements, got {p.size} and {a.size}")
    err = p - a
    out: dict[str, Any] = {"n": int(p.size)}
    if p.size == 0:
        return out | {k: float("nan") for k in ("mae", "rmse", "pearson", "spearman", "r2", "bag_mean", "bag_sd")}
    ss_tot = float(((a - a.mean()) ** 2).sum())
    out |= {
        "mae": float(np.abs(err).mean()),
        "rmse": float(np.sqrt((err**2).mean())),
        "pearson": _corr(p, a),
        "spearman": _corr(average_ranks(p), average_ranks(a)),
        "r2": float(1 - (err**2).sum() / ss_tot) if ss_tot > 0 else float("nan"),
        "bag_mean": float(err.mean()),
        "bag_sd": float(err.std(ddof=1)) if p.size > 1 else float("nan"),
        "corr_bag_age": _corr(err, a),
    }
    decades = np.floor(a / 10).astype(int) * 10
    out["mae_by_decade"] = {
        f"{d}-{d + 9}": float(np.abs(err[decades == d]).mean()) for d in sorted(set(decades.tolist()))
    }
    if corrected is not None:
        c = _as_1d(corrected, "corrected")
        if c.size != a.size:
            raise ValueError(f"`corrected` must have {a.size} elements, got {c.size}")
        gap = c - a
        out["corrected"] = {
            "mae": float(np.abs(gap).mean()),
            "bag_mean": float(gap.mean()),
            "bag_sd": float(gap.std(ddof=1)) if c.size > 1 else float("nan"),
            "corr_bag_age": _corr(gap, a),
        }
    return out


def _labels(x: Any, name: str, n: int, per: str = "gap") -> np.ndarray:
    """``x`` (a sequence of hashable labels) as a flat object array of length ``n``."""
    arr = np.asarray(x, dtype=object).reshape(-1)
    if arr.shape[0] != n:
        raise ValueError(f"`{name}` must have one label per {per} ({n}), got {arr.shape[0]}")
    return arr


def _group_stats(v: np.ndarray) -> dict[str, float | int]:
    n = int(v.shape[0])
    return {"n": n, "mean": float(v.mean()), "sd": float(v.std(ddof=1)) if n > 1 else math.nan}


def gap_by_site(gap: Any, sites: Any) -> dict[Any, dict[str, float | int]]:
    r"""Per-site n, mean and SD (ddof 1) of the brain-age gap :math:`\delta_i = \hat a_i - a_i`.

    .. math::
        \bar\delta_s = \frac{1}{n_s}\sum_{i \in s} \delta_i, \qquad
        \mathrm{sd}_s = \sqrt{\tfrac{1}{n_s - 1}\sum_{i \in s} (\delta_i - \bar\delta_s)^2}

    Pass the gap after the bias correction the run applies (:func:`correct_age_bias`). A site with one
    subject has ``sd`` NaN; one site gives a one-entry dict. Sites appear in sorted order (of ``str``).

    Shape:
        - gap: ``(N,)`` real and finite; sites: ``(N,)`` labels; output: ``{site: {"n", "mean", "sd"}}``.

    Example:
        >>> t = gap_by_site([1.0, 3.0, -2.0], ["a", "a", "b"])
        >>> t["a"]["mean"], t["a"]["n"], t["b"]["sd"]
        (2.0, 2, nan)
    """
    g = _as_1d(gap, "gap")
    if g.shape[0] == 0:
        raise ValueError("`gap` must hold at least one value, got an empty input")
    s = _labels(sites, "sites", g.shape[0])
    return {k: _group_stats(g[s == k]) for k in sorted(set(s.tolist()), key=str)}


def gap_by_group(gap: Any, groups: Any, *, reference: Any = None) -> dict[Any, dict[str, Any]]:
    r"""The brain-age gap per group and each group against a reference group.

    For group :math:`g` against reference :math:`r` (gaps :math:`x` of size :math:`n_g`, :math:`y` of size
    :math:`n_r`):

    .. math::
        d = \frac{\bar x - \bar y}{s_p}, \quad s_p^2 = \frac{(n_g-1)s_x^2 + (n_r-1)s_y^2}{n_g + n_r - 2},
        \qquad \mathrm{AUC} = \frac{U}{n_g n_r} = P(X > Y) + \tfrac12 P(X = Y)

    with ``p_welch`` the two-sided Welch t-test and ``p_mannwhitney`` the two-sided Mann-Whitney U test
    (:mod:`scipy.stats`); the AUC is that of the gap as a score for telling group :math:`g` (positive) from
    the reference (as ``sklearn.metrics.roc_auc_score``), the way Cheng et al. (IEEE TMI 2021, "Brain Age
    Estimation From MRI Using Cascade Networks With Ranking Loss") report AD vs healthy. ``reference``
    defaults to the first group in sorted order (of ``str``). Where a group or the reference has one
    subject, ``d`` and ``p_welch`` are NaN (no variance), ``p_mannwhitney`` and ``auc`` are still defined;
    ``d`` is NaN also when both groups have zero spread. The reference row holds only n, mean and sd.

    Shape:
        - gap: ``(N,)`` real and finite; groups: ``(N,)`` labels; output:
          ``{group: {"n", "mean", "sd", "d", "p_welch", "p_mannwhitney", "auc"}}``.

    Example:
        >>> t = gap_by_group([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], ["hc", "hc", "hc", "ad", "ad", "ad"], reference="hc")
        >>> t["ad"]["auc"], round(t["ad"]["d"], 3)
        (1.0, 3.0)
    """
    from scipy.stats import mannwhitneyu, ttest_ind

    g = _as_1d(gap, "gap")
    if g.shape[0] == 0:
        raise ValueError("`gap` must hold at least one value, got an empty input")
    lab = _labels(groups, "groups", g.shape[0])
    names = sorted(set(lab.tolist()), key=str)
    if reference is None:
        reference = names[0]
    if reference not in names:
        raise ValueError(f"`reference` must be one of the groups {names}, got {reference!r}")
    y = g[lab == reference]
    out: dict[Any, dict[str, Any]] = {}
    for k in names:
        x = g[lab == k]
        row: dict[str, Any] = dict(_group_stats(x))
        if k != reference:
            nx, ny = x.shape[0], y.shape[0]
            if nx > 1 and ny > 1:
                sp2 = ((nx - 1) * x.var(ddof=1) + (ny - 1) * y.var(ddof=1)) / (nx + ny - 2)
                row["d"] = float((x.mean() - y.mean()) / math.sqrt(sp2)) if sp2 > 0 else math.nan
                row["p_welch"] = float(ttest_ind(x, y, equal_var=False).pvalue) if sp2 > 0 else math.nan
            else:
                row["d"] = math.nan
                row["p_welch"] = math.nan
            mw = mannwhitneyu(x, y, alternative="two-sided")
            row["p_mannwhitney"] = float(mw.pvalue)
            row["auc"] = float(mw.statistic) / (nx * ny)
        out[k] = row
    return out


#: relative change of the empirical-Bayes estimates at which :func:`combat_fit` stops iterating
COMBAT_TOL = 1e-4
#: most iterations of the empirical-Bayes fixed point of :func:`combat_fit`
COMBAT_MAX_ITER = 1000


@dataclasses.dataclass(frozen=True)
class ComBat:
    """ComBat's site effects fitted by :func:`combat_fit`; :meth:`apply` harmonises new subjects.

    ``sites``: the fitted site labels (sorted by ``str``); ``beta``: ``(C, F)`` covariate coefficients;
    ``grand_mean``, ``var_pooled``: ``(F,)``; ``gamma``, ``delta``: ``(S, F)`` the (empirical-Bayes)
    additive and multiplicative site effects :math:`\\gamma^*_{sf}`, :math:`\\delta^*_{sf}`; ``gamma_hat``,
    ``delta_hat``: their per-site least-squares estimates; ``eb``: whether the estimates were shrunk.
    """

    sites: tuple[Any, ...]
    grand_mean: np.ndarray
    beta: np.ndarray
    var_pooled: np.ndarray
    gamma: np.ndarray
    delta: np.ndarray
    gamma_hat: np.ndarray
    delta_hat: np.ndarray
    eb: bool

    def apply(self, data: Any, sites: Any, *, covariates: Any = None) -> np.ndarray:
        r"""Harmonise ``data`` of subjects of fitted sites with the fitted effects.

        .. math::
            y^{\mathrm{ComBat}}_{if} = \frac{z_{if} - \gamma^*_{s(i)f}}{\sqrt{\delta^*_{s(i)f}}}\,\sigma_f
            + \alpha_f + x_i^\top\beta_f, \qquad z_{if} = \frac{y_{if} - \alpha_f - x_i^\top\beta_f}{\sigma_f}

        with the subject's own covariates :math:`x_i` (their fitted effect is kept). A site that the fit
        did not see is a ``ValueError`` naming it.

        Shape:
            - data: ``(N,)`` or ``(N, F)``; sites: ``(N,)``; covariates: ``(N, C)`` (or ``(N,)`` for one);
              output: shaped as ``data``, float64.
        """
        y, squeeze = _features(data, "data")
        if y.shape[1] != self.grand_mean.shape[0]:
            raise ValueError(f"`data` must have the {self.grand_mean.shape[0]} fitted feature(s), got {y.shape[1]}")
        lab = _labels(sites, "sites", y.shape[0], "subject")
        index = {s: j for j, s in enumerate(self.sites)}
        unseen = sorted({s for s in lab.tolist() if s not in index}, key=str)
        if unseen:
            raise ValueError(
                f"`sites` {unseen} were not in the fitted data (fitted sites: {list(self.sites)}): ComBat estimates "
                "a site's effects from its own subjects"
            )
        x = _covariates(covariates, y.shape[0], self.beta.shape[0])
        code = np.array([index[s] for s in lab.tolist()], dtype=np.int64)
        fitted = self.grand_mean + x @ self.beta
        sd = np.sqrt(self.var_pooled)
        z = (y - fitted) / sd
        out = (z - self.gamma[code]) / np.sqrt(self.delta[code]) * sd + fitted
        return out[:, 0] if squeeze else out


def _features(data: Any, name: str) -> tuple[np.ndarray, bool]:
    """``data`` as a finite float64 ``(N, F)`` array, and whether it was one feature ``(N,)``."""
    arr = np.asarray(data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else data)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"`{name}` must hold real numbers, got an array of {arr.dtype}")
    if arr.ndim not in (1, 2):
        raise ValueError(f"`{name}` must be (N,) or (N, F), got shape {arr.shape}")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        raise ValueError(f"`{name}` must be finite, got NaN or inf values")
    return (arr[:, None], True) if arr.ndim == 1 else (arr, False)


def _covariates(covariates: Any, n: int, c: int | None = None) -> np.ndarray:
    if covariates is None:
        x = np.zeros((n, 0))
    else:
        x, _ = _features(covariates, "covariates")
        if x.shape[0] != n:
            raise ValueError(f"`covariates` must have one row per subject ({n}), got {x.shape[0]}")
    if c is not None and x.shape[1] != c:
        raise ValueError(f"`covariates` must have the {c} fitted column(s), got {x.shape[1]}")
    return x


def combat_fit(data: Any, sites: Any, *, covariates: Any = None, eb: bool = True) -> ComBat:
    r"""Fit ComBat's additive and multiplicative site effects (Johnson et al., Biostatistics 2007; Fortin et
    al., NeuroImage 2018) on ``data``; :meth:`ComBat.apply` harmonises these or new subjects of the same sites.

    Each feature :math:`f` of subject :math:`i` at site :math:`s` follows

    .. math::
        y_{if} = \alpha_f + x_i^\top\beta_f + \gamma_{sf} + \delta_{sf}\,\varepsilon_{if},
        \qquad \varepsilon_{if} \sim \mathcal N(0, \sigma_f^2)

    Least squares on the design ``[site one-hot, covariates]`` gives :math:`\hat\beta_f` and per-site
    intercepts, :math:`\alpha_f = \sum_s (n_s / n) \hat\alpha_{sf}`, :math:`\sigma_f^2` the mean squared
    residual (divided by :math:`n`); the standardized data :math:`z_{if} = (y_{if} - \alpha_f -
    x_i^\top\hat\beta_f) / \sigma_f` give :math:`\hat\gamma_{sf}` (the site's mean) and
    :math:`\hat\delta_{sf}` (its variance, ddof 1; 0 is taken as 1). With ``eb``, the parametric empirical Bayes
    of Johnson et al. shrinks them towards priors pooled over the features of each site -- :math:`\gamma_{sf}
    \sim \mathcal N(\bar\gamma_s, \tau_s^2)`, :math:`\delta_{sf} \sim \Gamma^{-1}(a_s, b_s)` by the method of
    moments -- iterating

    .. math::
        \gamma^*_{sf} = \frac{n_s \tau_s^2 \hat\gamma_{sf} + \delta^*_{sf}\bar\gamma_s}{n_s\tau_s^2 + \delta^*_{sf}},
        \qquad \delta^*_{sf} = \frac{b_s + \tfrac12\sum_{i \in s}(z_{if} - \gamma^*_{sf})^2}{n_s/2 + a_s - 1}

    until the largest relative change is below :data:`COMBAT_TOL`; without ``eb`` (needed for one feature,
    whose prior has no spread to estimate) :math:`\gamma^* = \hat\gamma`, :math:`\delta^* = \hat\delta`. The
    covariates' effects :math:`x_i^\top\beta_f` are kept by the harmonisation; code a categorical covariate
    as indicator columns without one level (the site indicators already hold the intercept).

    Every site needs at least 2 subjects; ``eb`` at least 2 features. ``ValueError`` names what is missing.

    Shape:
        - data: ``(N,)`` or ``(N, F)`` (subjects x features); sites: ``(N,)`` labels; covariates: ``(N, C)``
          (``(N,)`` for one).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> sites = np.repeat(["a", "b"], 50)
        >>> y = rng.normal(size=(100, 3)) + np.where(sites == "b", 2.0, 0.0)[:, None]
        >>> fit = combat_fit(y, sites)
        >>> h = fit.apply(y, sites)
        >>> bool(abs(h[sites == "b"].mean() - h[sites == "a"].mean()) < 0.1)
        True
    """
    y, _ = _features(data, "data")
    n, f = y.shape
    lab = _labels(sites, "sites", n, "subject")
    names = tuple(sorted(set(lab.tolist()), key=str))
    index = {s: j for j, s in enumerate(names)}
    code = np.array([index[s] for s in lab.tolist()], dtype=np.int64)
    counts = np.bincount(code, minlength=len(names))
    small = [names[j] for j in np.flatnonzero(counts < 2)]
    if small:
        raise ValueError(f"every site needs at least 2 subjects to estimate its variance; {small} have 1")
    if eb and f < 2:
        raise ValueError(
            "`eb=True` pools the site effects over features and needs at least 2 features, got 1: use eb=False"
        )
    x = _covariates(covariates, n)
    onehot = np.zeros((n, len(names)))
    onehot[np.arange(n), code] = 1.0
    design = np.hstack([onehot, x])
    if np.linalg.matrix_rank(design) < design.shape[1]:
        raise ValueError(
            "the design [site indicators, covariates] is rank-deficient: a covariate is constant, collinear "
            "with another, or confounded with the sites"
        )
    coef = np.linalg.solve(design.T @ design, design.T @ y)  # (S + C, F)
    grand = (counts / n) @ coef[: len(names)]
    beta = coef[len(names) :]
    var = ((y - design @ coef) ** 2).mean(axis=0)
    if not (var > 0).all():
        raise ValueError("a feature is fitted exactly by the sites and covariates (zero residual variance)")
    z = (y - grand - x @ beta) / np.sqrt(var)
    gamma_hat = onehot.T @ z / counts[:, None]  # (S, F)
    delta_hat = np.stack([z[code == j].var(axis=0, ddof=1) for j in range(len(names))])
    delta_hat = np.where(delta_hat == 0, 1.0, delta_hat)
    gamma, delta = gamma_hat, delta_hat
    if eb:
        gamma, delta = _combat_eb(z, code, counts, gamma_hat, delta_hat)
    return ComBat(names, grand, beta, var, gamma, delta, gamma_hat, delta_hat, bool(eb))


def _combat_eb(
    z: np.ndarray, code: np.ndarray, counts: np.ndarray, gamma_hat: np.ndarray, delta_hat: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The parametric empirical-Bayes estimates of :func:`combat_fit`, every site at once."""
    gbar = gamma_hat.mean(axis=1, keepdims=True)
    t2 = gamma_hat.var(axis=1, ddof=1, keepdims=True)
    m = delta_hat.mean(axis=1, keepdims=True)
    s2 = delta_hat.var(axis=1, ddof=1, keepdims=True)
    if not ((t2 > 0).all() and (s2 > 0).all()):
        raise ValueError("the site effects do not vary over the features: their priors are not determined")
    a = (2 * s2 + m**2) / s2
    b = (m * s2 + m**3) / s2
    gamma, delta = np.empty_like(gamma_hat), np.empty_like(delta_hat)
    for j in range(gamma_hat.shape[0]):  # each site until its own estimates settle
        zj, nj = z[code == j], float(counts[j])
        g_old, d_old = gamma_hat[j], delta_hat[j]
        for _ in range(COMBAT_MAX_ITER):
            g_new = (t2[j] * nj * gamma_hat[j] + d_old * gbar[j]) / (t2[j] * nj + d_old)
            d_new = (0.5 * ((zj - g_new) ** 2).sum(axis=0) + b[j]) / (nj / 2.0 + a[j] - 1.0)
            change = max(float((np.abs(g_new - g_old) / g_old).max()), float((np.abs(d_new - d_old) / d_old).max()))
            g_old, d_old = g_new, d_new
            if change <= COMBAT_TOL:
                break
        gamma[j], delta[j] = g_old, d_old
    return gamma, delta
