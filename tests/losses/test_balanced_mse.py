"""Balanced MSE (Ren et al., CVPR'22): parity with a slow reference written from the paper's formulas,
the GAI integral against quadrature, the module, the label-density helpers and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import rankwise
from rankwise.imbalanced import bni_buckets, fit_label_gmm, get_lds_kernel_window
from rankwise.losses import BalancedMSELoss, balanced_mse_loss
from tests.conftest import gradcheck
from tests.registry_examples import case_entry


# --------------------------------------------------------------------------------------------------
# slow reference from the paper: explicit Gaussian densities (with their 2 pi constants), one sample
# at a time, float64; L_i = -log N(y_i; yhat_i, s2 I) + log I(yhat_i), times (2 s2) detached
# --------------------------------------------------------------------------------------------------
def _log_normal(x: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    d = x.numel()
    diff = x - mean
    return -0.5 * (diff @ torch.linalg.inv(cov) @ diff) - 0.5 * torch.logdet(cov) - 0.5 * d * math.log(2 * math.pi)


def ref_loss(pred, target, noise_var, method, gmm=None, centers=None, weights=None, reduction="mean"):
    p = pred.double().reshape(pred.shape[0], -1)
    t = target.double().reshape(target.shape[0], -1)
    b, d = p.shape
    eye = torch.eye(d, dtype=torch.float64)
    iso = noise_var * eye
    losses = []
    for i in range(b):
        nll = -_log_normal(t[i], p[i], iso)
        if method == "bmc":  # p_train = the batch's empirical label distribution
            dens = torch.stack([torch.exp(_log_normal(t[j], p[i], iso)) for j in range(b)]).mean()
        elif method == "gai":  # int N(y'; yhat, s2) sum_k phi_k N(y'; mu_k, S_k) dy'
            means, covs, phis = gmm
            dens = sum(phis[k] * torch.exp(_log_normal(p[i], means[k], covs[k] + iso)) for k in range(len(phis)))
        else:  # sum_b w_b N(c_b; yhat, s2)
            dens = sum(weights[k] * torch.exp(_log_normal(centers[k], p[i], iso)) for k in range(len(weights)))
        # for BMC the batch mean (1/B) shifts every sample's loss by log B: the paper's cross-entropy drops it
        ell = nll + torch.log(dens) + (math.log(b) if method == "bmc" else 0.0)
        losses.append(ell * (2 * noise_var).detach())
    out = torch.stack(losses) if losses else p.sum(-1)
    return {"mean": out.mean, "sum": out.sum, "none": lambda: out}[reduction]()


def _gmm(d: int, k: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(k, d, d, generator=g, dtype=torch.float64)
    covs = a @ a.mT / d + 0.3 * torch.eye(d, dtype=torch.float64)
    means = 2 * torch.randn(k, d, generator=g, dtype=torch.float64)
    phis = torch.softmax(torch.randn(k, generator=g, dtype=torch.float64), 0)
    return means, covs, phis


def _value_and_grads(fn, pred, target, noise_var):
    p = pred.clone().requires_grad_()
    v = noise_var.clone().requires_grad_()
    out = fn(p, target, v)
    gp, gv = torch.autograd.grad(out.sum(), (p, v))
    return out.detach(), gp, gv


CASES = [  # (method, d, reduction)
    ("bmc", 1, "mean"),
    ("bmc", 3, "none"),
    ("gai", 1, "mean"),
    ("gai", 2, "sum"),
    ("gai", 3, "none"),
    ("bni", 1, "mean"),
    ("bni", 2, "none"),
]


@pytest.mark.parametrize(("method", "d", "reduction"), CASES)
@pytest.mark.parametrize("var", [0.3, 4.0])
def test_matches_paper_reference(method: str, d: int, reduction: str, var: float) -> None:
    g = torch.Generator().manual_seed(3)
    pred = torch.randn(7, d, generator=g, dtype=torch.float64) * 2
    target = torch.randn(7, d, generator=g, dtype=torch.float64) * 2
    noise_var = torch.tensor(var, dtype=torch.float64)
    kw: dict = {"method": method, "reduction": reduction}
    rkw: dict = {"method": method, "reduction": reduction}
    if method == "gai":
        kw["gmm"] = rkw["gmm"] = _gmm(d)
    if method == "bni":
        centers = torch.randn(11, d, generator=g, dtype=torch.float64) * 2
        weights = torch.softmax(torch.randn(11, generator=g, dtype=torch.float64), 0)
        kw.update(bucket_centers=centers.squeeze(-1) if d == 1 else centers, bucket_weights=weights)
        rkw.update(centers=centers, weights=weights)
    got = _value_and_grads(lambda p, t, v: balanced_mse_loss(p, t, v, **kw), pred, target, noise_var)
    want = _value_and_grads(lambda p, t, v: ref_loss(p, t, v, **rkw), pred, target, noise_var)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["bmc", "gai", "bni"])
def test_one_dimensional_shapes_agree(method: str) -> None:
    """(B,) and (B, 1) predictions, and sklearn-shaped (K, 1), (K, 1, 1), (K,) GMMs or (K,) variances."""
    g = torch.Generator().manual_seed(4)
    pred, target = torch.randn(9, generator=g, dtype=torch.float64), torch.randn(9, generator=g, dtype=torch.float64)
    means, covs, phis = _gmm(1)
    kw: dict = {"method": method}
    if method == "gai":
        kw["gmm"] = (means, covs, phis)
    if method == "bni":
        kw.update(bucket_centers=torch.linspace(-2, 2, 5), bucket_weights=torch.full((5,), 0.2))
    want = balanced_mse_loss(pred.unsqueeze(-1), target.unsqueeze(-1), torch.tensor(0.5), **kw)
    torch.testing.assert_close(balanced_mse_loss(pred, target, torch.tensor(0.5), **kw), want)
    torch.testing.assert_close(balanced_mse_loss(pred, target, 0.5, **kw), want)
    if method == "gai":
        for gm in [(means.squeeze(-1), covs.reshape(3), phis), (means, covs.reshape(3, 1), phis)]:
            torch.testing.assert_close(balanced_mse_loss(pred, target, 0.5, method="gai", gmm=gm), want)


def test_gai_diagonal_and_isotropic_variances() -> None:
    g = torch.Generator().manual_seed(5)
    pred, target = (
        torch.randn(6, 2, generator=g, dtype=torch.float64),
        torch.randn(6, 2, generator=g, dtype=torch.float64),
    )
    means = torch.randn(3, 2, generator=g, dtype=torch.float64)
    diag = torch.rand(3, 2, generator=g, dtype=torch.float64) + 0.2
    phis = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    full = balanced_mse_loss(pred, target, 0.4, method="gai", gmm=(means, torch.diag_embed(diag), phis))
    torch.testing.assert_close(balanced_mse_loss(pred, target, 0.4, method="gai", gmm=(means, diag, phis)), full)
    iso = diag[:, 0]
    full_iso = balanced_mse_loss(
        pred, target, 0.4, method="gai", gmm=(means, torch.diag_embed(iso[:, None].expand(3, 2)), phis)
    )
    torch.testing.assert_close(balanced_mse_loss(pred, target, 0.4, method="gai", gmm=(means, iso, phis)), full_iso)


def test_gai_balancing_term_is_the_integral() -> None:
    """log int N(y'; yhat, s2) p_train(y') dy' by quadrature on a fine grid equals GAI's closed form."""
    means, covs, phis = _gmm(1)
    s2 = 0.6
    grid = torch.linspace(-30, 30, 200_001, dtype=torch.float64)
    p_train = sum(
        phis[k] * torch.exp(-0.5 * (grid - means[k, 0]) ** 2 / covs[k, 0, 0]) / torch.sqrt(2 * math.pi * covs[k, 0, 0])
        for k in range(3)
    )
    pred = torch.tensor([-3.0, 0.1, 2.5], dtype=torch.float64)
    target = pred.clone()  # zero error: the loss is the balancing term (plus 0.5 log s2), times 2 s2
    got = balanced_mse_loss(pred, target, s2, method="gai", gmm=(means, covs, phis), reduction="none")
    for i, yhat in enumerate(pred):
        kern = torch.exp(-0.5 * (grid - yhat) ** 2 / s2) / math.sqrt(2 * math.pi * s2)
        integral = torch.trapezoid(kern * p_train, grid)
        want = (0.5 * math.log(2 * math.pi * s2) + torch.log(integral)) * 2 * s2
        assert abs(float(got[i] - want)) < 1e-8


def test_bni_with_fine_buckets_approaches_gai() -> None:
    means, covs, phis = _gmm(1)
    centers = torch.linspace(-15, 15, 3001, dtype=torch.float64)
    dens = sum(
        phis[k] * torch.exp(-0.5 * (centers - means[k, 0]) ** 2 / covs[k, 0, 0]) / covs[k, 0, 0].sqrt()
        for k in range(3)
    )
    g = torch.Generator().manual_seed(6)
    pred, target = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    gai = balanced_mse_loss(pred, target, 0.5, method="gai", gmm=(means, covs, phis), reduction="none")
    bni = balanced_mse_loss(
        pred, target, 0.5, method="bni", bucket_centers=centers, bucket_weights=dens / dens.sum(), reduction="none"
    )
    # both are mse / 2 s2 + 0.5 log(2 pi s2) + log(integral): the bucket sum is a Riemann sum of GAI's integral
    torch.testing.assert_close(bni, gai, rtol=0, atol=1e-7)


def test_scale_is_detached() -> None:
    """d loss / d noise_var is that of the inner loss times 2 s2 (the scale is a constant in backward)."""
    g = torch.Generator().manual_seed(7)
    pred, target = (
        torch.randn(5, 1, generator=g, dtype=torch.float64),
        torch.randn(5, 1, generator=g, dtype=torch.float64),
    )
    v = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    (gv,) = torch.autograd.grad(balanced_mse_loss(pred, target, v), v)
    v2 = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    inner = balanced_mse_loss(pred, target, v2) / (2 * v2.detach())
    (gi,) = torch.autograd.grad(inner, v2)
    torch.testing.assert_close(gv, gi * 1.6)
    # the finite-difference derivative differs: it also differentiates the scale
    h = 1e-6
    fd = (balanced_mse_loss(pred, target, 0.8 + h) - balanced_mse_loss(pred, target, 0.8 - h)) / (2 * h)
    assert abs(float(fd - gv)) > 1e-3


@pytest.mark.parametrize("method", ["bmc", "gai", "bni"])
def test_gradcheck_pred(method: str) -> None:
    g = torch.Generator().manual_seed(8)
    pred, target = (
        torch.randn(5, 2, generator=g, dtype=torch.float64),
        torch.randn(5, 2, generator=g, dtype=torch.float64),
    )
    kw: dict = {"method": method}
    if method == "gai":
        kw["gmm"] = _gmm(2)
    if method == "bni":
        kw.update(
            bucket_centers=torch.randn(6, 2, generator=g, dtype=torch.float64), bucket_weights=torch.full((6,), 1 / 6)
        )
    assert gradcheck(lambda p: balanced_mse_loss(p, target, 0.7, reduction="none", **kw), pred)


def test_degenerate() -> None:
    var = torch.tensor(0.5, requires_grad=True)
    for method, kw in [
        ("bmc", {}),
        ("gai", {"gmm": _gmm(1)}),
        ("bni", {"bucket_centers": [0.0], "bucket_weights": [1.0]}),
    ]:
        empty = torch.zeros(0, 1, requires_grad=True)
        out = balanced_mse_loss(empty, torch.zeros(0, 1), var, method=method, **kw)
        assert out.item() == 0.0 and out.requires_grad
        out.backward()
        assert balanced_mse_loss(empty, torch.zeros(0, 1), var, method=method, reduction="none", **kw).shape == (0,)
    one = torch.tensor([[0.3]], requires_grad=True)
    out = balanced_mse_loss(one, torch.tensor([[2.0]]), var)  # BMC of a single sample: nothing to contrast
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert one.grad is not None and one.grad.item() == 0.0
    # far predictions in float32 stay finite (log-sum-exp)
    far = torch.full((4, 1), 1e3, requires_grad=True)
    for method, kw in [
        ("bmc", {}),
        ("gai", {"gmm": _gmm(1)}),
        ("bni", {"bucket_centers": [0.0, 1.0], "bucket_weights": [0.5, 0.5]}),
    ]:
        out = balanced_mse_loss(far, torch.zeros(4, 1), torch.tensor(0.01), method=method, **kw)
        out.backward()
        assert torch.isfinite(out) and torch.isfinite(far.grad).all()


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_computed_in_float32(half: torch.dtype) -> None:
    pred, target = torch.randn(6, 1), torch.randn(6, 1)
    out = balanced_mse_loss(pred.to(half), target.to(half), torch.tensor(0.5, dtype=half))
    assert out.dtype == torch.float32
    want = balanced_mse_loss(pred.to(half).float(), target.to(half).float(), torch.tensor(0.5, dtype=half).float())
    torch.testing.assert_close(out, want)


# --------------------------------------------------------------------------------------------------
# module
# --------------------------------------------------------------------------------------------------
def test_module_holds_sigma_and_buffers() -> None:
    pytest.importorskip("sklearn.mixture")
    gmm = fit_label_gmm(torch.randn(200, dtype=torch.float64), n_components=2)
    crit = BalancedMSELoss(2.0, method="gai", gmm=gmm)
    assert [n for n, _ in crit.named_parameters()] == ["noise_sigma"]
    assert crit.noise_sigma.requires_grad and float(crit.noise_var.detach()) == 4.0
    assert {"gmm_means", "gmm_variances", "gmm_weights"} <= set(crit.state_dict())
    pred, target = torch.randn(8, 1, requires_grad=True), torch.randn(8, 1)
    torch.testing.assert_close(
        crit(pred, target), balanced_mse_loss(pred, target, torch.tensor(4.0), method="gai", gmm=gmm)
    )
    # the reference trains sigma in its own param group (sigma_lr)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD([{"params": model.parameters()}, {"params": [crit.noise_sigma], "lr": 1e-2}], lr=1e-4)
    x = torch.randn(8, 1)
    crit(model(x), target).backward()
    assert crit.noise_sigma.grad is not None and crit.noise_sigma.grad.abs() > 0
    before = float(crit.noise_sigma.detach())
    opt.step()
    assert float(crit.noise_sigma.detach()) != before
    frozen = BalancedMSELoss(1.0, learnable=False)
    assert not frozen.noise_sigma.requires_grad
    assert "method='bmc', learnable=False" in repr(frozen)
    # noise_var passed to forward overrides sigma**2
    torch.testing.assert_close(
        frozen(pred, target, torch.tensor(0.3)), balanced_mse_loss(pred, target, torch.tensor(0.3))
    )


def test_module_bni_and_state_dict_roundtrip() -> None:
    centers, weights = bni_buckets(torch.randint(0, 10, (100,)))
    crit = BalancedMSELoss(1.5, method="bni", bucket_centers=centers, bucket_weights=weights)
    other = BalancedMSELoss(1.0, method="bni", bucket_centers=torch.zeros_like(centers), bucket_weights=weights)
    other.load_state_dict(crit.state_dict())
    pred, target = torch.randn(8, 1), torch.randn(8, 1)
    torch.testing.assert_close(other(pred, target), crit(pred, target))
    assert crit.double()(pred.double(), target.double()).dtype == torch.float64


# --------------------------------------------------------------------------------------------------
# label-density helpers
# --------------------------------------------------------------------------------------------------
def test_fit_label_gmm_matches_sklearn_and_recovers_components() -> None:
    mixture = pytest.importorskip("sklearn.mixture")
    g = torch.Generator().manual_seed(9)
    y = torch.cat([torch.randn(300, generator=g) * 0.5, 8 + torch.randn(100, generator=g)]).double()
    means, covs, weights = fit_label_gmm(y, n_components=2)
    assert means.shape == (2, 1) and covs.shape == (2, 1, 1) and weights.shape == (2,)
    order = means[:, 0].argsort()
    torch.testing.assert_close(means[order, 0], torch.tensor([0.0, 8.0], dtype=torch.float64), atol=0.2, rtol=0)
    torch.testing.assert_close(weights[order], torch.tensor([0.75, 0.25], dtype=torch.float64), atol=1e-3, rtol=0)
    ref = mixture.GaussianMixture(n_components=2, random_state=0).fit(y.numpy().reshape(-1, 1))
    np.testing.assert_allclose(means.numpy(), ref.means_)
    np.testing.assert_allclose(covs.numpy(), ref.covariances_)
    y2 = torch.randn(200, 2, generator=g).double()
    m2, c2, w2 = fit_label_gmm(y2, n_components=3, max_iter=50)
    assert m2.shape == (3, 2) and c2.shape == (3, 2, 2) and float(w2.sum()) == pytest.approx(1.0)
    loss = balanced_mse_loss(torch.randn(4, 2), torch.randn(4, 2), 1.0, method="gai", gmm=(m2, c2, w2))
    assert torch.isfinite(loss)


def test_fit_label_gmm_errors() -> None:
    pytest.importorskip("sklearn.mixture")
    with pytest.raises(ValueError, match=r"at least n_components=8 labels"):
        fit_label_gmm(torch.arange(5.0))
    with pytest.raises(ValueError, match=r"`labels` must be finite"):
        fit_label_gmm(torch.tensor([1.0, float("nan")] * 10), n_components=2)
    with pytest.raises(ValueError, match=r"`n_components` must be a positive int, got 0"):
        fit_label_gmm(torch.arange(10.0), n_components=0)
    with pytest.raises(ValueError, match=r"`covariance_type` must be 'full'"):
        fit_label_gmm(torch.arange(10.0), n_components=2, covariance_type="diag")


def _ref_bucket_info(labels, max_target=121, lds=False, kernel="gaussian", ks=5, sigma=2.0):
    """The authors' get_bucket_info, written out: integer ages below max_target, counts, LDS, drop empty."""
    ndimage = pytest.importorskip("scipy.ndimage")
    counts = {k: 0 for k in range(max_target)}
    for label in labels:
        if int(label) < max_target:
            counts[int(label)] += 1
    centers = np.arange(max_target)
    w = np.array([counts[k] for k in range(max_target)], dtype=float)
    if lds:
        w = ndimage.convolve1d(w, weights=get_lds_kernel_window(kernel, ks, sigma).numpy(), mode="constant")
    keep = w > 0
    return centers[keep].astype(float), w[keep] / w[keep].sum()


