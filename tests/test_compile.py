"""``torch.compile(fullgraph=True)`` over every registered operator and loss (CPU).

For each entry of ``rankwise.ops.OPS`` and ``rankwise.losses.LOSSES``: the compiled function
(``backend="aot_eager"``: dynamo's graph capture and AOT autograd, the parts that break on locks,
threads, ``.item()``, numpy views and data-dependent Python branches) gives the eager value and
gradients, with static shapes and with ``dynamic=True`` (one compiled function over two batch
sizes); a representative subset also runs under the default inductor backend. Entries that cannot
compile yet are listed in :data:`NOT_COMPILABLE` with the reason, as strict xfails (a fix is noticed).
Also: every entry under ``torch.autocast("cpu", dtype=torch.bfloat16)`` gives its documented
output dtype and finite values where float32 does.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rankwise._kernels import _custom
from rankwise._registry import Example, RegistryEntry
from rankwise.losses import LOSSES
from rankwise.ops import list_ops
from tests.registry_examples import entry_factories, registry_cases
from tests.registry_helpers import tensors as _tensors

list_ops()  # the plugin operators (SoDeep) too, whichever test file ran first
ENTRIES: list[tuple[str, RegistryEntry]] = registry_cases()  # every entry and every test variant
IDS = [f"{kind}:{e.name}" for kind, e in ENTRIES]

_RNN = "dynamo does not trace nn.GRU / nn.LSTM (the SoDeep sorter's recurrent network)"
_PL_CHECK = (
    "the CPU check that Plackett-Luce scores are > 0 (a ValueError) reads the input on the host: a data-dependent "
    "branch that fullgraph refuses"
)
#: entries that do not compile with ``fullgraph=True`` yet (static or ``dynamic=True``), and why
NOT_COMPILABLE: dict[str, str] = {
    "sodeep_rank": _RNN,
    "stochastic_neural_sort": _PL_CHECK,
    "stochastic_neural_sort.hard": _PL_CHECK,
}

_BF16_OUT = "the result follows autocast's bfloat16 matmul instead of the inputs' float32"
#: entries that do not give the float32 output dtype (or fail) under CPU bfloat16 autocast yet
AUTOCAST_FAILS: dict[str, str] = {
    "conr": _BF16_OUT,
    "npairs": _BF16_OUT,
}

#: inductor and dynamic-shape runs (slow to compile): one entry per kernel family and main loss
SUBSET = ["rank", "soft_rank_isotonic", "soft_sort_isotonic.kl", "supcon", "rnc", "ranksim", "spearman"]


def _fresh(ex: Example) -> Example:
    args = tuple(
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in ex.args
    )
    return Example(args, dict(ex.kwargs))


def _run(fn: Any, entry: RegistryEntry, ex: Example) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Floating outputs and the gradients of their weighted sum on the inputs that need one."""
    if entry.stochastic:
        torch.manual_seed(1234)
    outs = [t for t in _tensors(fn(*ex.args, **ex.kwargs)) if t.is_floating_point()]
    inputs = [a for a in ex.args if isinstance(a, torch.Tensor) and a.requires_grad]
    total = sum(
        ((t * torch.linspace(0.5, 1.5, t.numel(), dtype=t.dtype).reshape(t.shape)).sum() * (i + 1))
        for i, t in enumerate(outs)
        if t.requires_grad and t.numel()
    )
    grads: list[torch.Tensor | None] = [None] * len(inputs)
    if inputs and isinstance(total, torch.Tensor):
        grads = list(torch.autograd.grad(total, inputs, allow_unused=True))
    return [t.detach() for t in outs], grads


def _check(entry: RegistryEntry, backend: str, *, dynamic: bool = False) -> None:
    torch._dynamo.reset()
    ex = entry_factories(entry).example(torch.float32, torch.device("cpu"))
    compiled = torch.compile(entry.fn, fullgraph=True, backend=backend, dynamic=dynamic or None)
    want = _run(entry.fn, entry, _fresh(ex))
    got = _run(compiled, entry, _fresh(ex))
    for a, b in zip(got[0], want[0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
    for a, b in zip(got[1], want[1], strict=True):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)


def _marks(entry: RegistryEntry) -> Any:
    reason = NOT_COMPILABLE.get(entry.name)
    return [pytest.mark.xfail(reason=reason, strict=True)] if reason else []


PARAMS = [pytest.param(kind, e, id=i, marks=_marks(e)) for (kind, e), i in zip(ENTRIES, IDS)]


def test_not_compilable_names_exist() -> None:
    names = {e.name for _, e in ENTRIES}
    assert set(NOT_COMPILABLE) | set(SUBSET) | set(AUTOCAST_FAILS) | set(DYNAMIC_AOT_SUBSET) <= names


def test_constant_result_mark_matches_torch() -> None:
    """The kernel layer marks functions as the tracer's constants the way torch does."""

    def f() -> bool:
        return True

    def g() -> bool:
        return True

    torch.compiler.assume_constant_result(f)
    _custom.constant_result(g)
    marked = {k: v for k, v in vars(f).items()}
    assert marked and marked == vars(g)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "entry"), PARAMS)
