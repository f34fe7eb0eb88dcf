"""Metrics of ordinal predictions against scikit-learn, SciPy and NumPy; the streaming (torchmetrics)
versions against the functional ones, in pieces, with masks, and on 2 gloo processes."""

from __future__ import annotations

import json
import math
import time
import warnings
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rankwise import metrics as rm
from rankwise.imbalanced import regression_metrics

sklearn_metrics = pytest.importorskip("sklearn.metrics")
stats = pytest.importorskip("scipy.stats")
pytest.importorskip("torchmetrics")

from rankwise.metrics.streaming import OrdinalMetrics, real_sample_mask  # noqa: E402

NAN = math.nan
KEYS = {"mae", "rmse", "gm", "exact_acc", "off_by_one_acc", "qwk", "spearman", "kendall"}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _data(n: int, k: int, seed: int, *, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer targets in [0, k) and noisy continuous predictions around them (many ties after rounding)."""
    g = _gen(seed)
    t = torch.randint(0, k, (n,), generator=g)
    p = (t + 1.5 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype)
    return p, t


def _quiet(fn: Any, *args: Any, **kwargs: Any) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(fn(*args, **kwargs))


def _same(a: float, b: float, tol: float = 1e-12) -> bool:
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol


# --------------------------------------------------------------------------------------------------
# functional metrics against the references
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_errors_match_numpy_and_sklearn(dtype: torch.dtype) -> None:
    p, t = _data(500, 9, 0, dtype=dtype)
    pn, tn = p.double().numpy(), t.double().numpy()
    mae, rmse = rm.mean_absolute_error(p, t), rm.root_mean_squared_error(p, t)
    assert mae.dtype == dtype and mae.shape == () and rmse.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    assert abs(mae.item() - sklearn_metrics.mean_absolute_error(tn, pn)) <= tol
    assert abs(rmse.item() - math.sqrt(sklearn_metrics.mean_squared_error(tn, pn))) <= tol
    gm = rm.geometric_mean_absolute_error(p, t).item()
    assert abs(gm - stats.gmean(np.abs(pn - tn))) <= tol * 10
    assert abs(gm - regression_metrics(p, t, [0])["all"]["gmean"]) <= tol * 10
    assert rm.geometric_mean_absolute_error(torch.tensor([1.0, 2.0]), torch.tensor([1, 5])).item() == 0.0


def test_integer_inputs_give_the_default_dtype() -> None:
    out = rm.mean_absolute_error(torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3]))
    assert out.dtype == torch.get_default_dtype() and out.item() == pytest.approx(1 / 3)


@pytest.mark.parametrize("tolerance", [0, 1, 2, 0.5])
def test_accuracy_within_matches_numpy_rounding(tolerance: float) -> None:
    p, t = _data(400, 12, 1)
    p[:20] = torch.arange(20) + 0.5  # halves: round to even, as numpy
    ref = float(np.mean(np.abs(np.round(p.numpy()) - t.numpy()) <= tolerance))
    assert rm.accuracy_within(p, t, tolerance=tolerance).item() == ref
    if tolerance == 0:
        assert rm.exact_accuracy(p, t).item() == ref
        assert ref == sklearn_metrics.accuracy_score(t.numpy(), np.round(p.numpy()).astype(np.int64))
    if tolerance == 1:
        assert rm.off_by_one_accuracy(p, t).item() == ref


@pytest.mark.parametrize("weights", ["quadratic", "linear", None])
@pytest.mark.parametrize("k", [2, 3, 5, 11, 30])
def test_kappa_matches_sklearn(k: int, weights: str | None) -> None:
    worst = 0.0
    for seed in range(4):
        p, t = _data(60 + 40 * seed, k, 10 * k + seed)
        pr = np.round(p.numpy())
        ref = sklearn_metrics.cohen_kappa_score(t.numpy(), pr, weights=weights)
        got = rm.quadratic_weighted_kappa(p, t, weights=weights).item()
        worst = max(worst, abs(got - ref))
        # num_classes=K: the classes 0..K-1 themselves (sklearn's `labels`), predictions clipped into them
        clipped = np.clip(pr, 0, k - 1)
        ref_k = sklearn_metrics.cohen_kappa_score(t.numpy(), clipped, weights=weights, labels=np.arange(k))
        got_k = rm.quadratic_weighted_kappa(p, t, num_classes=k, weights=weights).item()
        worst = max(worst, abs(got_k - ref_k))
    assert worst <= 1e-12


def test_kappa_positions_vs_class_distances() -> None:
    """Without ``num_classes`` the weights use positions among the present labels, as scikit-learn."""
    p, t = torch.tensor([0.0, 5.0, 2.0]), torch.tensor([0, 2, 5])
    ref = sklearn_metrics.cohen_kappa_score([0, 2, 5], [0, 5, 2], weights="quadratic")
    assert rm.quadratic_weighted_kappa(p, t).item() == pytest.approx(ref, abs=1e-7)
    ref6 = sklearn_metrics.cohen_kappa_score([0, 2, 5], [0, 5, 2], weights="quadratic", labels=np.arange(6))
    assert rm.quadratic_weighted_kappa(p, t, num_classes=6).item() == pytest.approx(ref6, abs=1e-7)
    assert abs(ref - ref6) > 0.01


def test_kappa_defined_values() -> None:
    one = torch.tensor([2.0, 2.0, 1.8])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isnan(sklearn_metrics.cohen_kappa_score([2, 2, 2], [2, 2, 2], weights="quadratic"))
    for weights in ("quadratic", "linear", None):
        assert rm.quadratic_weighted_kappa(one, torch.tensor([2, 2, 2]), weights=weights).item() == 1.0
        assert rm.quadratic_weighted_kappa(one, torch.tensor([2, 2, 2]), num_classes=4, weights=weights).item() == 1.0
    assert rm.quadratic_weighted_kappa(torch.tensor([3.0]), torch.tensor([3])).item() == 1.0  # N = 1
    assert math.isnan(rm.quadratic_weighted_kappa(torch.empty(0), torch.empty(0)).item())
    assert math.isnan(rm.quadratic_weighted_kappa(torch.tensor([NAN, 1.0]), torch.tensor([1, 1])).item())
    assert rm.quadratic_weighted_kappa(torch.tensor([1.0]), torch.tensor([0]), num_classes=1).item() == 1.0


def _brute_kendall(p: np.ndarray, t: np.ndarray) -> float:
    s = 0.0
    n1 = n2 = 0
    for i, j in combinations(range(len(p)), 2):
        dp, dt = np.sign(p[i] - p[j]), np.sign(t[i] - t[j])
        s += dp * dt
        n1 += dp == 0
        n2 += dt == 0
    n0 = len(p) * (len(p) - 1) // 2
    return s / math.sqrt((n0 - n1) * (n0 - n2))


@pytest.mark.parametrize("k", [2, 3, 7, 30])
def test_rank_correlations_match_scipy_with_ties(k: int) -> None:
    worst_s = worst_k = 0.0
    for seed in range(5):
        n = (3, 17, 64, 201, 1000)[seed]
        p, t = _data(n, k, 100 * k + seed)
        for pp in (p, p.round()):  # continuous predictions, and rounded ones full of ties
            rho = rm.spearman_correlation(pp, t).item()
            tau = rm.kendall_tau(pp, t).item()
            ref_rho = _quiet(lambda a, b: stats.spearmanr(a, b).statistic, pp.numpy(), t.numpy())
            ref_tau = _quiet(lambda a, b: stats.kendalltau(a, b).statistic, pp.numpy(), t.numpy())
            assert _same(rho, ref_rho, 1e-12) and _same(tau, ref_tau, 1e-12), (n, rho, ref_rho, tau, ref_tau)
            worst_s = max(worst_s, abs(rho - ref_rho) if not math.isnan(ref_rho) else 0.0)
            worst_k = max(worst_k, abs(tau - ref_tau) if not math.isnan(ref_tau) else 0.0)
            if n <= 64:
                assert tau == pytest.approx(_brute_kendall(pp.numpy(), t.numpy()), abs=1e-12)
    assert worst_s <= 1e-12 and worst_k <= 1e-12


def test_rank_correlations_degenerate_inputs_are_nan_as_scipy() -> None:
    cases = [
        (torch.empty(0), torch.empty(0)),
        (torch.tensor([1.0]), torch.tensor([2])),
        (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4, 4, 4])),
        (torch.tensor([5.0, 5.0, 5.0]), torch.tensor([1, 2, 3])),
        (torch.tensor([NAN, 2.0, 3.0]), torch.tensor([1, 2, 3])),
    ]
    for p, t in cases:
        assert math.isnan(rm.spearman_correlation(p, t).item())
        assert math.isnan(rm.kendall_tau(p, t).item())
        if p.numel() >= 1 and not torch.isnan(p).any():
            assert math.isnan(_quiet(lambda a, b: stats.spearmanr(a, b).statistic, p.numpy(), t.numpy()))
            assert math.isnan(_quiet(lambda a, b: stats.kendalltau(a, b).statistic, p.numpy(), t.numpy()))
    two = torch.tensor([1.0, 2.0]), torch.tensor([2, 1])
    assert rm.spearman_correlation(*two).item() == pytest.approx(-1.0) and rm.kendall_tau(*two).item() == -1.0


def test_kendall_large_n_matches_scipy_in_bounded_memory() -> None:
    n = 100_000
    g = _gen(7)
    t = torch.randint(0, 40, (n,), generator=g)
    p = (t + 4 * torch.randn(n, generator=g, dtype=torch.float64)).round(decimals=1)
    start = time.perf_counter()
    tau = rm.kendall_tau(p, t).item()
    took = time.perf_counter() - start
    ref = stats.kendalltau(p.numpy(), t.numpy()).statistic
    assert abs(tau - ref) <= 1e-12 and took < 20
    assert abs(rm.spearman_correlation(p, t).item() - stats.spearmanr(p.numpy(), t.numpy()).statistic) <= 1e-12


def test_nan_and_empty_inputs() -> None:
    p, t = torch.tensor([1.0, NAN, 3.0]), torch.tensor([1, 2, 3])
    for fn in (rm.mean_absolute_error, rm.root_mean_squared_error, rm.exact_accuracy, rm.off_by_one_accuracy):
        assert math.isnan(fn(p, t).item())
        assert math.isnan(fn(torch.empty(0), torch.empty(0)).item())
    m = rm.ordinal_metrics(torch.empty(0), torch.empty(0, dtype=torch.long))
    assert set(m) == KEYS and all(math.isnan(v) for v in m.values())


def test_shot_group_mae_wraps_regression_metrics() -> None:
    p, t = _data(300, 10, 3)
    train = torch.randint(0, 10, (2000,), generator=_gen(4)) ** 2 % 10
    got = rm.shot_group_mae(p, t, train, many_shot=300, few_shot=150)
    ref = regression_metrics(p, t, train, many_shot=300, few_shot=150)
    assert set(got) == {"many", "medium", "few"}
    for name, value in got.items():
        assert ref[name]["count"] > 0 and abs(value.item() - ref[name]["mae"]) <= 1e-12
    empty = rm.shot_group_mae(p, t, [0] * 500)
    assert math.isnan(empty["medium"].item()) and regression_metrics(p, t, [0] * 500)["medium"]["mae"] is None


def test_ordinal_metrics_dict() -> None:
    p, t = _data(200, 6, 5)
    train = torch.randint(0, 6, (500,), generator=_gen(6))
    m = rm.ordinal_metrics(p, t, num_classes=6, train_labels=train, many_shot=90, few_shot=80)
    assert set(m) == KEYS | {"mae_many", "mae_medium", "mae_few"}
    assert all(type(v) is float for v in m.values())
    assert m["qwk"] == rm.quadratic_weighted_kappa(p, t, num_classes=6).item()
    assert m["kendall"] == rm.kendall_tau(p, t).item() and m["spearman"] == rm.spearman_correlation(p, t).item()
    assert m["mae_few"] == rm.shot_group_mae(p, t, train, many_shot=90, few_shot=80)["few"].item()


def test_argument_errors_name_the_argument() -> None:
    p, t = torch.tensor([1.0, 2.0]), torch.tensor([1, 2])
    with pytest.raises(ValueError, match=r"`predictions` and `targets` must have the same shape \(N,\)"):
        rm.mean_absolute_error(p, t[:1])
    with pytest.raises(ValueError, match="same shape"):
        rm.kendall_tau(p[:, None], t[:, None])
    with pytest.raises(TypeError, match=r"`predictions` must be a torch\.Tensor"):
        rm.spearman_correlation([1.0, 2.0], t)
    with pytest.raises(ValueError, match="`tolerance` must be finite and >= 0, got -1"):
        rm.accuracy_within(p, t, tolerance=-1)
    with pytest.raises(ValueError, match="`weights` must be one of 'quadratic', 'linear', None; got 'cubic'"):
        rm.quadratic_weighted_kappa(p, t, weights="cubic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`targets` must be integer classes in \[0, 1\] \(num_classes=2\), got 2.0"):
        rm.quadratic_weighted_kappa(p, t, num_classes=2)
    with pytest.raises(ValueError, match="`num_classes` must be a positive int, got 0"):
        rm.quadratic_weighted_kappa(p, t, num_classes=0)


# --------------------------------------------------------------------------------------------------
# streaming (torchmetrics) metrics
# --------------------------------------------------------------------------------------------------
def _close(got: dict[str, torch.Tensor], ref: dict[str, float], tol: float = 1e-12) -> float:
    assert set(got) == set(ref), (set(got), set(ref))
    worst = 0.0
    for k, v in ref.items():
        g = float(got[k])
        assert _same(g, v, tol), (k, g, v)
        worst = max(worst, 0.0 if math.isnan(v) else abs(g - v))
    return worst


@pytest.mark.parametrize("k", [2, 5, 30])
def test_streaming_in_pieces_equals_functional(k: int) -> None:
    p, t = _data(257, k, 20 + k, dtype=torch.float32)
    train = torch.randint(0, k, (3000,), generator=_gen(k)) ** 2 % k
    kw: dict[str, Any] = {"num_classes": k, "train_labels": train, "many_shot": 200, "few_shot": 100}
    ref = rm.ordinal_metrics(p, t, **kw)
    m = OrdinalMetrics(**kw)
    for a, b in ((0, 0), (0, 100), (100, 101), (101, 257)):
        m.update(p[a:b], t[a:b])
    assert _close(m.compute(), ref) <= 1e-12
    m.reset()
    m.update(p, t)
    _close(m.compute(), ref)


def test_streaming_mask_excludes_samples_and_empty_is_nan() -> None:
    p, t = _data(100, 4, 30)
    keep = torch.rand(100, generator=_gen(31)) > 0.3
    p_bad = p.clone()
    p_bad[~keep] = NAN  # a masked NaN counts nowhere
    t_bad = t.clone()
    t_bad[~keep] = 17  # nor does a masked invalid target
    m = OrdinalMetrics(num_classes=4)
    m.update(p_bad[:50], t_bad[:50], mask=keep[:50])
    m.update(p_bad[50:], t_bad[50:], mask=keep[50:])
    _close(m.compute(), rm.ordinal_metrics(p[keep], t[keep], num_classes=4))
    with pytest.warns(UserWarning, match="called before the ``update`` method"):
        empty = OrdinalMetrics(num_classes=4).compute()
    assert set(empty) == KEYS and all(math.isnan(float(v)) for v in empty.values())
    light = OrdinalMetrics(num_classes=4, rank_correlations=False)
    light.update(p, t)
    assert set(light.compute()) == KEYS - {"spearman", "kendall"}


def test_streaming_nan_and_invalid_targets() -> None:
    m = OrdinalMetrics(num_classes=3)
    m.update(torch.tensor([1.0, NAN]), torch.tensor([1, 2]))
    assert all(math.isnan(float(v)) for v in m.compute().values())
    bad = OrdinalMetrics(num_classes=3)
    bad.update(torch.tensor([1.0, 2.0, 0.0]), torch.tensor([1.0, 2.5, 3.0]))
    with pytest.raises(ValueError, match=r"`targets` must be integer classes in \[0, 2\] .* got 2 other value"):
        bad.compute()
    with pytest.raises(TypeError, match="`mask` must be a bool tensor of shape \\(2,\\)"):
        m.update(torch.zeros(2), torch.zeros(2), mask=torch.ones(2))
    with pytest.raises(ValueError, match="same shape"):
        m.update(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="`num_classes` must be a positive int"):
        OrdinalMetrics(num_classes=0)


def test_lazy_names() -> None:
    assert rm.OrdinalMetrics is OrdinalMetrics and rm.real_sample_mask is real_sample_mask
    assert "OrdinalMetrics" not in rm.__all__
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        rm.nope


@pytest.mark.parametrize(("size", "world"), [(7, 2), (10, 3), (12, 4), (5, 4)])
def test_real_sample_mask_finds_distributed_sampler_padding(size: int, world: int) -> None:
    from torch.utils.data import DistributedSampler

    seen: list[int] = []
    for r in range(world):
        idx = list(DistributedSampler(range(size), num_replicas=world, rank=r, shuffle=True, seed=1))
        mask = real_sample_mask(torch.arange(len(idx)), dataset_size=size, rank=r, world_size=world)
        seen += [i for i, keep in zip(idx, mask.tolist(), strict=True) if keep]
    assert sorted(seen) == list(range(size))  # every sample exactly once
    with pytest.raises(ValueError, match="`rank` must be < world_size"):
        real_sample_mask(torch.arange(3), dataset_size=3, rank=2, world_size=2)


# --------------------------------------------------------------------------------------------------
# DDP: 2 gloo processes, unequal shards and padded duplicates
# --------------------------------------------------------------------------------------------------
WORLD = 2


@pytest.mark.slow
@pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(), reason="gloo unavailable"
)
def test_ddp_values_equal_single_process(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from tests.distributed.test_distributed_losses import _free_port
    from tests.metrics._ordinal_ddp import worker

    ctx = mp.start_processes(
        worker, args=(WORLD, _free_port(), str(tmp_path)), nprocs=WORLD, start_method="spawn", join=False
    )
    deadline = time.monotonic() + 120
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail("distributed workers did not finish in 120 s")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for res in results:
        assert "error" not in res, res["error"]
        ref = res["reference"]
        assert set(ref) == KEYS | {"mae_many", "mae_medium", "mae_few"}
        assert not any(math.isnan(v) for v in ref.values())
        for scenario in ("unequal_shards", "sampler", "idle_rank"):
            got = res[scenario]
            for key, value in ref.items():
                assert abs(got[key] - value) <= 1e-6, (scenario, key, got[key], value)
