"""SoDeep sorter architectures, synthetic data, weights I/O and the updating wrapper."""

from __future__ import annotations

import pytest
import torch

from rankwise.ops.ranking import rank
from rankwise.sodeep import (
    FAMILIES,
    ExactSorter,
    MLPSorter,
    RNNSorter,
    SorterUpdater,
    build_sorter,
    generate,
    load_sorter,
    mixed_batch,
    save_sorter,
    standardize,
)
from tests.conftest import gradcheck


def _tiny(model: str, n: int) -> torch.nn.Module:
    if model in ("gru", "lstm"):
        return build_sorter(model, n, hidden_size=4, num_layers=1)
    if model == "mlp":
        return build_sorter(model, n, hidden_size=8, num_layers=1)
    return build_sorter(model, n, temperature=0.5)


def _slow_pairwise_sigmoid(x: list[float], temperature: float) -> list[float]:
    """The analytic sorter written straight from its formula (Python loops), descending normalized."""
    import math

    n = len(x)
    mean = sum(x) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / n)
    z = [(v - mean) / std for v in x]
    out = []
    for i in range(n):
        r = 0.5 + sum(1 / (1 + math.exp(-(z[i] - z[j]) / temperature)) for j in range(n))
        out.append((n + 1 - r) / n)
    return out


# ------------------------------------------------------------------------------------------------ models
@pytest.mark.parametrize("model", ["gru", "lstm", "mlp", "exact"])
def test_shapes_and_orders(model: str, dtype: torch.dtype) -> None:
    n = 6
    s = _tiny(model, n).to(dtype)
    x = torch.randn(2, 3, n, dtype=dtype)
    desc = s(x)
    asc = s(x, descending=False)
    assert desc.shape == x.shape and desc.dtype == dtype
    # the two conventions are mirror images: desc + asc = (n + 1) / n
    torch.testing.assert_close(desc + asc, torch.full_like(x, (n + 1) / n))


def test_exact_sorter_matches_ranks_and_slow_formula() -> None:
    x = torch.tensor([[3.0, -1.0, 2.0, 10.0, 0.5]], dtype=torch.float64)
    s = ExactSorter(5, temperature=1e-3)
    torch.testing.assert_close(s(x), rank(x, descending=True, normalize=True))
    torch.testing.assert_close(s(x, descending=False), rank(x, normalize=True))
    s2 = ExactSorter(5, temperature=0.3)
    torch.testing.assert_close(s2(x)[0], torch.tensor(_slow_pairwise_sigmoid(x[0].tolist(), 0.3), dtype=torch.float64))


def test_exact_sorter_constant_and_ties() -> None:
    s = ExactSorter(4)
    for c in (0.0, 5.0, -1e4):
        out = s(torch.full((2, 4), c))
        torch.testing.assert_close(out, torch.full((2, 4), 2.5 / 4))  # mean rank (n + 1) / 2, normalized
    x = torch.tensor([1.0, 1.0, 2.0, 3.0], requires_grad=True)
    out = ExactSorter(4, temperature=1e-4)(x, descending=False) * 4
    torch.testing.assert_close(out, torch.tensor([1.5, 1.5, 3.0, 4.0]))
    xc = torch.full((4,), 2.0, requires_grad=True)
    s(xc).sum().backward()
    assert torch.isfinite(xc.grad).all()


@pytest.mark.parametrize("model", ["gru", "lstm", "mlp", "exact"])
def test_gradcheck_float64(model: str) -> None:
    s = _tiny(model, 5).double()
    x = torch.randn(2, 5, dtype=torch.float64)
    assert gradcheck(lambda t: s(t), x)
    assert gradcheck(lambda t: s(t, descending=False), x)


@pytest.mark.parametrize("model", ["gru", "mlp", "exact"])
def test_scale_offset_invariance(model: str) -> None:
    s = _tiny(model, 8).double()
    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(s(x * 250.0 - 17.0), s(x), rtol=1e-6, atol=1e-6)


def test_standardize_constant_rows_give_zeros() -> None:
    x = torch.full((2, 7), 1234.5678)
    assert standardize(x).abs().max() == 0
    z = standardize(torch.tensor([[1.0, 2.0, 3.0]]))
    torch.testing.assert_close(z.mean(-1), torch.zeros(1), atol=1e-6, rtol=0)
    torch.testing.assert_close(z.pow(2).mean(-1), torch.ones(1), atol=1e-5, rtol=0)


def test_trivial_lengths() -> None:
    s = _tiny("gru", 4)
    x = torch.randn(3, 1, requires_grad=True)
    out = s(x)
    torch.testing.assert_close(out, torch.ones(3, 1))
    out.sum().backward()
    assert x.grad is not None
    assert s(torch.zeros(2, 0)).shape == (2, 0)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"seq_len=8.*length 5"):
        MLPSorter(8)(torch.randn(2, 5))
    with pytest.raises(TypeError, match=r"`x` must be a floating-point tensor"):
        RNNSorter(4)(torch.arange(4))
    with pytest.raises(ValueError, match=r"0-d"):
        ExactSorter(4)(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"`model` must be one of"):
        build_sorter("transformer", 8)
    with pytest.raises(ValueError, match=r"`seq_len` must be a positive int, got 0"):
        RNNSorter(0)
    with pytest.raises(ValueError, match=r"`temperature` must be finite and > 0"):
        ExactSorter(4, temperature=0.0)


