"""Learning-to-rank losses against allRank 1.4.3 (values and gradients on random padded batches with
and without ties), allRank's own loss-test cases through a shim, and the degenerate conventions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from scipy.special import softmax

from rankwise.losses import (
    LambdaLoss,
    ListNetLoss,
    approx_ndcg_loss,
    get_loss,
    lambda_loss,
    listmle_loss,
    listnet_loss,
    neural_ndcg_loss,
    pirank_ndcg_loss,
    ranknet_loss,
)
from rankwise.metrics import ndcg
from tests.losses._allrank import load

PAD = -1.0


def _batch(seed: int, bsz: int, n: int, *, ties: bool, end_padding: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores and graded labels 0..4 with padding (at the end of each list, or anywhere); every list
    keeps at least two real items; with ``ties`` the scores are rounded so that some are equal."""
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(bsz, n, generator=g)
    if ties:
        pred = (pred * 2).round() / 2
    true = torch.randint(0, 5, (bsz, n), generator=g).float()
    if end_padding:
        lengths = torch.randint(2, n + 1, (bsz,), generator=g)
        pad = torch.arange(n)[None, :] >= lengths[:, None]
    else:
        pad = torch.rand(bsz, n, generator=g) < 0.3
        pad[:, :2] = False
    return pred, true.masked_fill(pad, PAD)


def _value_and_grad(
    fn: Any, pred: torch.Tensor, true: torch.Tensor, seed: int | None = None
) -> tuple[float, torch.Tensor]:
    x = pred.clone().requires_grad_()
    if seed is not None:
        torch.manual_seed(seed)
    out = fn(x, true.clone())
    out.backward()
    assert x.grad is not None
    return float(out), x.grad.clone()


CASES = [(seed, ties) for seed in range(6) for ties in (False, True)]


def _compare(
    ours: Any,
    theirs: Any,
    *,
    end_padding: bool = False,
    same_length: bool = False,
    seeded: bool = False,
    grad_at_ties: bool = True,
    atol: float = 2e-5,
) -> None:
    for seed, ties in CASES:
        pred, true = _batch(seed, 5, 9, ties=ties, end_padding=end_padding)
        if same_length:
            true[:, 6:] = PAD
            true[:, :6] = true[:, :6].clamp(min=0.0)
        v1, g1 = _value_and_grad(ours, pred, true, seed if seeded else None)
        v2, g2 = _value_and_grad(theirs, pred, true, seed if seeded else None)
        assert math.isfinite(v1)
        assert v1 == pytest.approx(v2, rel=1e-5, abs=atol), (seed, ties)
        if grad_at_ties or not ties:
            torch.testing.assert_close(g1, g2, rtol=1e-4, atol=atol)


def test_listnet_matches_allrank() -> None:
    al, _ = load()
    _compare(listnet_loss, al.listNet)
    # eps = 0: allRank's padded slots give 0 * log(0) = NaN, so only unpadded lists are compared
    for seed, ties in CASES:
        pred, true = _batch(seed, 5, 9, ties=ties, end_padding=False)
        true = true.clamp(min=0.0)
        v1, g1 = _value_and_grad(lambda p, t: listnet_loss(p, t, eps=0.0), pred, true)
        v2, g2 = _value_and_grad(lambda p, t: al.listNet(p, t, eps=0.0), pred, true)
        assert v1 == pytest.approx(v2, rel=1e-5)
        torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-6)


def test_listmle_matches_allrank_with_the_same_shuffle() -> None:
    al, _ = load()
    _compare(listmle_loss, al.listMLE, seeded=True)


@pytest.mark.parametrize("weights", [{}, {"weight_by_diff": True}, {"weight_by_diff_powed": True}])
def test_ranknet_matches_allrank(weights: dict[str, bool]) -> None:
    al, _ = load()
    _compare(lambda p, t: ranknet_loss(p, t, **weights), lambda p, t: al.rankNet(p, t, **weights))