def test_fullgraph_compile_equals_eager(kind: str, entry: RegistryEntry) -> None:
    _check(entry, "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("name", SUBSET)
def test_inductor_compile_equals_eager(name: str) -> None:
    entry = dict((e.name, e) for _, e in ENTRIES)[name]
    _check(entry, "inductor")


def _at_batch(ex: Example, b: int) -> Example:
    """``ex`` with a batch (leading dim) of ``b``: a fresh first input, the other inputs that share the
    leading dim cycled to ``b`` rows (labels, targets, masks keep their kind)."""
    x0 = ex.args[0]
    b0 = x0.shape[0]
    x = torch.randn((b, *x0.shape[1:]), generator=torch.Generator().manual_seed(b), dtype=x0.dtype)
    if x0.numel() and x0.min() >= 0:  # (positive inputs: scores of a Plackett-Luce model, distances)
        x = x.abs()
    rest = [
        a[torch.arange(b) % b0] if isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == b0 else a
        for a in ex.args[1:]
    ]
    return Example((x.requires_grad_(x0.requires_grad), *rest), dict(ex.kwargs))


def _check_dynamic(entry: RegistryEntry, backend: str) -> None:
    """``dynamic=True``: one compiled function called at the example's batch size and a larger one equals
    eager at both (values, gradients, and the same NaN pattern)."""
    torch._dynamo.reset()
    ex = entry_factories(entry).example(torch.float32, torch.device("cpu"))
    compiled = torch.compile(entry.fn, fullgraph=True, backend=backend, dynamic=True)
    b = ex.args[0].shape[0]
    for size in (b, b + 3):
        case = _at_batch(ex, size)
        want = _run(entry.fn, entry, _fresh(case))
        got = _run(compiled, entry, _fresh(case))
        for a, c in zip(got[0] + got[1], want[0] + want[1], strict=True):
            assert (a is None) == (c is None)  # (rank: no gradient)
            if a is not None and c is not None:
                torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5, equal_nan=True)


def _dynamic_input(entry: RegistryEntry) -> bool:
    """Whether the example's first input is a floating tensor with a leading dim to change (the batch, or
    the ranked length of a 1-d input)."""
    x0 = entry_factories(entry).example(torch.float32, torch.device("cpu")).args[0]
    return isinstance(x0, torch.Tensor) and x0.dim() >= 1 and x0.is_floating_point()


DYNAMIC_PARAMS = [p for p, (_, e) in zip(PARAMS, ENTRIES) if _dynamic_input(e)]


@pytest.mark.slow
@pytest.mark.extended  # about 6 min on 2 cores: over CI's budget (as the aot_eager subset below)
@pytest.mark.parametrize(("kind", "entry"), DYNAMIC_PARAMS)
def test_dynamic_compile_equals_eager(kind: str, entry: RegistryEntry) -> None:
    """Every entry with symbolic shapes. ``backend="eager"``: dynamo's graph capture with symbolic sizes and
    floats (where dynamic shapes break: data-dependent checks, random draws, option checks on symbolic
    floats), run as captured; AOT autograd's tracing, already run with static shapes above, costs 3 to 4
    times as much again with symbolic ones, so it runs on :data:`DYNAMIC_AOT_SUBSET`
    (``tools/probe_library.py --only G`` runs it on every entry)."""
    _check_dynamic(entry, "eager")


#: ``dynamic=True`` under ``aot_eager`` (symbolic shapes through AOT autograd's forward and backward graphs)
DYNAMIC_AOT_SUBSET = [
    "soft_rank_isotonic",
    "soft_sort_isotonic.kl",
    "rank",
    "supcon",
    "rnc",
    "perturbed_rank.normal",
    "spearman.softsort",
]


#: the ``DYNAMIC_AOT_SUBSET`` entries over CI's time budget (their dynamic capture runs above): supcon
#: about 30 s here, the stochastic NeuralNDCG (50 unrolled Sinkhorn iterations over the samples) about
#: 70 s per batch size on the shared CPU
DYNAMIC_AOT_EXTENDED = {"supcon", "neural_ndcg.stochastic"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.extended) if n in DYNAMIC_AOT_EXTENDED else n
        for n in [*DYNAMIC_AOT_SUBSET, "neural_ndcg.stochastic"]
    ],
)
def test_dynamic_aot_compile_equals_eager(name: str) -> None:
    _check_dynamic(dict((e.name, e) for _, e in ENTRIES)[name], "aot_eager")


