"""Property/fuzz suite over EVERY registered operator and loss .

The registries are iterated, so entries added later are covered automatically. Each entry's ``fuzz``
factory (``tests/registry_examples.py``) builds random inputs of any size ``n``; the suite
draws ``n`` in {0, 1, 2, small, large}, the dtype (float16/bfloat16 included), ties, NaN/inf and seeds
with hypothesis, and checks the rules of ``docs/conventions.md``:

* finite inputs give finite outputs and finite gradients;
* a NaN/inf input makes the outputs that depend on it non-finite and leaves the others unchanged
  (entries with ``nonfinite="order"`` rank +-inf as extreme values; NaN still propagates);
* parity with scipy / torchsort / torch where they apply;
* every invalid argument (bad option values and types, non-tensors, complex tensors, tensors on another
  device) raises ``ValueError``/``TypeError`` naming the argument.

Every call is a *probe* with one outcome: ``ok``, ``clear_error`` (an invalid argument rejected with a
message naming it), ``crash`` (any other exception) or ``silent_wrong`` (no error for an invalid
argument, or a broken property). The counts are printed at the end of a run without ``-n``
(``tests/conftest.py``) and written as JSON to ``$RANKWISE_PROBE_REPORT`` when it is set.

Runtime: examples per test come from ``$RANKWISE_FUZZ_EXAMPLES`` (default 8, derandomized: the same
inputs on every CI run); ``RANKWISE_FUZZ_EXAMPLES=200`` explores more locally.
"""

from __future__ import annotations

import collections
import inspect
import math
import os
import warnings
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from rankwise import losses as rankwise_losses
from rankwise import ops as rankwise_ops
from rankwise._registry import Example, RegistryEntry
from rankwise.ops import blackbox_rank as rankwise_blackbox_rank
from rankwise.ops import rank as rankwise_rank
from tests.registry_examples import entry_factories, factories, registry_cases
from tests.registry_helpers import tensors as _tensors

ENTRIES: list[tuple[str, RegistryEntry]] = registry_cases()  # every entry and every test variant
IDS = [f"{kind}:{e.name}" for kind, e in ENTRIES]
CPU = torch.device("cpu")
LARGE = 257  # above bfloat16's exact-integer range (256)
SIZES = [0, 1, 2, 3, 7, LARGE]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

FUZZ = settings(
    max_examples=int(os.environ.get("RANKWISE_FUZZ_EXAMPLES", "8")),
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: every probe runs (and is counted) once
)

#: outcome counts of every probe of this session (see the module docstring)
PROBES: collections.Counter[str] = collections.Counter()
#: the probes that were not ok/clear_error, for the summary
FINDINGS: list[str] = []


def record(outcome: str, what: str) -> str:
    PROBES[outcome] += 1
    if outcome in ("crash", "silent_wrong"):
        FINDINGS.append(f"{outcome}: {what}")
    return outcome


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------
def _call(entry: RegistryEntry, ex: Example) -> Any:
    if entry.stochastic:
        torch.manual_seed(1234)
    return entry.fn(*ex.args, **ex.kwargs)


def _build(entry: RegistryEntry, n: int, dtype: torch.dtype, seed: int) -> Example | None:
    g = torch.Generator().manual_seed(seed)
    f = entry_factories(entry)
    if f.fuzz is not None:
        return f.fuzz(n, dtype, CPU, g)
    return f.example(dtype, CPU)  # fallback: fixed size


