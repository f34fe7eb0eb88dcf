"""Retrieval losses against pytorch-metric-learning and independent per-query references."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from rankwise.losses import blackbox_ap_loss, fastap_loss, recall_at_k_loss, smooth_ap_loss
from rankwise.losses import retrieval as retrieval_mod
from tests.registry_examples import factories

pml_losses = pytest.importorskip("pytorch_metric_learning.losses")


def _emb(b: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, d, generator=g, dtype=dtype).requires_grad_()


def _value_grad(fn, e, *args, **kw):  # type: ignore[no-untyped-def]
    v = fn(e, *args, **kw)
    (g,) = torch.autograd.grad(v, e)
    return v.detach(), g


# ----------------------------------------------------------------------------------------------
# independent references (loops over queries and items, written from the authors' formulations)
# ----------------------------------------------------------------------------------------------
def _smooth_ap_ref(e: torch.Tensor, y: torch.Tensor, tau: float, include_query: bool) -> torch.Tensor:
    z = F.normalize(e, dim=1)
    s = z @ z.T
    b = len(y)
    losses = []
    for q in range(b):
        items = [j for j in range(b) if include_query or j != q]
        pos = [j for j in items if y[j] == y[q]]
        if not any(j != q for j in pos):
            continue
        ap = 0.0
        for i in pos:
            r_all = 1 + sum(torch.sigmoid((s[q, j] - s[q, i]) / tau) for j in items if j != i)
            r_pos = 1 + sum(torch.sigmoid((s[q, j] - s[q, i]) / tau) for j in pos if j != i)
            ap = ap + r_pos / r_all
        losses.append(1 - ap / len(pos))
    return torch.stack(losses).mean()


def _recall_ref(  # type: ignore[no-untyped-def]
    e: torch.Tensor,
    y: torch.Tensor,
    ks: tuple[int, ...],
    tau: float,
    include_query: bool,
    *,
    normalize: bool = True,
    k_clip: int | None = None,
):
    z = F.normalize(e, dim=1) if normalize else e
    s = z @ z.T
    b = len(y)
    clip = b if k_clip is None else k_clip
    losses = []
    for q in range(b):
        items = [j for j in range(b) if include_query or j != q]
        pos = [j for j in range(b) if y[j] == y[q] and j != q]
        if not pos:
            continue
        recalls = []
        for k in ks:
            kk = min(k, clip)
            found = 0.0
            for i in pos:
                rank = 1 + sum(torch.sigmoid((s[q, j] - s[q, i]) / tau) for j in items if j != i)
                found = found + torch.sigmoid((kk - rank) / k)
            recalls.append(torch.clamp(found, max=kk) / min(kk, len(pos)))
        losses.append(1 - torch.stack(recalls).mean())
    return torch.stack(losses).mean()


@pytest.mark.parametrize("classes", [4, 6])
def test_smooth_ap_equals_pytorch_metric_learning(classes: int) -> None:
    # pytorch-metric-learning's SmoothAPLoss needs equal-size classes sorted by class; it reshapes the
    # batch as (samples per class, classes), which groups the right items only when both are equal
    y = torch.arange(classes).repeat_interleave(classes)
    for seed in range(3):
        e = _emb(len(y), 8, seed)
        v, g = _value_grad(smooth_ap_loss, e, y, temperature=0.01)
        rv, rg = _value_grad(pml_losses.SmoothAPLoss(temperature=0.01), e, y)
        # its per-query AP buffer is float32: agreement to float32 rounding
        assert abs(float(v - rv)) < 1e-6
        torch.testing.assert_close(g, rg, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("include_query", [True, False])
def test_smooth_ap_matches_loop_reference_on_any_labels(include_query: bool) -> None:
    y = torch.tensor([0, 1, 0, 2, 1, 0, 3, 2, 2])  # unequal classes, one singleton
    e = _emb(len(y), 5, 3)
    v, g = _value_grad(smooth_ap_loss, e, y, temperature=0.1, include_query=include_query)
    rv, rg = _value_grad(_smooth_ap_ref, e, y, 0.1, include_query)
    torch.testing.assert_close(v, rv)
    torch.testing.assert_close(g, rg)


@pytest.mark.parametrize("include_query", [True, False])
def test_recall_at_k_matches_loop_reference(include_query: bool) -> None:
    y = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 3])
    e = _emb(len(y), 6, 4)
    ks = (1, 2, 4, 16)
    v, g = _value_grad(recall_at_k_loss, e, y, k=ks, temperature=0.05, include_query=include_query)
    rv, rg = _value_grad(_recall_ref, e, y, ks, 0.05, include_query)
    torch.testing.assert_close(v, rv)
    torch.testing.assert_close(g, rg)


def test_recall_at_k_authors_query_convention() -> None:
    # with the query among the ranked items, the best positive ranks 2nd: at k = 1 and a tiny rank
    # temperature nothing is found, so the loss is 1 - sigmoid((1 - 2) / 1) for two perfect clusters
    y = torch.tensor([0, 0, 1, 1])
    e = torch.tensor([[1.0, 0, 0], [1, 0.15, 0], [0, 1, 0], [0, 1, 0.15]], dtype=torch.float64)
    with_q = recall_at_k_loss(e, y, k=1, temperature=1e-4)
    without = recall_at_k_loss(e, y, k=1, temperature=1e-4, include_query=False)
    torch.testing.assert_close(with_q, torch.tensor(1 - torch.sigmoid(torch.tensor(-1.0)).item(), dtype=torch.float64))
    torch.testing.assert_close(without, torch.tensor(0.5, dtype=torch.float64))  # rank 1: sigmoid(0)


@pytest.mark.parametrize(("b", "classes"), [(16, 3), (40, 5), (64, 20)])
def test_fastap_equals_pytorch_metric_learning(b: int, classes: int) -> None:
    for seed in range(3):
        g = torch.Generator().manual_seed(100 + seed)
        y = torch.randint(classes, (b,), generator=g)
        e = _emb(b, 8, seed)
        for bins in (10, 3):
            v, gr = _value_grad(fastap_loss, e, y, num_bins=bins)
            rv, rg = _value_grad(pml_losses.FastAPLoss(num_bins=bins), e, y)
            torch.testing.assert_close(v, rv.to(v.dtype), rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(gr, rg, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("include_query", [True, False])
def test_blackbox_ap_forward_is_exact_average_precision(include_query: bool) -> None:
    from sklearn.metrics import average_precision_score

    y = torch.tensor([0, 1, 0, 2, 1, 0, 3, 2, 2, 1])
    e = _emb(len(y), 4, 5)
    v = blackbox_ap_loss(e, y, margin=0.0, include_query=include_query)
    z = F.normalize(e.detach(), dim=1)
    s = (z @ z.T).numpy()
    yn = y.numpy()
    aps = []
    for q in range(len(yn)):
        keep = np.ones(len(yn), bool) if include_query else np.arange(len(yn)) != q
        rel = (yn == yn[q])[keep]
        if rel.sum() - int(include_query) < 1:
            continue
        aps.append(average_precision_score(rel, s[q][keep]))
    assert float(v) == pytest.approx(1 - np.mean(aps), abs=1e-12)


def test_blackbox_ap_gradient_is_the_blackbox_interpolation() -> None:
    # the gradient on the similarity scores is -(r(s) - r(s + lambda * dL/dr)) / lambda
    from rankwise.ops.ranking import rank_last

    y = torch.tensor([0, 1, 0, 1, 0, 1])
    e = _emb(len(y), 3, 6)
    lam = 3.0
    captured: dict[str, torch.Tensor] = {}
    orig = retrieval_mod.BlackboxRankFunction.apply

    def spy(scores, *args):  # type: ignore[no-untyped-def]
        scores.register_hook(lambda g: captured.setdefault("ds", g))
        r = orig(scores, *args)
        r.register_hook(lambda g: captured.setdefault("dr", g))
        captured["s"] = scores.detach()
        return r

    retrieval_mod.BlackboxRankFunction.apply = spy  # type: ignore[method-assign]
    try:
        blackbox_ap_loss(e, y, interpolation_lambda=lam, margin=0.0).backward()
    finally:
        retrieval_mod.BlackboxRankFunction.apply = orig  # type: ignore[method-assign]
    s, dr = captured["s"], captured["dr"]
    expected = -(rank_last(s, True, "ordinal") - rank_last(s + lam * dr, True, "ordinal")) / lam
    torch.testing.assert_close(captured["ds"], expected)
    assert captured["ds"].abs().sum() > 0


@pytest.mark.parametrize("fn", [smooth_ap_loss, recall_at_k_loss])
def test_blocks_give_the_same_value_and_gradient(fn, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    y = torch.tensor([0, 1, 0, 2, 1, 0, 3, 2, 2, 1, 3])
    e = _emb(len(y), 4, 7)
    v, g = _value_grad(fn, e, y, temperature=0.1)
    # the pairwise tensor is (queries, positives, B) with at most 3 positives: blocks of 3-4 queries
    monkeypatch.setattr(retrieval_mod, "_BLOCK_ELEMENTS", 9 * len(y))
    bv, bg = _value_grad(fn, e, y, temperature=0.1)
    torch.testing.assert_close(v, bv)
    torch.testing.assert_close(g, bg)


@pytest.mark.parametrize("fn", [smooth_ap_loss, recall_at_k_loss, blackbox_ap_loss, fastap_loss])
def test_perfect_clusters_give_low_loss_and_shuffled_ones_high(fn) -> None:  # type: ignore[no-untyped-def]
    y = torch.arange(4).repeat_interleave(4)
    centers = torch.eye(8, dtype=torch.float64)[:4]
    good = centers[y] + 0.01 * torch.randn(16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    bad = centers[y[torch.randperm(16, generator=torch.Generator().manual_seed(1))]] + 0.01 * good
    assert float(fn(good, y)) < float(fn(bad, y))


def test_argument_errors() -> None:
    e, y = _emb(4, 3, 0), torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="embeddings"):
        smooth_ap_loss(e[None], y)
    with pytest.raises(ValueError, match="labels"):
        fastap_loss(e, y[:3])
    with pytest.raises(ValueError, match="k"):
        recall_at_k_loss(e, y, k=(1, 0))
    with pytest.raises(ValueError, match="k_temperatures"):
        recall_at_k_loss(e, y, k=(1, 2), k_temperatures=(1.0,))
    with pytest.raises(ValueError, match="interpolation_lambda"):
        blackbox_ap_loss(e, y, interpolation_lambda=0.0)
    with pytest.raises(ValueError, match="num_bins"):
        fastap_loss(e, y, num_bins=0)


@pytest.mark.parametrize("name", ["smooth_ap", "recall_at_k", "blackbox_ap", "fastap", "supcon"])
@pytest.mark.parametrize("scale", [1e20, 1e-20])
def test_cosine_losses_are_scale_free_at_any_finite_magnitude(name: str, scale: float) -> None:
    # the L2 normalisation squared 1e20 to inf (all similarities 0) and 1e-20 to 0 in float32
    from rankwise.losses import LOSSES

    entry = next(e for e in LOSSES.entries() if e.name == name)
    kw = dict(factories("loss", name).example(torch.float32, torch.device("cpu")).kwargs)
    x = torch.randn(12, 6, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(12) % 4
    ref = entry.fn(x.double().requires_grad_(), labels, **kw)
    xs = (x * scale).requires_grad_()
    got = entry.fn(xs, labels, **kw)
    got.backward()
    assert torch.isfinite(xs.grad).all()
    torch.testing.assert_close(got.double(), ref.detach(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["smooth_ap_loss", "recall_at_k_loss", "blackbox_ap_loss", "fastap_loss"])
def test_compiles_fullgraph_without_gradients(name: str) -> None:
    # evaluation (no input requiring grad, or torch.no_grad): dynamo inlined the per-query autograd.Function
    # and lost its arguments ("AttributeError: shape")
    import rankwise

    fn = getattr(rankwise.losses, name)
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(3))
    labels = torch.arange(6) % 2
    compiled = torch.compile(lambda v: fn(v, labels), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), fn(x, labels))
    xg = x.clone().requires_grad_()
    with torch.no_grad():
        torch.testing.assert_close(compiled(xg), fn(xg, labels))


# ----------------------------------------------------------------------------------------------
# Similarity Mixup (SiMix) of the Recall@k surrogate
# ----------------------------------------------------------------------------------------------
def _mixed_embeddings(e: torch.Tensor, y: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit virtual embeddings: every same-label pair a < b (row-major order), alpha ~ U(0, 1)."""
    z = F.normalize(e, dim=1)
    pairs = [(a, b) for a in range(len(y)) for b in range(a + 1, len(y)) if y[a] == y[b]]
    alpha = torch.rand(len(pairs), generator=torch.Generator().manual_seed(seed), dtype=torch.float32).to(e.dtype)
    fakes = [alpha[i] * z[a] + (1 - alpha[i]) * z[b] for i, (a, b) in enumerate(pairs)]
    labels = torch.tensor([int(y[a]) for a, _ in pairs], dtype=y.dtype)
    if not fakes:
        return z, y
    return torch.cat([z, torch.stack(fakes)]), torch.cat([y, labels])