# ------------------------------------------------------------------------------------------------ data
@pytest.mark.parametrize("family", FAMILIES)
def test_families_shape_and_determinism(family: str) -> None:
    a = generate(family, 5, 16, seed=3)
    b = generate(family, 5, 16, seed=3)
    c = generate(family, 5, 16, seed=4)
    assert a.shape == (5, 16) and a.dtype == torch.float32
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)


def test_family_properties() -> None:
    ramps = generate("ramp", 50, 10, seed=0, scale_offset=False)
    d = ramps.diff(dim=-1)
    assert ((d > 0).all(-1) | (d < 0).all(-1)).all()
    shuffled = generate("shuffled_ramp", 4, 10, seed=0, scale_offset=False)
    torch.testing.assert_close(shuffled.sort(-1).values, torch.linspace(0, 1, 10).expand(4, 10))
    ties = generate("ties", 20, 32, seed=0)
    assert (ties.sort(-1).values.diff(dim=-1) == 0).any(-1).all()  # every row has ties


def test_mixed_batch_determinism_and_bad_family() -> None:
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    torch.testing.assert_close(mixed_batch(20, 8, generator=g1), mixed_batch(20, 8, generator=g2), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"`family` must be one of"):
        generate("cauchy", 2, 4, seed=0)


# ------------------------------------------------------------------------------------------------ weights I/O
def test_save_load_roundtrip(tmp_path) -> None:
    s = _tiny("gru", 6)
    path = save_sorter(s, tmp_path / "s.pt", metrics={"spearman": 0.5}, train={"steps": 1})
    payload = torch.load(path, weights_only=True)
    assert payload["model"] == "gru" and payload["hparams"]["hidden_size"] == 4
    s2 = load_sorter(path)
    x = torch.randn(3, 6)
    torch.testing.assert_close(s2(x), s(x))
    assert s2.metadata["metrics"]["spearman"] == 0.5
    torch.save({"foo": 1}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"must be a sorter file"):
        load_sorter(tmp_path / "bad.pt")


# ------------------------------------------------------------------------------------------------ updater
@pytest.mark.slow
def test_updater_collects_and_refines() -> None:
    torch.manual_seed(0)
    s = build_sorter("gru", 8, hidden_size=8, num_layers=1).requires_grad_(False)
    upd = SorterUpdater(s, buffer_size=16, lr=1e-2)
    upd.train()
    out = upd(torch.randn(2, 5, 8))
    assert out.shape == (2, 5, 8) and len(upd) == 10
    upd(torch.randn(10, 8))
    assert len(upd) == 16  # ring buffer is full
    upd.eval()
    upd(torch.randn(3, 8))
    assert len(upd) == 16  # not recorded in eval mode
    g = torch.Generator().manual_seed(0)
    losses = upd.refine(steps=40, batch_size=16, generator=g)
    assert len(losses) == 40
    assert sum(losses[-10:]) < sum(losses[:10])
    assert not any(p.requires_grad for p in s.parameters())  # state restored


def test_updater_bad_inputs() -> None:
    upd = SorterUpdater(build_sorter("gru", 8, hidden_size=4, num_layers=1), buffer_size=4)
    with pytest.raises(ValueError, match=r"needs recorded sequences"):
        upd.refine(steps=1)
    with pytest.raises(ValueError, match=r"seq_len=8"):
        upd.collect(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"`buffer_size` must be a positive int"):
        SorterUpdater(build_sorter("gru", 8), buffer_size=0)
    with pytest.raises(TypeError, match=r"`sorter` must be a rankwise.sodeep Sorter"):
        SorterUpdater(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ evaluation
def test_metrics_of_exact_sorter_are_perfect() -> None:
    from rankwise.sodeep.train import evaluate_sorter, sorter_metrics

    x = generate("normal", 16, 12, seed=0)
    m = sorter_metrics(ExactSorter(12, temperature=1e-4), x)
    assert m["spearman"] == pytest.approx(1.0) and m["exact_order"] == 1.0
    assert m["mae_rank"] < 1e-3
    rep = evaluate_sorter(ExactSorter(12, temperature=1e-4), num=4, real=False)
    assert set(rep) == {*FAMILIES, "families_mean"}
    assert rep["families_mean"]["spearman"] == pytest.approx(1.0)


def test_metrics_count_a_constant_sequence_as_correlated() -> None:
    """All-tied sequences have constant exact ranks: their correlations are reported as 1."""
    from rankwise.sodeep.train import sorter_metrics

    m = sorter_metrics(ExactSorter(6, temperature=1e-4), torch.ones(3, 6))
    assert m["spearman"] == 1.0 and m["pearson"] == 1.0


def test_real_score_sequences() -> None:
    pytest.importorskip("sklearn")
    from rankwise.sodeep.train import real_score_sequences

    seqs = real_score_sequences(32, 5, seed=0)
    assert "diabetes_ridge" in seqs
    for x in seqs.values():
        assert x.shape == (5, 32) and torch.isfinite(x).all()
    again = real_score_sequences(32, 5, seed=0)
    for k in seqs:
        torch.testing.assert_close(seqs[k], again[k])
