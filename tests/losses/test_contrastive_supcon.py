"""SupCon / SimCLR: parity with a slow loop written from eq. 2 / 3, chunking, stability, errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from rankwise._kernels import _loader
from rankwise._kernels import supcon as ksup
from rankwise.losses import SupConLoss, _supcon, get_loss_entry, list_losses, supcon_loss
from tests.conftest import gradcheck, tol


def slow_supcon(
    features,
    labels=None,
    mask=None,
    *,
    temperature=0.1,
    base_temperature=None,
    contrast_mode="all",
    variant="out",
    normalize=True,
):
    """Direct transcription of Khosla et al. eq. 2 / 3 with Python loops over anchors."""
    x = features.to(torch.float64)
    if x.dim() == 2:
        x = x[:, None]
    if normalize:
        x = F.normalize(x, dim=-1)
    b, v, _ = x.shape
    views = [(vi, bi) for vi in range(v) for bi in range(b)]
    anchors = [(vi, bi) for (vi, bi) in views if contrast_mode == "all" or vi == 0]

    def positive(i, j):
        if mask is not None:
            return bool(mask[i, j] != 0)
        if labels is not None:
            return bool(labels[i] == labels[j])
        return i == j

    terms = []
    for a in anchors:
        za = x[a[1], a[0]]
        others = [k for k in views if k != a]
        pos = [p for p in others if positive(a[1], p[1])]
        if not pos:
            continue
        den = sum(torch.exp(za @ x[k[1], k[0]] / temperature) for k in others)
        probs = [torch.exp(za @ x[p[1], p[0]] / temperature) / den for p in pos]
        if variant == "out":
            terms.append(-sum(torch.log(p) for p in probs) / len(pos))
        else:
            terms.append(-torch.log(sum(probs) / len(pos)))
    if not terms:
        return x.sum() * 0
    scale = 1.0 if base_temperature is None else temperature / base_temperature
    return scale * sum(terms) / len(terms)


def plain_supcon(features, labels, temperature):
    """The textbook masked (B*V)^2 implementation (every anchor must have a positive)."""
    b, v, d = features.shape
    z = F.normalize(features, dim=-1).transpose(0, 1).reshape(b * v, d)
    y = labels.repeat(v)
    logits = z @ z.T / temperature
    logits = logits - logits.max(1, keepdim=True).values.detach()
    not_self = ~torch.eye(b * v, dtype=torch.bool)
    pos = (y[:, None] == y[None, :]) & not_self
    log_prob = logits - torch.log((torch.exp(logits) * not_self).sum(1, keepdim=True))
    return -((pos * log_prob).sum(1) / pos.sum(1)).mean()


def _feats(*shape, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).requires_grad_()


LABELS = torch.tensor([0, 1, 0, 2, 1, 3])  # label 2 and 3 appear once: single-view anchors have no positive


@pytest.fixture(params=["mask", "groups"])
def label_path(request, monkeypatch):
    """Labels become a (B, B) mask for small batches and sorted group ids for large ones: test both."""
    if request.param == "groups":
        monkeypatch.setattr(_supcon, "_MASK_MAX_SAMPLES", 0)
    return request.param


@pytest.fixture(params=["one-pass", "general"])
def out_path(request, monkeypatch):
    """Small ``variant="out"`` problems take the one-pass path (_SupConOutSmall): test the general one too."""
    if request.param == "general":
        monkeypatch.setattr(_supcon, "_SMALL_MAX_ELEMENTS", 0)
    return request.param


@pytest.mark.parametrize("views", [1, 2, 3])
@pytest.mark.parametrize("contrast_mode", ["all", "one"])
@pytest.mark.parametrize("variant", ["out", "in"])
@pytest.mark.parametrize("source", ["labels", "mask", "simclr"])
def test_parity_with_slow_loop(views, contrast_mode, variant, source, out_path):
    x = _feats(6, views, 5, seed=views)
    g = torch.Generator().manual_seed(3)
    asym = (torch.rand(6, 6, generator=g) < 0.4).to(torch.float64)
    kw = {"labels": LABELS} if source == "labels" else {"mask": asym} if source == "mask" else {}
    opts = {"temperature": 0.3, "contrast_mode": contrast_mode, "variant": variant}
    got = supcon_loss(x, **kw, **opts)
    want = slow_supcon(x, **kw, **opts)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    (g1,) = torch.autograd.grad(got, x)
    (g2,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("views", [1, 2, 3])
@pytest.mark.parametrize("contrast_mode", ["all", "one"])
@pytest.mark.parametrize("variant", ["out", "in"])
def test_parity_with_slow_loop_label_groups(views, contrast_mode, variant, monkeypatch):
    """Large batches turn labels into sorted group ids instead of a (B, B) mask."""
    monkeypatch.setattr(_supcon, "_MASK_MAX_SAMPLES", 0)
    x = _feats(6, views, 5, seed=views)
    opts = {"temperature": 0.3, "contrast_mode": contrast_mode, "variant": variant}
    got = supcon_loss(x, LABELS, **opts)
    want = slow_supcon(x, LABELS, **opts)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    (g1,) = torch.autograd.grad(got, x)
    (g2,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("normalize", [True, False])
def test_parity_unnormalized_and_base_temperature(normalize):
    x = _feats(5, 2, 4, seed=7)
    y = torch.tensor([1, 1, 2, 3, 3])
    got = supcon_loss(x, y, temperature=0.7, base_temperature=0.07, normalize=normalize)
    want = slow_supcon(x, y, temperature=0.7, base_temperature=0.07, normalize=normalize)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, 10 * supcon_loss(x, y, temperature=0.7, normalize=normalize))


def test_simclr_is_supcon_with_distinct_labels():
    x = _feats(5, 2, 4)
    torch.testing.assert_close(supcon_loss(x, temperature=0.5), supcon_loss(x, torch.arange(5), temperature=0.5))
    torch.testing.assert_close(supcon_loss(x), supcon_loss(x, mask=torch.eye(5)))


def test_matches_plain_masked_implementation_when_every_anchor_has_a_positive(dtype):
    x = _feats(8, 2, 6, dtype=dtype)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    torch.testing.assert_close(supcon_loss(x, y, temperature=0.1), plain_supcon(x, y, 0.1), **tol(dtype))


@pytest.mark.parametrize("chunk_size", [1, 3, 5, 11, 100])
@pytest.mark.parametrize("variant", ["out", "in"])
def test_chunked_equals_unchunked(chunk_size, variant):
    x = _feats(6, 2, 5)
    y = LABELS
    full = supcon_loss(x, y, variant=variant)
    part = supcon_loss(x, y, variant=variant, chunk_size=chunk_size)
    torch.testing.assert_close(part, full)
    (g1,) = torch.autograd.grad(full, x)
    (g2,) = torch.autograd.grad(part, x)
    torch.testing.assert_close(g1, g2)
    m = (torch.rand(6, 6) < 0.5).to(torch.float64)
    torch.testing.assert_close(
        supcon_loss(x, mask=m, contrast_mode="one", chunk_size=chunk_size), supcon_loss(x, mask=m, contrast_mode="one")
    )


def _saved_sizes(*args, **kwargs):
    """Sizes of the tensors autograd saves for backward in ``supcon_loss(*args, **kwargs)``."""
    sizes: list[int] = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = supcon_loss(*args, **kwargs)
    loss.backward()
    return sizes


def test_blockwise_saves_no_square_tensor(monkeypatch):
    """Blockwise, autograd keeps only O(B*V*D) inputs, per-anchor statistics and (small batches) the
    (B, B) label mask, never a (B*V) x (B*V) tensor; automatic blocking goes blockwise exactly when
    the logits exceed the memory budget."""
    b, v, d = 64, 2, 8
    n = b * v
    x = _feats(b, v, d, dtype=torch.float32)
    y = torch.arange(b) % 7
    for variant in ("out", "in"):
        assert max(_saved_sizes(x, y, chunk_size=16, variant=variant)) <= b * b < n * n
        assert max(_saved_sizes(x, chunk_size=16, variant=variant)) <= n * d
        # within the budget: one block, the softmax is kept for backward instead of recomputed ("in"),
        # or ("out", small: the one-pass path) only the (B, V, D) gradient formed in forward
        assert max(_saved_sizes(x, y, variant=variant)) == (n * n if variant == "in" else n * d)
    monkeypatch.setattr(_supcon, "_DENSE_MAX_ELEMENTS", n * n - 1)
    monkeypatch.setattr(_supcon, "_AUTO_BLOCK_ELEMENTS", 16 * n)
    assert max(_saved_sizes(x, y)) <= b * b
    big_b = _supcon._MASK_MAX_SAMPLES + 1  # labels as group ids: nothing quadratic at all
    xb, yb = _feats(big_b, 2, 4, dtype=torch.float32), torch.arange(big_b) % 7
    assert max(_saved_sizes(xb, yb, chunk_size=16)) <= 2 * big_b * 4
    assert _supcon._block_size(None, n, n) == 16
    monkeypatch.setattr(_supcon, "_DENSE_MAX_ELEMENTS", n * n)
    assert _supcon._block_size(None, n, n) == n
    assert _supcon._block_size(1000, n, n) == n


def test_gradcheck():
    x = _feats(4, 2, 3)
    y = torch.tensor([0, 1, 0, 2])
    assert gradcheck(lambda f: supcon_loss(f, y, temperature=0.5), x)
    assert gradcheck(lambda f: supcon_loss(f, y, temperature=0.5, variant="in", chunk_size=3), x)
    assert gradcheck(lambda f: supcon_loss(f, temperature=0.5, contrast_mode="one", normalize=False), x)


def test_no_positive_gives_zero_with_graph():
    x = _feats(4, 6)
    loss = supcon_loss(x, torch.arange(4))  # one view, distinct labels
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    empty = _feats(0, 2, 3)
    loss = supcon_loss(empty, chunk_size=2)
    loss.backward()
    assert loss.item() == 0.0


def test_anchors_without_positive_are_excluded_from_the_mean():
    x = _feats(3, 4)
    y = torch.tensor([0, 0, 1])  # anchor 2 has no positive
    only_pair = supcon_loss(x, y)
    # the same loss restricted to the two anchors that have positives (sample 2 is still a negative)
    want = slow_supcon(x, y)
    torch.testing.assert_close(only_pair, want)
    loss_01 = torch.stack(
        [
            -torch.log_softmax(
                F.normalize(x, dim=-1)[i] @ F.normalize(x, dim=-1)[[j for j in range(3) if j != i]].T / 0.1, 0
            )[0]
            for i in (0, 1)
        ]
    ).mean()
    torch.testing.assert_close(only_pair, loss_01)


@pytest.mark.parametrize("variant", ["out", "in"])
def test_finite_for_extreme_inputs(variant):
    big = _feats(16, 2, 8, scale=1e4, dtype=torch.float32)
    y = torch.arange(16) % 3
    for kwargs in ({"normalize": False}, {"temperature": 0.01}, {"normalize": False, "temperature": 0.01}):
        loss = supcon_loss(big, y, variant=variant, **kwargs)
        (grad,) = torch.autograd.grad(loss, big)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), kwargs
    half = _feats(16, 2, 8, dtype=torch.float16)
    loss = supcon_loss(half, y, temperature=0.01, variant=variant)
    assert loss.dtype == torch.float32
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(half.grad).all()
    ref = supcon_loss(half.detach().float(), y, temperature=0.01, variant=variant)
    torch.testing.assert_close(loss, ref, rtol=1e-3, atol=1e-3)
    bf = _feats(16, 2, 8, dtype=torch.bfloat16)
    assert torch.isfinite(supcon_loss(bf, y, variant=variant, chunk_size=7))


def test_module_twin_and_registry():
    assert "supcon" in list_losses()
    entry = get_loss_entry("supcon")
    assert entry.fn is supcon_loss and entry.module is SupConLoss
    x = _feats(5, 2, 4)
    y = torch.tensor([0, 0, 1, 1, 2])
    mod = SupConLoss(temperature=0.2, variant="in", chunk_size=4)
    torch.testing.assert_close(mod(x, y), supcon_loss(x, y, temperature=0.2, variant="in", chunk_size=4))
    assert "variant='in'" in repr(mod)
    torch.testing.assert_close(SupConLoss()(x), supcon_loss(x))


def test_errors():
    x = _feats(4, 2, 3)
    y = torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="`labels` and `mask` cannot both"):
        supcon_loss(x, y, mask=torch.eye(4))
    # options are keyword-only: a third positional argument is not silently taken as `mask`
    with pytest.raises(TypeError, match=r"supcon_loss\(\) takes from 1 to 2 positional arguments but 3 were given"):
        supcon_loss(x, y, 0.1)
    with pytest.raises(TypeError, match=r"supcon_loss\(\) takes from 1 to 2 positional arguments but 3"):
        SupConLoss()(x, y, torch.eye(4))
    with pytest.raises(ValueError, match=r"`features` must have shape \(B, D\) or \(B, V, D\)"):
        supcon_loss(x[0, 0], y)
    with pytest.raises(TypeError, match="`features` must be a floating-point tensor"):
        supcon_loss(torch.ones(4, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="`labels` must have 4 rows"):
        supcon_loss(x, y[:3])
    with pytest.raises(ValueError, match=r"`labels` must have shape \(B,\) or \(B, 1\)"):
        supcon_loss(x, torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"`mask` must have shape \(4, 4\)"):
        supcon_loss(x, mask=torch.eye(3))
    with pytest.raises(ValueError, match="`temperature` must be finite and > 0, got 0"):
        supcon_loss(x, y, temperature=0)
    with pytest.raises(ValueError, match="`base_temperature` must be finite and > 0"):
        supcon_loss(x, y, base_temperature=-1.0)
    with pytest.raises(ValueError, match="`contrast_mode` must be one of 'all', 'one'; got 'two'"):
        supcon_loss(x, y, contrast_mode="two")
    with pytest.raises(ValueError, match="`variant` must be one of 'out', 'in'"):
        SupConLoss(variant="mid")
    with pytest.raises(ValueError, match="`chunk_size` must be >= 1, got 0"):
        supcon_loss(x, y, chunk_size=0)
    with pytest.raises(TypeError, match="`chunk_size` must be an int or None, got float"):
        supcon_loss(x, y, chunk_size=2.0)


@pytest.mark.parametrize("variant", ["out", "in"])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_nan_bool_and_signed_zero_labels(variant, chunk_size, label_path, out_path):
    """Labels are compared with ``==``: -0.0 equals 0.0, bool labels work. A NaN label makes the loss NaN
    (the NaN policy of docs/conventions.md; the kernels themselves treat it as nobody's positive)."""
    x = _feats(6, 2, 5, seed=11)
    opts = {"temperature": 0.4, "variant": variant}
    for y in (torch.tensor([0.0, math.nan, 1.0, math.nan, 1.0, -0.0]), torch.tensor([math.nan] * 6)):
        loss = supcon_loss(x, y, chunk_size=chunk_size, **opts)
        assert torch.isnan(loss)
        (g,) = torch.autograd.grad(loss, x)  # the backward still runs
        assert g.shape == x.shape
    for y in (
        torch.tensor([0.0, 2.0, 1.0, 3.0, 1.0, -0.0]),
        torch.tensor([True, False, True, True, False, False]),
    ):
        got = supcon_loss(x, y, chunk_size=chunk_size, **opts)
        want = slow_supcon(x, y, **opts)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        (g1,) = torch.autograd.grad(got, x)
        (g2,) = torch.autograd.grad(want, x) if want.requires_grad else (torch.zeros_like(x),)
        torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("variant", ["out", "in"])
@pytest.mark.parametrize("contrast_mode", ["all", "one"])
@pytest.mark.parametrize("block", [1, 3, 100])
def test_anchor_subsets_add_up(variant, contrast_mode, block, label_path):
    """The anchors of samples s0..s1 (what one rank computes under DDP) against all views: the
    parts of a partition of the batch add up to the loss and gradient of the whole batch."""
    x = _feats(7, 3, 4, seed=5)
    y = torch.tensor([0, 1, 0, 2, 1, 3, 0])
    pos = _supcon._Positives.from_keys(y, x.dtype)
    va = 3 if contrast_mode == "all" else 1
    n = 21
    full = supcon_loss(x, y, temperature=0.3, variant=variant, contrast_mode=contrast_mode)
    (g_full,) = torch.autograd.grad(full, x)
    valid_total = 7 * va  # every view has a positive (the other views of its sample)
    parts = []
    for s0, s1 in ((0, 2), (2, 3), (3, 7)):
        anchors = _supcon._Anchors(s0, s1, va, 3, n)
        blk = min(block, anchors.m)
        parts.append(
            _supcon._SupCon.apply(
                x, True, anchors, pos, 0.3, variant, blk, 1.0, lambda c: torch.full_like(c, valid_total)
            )
        )
    total = sum(parts)
    torch.testing.assert_close(total, full)
    (g_parts,) = torch.autograd.grad(total, x)
    torch.testing.assert_close(g_parts, g_full)


def test_labels_with_trailing_dim_and_float_labels():
    """(B, 1) labels are the (B,) labels, and float labels group by equality: the loss of the mask
    ``y_i == y_j`` (0.25 and 0.5 are different classes; rounding or truncating them would merge them)."""
    x = _feats(5, 2, 3)
    y = torch.tensor([0.5, 0.25, 0.5, 2.0, 0.25])
    want = supcon_loss(x, mask=y[:, None] == y[None, :])
    torch.testing.assert_close(supcon_loss(x, y), want)
    torch.testing.assert_close(supcon_loss(x, y[:, None]), want)
    assert not torch.allclose(supcon_loss(x, y.round()), want)  # merged classes give another loss
    assert math.isfinite(want.item())


@pytest.mark.parametrize("variant", ["out", "in"])
def test_chunked_gradcheck_and_extremes(variant):
    x = _feats(4, 2, 3)
    m = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    assert gradcheck(lambda f: supcon_loss(f, mask=m, temperature=0.5, variant=variant, chunk_size=3), x)
    assert gradcheck(lambda f: supcon_loss(f, temperature=0.5, contrast_mode="one", variant=variant, chunk_size=1), x)
    big = _feats(12, 2, 8, scale=1e4, dtype=torch.float32)
    y = torch.arange(12) % 5
    for kw in ({"normalize": False}, {"temperature": 0.01}):
        full = supcon_loss(big, y, variant=variant, **kw)
        part = supcon_loss(big, y, variant=variant, chunk_size=5, **kw)
        (g1,) = torch.autograd.grad(full, big)
        (g2,) = torch.autograd.grad(part, big)
        assert torch.isfinite(part) and torch.isfinite(g2).all()
        torch.testing.assert_close(part, full, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(g2, g1, rtol=1e-4, atol=1e-3)
    half = _feats(12, 2, 8, dtype=torch.float16)
    loss = supcon_loss(half, y, variant=variant, chunk_size=4)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(half.grad).all()
    with torch.no_grad():
        torch.testing.assert_close(supcon_loss(half, y, variant=variant, chunk_size=4), loss.detach())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("contrast_mode", ["one", "all"])
def test_all_zero_feature_vector_gets_a_zero_gradient(dtype: torch.dtype, contrast_mode: str, out_path: str) -> None:
    """An all-zero view normalizes to 0 with a zero gradient (as safe_normalize), not F.normalize's
    1/1e-12 gradient, which overflowed to inf in float16 (found by the property suite, n=2, ties)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2, 3, generator=g, dtype=torch.float64)
    x[0, 0] = 0.0
    x = x.to(dtype).requires_grad_()
    labels = torch.tensor([0, 1, 0, 1])
    loss = supcon_loss(x, labels, temperature=0.1, contrast_mode=contrast_mode)
    loss.backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    assert torch.equal(x.grad[0, 0], torch.zeros(3, dtype=dtype))
    # the other rows' gradients are the autograd gradients of the same loss written with safe_normalize
    ref_x = x.detach().double().requires_grad_()
    z = ref_x / torch.where(ref_x.norm(dim=-1, keepdim=True) > 0, ref_x.norm(dim=-1, keepdim=True), 1.0)
    ref = supcon_loss(z, labels, temperature=0.1, contrast_mode=contrast_mode, normalize=False)
    ref.backward()
    assert ref_x.grad is not None
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=1e-2 if dtype == torch.float16 else 1e-5, atol=1e-3)
    ref_grad = ref_x.grad.clone()
    ref_grad[0, 0] = 0.0  # the view that is exactly zero: no direction, zero gradient by definition
    torch.testing.assert_close(
        x.grad.double(),
        ref_grad,
        rtol=5e-2 if dtype == torch.float16 else 1e-4,
        atol=5e-3 if dtype == torch.float16 else 1e-6,
    )


def _value_and_grad(x, *args, **kwargs):
    x = x.detach().requires_grad_()
    loss = supcon_loss.__wrapped__(x, *args, **kwargs)  # without the NaN policy: the kernels' own values
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad


@pytest.mark.parametrize("kernel", ["numba", "torch"])
@pytest.mark.parametrize("seed", range(24))
def test_one_pass_path_equals_general_paths(seed, kernel, monkeypatch):
    """The one-pass ``variant="out"`` path (its per-element work in the numba kernel or in torch
    ops) against the general one (dense: softmax kept; and blockwise) at random shapes, sources,
    modes, temperatures, normalization, zero vectors and NaN labels (nobody's positive), value and
    gradient in float64."""
    if kernel == "torch":
        monkeypatch.setattr(_supcon, "_NUMBA_MAX_N", 0)
    else:
        pytest.importorskip("numba")
        monkeypatch.setattr(_loader, "MODE", "sync")
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (), generator=g))]

    b, v, d = pick([1, 2, 3, 5, 9, 17, 40]), pick([1, 2, 3, 4]), pick([1, 3, 8])
    x = torch.randn(b, v, d, generator=g, dtype=torch.float64) * pick([1.0, 30.0])
    if seed % 3 == 0:
        x[0, v - 1] = 0.0  # an all-zero view
    kw: dict = {
        "temperature": pick([0.05, 0.1, 0.7]),
        "contrast_mode": pick(["all", "one"]),
        "normalize": pick([True, True, False]),
        "base_temperature": pick([None, 0.07]),
    }
    source = pick(["labels", "float_labels", "bool_labels", "mask", "simclr"])
    if source == "labels":
        args: tuple = (torch.randint(0, pick([1, 2, 4, 50]), (b,), generator=g),)
    elif source == "float_labels":
        y = torch.randint(0, 3, (b,), generator=g).double()
        y[torch.rand(b, generator=g) < 0.3] = math.nan
        args = (y,)
    elif source == "bool_labels":
        args = (torch.rand(b, generator=g) < 0.5,)
    else:
        args = ()
        if source == "mask":
            kw["mask"] = torch.rand(b, b, generator=g) < 0.3
    if b * v < 2:
        return
    if seed % 2:  # two matmuls instead of one with W + W^T (large N), on both paths
        monkeypatch.setattr(_supcon, "_SYMMETRIC_MAX_N", 0)
    fast = _value_and_grad(x, *args, **kw)
    monkeypatch.setattr(_supcon, "_SMALL_MAX_ELEMENTS", 0)
    dense = _value_and_grad(x, *args, **kw)
    blockwise = _value_and_grad(x, *args, chunk_size=pick([1, 2, 7]), **kw)
    for other in (dense, blockwise):
        torch.testing.assert_close(fast[0], other[0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(fast[1], other[1], rtol=1e-9, atol=1e-11)


def test_one_pass_path_gradcheck_half_input_and_no_grad():
    x = _feats(5, 3, 4, seed=2)
    y = torch.tensor([0, 1, 0, 2, 1])
    m = torch.rand(5, 5, generator=torch.Generator().manual_seed(1)) < 0.4
    assert gradcheck(lambda f: supcon_loss(f, y, temperature=0.5), x)
    assert gradcheck(lambda f: supcon_loss(f, mask=m, temperature=0.5, contrast_mode="one"), x)
    assert gradcheck(lambda f: supcon_loss(f, temperature=0.5, normalize=False), x)
    with pytest.raises(RuntimeError):  # first-order only, like the general path
        (g,) = torch.autograd.grad(supcon_loss(x, y), x, create_graph=True)
        g.sum().backward()
    with torch.no_grad():
        torch.testing.assert_close(supcon_loss(x, y), supcon_loss(x.detach(), y))
    half = _feats(6, 2, 8, dtype=torch.float16, seed=4)
    yh = torch.tensor([0, 1, 0, 1, 2, 2])
    loss = supcon_loss(half, yh, temperature=0.05)
    loss.backward()
    assert loss.dtype == torch.float32 and half.grad is not None and half.grad.dtype == torch.float16
    ref_x = half.detach().float().requires_grad_()
    ref = supcon_loss(ref_x, yh, temperature=0.05, chunk_size=1)  # the blockwise path in float32
    ref.backward()
    torch.testing.assert_close(loss, ref)
    assert ref_x.grad is not None
    torch.testing.assert_close(half.grad.float(), ref_x.grad, rtol=1e-2, atol=1e-3)


def _fresh_loader(monkeypatch, mode):
    monkeypatch.setattr(_loader, "MODE", mode)
    monkeypatch.setattr(ksup.FAMILY, "kernels", _loader._UNSET)
    monkeypatch.setattr(ksup.FAMILY, "_thread", None)
    monkeypatch.setattr(ksup.FAMILY, "_unloaded_calls", 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["all", "one"])
def test_numba_kernel_equals_torch_ops(dtype, mode, monkeypatch):
    """The small path's numba kernel and its torch ops: value and gradient, labels / mask / SimCLR,
    at the largest size the kernel takes (B V = _NUMBA_MAX_N) and below, and the value alone
    (no gradient wanted: the kernel's ``out=0``)."""
    pytest.importorskip("numba")
    _fresh_loader(monkeypatch, "sync")
    ksup.FAMILY.load()
    real = ksup.supcon_out
    calls = []
    monkeypatch.setattr(ksup, "supcon_out", lambda *args: calls.append((args[3], args[6])) or real(*args))
    g = torch.Generator().manual_seed(3)
    rtol, atol = (1e-5, 1e-6) if dtype == torch.float32 else (1e-11, 1e-13)
    for b, v in ((_supcon._NUMBA_MAX_N // 2, 2), (7, 3), (1, 2)):
        x = torch.randn(b, v, 16, generator=g, dtype=dtype)
        y = torch.randint(0, 5, (b,), generator=g)
        m = torch.rand(b, b, generator=g) < 0.3
        for kw in ({"labels": y}, {"mask": m}, {}, {"labels": y, "normalize": False}):
            got = _value_and_grad(x, contrast_mode=mode, **kw)
            with torch.no_grad():
                value_only = supcon_loss.__wrapped__(x, contrast_mode=mode, **kw)
            with monkeypatch.context() as mp:
                mp.setattr(_supcon, "_NUMBA_MAX_N", 0)
                want = _value_and_grad(x, contrast_mode=mode, **kw)
            torch.testing.assert_close(got[0], want[0], rtol=rtol, atol=atol)
            torch.testing.assert_close(got[1], want[1], rtol=rtol, atol=atol)
            torch.testing.assert_close(value_only, want[0], rtol=rtol, atol=atol)
    # every case went through the kernel: v = 2 and 3; W + W^T ("all": by scaling for normalized
    # views, 3, by a transpose, 2), W ("one"), the value alone
    outs = (3, 2, 0) if mode == "all" else (1, 0)
    assert sorted(set(calls)) == sorted({(v, out) for v in (2, 3) for out in outs})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numba_kernel_scaling_at_its_smallest_temperature(dtype, monkeypatch):
    """W + W^T by row and column scaling (``out=3``) at the smallest temperature it is used at and
    at the largest batch, against the torch ops; just below that temperature the tiled transpose."""
    pytest.importorskip("numba")
    _fresh_loader(monkeypatch, "sync")
    ksup.FAMILY.load()
    real = ksup.supcon_out
    calls = []
    monkeypatch.setattr(ksup, "supcon_out", lambda *args: calls.append(args[6]) or real(*args))
    tau = _supcon._FACTOR_MIN_TAU[dtype]
    b = _supcon._NUMBA_MAX_N // 2
    g = torch.Generator().manual_seed(5)
    x = torch.randn(b, 2, 32, generator=g, dtype=dtype)
    x[3] = 0.0  # an all-zero sample: its logits are 0
    y = torch.randint(0, 40, (b,), generator=g)
    rtol, atol = (2e-5, 1e-6) if dtype == torch.float32 else (1e-10, 1e-13)
    for t in (tau, tau * 0.99):
        got = _value_and_grad(x, y, temperature=t)
        with monkeypatch.context() as mp:
            mp.setattr(_supcon, "_NUMBA_MAX_N", 0)
            want = _value_and_grad(x, y, temperature=t)
        torch.testing.assert_close(got[0], want[0], rtol=rtol, atol=atol)
        torch.testing.assert_close(got[1], want[1], rtol=rtol, atol=atol * got[1].abs().max().item())
    assert calls == [3, 2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numba_kernel_when_every_positive_underflows(dtype, monkeypatch):
    """Unnormalized features at a small temperature: the positives' softmax probabilities are 0 in
    float32, the kernel then takes the log-sum-exp from the row's maximum (finite, as the torch ops)."""
    pytest.importorskip("numba")
    _fresh_loader(monkeypatch, "sync")
    ksup.FAMILY.load()
    x = _feats(24, 2, 8, seed=11, dtype=dtype, scale=30.0).detach()
    y = torch.arange(24) % 3
    kw = {"temperature": 0.01, "normalize": False}
    got = _value_and_grad(x, y, **kw)
    with monkeypatch.context() as mp:
        mp.setattr(_supcon, "_NUMBA_MAX_N", 0)
        want = _value_and_grad(x, y, **kw)
    assert torch.isfinite(got[0]) and torch.isfinite(got[1]).all()
    assert got[0] > 1e4  # the positives are far below their rows' maxima
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    z = x.reshape(48, 8).double()  # eq. 2 with a log-sum-exp (slow_supcon's exp overflows here)
    s = z @ z.T / 0.01
    s.fill_diagonal_(-math.inf)
    log_prob = s - s.logsumexp(1, keepdim=True)
    yy = y.repeat_interleave(2)
    pos = (yy[:, None] == yy[None]) & ~torch.eye(48, dtype=torch.bool)
    want_eq2 = -(log_prob.where(pos, 0).sum(1) / pos.sum(1)).mean()
    torch.testing.assert_close(got[0], want_eq2.to(dtype), rtol=1e-5, atol=0)


def test_numba_kernel_loads_in_the_background_and_off_means_never(monkeypatch):
    pytest.importorskip("numba")
    x = _feats(6, 2, 8, seed=1)
    y = torch.tensor([0, 1, 0, 1, 2, 2])
    want = supcon_loss(x, y)
    _fresh_loader(monkeypatch, "off")
    torch.testing.assert_close(supcon_loss(x, y), want)
    assert ksup.FAMILY.kernels is _loader._UNSET and ksup.FAMILY._thread is None
    _fresh_loader(monkeypatch, "background")
    torch.testing.assert_close(supcon_loss(x, y), want)  # the torch ops while the kernel loads
    assert ksup.FAMILY._thread is not None
    ksup.FAMILY._thread.join(timeout=120)
    assert ksup.FAMILY.loaded
    torch.testing.assert_close(supcon_loss(x, y), want)


def test_without_numba_the_small_path_uses_torch_ops(monkeypatch):
    import sys

    _fresh_loader(monkeypatch, "sync")
    monkeypatch.setitem(sys.modules, "rankwise._kernels._numba_supcon", None)  # import raises ImportError
    x = _feats(5, 2, 4, seed=5)
    y = torch.tensor([0, 1, 0, 2, 1])
    loss = supcon_loss(x, y)
    assert ksup.FAMILY.kernels is None
    torch.testing.assert_close(loss, slow_supcon(x, y).to(loss.dtype))


def test_small_path_torch_ops_same_on_one_and_two_threads(monkeypatch):
    """W + W^T is a transposing copy on one thread and a transposed add on more: same result."""
    monkeypatch.setattr(_supcon, "_NUMBA_MAX_N", 0)
    x = _feats(40, 2, 8, seed=7)
    y = torch.randint(0, 6, (40,), generator=torch.Generator().manual_seed(7))
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _value_and_grad(x, y)
        torch.set_num_threads(2)
        two = _value_and_grad(x, y)
    finally:
        torch.set_num_threads(prev)
    torch.testing.assert_close(one[0], two[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(one[1], two[1], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(one[0], slow_supcon(x.detach(), y), rtol=1e-10, atol=1e-12)


def test_numba_normalization_at_any_magnitude(monkeypatch):
    """float32 views on the kernel path are normalized by the kernel (squares summed in float64): rows
    at 1e-37, 1e-25, 1e20 and 3e37 (whose float32 squares underflow / overflow) and an
    all-zero row give the float64 normalization of the same values; the gradient through it equals
    the float64 formula, and the loss and its gradient equal the float64 loss (torch path)."""
    pytest.importorskip("numba")
    _fresh_loader(monkeypatch, "sync")
    ksup.FAMILY.load()
    real = ksup.normalize_rows
    calls = []
    monkeypatch.setattr(ksup, "normalize_rows", lambda *args: calls.append(args[0].dtype) or real(*args))
    g = torch.Generator().manual_seed(12)
    b, v, d = 10, 2, 16
    scales = torch.tensor([1.0, 1e-37, 1e-25, 1e20, 3e37] * 4, dtype=torch.float64)
    x64 = torch.randn(b, v, d, generator=g, dtype=torch.float64) * scales.view(b, v, 1)
    x64[3, 1] = 0.0  # an all-zero view
    x = x64.to(torch.float32)
    x64 = x.double()  # the same values
    flat = x.reshape(b * v, d)
    z, zs, norm = ksup.normalize_rows(flat, 10.0)
    want_norm = flat.double().norm(dim=1, keepdim=True)
    want_z = flat.double() / want_norm.where(want_norm > 0, 1.0)
    torch.testing.assert_close(norm.double(), want_norm.where(want_norm > 0, math.inf), rtol=1e-6, atol=0)
    torch.testing.assert_close(z.double(), want_z, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(zs.double(), want_z * 10, rtol=1e-6, atol=1e-6)
    up = torch.randn(b * v, d, generator=g)
    grad = up.clone()
    ksup.normalize_rows_backward(grad, z, norm)
    u64 = up.double()
    want = (u64 - want_z * (want_z * u64).sum(1, keepdim=True)) / want_norm.where(want_norm > 0, math.inf)
    torch.testing.assert_close(grad.double() * scales.view(-1, 1), want * scales.view(-1, 1), rtol=1e-5, atol=1e-6)
    assert not grad[7].any()  # the all-zero view (sample 3, view 1)
    y = torch.tensor([0, 1, 0, 1, 2, 2, 0, 1, 2, 3])
    calls.clear()
    got = _value_and_grad(x, y)
    assert calls == [torch.float32]
    want_value, want_grad = _value_and_grad(x64, y)  # float64: the torch ops (robust norm)
    torch.testing.assert_close(got[0].double(), want_value, rtol=1e-5, atol=0)
    sv = scales.view(b, v, 1)
    torch.testing.assert_close(got[1].double() * sv, want_grad * sv, rtol=1e-4, atol=1e-6)
    assert torch.isfinite(got[1]).all() and not got[1][3, 1].any()


class _OpLog(TorchDispatchMode):
    """The aten operations reaching the dispatcher, views and metadata (no kernel on CUDA) excluded."""

    VIEWS = frozenset({"view", "_unsafe_view", "detach", "expand", "slice", "select", "t", "transpose", "alias"})
    VIEWS |= {"diagonal", "unsqueeze", "squeeze", "as_strided", "permute", "reshape", "_reshape_alias"}

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace != "prim" and func.overloadpacket.__name__ not in self.VIEWS:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


#: forward + backward of ``supcon_loss(x, labels)`` on the CUDA route at B = 1024, V = 2, D = 128
#: (integer labels, defaults): every one a kernel launch on CUDA, where this size is bound by the host
_CUDA_ROUTE_OPS = 30


def test_cuda_route_op_count(monkeypatch):
    """The one-pass path's torch route, as CUDA takes it, dispatches at most ``_CUDA_ROUTE_OPS`` ops.

    Counted on ``meta`` tensors (forward + backward; the one-pass size limit set to CUDA's, the only
    ``device.type == "cuda"`` choice of the route), and the forward checked against the same call on
    fake CUDA tensors (the branches a CUDA tensor takes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(_supcon, "_SMALL_MAX_ELEMENTS", _supcon._SMALL_MAX_ELEMENTS_CUDA)
    b = 1024
    x = torch.randn(b, 2, 128, device="meta", requires_grad=True)
    y = torch.randint(0, 100, (b,), device="meta")
    supcon_loss(x, y).backward()  # first-call work is not per-call work
    x.grad = None  # (a training step's zero_grad(set_to_none=True): no accumulation)
    with _OpLog() as fwd:
        loss = supcon_loss(x, y)
    with _OpLog() as bwd:
        loss.backward()
    assert x.grad is not None and x.grad.shape == x.shape
    mode = FakeTensorMode()
    xf = mode.from_tensor(torch.randn(b, 2, 128), static_shapes=True)
    yf = mode.from_tensor(torch.randint(0, 100, (b,)), static_shapes=True)
    with mode:
        xf, yf = xf.to("cuda").requires_grad_(), yf.to("cuda")
        supcon_loss(xf, yf)
    with mode, _OpLog() as fake:
        supcon_loss(xf, yf)
    assert fake.ops == fwd.ops
    assert len(fwd.ops) + len(bwd.ops) <= _CUDA_ROUTE_OPS, (fwd.ops, bwd.ops)


@pytest.mark.parametrize("contrast_mode", ["all", "one"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("labels", ["classes", "distinct", "none"])
def test_torch_route_value_is_nan_for_a_non_finite_normalized_feature(bad, labels, contrast_mode):
    """Off CPU, ``supcon_loss`` skips its separate NaN pass over normalized features because the torch
    route's value is NaN already: one non-finite element, anywhere, even with no positive at all."""
    b, v = 6, 2
    mask = {
        "classes": torch.tensor([0, 1, 0, 1, 2, 2])[:, None] == torch.tensor([0, 1, 0, 1, 2, 2]),
        "distinct": torch.zeros(b, b, dtype=torch.bool),
        "none": torch.eye(b, dtype=torch.bool),
    }[labels]
    va = 2 if contrast_mode == "all" else 1
    for row in (0, 3, 5, 11):  # view 0 (an anchor) or view 1 (not one for "one")
        x = torch.randn(b * v, 8, dtype=torch.float64)
        x[row, 5] = bad
        total, grad = _supcon._out_small_torch(x, mask, b, v, va, 0.1, 1.0, True, True)
        assert torch.isnan(total), (row, total)
        x[row, 5] = 1e300  # finite: finite value
        total, grad = _supcon._out_small_torch(x, mask, b, v, va, 0.1, 1.0, True, True)
        assert torch.isfinite(total) and torch.isfinite(grad).all()


def test_separate_nan_pass_only_where_needed(monkeypatch):
    """On the one-pass path's torch route the NaN pass of ``batch_loss`` runs for unnormalized features
    and floating labels or masks (a NaN label only removes positives), not for normalized features
    with integer labels, boolean masks or neither; the numba route keeps it."""
    import rankwise._validation as validation

    calls = []
    real = validation.nan_if_nonfinite
    monkeypatch.setattr(validation, "nan_if_nonfinite", lambda *a: calls.append(len(a)) or real(*a))
    x = torch.randn(8, 2, 4, device="meta", requires_grad=True)
    y = torch.arange(8, device="meta") % 3
    for kwargs, want in (
        ({"labels": y}, 0),
        ({}, 0),
        ({"mask": torch.ones(8, 8, dtype=torch.bool, device="meta")}, 0),
        ({"labels": y, "normalize": False}, 1),
        ({"labels": y.double()}, 1),
        ({"mask": torch.ones(8, 8, device="meta")}, 1),
    ):
        calls.clear()
        supcon_loss(x, **kwargs).backward()
        assert len(calls) == want, kwargs
    x, y = torch.randn(8, 2, 4), torch.arange(8) % 3
    _fresh_loader(monkeypatch, "sync")
    for kernel, want in ((True, 1), (False, 0)):
        with monkeypatch.context() as mp:
            if not kernel:
                mp.setattr(ksup, "ready", lambda: False)
            calls.clear()
            loss = supcon_loss(x.clone().requires_grad_(), y)
            assert len(calls) == want and torch.isfinite(loss), kernel
            bad = x.clone()
            bad[0, 1, 2] = math.nan
            assert torch.isnan(supcon_loss(bad.requires_grad_(), y)), kernel