def test_mixup_similarities_are_those_of_the_mixed_embeddings() -> None:
    e, y = _emb(7, 4, 11), torch.tensor([0, 1, 0, 2, 1, 0, 3])
    bt = retrieval_mod._batch(e, y, False)
    got = retrieval_mod._similarity_mixup(bt, y, torch.Generator().manual_seed(5))
    zm, ym = _mixed_embeddings(e, y, 5)
    assert got.sim.shape == (7 + 4, 7 + 4)  # 3 pairs of class 0, 1 of class 1
    torch.testing.assert_close(got.sim, zm @ zm.T)
    ref_pos = (ym[:, None] == ym[None, :]) & ~torch.eye(len(ym), dtype=torch.bool)
    assert torch.equal(got.pos, ref_pos)
    # a virtual item is not unit norm: its self-similarity is below 1
    assert bool((got.sim.diagonal()[7:] < 1).all())


@pytest.mark.parametrize("include_query", [True, False])
def test_mixup_loss_matches_loop_reference_on_mixed_embeddings(include_query: bool) -> None:
    e, y = _emb(9, 5, 12), torch.tensor([0, 0, 1, 2, 1, 0, 2, 2, 3])
    ks = (1, 2, 4, 16)
    gen = torch.Generator().manual_seed(7)
    kw: dict[str, Any] = {"k": ks, "temperature": 0.05, "include_query": include_query}
    v, g = _value_grad(recall_at_k_loss, e, y, mixup=True, generator=gen, **kw)

    def ref(x: torch.Tensor) -> torch.Tensor:
        zm, ym = _mixed_embeddings(x, y, 7)
        return _recall_ref(zm, ym, ks, 0.05, include_query, normalize=False, k_clip=len(y))

    rv, rg = _value_grad(ref, e)
    torch.testing.assert_close(v, rv)
    torch.testing.assert_close(g, rg)
    assert float(g.abs().sum()) > 0
    # the virtual items change the loss
    assert not torch.allclose(v, recall_at_k_loss(e, y, **kw).detach())