@pytest.mark.parametrize(
    "scheme",
    [
        None,
        "ndcgLoss1_scheme",
        "ndcgLoss2_scheme",
        "lambdaRank_scheme",
        "ndcgLoss2PP_scheme",
        "rankNet_scheme",
        "rankNetWeightedByGTDiff_scheme",
        "rankNetWeightedByGTDiffPowed_scheme",
    ],
)
@pytest.mark.parametrize(
    "options", [{}, {"k": 4, "reduction": "mean"}, {"sigma": 2.0, "mu": 3.0, "reduction_log": "natural"}]
)
def test_lambda_loss_matches_allrank(scheme: str | None, options: dict[str, Any]) -> None:
    al, _ = load()
    kw = {"weighing_scheme": scheme, **options}
    _compare(lambda p, t: lambda_loss(p, t, **kw), lambda p, t: al.lambdaLoss(p, t, **kw), atol=1e-4)


@pytest.mark.parametrize("alpha", [1.0, 3.0])
def test_approx_ndcg_matches_allrank(alpha: float) -> None:
    al, _ = load()
    _compare(lambda p, t: approx_ndcg_loss(p, t, alpha=alpha), lambda p, t: al.approxNDCGLoss(p, t, alpha=alpha))


@pytest.mark.parametrize("options", [{}, {"temperature": 0.3, "k": 4}, {"powered_relevancies": False}])
def test_neural_ndcg_matches_allrank(options: dict[str, Any]) -> None:
    """allRank masks the Sinkhorn rows by slot index, which are the real items' rows only when the
    padding sits at the end of the list (as its data loader pads): compared there. At tied scores
    NeuralSort is not differentiable (:math:`|s_i - s_j|` at 0): allRank's gradient takes
    sign(0) = 0, rankwise's NeuralSort a one-sided derivative; the values agree with ties and the
    gradients are compared on untied scores."""
    al, _ = load()
    _compare(
        lambda p, t: neural_ndcg_loss(p, t, **options),
        lambda p, t: al.neuralNDCG(p, t, **options),
        end_padding=True,
        grad_at_ties=False,
    )


def test_stochastic_neural_ndcg_matches_allrank_with_the_same_noise() -> None:
    """Same global seed, same Gumbel draws. allRank's stochastic path pairs the samples with the
    padding masks of other lists (a sample-major reshape against a batch-major
    ``repeat_interleave``), so it is compared on batches whose lists share one length."""
    al, _ = load()
    kw: dict[str, Any] = {"stochastic": True, "n_samples": 5, "beta": 0.5}
    _compare(
        lambda p, t: neural_ndcg_loss(p, t, **kw),
        lambda p, t: al.neuralNDCG(p, t, **kw),
        same_length=True,
        seeded=True,
        grad_at_ties=False,
    )


