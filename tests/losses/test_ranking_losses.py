"""Rank-based losses: RankSim, Spearman loss / correlation, pairwise (age-)difference loss.

Every loss is checked against a slow, obviously-correct implementation written from the paper's
formula (Python loops live only here), against scipy where it applies, with float64 gradcheck
where the gradient is exact, on degenerate batches and on bad inputs.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import rankwise
from rankwise.losses import (
    PairwiseDifferenceLoss,
    RankSimLoss,
    SpearmanCorrelation,
    SpearmanLoss,
    get_loss_entry,
    list_losses,
    list_spearman_rankers,
    pairwise_difference_loss,
    ranksim_loss,
    sample_unique_labels,
    spearman_correlation,
    spearman_loss,
)
from tests.conftest import gradcheck, tol
from tests.registry_examples import case_entry, factories

scipy_stats = pytest.importorskip("scipy.stats")


# --------------------------------------------------------------------------------------------------
# slow references (loops, written from the papers)
# --------------------------------------------------------------------------------------------------


def _slow_desc_ranks(v: torch.Tensor) -> torch.Tensor:
    """Ordinal descending ranks 1..n by counting; ties: lower index first."""
    n = v.numel()
    out = torch.empty(n, dtype=torch.float64)
    for j in range(n):
        out[j] = 1 + sum(1 for k in range(n) if v[k] > v[j] or (v[k] == v[j] and k < j))
    return out


def _slow_avg_desc_ranks(v: torch.Tensor) -> torch.Tensor:
    n = v.numel()
    out = torch.empty(n, dtype=torch.float64)
    for j in range(n):
        greater = sum(1 for k in range(n) if v[k] > v[j])
        equal = sum(1 for k in range(n) if v[k] == v[j])
        out[j] = greater + (equal + 1) / 2
    return out


class _PaperRanker(torch.autograd.Function):
    """RankSim eq. 6-7 for one row: normalized descending ranks, blackbox gradient."""

    @staticmethod
    def forward(ctx, a, lam):  # type: ignore[override]
        r = (_slow_desc_ranks(a.detach()) / a.numel()).to(a.dtype)
        ctx.save_for_backward(a, r)
        ctx.lam = lam
        return r

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        a, r = ctx.saved_tensors
        a_lam = a + ctx.lam * g
        r_lam = (_slow_desc_ranks(a_lam.detach()) / a.numel()).to(a.dtype)
        return -(r - r_lam) / ctx.lam, None


def _slow_ranksim(z: torch.Tensor, y: torch.Tensor, lam: float, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Paper eq. 4 on the subset ``keep`` (index order kept): sum over rows of the per-row MSE."""
    idx = [i for i in range(z.shape[0]) if keep is None or bool(keep[i])]
    zs, ys = z[idx].reshape(len(idx), -1), y[idx]
    loss = z.new_zeros(())
    for i in range(len(idx)):
        sim_row = torch.stack(
            [torch.nn.functional.cosine_similarity(zs[i], zs[j], dim=0, eps=1e-12) for j in range(len(idx))]
        )
        feat_ranks = _PaperRanker.apply(sim_row, lam)
        label_ranks = _slow_desc_ranks(-(ys[i] - ys).abs()).to(z.dtype) / len(idx)
        loss = loss + ((feat_ranks - label_ranks) ** 2).mean()
    return loss


