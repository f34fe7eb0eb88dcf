"""Ordinal Entropy and Dist Loss (rankwise.losses.ordinal_regression).

Reference values (``tests/losses/data/ordinal_regression_reference.json``) were produced by running
the authors' own functions on CPU in float64, in a scratch directory outside this repository (their
``.cuda()`` calls made no-ops, nothing else changed):

* needylove/OrdinalEntropy at commit 75fc9d50fa94d0240f4a7eac04fa2ce206eee4a2:
  ``OrdinalEntropy.ordinal_entropy(features, gt)`` (root file; entries ``"variant": "root"``, with
  the 10 rows its ``random.sample(range(B - 1), 10)`` drew stored as ``indices``) and
  ``AgeEstimation/OrdinalEntropy.ordinalentropy(features, gt)`` (entries ``"variant": "age"``), on
  standard-normal features (12x5, 16x3; 16x6, 10x4, 20x3), continuous targets for the root file and
  targets with repeats (a few classes, 2.5 apart) for the AgeEstimation one; value and gradient
  with respect to the features.
* Ngk03/DIR-Dist-Loss at commit d487e68d48a82d235aba48f80ef8e654b0c73ef7 (``agedb-dir``):
  ``loss_utils.get_label_distribution`` (scipy ``gaussian_kde``), ``get_batch_theoretical_labels`` and
  ``dist_loss.DistLoss`` with the ``fast_soft_sort`` copy vendored in that repository, on 500 rounded
  synthetic ages (``train_labels``), for l1 / mse / huber / focal_l1 losses, Scott / Silverman / 0.5
  bandwidths, steps 1 and 0.5, batch sizes 24 to 64, with and without weights; density, pseudo-labels,
  value and gradient with respect to the predictions. ``pseudo_labels`` holds the authors' labels for
  batch sizes 2 to 1000 (cases where their counts are non-negative and sum to the batch size).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import rankwise
from rankwise._validation import MissingTrainLabelsError
from rankwise.losses import DistLoss, OrdinalEntropyLoss, dist_loss, get_loss_entry, ordinal_entropy_loss

REF = json.loads((Path(__file__).parent / "data" / "ordinal_regression_reference.json").read_text())
F64 = torch.float64


def _t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# --------------------------------------------------------------------------------------------------
# parity with the authors' code
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", REF["ordinal_entropy"], ids=lambda c: f"{c['variant']}-{len(c['features'])}")
def test_ordinal_entropy_matches_the_authors(case: dict) -> None:
    z = _t(case["features"]).requires_grad_()
    y = _t(case["targets"])
    if case["variant"] == "root":
        loss = ordinal_entropy_loss(z, y, tightness=False, centers=False, indices=case["indices"])
    else:
        loss = ordinal_entropy_loss(z, y)
    loss.backward()
    torch.testing.assert_close(loss, _t(case["value"]), rtol=1e-12, atol=0)
    torch.testing.assert_close(z.grad, _t(case["grad"]), rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("case", REF["dist_loss"], ids=lambda c: f"{c['loss']}-{c['bw']}-{c['b']}")
def test_dist_loss_matches_the_authors(case: dict) -> None:
    labels = _t(REF["train_labels"])
    opts = {
        "label_range": (case["lo"], case["hi"]),
        "step": case["step"],
        "bandwidth": case["bw"],
        "kind": case["loss"],
        "loss_weight": case["lw"],
        "regularization_strength": case["rs"],
    }
    crit = DistLoss(train_labels=labels, **opts)
    torch.testing.assert_close(crit.density, _t(case["density"]), rtol=1e-12, atol=1e-16)
    assert crit.pseudo_labels(case["b"]).tolist() == case["pseudo_labels"]
    w = None if case["weights"] is None else _t(case["weights"])
    for call in (
        lambda p: crit(p, _t(case["targets"]), w),
        lambda p: dist_loss(p, _t(case["targets"]), train_labels=labels, weights=w, **opts),
    ):
        p = _t(case["predictions"]).requires_grad_()
        loss = call(p)
        loss.backward()
        torch.testing.assert_close(loss, _t(case["value"]), rtol=1e-12, atol=0)
        torch.testing.assert_close(p.grad, _t(case["grad"]), rtol=1e-9, atol=1e-14)


def test_pseudo_labels_match_the_authors_for_every_batch_size() -> None:
    labels = _t(REF["train_labels"])
    for case in REF["pseudo_labels"]:
        assert case["valid"]
        crit = DistLoss(train_labels=labels, label_range=(case["lo"], case["hi"]), bandwidth=case["bw"])
        assert crit.pseudo_labels(case["b"]).tolist() == case["pseudo_labels"], case["b"]


# --------------------------------------------------------------------------------------------------
# the kernel density against scipy
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bandwidth", ["scott", "silverman", 0.5, 2.0])
@pytest.mark.parametrize("step", [1.0, 0.25])
def test_density_matches_scipy_gaussian_kde(bandwidth: str | float, step: float) -> None:
    stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(0)
    labels = torch.cat([torch.randn(200, generator=g) * 3 + 10, torch.rand(30, generator=g) * 20]).double()
    lo, hi = 2.0, 18.0
    crit = DistLoss(train_labels=labels, label_range=(lo, hi), step=step, bandwidth=bandwidth)
    x = labels.numpy()
    x = x[(x >= lo) & (x <= hi)]
    grid = np.arange(lo, hi + step, step)
    want = stats.gaussian_kde(x, bw_method=bandwidth)(grid)
    want /= want.sum()
    np.testing.assert_allclose(crit.grid.numpy(), grid, rtol=0, atol=1e-12)
    np.testing.assert_allclose(crit.density.numpy(), want, rtol=1e-10, atol=1e-300)
    # the function (every label, no grouping of repeats) computes the same density
    pred = torch.zeros(5, dtype=F64)
    a = dist_loss(pred, pred, train_labels=labels.round(), label_range=(lo, hi), step=step, bandwidth=bandwidth)
    b = DistLoss(train_labels=labels.round(), label_range=(lo, hi), step=step, bandwidth=bandwidth)(pred, pred)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


# --------------------------------------------------------------------------------------------------
# a plain-loop implementation of the formulas
# --------------------------------------------------------------------------------------------------
def _loop_ordinal_entropy(z: torch.Tensor, y: list[float], tightness: bool, centers: bool) -> torch.Tensor:
    classes = sorted(set(y))
    zn = [v / v.norm() for v in z]
    if centers:
        cent = {c: sum(z[i] for i in range(len(y)) if y[i] == c) for c in classes}
        cent = {c: v / v.norm() for c, v in cent.items()}
        items = [(cent[c], c) for c in classes]
    else:
        items = list(zip(zn, y))
    pairs = [(a, b) for i, a in enumerate(items) for b in items[i + 1 :]]
    ws = [abs(a[1] - b[1]) for a, b in pairs]
    total = z.sum() * 0
    for (a, b), w in zip(pairs, ws):
        total = total + (w - min(ws)) / max(ws) * (a[0] - b[0]).norm()
    loss = -total / max(len(pairs), 1)
    if tightness:
        cent = {c: sum(z[i] for i in range(len(y)) if y[i] == c) for c in classes}
        ts = [(zn[i] - cent[y[i]] / cent[y[i]].norm()).norm() for i in range(len(y))]
        ts = [t for t in ts if t > 0]
        if ts:
            loss = loss + sum(ts) / len(ts)
    return loss


@pytest.mark.parametrize(("tightness", "centers"), [(True, True), (False, True), (True, False), (False, False)])
def test_ordinal_entropy_equals_a_plain_loop(tightness: bool, centers: bool) -> None:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(9, 4, generator=g, dtype=F64)
    y = [3.0, 1.0, 3.0, 7.0, 1.0, 2.0, 3.0, 9.0, 7.0]
    got = ordinal_entropy_loss(z, torch.tensor(y), tightness=tightness, centers=centers)
    torch.testing.assert_close(got, _loop_ordinal_entropy(z, y, tightness, centers), rtol=1e-12, atol=1e-15)


def test_dist_loss_equals_its_formula() -> None:
    g = torch.Generator().manual_seed(2)
    pred = torch.randn(7, generator=g, dtype=F64) * 5 + 30
    target = torch.randn(7, generator=g, dtype=F64) * 5 + 30
    w = torch.rand(7, generator=g, dtype=F64) + 0.5
    labels = torch.randn(50, generator=g, dtype=F64).mul(6).add(30).round()
    crit = DistLoss(train_labels=labels, kind="mse", loss_weight=0.7, regularization_strength=0.3)
    pseudo = crit.pseudo_labels(7)
    s = rankwise.soft_sort(pred, regularization_strength=0.3)
    want = [w[i] * (0.7 * (s[i] - pseudo[i]) ** 2 + (pred[i] - target[i]) ** 2) for i in range(7)]
    torch.testing.assert_close(crit(pred, target, w), sum(want) / 7, rtol=1e-12, atol=0)
    none = DistLoss(train_labels=labels, kind="mse", loss_weight=0.7, regularization_strength=0.3, reduction="none")
    torch.testing.assert_close(none(pred[:, None], target[:, None], w), torch.stack(want)[:, None])


# --------------------------------------------------------------------------------------------------
# degenerate inputs
# --------------------------------------------------------------------------------------------------
def _value_and_grad(fn, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    z = z.clone().requires_grad_()
    v = fn(z)
    v.backward()
    assert z.grad is not None
    return v.detach(), z.grad


@pytest.mark.parametrize("n", [0, 1])
@pytest.mark.parametrize("centers", [True, False])
def test_ordinal_entropy_of_nothing_to_constrain_is_zero(n: int, centers: bool) -> None:
    v, g = _value_and_grad(
        lambda z: ordinal_entropy_loss(z, torch.arange(float(n)), centers=centers), torch.randn(n, 3)
    )
    assert v == 0 and torch.equal(g, torch.zeros_like(g))


def test_ordinal_entropy_all_targets_equal_and_all_distinct() -> None:
    z = torch.randn(6, 3, generator=torch.Generator().manual_seed(3), dtype=F64)
    same = torch.full((6,), 4.0)
    # one class: no diversity, the tightness alone
    v = ordinal_entropy_loss(z, same)
    assert v > 0 and torch.isfinite(v)
    torch.testing.assert_close(ordinal_entropy_loss(z, same, tightness=False), torch.zeros((), dtype=F64))
    v, g = _value_and_grad(lambda x: ordinal_entropy_loss(x, same, tightness=False, centers=False), z)
    assert v == 0 and torch.equal(g, torch.zeros_like(g))
    # every target distinct: no row away from its centre, a tightness of 0 (the authors' empty mean)
    distinct = torch.arange(6.0)
    torch.testing.assert_close(ordinal_entropy_loss(z, distinct), ordinal_entropy_loss(z, distinct, tightness=False))


def test_ordinal_entropy_sampling() -> None:
    z = torch.randn(12, 4, generator=torch.Generator().manual_seed(4))
    y = torch.arange(12.0) % 5
    a = ordinal_entropy_loss(z, y, num_samples=6, generator=torch.Generator().manual_seed(5))
    b = ordinal_entropy_loss(z, y, num_samples=6, generator=torch.Generator().manual_seed(5))
    rows = torch.randperm(12, generator=torch.Generator().manual_seed(5))[:6]
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, ordinal_entropy_loss(z, y, indices=rows))
    torch.testing.assert_close(ordinal_entropy_loss(z, y, num_samples=50), ordinal_entropy_loss(z, y))
    module = OrdinalEntropyLoss(tightness=False, indices=[0, 3, 5])
    torch.testing.assert_close(module(z, y), ordinal_entropy_loss(z[[0, 3, 5]], y[[0, 3, 5]], tightness=False))


def test_ordinal_entropy_half_inputs_compute_in_float32() -> None:
    z = torch.randn(8, 5, generator=torch.Generator().manual_seed(6))
    y = torch.arange(8.0) % 3
    out = ordinal_entropy_loss(z.half(), y)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ordinal_entropy_loss(z.half().float(), y))


def test_dist_loss_degenerate_batches() -> None:
    labels = torch.tensor([20.0, 21.0, 25.0, 25.0, 30.0, 44.0])
    crit = DistLoss(train_labels=labels)
    v, g = _value_and_grad(lambda p: crit(p, p.detach()), torch.zeros(0))
    assert v == 0 and g.shape == (0,)
    assert crit.pseudo_labels(1).shape == (1,)
    v, g = _value_and_grad(lambda p: crit(p, torch.full((4,), 30.0)), torch.full((4,), 30.0))
    assert torch.isfinite(v) and torch.isfinite(g).all()
    # training labels of zero spread: every pseudo-label on the grid point nearest to them
    point = DistLoss(train_labels=[31.3, 31.3], label_range=(20, 40))
    assert point.pseudo_labels(5).tolist() == [31.0] * 5
    # no training label in range: the function uses a uniform density, the module refuses
    uni = dist_loss(torch.zeros(3), torch.zeros(3), train_labels=torch.tensor([100.0]), label_range=(0, 2))
    torch.testing.assert_close(uni, torch.tensor((0 + 1 + 2 + 0) / 3))  # pseudo-labels 0, 1, 2
    with pytest.raises(ValueError, match=r"`train_labels` has no label in `label_range`"):
        DistLoss(train_labels=[100.0], label_range=(0, 2))


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8, 13, 40, 97, 300])
def test_pseudo_labels_are_always_batch_many_ascending_grid_labels(batch: int) -> None:
    # a density peaked at the grid's start (residual windows that would wrap around) and a flat one
    for labels in (torch.tensor([0.0] * 40 + [1.0] * 10 + [5.0, 9.0, 30.0]), torch.arange(0.0, 30.0)):
        for bw in ("scott", 0.05, 3.0):
            crit = DistLoss(train_labels=labels, label_range=(0, 30), bandwidth=bw)
            pseudo = crit.pseudo_labels(batch)
            assert pseudo.shape == (batch,)
            assert bool((pseudo[1:] >= pseudo[:-1]).all())
            assert bool(torch.isin(pseudo, crit.grid).all())


def test_dist_loss_nan_policy() -> None:
    p, t = torch.zeros(3), torch.zeros(3)
    out = dist_loss(p, t, train_labels=torch.tensor([1.0, math.nan]), label_range=(0, 2))
    assert torch.isnan(out)
    with pytest.raises(ValueError, match=r"`train_labels` must be finite"):
        DistLoss(train_labels=[1.0, math.inf])


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------
def test_errors_name_the_argument() -> None:
    z, y = torch.randn(4, 3), torch.arange(4.0)
    with pytest.raises(ValueError, match=r"`indices` and `num_samples` are exclusive"):
        ordinal_entropy_loss(z, y, indices=[0, 1], num_samples=2)
    with pytest.raises(ValueError, match=r"`targets` must have shape \(4,\)"):
        ordinal_entropy_loss(z, torch.arange(5.0))
    with pytest.raises(ValueError, match=r"`indices` must be in \[0, 4\)"):
        ordinal_entropy_loss(z, y, indices=[0, 7])
    with pytest.raises(TypeError, match=r"`tightness` must be a bool"):
        OrdinalEntropyLoss(tightness=1)  # type: ignore[arg-type]
    with pytest.raises(MissingTrainLabelsError, match=r"`train_labels` is required"):
        DistLoss()
    labels = [1.0, 2.0, 3.0]
    with pytest.raises(TypeError, match=r"`label_range` must be a \(min_label, max_label\) pair"):
        DistLoss(train_labels=labels, label_range=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`label_range` must be \(min_label, max_label\) with min_label <= max_label"):
        DistLoss(train_labels=labels, label_range=(3, 1))
    with pytest.raises(TypeError, match=r"`bandwidth` must be 'scott', 'silverman' or a float"):
        DistLoss(train_labels=labels, bandwidth=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`kind` must be one of"):
        DistLoss(train_labels=labels, kind="l3")
    with pytest.raises(ValueError, match=r"`step` must be finite and > 0"):
        dist_loss(torch.zeros(2), torch.zeros(2), train_labels=labels, step=0.0)
    with pytest.raises(ValueError, match=r"`targets` must have the shape of `predictions`"):
        dist_loss(torch.zeros(2), torch.zeros(3), train_labels=labels)
    with pytest.raises(ValueError, match=r"`predictions` must have shape \(B,\) or \(B, 1\)"):
        dist_loss(torch.zeros(2, 2), torch.zeros(2, 2), train_labels=labels)


# --------------------------------------------------------------------------------------------------
# as losses of the DIR recipes
# --------------------------------------------------------------------------------------------------
def test_both_build_as_recipe_losses() -> None:
    pytest.importorskip("yaml")
    from rankwise.recipes import load_config
    from rankwise.recipes.config import RegularizerConfig
    from rankwise.recipes.loss_terms import build_regularizers, build_task_loss, check_loss_config

    entry = get_loss_entry("ordinal_entropy")
    assert entry.inputs == {"features": "features", "targets": "targets"}
    assert get_loss_entry("dist_loss").inputs == {"predictions": "predictions", "targets": "targets"}
    cfg = load_config(
        "abalone_vanilla",
        [
            "loss.name=dist_loss",
            "loss.options.kind=mse",
            "loss.options.regularization_strength=0.5",
        ],
    )
    cfg.loss.regularizers = [RegularizerConfig(name="ordinal_entropy", weight=0.1, options={"tightness": False})]
    check_loss_config(cfg.loss)  # the options are checked without the training labels
    labels = torch.tensor([5.0, 7.0, 7.0, 8.0, 9.0, 9.0, 10.0, 11.0, 15.0, 20.0], dtype=F64)
    task = build_task_loss(cfg.loss, train_labels=labels)
    regs = build_regularizers(cfg.loss.regularizers, train_labels=labels)
    g = torch.Generator().manual_seed(7)
    feats = torch.randn(6, 4, generator=g, requires_grad=True)
    pred = torch.randn(6, generator=g).mul(3).add(9).requires_grad_()
    y = torch.tensor([7.0, 9.0, 9.0, 10.0, 12.0, 15.0])
    tensors = {"features": feats, "predictions": pred, "targets": y, "weights": None}
    total = task(tensors) + sum(r.weight * r(tensors) for r in regs)
    want = dist_loss(
        pred, y, train_labels=labels, kind="mse", regularization_strength=0.5
    ) + 0.1 * ordinal_entropy_loss(feats, y, tightness=False)
    torch.testing.assert_close(total, want)
    total.backward()
    assert feats.grad is not None and pred.grad is not None
    assert isinstance(task.loss, DistLoss) and regs[0].loss.distributed == "auto"
