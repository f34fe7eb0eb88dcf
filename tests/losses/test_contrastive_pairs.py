"""Triplet (batch-all / batch-hard) and N-pairs losses against slow loops written from the formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rankwise.losses import NPairsLoss, TripletLoss, get_loss_entry, npairs_loss, triplet_loss
from tests.conftest import gradcheck


def _feats(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()


def slow_triplet(
    features, labels=None, mask=None, *, margin=0.2, distance="squared", mining="all", normalize=True, reduction="mean"
):
    x = features if features.dim() == 3 else features[:, None]
    if normalize:
        x = F.normalize(x, dim=-1)
    b, v, _ = x.shape
    views = [(vi, bi) for vi in range(v) for bi in range(b)]

    def dist(a, c):
        d2 = ((x[a[1], a[0]] - x[c[1], c[0]]) ** 2).sum()
        return d2 if distance == "squared" else d2.clamp_min(1e-12).sqrt()

    def positive(i, j):
        if mask is not None:
            return bool(mask[i, j] != 0)
        if labels is not None:
            return bool(labels[i] == labels[j])
        return i == j

    losses, valid = [], []
    for a in views:
        others = [k for k in views if k != a]
        pos = [p for p in others if positive(a[1], p[1])]
        neg = [k for k in others if not positive(a[1], k[1])]
        if not pos or not neg:
            losses.append(x.sum() * 0)
            valid.append(False)
            continue
        valid.append(True)
        if mining == "all":
            terms = [torch.relu(dist(a, p) - dist(a, n) + margin) for p in pos for n in neg]
            losses.append(sum(terms) / len(terms))
        else:
            hp = torch.stack([dist(a, p) for p in pos]).max()
            hn = torch.stack([dist(a, n) for n in neg]).min()
            losses.append(torch.relu(hp - hn + margin))
    out = torch.stack(losses)
    if reduction == "none":
        return out
    if reduction == "sum":
        return out.sum()
    return out.sum() / max(sum(valid), 1)


@pytest.mark.parametrize("mining", ["all", "hard"])
@pytest.mark.parametrize("distance", ["squared", "euclidean"])
@pytest.mark.parametrize("views", [1, 2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_triplet_parity(mining, distance, views, reduction):
    x = _feats(7, views, 4, seed=views)
    y = torch.tensor([0, 1, 0, 2, 1, 0, 3])
    kw = {"margin": 0.7, "distance": distance, "mining": mining, "reduction": reduction}
    got = triplet_loss(x, y, **kw)
    want = slow_triplet(x, y, **kw)
    torch.testing.assert_close(got, want)
    (g1,) = torch.autograd.grad(got.sum(), x)
    (g2,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("margin", [0.0, 0.3, 5.0])
def test_triplet_parity_mask_unnormalized_and_ties(margin):
    x = _feats(6, 2, 3, seed=4)
    m = (torch.rand(6, 6, generator=torch.Generator().manual_seed(1)) < 0.4).double()
    for mining in ("all", "hard"):
        got = triplet_loss(x, mask=m, margin=margin, mining=mining, normalize=False)
        torch.testing.assert_close(got, slow_triplet(x, mask=m, margin=margin, mining=mining, normalize=False))
    # SimCLR-style positives (other views of the same sample), duplicated points (exact distance ties)
    dup = torch.cat([x[:3], x[:3]]).detach().requires_grad_()
    torch.testing.assert_close(triplet_loss(dup, margin=margin), slow_triplet(dup, margin=margin))


def test_triplet_gradcheck():
    x = _feats(5, 2, 3)
    y = torch.tensor([0, 1, 0, 1, 2])
    assert gradcheck(lambda f: triplet_loss(f, y, margin=0.5), x)
    assert gradcheck(lambda f: triplet_loss(f, y, margin=0.5, distance="euclidean", normalize=False), x)
    assert gradcheck(lambda f: triplet_loss(f, y, mining="hard"), x)


def test_triplet_degenerate_and_half():
    x = _feats(3, 2, 4)
    loss = triplet_loss(x, torch.zeros(3, dtype=torch.long))  # no negatives
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(x))
    assert triplet_loss(_feats(0, 3), reduction="none").shape == (0,)
    h = _feats(8, 2, 4, dtype=torch.float16)
    y = torch.arange(8) % 3
    out = triplet_loss(h, y)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, triplet_loss(h.detach().float(), y), rtol=1e-3, atol=1e-3)


def slow_npairs(features, labels=None, *, temperature=1.0, normalize=False):
    x = F.normalize(features, dim=-1) if normalize else features
    b = x.shape[0]
    losses = []
    for i in range(b):
        keep = [j for j in range(b) if j == i or labels is None or labels[j] != labels[i]]
        s = torch.stack([x[i, 0] @ x[j, 1] for j in keep]) / temperature
        losses.append(-(s[keep.index(i)] - torch.logsumexp(s, 0)))
    return torch.stack(losses)


@pytest.mark.parametrize("with_labels", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
def test_npairs_parity(with_labels, normalize):
    x = _feats(6, 2, 5)
    y = torch.tensor([0, 1, 0, 2, 2, 3]) if with_labels else None
    want = slow_npairs(x, y, temperature=0.5, normalize=normalize)
    torch.testing.assert_close(npairs_loss(x, y, temperature=0.5, normalize=normalize, reduction="none"), want)
    torch.testing.assert_close(npairs_loss(x, y, temperature=0.5, normalize=normalize), want.mean())
    torch.testing.assert_close(npairs_loss(x, y, temperature=0.5, normalize=normalize, reduction="sum"), want.sum())


def test_npairs_log1p_form_and_gradcheck():
    x = _feats(4, 2, 3)
    f, fp = x[:, 0], x[:, 1]
    s = f @ fp.T
    want = torch.log1p((torch.exp(s - s.diagonal()[:, None]) * (1 - torch.eye(4))).sum(1)).mean()
    torch.testing.assert_close(npairs_loss(x), want)
    assert gradcheck(lambda t: npairs_loss(t, torch.tensor([0, 1, 0, 2]), temperature=0.7), x)


def test_modules_registry_and_errors():
    x = _feats(4, 2, 3)
    y = torch.tensor([0, 1, 0, 1])
    assert get_loss_entry("triplet").module is TripletLoss and get_loss_entry("npairs").module is NPairsLoss
    torch.testing.assert_close(
        TripletLoss(margin=0.1, mining="hard")(x, y), triplet_loss(x, y, margin=0.1, mining="hard")
    )
    torch.testing.assert_close(NPairsLoss(temperature=2.0)(x, y), npairs_loss(x, y, temperature=2.0))
    with pytest.raises(ValueError, match="`margin` must be finite and >= 0"):
        triplet_loss(x, y, margin=-1)
    with pytest.raises(ValueError, match="`mining` must be one of 'all', 'hard'; got 'semi'"):
        triplet_loss(x, y, mining="semi")
    with pytest.raises(ValueError, match="`distance` must be one of"):
        TripletLoss(distance="cosine")
    with pytest.raises(ValueError, match="`reduction` must be one of 'mean', 'sum', 'none'"):
        triplet_loss(x, y, reduction="max")
    with pytest.raises(ValueError, match="`labels` and `mask` cannot both"):
        triplet_loss(x, y, mask=torch.eye(4))
    with pytest.raises(TypeError, match=r"triplet_loss\(\) takes from 1 to 2 positional arguments but 3 were given"):
        triplet_loss(x, y, 0.5)  # options are keyword-only: 0.5 is not taken as `mask`
    with pytest.raises(TypeError, match=r"npairs_loss\(\) takes from 1 to 2 positional arguments"):
        npairs_loss(x, y, 0.5)
    with pytest.raises(ValueError, match=r"`features` must have shape \(B, 2, D\)"):
        npairs_loss(_feats(4, 3, 2))
    with pytest.raises(ValueError, match="`temperature` must be finite and > 0"):
        npairs_loss(x, temperature=0.0)