def _slow_pairwise(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    b = pred.numel()
    total = pred.new_zeros(())
    for i, j in itertools.permutations(range(b), 2):
        total = total + ((pred[i] - pred[j]) - (target[i] - target[j])) ** 2
    return total / (b * (b - 1))


# --------------------------------------------------------------------------------------------------
# RankSim
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lam", [0.5, 2.0])
@pytest.mark.parametrize("labels", ["distinct", "repeated"])
def test_ranksim_matches_paper_loop_all_examples(lam: float, labels: str) -> None:
    g = torch.Generator().manual_seed(3)
    z = torch.randn(12, 3, 5, generator=g, dtype=torch.float64)  # flattened per example
    if labels == "distinct":
        y = torch.randperm(12, generator=g).double()
    else:
        y = torch.randint(0, 5, (12,), generator=g).double()
    z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
    fast = ranksim_loss(z1, y, interpolation_lambda=lam, unique_labels=False)
    slow = _slow_ranksim(z2, y, lam)
    torch.testing.assert_close(fast, slow)
    fast.backward()
    slow.backward()
    assert z1.grad is not None and z1.grad.abs().sum() > 0
    torch.testing.assert_close(z1.grad, z2.grad)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranksim_unique_labels_matches_paper_loop_on_the_same_subset(seed: int) -> None:
    g = torch.Generator().manual_seed(10 + seed)
    z = torch.randn(20, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 7, (20, 1), generator=g).double()  # many repeats, (B, 1) targets
    keep = sample_unique_labels(y, generator=torch.Generator().manual_seed(seed))
    assert int(keep.sum()) == len(torch.unique(y))
    z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
    fast = ranksim_loss(z1, y, generator=torch.Generator().manual_seed(seed))
    slow = _slow_ranksim(z2, y[:, 0], 2.0, keep)
    torch.testing.assert_close(fast, slow)
    fast.backward()
    slow.backward()
    torch.testing.assert_close(z1.grad, z2.grad)
    assert (z1.grad[~keep] == 0).all()  # examples outside the subset get no gradient


def _label_cases(g: torch.Generator, dtype: torch.dtype) -> list[torch.Tensor]:
    b = 23
    special = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 0.0], dtype=dtype)
    with_special = torch.randint(-3, 4, (b,), generator=g).to(dtype)
    with_special[torch.randint(0, b, (6,), generator=g)] = special[torch.randint(0, 5, (6,), generator=g)]
    return [
        torch.randint(0, 6, (b,), generator=g).to(dtype),  # repeats and mirrored pairs (ties)
        torch.randn(b, generator=g, dtype=dtype),
        1e6 + torch.rand(b, generator=g, dtype=dtype) * 1e-3,  # distinct labels whose float32 distances collide
        with_special,
        torch.full((b,), 2.5, dtype=dtype),
        torch.tensor([1e38, -1e38, 0.0, 3e38, -3e38], dtype=dtype),  # distances that overflow to inf
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ranksim_label_ranks_kernel_matches_sorting_every_row(dtype: torch.dtype) -> None:
    """The numba merge gives exactly the ranks of sorting -|y_i - y| per row (stable ties, NaN first,
    masked columns and infinite distances last in column order)."""
    from rankwise.losses import ranking

    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        for y in _label_cases(g, dtype):
            b = y.shape[0]
            keep = torch.rand(b, generator=g) < (1.0 if trial == 0 else 0.7)
            rows = torch.randint(0, b, (min(b, 7),), generator=g)
            fast = ranking._label_ranks(y[rows], y, keep)
            label_sim = torch.where(keep, -(y[rows, None] - y[None, :]).abs(), -math.inf)
            # the ordinal ranks of a stable descending sort (NaN first); rankwise.rank itself makes a
            # NaN row all NaN (docs/conventions.md), and ranksim_loss is NaN for NaN labels anyway
            order = torch.sort(label_sim, dim=-1, descending=True, stable=True).indices
            by_sort = torch.empty_like(label_sim).scatter_(
                -1, order, torch.arange(1, b + 1, dtype=label_sim.dtype).expand_as(order).contiguous()
            )
            torch.testing.assert_close(fast, by_sort, rtol=0, atol=0)
            if trial == 0:  # and the slow counting definition
                for r in range(rows.shape[0]):
                    want = _slow_desc_ranks(torch.nan_to_num(label_sim[r].double(), nan=math.inf))
                    torch.testing.assert_close(fast[r].double(), want, rtol=0, atol=0)
    assert ranking.kernels.FAMILY.loaded  # the kernel ran (numba is a core dependency)


def test_ranksim_gram_symmetric_backward_gradcheck() -> None:
    from rankwise.losses.ranking import _Gram

    x = torch.randn(5, 3, dtype=torch.float64)
    assert gradcheck(_Gram.apply, x)
    torch.testing.assert_close(_Gram.apply(x), x @ x.T)


def test_ranksim_unique_labels_without_repeats_equals_full_batch() -> None:
    g = torch.Generator().manual_seed(4)
    z = torch.randn(9, 4, generator=g)
    y = torch.arange(9.0)
    torch.testing.assert_close(ranksim_loss(z, y), ranksim_loss(z, y, unique_labels=False), rtol=0, atol=0)


def test_sample_unique_labels_one_per_label_uniform_and_reproducible() -> None:
    y = torch.tensor([5, 1, 5, 2, 5, 1, 9])
    masks = torch.stack([sample_unique_labels(y, generator=torch.Generator().manual_seed(s)) for s in range(300)])
    assert masks.dtype == torch.bool and masks.shape == (300, 7)
    for lab in (1, 2, 5, 9):
        assert (masks[:, y == lab].sum(1) == 1).all()
    counts = masks[:, y == 5].sum(0)  # three candidates for label 5: each about 100 of 300
    assert counts.min() > 60 and counts.max() < 140
    a = sample_unique_labels(y, generator=torch.Generator().manual_seed(7))
    b = sample_unique_labels(y, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    torch.manual_seed(0)
    c = sample_unique_labels(y)
    torch.manual_seed(0)
    assert torch.equal(c, sample_unique_labels(y))


def test_ranksim_module_generator_and_targets_shapes(device: torch.device) -> None:
    g = torch.Generator().manual_seed(5)
    z = torch.randn(16, 8, generator=g).to(device)
    y = torch.randint(0, 6, (16,), generator=g).to(device)
    a = ranksim_loss(z, y, generator=torch.Generator().manual_seed(1))
    b = ranksim_loss(z, y.float().unsqueeze(1), generator=torch.Generator().manual_seed(1))
    c = RankSimLoss(generator=torch.Generator().manual_seed(1))(z, y)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c)
    assert a.device.type == device.type and a.dtype == torch.float32


def test_ranksim_degenerate_batches_give_zero_with_graph() -> None:
    for z, y in [
        (torch.randn(0, 3), torch.zeros(0)),
        (torch.randn(1, 3), torch.ones(1)),
        (torch.randn(6, 3), torch.full((6, 1), 2.0)),  # a single distinct label
    ]:
        z.requires_grad_()
        loss = ranksim_loss(z, y)
        assert loss.requires_grad and loss.item() == 0.0
        loss.backward()
        assert z.grad is not None and torch.equal(z.grad, torch.zeros_like(z))


def test_ranksim_perfectly_ordered_features_give_zero() -> None:
    # 1-d "embeddings" on a half circle ordered like the labels: cosine similarity decreases with
    # label distance, so every row's feature ranking equals its label ranking (no equidistant labels)
    y = torch.tensor([0.0, 1.0, 3.0, 7.0, 15.0])
    angle = y * 0.1
    z = torch.stack([angle.cos(), angle.sin()], 1)
    assert ranksim_loss(z, y).item() == 0.0
    assert ranksim_loss(z.flip(0)[torch.tensor([2, 0, 4, 1, 3])], y).item() > 0


def test_ranksim_gradient_descent_reduces_the_loss() -> None:
    g = torch.Generator().manual_seed(6)
    z = torch.randn(24, 8, generator=g).requires_grad_()
    y = torch.randperm(24, generator=g).float()
    opt = torch.optim.SGD([z], lr=0.5)
    first = ranksim_loss(z, y, unique_labels=False).item()
    for _ in range(20):
        opt.zero_grad()
        ranksim_loss(z, y, unique_labels=False).backward()
        opt.step()
    assert ranksim_loss(z, y, unique_labels=False).item() < 0.75 * first


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_ranksim_half_inputs_computed_in_float32(half: torch.dtype) -> None:
    g = torch.Generator().manual_seed(8)
    z = torch.randn(10, 16, generator=g).to(half).requires_grad_()
    y = torch.arange(10.0)
    loss = ranksim_loss(z, y)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ranksim_loss(z.detach().float(), y))
    loss.backward()
    assert z.grad is not None and z.grad.dtype == half and torch.isfinite(z.grad.float()).all()