def _leaf(t: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return values.detach().to(t.dtype).requires_grad_(t.requires_grad)


def _map_floating(ex: Example, fn: Any) -> Example:
    """Apply ``fn`` to every floating tensor argument (positional and keyword), keeping leaves."""
    args = tuple(_leaf(a, fn(a.detach())) if _is_float(a) else a for a in ex.args)
    kwargs = {k: (_leaf(v, fn(v.detach())) if _is_float(v) else v) for k, v in ex.kwargs.items()}
    return Example(args, kwargs)


def _is_float(a: Any) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


def _with_ties(ex: Example) -> Example:
    return _map_floating(ex, lambda t: (t.double() * 2).round() / 2)


def _grad_inputs(ex: Example) -> list[torch.Tensor]:
    return [a for a in (*ex.args, *ex.kwargs.values()) if isinstance(a, torch.Tensor) and a.requires_grad]


def _backward(outs: list[torch.Tensor], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    total: torch.Tensor | None = None
    for t in outs:
        if t.is_floating_point() and t.requires_grad:
            w = torch.rand(t.shape, generator=g, dtype=torch.float64).to(t.dtype)
            term = (t * w).sum()
            total = term if total is None else total + term.to(total.dtype)
    if total is not None:
        total.backward()


def _arg_names(entry: RegistryEntry) -> list[str]:
    return [
        p.name
        for p in inspect.signature(entry.fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]


def _names_arg(exc: BaseException, names: list[str]) -> bool:
    msg = str(exc)
    return isinstance(exc, (ValueError, TypeError)) and any(f"`{n}`" in msg for n in names)


# --------------------------------------------------------------------------------------------------
# registry metadata
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
def test_entry_has_fuzz_metadata(kind: str, entry: RegistryEntry) -> None:
    """A ``fuzz`` factory (inputs of any size) in tests/registry_examples.py lets this suite probe the entry fully."""
    fuzz = factories(kind, entry.name).fuzz
    assert fuzz is not None, f"{entry.name}: add a `fuzz` factory to tests/registry_examples.py (docs/conventions.md)"
    assert entry.nonfinite in ("propagate", "order")
    ex = fuzz(5, torch.float32, CPU, torch.Generator().manual_seed(0))
    assert ex is not None and any(isinstance(a, torch.Tensor) for a in ex.args)


# --------------------------------------------------------------------------------------------------
# finite inputs: finite outputs and gradients
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
@FUZZ
@given(
    n=st.sampled_from(SIZES),
    dtype=st.sampled_from(DTYPES),
    ties=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_finite_inputs_give_finite_outputs_and_gradients(
    kind: str, entry: RegistryEntry, n: int, dtype: torch.dtype, ties: bool, seed: int
) -> None:
    ex = _build(entry, n, dtype, seed)
    assume(ex is not None)
    assert ex is not None
    if ties:
        ex = _with_ties(ex)
    what = f"{entry.name} n={n} {dtype} ties={ties} seed={seed}"
    try:
        outs = _tensors(_call(entry, ex))
        if entry.gradient != "none":
            _backward(outs, seed)
    except Exception as exc:
        record("crash", f"{what}: {type(exc).__name__}: {exc}")
        raise
    bad = [i for i, t in enumerate(outs) if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    bad_grad = [
        i for i, x in enumerate(_grad_inputs(ex)) if x.grad is not None and not bool(torch.isfinite(x.grad).all())
    ]
    ok = not bad and not bad_grad and bool(outs)
    record("ok" if ok else "silent_wrong", f"{what}: non-finite outputs {bad} / gradients {bad_grad}")
    assert outs, f"{what}: no tensor output"
    assert not bad, f"{what}: non-finite output(s) {bad} on finite input"
    assert not bad_grad, f"{what}: non-finite gradient(s) {bad_grad} on finite input"


# --------------------------------------------------------------------------------------------------
# non-finite inputs: the NaN/inf policy
# --------------------------------------------------------------------------------------------------
def _targets(ex: Example) -> list[tuple[str | int, torch.Tensor]]:
    pos: list[tuple[str | int, torch.Tensor]] = [(i, a) for i, a in enumerate(ex.args) if _is_float(a)]
    return pos + [(k, v) for k, v in ex.kwargs.items() if _is_float(v)]


def _inject(ex: Example, where: str | int, flat_index: int, value: float) -> Example:
    def poison(t: torch.Tensor) -> torch.Tensor:
        out = t.detach().clone()
        out.view(-1)[flat_index] = value
        return _leaf(t, out)

    if isinstance(where, int):
        args = tuple(poison(a) if i == where else a for i, a in enumerate(ex.args))
        return Example(args, dict(ex.kwargs))
    return Example(ex.args, {k: (poison(v) if k == where else v) for k, v in ex.kwargs.items()})


@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
@FUZZ
@given(
    n=st.sampled_from([1, 2, 3, 7]),
    dtype=st.sampled_from(DTYPES),
    value=st.sampled_from([math.nan, math.inf, -math.inf]),
    pick=st.integers(0, 2**31 - 1),
    seed=st.integers(0, 2**31 - 1),
)
def test_non_finite_inputs_follow_the_policy(
    kind: str, entry: RegistryEntry, n: int, dtype: torch.dtype, value: float, pick: int, seed: int
) -> None:
    ex = _build(entry, n, dtype, seed)
    assume(ex is not None)
    assert ex is not None
    targets = [(w, t) for w, t in _targets(ex) if t.numel() > 0]
    assume(targets)
    where, t = targets[pick % len(targets)]
    index = (pick // len(targets)) % t.numel()
    names = _arg_names(entry)
    arg_name = names[where] if isinstance(where, int) and where < len(names) else str(where)
    what = f"{entry.name} n={n} {dtype} {arg_name}[{index}]={value} seed={seed}"
    clean = [o.detach() for o in _tensors(_call(entry, ex))]
    dirty_ex = _inject(ex, where, index, value)
    try:
        out = _call(entry, dirty_ex)
    except (ValueError, TypeError) as exc:
        if _names_arg(exc, [arg_name]):  # e.g. -inf where the domain is > 0: rejected, named
            record("clear_error", what)
            return
        record("crash", f"{what}: {type(exc).__name__}: {exc}")
        raise
    except Exception as exc:
        record("crash", f"{what}: {type(exc).__name__}: {exc}")
        raise
    dirty = _tensors(out)
    try:
        if entry.gradient != "none":
            _backward(dirty, seed)  # gradients of non-finite inputs are unspecified, but must not raise
    except Exception as exc:
        record("crash", f"{what} (backward): {type(exc).__name__}: {exc}")
        raise
    ordered_inf = entry.nonfinite == "order" and not math.isnan(value)
    problems: list[str] = []
    any_nonfinite = False
    for i, (c, d) in enumerate(zip(clean, dirty)):
        if not d.is_floating_point():
            continue
        d = d.detach()
        fin = torch.isfinite(d)
        any_nonfinite |= not bool(fin.all())
        if ordered_inf:
            if not bool(fin.all()):
                problems.append(f"output {i}: non-finite where +-inf is an ordered value")
            continue
        if c.shape != d.shape:
            problems.append(f"output {i}: shape {tuple(d.shape)} != {tuple(c.shape)}")
            continue
        # an output that stays finite must be one that does not depend on the poisoned entry
        same = torch.isclose(d.double(), c.double(), rtol=1e-3, atol=1e-3) | ~fin
        if not bool(same.all()):
            problems.append(f"output {i}: {int((~same).sum())} finite value(s) changed (silently wrong)")
        if math.isnan(value) and bool((~fin & ~torch.isnan(d)).any()):
            problems.append(f"output {i}: NaN input gave +-inf instead of NaN")
    if not ordered_inf and not any_nonfinite and any(c.numel() > 0 for c in clean if c.is_floating_point()):
        problems.append("no output is non-finite (the NaN/inf was swallowed)")
    record("silent_wrong" if problems else "ok", f"{what}: {problems}")
    assert not problems, f"{what}: {problems}"


# --------------------------------------------------------------------------------------------------
# invalid arguments: ValueError / TypeError naming the argument
# --------------------------------------------------------------------------------------------------
def _bad_values(name: str, value: Any) -> list[Any]:
    if isinstance(value, bool):
        return ["yes", 2]
    if isinstance(value, int):
        return ["3", 2.5, -7]
    if isinstance(value, float):
        return ["1", math.nan, math.inf, -1.0]
    if isinstance(value, str):
        return ["bogus", 3]
    if isinstance(value, torch.Tensor):
        return [value.tolist()]
    return []


def _probe_invalid(entry: RegistryEntry, call: Any, names: list[str], what: str, same_as: Any = None) -> str:
    """``call`` must raise a ValueError/TypeError naming one of ``names``; with ``same_as`` (a list
    standing for a tensor), accepting it is also fine if the result equals ``same_as()``'s."""
    try:
        out = call()
        if entry.gradient != "none":
            _backward(_tensors(out), 0)
    except Exception as exc:
        if _names_arg(exc, names):
            return record("clear_error", what)
        return record("crash", f"{what}: {type(exc).__name__}: {exc}")
    if same_as is not None:
        want = [t.detach() for t in _tensors(same_as())]
        got = [t.detach() for t in _tensors(out)]
        if len(want) == len(got) and all(
            a.shape == b.shape and torch.allclose(a.double(), b.double(), equal_nan=True) for a, b in zip(got, want)
        ):
            return record("ok", f"{what}: converted like the tensor")
    return record("silent_wrong", f"{what}: accepted")


def _invalid_probes(entry: RegistryEntry) -> list[tuple[str, list[str], Any, Any]]:
    """``(description, acceptable names, thunk, same_as)`` for every invalid-argument probe of ``entry``
    (``same_as``: for a tensor replaced by a list, the call with the tensor, whose result an accepting
    function must reproduce)."""
    ex = _build(entry, 4, torch.float32, 0)
    assert ex is not None
    probes: list[tuple[str, list[str], Any, Any]] = []
    names = _arg_names(entry)

    def original() -> Any:
        return _call(entry, ex)

    for key, value in ex.kwargs.items():
        for bad in _bad_values(key, value):
            kw = {**ex.kwargs, key: bad}
            same = original if isinstance(value, torch.Tensor) else None
            probes.append((f"{key}={bad!r}", [key], lambda kw=kw: _call(entry, Example(ex.args, kw)), same))
            if entry.module is not None and key in inspect.signature(entry.module).parameters:
                init = inspect.signature(entry.module).parameters
                var_kw = any(p.kind == p.VAR_KEYWORD for p in init.values())
                mkw = {k: v for k, v in kw.items() if (var_kw or k in init) and not isinstance(v, torch.Tensor)}
                tensor_kw = {k: v for k, v in kw.items() if k not in mkw}

                def module_call(mkw: dict[str, Any] = mkw, tensor_kw: dict[str, Any] = tensor_kw) -> Any:
                    assert entry.module is not None
                    return entry.module(**mkw)(*ex.args, **tensor_kw)

                probes.append((f"module {key}={bad!r}", [key], module_call, same))
    for i, a in enumerate(ex.args):
        if not isinstance(a, torch.Tensor) or i >= len(names):
            continue
        name = names[i]
        variants: list[tuple[str, Any]] = [("a list", a.detach().tolist())]
        variants.append(("a complex tensor", a.detach().to(torch.complex64)))
        if len([b for b in ex.args if isinstance(b, torch.Tensor)]) > 1:
            variants.append(("on the meta device", a.detach().to("meta")))
        for desc, bad in variants:
            args = tuple(bad if j == i else b for j, b in enumerate(ex.args))
            accept = [name] if desc != "on the meta device" else names  # either side of a mismatch
            same = original if desc == "a list" else None
            probes.append((f"{name} as {desc}", accept, lambda args=args: _call(entry, Example(args, ex.kwargs)), same))
    for key, value in ex.kwargs.items():
        if isinstance(value, torch.Tensor):
            kw = {**ex.kwargs, key: value.detach().to("meta")}
            probes.append(
                (f"{key} on the meta device", [key, *names], lambda kw=kw: _call(entry, Example(ex.args, kw)), None)
            )
    return probes


@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
def test_invalid_arguments_raise_errors_naming_them(kind: str, entry: RegistryEntry) -> None:
    failures = []
    for desc, accept, thunk, same_as in _invalid_probes(entry):
        outcome = _probe_invalid(entry, thunk, accept, f"{entry.name}: {desc}", same_as)
        if outcome not in ("clear_error", "ok"):
            failures.append(f"{desc} -> {outcome}")
    assert not failures, f"{entry.name}: {failures}"


# --------------------------------------------------------------------------------------------------
# parity with scipy / torchsort / torch where they apply
# --------------------------------------------------------------------------------------------------
def _parity(what: str, check: Any) -> None:
    try:
        check()
    except AssertionError:
        record("silent_wrong", what)
        raise
    except Exception as exc:
        record("crash", f"{what}: {type(exc).__name__}: {exc}")
        raise
    record("ok", what)


@FUZZ
@given(
    n=st.sampled_from(SIZES),
    dtype=st.sampled_from(DTYPES),
    ties=st.sampled_from(["ordinal", "average", "min", "max", "dense"]),
    descending=st.booleans(),
    normalize=st.booleans(),
    special=st.sampled_from([None, math.nan, math.inf, -math.inf]),
    seed=st.integers(0, 2**31 - 1),
)
def test_rank_matches_scipy_rankdata(
    n: int, dtype: torch.dtype, ties: str, descending: bool, normalize: bool, special: float | None, seed: int
) -> None:
    """``rank`` == ``scipy.stats.rankdata(method=ties, nan_policy="propagate")`` row by row, exact in float32
    for half inputs; ``blackbox_rank``'s forward equals the ordinal ranks."""
    scipy_stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(3, n, generator=g) * 2).round().to(dtype)  # many ties
    if special is not None and n:
        x[1, int(torch.randint(n, (), generator=g))] = special

    def check() -> None:
        got = rankwise_rank(x, ties=ties, descending=descending, normalize=normalize)
        assert got.dtype == (torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype)
        for row, r in zip(x, got):
            v = row.double().numpy()
            want = scipy_stats.rankdata(-v if descending else v, method=ties, nan_policy="propagate")
            want = torch.as_tensor(want, dtype=torch.float64) / (n if normalize else 1)
            exact = {"rtol": 0.0, "atol": 0.0} if not normalize else {"rtol": 2e-7, "atol": 0.0}  # r / n rounds
            torch.testing.assert_close(r.double(), want, equal_nan=True, **exact)
        if ties == "ordinal" and special is None and n:
            bb = rankwise_blackbox_rank(x.float().requires_grad_(), 1.0, descending=descending, normalize=normalize)
            torch.testing.assert_close(bb.detach(), got.float(), rtol=0, atol=0)

    _parity(f"rank vs scipy n={n} {dtype} {ties} desc={descending} special={special}", check)


def _tie_group_sums(x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Per row, every entry replaced by the sum of ``grad`` over the entries tied with it in ``x``."""
    out = torch.empty_like(grad)
    for r in range(x.shape[0]):
        _, inv = torch.unique(x[r], return_inverse=True)
        out[r] = torch.zeros(int(inv.max()) + 1, dtype=grad.dtype).index_add_(0, inv, grad[r])[inv]
    return out


@FUZZ
@given(
    n=st.sampled_from([1, 2, 3, 7, 64, LARGE]),
    reg=st.sampled_from(["l2", "kl"]),
    kind=st.sampled_from(["rank", "sort"]),
    strength=st.sampled_from([1e-2, 0.1, 1.0, 10.0]),
    ties=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_isotonic_matches_torchsort(n: int, reg: str, kind: str, strength: float, ties: bool, seed: int) -> None:
    """Values and gradients equal torchsort's (float64, ascending) on random inputs, ties included."""
    torchsort = pytest.importorskip("torchsort")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, generator=g, dtype=torch.float64) * 3
    if ties:
        x = x.round()
    w = torch.randn(2, n, generator=g, dtype=torch.float64)
    ours = getattr(rankwise_ops, f"soft_{kind}")
    theirs = getattr(torchsort, f"soft_{kind}")
    kw = {"regularization": reg, "regularization_strength": strength}

    def run(fn: Any) -> tuple[torch.Tensor, torch.Tensor]:
        a = x.clone().requires_grad_()
        y = fn(a)
        (y * w).sum().backward()
        assert a.grad is not None
        return y.detach(), a.grad

    def check() -> None:
        y1, g1 = run(lambda t: ours(t, method="isotonic", **kw))
        y2, g2 = run(lambda t: theirs(t, **kw))
        torch.testing.assert_close(y1, y2, rtol=1e-9, atol=1e-9)
        if ties and kind == "sort":
            # which of two tied inputs takes which sorted position is arbitrary (torchsort's argsort is
            # not stable): only the gradient summed over each group of tied inputs is defined
            g1, g2 = _tie_group_sums(x, g1), _tie_group_sums(x, g2)
        if torch.isfinite(g2).all():  # torchsort's KL backward is NaN at small strengths (its issue #63)
            torch.testing.assert_close(g1, g2, rtol=1e-8, atol=1e-8)

    _parity(f"isotonic {kind} {reg} vs torchsort n={n} eps={strength} ties={ties}", check)


@FUZZ
@given(
    n=st.sampled_from([2, 3, 7, 64, LARGE]),
    pred_dtype=st.sampled_from(DTYPES),
    target_dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_spearman_correlation_matches_scipy(
    n: int, pred_dtype: torch.dtype, target_dtype: torch.dtype, seed: int
) -> None:
    """With a strength far below the gaps of ``pred``: ``scipy.stats.spearmanr`` (target ties averaged),
    whatever the two dtypes (the target is never rounded to the prediction's dtype)."""
    scipy_stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(seed)
    pred = torch.randperm(n, generator=g).to(pred_dtype)  # distinct values in every dtype for n <= 256
    pred = pred if n <= 256 or pred_dtype != torch.bfloat16 else pred.float()
    target = torch.randint(-3, 4, (n,), generator=g).to(target_dtype)
    if target_dtype.is_floating_point:  # near-ties that only float64 resolves
        target = target + torch.randn(n, generator=g, dtype=torch.float64).to(target_dtype) * 1e-7

    def check() -> None:
        rho = rankwise_losses.spearman_correlation(pred, target, ranker="isotonic", regularization_strength=1e-3)
        with warnings.catch_warnings():  # a constant target: scipy warns and returns NaN
            warnings.simplefilter("ignore")
            want = scipy_stats.spearmanr(pred.double().numpy(), target.double().numpy()).statistic
        if math.isnan(want):  # a constant target: scipy gives NaN, rankwise 0
            assert rho.item() == 0.0
        else:
            assert abs(rho.item() - want) < 1e-5, (rho.item(), want)

    _parity(f"spearman_correlation vs scipy n={n} {pred_dtype}/{target_dtype}", check)


@FUZZ
@given(
    n=st.sampled_from([0, 1, 2, 7, LARGE]),
    kind=st.sampled_from(["l1", "mse", "huber"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_regression_loss_matches_torch(n: int, kind: str, seed: int) -> None:
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    p, t = torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)

    def check() -> None:
        got = rankwise_losses.regression_loss(p, t, kind=kind, huber_beta=0.7)  # type: ignore[arg-type]
        if n == 0:
            assert got.item() == 0.0
            return
        ref = {"l1": F.l1_loss(p, t), "mse": F.mse_loss(p, t), "huber": F.smooth_l1_loss(p, t, beta=0.7)}[kind]
        torch.testing.assert_close(got, ref)

    _parity(f"regression_{kind} vs torch n={n}", check)


# --------------------------------------------------------------------------------------------------
# the newer option spaces: Sinkhorn epsilon, isotonic magnitudes, Balanced-MSE mixtures, second derivatives
# --------------------------------------------------------------------------------------------------
@FUZZ
@given(
    n=st.sampled_from([1, 2, 3, 7, 16]),
    log_eps=st.floats(-330.0, 0.0),
    dtype=st.sampled_from(DTYPES),
    pattern=st.sampled_from(["randn", "ties", "near_ties", "outlier", "huge", "tiny"]),
    m_less=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_sinkhorn_epsilon_gives_a_valid_plan_or_a_clear_refusal(
    n: int, log_eps: float, dtype: torch.dtype, pattern: str, m_less: bool, seed: int
) -> None:
    """Any epsilon, down to the subnormals: ``epsilon`` below the dtype's floor is refused naming it;
    otherwise soft ranks lie in [n/m, n], the plan's rows sum to 1/n, gradients are finite."""
    from rankwise.ops import sinkhorn as sk

    eps = max(10.0**log_eps, 5e-324)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, generator=g, dtype=torch.float64)
    if pattern == "ties":
        x = x.round()
    elif pattern == "near_ties":
        x = x.round() + 1e-9 * torch.randn(2, n, generator=g, dtype=torch.float64)
    elif pattern == "outlier":
        x[:, 0] = 1e3
    elif pattern in ("huge", "tiny"):
        x = x * (1e30 if pattern == "huge" else 1e-30)
    x = x.to(dtype)
    assume(bool(torch.isfinite(x).all()))  # (1e30 overflows float16; non-finite rows are NaN by policy)
    m = max(1, n // 2) if m_less else n
    what = f"sinkhorn eps={eps:g} {dtype} {pattern} n={n} m={m}"
    if eps < sk.epsilon_floor(dtype):
        try:
            rankwise_ops.soft_rank(x, method="sinkhorn", epsilon=eps, num_targets=m)
        except ValueError as exc:
            assert "`epsilon`" in str(exc)
            record("clear_error", what)
            return
        record("silent_wrong", f"{what}: accepted below the floor")
        raise AssertionError(what)

    try:  # ties spread over fewer targets near the floor: an unbalanceable plan is refused, never returned
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rankwise_ops.sinkhorn_transport(x, epsilon=eps, num_targets=m)
    except ValueError as exc:
        assert "`epsilon`" in str(exc) and "too small for these inputs" in str(exc)
        record("clear_error", what)
        return

    def check() -> None:
        xr = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the std-floor and tolerance warnings are tested elsewhere)
            r = rankwise_ops.soft_rank(xr, method="sinkhorn", epsilon=eps, num_targets=m)
            plan = rankwise_ops.sinkhorn_transport(x, epsilon=eps, num_targets=m).double()
        rd = r.detach().double()
        assert (rd >= n / m - 1e-3).all() and (rd <= n + 1e-3).all(), rd
        # (the plan is returned in x's dtype: float16/bfloat16 round its entries)
        row_tol = 1e-4 if dtype in (torch.float32, torch.float64) else 4 * m * torch.finfo(dtype).eps
        assert float((plan.sum(-1) * n - 1).abs().max()) < row_tol
        (gx,) = torch.autograd.grad(r.sum(), xr)
        assert torch.isfinite(gx).all()

    _parity(what, check)


@FUZZ
@given(
    n=st.sampled_from([2, 3, 7, 64]),
    exponent=st.integers(-35, 35),
    log_eps=st.floats(-40.0, 4.0),
    reg=st.sampled_from(["l2", "kl"]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    descending=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_isotonic_ranks_stay_in_the_permutahedron_at_any_magnitude(
    n: int, exponent: int, log_eps: float, reg: str, dtype: torch.dtype, descending: bool, seed: int
) -> None:
    """Soft ranks in [1, n] summing to n(n+1)/2; the exact ranks where the strength is below 1/(4n) of
    the smallest gap; the soft sort between the row's min and max."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(3, n, generator=g, dtype=torch.float64) * 10.0**exponent).to(dtype)
    eps = 10.0**log_eps

    def check() -> None:
        kw = {"regularization": reg, "regularization_strength": eps, "descending": descending}
        r = rankwise_ops.soft_rank(x, method="isotonic", **kw).double()
        s = rankwise_ops.soft_sort(x, method="isotonic", **kw).double()
        assert torch.isfinite(r).all() and (r >= 1 - 1e-4).all() and (r <= n + 1e-4).all(), r
        torch.testing.assert_close(r.sum(-1), torch.full((3,), n * (n + 1) / 2, dtype=torch.float64), rtol=1e-5, atol=0)
        xs = torch.sort(x.double(), dim=-1).values
        gaps = (xs[:, 1:] - xs[:, :-1]).amin(-1)
        sharp = gaps > 4 * n * eps
        if sharp.any():
            exact = rankwise_rank(x.double(), descending=descending)
            torch.testing.assert_close(r[sharp], exact[sharp], rtol=0, atol=1e-3)
        lo, hi = xs[:, :1], xs[:, -1:]
        # kl works in absolute units (exp(x)): its soft part has absolute round-off ~ u n log n (documented)
        slack = 1e-5 * (hi - lo) + (64 * n * math.log(n + 1) * torch.finfo(dtype).eps if reg == "kl" else 0.0)
        assert (s >= lo - slack).all() and (s <= hi + slack).all()

    _parity(f"isotonic {reg} 1e{exponent} eps={eps:g} {dtype} n={n}", check)


@FUZZ
@given(
    k=st.integers(1, 4),
    kind=st.sampled_from(["valid", "negative_var", "zero_var", "negative_weight", "zero_weights", "unnormalised"]),
    cov=st.sampled_from(["isotropic", "full"]),
    method=st.sampled_from(["gai", "bni"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_balanced_mse_mixtures_are_validated_or_normalised(k: int, kind: str, cov: str, method: str, seed: int) -> None:
    """A valid mixture (weights rescaled by any positive factor) gives the loss of the normalised one; an
    invalid one (variance <= 0, weight < 0, weights summing to 0) is refused naming the argument."""
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(5, 1, generator=g, dtype=torch.float64)
    target = torch.randn(5, 1, generator=g, dtype=torch.float64)
    means = torch.randn(k, 1, generator=g, dtype=torch.float64)
    var = torch.rand(k, generator=g, dtype=torch.float64) + 0.1
    w = torch.rand(k, generator=g, dtype=torch.float64) + 0.05
    w = w / w.sum()
    bad_w, bad_var = w.clone(), var.clone()
    if kind == "negative_var":
        bad_var[0] = -0.5
    elif kind == "zero_var":
        bad_var[0] = 0.0
    elif kind == "negative_weight":
        bad_w[0] = -0.1
    elif kind == "zero_weights":
        bad_w = torch.zeros_like(w)
    elif kind == "unnormalised":
        bad_w = w * float(torch.rand((), generator=g, dtype=torch.float64) * 3 + 0.1)
    vv = bad_var[:, None, None] if cov == "full" else bad_var

    def loss(variances: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if method == "gai":
            return rankwise_losses.balanced_mse_loss(pred, target, 0.7, method="gai", gmm=(means, variances, weights))
        return rankwise_losses.balanced_mse_loss(
            pred, target, 0.7, method="bni", bucket_centers=means[:, 0], bucket_weights=weights
        )

    what = f"balanced_mse {method} {kind} {cov} k={k}"
    invalid = kind in ("negative_weight", "zero_weights") or (method == "gai" and kind in ("negative_var", "zero_var"))
    if invalid:
        try:
            loss(vv, bad_w)
        except ValueError as exc:
            assert "`gmm`" in str(exc) or "`bucket_weights`" in str(exc)
            record("clear_error", what)
            return
        record("silent_wrong", f"{what}: accepted")
        raise AssertionError(what)
    _parity(
        what, lambda: torch.testing.assert_close(loss(vv, bad_w), loss(var[:, None, None] if cov == "full" else var, w))
    )


@FUZZ
@given(
    n=st.sampled_from([2, 3, 5]),
    network=st.sampled_from(["odd_even", "bitonic"]),
    distribution=st.sampled_from(["cauchy", "logistic", "logistic_phi", "optimal", "gaussian", "reciprocal"]),
    output=st.sampled_from(["values", "matrix", "ranks"]),
    steepness=st.sampled_from([0.5, 2.0, 8.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_diffsort_second_derivatives(
    n: int, network: str, distribution: str, output: str, steepness: float, seed: int
) -> None:
    """``gradgradcheck`` (float64) of the sorting network's values, relaxed permutation matrix and ranks."""
    from rankwise.ops import diffsort

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, generator=g, dtype=torch.float64).requires_grad_()
    kw = {"network": network, "distribution": distribution, "steepness": steepness}

    def fn(t: torch.Tensor) -> torch.Tensor:
        if output == "values":
            return diffsort(t, return_matrix=False, **kw)
        if output == "matrix":
            return diffsort(t, **kw)[1]
        return rankwise_ops.soft_rank(t, method="diffsort", **kw)

    _parity(
        f"diffsort gradgradcheck {network} {distribution} {output} n={n}",
        lambda: torch.autograd.gradgradcheck(fn, (x,), atol=1e-5, rtol=1e-4),
    )