def test_mixup_is_deterministic_under_a_generator_and_off_by_default() -> None:
    e, y = _emb(8, 4, 13), torch.arange(8) % 3
    kw: dict[str, Any] = {"k": (1, 2), "temperature": 0.1}
    a = recall_at_k_loss(e, y, mixup=True, generator=torch.Generator().manual_seed(1), **kw)
    b = recall_at_k_loss(e, y, mixup=True, generator=torch.Generator().manual_seed(1), **kw)
    c = recall_at_k_loss(e, y, mixup=True, generator=torch.Generator().manual_seed(2), **kw)
    assert torch.equal(a, b) and not torch.equal(a, c)
    off = recall_at_k_loss(e, y, **kw)
    torch.testing.assert_close(off, recall_at_k_loss(e, y, mixup=False, **kw), rtol=0, atol=0)
    torch.testing.assert_close(off, _recall_ref(e, y, (1, 2), 0.1, True), rtol=1e-12, atol=1e-12)
    module = retrieval_mod.RecallAtKLoss(mixup=True, generator=torch.Generator().manual_seed(1), **kw)
    assert torch.equal(module(e, y), a) and "mixup=True" in repr(module)


@pytest.mark.parametrize(
    "labels",
    [[0], [0, 0, 0, 0], [0, 1, 2, 3], [0, 0, 1, 2], []],
    ids=["B1", "one-class", "singletons", "pair", "empty"],
)
def test_mixup_degenerate_batches_are_finite_and_keep_the_graph(labels: list[int]) -> None:
    e = _emb(len(labels), 3, 14)
    y = torch.tensor(labels, dtype=torch.long)
    v = recall_at_k_loss(e, y, mixup=True, generator=torch.Generator().manual_seed(0))
    assert v.requires_grad and torch.isfinite(v)
    (g,) = torch.autograd.grad(v, e)
    assert torch.isfinite(g).all()
    if len(labels) == 4 and len(set(labels)) == 4:  # no positives, no pairs: exactly the loss without mixup
        assert float(v.detach()) == 0.0