def test_ranksim_errors() -> None:
    z = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"`interpolation_lambda` must be finite and > 0, got 0"):
        ranksim_loss(z, torch.arange(4.0), interpolation_lambda=0)
    with pytest.raises(ValueError, match=r"`interpolation_lambda` must be finite and > 0"):
        RankSimLoss(interpolation_lambda=-1.0)
    with pytest.raises(ValueError, match=r"`targets` must have shape \(4,\) or \(4, 1\).*got shape \(5,\)"):
        ranksim_loss(z, torch.arange(5.0))
    with pytest.raises(ValueError, match=r"`targets` must have shape .*got shape \(4, 2\)"):
        ranksim_loss(z, torch.zeros(4, 2))
    with pytest.raises(TypeError, match=r"`features` must be a floating-point tensor"):
        ranksim_loss(torch.ones(4, 3, dtype=torch.long), torch.arange(4.0))
    with pytest.raises(ValueError, match=r"`targets` must have shape \(B,\) or \(B, 1\), got a 0-d tensor"):
        sample_unique_labels(torch.tensor(1.0))
    with pytest.raises(TypeError, match=r"`targets` must be a torch.Tensor, got list"):
        ranksim_loss(z, [0, 1, 2, 3])  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Spearman loss / correlation
# --------------------------------------------------------------------------------------------------

