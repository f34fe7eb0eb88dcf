"""rank and blackbox_rank: scipy parity, conventions of the reference code, blackbox backward, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rankwise
from rankwise import blackbox_rank, rank

scipy_stats = pytest.importorskip("scipy.stats")

TIES = ["ordinal", "average", "min", "max", "dense"]


@pytest.mark.parametrize("ties", TIES)
@pytest.mark.parametrize("descending", [False, True])
def test_rank_matches_scipy_rankdata(ties: str, descending: bool, device: torch.device) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 5, (6, 13), generator=g).double()  # many ties
    r = rank(x.to(device), ties=ties, descending=descending).cpu().numpy()
    src = -x.numpy() if descending else x.numpy()
    expected = np.stack([scipy_stats.rankdata(row, method=ties) for row in src])
    np.testing.assert_allclose(r, expected)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.integers(-3, 3), min_size=1, max_size=12),
    ties=st.sampled_from(TIES),
    descending=st.booleans(),
)
def test_rank_property_scipy(values: list[int], ties: str, descending: bool) -> None:
    x = torch.tensor(values, dtype=torch.float64)
    src = -np.asarray(values, float) if descending else np.asarray(values, float)
    np.testing.assert_allclose(
        rank(x, ties=ties, descending=descending).numpy(), scipy_stats.rankdata(src, method=ties)
    )


def test_rank_reference_conventions() -> None:
    a = torch.tensor([9.0, 5.0, 11.0, 6.0])
    # RankSim paper example: rk([9, 5, 11, 6]) = [2, 4, 1, 3]
    assert rank(a, descending=True).tolist() == [2, 4, 1, 3]
    # RankSim rank_normalised / SoDeep get_rank: largest -> 1/n
    n = a.numel()
    torch.testing.assert_close(rank(a, descending=True, normalize=True), torch.tensor([2, 4, 1, 3]) / n)
    get_rank = (n - torch.argsort(torch.argsort(a))).float() / n  # SoDeep's formula, written out
    torch.testing.assert_close(rank(a, descending=True, normalize=True), get_rank)
    # get_tiedrank: average ranks, largest -> 1/n
    t = torch.tensor([1.0, 1.0, 2.0, 3.0, 3.0])
    tied = (len(t) + 1 - scipy_stats.rankdata(t.numpy())) / len(t)
    np.testing.assert_allclose(rank(t, descending=True, ties="average", normalize=True).numpy(), tied)


def test_rank_dim_and_leading_dims() -> None:
    x = torch.randn(2, 5, 3, 4)
    r = rank(x, dim=1)
    expected = rank(x.movedim(1, -1)).movedim(-1, 1)
    torch.testing.assert_close(r, expected)
    assert r.shape == x.shape
    # each fibre along dim=1 is a permutation of 1..5
    torch.testing.assert_close(r.sort(dim=1).values[0, :, 0, 0], torch.arange(1.0, 6.0))


def test_rank_degenerate() -> None:
    assert rank(torch.empty(0)).shape == (0,)
    assert rank(torch.empty(3, 0)).shape == (3, 0)
    assert rank(torch.tensor([4.0])).tolist() == [1.0]
    assert rank(torch.ones(4), ties="average").tolist() == [2.5] * 4
    assert rank(torch.ones(4)).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert rank(torch.tensor([3, 1, 2])).dtype == torch.get_default_dtype()  # integer input allowed
    assert rank(torch.randn(3, dtype=torch.float64)).dtype == torch.float64


def test_rank_errors() -> None:
    with pytest.raises(ValueError, match="`ties` must be one of"):
        rank(torch.randn(3), ties="first")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`dim` must be in"):
        rank(torch.randn(3), dim=1)
    with pytest.raises(TypeError, match=r"`x` must be a torch\.Tensor"):
        rank([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="0-d"):
        rank(torch.tensor(1.0))


def _blackbox_reference_grad(x: torch.Tensor, grad_out: torch.Tensor, lam: float) -> torch.Tensor:
    """-(rk(x) - rk(x + lam * g)) / lam, written row by row from RankSim eq. 6-7."""
    rows = []
    for xi, gi in zip(x, grad_out):
        n = len(xi)
        r = (torch.tensor(scipy_stats.rankdata(-xi.numpy(), method="ordinal")) / n).to(x.dtype)
        rp = (torch.tensor(scipy_stats.rankdata(-(xi + lam * gi).numpy(), method="ordinal")) / n).to(x.dtype)
        rows.append(-(r - rp) / lam)
    return torch.stack(rows)


@pytest.mark.parametrize("lam", [0.5, 2.0, 10.0])
def test_blackbox_backward_matches_formula(lam: float) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 9, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.rand(5, 9, generator=g, dtype=torch.float64)
    r = blackbox_rank(x, lam, descending=True, normalize=True)
    torch.testing.assert_close(r.detach(), rank(x, descending=True, normalize=True))
    loss = ((r - target) ** 2).sum()
    loss.backward()
    grad_out = 2 * (r.detach() - target)
    torch.testing.assert_close(x.grad, _blackbox_reference_grad(x.detach(), grad_out, lam))


def test_blackbox_dim_leading_dims_and_module() -> None:
    x = torch.randn(2, 6, 3, requires_grad=True)
    r = blackbox_rank(x, 1.0, dim=1)
    torch.testing.assert_close(r, rank(x, dim=1))
    r.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    m = rankwise.BlackboxRank(1.0, dim=1)
    torch.testing.assert_close(m(x), r)


def test_blackbox_descends_a_ranking_objective() -> None:
    """Gradient steps through the blackbox ranks move the ranking towards a target ranking."""
    torch.manual_seed(0)
    x = torch.randn(1, 8, requires_grad=True)
    target = torch.arange(1, 9, dtype=torch.float32).unsqueeze(0) / 8  # want x sorted in descending order
    opt = torch.optim.SGD([x], lr=0.5)
    first = None
    for _ in range(60):
        opt.zero_grad()
        loss = ((blackbox_rank(x, 2.0, descending=True, normalize=True) - target) ** 2).sum()
        first = loss.item() if first is None else first
        loss.backward()
        opt.step()
    # the piecewise-constant objective has plateaus where the blackbox gradient vanishes; it must still
    # make substantial progress from a random start
    assert loss.item() < 0.5 * first


def test_blackbox_errors() -> None:
    with pytest.raises(ValueError, match="`lambda_val` must be finite and > 0, got 0"):
        blackbox_rank(torch.randn(3), 0)
    with pytest.raises(ValueError, match="`lambda_val` must be finite and > 0"):
        blackbox_rank(torch.randn(3), -1.0)
    with pytest.raises(TypeError, match=r"`x` must be a floating-point tensor, got dtype torch\.int64"):
        blackbox_rank(torch.tensor([1, 2, 3]), 1.0)
    with pytest.raises(TypeError, match="`lambda_val` must be a real number"):
        blackbox_rank(torch.randn(3), "1")  # type: ignore[arg-type]


def test_blackbox_degenerate_keeps_graph() -> None:
    for x in (
        torch.zeros(0, requires_grad=True),
        torch.zeros(1, requires_grad=True),
        torch.ones(4, requires_grad=True),
    ):
        r = blackbox_rank(x, 1.0)
        r.sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("ties", TIES)
def test_radix_key_sort_matches_torch_sort(descending: bool, ties: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The float32 CPU fast path (flat int64-key radix sort, taken on one torch thread) equals the
    stable torch.sort path."""
    from rankwise.ops import _sort, ranking

    monkeypatch.setattr(_sort.torch, "get_num_threads", lambda: 1)

    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 97, generator=g)
    x[:, ::7] = x[:, 3:4]  # ties within rows
    x[0, :5] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-42])  # zeros, infinities, subnormal
    x[1, 4] = float("nan")
    x[2, :] = 2.5  # a constant row
    assert x.numel() >= _sort._RADIX_MIN_NUMEL
    _, perm = _sort.sort_last(x, descending)
    ref = torch.sort(x, dim=-1, descending=descending, stable=True)
    finite_rows = torch.isfinite(x).all(-1)
    torch.testing.assert_close(perm[finite_rows], ref.indices[finite_rows])
    # rows with infinities and NaN: same order of values
    torch.testing.assert_close(x.gather(-1, perm), ref.values, equal_nan=True)
    fast = rank(x[finite_rows], ties=ties, descending=descending)
    slow = ranking.rank_last(x[finite_rows].double(), descending, ties).float()
    torch.testing.assert_close(fast, slow)


