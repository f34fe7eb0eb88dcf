# ruff: noqa: B023  (each lambda is called inside the loop iteration that builds it)
"""The ordinal losses over class logits (rankwise.losses.label_distribution): parity with dlordinal 2.7.0
(values and gradients, the soft-label matrices), plain-loop implementations of every formula, the
decoders, the registry metadata, errors and degenerate batches."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rankwise.losses import (
    LOSSES,
    DLDLLoss,
    UnimodalCELoss,
    argmax_class,
    cdw_ce_loss,
    dldl_loss,
    emd_loss,
    expected_class,
    mean_variance_loss,
    qwk_loss,
    slace_loss,
    sord_loss,
    unimodal_ce_loss,
)
from rankwise.losses import label_distribution as ld

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # dlordinal's *CrossEntropyLoss classes

F32 = {"rtol": 1e-5, "atol": 1e-6}
F64 = {"rtol": 1e-9, "atol": 1e-12}


def _case(
    k: int, n: int, seed: int, dtype: torch.dtype = torch.float32, scale: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, k, generator=g, dtype=torch.float64) * scale).to(dtype)
    targets = torch.randint(k, (n,), generator=g)
    targets[: min(n, k)] = torch.arange(min(n, k))  # every class present when n >= k
    return logits, targets


def _value_grad(fn: Callable[[torch.Tensor], torch.Tensor], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.detach().clone().requires_grad_()
    out = fn(x)
    w = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)
    (g,) = torch.autograd.grad((out * w).sum(), x)
    return out.detach(), g


def _assert_parity(mine: Callable[[torch.Tensor], torch.Tensor], ref: Any, logits: torch.Tensor, tol: dict) -> None:
    v1, g1 = _value_grad(mine, logits)
    v2, g2 = _value_grad(ref, logits)
    torch.testing.assert_close(v1, v2.to(v1.dtype), **tol)
    torch.testing.assert_close(g1, g2.to(g1.dtype), **tol)


@pytest.fixture(scope="module")
def dl() -> Any:
    dlordinal = pytest.importorskip("dlordinal")
    pytest.importorskip("dlordinal.losses")
    pytest.importorskip("dlordinal.soft_labelling")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    return dlordinal


# --------------------------------------------------------------------------------------------------
# soft-label matrices
# --------------------------------------------------------------------------------------------------
_GENTRI_5 = [0, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.1, 0]
_GENTRI_7 = [0, 0.0, 0.1, 0.02, 0.2, 0.1, 0.07, 0.15, 0.2, 0.05, 0.03, 0.3, 0.1, 0]
_GEO_ASYM = [(0.2, 0.0, 1.0), (0.05, 0.8, 0.2), (0.1, 0.5, 0.5), (0.15, 0.6, 0.4), (0.1, 1.0, 0.0)]


def _matrix(dist: str, k: int, **params: Any) -> torch.Tensor:
    return torch.tensor(ld._soft_label_matrix(ld._resolve(dist, k, params)), dtype=torch.float64)


@pytest.mark.parametrize("k", [3, 5, 10, 14])
def test_soft_label_matrices_equal_dlordinal(dl: Any, k: int) -> None:
    sl = dl.soft_labelling
    refs = {
        "beta": (_matrix("beta", k), sl.get_beta_soft_labels(k)),
        "binomial": (_matrix("binomial", k), sl.get_binomial_soft_labels(k)),
        "poisson": (_matrix("poisson", k), sl.get_poisson_soft_labels(k)),
        "exponential": (_matrix("exponential", k, p=1.5, tau=0.7), sl.get_exponential_soft_labels(k, 1.5, 0.7)),
        "triangular": (_matrix("triangular", k, alpha2=0.2), sl.get_triangular_soft_labels(k, 0.2)),
        "triangular.01": (_matrix("triangular", k, alpha2=0.01), sl.get_triangular_soft_labels(k, 0.01)),
        "geometric": (_matrix("geometric", k, alphas=0.3), sl.get_geometric_soft_labels(k, 0.3)),
        "geometric.list": (
            _matrix("geometric", k, alphas=[0.05 * (i % 4) for i in range(k)]),
            sl.get_geometric_soft_labels(k, [0.05 * (i % 4) for i in range(k)]),
        ),
    }
    for name, (mine, ref) in refs.items():
        torch.testing.assert_close(mine, torch.as_tensor(ref, dtype=torch.float64), rtol=0, atol=1e-12, msg=name)


def test_general_triangular_and_asymmetric_geometric_matrices_equal_dlordinal(dl: Any) -> None:
    sl = dl.soft_labelling
    for k, al in ((5, _GENTRI_5), (7, _GENTRI_7)):
        ref = torch.as_tensor(sl.get_general_triangular_soft_labels(k, al), dtype=torch.float64)  # float32 there
        torch.testing.assert_close(_matrix("general_triangular", k, alphas=al), ref, rtol=0, atol=1e-7)
    ref = torch.as_tensor(sl.get_geometric_soft_labels(5, _GEO_ASYM), dtype=torch.float64)
    torch.testing.assert_close(_matrix("geometric", 5, alphas=_GEO_ASYM), ref, rtol=0, atol=1e-12)


def test_soft_label_rows_are_distributions() -> None:
    for dist, kw in (("beta", {}), ("binomial", {}), ("poisson", {}), ("exponential", {}), ("geometric", {})):
        m = _matrix(dist, 6, **kw)
        torch.testing.assert_close(m.sum(1), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-8)
        assert (m >= 0).all()
        assert (m.argmax(1) == torch.arange(6)).all() or dist == "poisson"  # the softmax of pmfs is flat


# --------------------------------------------------------------------------------------------------
# parity with dlordinal: values and gradients
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("k", "seed"), [(3, 0), (3, 1), (5, 2), (10, 3)])
def test_unimodal_ce_equals_dlordinal(dl: Any, k: int, seed: int) -> None:
    L = dl.losses
    logits, y = _case(k, 12, seed)
    configs: list[tuple[str, dict[str, Any], Callable[[float, str], Any]]] = [
        ("beta", {}, lambda e, r: L.BetaCrossEntropyLoss(k, eta=e, reduction=r)),
        ("binomial", {}, lambda e, r: L.BinomialCrossEntropyLoss(k, eta=e, reduction=r)),
        ("poisson", {}, lambda e, r: L.PoissonCrossEntropyLoss(k, eta=e, reduction=r)),
        ("exponential", {"p": 2.0}, lambda e, r: L.ExponentialCrossEntropyLoss(k, eta=e, p=2.0, reduction=r)),
        (
            "exponential",
            {"p": 1.0, "tau": 0.5},
            lambda e, r: L.ExponentialLoss(torch.nn.CrossEntropyLoss(reduction=r), k, p=1.0, tau=0.5, eta=e),
        ),
        ("triangular", {}, lambda e, r: L.TriangularCrossEntropyLoss(k, eta=e, reduction=r)),
        ("triangular", {"alpha2": 0.1}, lambda e, r: L.TriangularCrossEntropyLoss(k, alpha2=0.1, eta=e, reduction=r)),
        ("geometric", {}, lambda e, r: L.GeometricCrossEntropyLoss(k, eta=e, reduction=r)),
        ("geometric", {"alphas": 0.35}, lambda e, r: L.GeometricCrossEntropyLoss(k, alphas=0.35, eta=e, reduction=r)),
    ]
    for i, (dist, params, ref) in enumerate(configs):
        eta = (1.0, 0.5, 0.0)[(i + seed) % 3]
        reduction = ("mean", "sum", "none")[(i + k) % 3]
        _assert_parity(
            lambda x: unimodal_ce_loss(x, y, distribution=dist, eta=eta, reduction=reduction, **params),
            lambda x: ref(eta, reduction)(x, y),
            logits,
            F32,
        )


def test_unimodal_ce_general_triangular_and_asymmetric_geometric_equal_dlordinal(dl: Any) -> None:
    L = dl.losses
    for k, al in ((5, _GENTRI_5), (7, _GENTRI_7)):
        logits, y = _case(k, 9, k)
        ref = L.GeneralTriangularCrossEntropyLoss(k, alphas=al, eta=0.8)
        _assert_parity(
            lambda x: unimodal_ce_loss(x, y, distribution="general_triangular", alphas=al, eta=0.8),
            lambda x: ref(x, y),
            logits,
            F32,
        )
    logits, y = _case(5, 9, 3)
    ref = L.GeometricCrossEntropyLoss(5, alphas=_GEO_ASYM, eta=0.6)
    _assert_parity(
        lambda x: unimodal_ce_loss(x, y, distribution="geometric", alphas=_GEO_ASYM, eta=0.6),
        lambda x: ref(x, y),
        logits,
        F32,
    )


def test_unimodal_ce_in_float64_uses_float64_matrices(dl: Any) -> None:
    logits, y = _case(5, 8, 4, torch.float64)
    out = unimodal_ce_loss(logits, y, distribution="binomial")
    assert out.dtype == torch.float64
    m = _matrix("binomial", 5)[y]
    want = -(m * torch.log_softmax(logits, -1)).sum(-1).mean()
    torch.testing.assert_close(out, want, **F64)
    ref = dl.losses.BinomialCrossEntropyLoss(5)(logits, y)  # its targets are float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("k", [3, 6, 10])
def test_cdw_ce_equals_dlordinal(dl: Any, k: int, seed: int) -> None:
    L = dl.losses
    # the reference keeps its distance and class weights in float32: float64 runs use weights that float32 holds
    w = (torch.rand(k, generator=torch.Generator().manual_seed(seed)) + 0.5).double()
    for dtype, tol in ((torch.float32, F32), (torch.float64, F64)):
        logits, y = _case(k, 10, seed, dtype)
        alphas = (0.5, 1.0, 2.0, 1.0) if dtype == torch.float32 else (1.0, 1.0, 2.0, 0.0)
        for alpha, margin, weight in zip(alphas, (0.0, 0.0, 0.3, 0.05), (None, w, None, w)):
            wt = None if weight is None else weight.to(dtype)
            ref = L.CDWCELoss(k, alpha=alpha, weight=wt, margin=margin)
            _assert_parity(
                lambda x: cdw_ce_loss(x, y, alpha=alpha, margin=margin, weight=wt), lambda x: ref(x, y), logits, tol
            )


def test_cdw_ce_large_logits_stay_finite(dl: Any) -> None:
    """The reference exponentiates the raw logits (float32 overflows above 88); rankwise evaluates the
    same formula from log-sum-exps: at logits of about 60 it equals the float64 reference."""
    logits, y = _case(4, 6, 2, scale=60.0)
    ref = dl.losses.CDWCELoss(4, alpha=1.0)
    want = ref(logits.double(), y)
    torch.testing.assert_close(cdw_ce_loss(logits, y, alpha=1.0).double(), want, rtol=1e-5, atol=1e-5)
    big = logits * 100
    assert not torch.isfinite(ref(big, y)) and torch.isfinite(cdw_ce_loss(big, y, alpha=1.0))


@pytest.mark.parametrize(("k", "seed"), [(3, 0), (5, 1), (10, 2)])
def test_sord_slace_emd_equal_dlordinal(dl: Any, k: int, seed: int) -> None:
    L = dl.losses
    g = torch.Generator().manual_seed(seed)
    train = torch.cat([torch.arange(k), torch.randint(k, (40,), generator=g)])
    w = (torch.rand(k, generator=g) + 0.5).double()  # float32 values: the reference keeps SLACE's weights in float32
    for dtype, tol in ((torch.float32, F32), (torch.float64, F64)):
        logits, y = _case(k, 11, seed, dtype)
        wt = w.to(dtype)
        for alpha in (1.0, 2.5):
            ref = L.SORDLoss(alpha, k, None)
            _assert_parity(lambda x: sord_loss(x, y, alpha=alpha), lambda x: ref(x, y), logits, tol)
            ref_s = L.SLACELoss(alpha, k, weight=wt)
            _assert_parity(lambda x: slace_loss(x, y, alpha=alpha, weight=wt), lambda x: ref_s(x, y), logits, tol)
        for ftype in ld._FTYPES if dtype == torch.float32 else ld._FTYPES[seed::3]:
            ref = L.SORDLoss(1.5, k, train, prox=True, ftype=ftype, weight=wt)
            _assert_parity(
                lambda x: sord_loss(x, y, alpha=1.5, prox=True, ftype=ftype, train_targets=train, weight=wt),
                lambda x: ref(x, y),
                logits,
                tol,
            )
        ref_e = L.EMDLoss(k)
        _assert_parity(lambda x: emd_loss(x, y), lambda x: ref_e(x, y), logits, tol)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("k", [3, 5, 10])
def test_qwk_equals_dlordinal(dl: Any, k: int, seed: int) -> None:
    L = dl.losses
    logits, y = _case(k, 16, seed)
    w = torch.rand(k, generator=torch.Generator().manual_seed(seed)) + 0.5
    for pen in ("linear", "quadratic"):
        for weight, log in ((None, False), (w, False), (None, True)):
            ref = L.WKLoss(k, penalization_type=pen, weight=weight, use_logits=True, use_logarithm=log)
            _assert_parity(
                lambda x: qwk_loss(x, y, penalization=pen, weight=weight, use_logarithm=log),
                lambda x: ref(x, y),
                logits,
                F32,
            )


# --------------------------------------------------------------------------------------------------
# plain loops over the formulas (float64)
# --------------------------------------------------------------------------------------------------
def _softmax(z: list[float]) -> list[float]:
    e = [math.exp(v - max(z)) for v in z]
    return [v / sum(e) for v in e]


def _loop(name: str, logits: torch.Tensor, y: torch.Tensor, **kw: Any) -> float:
    rows, ys = logits.tolist(), y.tolist()
    k, n = len(rows[0]), len(rows)
    total = 0.0
    if name == "qwk":
        p = [_softmax(r) for r in rows]
        om = [[(i - j) ** 2 / (k - 1) ** 2 for j in range(k)] for i in range(k)]
        nom = sum(om[i][ys[s]] * p[s][i] for s in range(n) for i in range(k))
        ha = [sum(p[s][i] for s in range(n)) for i in range(k)]
        hb = [sum(1.0 for s in range(n) if ys[s] == j) for j in range(k)]
        return nom / (sum(om[i][j] * ha[i] * hb[j] for i in range(k) for j in range(k)) / n + 1e-10)
    for z, t in zip(rows, ys):
        p = _softmax(z)
        if name == "cdw_ce":
            s = sum(math.exp(v) for v in z)
            total -= sum(
                abs(j - t) ** kw["alpha"] * math.log((s - math.exp(z[j]) + 1e-8) / (s + 1e-8)) for j in range(k)
            )
        elif name in ("sord", "slace"):
            q = _softmax([-kw["alpha"] * abs(j - t) for j in range(k)])
            if name == "sord":
                total -= sum(q[j] * math.log(p[j]) for j in range(k))
            else:
                acc = [sum(p[i] for i in range(k) if abs(i - t) <= abs(j - t)) for j in range(k)]
                total -= sum(q[j] * math.log(acc[j] + 1e-9) for j in range(k))
        elif name == "emd":
            total += sum((sum(p[: j + 1]) - (1.0 if j >= t else 0.0)) ** 2 for j in range(k))
        elif name == "mean_variance":
            m = sum(j * p[j] for j in range(k))
            v = sum(p[j] * (j - m) ** 2 for j in range(k))
            total += -math.log(p[t]) + kw["lambda_mean"] * (m - t) ** 2 / 2 + kw["lambda_variance"] * v
        elif name == "dldl":
            g = [math.exp(-((j - t) ** 2) / (2 * kw["sigma"] ** 2)) for j in range(k)]
            q = [v / sum(g) for v in g]
            kl = sum(q[j] * math.log(q[j] / p[j]) for j in range(k) if q[j] > 0)
            total += kl + kw["lambda_l1"] * abs(sum(j * p[j] for j in range(k)) - t)
    return total / n


_LOOP_CASES = [
    ("cdw_ce", cdw_ce_loss, {"alpha": 1.5}),
    ("sord", sord_loss, {"alpha": 2.0}),
    ("slace", slace_loss, {"alpha": 0.7}),
    ("emd", emd_loss, {}),
    ("qwk", qwk_loss, {}),
    ("mean_variance", mean_variance_loss, {"lambda_mean": 0.2, "lambda_variance": 0.05}),
    ("mean_variance", mean_variance_loss, {"lambda_mean": 1.3, "lambda_variance": 0.4}),
    ("dldl", dldl_loss, {"sigma": 2.0, "lambda_l1": 1.0}),
    ("dldl", dldl_loss, {"sigma": 0.7, "lambda_l1": 0.3}),
]


@pytest.mark.parametrize(("name", "fn", "kw"), _LOOP_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(_LOOP_CASES)])
@pytest.mark.parametrize("k", [3, 8])
def test_losses_equal_plain_loops(name: str, fn: Any, kw: dict, k: int) -> None:
    logits, y = _case(k, 7, k, torch.float64)
    assert math.isclose(float(fn(logits, y, **kw)), _loop(name, logits, y, **kw), rel_tol=1e-9)


@pytest.mark.parametrize(
    ("fn", "name", "kw"),
    [
        (mean_variance_loss, "mean_variance", {"lambda_mean": 0.2, "lambda_variance": 0.05}),
        (dldl_loss, "dldl", {"sigma": 2.0, "lambda_l1": 1.0}),
    ],
)
def test_mean_variance_and_dldl_gradients_equal_finite_differences_of_the_loop(fn: Any, name: str, kw: dict) -> None:
    logits, y = _case(6, 5, 7, torch.float64)
    x = logits.clone().requires_grad_()
    (grad,) = torch.autograd.grad(fn(x, y, **kw), x)
    h = 1e-6
    fd = torch.zeros_like(logits)
    for idx in range(logits.numel()):
        up, down = logits.clone(), logits.clone()
        up.view(-1)[idx] += h
        down.view(-1)[idx] -= h
        fd.view(-1)[idx] = (_loop(name, up, y, **kw) - _loop(name, down, y, **kw)) / (2 * h)
    torch.testing.assert_close(grad, fd, rtol=1e-5, atol=1e-7)


def test_dldl_is_the_gaussian_cross_entropy_minus_its_entropy() -> None:
    """The CVPR 2024 benchmark's DLDL-v2 (cross-entropy to the Gaussian + the expectation's L1 error)
    differs from this KL form by the targets' entropy: the same gradients."""
    logits, y = _case(9, 6, 1, torch.float64)
    cls = torch.arange(9, dtype=torch.float64)
    t = torch.softmax(-((cls - y[:, None].double()) ** 2) / 8.0, dim=-1)
    p = torch.softmax(logits, -1)
    ce_form = torch.nn.functional.cross_entropy(logits, t) + ((p * cls).sum(-1) - y).abs().mean()
    entropy = -(t * t.log()).sum(-1).mean()
    torch.testing.assert_close(dldl_loss(logits, y), ce_form - entropy, **F64)