@pytest.mark.extended  # about 3 min on the shared CPU: one dynamic=True compile and two recompiles
@pytest.mark.parametrize("value", [math.inf, -math.inf])
def test_dynamic_compiled_stochastic_neural_ndcg_non_finite_scores_equal_eager(value: float) -> None:
    """A non-finite first list: the same NaN loss and the same gradient (NaN on that list only) compiled
    with ``dynamic=True`` as in eager mode."""
    entry = dict((e.name, e) for _, e in ENTRIES)["neural_ndcg.stochastic"]
    ex = entry_factories(entry).example(torch.float32, torch.device("cpu"))
    torch._dynamo.reset()
    compiled = torch.compile(entry.fn, fullgraph=True, backend="aot_eager", dynamic=True)
    x = ex.args[0].detach().clone()
    x[0] = value
    grads = []
    for fn in (entry.fn, compiled):
        xr = x.clone().requires_grad_()
        torch.manual_seed(1234)
        out = fn(xr, *ex.args[1:], **ex.kwargs)
        grads.append(torch.autograd.grad(out, xr)[0])
    assert grads[0][0].isnan().all() and grads[0][1:].isfinite().all()
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5, equal_nan=True)


def test_explicit_generator_is_not_a_graph_input() -> None:
    """What docs/architecture.md says of a ``torch.Generator`` under ``torch.compile``: ``fullgraph=True``
    refuses it at the draw; without ``fullgraph`` the draw runs eagerly from it (graph break), with eager
    mode's values, gradients and generator state."""
    import torch._dynamo.exc

    fn = LOSSES.entry("listmle").fn
    pred = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    true = torch.tensor([[2.0, 1.0, 0.0, 1.0, -1.0]] * 3)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="Failed to convert args/kwargs to proxy"):
        torch.compile(fn, fullgraph=True, backend="aot_eager")(pred, true, generator=torch.Generator())
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager")
    gens = [torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)]
    results = []
    for f, gen in zip((fn, compiled), gens):
        x = pred.clone().requires_grad_()
        out = f(x, true, generator=gen)
        results.append((out.detach(), torch.autograd.grad(out, x)[0]))
    torch.testing.assert_close(results[1], results[0])
    assert torch.equal(gens[0].get_state(), gens[1].get_state())
    assert torch.equal(torch.randperm(5, generator=gens[1]), torch.randperm(5, generator=gens[0]))


def test_dynamic_params_cover_every_entry() -> None:
    """The dynamic-shape test runs on every entry (a new entry whose first input is not a floating tensor
    must be given its own changing-shape case)."""
    assert [e.name for _, e in ENTRIES if not _dynamic_input(e)] == []


def test_isotonic_kernel_ops_compile() -> None:
    """The isotonic and row-sort kernels are custom operators in the compiled graph (not a graph
    break): soft ranks, their gradient and ``rank`` at a size the row sort serves."""
    import rankwise

    torch._dynamo.reset()
    x = torch.randn(4, 600, generator=torch.Generator().manual_seed(0), requires_grad=True)

    def f(t: torch.Tensor) -> torch.Tensor:
        return rankwise.soft_rank(t, method="isotonic", regularization_strength=0.5) * rankwise.rank(t)

    w = torch.linspace(0, 1, x.numel()).view_as(x)
    (want,) = torch.autograd.grad((f(x) * w).sum(), x)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    (got,) = torch.autograd.grad((y * w).sum(), x)
    torch.testing.assert_close(y, f(x))
    torch.testing.assert_close(got, want)
    assert hasattr(torch.ops.rankwise, "isotonic_rank_forward") and hasattr(torch.ops.rankwise, "sort_rows")


