"""regression_loss / RegressionLoss: slow per-element formulas, weights for every kind, gradients, errors."""

from __future__ import annotations

import functools
import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import rankwise
from rankwise.imbalanced import RegressionLoss, regression_loss
from tests.conftest import gradcheck, tol
from tests.registry_examples import factories

KINDS = ["l1", "mse", "focal_l1", "focal_mse", "huber"]


def slow_element(p: float, t: float, kind: str, beta: float, gamma: float, activate: str, huber_beta: float) -> float:
    """The DIR definitions, one element at a time."""
    e = p - t
    a = abs(e)
    if kind == "l1":
        return a
    if kind == "mse":
        return e * e
    if kind == "huber":
        return 0.5 * a * a / huber_beta if a < huber_beta else a - 0.5 * huber_beta
    sig = 1.0 / (1.0 + math.exp(-beta * a))
    factor = math.tanh(beta * a) if activate == "tanh" else 2.0 * sig - 1.0
    base = a if kind == "focal_l1" else e * e
    return base * factor**gamma


def slow_loss(pred, target, weights, reduction, **kw) -> torch.Tensor:
    p, t = pred.reshape(-1).tolist(), target.reshape(-1).tolist()
    w = [1.0] * len(p) if weights is None else weights.reshape(-1).tolist()
    vals = [wi * slow_element(pi, ti, **kw) for pi, ti, wi in zip(p, t, w)]
    if reduction == "none":
        return torch.tensor(vals, dtype=torch.float64).reshape(pred.shape)
    total = sum(vals)
    return torch.tensor(total / len(vals) if reduction == "mean" else total, dtype=torch.float64)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(
    ("kind", "beta", "gamma", "activate", "huber_beta"),
    [
        ("l1", 0.2, 1.0, "sigmoid", 1.0),
        ("mse", 0.2, 1.0, "sigmoid", 1.0),
        ("focal_l1", 0.2, 1.0, "sigmoid", 1.0),
        ("focal_l1", 0.7, 2.0, "tanh", 1.0),
        ("focal_mse", 0.2, 1.0, "sigmoid", 1.0),
        ("focal_mse", 1.5, 0.5, "tanh", 1.0),
        ("huber", 0.2, 1.0, "sigmoid", 1.0),
        ("huber", 0.2, 1.0, "sigmoid", 0.3),
    ],
)
def test_matches_slow_formula(kind, beta, gamma, activate, huber_beta, weighted, reduction, dtype) -> None:
    g = torch.Generator().manual_seed(1)
    pred = torch.randn(7, 1, generator=g, dtype=torch.float64) * 2
    target = torch.randn(7, 1, generator=g, dtype=torch.float64)
    weights = torch.rand(7, generator=g, dtype=torch.float64) * 3 if weighted else None
    kw = {"kind": kind, "beta": beta, "gamma": gamma, "activate": activate, "huber_beta": huber_beta}
    got = regression_loss(
        pred.to(dtype), target.to(dtype), None if weights is None else weights.to(dtype), reduction=reduction, **kw
    )
    expected = slow_loss(pred, target, weights, reduction, **kw)
    assert got.dtype == dtype and got.shape == expected.shape
    torch.testing.assert_close(got.double(), expected, **tol(dtype))
    module = RegressionLoss(reduction=reduction, **kw)
    torch.testing.assert_close(
        module(pred.to(dtype), target.to(dtype), None if weights is None else weights.to(dtype)), got
    )


def test_unweighted_matches_torch_losses() -> None:
    p, t = torch.randn(50, dtype=torch.float64), torch.randn(50, dtype=torch.float64)
    torch.testing.assert_close(regression_loss(p, t, kind="l1"), F.l1_loss(p, t))
    torch.testing.assert_close(regression_loss(p, t, kind="mse"), F.mse_loss(p, t))
    torch.testing.assert_close(regression_loss(p, t, kind="huber", huber_beta=0.4), F.smooth_l1_loss(p, t, beta=0.4))
    torch.testing.assert_close(regression_loss(p, t, kind="mse", reduction="sum"), F.mse_loss(p, t, reduction="sum"))


@pytest.mark.parametrize("kind", KINDS)
def test_weights_matter_for_every_kind(kind: str) -> None:
    """The RankSim/ConR copies drop weights for focal losses and pass them as Huber's beta: we must not."""
    g = torch.Generator().manual_seed(2)
    p, t = torch.randn(8, 1, generator=g, dtype=torch.float64) * 3, torch.randn(8, 1, generator=g, dtype=torch.float64)
    w = torch.rand(8, 1, generator=g, dtype=torch.float64) * 4
    plain = regression_loss(p, t, kind=kind, reduction="none")
    weighted = regression_loss(p, t, w, kind=kind, reduction="none")
    torch.testing.assert_close(weighted, plain * w)
    assert not torch.allclose(regression_loss(p, t, w, kind=kind), regression_loss(p, t, kind=kind))
    # zero weight removes a sample completely
    w0 = torch.ones(8, 1, dtype=torch.float64)
    w0[0] = 0
    torch.testing.assert_close(regression_loss(p, t, w0, kind=kind, reduction="sum"), plain[1:].sum())
    if kind == "huber":  # the buggy reference behaviour (weights used as beta) is a different number
        buggy = torch.where((p - t).abs() < w, 0.5 * (p - t) ** 2 / w, (p - t).abs() - 0.5 * w).mean()
        assert not torch.allclose(regression_loss(p, t, w, kind="huber"), buggy)


