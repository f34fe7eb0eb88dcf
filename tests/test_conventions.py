"""The conventions of docs/conventions.md (NaN/inf, half precision, ties), as tests.

* half-precision inputs give exact (float32) ranks everywhere a rank is materialized;
* two tensors are promoted to a common compute dtype, never cast to the first one's;
* NaN in -> NaN out (``rank``: ``scipy.stats.rankdata(nan_policy="propagate")``);
* a tensor on another device raises ``ValueError`` naming both arguments.
"""

from __future__ import annotations

import math

import pytest
import torch

import rankwise
from rankwise import losses

NAN = math.nan


# --------------------------------------------------------------------------------------------------
# item 2: ranks of fp16/bf16 inputs are exact float32
# --------------------------------------------------------------------------------------------------
def _distinct(dtype: torch.dtype, n: int) -> torch.Tensor:
    """``n`` distinct values of ``dtype`` in random order."""
    vals = torch.randn(20 * n, generator=torch.Generator().manual_seed(0)).to(dtype).unique()
    assert vals.numel() >= n
    return vals[torch.randperm(vals.numel(), generator=torch.Generator().manual_seed(1))[:n]]


def test_rank_of_half_input_is_exact_float32() -> None:
    r = rankwise.rank(torch.arange(2049.0).half())
    assert r.dtype == torch.float32 and r[-2:].tolist() == [2048.0, 2049.0]  # was [2048, 2048] in fp16
    xb = _distinct(torch.bfloat16, 300)
    r = rankwise.rank(xb, descending=True)
    assert r.dtype == torch.float32 and r.max().item() == 300.0  # bf16 holds integers exactly only to 256
    assert torch.equal(r.sort().values, torch.arange(1, 301, dtype=torch.float32))
    assert torch.equal(r, rankwise.rank(xb.float(), descending=True))
    x = torch.arange(2049.0).half().requires_grad_()
    b = rankwise.blackbox_rank(x, 2.0)
    assert b.dtype == torch.float32 and b[-1].item() == 2049.0
    b.sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float16


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("method", "kw"),
    [
        ("isotonic", {"regularization_strength": 1e-3}),
        ("isotonic", {"regularization": "kl", "regularization_strength": 1e-3}),
        ("neuralsort", {"tau": 1e-3}),
        ("softsort", {"tau": 1e-3}),
    ],
)
def test_soft_ranks_of_half_input_are_float32(half: torch.dtype, method: str, kw: dict) -> None:
    n = 2049 if method == "isotonic" else 300  # the permutation-matrix methods are O(n^2)
    x = _distinct(half, n)
    gap = float(x.float().sort().values.diff().min())
    kw = {k: (v * gap if k in ("tau", "regularization_strength") else v) for k, v in kw.items()}
    r = rankwise.soft_rank(x, method=method, **kw)
    assert r.dtype == torch.float32
    exact = rankwise.rank(x)
    assert exact.dtype == torch.float32
    torch.testing.assert_close(r, exact, rtol=0, atol=1e-2)
    # soft sorts hold values of x: they keep its dtype
    assert rankwise.soft_sort(x[:50], method=method, **kw).dtype == half


def test_sodeep_ranks_of_half_input_are_float32() -> None:
    x = torch.randn(2, 32).half()
    assert rankwise.soft_rank(x, method="sodeep").dtype == torch.float32


def test_losses_rank_half_inputs_in_float32() -> None:
    """Spearman's soft and target ranks of fp16 inputs beyond 2048 stay exact (computed in float32)."""
    n = 3000
    pred = torch.randperm(n, generator=torch.Generator().manual_seed(1)).half()
    target = pred.clone()
    rho = losses.spearman_correlation(pred, target, ranker="isotonic", regularization_strength=1e-3)
    assert rho.dtype == torch.float32 and rho.item() > 1 - 1e-6
    assert losses.spearman_loss(pred, target, ranker="isotonic", regularization_strength=1e-3).item() < 1e-9