def test_neural_ndcg_padding_anywhere_equals_the_list_without_padding() -> None:
    pred, true = _batch(11, 4, 9, ties=False, end_padding=False)
    whole = neural_ndcg_loss(pred, true, temperature=0.5)
    per_list = []
    for p, t in zip(pred, true):
        keep = t != PAD
        per_list.append(neural_ndcg_loss(p[keep][None], t[keep][None], temperature=0.5))
    # Sinkhorn stops when every matrix of the batch is within 1e-6 of doubly stochastic: agreement
    # to that tolerance's effect, not bit for bit
    torch.testing.assert_close(whole, torch.stack(per_list).mean(), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------------
# allRank's own tests (tests/losses/ of the allRank 1.4.3 wheel), run against rankwise through a shim:
# rankwise's functions under allRank's names and call conventions, with the same inputs and assertions.
# --------------------------------------------------------------------------------------------------
class _AllRankNames:
    """allRank's call signatures (positional ``eps`` etc.) mapped onto rankwise's keyword options."""

    @staticmethod
    def listNet(y_pred: torch.Tensor, y_true: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
        return listnet_loss(y_pred, y_true, eps=eps)

    @staticmethod
    def listMLE(y_pred: torch.Tensor, y_true: torch.Tensor) -> torch.Tensor:
        return listmle_loss(y_pred, y_true)

    @staticmethod
    def rankNet(y_pred: torch.Tensor, y_true: torch.Tensor, **kw: Any) -> torch.Tensor:
        return ranknet_loss(y_pred, y_true, **kw)

    @staticmethod
    def lambdaLoss(y_pred: torch.Tensor, y_true: torch.Tensor, **kw: Any) -> torch.Tensor:
        return lambda_loss(y_pred, y_true, **kw)

    @staticmethod
    def approxNDCGLoss(y_pred: torch.Tensor, y_true: torch.Tensor, **kw: Any) -> torch.Tensor:
        return approx_ndcg_loss(y_pred, y_true, **kw)

    @staticmethod
    def neuralNDCG(y_pred: torch.Tensor, y_true: torch.Tensor, **kw: Any) -> torch.Tensor:
        return neural_ndcg_loss(y_pred, y_true, **kw)


R = _AllRankNames


def _bce(x: list[float] | float, y: list[float] | float, weight: list[float] | None = None) -> float:
    w = None if weight is None else torch.tensor(weight)
    return float(torch.nn.BCEWithLogitsLoss(weight=w)(torch.tensor([x]), torch.tensor([y])))


def test_allrank_listnet_cases() -> None:
    def wrap(p: list[float], t: list[float], eps: float = 1e-10) -> float:
        return float(R.listNet(torch.tensor([p]), torch.tensor([t]), eps))

    assert wrap([0.5, 0.2], [1.0, 0.0], eps=0.0) == pytest.approx(
        -np.sum(softmax([1.0, 0.0]) * np.log(softmax([0.5, 0.2])))
    )
    got = wrap([0.5, -1e30], [1.0, 0.0])
    assert math.isfinite(got)
    assert got == pytest.approx(-np.sum(softmax([1.0, 0.0]) * np.log(softmax([0.5, -1e30]) + 1e-10)))
    got = wrap([0.5, 0.2, 0.5], [1.0, 0.0, PAD])
    assert got == pytest.approx(-np.sum(softmax([1.0, 0.0]) * np.log(softmax([0.5, 0.2]) + 1e-10)))


def test_allrank_listmle_cases() -> None:
    got = float(R.listMLE(torch.tensor([[0.5, 0.3, 0.5]]), torch.tensor([[1.0, 0.0, PAD]])))
    assert math.isfinite(got) and got == pytest.approx(0.5981389284133911)


def test_allrank_ranknet_cases() -> None:
    def wrap(p: list[float], t: list[float], **kw: Any) -> float:
        return float(R.rankNet(torch.tensor([p]), torch.tensor([t]), **kw))

    assert wrap([0.5, 0.2], [1.0, 0.0]) == pytest.approx(_bce(0.3, 1.0))
    assert wrap([0.2, 0.5], [1.0, 0.0]) == pytest.approx(_bce(-0.3, 1.0))
    assert wrap([0.5, 0.2, 0.1], [1.0, 0.0, 0.0]) == pytest.approx(_bce([0.3, 0.4], [1.0, 1.0]))
    assert wrap([0.2, 0.5], [0.0, 1.0]) == pytest.approx(_bce(0.3, 1.0))
    assert wrap([0.2, 0.5], [0.0, 2.0]) == pytest.approx(_bce(0.3, 1.0))
    assert wrap([0.5, 0.2, 0.66], [1.0, 0.0, PAD]) == pytest.approx(_bce(0.3, 1.0))
    want = _bce([0.3, 0.4, 0.1], [1.0, 1.0, 1.0], weight=[1.0, 2.0, 1.0])
    assert wrap([0.5, 0.2, 0.1], [2.0, 1.0, 0.0], weight_by_diff=True) == pytest.approx(want)
    want = _bce([0.3, 0.4, 0.1], [1.0, 1.0, 1.0], weight=[3.0, 4.0, 1.0])
    assert wrap([0.5, 0.2, 0.1], [2.0, 1.0, 0.0], weight_by_diff_powed=True) == pytest.approx(want)


_PADDED_PAIR = (
    (torch.tensor([[0.5, 0.3, 0.5]]), torch.tensor([[0.5, 0.3, 0.5]])),
    (torch.tensor([[0.5, 0.3, 0.5, 1.0]]), torch.tensor([[0.5, 0.3, 0.5, PAD]])),
)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"weighing_scheme": "ndcgLoss1_scheme", "reduction_log": "binary"}, 2.9272110462),
        ({"weighing_scheme": "ndcgLoss2PP_scheme", "reduction_log": "binary"}, 1.1244146823),
        ({"weighing_scheme": "rankNet_scheme", "reduction_log": "natural"}, 1.1962778568),
    ],
)
def test_allrank_lambdaloss_cases(options: dict[str, Any], expected: float) -> None:
    (p0, t0), (p1, t1) = _PADDED_PAIR
    got, got_pad = float(R.lambdaLoss(p0, t0, **options)), float(R.lambdaLoss(p1, t1, **options))
    assert got == pytest.approx(got_pad) and got == pytest.approx(expected)