# --------------------------------------------------------------------------------------------------
# decoders, registry, shapes and dtypes
# --------------------------------------------------------------------------------------------------
def test_decoders() -> None:
    logits = torch.tensor([[0.0, 3.0, 0.0], [1.0, 1.0, 1.0], [-5.0, 0.0, 9.0]])
    assert argmax_class(logits).tolist() == [1, 0, 2] and argmax_class(logits).dtype == torch.int64
    want = (torch.softmax(logits, -1) * torch.arange(3.0)).sum(-1)
    torch.testing.assert_close(expected_class(logits), want)
    assert expected_class(logits.half()).dtype == torch.float32
    assert expected_class(torch.zeros(2, 4, 5)).shape == (2, 4)


def test_registry_entries() -> None:
    names = ["cdw_ce", "unimodal_ce", "sord", "emd", "qwk", "slace", "mean_variance", "dldl"]
    for name in names:
        e = LOSSES.entry(name)
        assert e.inputs == {"logits": "logits", "targets": "classes"}
        assert e.ordinal is not None and e.ordinal.outputs == "classes" and e.ordinal.num_outputs(5) == 5
        want = expected_class if name in ("mean_variance", "dldl") else argmax_class
        assert e.ordinal.predict is want


def test_leading_dims_reductions_and_dtypes() -> None:
    logits, y = _case(4, 6, 0)
    lead, ylead = logits.reshape(2, 3, 4), y.reshape(2, 3)
    for fn, kw in ((cdw_ce_loss, {}), (unimodal_ce_loss, {"distribution": "poisson"}), (sord_loss, {}), (emd_loss, {}),
                   (slace_loss, {}), (mean_variance_loss, {}), (dldl_loss, {})):  # fmt: skip
        none = fn(lead, ylead, reduction="none", **kw)
        assert none.shape == (2, 3)
        torch.testing.assert_close(none.reshape(-1), fn(logits, y, reduction="none", **kw))
        torch.testing.assert_close(fn(lead, ylead, **kw), none.mean())
        torch.testing.assert_close(fn(lead, ylead, reduction="sum", **kw), none.sum())
        half = fn(logits.half(), y, **kw)
        assert half.dtype == torch.float32
        torch.testing.assert_close(half, fn(logits.half().float(), y, **kw))
    torch.testing.assert_close(qwk_loss(lead, ylead), qwk_loss(logits, y))