@pytest.mark.parametrize("name", ["supcon", "ranksim", "rank"])
def test_torch_paths_compile_without_numba(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The torch paths that serve CUDA inputs and CPU without numba (kernels reported unavailable)
    trace as one graph at sizes past the small-input branches: no graph break on a host setting such
    as ``torch.get_num_threads()`` (SupCon's symmetric gradient, the row sort of ``rank``)."""
    import rankwise
    from rankwise._kernels import sort as sort_kernels
    from rankwise._kernels import supcon as supcon_kernels
    from rankwise.losses import ranksim_loss, supcon_loss

    monkeypatch.setattr(sort_kernels, "ready", lambda *a, **k: False)
    monkeypatch.setattr(supcon_kernels, "ready", lambda *a, **k: False)
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    fn: Any
    if name == "supcon":  # 2 x 200 views: the symmetric W + W^T gradient of the one-block path
        args: tuple[Any, ...] = (torch.randn(200, 2, 16, generator=g), torch.randint(0, 8, (200,), generator=g))
        fn = supcon_loss
    elif name == "ranksim":  # 64 x 64 similarities: the row sorts past the radix threshold
        args = (torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g))
        fn = ranksim_loss
    else:
        args = (torch.randn(4, 1024, generator=g),)
        fn = rankwise.rank
    x = args[0].requires_grad_(name != "rank")
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    got, want = compiled(*args), fn(*args)
    torch.testing.assert_close(got, want)
    if name != "rank":
        (g_got,) = torch.autograd.grad(got, x)
        (g_want,) = torch.autograd.grad(want, x)
        torch.testing.assert_close(g_got, g_want)


def test_first_call_compiled_loads_the_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiled Spearman loss with an explicit ranker as the very first call (the soft-method
    plugins not imported yet) traces without a graph break."""
    from rankwise.losses import spearman_loss
    from rankwise.ops import soft

    monkeypatch.setattr(soft, "_PLUGINS_LOADED", False)
    torch._dynamo.reset()
    p = torch.randn(16, generator=torch.Generator().manual_seed(0), requires_grad=True)
    y = torch.arange(16.0)
    fn = torch.compile(lambda a, b: spearman_loss(a, b, ranker="isotonic"), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fn(p, y), spearman_loss(p, y, ranker="isotonic"))
    assert soft._PLUGINS_LOADED


# --------------------------------------------------------------------------------------------------
# autocast (CPU bfloat16)
# --------------------------------------------------------------------------------------------------
def _expected_dtype(entry: RegistryEntry, out: torch.Tensor, want: torch.Tensor) -> None:
    """Under autocast the inputs stay float32, so each output keeps its float32 dtype (the ops and
    losses compute in float32 and return the input's dtype)."""
    assert out.dtype == want.dtype, (entry.name, out.dtype, want.dtype)


AUTOCAST_PARAMS = [
    pytest.param(
        kind,
        e,
        id=i,
        marks=[pytest.mark.xfail(reason=AUTOCAST_FAILS[e.name], strict=True)] if e.name in AUTOCAST_FAILS else [],
    )
    for (kind, e), i in zip(ENTRIES, IDS)
]


@pytest.mark.parametrize(("kind", "entry"), AUTOCAST_PARAMS)
def test_autocast_bf16_dtype_and_finite(kind: str, entry: RegistryEntry) -> None:
    ex = entry_factories(entry).example(torch.float32, torch.device("cpu"))
    want = _run(entry.fn, entry, _fresh(ex))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _run(entry.fn, entry, _fresh(ex))
    for a, b in zip(got[0], want[0], strict=True):
        _expected_dtype(entry, a, b)
        assert torch.isfinite(a[torch.isfinite(b)]).all(), entry.name
    for a, b in zip(got[1], want[1], strict=True):
        if a is not None and b is not None:
            assert a.dtype == b.dtype and torch.isfinite(a[torch.isfinite(b)]).all(), entry.name


@pytest.mark.parametrize("regularization", ["l2", "kl"])
@pytest.mark.parametrize("descending", [False, True])
def test_compiled_soft_rank_of_huge_rows_equals_eager(regularization: str, descending: bool) -> None:
    """Rows of magnitude 1e20-1e30 (where the fused CPU kernels alone round the soft part away) give the
    eager soft ranks and gradients under ``torch.compile`` too (no host read decides the path there)."""
    import rankwise

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g)
    x[0] *= 1e30
    x[1] *= 1e20
    x[2] = torch.tensor([1e30, 1e30 + 1e24, -1e30, 5.0, 5.5, -1e29])  # huge and small entries, a near tie
    x.requires_grad_()  # row 3: ordinary values, beside the huge rows

    def f(t: torch.Tensor) -> torch.Tensor:
        return rankwise.soft_rank(t, regularization=regularization, regularization_strength=0.5, descending=descending)

    w = torch.linspace(0, 1, x.numel()).view_as(x)
    want = f(x)
    (want_grad,) = torch.autograd.grad((want * w).sum(), x)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    got = compiled(x)
    (got_grad,) = torch.autograd.grad((got * w).sum(), x)
    # the huge rows are hard ranks: a permutation of 1..6 (not the zeros of the unconditioned kernel)
    assert sorted(got[0].tolist()) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("regularization", ["l2", "kl"])
def test_dynamic_compiled_soft_sort_equals_eager(regularization: str) -> None:
    """``dynamic=True`` soft sort (the function shared with the soft ranks picks its traced path without
    comparing autograd Function classes, which dynamo cannot trace) over two batch sizes."""
    import rankwise

    def f(t: torch.Tensor) -> torch.Tensor:
        return rankwise.soft_sort(t, regularization=regularization, regularization_strength=0.5)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    for b in (3, 7):
        x = torch.randn(b, 6, generator=torch.Generator().manual_seed(b)) * 1e25 ** (b == 7)
        torch.testing.assert_close(compiled(x), f(x), rtol=1e-5, atol=1e-5)