#: (ranker, options) giving soft ranks close to the exact ranks for the test inputs
SHARP = [
    ("isotonic", {"regularization_strength": 1e-3}),
    ("neuralsort", {"tau": 1e-3}),
    ("softsort", {"tau": 1e-3}),
    ("blackbox", {"lambda_val": 2.0}),
]
SMOOTH = [
    ("isotonic", {"regularization_strength": 0.5}),
    ("neuralsort", {"tau": 1.0}),
    ("softsort", {"tau": 1.0}),
]


def _slow_spearman_loss(pred: torch.Tensor, target: torch.Tensor, l1_weight: float) -> float:
    n = pred.numel()
    rp = _slow_desc_ranks(pred) / n
    rt = _slow_avg_desc_ranks(target) / n
    mse = sum((float(rp[j]) - float(rt[j])) ** 2 for j in range(n)) / n
    l1 = sum(abs(float(pred[j]) - float(target[j])) for j in range(n)) / n
    return mse + l1_weight * l1


@pytest.mark.parametrize(("ranker", "opts"), SHARP, ids=[r for r, _ in SHARP])
@pytest.mark.parametrize("l1_weight", [0.0, 0.7])
def test_spearman_loss_matches_slow_reference_for_sharp_rankers(ranker: str, opts: dict, l1_weight: float) -> None:
    g = torch.Generator().manual_seed(11)
    pred = torch.randn(15, generator=g, dtype=torch.float64)
    target = torch.randint(0, 6, (15,), generator=g).double()  # ties: average ranks
    got = spearman_loss(pred, target, ranker=ranker, l1_weight=l1_weight, **opts)
    assert got.item() == pytest.approx(_slow_spearman_loss(pred, target, l1_weight), rel=1e-4, abs=1e-6)


def test_spearman_loss_relation_to_rho() -> None:
    # for distinct values: mse = (1 - rho) (n^2 - 1) / (6 n^2)
    g = torch.Generator().manual_seed(12)
    pred, target = torch.randn(30, generator=g, dtype=torch.float64), torch.randn(30, generator=g, dtype=torch.float64)
    n = 30
    rho = scipy_stats.spearmanr(pred.numpy(), target.numpy())[0]
    got = spearman_loss(pred, target, ranker="blackbox").item()
    assert got == pytest.approx((1 - rho) * (n * n - 1) / (6 * n * n), rel=1e-10)


