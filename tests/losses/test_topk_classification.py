"""The top-k classification loss: difftopk parity, an independent slow implementation, gradients, errors."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rankwise.losses import TopKCrossEntropyLoss, get_loss, topk_cross_entropy_loss
from rankwise.ops.sorting_network import (
    _bitonic_comparators,
    _odd_even_comparators,
    _splitter_selection_comparators,
)
from tests.losses import _difftopk

METHODS = ("odd_even", "bitonic", "splitter_selection", "neuralsort", "softsort")
TOL = {torch.float32: {"rtol": 1e-5, "atol": 2e-6}, torch.float64: {"rtol": 1e-10, "atol": 1e-12}}


def _inputs(b: int, n: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(b, n, generator=g, dtype=torch.float64) * scale).to(dtype).requires_grad_()
    return x, torch.randint(n, (b,), generator=g)


# --------------------------------------------------------------------------------------------------
# parity with difftopk (values and gradients)
# --------------------------------------------------------------------------------------------------
CASES = [  # (p_k, n classes, m)
    ([0.5, 0.0, 0.0, 0.0, 0.5], 10, None),
    ([1.0], 7, None),
    ([0.2, 0.3, 0.5], 13, None),
    ([0.25, 0.0, 0.0, 0.0, 0.75], 100, 16),
    ([0.2, 0.2, 0.2, 0.2, 0.2], 100, 12),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("top1_mode", ["sm", "smce", "sort"])
@pytest.mark.parametrize(("p_k", "n", "m"), CASES, ids=[f"k{len(c[0])}-n{c[1]}-m{c[2]}" for c in CASES])
@pytest.mark.parametrize("method", METHODS)
def test_equals_difftopk(
    method: str, p_k: list[float], n: int, m: int | None, top1_mode: str, dtype: torch.dtype
) -> None:
    if top1_mode == "smce" and len(p_k) == 1:
        pytest.skip("difftopk's smce needs a k > 1 term (its top-k sum stays the float 0)")
    x, y = _inputs(6, n, dtype, seed=n + len(p_k))
    opts: dict[str, Any] = {"inverse_temperature": 2.0, "p_k": p_k, "m": m, "top1_mode": top1_mode}
    want = _difftopk.reference_loss(x, y, method, distribution="cauchy", **opts)
    got = topk_cross_entropy_loss(x, y, method=method, **opts)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, **TOL[dtype])
    (g_want,) = torch.autograd.grad(want, x)
    (g_got,) = torch.autograd.grad(got, x)
    torch.testing.assert_close(g_got, g_want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize(
    ("distribution", "art_lambda"),
    [("logistic_phi", 0.5), ("logistic_phi", 0.25), ("logistic", 0.25), ("optimal", 0.25), ("reciprocal", 0.25)],
)
@pytest.mark.parametrize("method", ["odd_even", "bitonic", "splitter_selection"])
def test_networks_distributions_equal_difftopk(
    method: str, distribution: str, art_lambda: float, dtype: torch.dtype
) -> None:
    x, y = _inputs(5, 11, dtype, seed=3, scale=2.0)
    opts: dict[str, Any] = {"inverse_temperature": 1.0, "p_k": [0.2, 0.2, 0.2, 0.2, 0.2], "art_lambda": art_lambda}
    want = _difftopk.reference_loss(x, y, method, distribution=distribution, **opts)
    got = topk_cross_entropy_loss(x, y, method=method, distribution=distribution, **opts)
    torch.testing.assert_close(got, want, **TOL[dtype])
    torch.testing.assert_close(torch.autograd.grad(got, x)[0], torch.autograd.grad(want, x)[0], **TOL[dtype])


def test_bitonic_equals_difftopks_dense_network_too() -> None:
    x, y = _inputs(4, 12, torch.float64, seed=5)
    opts: dict[str, Any] = {"inverse_temperature": 2.0, "p_k": [0.5, 0.0, 0.5], "distribution": "cauchy"}
    want = _difftopk.reference_loss(x, y, "bitonic__non_sparse", **opts)
    torch.testing.assert_close(topk_cross_entropy_loss(x, y, method="bitonic", **opts), want, **TOL[torch.float64])


@pytest.mark.parametrize(("n", "k"), [(2, 1), (5, 3), (10, 5), (16, 5), (37, 8), (100, 16)])
def test_splitter_selection_network_is_difftopks(n: int, k: int, capsys: pytest.CaptureFixture[str]) -> None:
    _difftopk.load()
    from difftopk.networks import sparse_splitter_selection_network

    theirs = []
    for split_a, split_b, *_rest, alpha_mask in sparse_splitter_selection_network(n, k):
        theirs.append(sorted((int(split_a[c].argmax()), int(split_b[c].argmax())) for c in range(len(alpha_mask))))
    ours, _ = _splitter_selection_comparators(n, k)
    assert [sorted((a, b) for a, b, _ in layer) for layer in ours] == [lyr for lyr in theirs if lyr]
    capsys.readouterr()  # (difftopk prints the number of layers)


# --------------------------------------------------------------------------------------------------
# an independent slow implementation: dense layer matrices, the full permutation matrix
# --------------------------------------------------------------------------------------------------
def _cdf(v: torch.Tensor, distribution: str) -> torch.Tensor:
    if distribution == "cauchy":
        return torch.atan(v) / math.pi + 0.5
    assert distribution == "logistic"
    return torch.sigmoid(v)


def _slow_network_p(x: torch.Tensor, layers: list[list[tuple[int, int, bool]]], beta: float, dist: str) -> torch.Tensor:
    """``P`` (B, n, n), ``sorted = x @ P`` ascending, as the product of one dense matrix per layer."""
    b, n = x.shape
    p = torch.eye(n, dtype=x.dtype).expand(b, n, n)
    v = x
    for layer in layers:
        mat = torch.eye(n, dtype=x.dtype).repeat(b, 1, 1)
        for a, c, flipped in layer:
            lo, hi = (c, a) if flipped else (a, c)
            alpha = _cdf(beta * (v[:, c] - v[:, a]), dist)
            mat[:, a, a], mat[:, c, c] = 0.0, 0.0
            mat[:, a, lo], mat[:, c, lo] = alpha, 1 - alpha  # the min: alpha x_a + (1 - alpha) x_c
            mat[:, a, hi], mat[:, c, hi] = 1 - alpha, alpha
        v = (v.unsqueeze(-2) @ mat).squeeze(-2)
        p = p @ mat
    return p


def _slow_top_rows(x: torch.Tensor, method: str, k: int, beta: float, dist: str) -> torch.Tensor:
    """``(B, k, n)``: row ``r`` = weights of the inputs on the ``r``-th largest position."""
    n = x.shape[-1]
    if method in ("odd_even", "bitonic", "splitter_selection"):
        if method == "odd_even":
            patterns, order = _odd_even_comparators(n)
        elif method == "bitonic":
            patterns, order = _bitonic_comparators(n)
        else:
            patterns, order = _splitter_selection_comparators(n, k)
        p = _slow_network_p(x, [patterns[i] for i in order], beta, dist)
        return p.flip(-1)[..., :k].transpose(-1, -2)
    tau = 1.0 / beta
    r = torch.arange(1, n + 1, dtype=x.dtype)
    if method == "neuralsort":  # Grover et al.: softmax(((n + 1 - 2i) s - A_s 1) / tau)
        a1 = (x.unsqueeze(-1) - x.unsqueeze(-2)).abs().sum(-1)
        logits = ((n + 1 - 2 * r).view(1, -1, 1) * x.unsqueeze(1) - a1.unsqueeze(1)) / tau
    else:  # SoftSort: softmax(-|sort(s)_i - s_j| / tau)
        srt = torch.sort(x, dim=-1, descending=True).values
        logits = -(srt.unsqueeze(-1) - x.unsqueeze(-2)).abs() / tau
    return torch.softmax(logits, dim=-1)[:, :k]


def _slow_loss(
    x: torch.Tensor,
    y: torch.Tensor,
    p_k: list[float],
    method: str,
    beta: float,
    top1_mode: str,
    m: int | None,
    dist: str,
) -> torch.Tensor:
    if m is not None:
        rows = []
        for i in range(x.shape[0]):
            others = torch.cat([x[i, : y[i]], x[i, y[i] + 1 :]])
            rows.append(torch.cat([x[i, y[i] : y[i] + 1], torch.sort(others, descending=True).values[: m - 1]]))
        x, y = torch.stack(rows), torch.zeros_like(y)
    top = _slow_top_rows(x, method, len(p_k), beta, dist)
    member = top[torch.arange(len(y)), :, y].cumsum(-1)  # (B, k)
    sm = torch.softmax(x, dim=-1)[torch.arange(len(y)), y]
    ks = range(len(p_k)) if top1_mode == "sort" else range(1, len(p_k))
    prob = sum((p_k[i] * member[:, i] for i in ks), torch.zeros_like(sm))
    if top1_mode == "sm":
        prob = prob + p_k[0] * sm
    nll = -torch.log(prob * (1 - 2e-7) + 1e-7)
    if top1_mode == "smce":
        return (p_k[0] * -torch.log(sm) + sum(p_k[1:]) * nll).mean()
    return nll.mean()


@pytest.mark.parametrize("top1_mode", ["sm", "smce", "sort"])
@pytest.mark.parametrize(("n", "m"), [(9, None), (16, None), (40, 11)])
@pytest.mark.parametrize("method", METHODS)
def test_equals_a_slow_dense_implementation(method: str, n: int, m: int | None, top1_mode: str) -> None:
    x, y = _inputs(5, n, torch.float64, seed=n)
    p_k = [0.4, 0.0, 0.3, 0.3]
    for dist in ("cauchy", "logistic") if method in ("odd_even", "bitonic", "splitter_selection") else ("cauchy",):
        want = _slow_loss(x, y, p_k, method, 1.5, top1_mode, m, dist)
        got = topk_cross_entropy_loss(
            x, y, p_k=p_k, method=method, inverse_temperature=1.5, top1_mode=top1_mode, m=m, distribution=dist
        )
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(
            torch.autograd.grad(got, x)[0], torch.autograd.grad(want, x)[0], rtol=1e-9, atol=1e-12
        )


@pytest.mark.parametrize(("n", "k"), [(7, 1), (10, 3), (33, 5)])
def test_steep_splitter_selection_finds_the_top_k(n: int, k: int) -> None:
    x, _ = _inputs(8, n, torch.float64, seed=k)
    x = x.detach()
    top = _slow_top_rows(x, "splitter_selection", k, 1e6, "cauchy")
    want = torch.sort(x, dim=-1, descending=True).indices[:, :k]
    assert torch.equal(top.argmax(-1), want)


# --------------------------------------------------------------------------------------------------
# gradients, shapes, batches
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("top1_mode", ["sm", "smce", "sort"])
@pytest.mark.parametrize("method", METHODS)
def test_gradcheck_float64(method: str, top1_mode: str) -> None:
    x, y = _inputs(3, 9, torch.float64, seed=1)

    def f(z: torch.Tensor) -> torch.Tensor:
        return topk_cross_entropy_loss(z, y, p_k=[0.5, 0.0, 0.5], method=method, top1_mode=top1_mode, reduction="none")

    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)
    assert torch.autograd.gradcheck(
        lambda z: topk_cross_entropy_loss(z, y, p_k=[0.5, 0.5], method=method, m=4), (x,), eps=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("method", METHODS)
def test_batch_of_one_and_leading_dims(method: str) -> None:
    x, y = _inputs(6, 8, torch.float64, seed=2)
    kw: dict[str, Any] = {"p_k": [0.5, 0.5], "method": method}
    each = topk_cross_entropy_loss(x, y, reduction="none", **kw)
    assert each.shape == (6,)
    for i in range(6):
        torch.testing.assert_close(topk_cross_entropy_loss(x[i : i + 1], y[i : i + 1], **kw), each[i])
    torch.testing.assert_close(topk_cross_entropy_loss(x, y, **kw), each.mean())
    torch.testing.assert_close(topk_cross_entropy_loss(x, y, reduction="sum", **kw), each.sum())
    lead = topk_cross_entropy_loss(x.reshape(2, 3, 8), y.reshape(2, 3), reduction="none", **kw)
    torch.testing.assert_close(lead, each.reshape(2, 3))
    one = topk_cross_entropy_loss(x[0], y[0], reduction="none", **kw)  # (C,) logits, a 0-d target
    torch.testing.assert_close(one, each[0])


def test_empty_batch_one_class_and_ties() -> None:
    x = torch.zeros(0, 5, requires_grad=True)
    out = topk_cross_entropy_loss(x, torch.zeros(0, dtype=torch.long), p_k=[1.0])
    assert out.item() == 0.0 and out.requires_grad
    one = topk_cross_entropy_loss(torch.zeros(2, 1, requires_grad=True), torch.zeros(2, dtype=torch.long), p_k=[1.0])
    torch.testing.assert_close(one, torch.tensor(-math.log(1 - 1e-7)))
    ties, t = torch.zeros(1, 5, dtype=torch.float64), torch.tensor([2])
    for method in METHODS:  # all tied: NeuralSort / SoftSort rows are uniform, a network's comparators all 1/2
        got = topk_cross_entropy_loss(ties, t, p_k=[0.0, 1.0], method=method, top1_mode="sort")
        if method in ("neuralsort", "softsort"):
            torch.testing.assert_close(got, -torch.log(torch.tensor(0.4 * (1 - 2e-7) + 1e-7, dtype=torch.float64)))
        else:
            torch.testing.assert_close(got, _slow_loss(ties, t, [0.0, 1.0], method, 2.0, "sort", None, "cauchy"))


def test_top_m_preselection_ignores_the_classes_left_out() -> None:
    x, y = _inputs(4, 100, torch.float64, seed=9)
    kw: dict[str, Any] = {"p_k": [0.5, 0.0, 0.5], "m": 10}
    base = topk_cross_entropy_loss(x, y, **kw)
    (g,) = torch.autograd.grad(base, x)
    assert ((g != 0).sum(-1) <= 10).all()  # only the m selected logits get a gradient
    low = x.detach().clone()
    keep = torch.topk(low.scatter(1, y[:, None], math.inf), 10, dim=1).indices
    drop = torch.ones_like(low, dtype=torch.bool).scatter(1, keep, False)
    low[drop] -= 5.0  # moving logits that are not selected changes nothing
    torch.testing.assert_close(topk_cross_entropy_loss(low, y, **kw), base.detach())


def test_module_twin_and_registry() -> None:
    x, y = _inputs(4, 7, torch.float32, seed=4)
    kw: dict[str, Any] = {"p_k": [0.5, 0.0, 0.5], "method": "softsort", "inverse_temperature": 3.0, "m": 5}
    mod = TopKCrossEntropyLoss(**kw)
    torch.testing.assert_close(mod(x, y), topk_cross_entropy_loss(x, y, **kw))
    assert "softsort" in repr(mod) and "p_k=[0.5, 0.0, 0.5]" in repr(mod)
    assert get_loss("topk_cross_entropy") is topk_cross_entropy_loss


def test_half_precision_is_computed_in_float32() -> None:
    x, y = _inputs(3, 6, torch.float32, seed=0)
    half = topk_cross_entropy_loss(x.detach().half(), y, p_k=[0.5, 0.5])
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, topk_cross_entropy_loss(x.detach().half().float(), y, p_k=[0.5, 0.5]))


def test_nan_logit_gives_nan() -> None:
    x, y = _inputs(3, 6, torch.float32, seed=0)
    bad = x.detach().clone()
    bad[1, 2] = math.nan
    assert topk_cross_entropy_loss(bad, y, p_k=[0.5, 0.5], reduction="none").isnan().all()


# --------------------------------------------------------------------------------------------------
# errors name the argument
# --------------------------------------------------------------------------------------------------
def test_errors_name_the_argument() -> None:
    x, y = _inputs(2, 6, torch.float32, seed=0)
    with pytest.raises(ValueError, match=r"`p_k` must sum to 1.*summing to 0.9"):
        topk_cross_entropy_loss(x, y, p_k=[0.5, 0.4])
    with pytest.raises(ValueError, match="`p_k` must hold finite probabilities"):
        topk_cross_entropy_loss(x, y, p_k=[1.5, -0.5])
    with pytest.raises(TypeError, match="`p_k`"):
        topk_cross_entropy_loss(x, y, p_k=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`p_k` must not be longer than the number of classes 6"):
        topk_cross_entropy_loss(x, y, p_k=[1 / 7] * 7)
    with pytest.raises(ValueError, match=r"`m` .* must be in \[len\(p_k\), n_classes\] = \[2, 6\], got 7"):
        topk_cross_entropy_loss(x, y, p_k=[0.5, 0.5], m=7)
    with pytest.raises(ValueError, match=r"`m` must be >= len\(p_k\) = 3"):
        topk_cross_entropy_loss(x, y, p_k=[0.5, 0.0, 0.5], m=2)
    with pytest.raises(
        ValueError, match=r"`method` must be a known top-k method, got 'odd-even': did you mean 'odd_even'"
    ):
        topk_cross_entropy_loss(x, y, p_k=[1.0], method="odd-even")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"did you mean 'neuralsort'"):
        TopKCrossEntropyLoss(p_k=[1.0], method="neural_sort")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`inverse_temperature` must be finite and > 0"):
        topk_cross_entropy_loss(x, y, p_k=[1.0], inverse_temperature=0.0)
    with pytest.raises(ValueError, match="`top1_mode`"):
        topk_cross_entropy_loss(x, y, p_k=[1.0], top1_mode="softmax")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`distribution`"):
        topk_cross_entropy_loss(x, y, p_k=[1.0], distribution="normal")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`targets` must hold integer class indices"):
        topk_cross_entropy_loss(x, y.float(), p_k=[1.0])
    with pytest.raises(ValueError, match="`targets` must have the shape of `logits` without its class dim"):
        topk_cross_entropy_loss(x, y[:1], p_k=[1.0])
    with pytest.raises(TypeError, match="`logits` must be a floating-point tensor"):
        topk_cross_entropy_loss(x.long(), y, p_k=[1.0])
