"""soft_topk, dknn and dknn_class_scores: parity with loop references, gradients, limits, errors."""

from __future__ import annotations

import math

import pytest
import torch

import rankwise
from rankwise import DKNN, DKNNClassScores, SoftTopK, dknn, dknn_class_scores, neural_sort, soft_topk, softsort_matrix
from tests.conftest import gradcheck
from tests.registry_examples import case_entry


def topk_loop(s: list[float], k: int, tau: float) -> torch.Tensor:
    """m_j = sum_{i <= k} softmax_j(((n + 1 - 2i) s_j - sum_l |s_j - s_l|) / tau), with loops."""
    n = len(s)
    row_sum = [sum(abs(a - b) for b in s) for a in s]
    m = [0.0] * n
    for i in range(1, k + 1):
        logits = [((n + 1 - 2 * i) * s[j] - row_sum[j]) / tau for j in range(n)]
        mx = max(logits)
        e = [math.exp(v - mx) for v in logits]
        for j in range(n):
            m[j] += e[j] / sum(e)
    return torch.tensor(m, dtype=torch.float64)


def hard_topk(s: torch.Tensor, k: int) -> torch.Tensor:
    idx = torch.topk(s, k, dim=-1).indices
    return torch.zeros_like(s).scatter(-1, idx, 1.0)


# ----------------------------------------------------------------------------------------------
# soft_topk
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("tau", [0.1, 1.0])
def test_soft_topk_matches_loop(k: int, tau: float) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g, dtype=torch.float64)
    m = soft_topk(x, k, tau=tau)
    for b in range(4):
        torch.testing.assert_close(m[b], topk_loop(x[b].tolist(), k, tau), rtol=1e-10, atol=1e-12)
    # = sum of the first k rows of the full matrices
    torch.testing.assert_close(m, neural_sort(x, tau=tau)[..., :k, :].sum(-2))
    torch.testing.assert_close(
        soft_topk(x, k, tau=tau, method="softsort"), softsort_matrix(x, tau=tau)[..., :k, :].sum(-2)
    )


@pytest.mark.parametrize("method", ["neuralsort", "softsort"])
def test_soft_topk_properties(method: str, device: torch.device, dtype: torch.dtype) -> None:
    x = torch.randn(32, 10, device=device, dtype=dtype)
    for tau in (0.05, 0.5, 2.0):
        m = soft_topk(x, 4, tau=tau, method=method)
        assert m.shape == x.shape and m.dtype == dtype
        assert (m >= 0).all()
        torch.testing.assert_close(m.sum(-1), torch.full((32,), 4.0, device=device, dtype=dtype))
        # what is true: entries may exceed 1 only by the column-sum excess of P̂ (not doubly stochastic)
        full = neural_sort(x, tau=tau) if method == "neuralsort" else softsort_matrix(x, tau=tau)
        assert (m <= full.sum(-2) + 1e-5).all()
    # tau -> 0: the hard top-k indicator
    xs = torch.randperm(20, device=device).to(dtype).reshape(2, 10) / 4
    torch.testing.assert_close(soft_topk(xs, 3, tau=1e-3, method=method), hard_topk(xs, 3), rtol=0, atol=1e-5)


def test_soft_topk_dim_gradcheck_and_module() -> None:
    x = torch.randn(3, 6, 2, dtype=torch.float64)
    m = soft_topk(x, 2, dim=1, tau=0.5)
    assert m.shape == x.shape
    torch.testing.assert_close(m, soft_topk(x.movedim(1, -1), 2, tau=0.5).movedim(-1, 1))
    torch.testing.assert_close(SoftTopK(2, tau=0.5, dim=1)(x), m)
    assert gradcheck(lambda s: soft_topk(s, 2, dim=1, tau=0.5), x)
    assert gradcheck(lambda s: soft_topk(s, 3, tau=0.5, method="softsort"), torch.randn(2, 5, dtype=torch.float64))


def test_soft_topk_degenerate() -> None:
    x = torch.full((2, 5), 0.3, requires_grad=True)
    m = soft_topk(x, 2)  # all ties: k / n everywhere
    torch.testing.assert_close(m, torch.full((2, 5), 0.4))
    m.sum().backward()
    assert torch.isfinite(x.grad).all()
    # k = n: the column sums of P̂ (they add up to n but are not all 1: P̂ is not doubly stochastic)
    x = torch.randn(3, 4)
    torch.testing.assert_close(soft_topk(x, 4), neural_sort(x).sum(-2))
    torch.testing.assert_close(soft_topk(x, 4).sum(-1), torch.full((3,), 4.0))
    assert torch.equal(soft_topk(torch.tensor([2.0]), 1), torch.ones(1))
    e = torch.zeros(0, 4, requires_grad=True)
    out = soft_topk(e, 2)
    assert out.shape == (0, 4)
    out.sum().backward()
    assert soft_topk(torch.randn(3, 5).half(), 2).dtype == torch.float16