@pytest.mark.parametrize(("ranker", "opts"), SHARP, ids=[r for r, _ in SHARP])
def test_spearman_correlation_matches_scipy(ranker: str, opts: dict, device: torch.device) -> None:
    g = torch.Generator().manual_seed(13)
    pred = torch.randn(3, 20, generator=g, dtype=torch.float64)
    target = torch.randint(0, 8, (3, 20), generator=g).double()
    got = spearman_correlation(pred.to(device), target.to(device), ranker=ranker, **opts).cpu()
    expected = [scipy_stats.spearmanr(p, t)[0] for p, t in zip(pred.numpy(), target.numpy())]
    assert got.shape == (3,)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-6)
    assert SpearmanCorrelation(ranker=ranker, **opts)(pred[0], target[0]).item() == pytest.approx(expected[0], rel=1e-4)


def test_spearman_shapes_leading_dims_and_module() -> None:
    g = torch.Generator().manual_seed(14)
    pred, target = torch.randn(4, 9, generator=g), torch.randn(4, 9, generator=g)
    rows = torch.stack([spearman_loss(p, t, ranker="blackbox", l1_weight=0.3) for p, t in zip(pred, target)])
    torch.testing.assert_close(spearman_loss(pred, target, ranker="blackbox", l1_weight=0.3), rows.mean())
    col = spearman_loss(pred[0].unsqueeze(1), target[0], ranker="blackbox")  # (B, 1) vs (B,)
    torch.testing.assert_close(col, spearman_loss(pred[0], target[0], ranker="blackbox"))
    module = SpearmanLoss(ranker="blackbox", l1_weight=0.3, lambda_val=2.0)
    torch.testing.assert_close(module(pred, target), spearman_loss(pred, target, ranker="blackbox", l1_weight=0.3))
    assert "blackbox" in repr(module)


@pytest.mark.parametrize(("ranker", "opts"), SMOOTH, ids=[r for r, _ in SMOOTH])
def test_spearman_gradcheck_float64(ranker: str, opts: dict) -> None:
    g = torch.Generator().manual_seed(15)
    pred, target = torch.randn(2, 7, generator=g), torch.randn(2, 7, generator=g)
    assert gradcheck(lambda p: spearman_loss(p, target.double(), ranker=ranker, l1_weight=0.2, **opts), pred)
    assert gradcheck(lambda p: spearman_correlation(p, target.double(), ranker=ranker, **opts), pred)


def test_spearman_blackbox_gradient_direction_improves_correlation() -> None:
    g = torch.Generator().manual_seed(16)
    target = torch.randn(32, generator=g)
    pred = torch.randn(32, generator=g).requires_grad_()
    opt = torch.optim.SGD([pred], lr=10.0)
    rho0 = spearman_correlation(pred, target, ranker="blackbox").item()
    for _ in range(30):
        opt.zero_grad()
        # dL/drank is O(1/n^2) with the MSE mean, so the interpolation strength must be large
        spearman_loss(pred, target, ranker="blackbox", lambda_val=100.0).backward()
        opt.step()
    assert spearman_correlation(pred, target, ranker="blackbox").item() > rho0 + 0.4


@pytest.mark.parametrize("ranker", ["isotonic", "blackbox"])
def test_spearman_degenerate_inputs(ranker: str) -> None:
    for pred, target in [
        (torch.zeros(0), torch.zeros(0)),
        (torch.ones(1), torch.ones(1)),
        (torch.ones(1, 1), torch.ones(1, 1)),
    ]:
        pred.requires_grad_()
        loss = spearman_loss(pred, target, ranker=ranker, l1_weight=1.0)
        assert loss.requires_grad and loss.item() == 0.0
        corr = spearman_correlation(pred, target, ranker=ranker)
        assert corr.requires_grad and corr.item() == 0.0
        (loss + corr).backward()
        assert pred.grad is not None and torch.isfinite(pred.grad).all()
    # constant target (scipy gives nan): correlation 0 with a finite gradient
    pred = torch.randn(6).requires_grad_()
    corr = spearman_correlation(pred, torch.full((6,), 3.0), ranker=ranker)
    assert corr.item() == 0.0
    corr.backward()
    assert pred.grad is not None and torch.isfinite(pred.grad).all()