def test_mixup_argument_errors() -> None:
    e, y = _emb(4, 3, 0), torch.tensor([0, 0, 1, 1])
    with pytest.raises(TypeError, match="mixup"):
        recall_at_k_loss(e, y, mixup=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="generator"):
        recall_at_k_loss(e, y, mixup=True, generator=0)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# blackbox AP: the authors' random margin
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("include_query", [True, False])
def test_blackbox_ap_random_margin_is_exact_ap_of_the_randomly_shifted_scores(include_query: bool) -> None:
    from sklearn.metrics import average_precision_score

    y = torch.tensor([0, 1, 0, 2, 1, 0, 3, 2, 2, 1])
    e = _emb(len(y), 4, 15)
    margin = 0.3
    v = blackbox_ap_loss(
        e, y, margin=margin, include_query=include_query, random_margin=True, generator=torch.Generator().manual_seed(4)
    )
    z = F.normalize(e.detach(), dim=1)
    s = (z @ z.T).numpy()
    xi = torch.randn(len(y), len(y), generator=torch.Generator().manual_seed(4)).double().abs().numpy()
    yn = y.numpy()
    aps = []
    for q in range(len(yn)):
        rel_all = yn == yn[q]
        if not include_query:
            rel_all[q] = False
        shifted = s[q] - margin * xi[q] * (rel_all - 0.5)
        keep = np.ones(len(yn), bool) if include_query else np.arange(len(yn)) != q
        rel = (yn == yn[q])[keep]
        if rel.sum() - int(include_query) < 1:
            continue
        aps.append(average_precision_score(rel, shifted[keep]))
    assert float(v.detach()) == pytest.approx(1 - np.mean(aps), abs=1e-12)
    # the deterministic margin ranks differently at this margin size
    fixed = blackbox_ap_loss(e, y, margin=margin, include_query=include_query)
    assert float(fixed.detach()) != pytest.approx(float(v.detach()), abs=1e-9)