def test_soft_topk_errors() -> None:
    x = torch.randn(2, 5)
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 5\] \(n = 5\), got 6"):
        soft_topk(x, 6)
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 5\] \(n = 5\), got 0"):
        soft_topk(x, 0)
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 2\] \(n = 2\), got 3"):
        soft_topk(x, 3, dim=0)
    with pytest.raises(TypeError, match="`k` must be an int, got float"):
        soft_topk(x, 2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`k` must be an int, got bool"):
        soft_topk(x, True)
    with pytest.raises(ValueError, match="`tau` must be finite and > 0, got 0"):
        soft_topk(x, 2, tau=0)
    with pytest.raises(TypeError, match="`scores` must be a floating-point tensor"):
        soft_topk(torch.tensor([1, 2, 3]), 1)
    with pytest.raises(ValueError, match="`scores` must have at least 1 dimension"):
        soft_topk(torch.tensor(1.0), 1)
    with pytest.raises(ValueError, match="`method` must be one of 'neuralsort', 'softsort'; got 'sinkhorn'"):
        soft_topk(x, 2, method="sinkhorn")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`k` must be >= 1, got 0"):
        SoftTopK(0)


# ----------------------------------------------------------------------------------------------
# dknn
# ----------------------------------------------------------------------------------------------
def test_dknn_matches_definition() -> None:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(5, 3, generator=g, dtype=torch.float64)
    y = torch.randn(9, 3, generator=g, dtype=torch.float64)
    m = dknn(q, y, 3, tau=0.4)
    assert m.shape == (5, 9)
    # explicit negative squared Euclidean distances (including the per-query constant), loop top-k
    for a in range(5):
        s = [-sum((q[a, d] - y[b, d]).item() ** 2 for d in range(3)) for b in range(9)]
        torch.testing.assert_close(m[a], topk_loop(s, 3, 0.4), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(m.sum(-1), torch.full((5,), 3.0, dtype=torch.float64))
    assert (m > 0).all()


def test_dknn_small_tau_is_hard_knn(device: torch.device) -> None:
    g = torch.Generator().manual_seed(2)
    q = torch.randn(20, 4, generator=g).to(device)
    y = torch.randn(30, 4, generator=g).to(device)
    d2 = torch.cdist(q, y) ** 2
    hard = hard_topk(-d2, 5)
    gaps = torch.sort(d2, dim=-1).values.diff(dim=-1)[:, 4]  # gap between 5th and 6th neighbour
    keep = gaps > 0.05
    m = dknn(q, y, 5, tau=1e-4)
    torch.testing.assert_close(m[keep], hard[keep], rtol=0, atol=1e-3)
    assert keep.sum() > 10


def test_dknn_stochastic() -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, 2, generator=g, dtype=torch.float64)
    y = torch.randn(6, 2, generator=g, dtype=torch.float64)
    a = dknn(q, y, 2, method="stochastic", n_samples=8, generator=torch.Generator().manual_seed(5))
    b = dknn(q, y, 2, method="stochastic", n_samples=8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and a.shape == (4, 6)
    torch.testing.assert_close(a.sum(-1), torch.full((4,), 2.0, dtype=torch.float64))
    # k = 1, tau -> 0: membership -> Pr(j is first) under Plackett-Luce with log-scores -d², = softmax(-d²)
    m = dknn(q, y, 1, tau=1e-4, method="stochastic", n_samples=20000, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(m, torch.softmax(-(torch.cdist(q, y) ** 2), -1), rtol=0, atol=0.02)
    assert gradcheck(
        lambda qq, yy: dknn(
            qq, yy, 2, tau=0.5, method="stochastic", n_samples=2, generator=torch.Generator().manual_seed(1)
        ),
        q,
        y,
    )


def test_dknn_gradcheck_batch_and_module() -> None:
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 3, 2, generator=g, dtype=torch.float64)
    y = torch.randn(4, 2, generator=g, dtype=torch.float64)
    m = dknn(q, y, 2, tau=0.5)  # leading dims broadcast
    assert m.shape == (2, 3, 4)
    torch.testing.assert_close(m[1], dknn(q[1], y, 2, tau=0.5))
    torch.testing.assert_close(DKNN(2, tau=0.5)(q, y), m)
    assert gradcheck(lambda qq, yy: dknn(qq, yy, 2, tau=0.5), q, y)


def test_dknn_degenerate_and_dtype() -> None:
    y = torch.ones(5, 3, requires_grad=True)
    q = torch.randn(2, 3, requires_grad=True)
    m = dknn(q, y, 2)  # identical neighbours: shared membership k / N
    torch.testing.assert_close(m, torch.full((2, 5), 0.4))
    m.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(y.grad).all()
    assert dknn(torch.zeros(0, 3), torch.randn(4, 3), 2).shape == (0, 4)
    torch.testing.assert_close(dknn(torch.randn(2, 3), torch.randn(1, 3), 1), torch.ones(2, 1))
    assert dknn(torch.randn(2, 3).bfloat16(), torch.randn(4, 3).bfloat16(), 2).dtype == torch.bfloat16
    assert dknn(torch.randn(2, 3), torch.randn(4, 3).double(), 2).dtype == torch.float64


def test_dknn_classifies_separated_blobs() -> None:
    g = torch.Generator().manual_seed(6)
    centres = torch.tensor([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    labels = torch.arange(3).repeat_interleave(10)
    train = centres[labels] + 0.5 * torch.randn(30, 2, generator=g)
    test_y = torch.arange(3).repeat_interleave(4)
    test = centres[test_y] + 0.5 * torch.randn(12, 2, generator=g)
    scores = dknn_class_scores(dknn(test, train, 5, tau=1.0), labels, 3)
    torch.testing.assert_close(scores.sum(-1), torch.full((12,), 5.0))
    assert torch.equal(scores.argmax(-1), test_y)


def test_dknn_errors() -> None:
    q, y = torch.randn(2, 3), torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 4\] \(number of neighbours N = 4\), got 5"):
        dknn(q, y, 5)
    with pytest.raises(ValueError, match=r"`k` must be in \[1, 4\]"):
        dknn(q, y, 0)
    with pytest.raises(ValueError, match="`query` must have at least 2 dimensions"):
        dknn(torch.randn(3), y, 1)
    with pytest.raises(ValueError, match="`neighbors` must have at least 2 dimensions"):
        dknn(q, torch.randn(3), 1)
    with pytest.raises(ValueError, match="same feature size, got 3 and 2"):
        dknn(q, torch.randn(4, 2), 1)
    with pytest.raises(TypeError, match="`query` must be a floating-point tensor"):
        dknn(q.long(), y, 1)
    with pytest.raises(ValueError, match="`method` must be one of 'deterministic', 'stochastic'; got 'soft'"):
        dknn(q, y, 1, method="soft")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`tau` must be finite and > 0, got -1"):
        dknn(q, y, 1, tau=-1)
    with pytest.raises(ValueError, match="`n_samples` must be >= 1, got 0"):
        dknn(q, y, 1, method="stochastic", n_samples=0)


def test_class_scores() -> None:
    g = torch.Generator().manual_seed(7)
    m = torch.rand(2, 3, 6, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 3, 1, 3, 3, 0])
    c = dknn_class_scores(m, labels, 4)
    expected = torch.zeros(2, 3, 4, dtype=torch.float64)
    for a in range(2):
        for b in range(3):
            for j in range(6):
                expected[a, b, labels[j]] += m[a, b, j]
    torch.testing.assert_close(c, expected)
    torch.testing.assert_close(DKNNClassScores(4)(m, labels), c)
    assert gradcheck(lambda mm: dknn_class_scores(mm, labels, 4), m)
    with pytest.raises(TypeError, match=r"`labels` must be an integer tensor, got dtype torch\.float32"):
        dknn_class_scores(m, labels.float(), 4)
    with pytest.raises(ValueError, match=r"`labels` must have shape \(\.\.\., N\) with N = 6, got shape \(5,\)"):
        dknn_class_scores(m, labels[:5], 4)
    with pytest.raises(ValueError, match="`num_classes` must be >= 1, got 0"):
        dknn_class_scores(m, labels, 0)
    with pytest.raises(ValueError, match="`membership` must have at least 2 dimensions"):
        dknn_class_scores(m[0, 0], labels, 4)


def test_registered() -> None:
    assert {"soft_topk", "dknn", "dknn_class_scores"} <= set(rankwise.list_ops())
    assert case_entry("op", "dknn.stochastic").stochastic  # dknn(..., method="stochastic")
