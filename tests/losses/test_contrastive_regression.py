"""Rank-N-Contrast and ConR against O(N^3) / per-anchor loops written from the papers' formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rankwise.losses import ConRLoss, RnCLoss, conr_loss, get_loss_entry, rnc_loss
from tests.conftest import gradcheck


def _feats(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()


def _views(features):
    x = features if features.dim() == 3 else features[:, None]
    b, v, _ = x.shape
    return [x[bi, vi] for vi in range(v) for bi in range(b)], [bi for vi in range(v) for bi in range(b)]


def slow_rnc(features, labels, temperature=2.0):
    """The definition, literally: a triple loop over anchors i, positives j and candidates k."""
    z, sample = _views(features)
    y = labels.to(torch.float64).reshape(labels.shape[0], -1)
    n = len(z)

    def ld(i, k):
        return (y[sample[i]] - y[sample[k]]).abs().sum()

    total = features.sum() * 0
    for i in range(n):
        for j in range(n):
            if j == i:
                continue
            s_ij = -torch.linalg.vector_norm(z[i] - z[j]) / temperature
            den = [
                -torch.linalg.vector_norm(z[i] - z[k]) / temperature
                for k in range(n)
                if k != i and ld(i, k) >= ld(i, j)
            ]
            total = total - (s_ij - torch.logsumexp(torch.stack(den), 0))
    return total / max(n * (n - 1), 1)


@pytest.mark.parametrize(
    "labels",
    [
        torch.tensor([0.3, 1.7, 2.2, 0.9, 5.0]),  # distinct
        torch.tensor([1, 2, 1, 2, 1]),  # many ties (integer labels)
        torch.tensor([3.0, 3.0, 3.0, 3.0, 3.0]),  # all tied
        torch.tensor([0.0, 2.0, 4.0, 1.0, 3.0]),  # symmetric distances: ties across sides of the anchor
    ],
    ids=["distinct", "ties", "all-tied", "symmetric"],
)
@pytest.mark.parametrize("views", [1, 2])
def test_rnc_parity_values_and_gradients(labels, views):
    x = _feats(5, views, 3, seed=views)
    got = rnc_loss(x, labels, temperature=0.7)
    want = slow_rnc(x, labels, temperature=0.7)
    torch.testing.assert_close(got, want)
    (g1,) = torch.autograd.grad(got, x)
    (g2,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(g1, g2)


def test_rnc_multidim_labels_and_trailing_dim():
    x = _feats(4, 2, 3)
    y2 = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [2.0, 1.0]])
    torch.testing.assert_close(rnc_loss(x, y2), slow_rnc(x, y2))
    y = torch.tensor([1.0, 0.0, 1.0, 4.0])
    torch.testing.assert_close(rnc_loss(x, y[:, None]), rnc_loss(x, y))


def test_rnc_gradcheck_with_ties():
    x = _feats(4, 2, 3)
    assert gradcheck(lambda t: rnc_loss(t, torch.tensor([1, 0, 1, 1])), x)
    assert gradcheck(lambda t: rnc_loss(t, torch.tensor([0.1, 0.5, 0.2, 0.9]), temperature=0.5), x)


def test_rnc_degenerate_and_half():
    one = _feats(1, 2, 4)
    loss = rnc_loss(one, torch.tensor([2.0]))  # two views, one pair each: -log(1) = 0
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-12) and torch.isfinite(one.grad).all()
    assert rnc_loss(_feats(0, 2, 3), torch.zeros(0)).item() == 0.0
    same = torch.ones(3, 2, 4, requires_grad=True)  # identical views: zero distances
    rnc_loss(same, torch.tensor([0.0, 1.0, 2.0])).backward()
    assert torch.isfinite(same.grad).all()
    h = _feats(16, 2, 8, dtype=torch.float16)
    y = torch.arange(16) % 5
    out = rnc_loss(h, y)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, rnc_loss(h.detach().float(), y), rtol=1e-3, atol=1e-3)


def test_rnc_larger_batch_parity_with_column_loop():
    """B = 24 (N = 48) against a loop over positive columns (the O(N^3) public-code structure)."""
    x = _feats(24, 2, 6, seed=5)
    y = torch.randint(0, 6, (24,), generator=torch.Generator().manual_seed(2)).double()
    z = x.transpose(0, 1).reshape(48, 6)
    yy = y.repeat(2)
    s = -torch.cdist(z, z) / 2.0
    ld = (yy[:, None] - yy[None, :]).abs()
    off = ~torch.eye(48, dtype=torch.bool)
    total = 0
    for j in range(48):
        den_mask = (ld >= ld[:, j : j + 1]) & off
        lse = torch.logsumexp(s.masked_fill(~den_mask, -float("inf")), 1)
        total = total + ((lse - s[:, j]) * off[:, j]).sum()
    torch.testing.assert_close(rnc_loss(x, y), total / (48 * 47))


def _rnc_label_cases(g):
    b = 13
    special = torch.randint(-2, 3, (b,), generator=g).double()
    special[[1, 4, 7, 8]] = torch.tensor([float("nan"), float("inf"), -float("inf"), float("nan")], dtype=torch.float64)
    return [
        torch.randint(0, 4, (b,), generator=g),  # integer labels: many ties
        torch.randn(b, generator=g),
        1e6 + torch.rand(b, generator=g) * 1e-3,  # float32 distances that collide
        special,
        torch.full((b,), 1.5),
        torch.randint(0, 3, (b, 2), generator=g).double(),  # two label dims (L1 distance): sorted rows
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rnc_cpu_kernels_match_the_pytorch_path(dtype, monkeypatch):
    """On CPU the prefix log-sum-exps and their gradient come from numba kernels (the label order
    from merging two label-sorted runs); on other devices from sorts and logcumsumexp: same values
    and gradients, also for the anchor subsets of the distributed case."""
    from rankwise.losses import _regression_contrastive as rc

    g = torch.Generator().manual_seed(0)
    x = _feats(13, 2, 5, seed=4, dtype=dtype)
    for y in _rnc_label_cases(g):
        for rows in (None, torch.tensor([3, 20, 0, 25, 7])):

            def run(use_kernels, y=y, rows=rows):
                monkeypatch.setattr(rc.kernels, "ready", (lambda: True) if use_kernels else (lambda: False))
                if rows is None:
                    loss = rnc_loss(x, y, temperature=0.6)
                else:  # what one rank computes: its anchors against every view
                    monkeypatch.setattr(rc, "_global_views", lambda t, _: (t, _FakeLayout(rows)))
                    monkeypatch.setattr(rc, "all_gather_no_grad", lambda t, sizes: t)
                    monkeypatch.setattr(rc, "local_view_rows", lambda layout, v, dev: rows)
                    loss = rnc_loss(x, y, temperature=0.6, distributed=True)
                (grad,) = torch.autograd.grad(loss, x)
                return loss, grad

            fast, g_fast = run(True)
            assert rc.kernels.FAMILY.loaded, "the numba kernels ran"
            slow, g_slow = run(False)
            if torch.isnan(slow):
                assert torch.isnan(fast)
                continue
            torch.testing.assert_close(fast, slow)
            torch.testing.assert_close(g_fast, g_slow)


class _FakeLayout:
    def __init__(self, rows):
        self.total, self.world_size, self.rows = 13, 1, rows


def slow_conr(
    features, labels, preds, weights=None, *, window=1.0, temperature=0.2, eta=0.01, variant="in", normalize=True
):
    x = features if features.dim() == 3 else features[:, None]
    if normalize:
        x = F.normalize(x, dim=-1)
    b, v, _ = x.shape
    z, sample = _views(x)
    pr = preds.reshape(b, -1).expand(b, v) if preds.numel() == b else preds
    yhat = [pr[sample[i], i // b] for i in range(len(z))]
    w = torch.ones(b, dtype=torch.float64) if weights is None else weights.reshape(-1)
    n = len(z)
    total = features.sum() * 0
    for j in range(n):
        yj = labels[sample[j]]
        pos = [i for i in range(n) if i != j and abs(labels[sample[i]] - yj) <= window]
        neg = [q for q in range(n) if abs(labels[sample[q]] - yj) > window and abs(yhat[q] - yhat[j]) <= window]
        if not pos or not neg:
            continue
        den = sum(torch.exp(z[j] @ z[p] / temperature) for p in pos)
        den = den + sum(
            w[sample[j]] * torch.exp(eta * abs(labels[sample[q]] - yj)) * torch.exp(z[j] @ z[q] / temperature)
            for q in neg
        )
        ratios = [torch.exp(z[j] @ z[i] / temperature) / den for i in pos]
        if variant == "in":
            total = total - torch.log(sum(ratios) / len(pos))
        else:
            total = total - sum(torch.log(r) for r in ratios) / len(pos)
    return total / n


Y = torch.tensor([1.0, 1.5, 4.0, 4.2, 9.0, 2.0, 2.8])
YHAT = torch.tensor([1.2, 3.5, 3.9, 4.0, 8.0, 2.5, 1.9])


@pytest.mark.parametrize("variant", ["in", "out"])
@pytest.mark.parametrize("views", [1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_conr_parity(variant, views, weighted):
    x = _feats(7, views, 4, seed=views)
    w = torch.tensor([1.0, 2.0, 0.5, 1.0, 1.5, 1.0, 3.0]).double() if weighted else None
    kw = {"window": 1.0, "temperature": 0.3, "eta": 0.5, "variant": variant}
    got = conr_loss(x, Y, YHAT, weights=w, **kw)
    want = slow_conr(x, Y, YHAT, w, **kw)
    torch.testing.assert_close(got, want)
    (g1,) = torch.autograd.grad(got, x)
    (g2,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(g1, g2)


def test_conr_per_view_preds_and_unnormalized():
    x = _feats(7, 2, 4)
    pv = torch.stack([YHAT, YHAT + torch.tensor([0.0, -2.0, 0.5, 0.0, 3.0, 0.0, 1.0])], 1)
    torch.testing.assert_close(conr_loss(x, Y, pv), slow_conr(x, Y, pv))
    torch.testing.assert_close(
        conr_loss(x, Y, YHAT, normalize=False, temperature=2.0), slow_conr(x, Y, YHAT, normalize=False, temperature=2.0)
    )
    torch.testing.assert_close(conr_loss(x, Y[:, None], YHAT[:, None]), conr_loss(x, Y, YHAT))


def test_conr_gradcheck():
    x = _feats(7, 2, 3)
    w = torch.tensor([1.0, 2.0, 0.5, 1.0, 1.5, 1.0, 3.0]).double()
    assert gradcheck(lambda t: conr_loss(t, Y, YHAT, weights=w, temperature=0.5), x)
    assert gradcheck(lambda t: conr_loss(t, Y, YHAT, variant="out", eta=0.2), x)


def test_conr_differs_from_public_code_where_documented():
    x = _feats(7, 2, 4)
    # the temperature argument is used (the public code hard-codes 0.07)
    assert conr_loss(x, Y, YHAT, temperature=0.2).item() != pytest.approx(
        conr_loss(x, Y, YHAT, temperature=0.07).item()
    )
    # no positives anywhere (distinct labels, one view) -> 0, not NaN
    far = torch.tensor([0.0, 10.0, 20.0])
    one = _feats(3, 4)
    loss = conr_loss(one, far, torch.zeros(3))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(one.grad, torch.zeros_like(one))
    # perfect predictions -> no negatives -> 0
    assert conr_loss(x, Y, Y, window=0.1).item() == 0.0


def test_conr_half_and_weights_zero():
    h = _feats(7, 2, 4, dtype=torch.bfloat16)
    out = conr_loss(h, Y, YHAT)
    # computed in float32 from the bfloat16 values (exactly representable in float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, conr_loss(h.detach().float(), Y.float(), YHAT.float()), rtol=1e-5, atol=1e-6)
    x = _feats(7, 2, 4)
    # weight 0 removes every negative from the denominators: D_j is the positives' sum, so the L_in
    # term of an anchor is -log(1/|K+_j|) = log |K+_j| whatever the features, and the gradient is 0
    out = conr_loss(x, Y, YHAT, weights=torch.zeros(7))
    out.backward()
    # (only anchors with a positive and a negative count; the mean is over all 14 views)
    y, yp = Y.to(torch.float64).repeat(2), YHAT.to(torch.float64).repeat(2)  # the 2 x 7 views, view-major
    far = (y[:, None] - y[None, :]).abs() > 1.0
    pos = ~far & ~torch.eye(14, dtype=torch.bool)
    neg = far & ((yp[:, None] - yp[None, :]).abs() <= 1.0)
    k = pos.sum(1).double()
    want = torch.where((k > 0) & neg.any(1), k.clamp_min(1).log(), torch.zeros_like(k)).sum() / 14
    torch.testing.assert_close(out.detach(), want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(x.grad, torch.zeros_like(x), rtol=0, atol=1e-12)


def test_modules_registry_and_errors():
    assert get_loss_entry("rnc").module is RnCLoss and get_loss_entry("conr").module is ConRLoss
    x = _feats(7, 2, 3)
    torch.testing.assert_close(RnCLoss(temperature=1.0)(x, Y), rnc_loss(x, Y, temperature=1.0))
    w = torch.rand(7, dtype=torch.float64)
    torch.testing.assert_close(
        ConRLoss(window=0.5, eta=0.1)(x, Y, YHAT, w), conr_loss(x, Y, YHAT, weights=w, window=0.5, eta=0.1)
    )
    with pytest.raises(ValueError, match="`temperature` must be finite and > 0"):
        rnc_loss(x, Y, temperature=-2.0)
    with pytest.raises(ValueError, match="`labels` must have 7 rows"):
        rnc_loss(x, Y[:5])
    with pytest.raises(ValueError, match=r"`labels` must have shape \(B,\), \(B, 1\) or \(B, K\)"):
        rnc_loss(x, torch.zeros(7, 2, 2))
    with pytest.raises(ValueError, match=r"`preds` must have shape \(7,\), \(7, 1\) or \(7, 2\)"):
        conr_loss(x, Y, torch.zeros(7, 3))
    with pytest.raises(ValueError, match=r"`weights` must have shape \(7,\)"):
        conr_loss(x, Y, YHAT, weights=torch.ones(3))
    with pytest.raises(TypeError, match="`weights` must be a floating-point tensor"):
        conr_loss(x, Y, YHAT, weights=torch.ones(7, dtype=torch.long))
    with pytest.raises(ValueError, match="`window` must be finite and >= 0"):
        conr_loss(x, Y, YHAT, window=-1.0)
    with pytest.raises(ValueError, match="`variant` must be one of 'in', 'out'"):
        ConRLoss(variant="both")
    with pytest.raises(TypeError, match=r"`preds` must be a torch\.Tensor"):
        conr_loss(x, Y, [1.0] * 7)
    # options are keyword-only (ConR's predictions are data: the third positional argument)
    with pytest.raises(TypeError, match=r"rnc_loss\(\) takes 2 positional arguments but 3 were given"):
        rnc_loss(x, Y, 2.0)
    with pytest.raises(TypeError, match=r"conr_loss\(\) takes 3 positional arguments but 4 were given"):
        conr_loss(x, Y, YHAT, torch.ones(7))