SPECIAL = [
    0.0,
    -0.0,
    float("nan"),
    -float("nan"),
    float("inf"),
    -float("inf"),
    1e-45,
    -1e-45,
    3.4e38,
    -3.4e38,
    1.0,
    -1.0,
]


@pytest.mark.parametrize(
    "shape", [(1, 2048), (3, 700), (40, 64), (2, 8192), (1, 20000), (64, 65), (64, 1024), (300, 200)]
)
def test_sort_last_numba_row_sort_is_torch_sort(shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Once loaded, float32 CPU inputs are sorted by numba's row radix sort (torch.sort is not
    called): exactly torch.sort(stable=True)'s permutation in both directions, with ties, +-0.0,
    NaN of either sign, +-inf, subnormals and the largest floats, on 1 and 2 threads."""
    from rankwise._kernels import _parallel
    from rankwise._kernels import sort as ksort
    from rankwise.ops import _sort

    nb = ksort.FAMILY.load()
    if nb is None:
        pytest.skip("numba unavailable")
    gen = torch.Generator().manual_seed(shape[-1])
    inputs = [
        torch.randn(*shape, generator=gen),
        torch.randint(-3, 3, shape, generator=gen).float(),
        torch.tensor(SPECIAL)[torch.randint(0, len(SPECIAL), shape, generator=gen)],
        torch.randn(*shape, generator=gen).sort(dim=-1).values,
    ]
    real_sort = torch.sort
    calls: list[object] = []
    monkeypatch.setattr(_sort.torch, "sort", lambda *a, **k: calls.append(a) or real_sort(*a, **k))
    real_run_task = _parallel.run_task
    team: list[tuple[int, int]] = []
    monkeypatch.setattr(
        _parallel,
        "run_task",
        lambda task, rows, n, th, *a: team.append((task, th)) or real_run_task(task, rows, n, th, *a),
    )
    for threads in (1, 2):
        monkeypatch.setattr(_sort.torch, "get_num_threads", lambda threads=threads: threads)
        for x in inputs:
            for descending in (False, True):
                values, perm = _sort.sort_last(x, descending)
                assert values is None
                want = real_sort(x, dim=-1, descending=descending, stable=True).indices
                assert torch.equal(perm, want)
    assert calls == []
    # rows split over torch's OpenMP team on 2 threads from _PARALLEL_MIN_NUMEL elements on
    big = shape[0] > 1 and shape[0] * shape[1] >= _parallel.PARALLEL_MIN_NUMEL and _parallel.gomp is not None
    assert team == ([(nb.SORT_ROWS, 2)] * 8 if big else [])
    x = torch.randn(2, 3, 700, generator=gen).requires_grad_()  # leading dims, a leaf with grad
    _, perm = _sort.sort_last(x, True)
    assert perm.shape == x.shape and torch.equal(
        perm, real_sort(x.detach(), dim=-1, descending=True, stable=True).indices
    )


def test_sort_last_waits_for_no_numba_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the kernels are loaded, "background" sorts with torch (and starts the load on the
    second call), "off" always does; neither waits for numba."""
    from rankwise._kernels import _loader
    from rankwise._kernels import sort as ksort
    from rankwise.ops import _sort

    x = torch.randn(4, 1000, generator=torch.Generator().manual_seed(3))
    want = torch.sort(x, dim=-1, stable=True).indices
    fam = ksort.FAMILY
    monkeypatch.setattr(fam, "kernels", _loader._UNSET)
    monkeypatch.setattr(_loader, "MODE", "off")
    assert not ksort.ready()
    assert torch.equal(_sort.sort_last(x, False)[1], want)
    monkeypatch.setattr(_loader, "MODE", "background")
    monkeypatch.setattr(fam, "_unloaded_calls", 0)
    started: list[bool] = []
    monkeypatch.setattr(fam, "_thread", None)
    monkeypatch.setattr(fam, "load", lambda **kw: started.append(True))
    monkeypatch.setattr(_loader.atexit, "register", lambda fn: None)
    assert not ksort.ready() and fam._thread is None
    assert torch.equal(_sort.sort_last(x, False)[1], want)  # the second call starts the load
    assert fam._thread is not None
    fam._thread.join(timeout=60)
    assert started == [True]


def test_sort_last_uses_row_sort_when_threaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the numba sort (not loaded yet, or no numba): with more than one torch thread,
    several rows go to torch.sort (rows split across threads); a single row keeps the flat key
    sort. Both give torch.sort's stable permutation."""
    from rankwise.ops import _sort

    monkeypatch.setattr(_sort.kernels, "ready", lambda: False)
    x = torch.randn(40, 97, generator=torch.Generator().manual_seed(1))
    calls: list[tuple[int, ...]] = []
    real_sort = torch.sort

    def spy(t: torch.Tensor, *args: object, **kwargs: object) -> object:
        calls.append(tuple(t.shape))
        return real_sort(t, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_sort.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(_sort.torch, "sort", spy)
    _, perm = _sort.sort_last(x, True)
    assert calls == [(40, 97)]  # the row-wise sort, not the flat key sort
    torch.testing.assert_close(perm, real_sort(x, dim=-1, descending=True, stable=True).indices)
    calls.clear()
    row = torch.randn(1, 4000, generator=torch.Generator().manual_seed(2))
    _, perm = _sort.sort_last(row, False)
    assert calls == [(4000,)]  # one row: the flat radix key sort
    torch.testing.assert_close(perm, real_sort(row, dim=-1, stable=True).indices)