def test_allrank_approxndcg_case() -> None:
    (p0, t0), (p1, t1) = _PADDED_PAIR
    got, got_pad = float(R.approxNDCGLoss(p0, t0, alpha=1.0)), float(R.approxNDCGLoss(p1, t1, alpha=1.0))
    assert got == pytest.approx(got_pad) and got == pytest.approx(-0.8499219417)


def _neural_wrap(p: list[float], t: list[float], *, stochastic: bool, temperature: float = 1e-4, **kw: Any) -> float:
    # allRank's test wrapper: temperature 1e-4, 1024 samples, beta 0.001
    out = R.neuralNDCG(
        torch.tensor([p]),
        torch.tensor([t]),
        temperature=temperature,
        stochastic=stochastic,
        n_samples=1024,
        beta=0.001,
        **kw,
    )
    return float(out)


def _ndcg_wrap(p: list[float], t: list[float], ats: list[int] | None = None) -> float:
    return float(ndcg(torch.tensor([p]), torch.tensor([t]), ats=ats).mean())


@pytest.mark.parametrize("stochastic", [False, True])
def test_allrank_neuralndcg_cases(stochastic: bool) -> None:
    """allRank's cases for the non-transposed variant (rankwise has no NeuralNDCG-transposed)."""
    torch.manual_seed(0)
    long_p, long_t = [0.5, 0.2, 0.1, 0.4, 1.0, -1.0, 0.63], [1.0, 2.0, 2.0, 4.0, 1.0, 4.0, 3.0]
    for p, t in [([0.5, 0.2], [1.0, 0.0]), (long_p, long_t), ([0.5, -1e30], [1.0, 0.0])]:
        got = _neural_wrap(p, t, stochastic=stochastic)
        assert math.isfinite(got) and -got == pytest.approx(_ndcg_wrap(p, t))
    p = [*long_p, 1.0, 0.5, 0.3]
    t = [*long_t, PAD, PAD, PAD]
    got = _neural_wrap(p, t, stochastic=stochastic, temperature=0.001)
    assert math.isfinite(got) and -got == pytest.approx(_ndcg_wrap(p, t))
    got = _neural_wrap(long_p, long_t, stochastic=stochastic, k=3)
    assert math.isfinite(got) and -got == pytest.approx(_ndcg_wrap(long_p, long_t, ats=[3]))


# --------------------------------------------------------------------------------------------------
# conventions where allRank gives NaN, module twins, PiRank
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["listnet", "listmle", "ranknet", "lambda_loss", "approx_ndcg", "neural_ndcg", "pirank", "pirank.isotonic"]
)
def test_all_padding_lists_add_zero(name: str) -> None:
    fn = get_loss(name.partition(".")[0])
    kw = {"method": "isotonic"} if name == "pirank.isotonic" else {}
    pred, true = _batch(3, 2, 6, ties=False, end_padding=True)
    pred = pred.requires_grad_()
    padded_true = torch.cat([true, torch.full((1, 6), PAD)])
    padded_pred = torch.cat([pred, torch.randn(1, 6)])
    torch.manual_seed(0)
    a = fn(pred, true, **kw)
    torch.manual_seed(0)
    b = fn(padded_pred, padded_true, **kw)
    scale = {"listnet": 2 / 3, "listmle": 2 / 3, "approx_ndcg": 2 / 3}.get(name, 1.0)  # the mean counts the list
    torch.testing.assert_close(b, a * scale, rtol=1e-4, atol=1e-5)
    b.backward()
    assert pred.grad is not None and torch.isfinite(pred.grad).all()