@pytest.mark.parametrize("lds", [False, True])
def test_bni_buckets_match_the_reference_for_integer_labels(lds: bool) -> None:
    g = torch.Generator().manual_seed(10)
    ages = torch.cat([torch.randint(20, 40, (300,), generator=g), torch.randint(0, 100, (40,), generator=g)])
    want_c, want_w = _ref_bucket_info(ages.tolist(), lds=lds)
    got_c, got_w = bni_buckets(ages, label_range=(0, 121), lds=lds)
    np.testing.assert_allclose(got_c.numpy(), want_c)
    np.testing.assert_allclose(got_w.numpy(), want_w, rtol=1e-12)
    if not lds:  # data-driven bins give the same buckets (empty ones are dropped either way)
        c2, w2 = bni_buckets(ages.double())
        np.testing.assert_allclose(c2.numpy(), want_c)
        np.testing.assert_allclose(w2.numpy(), want_w)


def test_bni_buckets_continuous_labels() -> None:
    y = torch.tensor([0.71, 0.75, 0.79, 1.52, 1.55, 3.0])
    c, w = bni_buckets(y, bin_width=0.5, centers="mid")
    torch.testing.assert_close(c, torch.tensor([0.75, 1.75, 3.25], dtype=torch.float64))
    torch.testing.assert_close(w, torch.tensor([0.5, 2 / 6, 1 / 6], dtype=torch.float64))
    c, w = bni_buckets(y, bins=[0.0, 1.0, 2.0, 4.0])
    torch.testing.assert_close(c, torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64))
    c, _ = bni_buckets(y, bins=[0.0, 1.0, 2.0, 4.0], centers="mid")
    torch.testing.assert_close(c, torch.tensor([0.5, 1.5, 3.0], dtype=torch.float64))
    c, _ = bni_buckets(np.array([-1.2, -0.4]), bin_width=0.5)
    torch.testing.assert_close(c, torch.tensor([-1.5, -0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"`labels` must hold at least one training label"):
        bni_buckets([])
    with pytest.raises(ValueError, match=r"`centers` must be one of 'left', 'mid'; got 'right'"):
        bni_buckets(y, centers="right")


# --------------------------------------------------------------------------------------------------
# registry and errors
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["balanced_mse.bmc", "balanced_mse.gai", "balanced_mse.bni", "balanced_mse.bmc_3d", "balanced_mse.gai_2d"]
)
def test_registry_entries(name: str) -> None:
    assert name.partition(".")[0] in rankwise.list_losses()  # a test variant of the entry
    entry = case_entry("loss", name)
    assert entry.module is BalancedMSELoss and entry.fn is balanced_mse_loss


def test_bad_inputs() -> None:
    p, t = torch.randn(4, 1), torch.randn(4, 1)
    with pytest.raises(ValueError, match=r"`method` must be one of 'bmc', 'gai', 'bni'; got 'bnn'"):
        balanced_mse_loss(p, t, 1.0, method="bnn")
    with pytest.raises(ValueError, match=r"`gmm` is required for method='gai'"):
        balanced_mse_loss(p, t, 1.0, method="gai")
    with pytest.raises(ValueError, match=r"`bucket_centers` and `bucket_weights` are required"):
        balanced_mse_loss(p, t, 1.0, method="bni", bucket_centers=[0.0])
    with pytest.raises(ValueError, match=r"`target` must have the shape of `pred` \(4, 1\), got \(4,\)"):
        balanced_mse_loss(p, t.squeeze(-1), 1.0)
    with pytest.raises(ValueError, match=r"`pred` must have shape \(B,\) or \(B, d\), got \(2, 2, 1\)"):
        balanced_mse_loss(p.reshape(2, 2, 1), t.reshape(2, 2, 1), 1.0)
    with pytest.raises(ValueError, match=r"`noise_var` must be a scalar \(one element\), got shape \(2,\)"):
        balanced_mse_loss(p, t, torch.ones(2))
    with pytest.raises(ValueError, match=r"`noise_var` must be finite and > 0, got -1.0"):
        balanced_mse_loss(p, t, -1.0)
    with pytest.raises(TypeError, match=r"`pred` must be a floating-point tensor"):
        balanced_mse_loss(torch.ones(4, 1, dtype=torch.long), t, 1.0)
    with pytest.raises(TypeError, match=r"`gmm` must be a \(means, variances, weights\) tuple"):
        balanced_mse_loss(p, t, 1.0, method="gai", gmm={"means": 0})
    with pytest.raises(ValueError, match=r"`gmm` means must have shape \(2, 1\)"):
        balanced_mse_loss(p, t, 1.0, method="gai", gmm=(torch.zeros(3, 1), torch.ones(2), torch.ones(2) / 2))
    with pytest.raises(ValueError, match=r"`gmm` variances must have shape \(2, 1, 1\)"):
        balanced_mse_loss(p, t, 1.0, method="gai", gmm=(torch.zeros(2, 1), torch.ones(3), torch.ones(2) / 2))
    with pytest.raises(ValueError, match=r"`bucket_centers` must have shape \(2,\) or \(2, 1\)"):
        balanced_mse_loss(p, t, 1.0, method="bni", bucket_centers=[0.0, 1.0, 2.0], bucket_weights=[0.5, 0.5])
    with pytest.raises(ValueError, match=r"`init_noise_sigma` must be finite and > 0, got 0"):
        BalancedMSELoss(0)
    with pytest.raises(ValueError, match=r"`gmm` is required for method='gai'"):
        BalancedMSELoss(method="gai")
    with pytest.raises(TypeError, match=r"`learnable` must be a bool, got int"):
        BalancedMSELoss(learnable=1)


def test_module_fits_gmm_and_buckets_from_train_labels():
    """``train_labels`` builds GAI's GMM and BNI's buckets exactly as the public helpers would."""
    pytest.importorskip("sklearn")
    from rankwise.imbalanced import bni_buckets, fit_label_gmm

    g = torch.Generator().manual_seed(3)
    labels = torch.cat([torch.randn(300, generator=g) * 2 + 8, torch.randn(100, generator=g) + 15]).round() + 0.5
    gai = BalancedMSELoss(1.0, method="gai", train_labels=labels, gmm_components=3)
    means, variances, weights = fit_label_gmm(labels, n_components=3)
    torch.testing.assert_close(gai.gmm_means, means)
    torch.testing.assert_close(gai.gmm_variances, variances)
    torch.testing.assert_close(gai.gmm_weights, weights)
    bni = BalancedMSELoss(1.0, method="bni", train_labels=labels, bucket_center="mid")
    centers, bucket_w = bni_buckets(labels, bin_width=1.0, centers="mid")
    torch.testing.assert_close(bni.bucket_centers, centers)
    torch.testing.assert_close(bni.bucket_weights, bucket_w)
    assert set(bni.bucket_centers.tolist()) == set(labels.unique().tolist())  # centres = the x.5 labels
    pred, target = torch.randn(16, 1, generator=g), labels[:16, None]
    explicit = BalancedMSELoss(1.0, method="gai", gmm=(means, variances, weights))
    torch.testing.assert_close(gai(pred, target), explicit(pred, target))
    bmc = BalancedMSELoss(1.0, method="bmc", train_labels=labels)  # ignored for BMC
    assert bmc.gmm_means is None and bmc.bucket_centers is None
    with pytest.raises(ValueError, match=r"`bucket_width` must be finite and > 0, got 0"):
        BalancedMSELoss(method="bni", train_labels=labels, bucket_width=0)
    with pytest.raises(ValueError, match=r"`gmm` is required for method='gai'.*or pass `train_labels`"):
        BalancedMSELoss(method="gai")
    with pytest.raises(ValueError, match=r"`train_labels` \(GAI fit\): `labels` must be finite, got NaN or inf"):
        BalancedMSELoss(method="gai", train_labels=[float("nan"), 1.0, 2.0] * 5, gmm_components=2)
    with pytest.raises(ValueError, match=r"`train_labels` \(BNI fit\): `labels` must hold at least one training label"):
        BalancedMSELoss(method="bni", train_labels=[])
    with pytest.raises(TypeError, match=r"`train_labels` \(BNI fit\): `labels` must be a tensor, array or sequence"):
        BalancedMSELoss(method="bni", train_labels="abc")


# --------------------------------------------------------------------------------------------------
# mixture validation and the weight normalisation rule
# --------------------------------------------------------------------------------------------------
def test_gai_refuses_invalid_mixtures() -> None:
    p, t = torch.randn(4, 1, dtype=torch.float64), torch.randn(4, 1, dtype=torch.float64)
    means = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    good_var = torch.tensor([0.5, 2.0], dtype=torch.float64)
    good_w = torch.tensor([0.7, 0.3], dtype=torch.float64)
    cases = [
        ((means, torch.tensor([-0.5, 2.0], dtype=torch.float64), good_w), r"`gmm` variances must be > 0.*-0\.5"),
        ((means, torch.tensor([0.0, 2.0], dtype=torch.float64), good_w), r"`gmm` variances must be > 0"),
        ((means, good_var, torch.tensor([-0.1, 1.1], dtype=torch.float64)), r"`gmm` weights must be >= 0.*-0\.1"),
        ((means, good_var, torch.zeros(2, dtype=torch.float64)), r"`gmm` weights must have a positive sum.*0"),
        # a full covariance that is not positive definite
        (
            (torch.zeros(2, 2), torch.tensor([[[1.0, 2.0], [2.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]]), good_w.float()),
            r"`gmm` variances .*positive definite.*component 0",
        ),
    ]
    for gmm, match in cases:
        pp, tt = (p, t) if gmm[0].shape[-1] == 1 else (torch.randn(4, 2), torch.randn(4, 2))
        with pytest.raises(ValueError, match=match):
            balanced_mse_loss(pp, tt, 1.0, method="gai", gmm=gmm)
        with pytest.raises(ValueError, match=match):
            BalancedMSELoss(1.0, method="gai", gmm=gmm)(pp, tt)


def test_gai_weights_are_normalised_to_sum_one() -> None:
    """Weights summing to 0.6 give the loss of the same mixture normalised (the documented rule),
    not a loss shifted by 2 sigma^2 log 0.6."""
    g = torch.Generator().manual_seed(4)
    p = torch.randn(5, 1, generator=g, dtype=torch.float64)
    t = torch.randn(5, 1, generator=g, dtype=torch.float64)
    means = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    var = torch.tensor([0.5, 2.0], dtype=torch.float64)
    w = torch.tensor([0.4, 0.2], dtype=torch.float64)
    got = balanced_mse_loss(p, t, 0.8, method="gai", gmm=(means, var, w), reduction="none")
    want = ref_loss(
        p,
        t,
        torch.tensor(0.8, dtype=torch.float64),
        "gai",
        gmm=(means, var[:, None, None], w / w.sum()),
        reduction="none",
    )
    torch.testing.assert_close(got, want)


def test_bni_refuses_invalid_buckets_and_normalises() -> None:
    p, t = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    c = [0.0, 1.0]
    with pytest.raises(ValueError, match=r"`bucket_weights` must be >= 0.*-0\.5"):
        balanced_mse_loss(p, t, 1.0, method="bni", bucket_centers=c, bucket_weights=[-0.5, 1.5])
    with pytest.raises(ValueError, match=r"`bucket_weights` must have a positive sum"):
        balanced_mse_loss(p, t, 1.0, method="bni", bucket_centers=c, bucket_weights=[0.0, 0.0])
    got = balanced_mse_loss(p, t, 1.0, method="bni", bucket_centers=c, bucket_weights=[1.0, 1.0], reduction="none")
    cen = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    want = ref_loss(
        p,
        t,
        torch.tensor(1.0, dtype=torch.float64),
        "bni",
        centers=cen,
        weights=torch.tensor([0.5, 0.5]),
        reduction="none",
    )
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_magnitudes_stay_finite_where_the_loss_is_representable(dtype: torch.dtype) -> None:
    """A prediction of 1e20 against targets near 0: the squared differences (1e40) overflow float32,
    and in float64 they absorb the targets' differences, but the losses do not: written as
    differences of squares, (y_j - y_i)(2 yhat - y_i - y_j), they are (sigma^2 = 1)
    BMC 2 * 2e20, BNI 2 * (1e20 + log 0.5) and GAI 1e40 * v / (1 + v) for one component of variance v."""
    pred = torch.tensor([[1e20], [0.0], [1.0]], dtype=dtype, requires_grad=True)
    target = torch.tensor([[0.0], [1.0], [2.0]], dtype=dtype)
    bmc = balanced_mse_loss(pred, target, 1.0, reduction="none")
    assert bmc[0].item() == pytest.approx(4e20, rel=1e-6)
    bni = balanced_mse_loss(
        pred, target, 1.0, method="bni", bucket_centers=[0.0, 1.0], bucket_weights=[0.5, 0.5], reduction="none"
    )
    assert bni[0].item() == pytest.approx(2e20, rel=1e-6)
    gmm = (torch.zeros(1, 1, dtype=dtype), torch.tensor([0.01], dtype=dtype), torch.ones(1, dtype=dtype))
    gai = balanced_mse_loss(pred[:1], torch.zeros(1, 1, dtype=dtype), 1.0, method="gai", gmm=gmm, reduction="none")
    # + 2 sigma^2 (-0.5 log(1 + v)): negligible here
    assert gai[0].item() == pytest.approx(1e40 * 0.01 / 1.01, rel=1e-4 if dtype == torch.float32 else 1e-9)
    (bmc.sum() + bni.sum() + gai.sum()).backward()
    assert pred.grad is not None and torch.isfinite(pred.grad).all()
    # the other samples are unchanged by the large one's presence (their logits are finite)
    small = balanced_mse_loss(pred[1:].detach().double(), target[1:].double(), 1.0, reduction="none")
    assert torch.isfinite(bmc[1:]).all() and (bmc[1:].double() >= small - 1e-6).all()


@pytest.mark.parametrize("method", ["gai", "bni"])
def test_unrepresentable_loss_is_inf_not_nan(method: str) -> None:
    """float32: a loss beyond the dtype's range is +-inf (not NaN from inf - inf); GAI: 2.5e39, BNI: -1.5e40."""
    pred, target = torch.tensor([1e20, 0.0]), torch.tensor([0.0, 1.0])
    kw: dict = {"gmm": (torch.zeros(1, 1), torch.ones(1), torch.ones(1))} if method == "gai" else {}
    if method == "bni":
        kw = {"bucket_centers": [-1e20, -2e20], "bucket_weights": [0.5, 0.5]}
    got = balanced_mse_loss(pred, target, 1.0, method=method, reduction="none", **kw)
    assert got[0].item() == (math.inf if method == "gai" else -math.inf) and not torch.isnan(got).any()