def test_blackbox_ap_random_margin_is_seeded_and_off_by_default() -> None:
    y = torch.tensor([0, 1, 0, 2, 1, 0, 3, 2, 2, 1])
    e = _emb(len(y), 4, 16)

    def run(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        kw: dict[str, Any] = {
            "margin": 0.5,
            "interpolation_lambda": 100.0,
            "random_margin": True,
            "generator": torch.Generator().manual_seed(seed),
        }
        return _value_grad(blackbox_ap_loss, e, y, **kw)

    (a, ga), (b, gb), (c, _) = run(1), run(1), run(3)
    assert torch.equal(a, b) and torch.equal(ga, gb) and not torch.equal(a, c)
    assert torch.isfinite(ga).all() and float(ga.abs().sum()) > 0
    off = blackbox_ap_loss(e, y, margin=0.5)
    assert torch.equal(off, blackbox_ap_loss(e, y, margin=0.5, random_margin=False))
    module = retrieval_mod.BlackboxAPLoss(
        margin=0.5, interpolation_lambda=100.0, random_margin=True, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(module(e, y).detach(), a) and "random_margin=True" in repr(module)
    with pytest.raises(TypeError, match="random_margin"):
        blackbox_ap_loss(e, y, random_margin=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["smooth_ap", "recall_at_k", "recall_at_k.mixup"])
@pytest.mark.parametrize("include_query", [True, False])
@pytest.mark.parametrize("block", [None, 1])
def test_positive_anchors_equal_all_item_ranks(
    name: str, include_query: bool, block: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the CPU path ranks the positives only (gathered, padded to the largest count); the all-items
    # path (other devices, traced graphs) ranks every item and masks: same values and gradients
    y = torch.tensor([0, 1, 0, 2, 1, 0, 3, 2, 2, 1, 4, 0, 0])  # unequal classes, a singleton
    e = _emb(len(y), 5, 11)
    kw: dict[str, Any] = {"temperature": 0.05, "include_query": include_query}
    fn = smooth_ap_loss if name == "smooth_ap" else recall_at_k_loss
    if name == "recall_at_k.mixup":
        kw["mixup"] = True
    gen = kw.get("mixup") and torch.Generator()

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        extra = {"generator": gen.manual_seed(5)} if gen else {}
        return _value_grad(fn, e, y, **kw, **extra)

    if block is not None:
        monkeypatch.setattr(retrieval_mod, "_BLOCK_ELEMENTS", block)  # one query per block
    seen: list[tuple[int, int]] = []
    anchors = retrieval_mod._anchors

    def spy(pos: torch.Tensor, *, gather: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        index, mask = anchors(pos, gather=gather)
        seen.append((index.shape[1], pos.shape[1]))
        return index, mask

    monkeypatch.setattr(retrieval_mod, "_anchors", spy)
    v, g = run()
    monkeypatch.setattr(retrieval_mod, "_anchors", lambda pos: anchors(pos, gather=False))
    dv, dg = run()
    # the gathered path ranked fewer anchors than items
    assert seen and seen[0][0] < seen[0][1]
    torch.testing.assert_close(v, dv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, dg, rtol=1e-10, atol=1e-12)
    assert float(g.abs().sum()) > 0