# --------------------------------------------------------------------------------------------------
# item 3: a common compute dtype for two tensors
# --------------------------------------------------------------------------------------------------
def test_spearman_correlation_promotes_the_target() -> None:
    """float32 pred, float64 target [1, 1+1e-9, 1+2e-9, 0.5]: 0.775 before (target cast to float32), scipy 1.0."""
    scipy_stats = pytest.importorskip("scipy.stats")
    pred = torch.tensor([1.0, 2.0, 3.0, 0.0], dtype=torch.float32)
    target = torch.tensor([1.0, 1 + 1e-9, 1 + 2e-9, 0.5], dtype=torch.float64)
    want = scipy_stats.spearmanr(pred.numpy(), target.numpy()).statistic
    assert want == pytest.approx(1.0)
    rho = losses.spearman_correlation(pred, target, ranker="isotonic", regularization_strength=1e-3)
    assert rho.dtype == torch.float64
    assert rho.item() == pytest.approx(want, abs=1e-9)
    loss = losses.spearman_loss(pred, target, ranker="isotonic", regularization_strength=1e-3)
    assert loss.item() == pytest.approx(0.0, abs=1e-12)
    # the arithmetic terms also see the float64 target
    p32 = torch.tensor([0.0, 0.0], dtype=torch.float32)
    t64 = torch.tensor([1e-9, 0.0], dtype=torch.float64)
    d = losses.pairwise_difference_loss(p32, t64)
    assert d.dtype == torch.float64 and d.item() == pytest.approx(2e-18, rel=1e-6)
    l1 = losses.spearman_loss(p32, t64, ranker="blackbox", l1_weight=1.0)
    assert l1.dtype == torch.float64


def test_integer_labels_are_not_rounded_to_float32() -> None:
    """Integer targets above 2**24 stay distinct (ranked exactly / as float64 distances)."""
    big = torch.tensor([2**24, 2**24 + 1, 2**24 + 2, 0])
    pred = torch.tensor([1.0, 2.0, 3.0, 0.0])
    rho = losses.spearman_correlation(pred, big, ranker="isotonic", regularization_strength=1e-3)
    assert rho.item() == pytest.approx(1.0, abs=1e-6)
    # RankSim's label ranks: distances 1 and 2 from 2**24 + 1 are different (not tied in float32)
    z = torch.eye(4)
    a = losses.ranksim_loss(z, big, unique_labels=False)
    b = losses.ranksim_loss(z, big.double(), unique_labels=False)
    torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------------------------------
# item 4: NaN policy
# --------------------------------------------------------------------------------------------------
def test_rank_follows_scipy_nan_propagate() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    x = torch.tensor([[NAN, NAN, NAN], [3.0, NAN, 1.0], [2.0, -math.inf, math.inf], [1.0, 1.0, 0.0]])
    for ties in ("average", "min", "max", "dense", "ordinal"):
        for descending in (False, True):
            got = rankwise.rank(x, ties=ties, descending=descending)
            for row, g in zip(x, got):
                v = -row.numpy() if descending else row.numpy()
                want = scipy_stats.rankdata(v, method=ties, nan_policy="propagate")
                torch.testing.assert_close(g, torch.as_tensor(want, dtype=g.dtype), equal_nan=True)
    # before: all-NaN average gave [1, 2, 3]; NaN shifted dense ranks; NaN was rank 1 descending
    assert torch.isnan(rankwise.rank(x[0], ties="average")).all()
    assert rankwise.rank(torch.tensor([2.0, 1.0]), ties="dense").tolist() == [2.0, 1.0]


def test_losses_with_nan_labels_are_nan() -> None:
    """ranksim 1.154 -> 1.292 with y[0]=nan before (F.l1_loss gives nan); now NaN everywhere."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(8, 4, generator=g, requires_grad=True)
    y = torch.arange(8.0)
    y_nan = y.clone()
    y_nan[0] = NAN
    torch.manual_seed(0)
    assert torch.isfinite(losses.ranksim_loss(z, y))
    cases = {
        "ranksim": lambda t: losses.ranksim_loss(z, t),
        "rnc": lambda t: losses.rnc_loss(z, t),
        "conr": lambda t: losses.conr_loss(z, t, y + 0.5),
        "conr preds": lambda t: losses.conr_loss(z, y, t),
        "spearman_correlation": lambda t: losses.spearman_correlation(z[:, 0], t),
        "spearman": lambda t: losses.spearman_loss(z[:, 0], t),
        "pairwise_difference": lambda t: losses.pairwise_difference_loss(z[:, 0], t),
        "supcon": lambda t: losses.supcon_loss(z, t),
        "triplet": lambda t: losses.triplet_loss(z, t),
        "regression": lambda t: rankwise.losses.regression_loss(z[:, 0], t),
    }
    for name, fn in cases.items():
        assert torch.isfinite(fn(y)).all(), name
        out = fn(y_nan)
        assert torch.isnan(out).all(), name
        out.sum().backward()  # a NaN loss still has a backward (its gradient is unspecified)


def test_nan_features_make_batch_losses_nan_even_when_masked_out() -> None:
    """An example RankSim's unique-label subset leaves out, or an anchor without positives, still poisons."""
    z = torch.randn(4, 3)
    z[1, 0] = NAN
    y = torch.tensor([0.0, 0.0, 0.0, 0.0])  # one label: the subset keeps one example
    assert torch.isnan(losses.ranksim_loss(z, y))
    assert torch.isnan(losses.triplet_loss(z[1:2], None))  # n = 1: no positive
    assert torch.isnan(losses.supcon_loss(torch.full((1, 1, 3), NAN)))