def test_spearman_half_inputs_computed_in_float32() -> None:
    pred = torch.randn(12).to(torch.float16).requires_grad_()
    target = torch.randn(12).to(torch.float16)
    loss = spearman_loss(pred, target, ranker="blackbox", l1_weight=0.5)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(
        loss, spearman_loss(pred.detach().float(), target.float(), ranker="blackbox", l1_weight=0.5)
    )
    loss.backward()
    assert pred.grad is not None and pred.grad.dtype == torch.float16


def test_spearman_errors() -> None:
    p, t = torch.randn(5), torch.randn(5)
    with pytest.raises(ValueError, match=r"`ranker` must be one of .*'blackbox'.*; got 'nope'"):
        spearman_loss(p, t, ranker="nope")
    with pytest.raises(ValueError, match=r"`ranker` must be one of .*'blackbox'"):
        SpearmanLoss(ranker="nope")
    with pytest.raises(ValueError, match=r"`ranker` must be one of"):
        spearman_correlation(p, t, ranker="nope")
    with pytest.raises(ValueError, match=r"`pred` and `target` must have the same shape .*got \(5,\) and \(6,\)"):
        spearman_loss(p, torch.randn(6), ranker="blackbox")
    with pytest.raises(ValueError, match=r"`lambda_val` must be finite and > 0, got 0"):
        spearman_loss(p, t, ranker="blackbox", lambda_val=0)
    with pytest.raises(TypeError, match=r"ranker 'blackbox' accepts only the option `lambda_val`, got tau"):
        spearman_loss(p, t, ranker="blackbox", tau=1.0)
    with pytest.raises(ValueError, match=r"`l1_weight` must be finite and >= 0, got -1"):
        spearman_loss(p, t, ranker="blackbox", l1_weight=-1)
    with pytest.raises(TypeError, match=r"`pred` must be a floating-point tensor"):
        spearman_loss(torch.arange(5), t, ranker="blackbox")
    with pytest.raises(ValueError, match=r"`pred` must have shape .*got a 0-d tensor"):
        spearman_loss(torch.tensor(1.0), torch.tensor(1.0), ranker="blackbox")


def test_spearman_isotonic_matches_torchsort() -> None:
    torchsort = pytest.importorskip("torchsort")
    g = torch.Generator().manual_seed(17)
    pred, target = torch.randn(3, 16, generator=g), torch.randn(3, 16, generator=g)
    n = pred.shape[-1]
    soft = (n + 1 - torchsort.soft_rank(pred, regularization_strength=0.3)) / n  # descending, / n
    expected = ((soft - rankwise.rank(target, descending=True, ties="average", normalize=True)) ** 2).mean()
    got = spearman_loss(pred, target, ranker="isotonic", regularization_strength=0.3)
    torch.testing.assert_close(got, expected, **tol(torch.float32))


# --------------------------------------------------------------------------------------------------
# Pairwise difference loss
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("b", [2, 3, 7, 16])
def test_pairwise_difference_matches_pair_loop(b: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(b)
    pred = (torch.randn(b, generator=g) * 10 + 40).to(dtype)
    target = (torch.randn(b, generator=g) * 10 + 40).to(dtype)
    p1, p2 = pred.clone().requires_grad_(), pred.clone().requires_grad_()
    fast = pairwise_difference_loss(p1, target)
    slow = _slow_pairwise(p2, target)
    torch.testing.assert_close(fast, slow, **tol(dtype))
    fast.backward()
    slow.backward()
    torch.testing.assert_close(p1.grad, p2.grad, **tol(dtype))
    r = (pred - target).double()
    assert fast.item() == pytest.approx(2 * r.var(unbiased=True).item(), rel=1e-4)


def test_pairwise_difference_shapes_offset_and_module() -> None:
    g = torch.Generator().manual_seed(18)
    pred, target = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)
    rows = torch.stack([_slow_pairwise(p, t) for p, t in zip(pred, target)])
    torch.testing.assert_close(pairwise_difference_loss(pred, target), rows.mean())
    torch.testing.assert_close(pairwise_difference_loss(pred[0].unsqueeze(1), target[0]), rows[0])
    torch.testing.assert_close(pairwise_difference_loss(pred + 5.0, target), pairwise_difference_loss(pred, target))
    torch.testing.assert_close(PairwiseDifferenceLoss()(pred, target), pairwise_difference_loss(pred, target))
    assert pairwise_difference_loss(target, target).item() == 0.0


