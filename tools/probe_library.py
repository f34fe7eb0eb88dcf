"""Hostile-input probe of the library surfaces: learning-to-rank losses and metrics, retrieval losses and
``retrieval_metrics``, the ``nifti`` loader's cache, ``torch.compile(fullgraph=True)`` against eager, and two
checks of the soft-rank operators (second derivatives of the stochastic ops at fixed noise, the isotonic
gradient of a block-constant cotangent in half precision).

    PYTHONPATH=$PWD/src python tools/probe_library.py [--out FILE.json] [--only A,B,...]

Outcomes per case: ok (the value agrees with an independent computation or the documented convention),
clear (ValueError/TypeError naming an argument in backticks), crash (any other exception, or over the time
limit), silent (a wrong value without an error), limit (a NaN where an intermediate overflows the
dtype). Prints the counts and every crash/silent case; writes the counts and every case to the JSON file.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import rankwise
from rankwise.metrics import dcg, map_at_k, mrr, ndcg, retrieval_metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the example inputs of tests/
from tests.registry_examples import entry_factories, registry_cases

warnings.simplefilter("ignore")
torch.set_num_threads(1)
COUNTS: collections.Counter[str] = collections.Counter()
CASES: list[dict[str, Any]] = []


class _Timeout(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise _Timeout()


signal.signal(signal.SIGALRM, _alarm)


class Factories:
    """The example / degenerate / fuzz input factories of one registry entry (``None`` where it has none)."""

    def __init__(self, example: Any, degenerate: Any, fuzz: Any) -> None:
        self.example, self.degenerate, self.fuzz = example, degenerate, fuzz


def factories(entry: Any) -> Factories:
    """An entry's input factories, from the test suite's ``tests/registry_examples.py`` (all ``None``
    for an entry that has none there)."""
    try:
        found = entry_factories(entry)
    except LookupError:
        return Factories(None, None, None)
    return Factories(found.example, found.degenerate, found.fuzz)


#: the device of the families that take one (G, H); ``--device``
DEVICE = torch.device("cpu")


def fail(msg: str) -> None:
    """A usage error of the probe: one ``error:`` line, exit status 2."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def probe(section: str, what: str, fn: Callable[[], Any], seconds: int = 60) -> None:
    """Run one case: ``fn`` returns True (ok) or a string saying what is wrong (silent)."""
    signal.alarm(seconds)
    try:
        res = fn()
        out, msg = ("ok", "") if res is True else ("silent", str(res)[:240])
    except _Timeout:
        out, msg = "crash", "timeout"
    except OverflowError as e:  # a NaN beyond a range the dtype can hold: a limit, counted apart
        out, msg = "limit", str(e)[:160]
    except (ValueError, TypeError) as e:
        out, msg = ("clear", str(e)[:160]) if "`" in str(e) else ("crash", repr(e)[:240])
    except Exception as e:
        out, msg = "crash", repr(e)[:240]
    finally:
        signal.alarm(0)
    COUNTS[out] += 1
    CASES.append({"section": section, "case": what, "outcome": out, "detail": msg})
    if out in ("crash", "silent"):  # at once, for a long run
        print(f"{out}: [{section}] {what}: {msg}", flush=True)


def expect_error(fn: Callable[[], Any]) -> Callable[[], Any]:
    """A case where a refusal is the right answer: returning a value is silent acceptance."""

    def run() -> Any:
        fn()
        return "accepted"

    return run


def close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-6) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True))


def finite(*ts: torch.Tensor | None) -> bool:
    return all(t is None or bool(torch.isfinite(t).all()) for t in ts)


# -------------------------------------------------------------------------------------------- A. soft ranks
def section_a() -> None:
    for _, e in registry_cases("op"):  # the entries and their test variants (name + options)
        if not e.stochastic or e.gradient != "exact" or factories(e).example is None:
            continue
        for fixed in (False, True):

            def f(e: Any = e, fixed: bool = fixed) -> Any:
                ex = factories(e).example(torch.float64, torch.device("cpu"))
                x = ex.args[0].detach().clone().requires_grad_()
                rest = [a.detach() if isinstance(a, torch.Tensor) else a for a in ex.args[1:]]

                def fn(v: torch.Tensor) -> Any:
                    kw = dict(ex.kwargs)
                    if fixed:
                        kw["generator"] = torch.Generator().manual_seed(7)
                    out = e.fn(v, *rest, **kw)
                    return out[0] if isinstance(out, tuple) else out

                ok = torch.autograd.gradgradcheck(fn, (x,), atol=1e-5, rtol=1e-3, raise_exception=False)
                if fixed:
                    return ok or "second derivative differs from finite differences at fixed noise"
                # re-drawn noise: finite differences of a different function each call; a mismatch is expected
                return True

            probe("A", f"gradgradcheck {e.name} {'fixed generator' if fixed else 'global RNG (re-drawn noise)'}", f)
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        for reg in ("l2", "kl"):
            for eps in (1e-30, 1e-3, 1.0):

                def g(dt: torch.dtype = dt, reg: str = reg, eps: float = eps) -> Any:
                    x = torch.tensor([[1.0, -1, 1, 1, -1, 1, -1], [0.3, 0.1, 0.3, 0.2, 0.9, 0.1, 0.5]], dtype=dt)
                    x.requires_grad_()
                    y = rankwise.soft_rank(x, method="isotonic", regularization=reg, regularization_strength=eps)
                    y.sum().backward()
                    if not finite(x.grad):
                        return f"non-finite gradient of sum(ranks) {x.grad}"
                    return bool((x.grad.abs() <= 1e-6 / eps).all()) or f"gradient of sum(ranks) not 0: {x.grad}"

                probe("A", f"isotonic {reg} {dt} eps={eps} d(sum ranks)/dx = 0", g)


# ------------------------------------------------------------------------------------ B. learning to rank
LTR = [e for _, e in registry_cases("loss") if e.fn.__module__.endswith("learning_to_rank")]
DOCUMENTED_PADDING_SHIFT = ("pirank.diffsort", "pirank.softsort", "pirank.isotonic")


def _ltr_call(e: Any, p: torch.Tensor, t: torch.Tensor, **extra: Any) -> torch.Tensor:
    kw = dict(factories(e).example(torch.float64, torch.device("cpu")).kwargs)
    if "generator" in kw or e.stochastic:
        kw["generator"] = torch.Generator().manual_seed(3)
    kw.update(extra)
    return e.fn(p, t, **kw)


