"""GPU benchmark: forward+backward time and peak memory of every relaxation and loss, beside the references.

Usage (repository root, a CUDA device)::

    python benchmarks/gpu.py --out benchmarks/results/gpu.json           # every shape, eager and compiled
    python benchmarks/gpu.py --quick --out $OUT/gpu.json                   # isotonic vs torchsort + public losses
    python benchmarks/gpu.py --dry-run --out /tmp/gpu_dry.json             # tiny shapes on CPU (no GPU)
    python benchmarks/gpu.py --markdown benchmarks/results/gpu.json        # the docs table of a result

Sections (each written to the JSON as soon as it is done, so a run cut short keeps what it has):

* ``ops``: every registered operator (``rankwise.ops.OPS``) on float32 ``(rows, n)`` inputs at
  (1, 1e3 ... 1e6), (256, 256), (32, 4096) (O(n^2)-memory operators only up to ``--max-quadratic-n``);
  ``loss = (f(x) * w).sum()`` with a fixed random ``w`` over every floating output, then backward.
  Beside them, from ``benchmarks/ops.py``: ``torchsort.soft_rank`` (its CUDA kernel; when the
  package is importable), the authors' ``diffsort`` package, NeuralSort's and SoftSort's reference
  formulas.
* ``crossover``: the isotonic soft rank's two CUDA paths at 256 rows of n = 4 ... 1024: the Triton
  PAV kernel and the O(n^2) min-max formulation (``rankwise.ops.isotonic._TRITON_MIN_N``), with the
  smallest n from which Triton is at least as fast (the constant to set).
* ``losses``: every registered loss (``rankwise.losses.LOSSES``) at batch 256 ... 8192 (the
  example inputs of its registry entry, batch dimension scaled, feature width 128), and the
  re-implementations of the public SupCon / RankSim / Rank-N-Contrast code of
  ``benchmarks/losses.py`` beside ``supcon_loss`` / ``ranksim_loss`` / ``rnc_loss``.
* ``compiled``: ``torch.compile`` of a selection (``--quick``) or of every case above at one shape:
  time after compilation, compilation time, and whether the values equal eager.

``--quick`` keeps the summary's cases: the isotonic operators and torchsort at (256, 256),
(32, 4096), (1, 1e3 ... 1e6), the losses with a public reference at batch 256, 1024, 4096, the
crossover and a few compiled cases. TF32 matmuls are off (PyTorch's default) for rankwise and the
references alike (``allow_tf32`` in the JSON's environment).

Timing: CUDA events around each forward+backward call, after a warm-up call, median (and
quartiles) of up to ``--repeats`` calls or ``--case-seconds`` of them; peak memory:
``torch.cuda.max_memory_allocated`` during one call minus the memory allocated before it, in MiB.
A case that runs out of memory or fails is recorded with its error and the run goes on; cases
left when ``--budget-s`` is spent are recorded as skipped. ``--dry-run`` runs every code path on
CPU at tiny shapes (wall-clock timing, no memory figures) to check the script without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the example inputs of tests/
from tests.registry_examples import case_entry, entry_factories, factories, registry_cases

import ops as ops_bench  # benchmarks/ops.py: torchsort, the diffsort package, reference formulas
import rankwise
from _tables import load_range, provenance, ratio, read
from _tables import ms as _ms
from losses import ranksim_reference, rnc_reference, supcon_reference  # benchmarks/losses.py
from rankwise.losses import ranksim_loss, rnc_loss, supcon_loss
from rankwise.ops import isotonic as iso
from rankwise.sodeep.hub import available_sorters

#: operators that stay O(n log n) in time and O(n) in memory per row (timed at every n)
LINEAR_OPS = (
    "rank",
    "blackbox_rank",
    "soft_rank_isotonic",
    "soft_rank_isotonic.kl",
    "soft_sort_isotonic",
    "soft_sort_isotonic.kl",
    "perturbed_rank",
    "perturbed_rank.normal",
    "soft_rank.perturbed",
    "perturbed_topk",
    "perturbed_fy_loss",
)
#: cases compiled in --quick mode: (section, name, shape)
QUICK_COMPILED = (
    ("ops", "soft_rank_isotonic", (256, 256)),
    ("losses", "supcon", 1024),
    ("ops", "neural_sort", (256, 256)),
    ("losses", "ranksim", 1024),
    ("losses", "spearman", 1024),
    ("losses", "rnc", 1024),
)
#: --quick: only these operators (the isotonic ones and their torchsort references) and the losses
#: that have a public reference, so that every shape and batch of the summary fits the budget
QUICK_OPS = ("soft_rank_isotonic", "soft_rank_isotonic.kl", "soft_sort_isotonic", "soft_sort_isotonic.kl")
QUICK_LOSSES = ("supcon", "ranksim", "rnc")
#: share of the remaining time budget each section may use (the compiled cases take what is left)
SECTION_SHARES = {"ops": 0.4, "crossover": 0.15, "losses": 0.5}
#: registry kwargs that only make the examples small (dropped for the benchmark)
_TEST_ONLY_KWARGS = ("chunk_size", "dim")


# ----------------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------------
class Runner:
    """Times cases within a global deadline and keeps the results."""

    def __init__(self, device: torch.device, args: argparse.Namespace) -> None:
        self.device = device
        self.args = args
        self.deadline = time.perf_counter() + args.budget_s
        self.cuda = device.type == "cuda"

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _once_ms(self, step: Callable[[], Any]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
        t0 = time.perf_counter()
        step()
        return (time.perf_counter() - t0) * 1e3

    def measure(self, step: Callable[[], Any]) -> dict[str, Any]:
        """Warm-up call (its time is ``first_call_ms``: compilation included), one call for the peak
        memory, then timed calls. Errors and out-of-memory are returned, never raised."""
        if self.left() <= 0:
            return {"skipped": "time budget spent"}
        res: dict[str, Any] = {}
        try:
            self._sync()
            t0 = time.perf_counter()
            step()
            self._sync()
            res["first_call_ms"] = (time.perf_counter() - t0) * 1e3
            if self.cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
                base = torch.cuda.memory_allocated(self.device)
                step()
                self._sync()
                res["peak_mib"] = (torch.cuda.max_memory_allocated(self.device) - base) / 2**20
            times: list[float] = []
            spent = 0.0
            while len(times) < self.args.repeats and (len(times) < 3 or spent < self.args.case_seconds * 1e3):
                if self.left() <= 0 and len(times) >= 1:
                    break
                times.append(self._once_ms(step))
                spent += times[-1]
                if times[0] > 10 * self.args.case_seconds * 1e3:
                    break  # a slow case: a single timed call
            q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
            res.update(median_ms=statistics.median(times), q1_ms=q[0], q3_ms=q[2], repeats=len(times))
        except torch.cuda.OutOfMemoryError:
            res = {"error": "out of memory"}
        except Exception as exc:  # recorded, the run goes on
            res = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        finally:
            with contextlib.suppress(Exception):
                if self.cuda:
                    torch.cuda.empty_cache()
        return res


def _floats(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _floats(o)]
    return []


def _fwd_bwd(fn: Callable[[], Any], leaves: list[torch.Tensor]) -> Callable[[], Any]:
    """``(f() * w).sum().backward()`` over every floating output, ``w`` fixed on the first call."""
    weights: list[torch.Tensor] = []

    def step() -> None:
        for t in leaves:
            t.grad = None
        outs = _floats(fn())
        if not weights:
            g = torch.Generator().manual_seed(1)
            weights.extend(torch.randn(o.shape, generator=g).to(o.device, o.dtype) for o in outs)
        total = sum((o * w).sum() for o, w in zip(outs, weights))
        if isinstance(total, torch.Tensor) and total.requires_grad:
            total.backward()

    return step


def _to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_to(o, device) for o in obj)
    if isinstance(obj, list):
        return [_to(o, device) for o in obj]
    return obj


# ----------------------------------------------------------------------------------------------
# inputs from the registries
# ----------------------------------------------------------------------------------------------
def op_inputs(name: str, rows: int, n: int, device: torch.device) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """``(args, kwargs)`` for operator ``name`` on ``(rows, n)``: its example's options, every tensor of
    the example's first tensor's shape replaced by a random ``(rows, n)`` one; ``None`` when the
    example has tensors of other shapes (the operator is timed at its example only)."""
    ex = factories("op", name).example(torch.float32, torch.device("cpu"))
    shape0 = ex.args[0].shape
    if any(isinstance(a, torch.Tensor) and a.shape != shape0 for a in ex.args):
        return None
    g = torch.Generator().manual_seed(rows * 7919 + n)
    args = tuple(
        _like(a, (rows, n), g).to(device).requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
        for a in ex.args
    )
    kwargs = {k: _to(v, device) for k, v in ex.kwargs.items() if k not in _TEST_ONLY_KWARGS}
    return args, kwargs


def _like(a: torch.Tensor, shape: Any, g: torch.Generator) -> torch.Tensor:
    """Random values of ``shape`` like the example tensor ``a``: integer labels in
    ``[0, min(100, shape[0] // 4))``, positive floats where ``a`` is positive, else standard normal."""
    if not a.is_floating_point():
        return torch.randint(0, max(2, min(100, shape[0] // 4)), shape, generator=g).to(a.dtype)
    if a.numel() and bool((a > 0).all()):
        return torch.rand(shape, generator=g) + 0.1
    return torch.randn(shape, generator=g)


def loss_inputs(name: str, batch: int, device: torch.device) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` for loss ``name`` at ``batch``: the example's tensors with their batch dim
    scaled (features 128 wide; integer labels in ``[0, min(100, batch // 4))``; non-negative floats
    stay non-negative), the example's options."""
    ex = factories("loss", name).example(torch.float32, torch.device("cpu"))
    b0 = ex.args[0].shape[0] if ex.args[0].dim() else 1
    g = torch.Generator().manual_seed(batch)
    args: list[Any] = []
    for i, a in enumerate(ex.args):
        if not isinstance(a, torch.Tensor) or a.dim() == 0 or a.shape[0] != b0:
            args.append(_to(a, device))
            continue
        shape = [batch, *a.shape[1:]]
        paired = any(isinstance(b, torch.Tensor) and b is not a and b.shape == a.shape for b in ex.args)
        if i == 0 and a.is_floating_point() and a.dim() >= 2 and a.shape[-1] >= 4 and not paired:
            shape[-1] = 128  # features
        args.append(_like(a, tuple(shape), g).to(device).requires_grad_(a.requires_grad))
    kwargs = {k: _to(v, device) for k, v in ex.kwargs.items() if k not in _TEST_ONLY_KWARGS}
    return tuple(args), kwargs


def _leaves(args: tuple[Any, ...]) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


# ----------------------------------------------------------------------------------------------
# sections
# ----------------------------------------------------------------------------------------------
def _shape_key(shape: tuple[int, int]) -> str:
    return f"{shape[0]}x{shape[1]}"


def section_ops(r: Runner, shapes: list[tuple[int, int]], out: dict[str, Any]) -> None:
    a = r.args
    for shape in shapes:
        rows, n = shape
        res: dict[str, Any] = out.setdefault(_shape_key(shape), {})
        big = n > a.max_quadratic_n
        for _, entry in registry_cases("op"):  # the entries and their test variants (name + options)
            if a.quick and entry.name not in QUICK_OPS:
                continue
            if big and entry.name not in LINEAR_OPS:
                res[entry.name] = {"skipped": f"O(n^2) memory or time beyond n = {a.max_quadratic_n}"}
                continue
            if entry.name == "sodeep_rank" and ("gru", n) not in available_sorters():
                # a learned sorter exists per sequence length: none bundled for this n
                res[entry.name] = {"skipped": f"no bundled SoDeep sorter for n = {n}"}
                continue
            if n > 1024 and entry.name not in LINEAR_OPS:
                probe = _probe_seconds(r, entry, rows, n // 4)
                if probe is not None and probe * 16 > a.max_case_s:
                    res[entry.name] = {"skipped": f"predicted {probe * 16:.1f} s per call from a {rows}x{n // 4} probe"}
                    continue
            inp = op_inputs(entry.name, rows, n, r.device)
            if inp is None:
                if shape != shapes[0]:
                    continue
                ex = entry_factories(entry).example(torch.float32, r.device)
                inp = (ex.args, ex.kwargs)
                res.setdefault("_example_shape", []).append(entry.name)
            args, kwargs = inp
            if entry.stochastic:
                torch.manual_seed(0)
            res[entry.name] = r.measure(_fwd_bwd(lambda f=entry.fn, a_=args, k=kwargs: f(*a_, **k), _leaves(args)))
            _print(f"ops {_shape_key(shape)}", entry.name, res[entry.name])
        # references: torchsort, the diffsort package, NeuralSort / SoftSort formulas (benchmarks/ops.py)
        refs = ops_bench.make_cases(shape, r.device)
        for key, case in refs.items():
            if case.reference_of is None or (a.quick and not key.startswith("torchsort")):
                continue
            if case.mem_bytes > a.mem_budget_gb * 2**30 or (big and not key.startswith("torchsort")):
                res[f"ref:{key}"] = {"skipped": f"estimated memory {case.mem_bytes / 2**30:.1f} GiB or O(n^2)"}
                continue
            x = torch.randn(rows, n, generator=torch.Generator().manual_seed(n)).to(r.device).requires_grad_()
            res[f"ref:{key}"] = r.measure(_fwd_bwd(lambda f=case.fn, x=x: f(x), [x]))
            res[f"ref:{key}"]["reference_of"] = case.reference_of
            _print(f"ops {_shape_key(shape)}", f"ref:{key}", res[f"ref:{key}"])
        if ops_bench._torchsort() is None:
            res["ref:torchsort"] = {"skipped": "torchsort is not importable"}


def section_crossover(r: Runner, ns: list[int], rows: int, out: dict[str, Any]) -> None:
    old = iso._TRITON_MIN_N
    try:
        for n in ns:
            res = out.setdefault(f"{rows}x{n}", {})
            x = torch.randn(rows, n, generator=torch.Generator().manual_seed(n)).to(r.device).requires_grad_()
            for reg in ("l2", "kl"):
                for path, min_n in (("triton", 1), ("minmax", 10**9)):
                    iso._TRITON_MIN_N = min_n
                    fn = lambda x=x, reg=reg: rankwise.soft_rank_isotonic(x, regularization=reg)  # noqa: E731
                    res[f"{reg}:{path}"] = r.measure(_fwd_bwd(fn, [x]))
                    _print(f"crossover {rows}x{n}", f"{reg}:{path}", res[f"{reg}:{path}"])
    finally:
        iso._TRITON_MIN_N = old
    suggestion = None
    for n in ns:
        res = out.get(f"{rows}x{n}", {})
        try:
            if all(res[f"{g}:triton"]["median_ms"] <= res[f"{g}:minmax"]["median_ms"] for g in ("l2", "kl")):
                suggestion = n
                break
        except KeyError:
            continue
    out["suggested_TRITON_MIN_N"] = suggestion


def _probe_seconds(r: Runner, entry: Any, rows: int, n: int) -> float | None:
    """Seconds of one forward+backward call (after a warm-up) of ``entry`` on ``(rows, n)``; ``None``
    when it fails (the real case then records the error)."""
    inp = op_inputs(entry.name, rows, n, r.device)
    if inp is None:
        return None
    args, kwargs = inp
    step = _fwd_bwd(lambda: entry.fn(*args, **kwargs), _leaves(args))
    try:
        step()
        return r._once_ms(step) / 1e3
    except Exception:
        return None
    finally:
        if r.cuda:
            torch.cuda.empty_cache()


def _reference_losses(batch: int, device: torch.device) -> dict[str, tuple[Callable[[], Any], Callable[[], Any], list]]:
    """(rankwise, reference, leaves) of the public-code comparisons of ``benchmarks/losses.py``."""
    g = torch.Generator().manual_seed(batch)
    xs = torch.randn(batch, 2, 128, generator=g).to(device).requires_grad_()
    ys = torch.randint(0, 100, (batch,), generator=g).to(device)
    xr = torch.randn(batch, 512, generator=g).to(device).requires_grad_()
    yr = torch.randperm(batch, generator=g).float().to(device)
    xn = torch.randn(batch, 2, 128, generator=g).to(device).requires_grad_()
    yn = torch.randint(0, 20, (batch,), generator=g).float().to(device)
    return {
        "supcon": (lambda: supcon_loss(xs, ys), lambda: supcon_reference(xs, ys), [xs]),
        "ranksim": (lambda: ranksim_loss(xr, yr), lambda: ranksim_reference(xr, yr), [xr]),
        "rnc": (lambda: rnc_loss(xn, yn), lambda: rnc_reference(xn, yn), [xn]),
    }


def section_losses(r: Runner, batches: list[int], out: dict[str, Any]) -> None:
    a = r.args
    for batch in batches:
        res: dict[str, Any] = out.setdefault(f"B={batch}", {})
        for _, entry in registry_cases("loss"):
            if a.quick and entry.name not in QUICK_LOSSES:
                continue
            try:
                args, kwargs = loss_inputs(entry.name, batch, r.device)
            except Exception as exc:
                res[entry.name] = {"error": f"inputs: {type(exc).__name__}: {exc}"[:300]}
                continue
            if entry.stochastic:
                torch.manual_seed(0)
            res[entry.name] = r.measure(_fwd_bwd(lambda f=entry.fn, a_=args, k=kwargs: f(*a_, **k), _leaves(args)))
            _print(f"losses B={batch}", entry.name, res[entry.name])
        for key, (ours, ref, leaves) in _reference_losses(batch, r.device).items():
            res[f"public:{key}"] = {"rankwise": r.measure(_fwd_bwd(ours, leaves))}
            if key == "rnc" and batch > a.max_rnc_reference_batch:
                res[f"public:{key}"]["reference"] = {"skipped": f"loop over 2B - 1 columns beyond B = {batch}"}
            else:
                res[f"public:{key}"]["reference"] = r.measure(_fwd_bwd(ref, leaves))
            with contextlib.suppress(Exception):
                res[f"public:{key}"]["ratio"] = (
                    res[f"public:{key}"]["reference"]["median_ms"] / res[f"public:{key}"]["rankwise"]["median_ms"]
                )
            _print(f"losses B={batch}", f"public:{key}", res[f"public:{key}"])


def _compile_case(r: Runner, section: str, name: str, size: Any) -> dict[str, Any]:
    if section == "ops":
        inp = op_inputs(name, *size, r.device)
        if inp is None:
            return {"skipped": "example-shape operator"}
        args, kwargs = inp
        fn = case_entry("op", name).fn
    else:
        args, kwargs = loss_inputs(name, size, r.device)
        fn = case_entry("loss", name).fn
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: fn(*a, **kwargs))
    res: dict[str, Any] = {}
    try:
        with torch.no_grad():
            if case_entry("op" if section == "ops" else "loss", name).stochastic:
                torch.manual_seed(0)
            want = _floats(fn(*args, **kwargs))
            if case_entry("op" if section == "ops" else "loss", name).stochastic:
                torch.manual_seed(0)
            got = _floats(compiled(*args))
        res["equals_eager"] = all(
            torch.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True) for x, y in zip(got, want)
        ) and len(got) == len(want)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    res.update(r.measure(_fwd_bwd(lambda: compiled(*args), _leaves(args))))
    return res


def section_compiled(r: Runner, cases: list[tuple[str, str, Any]], out: dict[str, Any]) -> None:
    for section, name, size in cases:
        key = f"{section}:{name}@{size if isinstance(size, int) else _shape_key(size)}"
        if r.left() <= r.args.compile_min_left_s:
            out[key] = {"skipped": "time budget spent"}
            continue
        out[key] = _compile_case(r, section, name, size)
        _print("compiled", key, out[key])


# ----------------------------------------------------------------------------------------------
def _print(section: str, name: str, res: dict[str, Any]) -> None:
    if "median_ms" in res:
        mem = f"  peak {res['peak_mib']:9.1f} MiB" if "peak_mib" in res else ""
        print(f"{section:22s} {name:34s} {res['median_ms']:10.3f} ms{mem}", flush=True)
    elif "rankwise" in res:
        ours, ref = res["rankwise"], res.get("reference", {})
        print(
            f"{section:22s} {name:34s} rankwise {ours.get('median_ms', float('nan')):10.3f} ms  "
            f"reference {ref.get('median_ms', float('nan')):10.3f} ms  {ours.get('error', '')}{ref.get('error', '')}",
            flush=True,
        )
    else:
        print(f"{section:22s} {name:34s} {res}", flush=True)


def _environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_gib=props.total_memory / 2**30, cuda=torch.version.cuda)
    for pkg in ("triton", "torchsort", "diffsort", "numba"):
        try:
            env[pkg] = getattr(__import__(pkg), "__version__", "installed")
        except Exception as exc:
            env[pkg] = f"unavailable ({type(exc).__name__})"
    with contextlib.suppress(Exception):
        env["commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    return env


@contextlib.contextmanager
def _section(name: str, result: dict[str, Any], write: Callable[[], None]) -> Iterator[dict[str, Any]]:
    out: dict[str, Any] = result.setdefault(name, {})
    t0 = time.perf_counter()
    try:
        yield out
    except Exception:
        out["_error"] = traceback.format_exc()[-2000:]
        print(f"section {name} failed:\n{out['_error']}", flush=True)
    finally:
        out["_seconds"] = time.perf_counter() - t0
        write()


#: (section key of ``losses``, label, reference) of the docs table
_PUBLIC_LOSSES = (
    ("public:supcon", "SupCon, B = {b} (2 views, D = 128)", "HobbitLong's `SupConLoss`"),
    ("public:ranksim", "RankSim, B = {b}, d = 512", "the public per-row loop"),
    ("public:rnc", "Rank-N-Contrast, B = {b} (2 views)", "the public O(N³) loop"),
)


def markdown(result: dict[str, Any]) -> str:
    """The docs table of a result: the isotonic soft rank beside torchsort, the losses beside the public code."""
    lines = [
        "Median ms of one forward + backward; ratio = the reference's time / rankwise's (above 1, rankwise is faster).",
        "",
        "| case | rankwise, ms | reference, ms | reference | ratio |",
        "|---|---|---|---|---|",
    ]
    ops = {k: v for k, v in result.get("ops", {}).items() if isinstance(v, dict)}
    for reg in ("l2", "kl"):
        for shape, cases in ops.items():
            ours, ref = cases.get(f"soft_rank.isotonic_{reg}", {}), cases.get(f"ref:torchsort_{reg}", {})
            a, b = ours.get("median_ms"), ref.get("median_ms")
            if a is None or b is None:
                continue
            rows, n = (int(v) for v in shape.split("x"))
            lines.append(
                f"| isotonic `soft_rank` {reg}, {rows:,} × {n:,} | {_ms(a)} | {_ms(b)} | torchsort | {ratio(b / a)} |"
            )
    losses = {k: v for k, v in result.get("losses", {}).items() if isinstance(v, dict)}
    for key, label, reference in _PUBLIC_LOSSES:
        for batch, cases in losses.items():
            case = cases.get(key)
            if not case or "ratio" not in case:
                continue
            a, b = case["rankwise"].get("median_ms"), case["reference"].get("median_ms")
            lines.append(
                f"| {label.format(b=f'{int(batch[2:]):,}')} | {_ms(a)} | {_ms(b)} | {reference} | "
                f"{ratio(case['ratio'])} |"
            )
    env = result.get("environment", {})
    lines += [
        "",
        provenance(
            "gpu.py",
            commit=env.get("commit"),
            date=result.get("date"),
            machine={k: env.get(k) for k in ("gpu", "platform", "torch", "triton", "python")},
            load=load_range(result.get("loadavg_start"), result.get("loadavg_end")),
            threads=str(result["threads"]) if "threads" in result else "not recorded",
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--markdown", type=Path, default=None, help="print the docs table of this result JSON and stop")
    ap.add_argument("--quick", action="store_true", help="a subset of shapes and compiled cases (< ~4 min on an H100)")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU: check the script without a GPU")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu.json"))
    ap.add_argument("--budget-s", type=float, default=None, help="stop timing new cases after this many seconds")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--case-seconds", type=float, default=None, help="timed seconds per case (at least 3 calls)")
    ap.add_argument("--max-quadratic-n", type=int, default=4096, help="largest n for O(n^2) operators")
    ap.add_argument("--max-rnc-reference-batch", type=int, default=2048)
    ap.add_argument("--max-case-s", type=float, default=5.0, help="skip O(n^2) cases predicted slower per call")
    ap.add_argument("--compile-min-left-s", type=float, default=25.0, help="compile only with this much budget left")
    ap.add_argument("--mem-budget-gb", type=float, default=40.0, help="skip references estimated above this")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--sections", default="ops,crossover,losses,compiled")
    a = ap.parse_args(argv)
    if a.markdown is not None:
        print(markdown(read(a.markdown)))
        return 0

    if a.dry_run:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        op_shapes = [(2, 8), (1, 64)]
        a.max_quadratic_n = min(a.max_quadratic_n, 8)
        batches = [8]
        cross_ns, cross_rows = [4, 8], 4
        compiled = [("ops", "soft_rank_isotonic", (2, 8)), ("losses", "spearman", 8)]
        defaults = {"budget_s": 600.0, "repeats": 2, "case_seconds": 0.05}
        a.compile_min_left_s = 0.0
    elif not torch.cuda.is_available():
        print("error: no CUDA device (use --dry-run to check the script on CPU)", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
        if a.quick:
            op_shapes = [(256, 256), (32, 4096), (1, 1000), (1, 10_000), (1, 100_000), (1, 1_000_000)]
            batches = [256, 1024, 4096]
            cross_ns, cross_rows = [8, 32, 128, 512], 256
            compiled = list(QUICK_COMPILED)
            defaults = {"budget_s": 200.0, "repeats": 10, "case_seconds": 0.2}
        else:
            op_shapes = [(1, 1_000_000), (1, 100_000), (1, 10_000), (1, 1000), (256, 256), (32, 4096)]
            batches = [256, 1024, 4096, 8192]
            cross_ns, cross_rows = [4, 8, 16, 32, 64, 128, 256, 512, 1024], 256
            compiled = [("ops", e.name, (256, 256)) for _, e in registry_cases("op")]
            compiled += [("losses", e.name, 1024) for _, e in registry_cases("loss")]
            defaults = {"budget_s": 3000.0, "repeats": 30, "case_seconds": 1.0}
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.no_compile:
        compiled = []
    sections = set(a.sections.split(","))

    # one matmul precision for rankwise and the references alike: TF32 off (PyTorch's default), so
    # float32 matmuls are float32 on both sides of every ratio
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    result: dict[str, Any] = {
        "environment": {**_environment(device), "allow_tf32": False},
        "mode": "dry-run" if a.dry_run else ("quick" if a.quick else "full"),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "timing": "CUDA events, median of the calls after one warm-up call; peak = max_memory_allocated "
        "during one call minus the memory allocated before it (MiB)",
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        a.out.write_text(json.dumps(result, indent=1, default=str))

    write()
    runner = Runner(device, a)
    t0 = time.perf_counter()
    end = runner.deadline

    def share(fraction: float) -> None:
        """The next section may use ``fraction`` of the budget (plus what earlier ones left)."""
        runner.deadline = min(end, time.perf_counter() + max(0.0, end - time.perf_counter()) * fraction)

    if "ops" in sections:
        share(SECTION_SHARES["ops"])
        with _section("ops", result, write) as out:
            section_ops(runner, op_shapes, out)
    if "crossover" in sections:
        share(SECTION_SHARES["crossover"])
        with _section("crossover", result, write) as out:
            section_crossover(runner, cross_ns, cross_rows, out)
    if "losses" in sections:
        share(SECTION_SHARES["losses"])
        with _section("losses", result, write) as out:
            section_losses(runner, batches, out)
    if "compiled" in sections and compiled:
        runner.deadline = end
        with _section("compiled", result, write) as out:
            section_compiled(runner, compiled, out)
    result["total_seconds"] = time.perf_counter() - t0
    write()
    _summary(result)
    print(f"wrote {a.out} ({result['total_seconds']:.0f} s)")
    return 0


def _summary(result: dict[str, Any]) -> None:
    """Short table last (the end of the output is what a remote run shows first)."""
    print("\n== summary (median ms fwd+bwd; ratio = reference / rankwise) ==")
    ops = result.get("ops", {})
    for shape, res in ops.items():
        if not isinstance(res, dict) or shape.startswith("_"):
            continue
        for reg in ("l2", "kl"):
            ours = res.get("soft_rank_isotonic" + ("" if reg == "l2" else f".{reg}"), {}).get("median_ms")
            ref = res.get(f"ref:torchsort_{reg}", {}).get("median_ms")
            if ours is not None:
                ratio = f"  vs torchsort {ref:.3f} ms: {ref / ours:.2f}x" if ref else ""
                print(f"soft_rank isotonic_{reg} {shape:>10s}: {ours:.3f} ms{ratio}")
    for batch, res in result.get("losses", {}).items():
        if not isinstance(res, dict) or batch.startswith("_"):
            continue
        for key in ("public:supcon", "public:ranksim", "public:rnc"):
            r = res.get(key, {})
            if "ratio" in r:
                print(f"{key:16s} {batch:>7s}: ratio {r['ratio']:.2f}x")
    cross = result.get("crossover", {})
    if "suggested_TRITON_MIN_N" in cross:
        print(f"suggested _TRITON_MIN_N: {cross['suggested_TRITON_MIN_N']}")
    errors = [
        f"{sec}/{k}/{name}"
        for sec in ("ops", "losses", "crossover")
        for k, res in result.get(sec, {}).items()
        if isinstance(res, dict)
        for name, v in res.items()
        if isinstance(v, dict) and "error" in v
    ]
    errors += [f"compiled/{k}" for k, v in result.get("compiled", {}).items() if isinstance(v, dict) and "error" in v]
    print(f"errors ({len(errors)}): {', '.join(errors[:40])}")
    if not math.isfinite(result.get("total_seconds", 0.0)):
        print("total time unknown")


if __name__ == "__main__":
    sys.exit(main())