def test_module_twins_hold_the_options() -> None:
    pred, true = _batch(5, 3, 7, ties=False, end_padding=False)
    torch.testing.assert_close(ListNetLoss(eps=0.0)(pred, true), listnet_loss(pred, true, eps=0.0))
    kw: dict[str, Any] = {"weighing_scheme": "lambdaRank_scheme", "k": 3, "reduction": "mean"}
    torch.testing.assert_close(LambdaLoss(**kw)(pred, true), lambda_loss(pred, true, **kw))


def test_invalid_options_name_the_argument() -> None:
    pred, true = _batch(5, 2, 4, ties=False, end_padding=False)
    with pytest.raises(ValueError, match="weighing_scheme"):
        lambda_loss(pred, true, weighing_scheme="ndcgLoss1")
    with pytest.raises(ValueError, match="reduction_log"):
        lambda_loss(pred, true, reduction_log="ten")
    with pytest.raises(ValueError, match="y_true"):
        listnet_loss(pred, true[:, :3])


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("neuralsort", {"tau": 1e-3}),
        ("softsort", {"tau": 1e-3}),
        ("diffsort", {"steepness": 200.0}),
        ("isotonic", {"regularization_strength": 1e-4}),
    ],
)
def test_pirank_tends_to_one_minus_ndcg(method: str, options: dict[str, Any]) -> None:
    """At a small temperature / strength every relaxation gives 1 - NDCG@k of the exact ranking."""
    pred, true = _batch(7, 4, 8, ties=False, end_padding=False)
    pred = pred * 3  # well-separated scores
    for k in (None, 3):
        got = pirank_ndcg_loss(pred, true, method=method, k=k, **options)
        want = 1 - ndcg(pred, true, ats=None if k is None else [k]).mean()
        torch.testing.assert_close(got, want, rtol=0, atol=2e-3)


def test_pirank_gradient_improves_ndcg() -> None:
    pred, true = _batch(8, 8, 10, ties=False, end_padding=False)
    x = pred.clone().requires_grad_()
    opt = torch.optim.SGD([x], lr=0.5)
    before = float(ndcg(x.detach(), true).mean())
    for _ in range(30):
        opt.zero_grad()
        pirank_ndcg_loss(x, true, tau=0.3).backward()
        opt.step()
    assert float(ndcg(x.detach(), true).mean()) > before + 0.02


@pytest.mark.parametrize("loss", [listnet_loss, listmle_loss])
def test_listwise_second_derivatives_are_exact(loss: Any) -> None:
    # the closed-form backwards must not return a constant gradient under create_graph (a silent zero Hessian)
    y_true = torch.tensor([[2.0, 0.0, 1.0, -1.0], [1.0, 1.0, 0.0, 3.0]], dtype=torch.float64)
    y_pred = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    kw = {"generator": torch.Generator().manual_seed(0)} if loss is listmle_loss else {}

    def f(x: torch.Tensor) -> torch.Tensor:
        if kw:
            kw["generator"].manual_seed(0)
        return loss(x, y_true, **kw)

    assert torch.autograd.gradgradcheck(f, (y_pred,))
    (g,) = torch.autograd.grad(f(y_pred), y_pred, create_graph=True)
    assert g.grad_fn is not None