def test_module_twins() -> None:
    logits, y = _case(5, 6, 0)
    m = UnimodalCELoss(distribution="exponential", eta=0.5, p=2.0)
    assert "distribution='exponential'" in repr(m) and "p=2.0" in repr(m)
    torch.testing.assert_close(m(logits, y), unimodal_ce_loss(logits, y, distribution="exponential", eta=0.5, p=2.0))
    torch.testing.assert_close(DLDLLoss(sigma=1.0)(logits, y), dldl_loss(logits, y, sigma=1.0))


# --------------------------------------------------------------------------------------------------
# degenerate batches and errors
# --------------------------------------------------------------------------------------------------
_ALL: list[tuple[Any, dict[str, Any]]] = [
    (cdw_ce_loss, {"margin": 0.1}),
    (unimodal_ce_loss, {"distribution": "beta"}),
    (sord_loss, {"prox": True, "train_targets": torch.tensor([0, 1, 2, 3, 4, 4])}),
    (emd_loss, {}),
    (qwk_loss, {}),
    (slace_loss, {}),
    (mean_variance_loss, {}),
    (dldl_loss, {}),
]


@pytest.mark.parametrize(("fn", "kw"), _ALL, ids=[f.__name__ for f, _ in _ALL])
def test_degenerate_batches(fn: Any, kw: dict) -> None:
    empty = torch.zeros(0, 5, requires_grad=True)
    out = fn(empty, torch.zeros(0, dtype=torch.long), **kw)
    assert out.item() == 0.0
    out.backward()
    assert empty.grad is not None and empty.grad.shape == (0, 5)
    for logits, y in (
        (torch.randn(1, 5), torch.tensor([4])),
        (torch.randn(6, 5), torch.full((6,), 3)),  # one class only, the others absent
        (torch.tensor([[80.0, -80.0, 0.0, -80.0, -80.0]]), torch.tensor([4])),  # confident and wrong
    ):
        x = logits.clone().requires_grad_()
        out = fn(x, y, **kw)
        out.backward()
        assert torch.isfinite(out) and torch.isfinite(x.grad).all()  # type: ignore[arg-type]


