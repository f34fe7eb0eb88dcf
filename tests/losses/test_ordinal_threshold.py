"""CORAL, CORN and CONDOR (rankwise.losses.ordinal) against coral-pytorch 1.4.0 and condor-pytorch 1.1.0
(values and gradients, float32 and float64, every reduction, importance weights, K = 2..10, B = 1), against
plain loops written from the papers' formulas, and their errors and degenerate batches (empty batch, one
example, every target in class 0 or in class K-1: CORN's empty task subsets)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rankwise._registry import OrdinalHead
from rankwise.losses import (
    CondorLoss,
    CoralLoss,
    CornLoss,
    condor_loss,
    condor_predict,
    coral_loss,
    coral_predict,
    corn_loss,
    corn_predict,
    get_loss_entry,
    levels_from_labels,
)

KS = [2, 3, 5, 10]
SEEDS = [0, 1, 2]
BATCHES = [1, 2, 9]
DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: {"rtol": 1e-6, "atol": 1e-6}, torch.float64: {"rtol": 1e-12, "atol": 1e-12}}


def _coral_ref() -> Any:
    """coral-pytorch (its package does not import its submodules): ``.losses``, ``.dataset``."""
    pytest.importorskip("coral_pytorch")
    import coral_pytorch.dataset
    import coral_pytorch.losses

    return coral_pytorch


def _condor_ref() -> Any:
    pytest.importorskip("condor_pytorch")
    import condor_pytorch.dataset
    import condor_pytorch.losses

    return condor_pytorch


def _data(seed: int, b: int, k: int, dtype: torch.dtype, scale: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, k - 1, generator=g, dtype=torch.float64) * scale).to(dtype)
    labels = torch.randint(k, (b,), generator=g)
    return logits, labels


def _levels(labels: torch.Tensor, k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (labels[:, None] > torch.arange(k - 1)).to(dtype)


def _value_and_grad(fn: Any, logits: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.detach().clone().requires_grad_()
    out = fn(x, *args, **kwargs)
    w = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)
    (grad,) = torch.autograd.grad((out * w).sum(), x)
    return out.detach(), grad


def _assert_same(ours: Any, theirs: Any, logits: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    v1, g1 = _value_and_grad(ours, logits, *args, **kwargs)
    v2, g2 = _value_and_grad(theirs, logits, *args, **kwargs)
    assert v1.dtype == v2.dtype == logits.dtype and v1.shape == v2.shape
    torch.testing.assert_close(v1, v2, **TOL[logits.dtype])
    torch.testing.assert_close(g1, g2, **TOL[logits.dtype])


# --------------------------------------------------------------------------------------------------
# independent implementations: plain loops over examples and tasks, from the papers' formulas
# --------------------------------------------------------------------------------------------------
def _log_sigmoid(z: float) -> float:
    return -math.log1p(math.exp(-z)) if z >= 0 else z - math.log1p(math.exp(z))


def _bce(z: float, label: float) -> float:
    """-[l log s(z) + (1 - l) log(1 - s(z))], with log(1 - s(z)) = log s(-z)."""
    return -(label * _log_sigmoid(z) + (1 - label) * _log_sigmoid(-z))


def _loop_coral(logits: torch.Tensor, labels: torch.Tensor, weights: list[float] | None = None) -> list[float]:
    """Cao et al. 2020, eq. (2): per example the weighted sum over the K-1 thresholds of the BCE of [y > k]."""
    out = []
    for row, y in zip(logits.tolist(), labels.tolist()):
        total = 0.0
        for k, z in enumerate(row):
            total += (1.0 if weights is None else weights[k]) * _bce(z, 1.0 if y > k else 0.0)
        out.append(total)
    return out


def _loop_corn(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Shi et al. 2023, eq. (6): task k on the subset y >= k (label [y > k]); one average over every
    (example, task) pair of the subsets."""
    total, count = 0.0, 0
    for k in range(logits.shape[1]):
        for row, y in zip(logits.tolist(), labels.tolist()):
            if y >= k:
                total += _bce(row[k], 1.0 if y > k else 0.0)
                count += 1
    return total / count