def test_regression_loss_propagates_elementwise_like_torch() -> None:
    import torch.nn.functional as F

    p = torch.tensor([1.0, 2.0, 3.0])
    t = torch.tensor([1.5, NAN, 2.0])
    none = rankwise.losses.regression_loss(p, t, reduction="none")
    torch.testing.assert_close(none, F.l1_loss(p, t, reduction="none"), equal_nan=True)
    assert torch.isnan(rankwise.losses.regression_loss(p, t))


def test_soft_ops_give_nan_rows_for_non_finite_inputs() -> None:
    """soft_sort(kl) of [0.3, -inf, 2, 1] gave finite [2.29, 0.29, -1.71, -3.71]; a row with NaN/inf is NaN."""
    x = torch.tensor([[0.3, -math.inf, 2.0, 1.0], [0.3, 0.1, 2.0, 1.0]])
    for reg in ("l2", "kl"):
        for fn in (rankwise.soft_sort, rankwise.soft_rank):
            y = fn(x, method="isotonic", regularization=reg)
            assert torch.isnan(y[0]).all() and torch.isfinite(y[1]).all(), (reg, fn.__name__)
            torch.testing.assert_close(y[1], fn(x[1:], method="isotonic", regularization=reg)[0])
    p = rankwise.neural_sort(torch.tensor([[1.0, NAN, 0.0], [1.0, 2.0, 0.0]]))
    assert torch.isnan(p[0]).all() and torch.isfinite(p[1]).all()
    m = rankwise.soft_topk(torch.tensor([[1.0, math.inf, 0.0], [1.0, 2.0, 0.0]]), 2)
    assert torch.isnan(m[0]).all() and torch.isfinite(m[1]).all()
    q = torch.tensor([[0.0, 0.0], [NAN, 1.0]])
    nb = torch.tensor([[0.1, 0.0], [4.0, 5.0], [0.0, -0.3]])
    d = rankwise.dknn(q, nb, 2)
    assert torch.isfinite(d[0]).all() and torch.isnan(d[1]).all()  # a NaN query: its row
    nb[1, 0] = math.inf
    assert torch.isnan(rankwise.dknn(q[:1], nb, 2)).all()  # a non-finite neighbour: every row


# --------------------------------------------------------------------------------------------------
# item 8: device mismatches name the arguments
# --------------------------------------------------------------------------------------------------
def _meta_cases() -> list[tuple[str, object]]:
    cpu = torch.randn(6, 2, 4)
    y = torch.tensor([0.0, 1.0, 2.0, 0.0, 1.0, 2.0])
    meta = torch.device("meta")
    q, nb = torch.randn(2, 3), torch.randn(4, 3, device=meta)
    lab = torch.zeros(3, dtype=torch.long, device=meta)
    return [
        ("dknn", lambda: rankwise.dknn(q, nb, 2)),
        ("dknn.stochastic", lambda: rankwise.dknn(q, nb, 2, method="stochastic")),
        ("dknn_class_scores", lambda: rankwise.dknn_class_scores(torch.rand(2, 3), lab, 2)),
        ("ranksim", lambda: losses.ranksim_loss(cpu, y.to(meta))),
        ("spearman.isotonic", lambda: losses.spearman_loss(y, y.to(meta))),
        ("spearman.neuralsort", lambda: losses.spearman_loss(y, y.to(meta), ranker="neuralsort")),
        ("spearman.softsort", lambda: losses.spearman_loss(y, y.to(meta), ranker="softsort")),
        ("spearman.blackbox", lambda: losses.spearman_loss(y, y.to(meta), ranker="blackbox")),
        ("spearman_correlation", lambda: losses.spearman_correlation(y, y.to(meta))),
        ("pairwise_difference", lambda: losses.pairwise_difference_loss(y, y.to(meta))),
        ("supcon", lambda: losses.supcon_loss(cpu, y.long().to(meta))),
        ("triplet", lambda: losses.triplet_loss(cpu, y.long().to(meta))),
        ("npairs", lambda: losses.npairs_loss(cpu, y.long().to(meta))),
        ("rnc", lambda: losses.rnc_loss(cpu, y.to(meta))),
        ("conr", lambda: losses.conr_loss(cpu, y, y.to(meta))),
    ]


@pytest.mark.parametrize(("name", "call"), _meta_cases(), ids=[n for n, _ in _meta_cases()])
def test_device_mismatch_names_the_arguments(name: str, call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"`\w+` must be on the device of `\w+` \(cpu\), got meta"):
        call()