def _ltr_batch(
    seed: int = 0, b: int = 4, n: int = 7, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(b, n, generator=g, dtype=torch.float64)
    t = torch.randint(0, 5, (b, n), generator=g).to(torch.float64)
    t[0, -2:] = -1.0  # padding
    t[1, 0] = -1.0
    return p.to(dtype), t


def section_b() -> None:
    for e in LTR:
        name = e.name

        def base(e: Any = e) -> Any:
            p, t = _ltr_batch()
            p.requires_grad_()
            y = _ltr_call(e, p, t)
            y.backward()
            return (finite(y, p.grad) and y.dim() == 0) or f"value {y} grad {p.grad}"

        probe("B", f"{name}: base", base)

        for junk in (0.0, math.nan, math.inf, -math.inf, 1e30):

            def pad(junk: float = junk, e: Any = e) -> Any:
                p, t = _ltr_batch()
                p2 = torch.cat([p, torch.full((4, 3), junk, dtype=p.dtype)], -1).requires_grad_()
                t2 = torch.cat([t, torch.full((4, 3), -1.0, dtype=t.dtype)], -1)
                if not math.isfinite(junk):  # batch losses: any NaN/inf input makes the loss NaN (documented policy)
                    y = _ltr_call(
                        e, torch.cat([p, torch.full((4, 3), junk)], -1), torch.cat([t, -torch.ones(4, 3)], -1)
                    )
                    return bool(torch.isnan(y)) or f"non-finite padded score gave {y} (policy: NaN)"
                p1 = p.clone().requires_grad_()
                y1, y2 = _ltr_call(e, p1, t), _ltr_call(e, p2, t2)
                y1.backward()
                y2.backward()
                if e.stochastic or e.name in DOCUMENTED_PADDING_SHIFT:
                    # stochastic: the noise is drawn per slot, so padding shifts it; the relaxations other than
                    # NeuralSort see padded slots as items below every real one (documented): finiteness only
                    return finite(y2, p2.grad[:, :7]) or f"padding score {junk} leaks: {y2}"
                if not close(y1, y2, 1e-5, 1e-7):
                    return f"padding score {junk} changes the loss {float(y1):.6g} -> {float(y2):.6g}"
                return close(p1.grad, p2.grad[:, :7], 1e-5, 1e-7) or f"padding score {junk} changes the gradient"

            probe("B", f"{name}: 3 padded slots with score {junk}", pad)

        def perm(e: Any = e) -> Any:
            p, t = _ltr_batch(1)
            g = torch.Generator().manual_seed(9)
            idx = torch.stack([torch.randperm(7, generator=g) for _ in range(4)])
            y1 = _ltr_call(e, p, t)
            y2 = _ltr_call(e, p.gather(1, idx), t.gather(1, idx))
            if e.stochastic or e.name == "pirank.diffsort":  # a relaxed sorting network depends on the input order
                return finite(y1, y2) or "non-finite"
            return close(y1, y2, 1e-6, 1e-9) or f"not invariant to reordering the items {float(y1)} vs {float(y2)}"

        probe("B", f"{name}: joint permutation of items", perm)

        degenerate = {
            "empty n=0": (torch.zeros(3, 0), torch.zeros(3, 0)),
            "no lists": (torch.zeros(0, 5), torch.zeros(0, 5)),
            "n=1": (torch.randn(3, 1), torch.ones(3, 1)),
            "all padding": (torch.randn(3, 5), torch.full((3, 5), -1.0)),
            "all-equal scores": (torch.full((3, 5), 0.3), torch.tensor([[0.0, 1, 2, 3, 4]] * 3)),
            "no relevant item": (torch.randn(3, 5), torch.zeros(3, 5)),
            "all labels equal 2": (torch.randn(3, 5), torch.full((3, 5), 2.0)),
            "one real item per list": (torch.randn(3, 5), torch.tensor([[2.0, -1, -1, -1, -1]] * 3)),
            "scores 1e30": (torch.randn(3, 5) * 1e30, torch.tensor([[0.0, 1, 2, 3, 4]] * 3)),
            "scores 1e-30": (torch.randn(3, 5) * 1e-30, torch.tensor([[0.0, 1, 2, 3, 4]] * 3)),
            "labels 1e3": (torch.randn(3, 5), torch.tensor([[0.0, 1, 2, 3, 1000]] * 3)),
            "labels 0.5 (fractional)": (torch.randn(3, 5), torch.tensor([[0.0, 0.5, 1.5, 3, 4]] * 3)),
        }
        for tag, (p0, t0) in degenerate.items():

            def deg(p0: torch.Tensor = p0, t0: torch.Tensor = t0, tag: str = tag, e: Any = e) -> Any:
                p = p0.clone().requires_grad_()
                y = _ltr_call(e, p, t0)
                y.backward()
                if not finite(y, p.grad):
                    if tag == "labels 1e3":
                        raise OverflowError("gain 2**1000 overflows float32 (NaN loss)")
                    return f"non-finite: {y}"
                if tag in ("empty n=0", "no lists", "all padding"):
                    return float(y) == 0.0 or f"expected 0 for {tag}, got {float(y)}"
                return True

            probe("B", f"{name}: {tag}", deg)

        for dt in (torch.float16, torch.bfloat16):

            def half(dt: torch.dtype = dt, e: Any = e) -> Any:
                p, t = _ltr_batch(2, dtype=dt)
                p.requires_grad_()
                y = _ltr_call(e, p, t)
                y.backward()
                ref = _ltr_call(e, p.detach().double(), t)
                if not finite(y, p.grad) or p.grad.dtype != dt:
                    return f"non-finite or wrong grad dtype {y} {p.grad.dtype}"
                return close(y, ref, 2e-2, 1e-3) or f"{dt} {float(y)} vs float64 {float(ref)}"

            probe("B", f"{name}: {dt} scores", half)

        def labels_int(e: Any = e) -> Any:
            p, t = _ltr_batch(3)
            return close(_ltr_call(e, p, t.long()), _ltr_call(e, p, t)) or "int64 labels differ from float"

        def noncontig(e: Any = e) -> Any:
            p, t = _ltr_batch(4)
            return close(_ltr_call(e, p.t().contiguous().t(), t.t().contiguous().t()), _ltr_call(e, p, t)) or "differs"

        def lead(e: Any = e) -> Any:
            p, t = _ltr_batch(5, b=6)
            kw = (
                {"reduction": "sum"}
                if "reduction" in factories(e).example(torch.float64, torch.device("cpu")).kwargs
                else {}
            )
            y3 = _ltr_call(e, p.reshape(2, 3, 7), t.reshape(2, 3, 7), **kw)
            return close(y3, _ltr_call(e, p, t, **kw)) or "leading dims differ from the flat batch"

        def nan_valid(e: Any = e) -> Any:
            p, t = _ltr_batch(6)
            p[2, 3] = math.nan
            y = _ltr_call(e, p, t)
            return bool(torch.isnan(y)) or f"NaN score in a real slot gave a finite loss {float(y)}"

        def grad_target(e: Any = e) -> Any:
            p, t = _ltr_batch(7)
            t = t.clone().requires_grad_()
            y = _ltr_call(e, p.requires_grad_(), t)
            y.backward()
            return finite(y) or "non-finite"

        for tag, fn in (
            ("int64 labels", labels_int),
            ("non-contiguous", noncontig),
            ("leading dims (2, 3, n)", lead),
            ("NaN score in a real slot", nan_valid),
            ("labels with requires_grad", grad_target),
        ):
            probe("B", f"{name}: {tag}", fn)
        bad = {
            "shape mismatch": lambda e=e: _ltr_call(e, torch.randn(3, 5), torch.zeros(3, 4)),
            "integer scores": lambda e=e: _ltr_call(e, torch.ones(3, 5, dtype=torch.long), torch.zeros(3, 5)),
            "0-d scores": lambda e=e: _ltr_call(e, torch.tensor(1.0), torch.tensor(1.0)),
            "labels on the meta device": lambda e=e: _ltr_call(e, torch.randn(3, 5), torch.zeros(3, 5, device="meta")),
            "padded_value_indicator=nan": lambda e=e: _ltr_call(
                e, torch.randn(3, 5), torch.zeros(3, 5), padded_value_indicator=math.nan
            ),
            "complex scores": lambda e=e: _ltr_call(e, torch.randn(3, 5, dtype=torch.complex64), torch.zeros(3, 5)),
        }
        for tag, fn in bad.items():
            probe("B", f"{name}: {tag} refused", expect_error(fn))


def _ref_metrics(p: np.ndarray, t: np.ndarray, k: int) -> tuple[float, float, float, float]:
    """DCG@k, NDCG@k (1.0 without gain), MRR@k, AP@k of one list (padding -1 dropped), by definition."""
    keep = t != -1
    p, t = p[keep], t[keep]
    order = np.argsort(-p, kind="stable")
    ts = t[order]
    gains = 2.0 ** np.maximum(ts, 0) - 1.0
    gains = np.where(ts > 0, 2.0**ts - 1.0, 0.0) if (ts < 0).any() else gains
    disc = 1.0 / np.log2(np.arange(2, len(ts) + 2))
    d = float((gains[:k] * disc[:k]).sum())
    ideal_t = np.sort(t)[::-1]
    ig = np.where(ideal_t > 0, 2.0**ideal_t - 1.0, 0.0) if (ideal_t < 0).any() else 2.0 ** np.maximum(ideal_t, 0) - 1.0
    i = float((ig[:k] * disc[:k]).sum())
    nd = d / i if i > 0 else 1.0
    if len(ts) == 0 or ts.max() <= 0:
        rr = 0.0
    else:
        r = int(np.argmax(ts == ts.max())) + 1
        rr = 1.0 / r if r <= k else 0.0
    rel = (ts > 0).astype(float)
    hits = np.cumsum(rel)
    prec = hits / np.arange(1, len(ts) + 1)
    nrel = rel.sum()
    ap = float((prec * rel)[:k].sum() / min(k, nrel)) if nrel > 0 else 0.0
    return d, nd, rr, ap


def section_c() -> None:
    rng = np.random.default_rng(0)
    for trial in range(6):

        def f(trial: int = trial) -> Any:
            b, n = 5, 8
            p = torch.tensor(rng.permutation(b * n).reshape(b, n) / 7.0)  # no ties
            t = torch.tensor(rng.integers(0, 4, (b, n)).astype(float))
            t[0, -3:] = -1
            t[1] = torch.tensor([0.0] * 6 + [-1, -1])  # no relevant item
            if trial % 2:
                t[2] = -1  # only padding
            for k in (1, 3, n):
                got = [m(p, t, ats=[k])[:, 0] for m in (dcg, ndcg, mrr, map_at_k)]
                for row in range(b):
                    ref = _ref_metrics(p[row].numpy(), t[row].numpy(), k)
                    for name, g, r in zip(("dcg", "ndcg", "mrr", "map"), got, ref):
                        if abs(float(g[row]) - r) > 1e-9:
                            return f"{name}@{k} row {row}: {float(g[row])} vs reference {r}"
            return True

        probe("C", f"dcg/ndcg/mrr/map vs definition, trial {trial}", f)
    for m in (dcg, ndcg, mrr, map_at_k):
        name = m.__name__
        cases: dict[str, Callable[[], Any]] = {
            "n=0": lambda m=m: m(torch.zeros(2, 0), torch.zeros(2, 0)).shape[0] == 2 or "shape",
            "n=1": lambda m=m: finite(m(torch.randn(2, 1), torch.ones(2, 1))) or "non-finite",
            "all padding": lambda m=m: finite(m(torch.randn(2, 4), torch.full((2, 4), -1.0))) or "non-finite",
            "float16": lambda m=m: (
                close(
                    m(torch.tensor([[0.5, 0.2, 0.9]], dtype=torch.float16), torch.tensor([[1.0, 0.0, 2.0]])),
                    m(torch.tensor([[0.5, 0.2, 0.9]]), torch.tensor([[1.0, 0.0, 2.0]])),
                    1e-3,
                )
                or "float16 differs"
            ),
            "int labels": lambda m=m: (
                close(
                    m(torch.tensor([[0.5, 0.2, 0.9]]), torch.tensor([[1, 0, 2]])),
                    m(torch.tensor([[0.5, 0.2, 0.9]]), torch.tensor([[1.0, 0.0, 2.0]])),
                )
                or "int labels differ"
            ),
            "scores 1e30": lambda m=m: (
                close(
                    m(torch.tensor([[0.5, 0.2, 0.9]]) * 1e30, torch.tensor([[1.0, 0.0, 2.0]])),
                    m(torch.tensor([[0.5, 0.2, 0.9]]), torch.tensor([[1.0, 0.0, 2.0]])),
                )
                or "scale changes the metric"
            ),
            "NaN score": lambda m=m: (lambda y: not finite(y) or "NaN score ranked silently")(
                m(torch.tensor([[0.5, math.nan, 0.9]]), torch.tensor([[1.0, 0.0, 2.0]]))
            ),
        }
        for tag, fn in cases.items():
            probe("C", f"{name}: {tag}", fn)
        probe(
            "C",
            f"{name}: ats beyond n clipped to n (documented)",
            lambda m=m: (
                close(
                    m(torch.tensor([[0.5, 0.2, 0.9]]), torch.tensor([[1.0, 0.0, 2.0]]), ats=[1, 100]),
                    m(torch.tensor([[0.5, 0.2, 0.9]]), torch.tensor([[1.0, 0.0, 2.0]]), ats=[1, 3]),
                )
                or "not clipped"
            ),
        )
        for ats in (0, -1, [0], True, 1.5, "3"):
            probe(
                "C",
                f"{name}: ats={ats!r} refused",
                expect_error(lambda m=m, ats=ats: m(torch.randn(2, 4), torch.ones(2, 4), ats=ats)),
            )
        probe("C", f"{name}: shape mismatch refused", expect_error(lambda m=m: m(torch.randn(2, 4), torch.ones(2, 3))))


# ------------------------------------------------------------------------------------- D. retrieval
RETR = [
    e
    for _, e in registry_cases("loss")
    if e.fn.__module__.rsplit(".", 1)[-1] in ("retrieval", "_pairs", "_supcon") and e.name not in ("conr", "rnc")
]  # conr / rnc: regression losses of continuous labels


def _retr_call(e: Any, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    kw = dict(factories(e).example(torch.float64, torch.device("cpu")).kwargs)
    return e.fn(x, labels, **kw)


def _ref_retrieval(x: np.ndarray, y: np.ndarray, ks: tuple[int, ...]) -> dict[str, float]:
    d = ((x[:, None] - x[None]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    out: dict[str, list[float]] = {f"recall@{k}": [] for k in ks} | {"map@r": [], "r_precision": []}
    for q in range(len(x)):
        r = int((y == y[q]).sum() - 1)
        if r == 0:
            continue
        order = np.argsort(d[q], kind="stable")[: len(x) - 1]
        rel = (y[order] == y[q]).astype(float)
        for k in ks:
            out[f"recall@{k}"].append(float(rel[:k].any()))
        prec = np.cumsum(rel[:r]) / np.arange(1, r + 1)
        out["map@r"].append(float((prec * rel[:r]).sum() / r))
        out["r_precision"].append(float(rel[:r].mean()))
    return {k: float(np.mean(v)) if v else math.nan for k, v in out.items()}


def section_d() -> None:
    for e in RETR:
        name = e.name

        def base(e: Any = e) -> Any:
            x = torch.randn(12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
            y = _retr_call(e, x, torch.arange(12) % 4)
            y.backward()
            return finite(y, x.grad) or f"non-finite {y}"

        probe("D", f"{name}: base", base)

        def perm(e: Any = e) -> Any:
            x = torch.randn(12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
            lab = torch.arange(12) % 4
            idx = torch.randperm(12, generator=torch.Generator().manual_seed(2))
            if e.stochastic:
                return True
            return (
                close(_retr_call(e, x, lab), _retr_call(e, x[idx], lab[idx]), 1e-6, 1e-9) or "not permutation invariant"
            )

        probe("D", f"{name}: joint permutation of the batch", perm)
        degenerate = {
            "one class": (torch.randn(8, 5), torch.zeros(8, dtype=torch.long)),
            "all singletons (no positives)": (torch.randn(8, 5), torch.arange(8)),
            "B=1": (torch.randn(1, 5), torch.zeros(1, dtype=torch.long)),
            "B=0": (torch.randn(0, 5), torch.zeros(0, dtype=torch.long)),
            "all-zero embeddings": (torch.zeros(8, 5), torch.arange(8) % 2),
            "identical embeddings": (torch.ones(8, 5), torch.arange(8) % 2),
            "magnitude 1e30": (torch.randn(8, 5) * 1e30, torch.arange(8) % 2),
            "magnitude 1e-30": (torch.randn(8, 5) * 1e-30, torch.arange(8) % 2),
            "labels (B, 1)": (torch.randn(8, 5), (torch.arange(8) % 2)[:, None]),
            "float labels": (torch.randn(8, 5), (torch.arange(8) % 2).double()),
            "negative labels": (torch.randn(8, 5), (torch.arange(8) % 2) - 5),
            "D=1": (torch.randn(8, 1), torch.arange(8) % 2),
        }
        for tag, (x0, lab) in degenerate.items():

            def deg(e: Any = e, x0: torch.Tensor = x0, lab: torch.Tensor = lab, tag: str = tag) -> Any:
                x = x0.clone().requires_grad_()
                y = _retr_call(e, x, lab)
                y.backward()
                if not finite(y, x.grad):
                    return f"non-finite: loss {y}, grad finite {finite(x.grad)}"
                if tag in ("all singletons (no positives)", "B=1", "B=0") and e.name not in ("triplet",):
                    return float(y) == 0.0 or f"expected 0 without positives, got {float(y)}"
                if tag == "magnitude 1e30" and e.name not in ("triplet", "npairs"):
                    ref = _retr_call(e, x0 / 1e30, lab)
                    return (
                        close(y, ref, 1e-4, 1e-6) or f"scale-invariant loss differs at 1e30: {float(y)} vs {float(ref)}"
                    )
                return True

            probe("D", f"{name}: {tag}", deg)
        for dt in (torch.float16, torch.bfloat16):

            def half(e: Any = e, dt: torch.dtype = dt) -> Any:
                x = torch.randn(12, 6, generator=torch.Generator().manual_seed(3)).to(dt).requires_grad_()
                lab = torch.arange(12) % 4
                y = _retr_call(e, x, lab)
                y.backward()
                ref = _retr_call(e, x.detach().double(), lab)
                if not finite(y, x.grad) or x.grad.dtype != dt:
                    return f"non-finite or grad dtype {x.grad.dtype}"
                return close(y, ref, 5e-2, 5e-3) or f"{dt} {float(y)} vs float64 {float(ref)}"

            probe("D", f"{name}: {dt}", half)

        def nan_emb(e: Any = e) -> Any:
            x = torch.randn(8, 5)
            x[3, 1] = math.nan
            y = _retr_call(e, x, torch.arange(8) % 2)
            return bool(torch.isnan(y)) or f"NaN embedding gave a finite loss {float(y)}"

        probe("D", f"{name}: NaN embedding", nan_emb)
        bad = {
            "labels of another length": lambda e=e: _retr_call(e, torch.randn(8, 5), torch.arange(7)),
            "1-d embeddings": lambda e=e: _retr_call(e, torch.randn(8), torch.arange(8)),
            "integer embeddings": lambda e=e: _retr_call(e, torch.ones(8, 5, dtype=torch.long), torch.arange(8)),
            "labels (B, 2)": lambda e=e: _retr_call(e, torch.randn(8, 5), torch.zeros(8, 2)),
            "labels on meta": lambda e=e: _retr_call(e, torch.randn(8, 5), torch.arange(8, device="meta")),
        }
        for tag, fn in bad.items():
            probe("D", f"{name}: {tag} refused", expect_error(fn))

    rng = np.random.default_rng(1)
    for trial in range(5):

        def ref_case(trial: int = trial) -> Any:
            x = rng.normal(size=(30, 4))
            y = rng.integers(0, 5 + trial, 30)
            got = retrieval_metrics(torch.tensor(x), torch.tensor(y), ks=(1, 2, 4), block_size=7)
            ref = _ref_retrieval(x, y, (1, 2, 4))
            for k, v in ref.items():
                if abs(got[k] - v) > 1e-9:
                    return f"{k}: {got[k]} vs reference {v}"
            return True

        probe("D", f"retrieval_metrics vs definition, trial {trial}", ref_case)
    rm_cases: dict[str, Callable[[], Any]] = {
        "one class": lambda: (
            finite(torch.tensor(list(retrieval_metrics(torch.randn(6, 3), torch.zeros(6)).values()))) or "non-finite"
        ),
        "all singletons: nan metrics, 0 queries": lambda: (
            lambda m: (m["num_queries"] == 0 and math.isnan(m["map@r"])) or str(m)
        )(retrieval_metrics(torch.randn(6, 3), torch.arange(6))),
        "B=1": lambda: (lambda m: m["num_queries"] == 0 or str(m))(
            retrieval_metrics(torch.randn(1, 3), torch.zeros(1))
        ),
        "B=0": lambda: (lambda m: m["num_queries"] == 0 or str(m))(
            retrieval_metrics(torch.randn(0, 3), torch.zeros(0))
        ),
        "k > B - 1": lambda: (lambda m: m["recall@8"] == 1.0 or str(m))(
            retrieval_metrics(torch.randn(4, 3), torch.tensor([0, 0, 1, 1]), ks=(8,))
        ),
        "cosine with zero vectors": lambda: (
            finite(
                torch.tensor(
                    list(retrieval_metrics(torch.zeros(6, 3), torch.arange(6) % 2, distance="cosine").values())
                )
            )
            or "non-finite"
        ),
        "float16": lambda: (lambda a, b: abs(a["map@r"] - b["map@r"]) < 1e-6 or f"{a} {b}")(
            retrieval_metrics(torch.eye(6, dtype=torch.float16), torch.arange(6) % 2),
            retrieval_metrics(torch.eye(6), torch.arange(6) % 2),
        ),
        "NaN embedding": lambda: (lambda m: any(math.isnan(v) for v in m.values()) or f"finite metrics {m}")(
            retrieval_metrics(torch.tensor([[0.0], [math.nan], [1.0], [1.1]]), torch.tensor([0, 0, 1, 1]))
        ),
        "magnitude 1e20 float32 equals magnitude 1": lambda: (lambda a, b: a == b or f"{a} vs {b}")(
            retrieval_metrics(
                torch.randn(20, 3, generator=torch.Generator().manual_seed(5)) * 1e20, torch.arange(20) % 4
            ),
            retrieval_metrics(torch.randn(20, 3, generator=torch.Generator().manual_seed(5)), torch.arange(20) % 4),
        ),
        "magnitude 1e-20 float32 equals magnitude 1": lambda: (lambda a, b: a == b or f"{a} vs {b}")(
            retrieval_metrics(
                torch.randn(20, 3, generator=torch.Generator().manual_seed(5)) * 1e-20, torch.arange(20) % 4
            ),
            retrieval_metrics(torch.randn(20, 3, generator=torch.Generator().manual_seed(5)), torch.arange(20) % 4),
        ),
        "cosine magnitude 1e-30 equals magnitude 1": lambda: (lambda a, b: a == b or f"{a} vs {b}")(
            retrieval_metrics(
                torch.randn(20, 3, generator=torch.Generator().manual_seed(5)) * 1e-30,
                torch.arange(20) % 4,
                distance="cosine",
            ),
            retrieval_metrics(
                torch.randn(20, 3, generator=torch.Generator().manual_seed(5)), torch.arange(20) % 4, distance="cosine"
            ),
        ),
    }
    for tag, fn in rm_cases.items():
        probe("D", f"retrieval_metrics: {tag}", fn)
    for tag, kw in {
        "ks=(0,)": {"ks": (0,)},
        "ks=(-1,)": {"ks": (-1,)},
        "ks=()": {"ks": ()},
        "block_size=0": {"block_size": 0},
        "block_size=-3": {"block_size": -3},
        "distance=bogus": {"distance": "bogus"},
        "ks=(1.5,)": {"ks": (1.5,)},
    }.items():
        probe(
            "D",
            f"retrieval_metrics: {tag} refused",
            expect_error(lambda kw=kw: retrieval_metrics(torch.randn(6, 3), torch.arange(6) % 2, **kw)),
        )
    probe(
        "D",
        "retrieval_metrics: labels of another length refused",
        expect_error(lambda: retrieval_metrics(torch.randn(6, 3), torch.arange(5))),
    )


# ------------------------------------------------------------------------------------------ E. nifti cache
def section_e() -> None:
    try:
        import nibabel as nib
    except ImportError:
        return
    from rankwise.data import load_nifti_csv

    for scale, norm in ((1e6, "none"), (1e-30, "none"), (1e30, "brain_zscore"), (1e-30, "brain_zscore"), (3e3, "none")):

        def f(scale: float = scale, norm: str = norm) -> Any:
            rng = np.random.default_rng(0)
            with tempfile.TemporaryDirectory() as d:
                root = Path(d)
                vols = []
                lines = ["path,age,split"]
                for i in range(4):
                    v = np.zeros((10, 12, 10), np.float32)
                    v[2:-2, 2:-2, 2:-2] = scale * rng.uniform(1, 2, (6, 8, 6))
                    vols.append(v)
                    nib.save(nib.Nifti1Image(v, np.eye(4)), str(root / f"v{i}.nii"))
                    lines.append(f"v{i}.nii,{30 + i},{'train' if i < 2 else 'test'}")
                (root / "c.csv").write_text("\n".join(lines) + "\n")
                data = load_nifti_csv(str(root / "c.csv"), cache_dir=str(root / "k"), normalize=norm)
                x = data.train[0][0]["volume"][0]
                ref = torch.from_numpy(vols[0]).double()
                if norm == "brain_zscore":
                    m = ref > 0
                    ref[m] = (ref[m] - ref[m].mean()) / ref[m].std(unbiased=False)
                if not finite(x):
                    return "non-finite voxels in the cached volume"
                return close(x, ref, 2e-3, 2e-3 * float(ref.abs().max())) or "cached volume differs from the input"

        probe("E", f"nifti cache: scale {scale:g}, normalize={norm}", f)


# ----------------------------------------------------------------------------------------- F. torch.compile
def section_f() -> None:
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = 64
    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "neural_sort": lambda x: rankwise.neural_sort(x, tau=0.5),
        "soft_rank.sinkhorn": lambda x: rankwise.soft_rank(x, method="sinkhorn"),
        "soft_rank.neuralsort": lambda x: rankwise.soft_rank(x, method="neuralsort"),
        "listnet_loss": lambda x: rankwise.losses.listnet_loss(x, (x.detach() > 0).to(x.dtype)),
        "ndcg": lambda x: ndcg(x, torch.arange(x.shape[-1], dtype=x.dtype).expand_as(x) % 3),
        "smooth_ap_loss": lambda x: rankwise.losses.smooth_ap_loss(x, torch.arange(x.shape[0]) % 2),
    }
    inputs = {
        "randn": torch.randn(4, 6, generator=torch.Generator().manual_seed(0)),
        "NaN": torch.tensor([[0.1, math.nan, 0.3, 0.2]] * 4),
        "inf": torch.tensor([[0.1, math.inf, 0.3, -math.inf]] * 4),
        "all ties": torch.full((4, 5), 0.7),
        "n=1": torch.randn(4, 1),
        "huge 1e30": torch.randn(4, 6, generator=torch.Generator().manual_seed(1)) * 1e30,
    }
    for fname, fn in fns.items():
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=False)
        for iname, x in inputs.items():

            def f(fn: Any = fn, compiled: Any = compiled, x: torch.Tensor = x) -> Any:
                try:
                    ref = fn(x.clone())
                    eager_err = None
                except (ValueError, TypeError) as e:
                    ref, eager_err = None, e
                try:
                    got = compiled(x.clone())
                except (ValueError, TypeError) as e:
                    if eager_err is not None:
                        raise
                    return f"compiled raised {e!r}, eager returned a value"
                except Exception as e:
                    if eager_err is not None:
                        raise ValueError(f"`eager` raised {eager_err!r}; compiled raised {type(e).__name__}") from None
                    raise
                if eager_err is not None:
                    return f"eager raised {eager_err!r}, compiled returned {got}"
                return close(got, ref, 1e-4, 1e-6) or f"compiled {got} vs eager {ref}"

            probe("F", f"compile {fname}: {iname}", f, seconds=240)


# ------------------------------------------------------------- G. torch.compile of every op and loss
#: entries that do not compile with fullgraph=True (tests/test_compile.py's list): probed eagerly only by H
NOT_COMPILABLE = {"sodeep_rank", "stochastic_neural_sort", "stochastic_neural_sort.hard"}
MATCH = [""]


def _outputs(fn: Callable[..., Any], entry: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """Floating outputs of ``fn`` and the gradients of their weighted sum on the inputs that need one."""
    args = tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args)
    if entry.stochastic:
        torch.manual_seed(1234)
    out = fn(*args, **kwargs)
    flat: list[torch.Tensor] = []
    stack = [out]
    while stack:
        o = stack.pop(0)
        if isinstance(o, torch.Tensor):
            flat.append(o)
        elif isinstance(o, (tuple, list)):
            stack = list(o) + stack
        elif isinstance(o, dict):
            stack = list(o.values()) + stack
    outs = [t for t in flat if t.is_floating_point()]
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    total = sum(
        (torch.nan_to_num(t) * torch.linspace(0.5, 1.5, t.numel(), dtype=t.dtype, device=t.device).reshape(t.shape))
        .sum()
        .mul(i + 1)
        for i, t in enumerate(outs)
        if t.requires_grad and t.numel()
    )
    grads: list[torch.Tensor] = []
    if inputs and isinstance(total, torch.Tensor):
        grads = [g if g is not None else torch.zeros(0) for g in torch.autograd.grad(total, inputs, allow_unused=True)]
    return [t.detach() for t in outs] + grads


def _hostile_inputs(entry: Any, dtype: torch.dtype) -> dict[str, tuple[tuple[Any, ...], dict[str, Any]]]:
    """Named inputs of one entry: its example, the example at other batch sizes, NaN / inf rows, values of
    magnitude 1e30, and its degenerate examples (empty, n=1, all ties, no positives, ...)."""
    f = factories(entry)
    ex = f.example(dtype, DEVICE)
    x0 = ex.args[0]
    out: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {"example": (tuple(ex.args), dict(ex.kwargs))}
    if isinstance(x0, torch.Tensor) and x0.dim() >= 1 and x0.is_floating_point():
        b = x0.shape[0]
        for nb in (b + 3, b + 7, max(b - 1, 2)):  # the same compiled function over changing batch sizes
            g = torch.Generator(device=DEVICE).manual_seed(nb)
            x = torch.randn((nb, *x0.shape[1:]), generator=g, dtype=dtype, device=DEVICE)
            if x0.min() >= 0:
                x = x.abs()
            rest = []
            for a in ex.args[1:]:
                if isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == b:
                    a = a[torch.arange(nb, device=a.device) % b]
                rest.append(a)
            out[f"batch {nb} (example's {b})"] = ((x.requires_grad_(x0.requires_grad), *rest), dict(ex.kwargs))
        for tag, value in (("NaN", math.nan), ("+inf", math.inf), ("-inf", -math.inf), ("1e30 scale", None)):
            x = x0.detach().clone()
            if value is None:
                x = x * 1e30
            else:
                x[0] = value
            out[f"{tag} {'values' if value is None else 'in the first row'}"] = (
                (x.requires_grad_(x0.requires_grad), *ex.args[1:]),
                dict(ex.kwargs),
            )
        ties = torch.full_like(x0.detach(), 0.5).requires_grad_(x0.requires_grad)
        out["all ties"] = ((ties, *ex.args[1:]), dict(ex.kwargs))
    for i, d in enumerate(f.degenerate(dtype, DEVICE) if f.degenerate is not None else []):
        shapes = ",".join(str(tuple(a.shape)) for a in d.args if isinstance(a, torch.Tensor))
        out[f"degenerate {i} {shapes}"] = (tuple(d.args), dict(d.kwargs))
    return out


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape
        and x.dtype == y.dtype
        and bool(torch.equal(torch.isnan(x), torch.isnan(y)))
        and close(x.cpu(), y.cpu(), 1e-4, 1e-5)
        for x, y in zip(a, b)
    )


def section_g() -> None:
    """``torch.compile(fn, fullgraph=True, dynamic=True)`` of every registered op and loss against eager,
    on hostile inputs: same values and gradients (NaN where eager has NaN), same errors."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = 64
    from rankwise.ops import list_ops

    list_ops()
    entries = registry_cases()
    for kind, e in entries:
        if MATCH[0] not in e.name or factories(e).example is None or e.name in NOT_COMPILABLE:
            continue
        torch._dynamo.reset()
        compiled = torch.compile(e.fn, fullgraph=True, backend="aot_eager", dynamic=True)
        for tag, (args, kwargs) in _hostile_inputs(e, torch.float32).items():

            def f(
                e: Any = e, args: tuple[Any, ...] = args, kwargs: dict[str, Any] = kwargs, compiled: Any = compiled
            ) -> Any:
                try:
                    want = _outputs(e.fn, e, args, kwargs)
                    eager_err: Exception | None = None
                except (ValueError, TypeError) as err:
                    want, eager_err = [], err
                try:
                    got = _outputs(compiled, e, args, kwargs)
                except Exception as err:
                    if eager_err is None:  # the compiled function fails where eager works: a crash, not a value
                        raise RuntimeError(
                            f"compiled raised {type(err).__name__}: {str(err)[:160]}; eager returned a value"
                        ) from None
                    if type(err) is not type(eager_err) or str(eager_err)[:60] not in str(err):
                        return f"eager raised {eager_err!r}; compiled raised {type(err).__name__}: {str(err)[:120]}"
                    raise  # the same error: clear if it names an argument
                if eager_err is not None:
                    return f"eager raised {eager_err!r}; compiled returned a value"
                if not _same(got, want):
                    diff = [
                        f"{tuple(g.shape)} {g.flatten()[:3].tolist()} vs {tuple(w.shape)} {w.flatten()[:3].tolist()}"
                        for g, w in zip(got, want)
                        if not (g.shape == w.shape and close(g.cpu(), w.cpu(), 1e-4, 1e-5))
                    ]
                    return f"compiled differs from eager: {diff[:2] or (len(got), len(want))}"
                return True

            probe("G", f"compile {kind} {e.name}: {tag}", f, seconds=300)


# ------------------------------------------------------- H. ranking-metric losses on degenerate lists
def section_h() -> None:
    """Learning-to-rank losses on all-padding lists, lists of one, all-equal relevance, NaN and -inf
    scores and huge lists; retrieval losses without positives, of one class, with duplicated and zero
    embeddings (on ``--device``)."""
    dev = DEVICE

    def ltr(e: Any, p: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        p = p.to(dev).requires_grad_()
        kw = dict(factories(e).example(torch.float32, dev).kwargs)
        if "generator" in kw or e.stochastic:
            kw["generator"] = torch.Generator(device=dev).manual_seed(3)
        y = e.fn(p, t.to(dev), **kw)
        (g,) = torch.autograd.grad(y, p, allow_unused=True) if y.requires_grad else (None,)
        return y.detach(), g

    pairwise = {"ranknet", "lambda_loss.rankNet"}  # losses over pairs of different labels only
    for e in LTR:
        if MATCH[0] not in e.name:
            continue
        gen = torch.Generator().manual_seed(0)
        cases: dict[str, Callable[[], Any]] = {}

        def all_padding(e: Any = e, gen: torch.Generator = gen) -> Any:
            y, g = ltr(e, torch.randn(4, 6, generator=gen), torch.full((4, 6), -1.0))
            return (float(y) == 0.0 and (g is None or float(g.abs().max()) == 0.0)) or f"loss {float(y)} grad {g}"

        def one_per_list(e: Any = e, gen: torch.Generator = gen) -> Any:
            y, g = ltr(e, torch.randn(4, 1, generator=gen), torch.tensor([[2.0], [0.0], [1.0], [4.0]]))
            return finite(y, g) or f"non-finite loss {float(y)} on lists of one"

        def equal_relevance(e: Any = e, gen: torch.Generator = gen) -> Any:
            y, g = ltr(e, torch.randn(4, 6, generator=gen), torch.full((4, 6), 2.0))
            if not finite(y, g):
                return f"non-finite loss {float(y)} with all-equal relevance"
            if e.name in pairwise:  # no pair of different relevance: nothing to learn
                no_grad = g is None or float(g.abs().max()) == 0.0
                return (float(y) == 0.0 and no_grad) or f"loss {float(y)} without pairs"
            return True

        def nan_scores(e: Any = e, gen: torch.Generator = gen) -> Any:
            p = torch.randn(4, 6, generator=gen)
            p[1] = math.nan
            y, _ = ltr(e, p, torch.randint(0, 3, (4, 6), generator=gen).float())
            return bool(torch.isnan(y)) or f"a NaN list of scores gave the finite loss {float(y)}"

        def neg_inf_score(e: Any = e, gen: torch.Generator = gen) -> Any:
            p = torch.randn(4, 6, generator=gen)
            p[2, 1] = -math.inf
            y, _ = ltr(e, p, torch.randint(0, 3, (4, 6), generator=gen).float())
            return bool(torch.isnan(y)) or f"a -inf score in a real slot gave the finite loss {float(y)} (policy: NaN)"

        def huge(e: Any = e, gen: torch.Generator = gen) -> Any:
            n = 1000
            p = torch.randn(2, n, generator=gen)
            t = torch.randint(0, 5, (2, n), generator=gen).float()
            t[1, n // 2 :] = -1.0
            y, g = ltr(e, p, t)
            if not finite(y, g):
                return f"non-finite loss {float(y)} on lists of {n}"
            if e.stochastic or e.name == "pirank.diffsort":
                return True
            idx = torch.randperm(n, generator=gen)
            y2, _ = ltr(e, p[:, idx], t[:, idx])
            return close(y, y2, 1e-4, 1e-6) or f"lists of {n}: reordering the items changes {float(y)} -> {float(y2)}"

        cases = {
            "all-padding lists": all_padding,
            "lists of one": one_per_list,
            "all-equal relevance": equal_relevance,
            "NaN scores of a whole list": nan_scores,
            "-inf score in a real slot": neg_inf_score,
            "huge lists (1000 items)": huge,
        }
        for tag, fn in cases.items():
            probe("H", f"{e.name}: {tag}", fn, seconds=120)

    def retr(e: Any, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = x.to(dev).requires_grad_()
        kw = dict(factories(e).example(torch.float32, dev).kwargs)
        if e.stochastic:
            torch.manual_seed(0)
        y = e.fn(x, labels.to(dev), **kw)
        (g,) = torch.autograd.grad(y, x, allow_unused=True) if y.requires_grad else (None,)
        return y.detach(), g

    for e in RETR:
        if MATCH[0] not in e.name:
            continue
        gen = torch.Generator().manual_seed(1)
        shape = tuple(factories(e).example(torch.float32, torch.device("cpu")).args[0].shape[1:])
        if len(shape) == 2:  # (views, dim): one view, so that distinct labels leave no positive pair
            shape = (1, shape[1])

        def emb(b: int, gen: torch.Generator = gen, shape: tuple[int, ...] = shape) -> torch.Tensor:
            return torch.randn((b, *shape), generator=gen)

        def no_positives(e: Any = e, emb: Any = emb) -> Any:
            y, g = retr(e, emb(8), torch.arange(8))
            if not finite(y, g):
                return f"non-finite loss {float(y)} without positives"
            if e.name == "triplet":  # no triplet: documented 0 as well
                return float(y) == 0.0 or f"loss {float(y)} without positives"
            return (float(y) == 0.0 and (g is None or float(g.abs().max()) == 0.0)) or f"loss {float(y)}, grad {g}"

        def one_class(e: Any = e, emb: Any = emb) -> Any:
            y, g = retr(e, emb(8), torch.zeros(8, dtype=torch.long))
            return finite(y, g) or f"non-finite loss {float(y)} with one class"

        def duplicated(e: Any = e, emb: Any = emb) -> Any:
            x = emb(6)
            x = torch.cat([x, x])  # every embedding twice: ties between a positive and a negative
            lab = torch.cat([torch.arange(6) % 3, (torch.arange(6) + 1) % 3])
            y, g = retr(e, x, lab)
            if not finite(y, g):
                return f"non-finite loss {float(y)} with duplicated embeddings"
            if e.stochastic:
                return True
            idx = torch.randperm(12, generator=torch.Generator().manual_seed(4))
            y2, _ = retr(e, x[idx], lab[idx])
            return close(y, y2, 1e-4, 1e-6) or f"duplicated embeddings: order changes {float(y)} -> {float(y2)}"

        def zero_rows(e: Any = e, emb: Any = emb) -> Any:
            x = emb(8)
            x[2] = 0.0
            x[5] = 0.0
            y, g = retr(e, x, torch.arange(8) % 2)
            return finite(y, g) or f"non-finite loss {float(y)} or gradient with two zero embeddings"

        def all_zero(e: Any = e, emb: Any = emb) -> Any:
            y, g = retr(e, emb(8) * 0.0, torch.arange(8) % 2)
            return finite(y, g) or f"non-finite loss {float(y)} or gradient with all-zero embeddings"

        retrieval_cases: dict[str, Callable[[], Any]] = {
            "no positives (all labels distinct)": no_positives,
            "one class": one_class,
            "duplicated embeddings, different labels": duplicated,
            "two zero embeddings": zero_rows,
            "all-zero embeddings": all_zero,
        }
        if e.name == "npairs":  # (anchor, positive) pairs: every anchor has its positive by construction
            del retrieval_cases["no positives (all labels distinct)"]
        for tag, fn in retrieval_cases.items():
            probe("H", f"{e.name}: {tag}", fn, seconds=120)


def main() -> None:
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "benchmarks/results/probe_library.json"))
    ap.add_argument("--only", default=None, help="sections, e.g. A,B,G (default: all; with a CUDA device: G,H)")
    ap.add_argument("--match", default="", help="G, H: only the entries whose name contains this")
    ap.add_argument(
        "--device", default="cpu", help="device of the families G and H (cpu, cuda, cuda:1); A-F run on the CPU"
    )
    args = ap.parse_args()
    try:
        DEVICE = torch.device(args.device)
    except RuntimeError:
        fail(f"--device {args.device!r} is not a torch device (cpu, cuda, cuda:1, ...)")
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        fail(f"--device {args.device}: CUDA is not available here (torch.cuda.is_available() is False)")
    if DEVICE.type == "cuda" and DEVICE.index is not None and DEVICE.index >= torch.cuda.device_count():
        fail(f"--device {args.device}: there are {torch.cuda.device_count()} CUDA device(s)")
    if DEVICE.type not in ("cpu", "cuda"):
        fail(f"--device {args.device}: the probe runs on cpu or cuda")
    only = args.only or ("A,B,C,D,E,F,G,H" if DEVICE.type == "cpu" else "G,H")
    if DEVICE.type != "cpu" and set(only.split(",")) - {"G", "H"}:
        fail(f"--only {only}: with --device {args.device} only the sections G and H run there")
    MATCH[0] = args.match
    t0 = time.time()
    sections = {
        "A": section_a,
        "B": section_b,
        "C": section_c,
        "D": section_d,
        "E": section_e,
        "F": section_f,
        "G": section_g,
        "H": section_h,
    }
    unknown = set(only.split(",")) - set(sections)
    if unknown:
        fail(f"--only: unknown section(s) {sorted(unknown)}; choose from {','.join(sections)}")
    for s in only.split(","):
        before = len(CASES)
        sections[s]()
        sub = collections.Counter(c["outcome"] for c in CASES[before:])
        print(f"section {s}: {dict(sub)}", flush=True)
    summary = {
        "cases": len(CASES),
        "counts": dict(COUNTS),
        "seconds": round(time.time() - t0),
        "sections": only,
        "device": str(DEVICE),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
    }
    print(json.dumps(summary))
    for c in CASES:
        if c["outcome"] in ("crash", "silent"):
            print(f"{c['outcome']}: [{c['section']}] {c['case']}: {c['detail']}")
    Path(args.out).write_text(json.dumps({"summary": summary, "cases": CASES}, indent=1))


if __name__ == "__main__":
    main()