def test_weights_shapes() -> None:
    p, t = torch.randn(5, 1), torch.randn(5, 1)
    w = torch.rand(5)
    out = regression_loss(p, t, w, reduction="none")
    assert out.shape == (5, 1)  # (B,) weights align with the batch dim, never a (B, B) broadcast
    torch.testing.assert_close(out, regression_loss(p, t, w[:, None], reduction="none"))
    torch.testing.assert_close(
        regression_loss(p, t, torch.tensor(2.0), reduction="none"), 2 * regression_loss(p, t, reduction="none")
    )
    with pytest.raises(ValueError, match="`weights` must have the shape of `pred`"):
        regression_loss(p, t, torch.rand(4))


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck(kind: str) -> None:
    g = torch.Generator().manual_seed(3)
    p, t = torch.randn(6, 2, generator=g) * 2, torch.randn(6, 2, generator=g)
    w = torch.rand(6, generator=g) + 0.1
    assert gradcheck(
        lambda a, b: regression_loss(a, b, w.double(), kind=kind, gamma=1.5, beta=0.5, huber_beta=0.8), p, t
    )


@pytest.mark.parametrize("kind", ["focal_l1", "focal_mse"])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0])
def test_zero_error_gradient_finite(kind: str, gamma: float) -> None:
    p = torch.tensor([0.0, 1.0, -2.0], requires_grad=True)
    t = torch.tensor([0.0, 1.0, 0.5])
    loss = regression_loss(p, t, kind=kind, gamma=gamma)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(p.grad).all()
    assert p.grad[0] == 0 and p.grad[1] == 0


def test_empty_and_half(device: torch.device) -> None:
    p = torch.zeros(0, 1, device=device, requires_grad=True)
    loss = regression_loss(p, torch.zeros(0, 1, device=device), kind="focal_mse")
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    h = torch.randn(4, device=device).half().requires_grad_()
    out = regression_loss(h, torch.zeros(4, device=device).half(), torch.ones(4, device=device).half(), kind="huber")
    assert out.dtype == torch.float32
    out.backward()
    assert h.grad is not None and h.grad.dtype == torch.float16


def test_registered() -> None:
    names = set(rankwise.list_losses())
    assert {f"regression_{k}" for k in KINDS} <= names
    for k in KINDS:
        entry = rankwise.losses.get_loss_entry(f"regression_{k}")
        assert entry.fn.__wrapped__ is regression_loss  # regression_loss with this kind as the default
        assert inspect.signature(entry.fn).parameters["kind"].default == k
        module = entry.module  # the twin of this kind: RegressionLoss(kind=k)
        assert isinstance(module, functools.partial) and module.func is RegressionLoss
        assert module.keywords == {"kind": k} and module().kind == k
        ex = factories("loss", f"regression_{k}").example(torch.float64, torch.device("cpu"))
        assert ex.kwargs["kind"] == k
        torch.testing.assert_close(entry.fn(*ex.args, **ex.kwargs), RegressionLoss(**ex.kwargs)(*ex.args))


def test_errors() -> None:
    p = torch.randn(4)
    with pytest.raises(ValueError, match="`target` must have the shape of `pred`"):
        regression_loss(p, torch.randn(4, 1))
    with pytest.raises(ValueError, match="`kind` must be one of"):
        regression_loss(p, p, kind="l2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`activate` must be one of"):
        regression_loss(p, p, kind="focal_l1", activate="relu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`reduction` must be one of"):
        regression_loss(p, p, reduction="avg")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`beta` must be finite and > 0"):
        regression_loss(p, p, kind="focal_l1", beta=0.0)
    with pytest.raises(ValueError, match="`gamma` must be finite and >= 0"):
        regression_loss(p, p, kind="focal_l1", gamma=-1.0)
    with pytest.raises(ValueError, match="`huber_beta` must be finite and > 0"):
        RegressionLoss(kind="huber", huber_beta=-1.0)
    with pytest.raises(TypeError, match="`pred` must be a floating-point tensor"):
        regression_loss(torch.tensor([1, 2]), torch.tensor([1, 2]))
    with pytest.raises(TypeError, match=r"`weights` must be a torch\.Tensor"):
        regression_loss(p, p, [1.0, 1.0, 1.0, 1.0])  # type: ignore[arg-type]