def _loop_condor(logits: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """Dennis et al. 2021: -log P(y) with P(y) = prod_{k < y} s(z_k) * (1 - s(z_y)) [y < K-1], i.e. the
    BCE of task k counted while every previous level is 1 (k <= y)."""
    out = []
    for row, y in zip(logits.tolist(), labels.tolist()):
        nll = 0.0
        for k, z in enumerate(row):
            if k <= y:
                nll += _bce(z, 1.0 if y > k else 0.0)
        out.append(nll)
    return out


# --------------------------------------------------------------------------------------------------
# levels_from_labels
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("b", BATCHES)
def test_levels_from_labels_equals_the_references(k: int, b: int) -> None:
    coral = _coral_ref()
    condor = _condor_ref()
    labels = torch.randint(k, (b,), generator=torch.Generator().manual_seed(k * 10 + b))
    ours = levels_from_labels(labels, k)
    want = coral.dataset.levels_from_labelbatch(labels, num_classes=k)
    assert ours.dtype == want.dtype == torch.float32 and ours.shape == (b, k - 1)
    assert torch.equal(ours, want)
    assert torch.equal(ours, condor.dataset.levels_from_labelbatch(labels, num_classes=k))
    # a list of ints, as the reference takes it; (B, 1) labels as well; another dtype
    assert torch.equal(levels_from_labels(labels.tolist(), k), want)
    assert torch.equal(levels_from_labels(labels[:, None], k), want)
    assert torch.equal(
        levels_from_labels(labels, k, dtype=torch.float64),
        coral.dataset.levels_from_labelbatch(labels, num_classes=k, dtype=torch.float64),
    )


def test_levels_from_labels_definition_and_device() -> None:
    labels = torch.tensor([0, 3, 1, 2], dtype=torch.int32)
    lv = levels_from_labels(labels, 4)
    for i, y in enumerate(labels.tolist()):
        assert lv[i].tolist() == [1.0 if y > j else 0.0 for j in range(3)]
    meta = levels_from_labels(labels.to("meta"), 4)  # the device of the labels (the reference: always CPU)
    assert meta.device.type == "meta" and meta.shape == (4, 3) and meta.dtype == torch.float32
    assert levels_from_labels(torch.zeros(0, dtype=torch.long), 5).shape == (0, 4)  # the reference: stack([]) fails
    assert levels_from_labels([], 3).shape == (0, 2)


def test_levels_from_labels_errors() -> None:
    with pytest.raises(ValueError, match=r"`labels` must hold class labels in \[0, 3\].*got 4 at index 1"):
        levels_from_labels(torch.tensor([1, 4]), 4)
    with pytest.raises(ValueError, match=r"`labels` must hold class labels in \[0, 3\].*got -1"):
        levels_from_labels(torch.tensor([-1, 2]), 4)  # the reference returns a row of the wrong length
    with pytest.raises(TypeError, match=r"`labels` must be an integer tensor.*float32.*\.long\(\)"):
        levels_from_labels(torch.tensor([1.0, 2.0]), 4)
    with pytest.raises(TypeError, match=r"`labels` must be an integer tensor.*bool"):
        levels_from_labels(torch.tensor([True, False]), 4)
    with pytest.raises(ValueError, match=r"`labels` must have shape \(B,\) or \(B, 1\), got \(2, 2\)"):
        levels_from_labels(torch.zeros(2, 2, dtype=torch.long), 4)
    with pytest.raises(ValueError, match=r"`num_classes` must be >= 2"):
        levels_from_labels(torch.tensor([0]), 1)
    with pytest.raises(TypeError, match=r"`num_classes` must be an int"):
        levels_from_labels(torch.tensor([0]), 4.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`dtype` must be a real torch.dtype"):
        levels_from_labels(torch.tensor([0]), 4, dtype="float32")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# CORAL
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", None])
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("seed", SEEDS)
def test_coral_loss_equals_coral_pytorch(dtype: torch.dtype, reduction: str | None, k: int, seed: int) -> None:
    ref = _coral_ref().losses.coral_loss
    for b in BATCHES:
        logits, labels = _data(seed, b, k, dtype)
        levels = _levels(labels, k, dtype)
        _assert_same(coral_loss, ref, logits, levels, reduction=reduction)
        g = torch.Generator().manual_seed(seed + 100)
        w = (torch.rand(k - 1, generator=g, dtype=torch.float64) * 2).to(dtype)
        _assert_same(coral_loss, ref, logits, levels, importance_weights=w, reduction=reduction)


def test_coral_reduction_none_is_the_reference_none() -> None:
    ref = _coral_ref().losses.coral_loss
    logits, labels = _data(5, 6, 4, torch.float64)
    levels = _levels(labels, 4, torch.float64)
    _assert_same(
        lambda x, lv: coral_loss(x, lv, reduction="none"), lambda x, lv: ref(x, lv, reduction=None), logits, levels
    )
    torch.testing.assert_close(coral_loss(logits, levels, reduction="none"), coral_loss(logits, levels, reduction=None))


@pytest.mark.parametrize("k", KS)
def test_coral_loss_equals_the_paper_loop(k: int) -> None:
    logits, labels = _data(k, 7, k, torch.float64, scale=5.0)
    levels = _levels(labels, k, torch.float64)
    want = torch.tensor(_loop_coral(logits, labels), dtype=torch.float64)
    torch.testing.assert_close(coral_loss(logits, levels, reduction="none"), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(coral_loss(logits, levels), want.mean(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(coral_loss(logits, levels, reduction="sum"), want.sum(), rtol=1e-12, atol=1e-12)
    w = [0.5 + j for j in range(k - 1)]
    weighted = coral_loss(logits, levels, importance_weights=torch.tensor(w, dtype=torch.float64), reduction="none")
    torch.testing.assert_close(weighted, torch.tensor(_loop_coral(logits, labels, w), dtype=torch.float64))
    # the gradient of the BCE of a logit: sigmoid(z) - level, times its weight (no reduction: per element)
    x = logits.clone().requires_grad_()
    coral_loss(x, levels, reduction="sum").backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, torch.sigmoid(logits) - levels, rtol=1e-12, atol=1e-12)


def test_coral_importance_weights_per_element_and_promotion() -> None:
    ref = _coral_ref().losses.coral_loss
    logits, labels = _data(1, 5, 4, torch.float32)
    levels = _levels(labels, 4)
    full = torch.rand(5, 3, generator=torch.Generator().manual_seed(0))
    _assert_same(coral_loss, ref, logits, levels, importance_weights=full)  # (B, K-1): broadcasts as there
    w64 = torch.rand(3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = coral_loss(logits, levels, importance_weights=w64)
    assert out.dtype == torch.float64  # promoted (the reference rounds the weights to float32 in place)
    torch.testing.assert_close(out, coral_loss(logits.double(), levels.double(), importance_weights=w64))
    ones = coral_loss(logits, levels, importance_weights=torch.ones(3))
    torch.testing.assert_close(ones, coral_loss(logits, levels))


def test_coral_degenerate_batches() -> None:
    ref = _coral_ref().losses.coral_loss
    x = torch.zeros(0, 4, requires_grad=True)
    lv = torch.zeros(0, 4)
    for reduction in ("mean", "sum"):
        out = coral_loss(x, lv, reduction=reduction)
        assert out.item() == 0.0 and out.requires_grad  # 0 that keeps the graph
        (g,) = torch.autograd.grad(out, x)
        assert g.shape == (0, 4)
    assert coral_loss(x, lv, reduction="none").shape == (0,)
    assert math.isnan(ref(x, lv).item())  # the reference's mean of an empty batch: NaN
    # one example; every example in class 0 or in class K-1
    for labels in (torch.tensor([2]), torch.zeros(6, dtype=torch.long), torch.full((6,), 4)):
        logits, _ = _data(0, labels.numel(), 5, torch.float32)
        _assert_same(coral_loss, ref, logits, _levels(labels, 5))
    # K = 2: one threshold, the plain binary cross-entropy
    logits, labels = _data(3, 8, 2, torch.float64)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0], labels.double())
    torch.testing.assert_close(coral_loss(logits, _levels(labels, 2, torch.float64)), bce)


def test_coral_half_precision_is_computed_in_float32() -> None:
    logits, labels = _data(2, 6, 5, torch.float32)
    levels = _levels(labels, 5)
    for half in (torch.float16, torch.bfloat16):
        x = logits.to(half).requires_grad_()
        out = coral_loss(x, levels.to(half))
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, coral_loss(x.detach().float(), levels), rtol=0, atol=1e-6)
        out.backward()
        assert x.grad is not None and x.grad.dtype == half


# --------------------------------------------------------------------------------------------------
# CORN
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("seed", SEEDS)
def test_corn_loss_equals_coral_pytorch(dtype: torch.dtype, k: int, seed: int) -> None:
    ref = _coral_ref().losses.corn_loss
    for b in (*BATCHES, 64):
        logits, labels = _data(seed, b, k, dtype)
        _assert_same(corn_loss, ref, logits, labels, k)


@pytest.mark.parametrize("k", KS)
def test_corn_loss_equals_the_paper_loop(k: int) -> None:
    logits, labels = _data(k + 1, 11, k, torch.float64, scale=5.0)
    got = corn_loss(logits, labels, k)
    assert got.item() == pytest.approx(_loop_corn(logits, labels), rel=1e-12, abs=1e-12)
    # the normalisation: the number of (example, task) pairs of the subsets, sum_i min(y_i + 1, K - 1)
    pairs = sum(min(y + 1, k - 1) for y in labels.tolist())
    x = logits.clone().requires_grad_()
    corn_loss(x, labels, k).backward()
    assert x.grad is not None
    in_subset = (labels[:, None] >= torch.arange(k - 1)).double()
    want = (torch.sigmoid(logits) - _levels(labels, k, torch.float64)) * in_subset / pairs
    torch.testing.assert_close(x.grad, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("k", [2, 4, 7])
def test_corn_empty_task_subsets(k: int) -> None:
    """Every target in class 0: only task 0 trains (the others' subsets are empty); every target in class
    K-1: every task trains on every example with label 1. As the reference; the other logits get no gradient."""
    ref = _coral_ref().losses.corn_loss
    for fill in (0, k - 1, min(1, k - 1)):
        labels = torch.full((6,), fill)
        for dtype in DTYPES:
            logits, _ = _data(fill, 6, k, dtype)
            _assert_same(corn_loss, ref, logits, labels, k)
    logits, _ = _data(0, 6, k, torch.float64)
    x = logits.clone().requires_grad_()
    zeros = torch.zeros(6, dtype=torch.long)
    corn_loss(x, zeros, k).backward()
    assert x.grad is not None and (x.grad[:, 1:] == 0).all() and (x.grad[:, 0] != 0).all()
    want = torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0], torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(corn_loss(logits, zeros, k), want)


def test_corn_empty_batch_is_zero_where_the_reference_divides_by_zero() -> None:
    ref = _coral_ref().losses.corn_loss
    x = torch.zeros(0, 3, requires_grad=True)
    y = torch.zeros(0, dtype=torch.long)
    with pytest.raises(ZeroDivisionError):
        ref(x, y, 4)
    out = corn_loss(x, y, 4)
    assert out.item() == 0.0 and out.requires_grad and out.dtype == torch.float32
    (g,) = torch.autograd.grad(out, x)
    assert g.shape == (0, 3)
    assert CornLoss(num_classes=4)(x, y).item() == 0.0


def test_corn_nan_in_a_logit_outside_every_subset_makes_the_loss_nan() -> None:
    """The reference never reads the logits of tasks above a target, so a NaN there is ignored; here it
    makes the loss NaN (docs/conventions.md: a non-finite input is never silently dropped)."""
    ref = _coral_ref().losses.corn_loss
    logits, _ = _data(0, 4, 4, torch.float32)
    labels = torch.tensor([0, 1, 2, 3])
    logits[0, 2] = math.nan  # example 0 (class 0) trains task 0 only
    assert math.isfinite(ref(logits, labels, 4).item())
    assert math.isnan(corn_loss(logits, labels, 4).item())
    for value in (math.inf, -math.inf):
        logits[0, 2] = value
        assert not math.isfinite(corn_loss(logits, labels, 4).item())


def test_corn_half_precision_is_computed_in_float32() -> None:
    logits, labels = _data(4, 9, 5, torch.float32)
    for half in (torch.float16, torch.bfloat16):
        x = logits.to(half).requires_grad_()
        out = corn_loss(x, labels, 5)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, corn_loss(x.detach().float(), labels, 5), rtol=0, atol=1e-6)
        out.backward()
        assert x.grad is not None and x.grad.dtype == half


def test_corn_is_vectorized() -> None:
    """One masked computation over all tasks: the same graph for any K (no per-task operations) and no
    data-dependent indexing (it runs on the data-less meta device, where a boolean selection or a host
    read of the targets would fail)."""

    def n_nodes(k: int) -> int:
        logits, labels = _data(0, 16, k, torch.float32)
        out = corn_loss(logits.requires_grad_(), labels, k)
        seen, stack = set(), [out.grad_fn]
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            stack.extend(f for f, _ in fn.next_functions)
        return len(seen)

    assert n_nodes(3) == n_nodes(30)
    x = torch.randn(5, 4).to("meta").requires_grad_()
    out = corn_loss(x, torch.tensor([0, 1, 2, 3, 4]).to("meta"), 5)
    assert out.device.type == "meta" and out.shape == ()
    out.backward()


# --------------------------------------------------------------------------------------------------
# CONDOR
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", None])
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("seed", SEEDS)
def test_condor_loss_equals_condor_pytorch(dtype: torch.dtype, reduction: str | None, k: int, seed: int) -> None:
    ref = _condor_ref().losses.condor_negloglikeloss
    for b in BATCHES:
        logits, labels = _data(seed, b, k, dtype)
        _assert_same(condor_loss, ref, logits, _levels(labels, k, dtype), reduction=reduction)


@pytest.mark.parametrize("k", KS)
def test_condor_loss_equals_the_paper_loop(k: int) -> None:
    logits, labels = _data(k + 2, 7, k, torch.float64, scale=5.0)
    levels = _levels(labels, k, torch.float64)
    want = torch.tensor(_loop_condor(logits, labels), dtype=torch.float64)
    torch.testing.assert_close(condor_loss(logits, levels, reduction="none"), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(condor_loss(logits, levels), want.mean(), rtol=1e-12, atol=1e-12)
    # = -log P(y) under the conditional model: P(y > k) = prod_{j <= k} sigmoid(z_j)
    s = torch.sigmoid(logits)
    cum = torch.cat(
        [torch.ones(7, 1, dtype=torch.float64), torch.cumprod(s, 1), torch.zeros(7, 1, dtype=torch.float64)], 1
    )
    p = cum[:, :-1] - cum[:, 1:]
    torch.testing.assert_close(want, -torch.log(p[torch.arange(7), labels]), rtol=1e-9, atol=1e-12)


def test_condor_gradient_at_zero_and_degenerate_batches() -> None:
    ref = _condor_ref().losses.condor_negloglikeloss
    levels = _levels(torch.tensor([0, 1, 3, 2]), 4)
    _assert_same(condor_loss, ref, torch.zeros(4, 3), levels)  # sigmoid(0) - level also at z = 0
    x = torch.zeros(0, 3, requires_grad=True)
    out = condor_loss(x, torch.zeros(0, 3))
    assert out.item() == 0.0 and out.requires_grad
    assert math.isnan(ref(x, torch.zeros(0, 3)).item())  # the reference's mean of an empty batch
    assert condor_loss(x, torch.zeros(0, 3), reduction="none").shape == (0,)
    for labels in (torch.tensor([1]), torch.zeros(5, dtype=torch.long), torch.full((5,), 3)):
        logits, _ = _data(1, labels.numel(), 4, torch.float64)
        _assert_same(condor_loss, ref, logits, _levels(labels, 4, torch.float64))


def test_condor_non_finite_in_a_masked_task_makes_the_row_nan() -> None:
    ref = _condor_ref().losses.condor_negloglikeloss
    logits, _ = _data(0, 3, 4, torch.float32)
    levels = _levels(torch.tensor([0, 3, 1]), 4)
    logits[0, 2] = math.nan  # example 0 (class 0) counts task 0 only
    assert torch.isfinite(ref(logits, levels, reduction=None)).all()
    out = condor_loss(logits, levels, reduction="none")
    assert math.isnan(out[0].item()) and torch.isfinite(out[1:]).all()
    torch.testing.assert_close(out[1:], ref(logits[1:], levels[1:], reduction=None))


def test_condor_half_precision_is_computed_in_float32() -> None:
    logits, labels = _data(6, 5, 4, torch.float32)
    levels = _levels(labels, 4)
    for half in (torch.float16, torch.bfloat16):
        out = condor_loss(logits.to(half), levels.to(half))
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, condor_loss(logits.to(half).float(), levels), rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# decoding
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
def test_predictions_equal_the_references(k: int, dtype: torch.dtype) -> None:
    coral = _coral_ref()
    condor = _condor_ref()
    for seed in SEEDS:
        logits, _ = _data(seed, 64, k, dtype, scale=3.0)
        logits[0] = 1e-9  # sigmoid rounds to 0.5: "not above 0.5", as the reference decides
        logits[1] = -1e-9
        logits[2, : (k - 1) // 2 + 1] = 30.0  # saturated probabilities
        want = coral.dataset.proba_to_label(torch.sigmoid(logits))
        got = coral_predict(logits)
        assert got.dtype == want.dtype == torch.int64 and torch.equal(got, want)
        got = corn_predict(logits)
        assert got.dtype == torch.int64 and torch.equal(got, coral.dataset.corn_label_from_logits(logits))
        got = condor_predict(logits)
        assert got.dtype == torch.int64 and torch.equal(got, condor.dataset.logits_to_label(logits))
        for fn in (coral_predict, corn_predict, condor_predict):
            assert ((fn(logits) >= 0) & (fn(logits) <= k - 1)).all()


def test_predictions_definitions() -> None:
    assert coral_predict(torch.tensor([[3.0, 2.0, -1.0]])).tolist() == [2]
    assert coral_predict(torch.tensor([[-3.0, 2.0, 1.0]])).tolist() == [2]  # counts, whatever the order
    # conditional: P(y > 1) = 0.95 * 0.6 > 0.5, P(y > 2) = 0.57 * 0.6 < 0.5
    z = torch.logit(torch.tensor([[0.95, 0.6, 0.6]]))
    assert corn_predict(z).tolist() == [2] and condor_predict(z).tolist() == [2]
    assert corn_predict(torch.tensor([[-3.0, 5.0, 5.0]])).tolist() == [0]  # stops at the first P(y > k) <= 0.5
    assert coral_predict(torch.zeros(0, 4)).shape == (0,)


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [coral_loss, condor_loss], ids=["coral", "condor"])
def test_level_losses_errors(fn: Any) -> None:
    logits, levels = torch.randn(4, 3), _levels(torch.tensor([0, 1, 2, 3]), 4)
    with pytest.raises(ValueError, match=r"`logits` and `levels` must have the same shape.*\(4, 2\).*\(4, 3\)"):
        fn(logits[:, :2], levels)  # logits of K-1 = 2 thresholds for levels of K = 4 classes
    with pytest.raises(ValueError, match=r"`logits` and `levels`.*\(4, 3\).*\(4, 4\)"):
        fn(logits, _levels(torch.tensor([0, 1, 2, 4]), 5))
    with pytest.raises(ValueError, match=r"`logits` and `levels`"):
        fn(logits, levels[:3])
    with pytest.raises(TypeError, match=r"`logits` must be a floating-point tensor"):
        fn(torch.ones(4, 3, dtype=torch.long), levels)
    with pytest.raises(TypeError, match=r"`levels` must be a real tensor"):
        fn(logits, levels.to(torch.complex64))
    with pytest.raises(TypeError, match=r"`levels` must be a torch.Tensor"):
        fn(logits, levels.tolist())
    with pytest.raises(ValueError, match=r"`logits` must have shape \(B, K-1\)"):
        fn(logits[0], levels[0])
    with pytest.raises(ValueError, match=r"`logits` must have K-1 >= 1 columns"):
        fn(torch.zeros(4, 0), torch.zeros(4, 0))
    with pytest.raises(ValueError, match=r"`levels` must be on the device of `logits` \(cpu\), got meta"):
        fn(logits, levels.to("meta"))
    with pytest.raises(ValueError, match=r"`reduction` must be one of"):
        fn(logits, levels, reduction="avg")
    assert torch.equal(fn(logits, levels.long()), fn(logits, levels))  # integer / bool levels are read as 0/1
    assert torch.equal(fn(logits, levels.bool()), fn(logits, levels))


def test_coral_importance_weights_errors() -> None:
    logits, levels = torch.randn(4, 3), _levels(torch.tensor([0, 1, 2, 3]), 4)
    with pytest.raises(ValueError, match=r"`importance_weights` must have shape \(K-1,\) = \(3,\).*got \(4,\)"):
        coral_loss(logits, levels, importance_weights=torch.ones(4))
    with pytest.raises(ValueError, match=r"`importance_weights`.*got \(2, 4, 3\)"):
        coral_loss(logits, levels, importance_weights=torch.ones(2, 4, 3))  # would change the shape
    with pytest.raises(TypeError, match=r"`importance_weights` must be a torch.Tensor"):
        coral_loss(logits, levels, importance_weights=[1.0, 1.0, 1.0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`importance_weights` must be on the device of `logits`"):
        coral_loss(logits, levels, importance_weights=torch.ones(3, device="meta"))


def test_corn_errors() -> None:
    logits, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"`logits` must have K-1 = 4 columns for num_classes=5.*\(4, 3\)"):
        corn_loss(logits, y, 5)
    with pytest.raises(ValueError, match=r"`targets` must hold class labels in \[0, 3\].*got 4 at index 3"):
        corn_loss(logits, torch.tensor([0, 1, 2, 4]), 4)  # the reference reads 4 as class 3
    with pytest.raises(ValueError, match=r"`targets` must hold class labels in \[0, 3\].*got -1 at index 0"):
        corn_loss(logits, torch.tensor([-1, 1, 2, 3]), 4)  # the reference drops it silently
    with pytest.raises(TypeError, match=r"`targets` must be an integer tensor.*float32"):
        corn_loss(logits, y.float(), 4)
    with pytest.raises(TypeError, match=r"`targets` must be a torch.Tensor"):
        corn_loss(logits, y.tolist(), 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`logits` must be a floating-point tensor"):
        corn_loss(logits.long(), y, 4)
    with pytest.raises(ValueError, match=r"`targets` must have shape \(B,\) = \(4,\).*\(3,\)"):
        corn_loss(logits, y[:3], 4)
    with pytest.raises(ValueError, match=r"`targets` must have shape \(B,\).*\(4, 1\)"):
        corn_loss(logits, y[:, None], 4)
    with pytest.raises(ValueError, match=r"`num_classes` must be >= 2"):
        corn_loss(logits, y, 1)
    with pytest.raises(TypeError, match=r"`num_classes` must be an int"):
        corn_loss(logits, y, "4")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`num_classes` must be an int"):
        CornLoss(4.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`targets` must be on the device of `logits` \(cpu\), got meta"):
        corn_loss(logits, y.to("meta"), 4)
    assert corn_loss(logits, y.to(torch.int32), 4).item() == pytest.approx(corn_loss(logits, y, 4).item())


def test_predict_errors() -> None:
    for fn in (coral_predict, corn_predict, condor_predict):
        with pytest.raises(TypeError, match=r"`logits` must be a floating-point tensor"):
            fn(torch.ones(2, 3, dtype=torch.long))
        with pytest.raises(ValueError, match=r"`logits` must have shape \(B, K-1\)"):
            fn(torch.ones(3))


# --------------------------------------------------------------------------------------------------
# module twins and registry entries
# --------------------------------------------------------------------------------------------------
def test_module_twins() -> None:
    ref = _coral_ref().losses
    logits, labels = _data(0, 6, 5, torch.float32)
    levels = _levels(labels, 5)
    w = torch.rand(4, generator=torch.Generator().manual_seed(0))
    for reduction in ("mean", "sum", None):
        torch.testing.assert_close(
            CoralLoss(reduction=reduction)(logits, levels, importance_weights=w),
            ref.CoralLoss(reduction=reduction)(logits, levels, importance_weights=w),
        )
        torch.testing.assert_close(
            CondorLoss(reduction=reduction)(logits, levels), condor_loss(logits, levels, reduction=reduction)
        )
    torch.testing.assert_close(CornLoss(5)(logits, labels), ref.CornLoss(5)(logits, labels))
    torch.testing.assert_close(CornLoss(num_classes=5)(logits=logits, targets=labels), corn_loss(logits, labels, 5))
    assert repr(CoralLoss()) == "CoralLoss(reduction='mean')"
    assert repr(CornLoss(num_classes=5)) == "CornLoss(num_classes=5)"
    assert repr(CondorLoss(reduction="sum")) == "CondorLoss(reduction='sum')"
    assert list(CoralLoss().state_dict()) == [] and list(CornLoss(3).state_dict()) == []
    with pytest.raises(ValueError, match=r"`reduction` must be one of"):
        CoralLoss(reduction="avg")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`reduction` must be one of"):
        CondorLoss(reduction=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`num_classes` must be >= 2"):
        CornLoss(num_classes=1)


def test_registry_entries() -> None:
    expected = {
        "coral": ({"logits": "logits", "levels": "levels"}, coral_loss, CoralLoss, coral_predict, "coral", False),
        "corn": ({"logits": "logits", "targets": "classes"}, corn_loss, CornLoss, corn_predict, "linear", True),
        "condor": ({"logits": "logits", "levels": "levels"}, condor_loss, CondorLoss, condor_predict, "linear", False),
    }
    for name, (inputs, fn, module, predict, layer, num_classes) in expected.items():
        entry = get_loss_entry(name)
        assert entry.fn is fn and entry.module is module and entry.inputs == inputs
        assert entry.gradient == "exact" and not entry.stochastic and entry.description
        head = entry.ordinal
        assert isinstance(head, OrdinalHead)
        assert head.outputs == "thresholds" and head.predict is predict and head.layer == layer
        assert head.num_classes is num_classes and head.num_outputs(6) == 5
    # how a recipe calls an entry: the twin with its options (num_classes by keyword), tensors by keyword
    logits, labels = _data(0, 5, 6, torch.float32)
    tensors = {"logits": logits, "classes": labels, "levels": levels_from_labels(labels, 6)}
    for name in expected:
        entry = get_loss_entry(name)
        assert entry.ordinal is not None and entry.inputs is not None
        module = entry.module(num_classes=6) if entry.ordinal.num_classes else entry.module()
        value = module(**{param: tensors[role] for param, role in entry.inputs.items()})
        assert value.shape == () and torch.isfinite(value)
        classes = entry.ordinal.predict(logits)
        assert classes.dtype == torch.int64 and classes.shape == (5,)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_levels_and_losses_without_host_sync() -> None:
    """On CUDA: the levels are made on the device, the losses (CONDOR too, whose reference builds a CPU
    column and fails there) equal the CPU ones, and nothing synchronizes with the host (the range check of
    the labels is a device-side assertion)."""
    logits, labels = _data(0, 32, 6, torch.float32)
    x, y = logits.cuda(), labels.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        lv = levels_from_labels(y, 6)
        out = [coral_loss(x, lv), corn_loss(x, y, 6), condor_loss(x, lv), coral_predict(x), corn_predict(x)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert lv.device.type == "cuda"
    want = [
        coral_loss(logits, _levels(labels, 6)),
        corn_loss(logits, labels, 6),
        condor_loss(logits, _levels(labels, 6)),
        coral_predict(logits),
        corn_predict(logits),
    ]
    for a, b in zip(out, want, strict=True):
        assert a.device.type == "cuda"
        torch.testing.assert_close(a.cpu(), b)