@pytest.mark.parametrize("eps", [1e-10, 0.0])
@pytest.mark.parametrize("n", [7, 60, 50_000])  # the three softmax paths: short rows, kernel, kernel in place
def test_listnet_closed_form_matches_autograd_with_all_padding_lists(eps: float, n: int) -> None:
    # reference: autograd through torch ops on the real slots of each list, row by row
    g = torch.Generator().manual_seed(3)
    y_pred = torch.randn(6, n, generator=g, dtype=torch.float64)
    y_true = torch.randint(0, 4, (6, n), generator=g).double()
    y_true[0] = PAD  # a list made only of padding
    y_true[2, 3:] = PAD
    y_true[4, ::2] = PAD  # padding anywhere
    x = y_pred.clone().requires_grad_()
    total = x.sum() * 0.0
    for row in range(6):
        real = y_true[row] != PAD
        if real.any():
            s = torch.softmax(x[row][real], 0)
            q = torch.softmax(y_true[row][real], 0)
            total = total - (q * torch.log(s + eps)).sum()
    (expected,) = torch.autograd.grad(total / 6, x)
    ours = y_pred.clone().requires_grad_()
    loss = listnet_loss(ours, y_true, eps=eps)
    assert float(loss) == pytest.approx(float(total / 6), rel=1e-12)
    loss.backward(retain_graph=True)
    assert ours.grad is not None
    torch.testing.assert_close(ours.grad, expected, rtol=1e-10, atol=1e-12)
    assert float(ours.grad[0].abs().sum()) == 0.0
    first = ours.grad.clone()
    loss.backward()  # the backward reuses a buffer of the forward: a second run must give the same
    torch.testing.assert_close(ours.grad, 2 * first, rtol=1e-12, atol=0.0)


# --------------------------------------------------------------------------------------------------
# stochastic NeuralNDCG: non-finite scores, tied batch minima, the traced Sinkhorn scaling
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("whole_list", [False, True])
def test_stochastic_neural_ndcg_non_finite_score_makes_its_own_list_nan(value: float, whole_list: bool) -> None:
    """The rule of the deterministic NeuralNDCG and the other learning-to-rank losses: a NaN or ±inf score
    makes the loss NaN and the gradient NaN on its own list, finite on the others (the shift by the batch
    minimum takes the finite scores only; allRank's ``|min|`` made every list NaN for a NaN or -inf score)."""
    pred, true = _batch(3, 4, 6, ties=False, end_padding=True)
    true[1] = true[1].clamp(min=0.0)  # (padded slots take no part and get no gradient)
    if whole_list:
        pred[1] = value
    else:
        pred[1, 2] = value
    for stochastic in (False, True):
        x = pred.clone().requires_grad_()
        torch.manual_seed(0)
        out = neural_ndcg_loss(x, true, stochastic=stochastic, n_samples=3, temperature=0.5)
        (g,) = torch.autograd.grad(out, x)
        assert math.isnan(float(out))
        assert g[1].isnan().all() and g[[0, 2, 3]].isfinite().all(), (stochastic, g)


def test_stochastic_neural_ndcg_tied_batch_minima_match_allrank() -> None:
    """The batch minimum held by two lists: the gradient of the shift is shared evenly, as ``torch.min``'s
    (positive scores: with a negative minimum, ``log(s + |min s| + 1e-10)`` puts the minima at ``log(1e-10)``
    and their gradients at 1e10 times a cancellation, which no two implementations share)."""
    al, _ = load()
    kw: dict[str, Any] = {"stochastic": True, "n_samples": 4, "beta": 0.5}
    for seed in range(3):
        pred, true = _batch(seed, 4, 7, ties=False, end_padding=False)
        pred = pred.abs() + 0.2
        true[:, 5:] = PAD
        true[:, :5] = true[:, :5].clamp(min=0.0)
        pred[0, 1] = pred[2, 3] = float(pred.min()) - 0.1
        v1, g1 = _value_and_grad(lambda p, t: neural_ndcg_loss(p, t, **kw), pred, true, seed)
        v2, g2 = _value_and_grad(lambda p, t: al.neuralNDCG(p, t, **kw), pred, true, seed)
        assert v1 == pytest.approx(v2, rel=1e-5, abs=2e-5)
        torch.testing.assert_close(g1, g2, rtol=1e-4, atol=2e-5)
        assert float(g1[0, 1]) != 0.0