def test_pairwise_difference_gradcheck_and_degenerate() -> None:
    g = torch.Generator().manual_seed(19)
    target = torch.randn(2, 5, generator=g, dtype=torch.float64).requires_grad_()
    assert gradcheck(pairwise_difference_loss, torch.randn(2, 5, generator=g), target)
    for pred in [torch.zeros(0), torch.ones(1), torch.ones(1, 1), torch.zeros(0, 4)]:
        pred.requires_grad_()
        loss = pairwise_difference_loss(pred, torch.zeros_like(pred))
        assert loss.requires_grad and loss.item() == 0.0
        loss.backward()
        assert pred.grad is not None and torch.isfinite(pred.grad).all()


def test_pairwise_difference_half_and_errors() -> None:
    pred = torch.randn(8).to(torch.bfloat16)
    loss = pairwise_difference_loss(pred, torch.zeros(8, dtype=torch.bfloat16))
    assert loss.dtype == torch.float32
    with pytest.raises(ValueError, match=r"`pred` and `target` must have the same shape .*got \(4,\) and \(4, 2\)"):
        pairwise_difference_loss(torch.randn(4), torch.randn(4, 2))
    with pytest.raises(TypeError, match=r"`target` must be a torch.Tensor, got float"):
        pairwise_difference_loss(torch.randn(4), 1.0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------------


def test_registered_losses() -> None:
    names = set(list_losses())
    assert {
        "ranksim",
        "pairwise_difference",
        "spearman",
        "spearman_correlation",
    } <= names
    entry = get_loss_entry("ranksim")
    assert entry.gradient == "surrogate" and entry.stochastic and entry.module is RankSimLoss
    assert case_entry("loss", "spearman.blackbox").gradient == "surrogate"  # spearman_loss(..., ranker="blackbox")
    assert case_entry("loss", "spearman.isotonic").gradient == "exact"
    assert get_loss_entry("pairwise_difference").module is PairwiseDifferenceLoss
    assert {"blackbox", *rankwise.list_soft_methods()} == set(list_spearman_rankers())
    # the registered examples run through function and module alike
    for name in ("ranksim", "spearman.blackbox", "pairwise_difference"):
        e = case_entry("loss", name)
        f = factories("loss", name)
        assert e.module is not None and f.degenerate is not None
        ex = f.example(torch.float64, torch.device("cpu"))
        torch.manual_seed(0)
        a = e.fn(*ex.args, **ex.kwargs)
        torch.manual_seed(0)
        torch.testing.assert_close(a, e.module(**ex.kwargs)(*ex.args))
        for d in f.degenerate(torch.float32, torch.device("cpu")):
            out = e.fn(*d.args, **d.kwargs)
            assert torch.isfinite(out).all() and out.requires_grad


def test_spearman_sodeep_fallback_ranks_the_lengths_without_a_bundled_sorter() -> None:
    from rankwise.losses import SpearmanLoss, spearman_loss

    pred = torch.linspace(0, 50, 25).flip(0).requires_grad_(True)
    target = torch.arange(25.0)
    with pytest.raises(ValueError, match="n=25"):
        spearman_loss(pred, target, ranker="sodeep")
    got = spearman_loss(pred, target, ranker="sodeep", fallback="isotonic")
    assert torch.allclose(got, spearman_loss(pred, target, ranker="isotonic"))
    got.backward()
    assert pred.grad is not None and torch.isfinite(pred.grad).all()
    p32, t32 = torch.randn(32), torch.randn(32)  # a bundled length keeps the sorter
    assert torch.allclose(
        SpearmanLoss(ranker="sodeep", fallback="isotonic")(p32, t32), spearman_loss(p32, t32, ranker="sodeep")
    )
    with pytest.raises(ValueError, match="`fallback` must be None or a ranker of every length"):
        SpearmanLoss(ranker="sodeep", fallback="sodeep")