def test_errors_name_the_argument() -> None:
    logits, y = _case(5, 4, 0)
    cases: list[tuple[Any, type[Exception], str]] = [
        (lambda: emd_loss(logits, torch.tensor([0, 1, 5, 2])), ValueError, "`targets` must hold classes in 0..4"),
        (lambda: emd_loss(logits, torch.tensor([0, -1, 3, 2])), ValueError, "`targets`"),
        (lambda: emd_loss(logits, y.float()), TypeError, "`targets` must be an integer tensor"),
        (lambda: emd_loss(logits, y[:3]), ValueError, "`targets` must have shape (4,)"),
        (lambda: emd_loss(logits[:, :1], torch.zeros(4, dtype=torch.long)), ValueError, "K >= 2"),
        (lambda: emd_loss(logits.long(), y), TypeError, "`logits`"),
        (lambda: unimodal_ce_loss(logits, y, distribution="gauss"), ValueError, "`distribution`"),
        (
            lambda: unimodal_ce_loss(logits, y, distribution="geometric", alpha=0.1),
            TypeError,
            "its options are: alphas",
        ),
        (lambda: unimodal_ce_loss(logits, y, distribution="binomial", p=0.1), TypeError, "its options are: none"),
        (lambda: unimodal_ce_loss(logits, y, distribution="geometric", alphas=1.0), ValueError, "`alphas`"),
        (lambda: unimodal_ce_loss(logits, y, distribution="general_triangular"), TypeError, "`alphas`"),
        (
            lambda: unimodal_ce_loss(logits, y, distribution="general_triangular", alphas=[0.1] * 9),
            ValueError,
            "10 entries",
        ),
        (lambda: unimodal_ce_loss(logits, y, distribution="triangular", alpha2=0.5), ValueError, "`alpha2`"),
        (lambda: unimodal_ce_loss(logits, y, distribution="binomial", eta=1.5), ValueError, "`eta`"),
        (lambda: unimodal_ce_loss(*_case(15, 4, 0), distribution="beta"), ValueError, "K in 3..14"),
        (lambda: sord_loss(logits, y, prox=True), ValueError, "`train_targets`"),
        (lambda: sord_loss(logits, y, prox=True, train_targets=torch.tensor([0, 1, 2, 4])), ValueError, "every class"),
        (lambda: sord_loss(logits, y, ftype="min"), ValueError, "`ftype`"),
        (lambda: cdw_ce_loss(logits, y, weight=torch.ones(4)), ValueError, "`weight` must have shape (5,)"),
        (lambda: cdw_ce_loss(logits, y, margin=-0.1), ValueError, "`margin`"),
        (lambda: qwk_loss(logits, y, penalization="cubic"), ValueError, "`penalization`"),
        (lambda: dldl_loss(logits, y, sigma=0.0), ValueError, "`sigma`"),
    ]
    for call, exc, text in cases:
        with pytest.raises(exc) as info:
            call()
        assert text in str(info.value), (text, str(info.value))