def test_stochastic_shift_keeps_nan_gradients_to_their_list_under_compile() -> None:
    """``torch.compile``'s trace of ``torch.min``'s backward multiplies the upstream gradient by the mask
    of the minima (``NaN * 0`` is NaN everywhere), where eager mode scatters it: the shift routes the
    gradient with ``torch.where`` instead, the same NaN pattern in both (a NaN upstream gradient on the
    list holding ``+inf``)."""
    from rankwise.losses.learning_to_rank import _batch_shift

    def f(p: torch.Tensor) -> torch.Tensor:
        return p + _batch_shift(p)

    pred = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    pred[0, 2] = math.inf
    up = torch.ones(4, 5)
    up[0] = math.nan
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    grads = []
    for fn in (f, compiled):
        x = pred.clone().requires_grad_()
        (g,) = torch.autograd.grad(fn(x), x, up)
        grads.append(g)
    assert torch.equal(grads[0].isnan(), grads[1].isnan())
    assert grads[0][0].isnan().all() and grads[0][1:].isfinite().all()
    torch.testing.assert_close(grads[1], grads[0], equal_nan=True)
    # the argmin gets the gradient of every list without a non-finite score (eager: torch.min's)
    x = pred[1:].clone().requires_grad_()
    (want,) = torch.autograd.grad(x + x.min().abs(), x, up[1:])
    torch.testing.assert_close(grads[0][1:], want)


def test_traced_sinkhorn_scaling_lifts_no_float_constant() -> None:
    """``torch.compile(dynamic=True)`` turns a module-level or default float read by the traced code into
    a symbolic graph input; the 50 unrolled iterations of the Sinkhorn scaling then used one in over a
    hundred nodes (clamps, comparisons) and tracing the stochastic NeuralNDCG took over 5 minutes. The
    captured graph takes the tensors and their sizes only."""
    from rankwise.losses.learning_to_rank import _sinkhorn_scaling

    placeholders: list[Any] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        placeholders.extend(n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder")
        return gm

    mat = torch.rand(2, 3, 4, 4)
    rows = torch.ones(2, 3, 4, dtype=torch.bool)
    cols = rows.clone()
    cols[:, :, -1] = False
    torch._dynamo.reset()
    compiled = torch.compile(_sinkhorn_scaling, fullgraph=True, backend=backend, dynamic=True)
    torch.testing.assert_close(compiled(mat, rows, cols), _sinkhorn_scaling(mat, rows, cols))
    tensors = [p for p in placeholders if isinstance(p, torch.Tensor)]
    sizes = [p for p in placeholders if not isinstance(p, torch.Tensor)]
    assert len(tensors) == 3 and all(t.dim() >= 3 for t in tensors), placeholders
    assert all(isinstance(s, torch.SymInt) for s in sizes), placeholders


def _ltr_entries() -> list[Any]:
    from rankwise.losses import LOSSES

    return [e for e in LOSSES.entries() if e.fn.__module__ == "rankwise.losses.learning_to_rank"]


@pytest.mark.parametrize("entry", _ltr_entries(), ids=lambda e: e.name)
def test_a_negative_grade_other_than_the_padding_is_refused(entry: Any) -> None:
    pred = torch.randn(2, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    for bad in (-2.0, -0.5, -math.inf):
        true = torch.tensor([[2.0, 0.0, -1.0, 1.0], [1.0, bad, 0.0, -1.0]])
        with pytest.raises(ValueError, match=r"`y_true`.*grades >= 0"):
            entry.fn(pred, true)
        with pytest.raises(ValueError, match=r"`y_true`.*grades >= 0"):
            entry.module()(pred, true)
    # with another padding label, -1 is a negative grade too
    true = torch.tensor([[2.0, 0.0, -5.0, 1.0], [1.0, -1.0, 0.0, -5.0]])
    with pytest.raises(ValueError, match="y_true"):
        entry.fn(pred, true, padded_value_indicator=-5)
    assert torch.isfinite(entry.fn(pred, true.clamp(min=-5).where(true != -1, 0.0), padded_value_indicator=-5))
