"""Forward+backward time and peak memory of every ``soft_topk`` method beside the authors' code, one process.

Usage::

    python benchmarks/topk.py --threads 1 --lapsum-path /tmp/lapsum --out benchmarks/results/topk.json
    python benchmarks/topk.py --threads 2 --lapsum-path /tmp/lapsum --out benchmarks/results/topk_2threads.json
    python benchmarks/topk.py --markdown benchmarks/results/topk.json benchmarks/results/topk_2threads.json
    python benchmarks/topk.py --quick                      # toy sizes, a smoke run (no file unless --out)
    python benchmarks/topk.py --threads 1 --lapsum-path /tmp/lapsum --methods lapsum,lapsum_torch,lapsum_authors \
        --out benchmarks/results/topk_lapsum_kernel.json   # LapSum only: kernel, torch path, authors' C++

For each input shape (rows x n, float32, CPU) and ``k`` in 1, 10, 100 (``k < n``) every case runs
``m = f(x)`` (the relaxed top-``k`` membership, shape of ``x``) and ``(m * w).sum().backward()`` with
fixed random ``w``:

* rankwise: ``rankwise.soft_topk(x, k, method=M)`` for every method ``M`` of ``TOPK_METHODS`` at its
  defaults (neuralsort / softsort ``tau=1``, isotonic l2 strength 1, sparse ``p=2``, ot
  ``epsilon=0.1``, diffsort odd-even steepness 10 cauchy, lapsum ``alpha=1``, perturbed
  ``sigma=0.1`` with 100 Gumbel samples), and ``diffsort_bitonic`` (``network="bitonic"``);
* the ``difftopk`` package (Petersen et al., ICML 2022): its dense odd-even and bitonic top-k
  networks (``DiffTopkNet(..., sparse=False)``: the sum of the ``k`` columns of the largest wires),
  its ``NeuralSort`` and ``SoftSort`` modules (``tau=1``: the sum of the first ``k`` rows of their
  ``n x n`` matrix). Its sparse bitonic and splitter-selection networks need ``torch-sparse`` (not
  installed here) and are not timed;
* ``lapsum_torch``: ``soft_topk(x, k, method="lapsum")`` with rankwise's CPU kernels switched off
  (its torch-ops path), only when ``--methods`` names it;
* LapSum's authors' code (Struski et al., ICML 2025, github.com/gmum/LapSum) with ``--lapsum-path``
  pointing to a checkout of that repository: its CPU C++ extension is built with
  ``torch.utils.cpp_extension.load`` into a temporary directory and called through the authors'
  autograd wrapper (nothing of it is copied into this repository).

Timing: after one untimed call per case at a toy size (numba compilation) and one profiled
untimed call per case and shape (the warm-up, which also gives the peak memory), the cases of a
(shape, k) run interleaved in a fresh random order every repeat (load on a shared machine hits
all alike); a case stops being timed once it has ``--min-repeats`` samples and more than
``--max-seconds`` in total (so slow cases at large ``n`` have fewer repeats, recorded per case); a
case whose warm-up call takes more than ``--max-first-call`` seconds is timed from one more call.
Cases whose estimated memory exceeds ``--mem-budget-gb`` or estimated work exceeds ``--max-work``
are skipped, with the estimate in the JSON. Peak memory: ``_timing.peak_allocated_bytes`` (the
largest running sum of torch's CPU allocations during one profiled forward+backward call); the
memory the authors' C++ extension and numba allocate outside torch's allocator is not seen.
Masks of pairs with the same conventions are compared (largest absolute difference under
``parity``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import rankwise
from _timing import loadavg, machine, peak_allocated_bytes
from rankwise.ops.topk import TOPK_METHODS

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(1, 100), (256, 100), (1, 1_000), (1, 10_000), (1, 100_000), (1, 1_000_000), (256, 1_000)]
QUICK_SHAPES = [(1, 16), (4, 32)]
KS = (1, 10, 100)
B4 = 4.0  # bytes per float32
Fn = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Case:
    fn: Fn
    mem_bytes: float = 0.0  # estimated peak memory
    work: float = 0.0  # estimated element operations
    reference_of: str | None = None  # the rankwise case this implementation is compared with
    parity: bool = False  # whether the masks should agree with that case's to rounding
    order: str = ""  # the order of the memory estimate where it is super-linear (for the skip message)


# ----------------------------------------------------------------------------------------------
# the authors' implementations
# ----------------------------------------------------------------------------------------------
def load_difftopk() -> Any:
    """The ``difftopk`` package, or None; its import prints a note about ``torch-sparse`` (silenced)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            import difftopk  # type: ignore[import-not-found]
    except ImportError:
        return None
    return difftopk


def load_lapsum(path: Path, build_dir: Path | None = None) -> Callable[..., torch.Tensor]:
    """The authors' ``soft_topk(x, k, alpha, dim, largest)`` from a checkout of github.com/gmum/LapSum.

    ``path`` is the repository root (or its ``lapsum`` folder). The CPU source is patched as the
    authors' ``setup.py`` does for PyTorch >= 2.6 (``.type()`` -> ``.scalar_type()``) and built
    with ``torch.utils.cpp_extension.load``; their autograd wrapper is imported from a temporary
    package whose ``extension.soft_topk_cpu`` is that build (no CUDA part).
    """
    from torch.utils.cpp_extension import load

    cands = [path / "lapsum" / "lapsum" / "topk", path / "lapsum" / "topk"]
    topk = next((c for c in cands if (c / "cpu" / "soft_topk.cpp").is_file()), None)
    if topk is None:
        raise SystemExit(f"error: --lapsum-path {path}: no lapsum/lapsum/topk/cpu/soft_topk.cpp below it")
    work = build_dir or Path(tempfile.gettempdir()) / "rankwise_lapsum_build"
    work.mkdir(parents=True, exist_ok=True)
    cpp = work / "soft_topk.cpp"
    cpp.write_text((topk / "cpu" / "soft_topk.cpp").read_text().replace(".type()", ".scalar_type()"))
    with contextlib.redirect_stdout(io.StringIO()):
        ext = load(name="lapsum_soft_topk_cpu", sources=[str(cpp)], build_directory=str(work), extra_cflags=["-O3"])
    pkg = work / "lapsum_authors"
    (pkg / "extension").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").touch()
    (pkg / "extension" / "__init__.py").touch()
    (pkg / "extension" / "soft_topk.py").write_text((topk / "extension" / "soft_topk.py").read_text())
    sys.modules["lapsum_authors.extension.soft_topk_cpu"] = ext
    sys.modules["lapsum_authors.extension.soft_topk_cuda"] = types.ModuleType("lapsum_authors.extension.soft_topk_cuda")
    sys.path.insert(0, str(work))
    import importlib

    fn: Callable[..., torch.Tensor] = importlib.import_module("lapsum_authors.extension.soft_topk").soft_topk
    return fn


# ----------------------------------------------------------------------------------------------
# the cases
# ----------------------------------------------------------------------------------------------
def _depth(network: str, n: int) -> int:
    if network == "odd_even":
        return n
    b = math.ceil(math.log2(max(n, 2)))
    return b * (b + 1) // 2


def make_cases(shape: tuple[int, int], k: int, pkg: Any, lapsum: Callable[..., torch.Tensor] | None) -> dict[str, Case]:
    rows, n = shape
    kn = rows * k * n
    cases: dict[str, Case] = {}
    for m in TOPK_METHODS:
        cases[m] = Case(lambda x, m=m: rankwise.soft_topk(x, k, method=m), mem_bytes=20 * rows * n * B4)
    # O(k n): the first k rows of the relaxed permutation (logits, P, and the backward's products)
    cases["neuralsort"].mem_bytes = cases["softsort"].mem_bytes = 6 * kn * B4 + 20 * rows * n * B4
    cases["neuralsort"].work = cases["softsort"].work = 10 * kn
    cases["perturbed"].mem_bytes = 6 * 100 * rows * n * B4  # 100 samples: noise, perturbed copies, indices
    cases["ot"].work = 4 * 200 * rows * n  # 200 Sinkhorn iterations against two target points
    for network, name in (("odd_even", "diffsort"), ("bitonic", "diffsort_bitonic")):
        depth = _depth(network, n)
        if name != "diffsort":
            cases[name] = Case(lambda x: rankwise.soft_topk(x, k, method="diffsort", network="bitonic"))
        # P @ u through the layers (P never built): the sort's saved values and alphas, the transposed
        # pass's inputs and the backward's gradients, 12.5 L n floats per row as measured at 1 x 1e4 and
        # 1 x 1e5 (bitonic)
        cases[name].mem_bytes = (13 * depth + 8) * rows * n * B4
        cases[name].work = 8 * depth * rows * n
        cases[name].order = "O(L n), L = " + ("n," if network == "odd_even" else "log2(n)^2 / 2,")
    if pkg is not None:
        for network, ours in (("odd_even", "diffsort"), ("bitonic", "diffsort_bitonic")):
            depth = _depth(network, n)
            nets: dict[str, Any] = {}

            def run_net(x: torch.Tensor, network: str = network, nets: dict[str, Any] = nets) -> torch.Tensor:
                if "net" not in nets:  # built on first use only (never for a skipped case)
                    nets["net"] = pkg.DiffTopkNet(network, n, k, sparse=False, steepness=10.0, distribution="cauchy")
                _, p = nets["net"](x)  # (rows, n, k): weights of the inputs in the k largest wires
                return p.sum(-1)

            # the dense network: 4 (n/2 x n) matrices per layer; per layer and row two (n x n/2)
            # blends kept for the backward product
            cases[f"difftopk_{network}"] = Case(
                run_net,
                mem_bytes=(2 + 2 * rows) * depth * n * n * B4,
                work=2 * depth * rows * n * n * (1 + k / 8),
                reference_of=ours,
                order="O(L n^2), L = " + ("n," if network == "odd_even" else "log2(n)^2 / 2,"),
            )
        # as difftopk's TopKCrossEntropyLoss uses them: X[b, i, j] = weight of input i in ascending
        # position j, the mask is the sum of the last k columns
        ns, ss = pkg.NeuralSort(tau=1.0), pkg.SoftSort(tau=1.0)
        # the memory factors (9 and 6 n^2 floats per row) are the peaks measured at 1 x 1,000
        cases["difftopk_NeuralSort"] = Case(
            lambda x: ns(x)[:, :, -k:].sum(-1),
            mem_bytes=9 * rows * n * n * B4,
            work=rows * n**3,  # A_s @ (1 1^T) as an n x n matrix product
            reference_of="neuralsort",
            parity=True,
            order="O(n^2)",
        )
        cases["difftopk_SoftSort"] = Case(
            lambda x: ss(-x).transpose(-2, -1)[:, :, -k:].sum(-1),
            mem_bytes=6 * rows * n * n * B4,
            work=20 * rows * n * n,
            reference_of="softsort",
            parity=True,
            order="O(n^2)",
        )
    cases["lapsum_torch"] = Case(_lapsum_torch(k), mem_bytes=20 * rows * n * B4, reference_of="lapsum", parity=True)
    if lapsum is not None:
        kk = torch.full((rows, 1), float(k))
        alpha = torch.tensor(1.0)  # a tensor: their backward returns a gradient for alpha
        cases["lapsum_authors"] = Case(
            lambda x: lapsum(x, kk, alpha, 1, True), mem_bytes=20 * rows * n * B4, reference_of="lapsum", parity=True
        )
    return cases


def _lapsum_torch(k: int) -> Fn:
    """``soft_topk(x, k, method="lapsum")`` through its torch-ops path (the CPU kernels switched off)."""
    import rankwise.ops.lapsum as lapsum_ops

    def fn(x: torch.Tensor) -> torch.Tensor:
        real = lapsum_ops._use_kernels
        lapsum_ops._use_kernels = lambda t: False  # type: ignore[assignment]
        try:
            return rankwise.soft_topk(x, k, method="lapsum")
        finally:
            lapsum_ops._use_kernels = real  # type: ignore[assignment]

    return fn


#: cases timed unless ``--methods`` names them
OPT_IN = ("lapsum_torch",)


def _selected(cases: dict[str, Case], methods: list[str] | None) -> dict[str, Case]:
    if methods is None:
        return {name: c for name, c in cases.items() if name not in OPT_IN}
    return {name: c for name, c in cases.items() if name in methods}


# ----------------------------------------------------------------------------------------------
# timing and memory
# ----------------------------------------------------------------------------------------------
_W: dict[tuple[int, ...], torch.Tensor] = {}


def _weights(shape: tuple[int, ...]) -> torch.Tensor:
    if shape not in _W:
        _W[shape] = torch.rand(shape, generator=torch.Generator().manual_seed(len(_W)))
    return _W[shape]


def _call(case: Case, x: torch.Tensor) -> torch.Tensor:
    a = x.detach().requires_grad_(True)
    out = case.fn(a)
    (out * _weights(tuple(out.shape))).sum().backward()
    return out


def _timed(case: Case, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    _call(case, x)
    return time.perf_counter() - t0


def _skip_reason(name: str, case: Case, k: int, n: int, args: argparse.Namespace) -> str | None:
    if k >= n:
        return f"k = {k} >= n = {n}"
    gb = case.mem_bytes / 1e9
    if case.mem_bytes > args.mem_budget_gb * 1e9:
        kind = f"{case.order} memory" if case.order else "memory"
        return f"{kind} = {gb:,.1f} GB (estimated) > --mem-budget-gb {args.mem_budget_gb:g}"
    if case.work > args.max_work:
        return f"work = {case.work:.1e} element operations (estimated) > --max-work {args.max_work:.0e}"
    return None


def bench(
    shape: tuple[int, int], k: int, args: argparse.Namespace, pkg: Any, lapsum: Any
) -> tuple[dict[str, Any], dict[str, float]]:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[1] + k))
    out: dict[str, Any] = {}
    live: dict[str, Case] = {}
    for name, case in _selected(make_cases(shape, k, pkg, lapsum), args.methods).items():
        reason = _skip_reason(name, case, k, shape[1], args)
        if reason is None:
            live[name] = case
        else:
            out[name] = {"skipped": reason}
    times: dict[str, list[float]] = {name: [] for name in live}
    peaks: dict[str, int] = {}
    slow: set[str] = set()
    for name, case in live.items():  # warm-up: one profiled call (the peak memory)
        t0 = time.perf_counter()
        peaks[name] = peak_allocated_bytes(lambda case=case: _call(case, x))
        if time.perf_counter() - t0 > args.max_first_call:
            slow.add(name)
            times[name].append(_timed(case, x))
    order = [name for name in live if name not in slow]
    rng = random.Random(shape[1] * 1000 + k)
    for _ in range(args.repeats):
        rng.shuffle(order)
        for name in order:
            ts = times[name]
            if len(ts) >= args.min_repeats and sum(ts) > args.max_seconds:
                continue
            ts.append(_timed(live[name], x))
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4, method="inclusive") if len(ts) >= 2 else [ts[0]] * 3
        out[name] = {
            "median_ms": 1e3 * statistics.median(ts),
            "q1_ms": 1e3 * q[0],
            "q3_ms": 1e3 * q[2],
            "repeats": len(ts),
            "peak_mib": peaks[name] / 2**20,
        }
        if name in slow:
            out[name]["note"] = f"warm-up call over {args.max_first_call:g} s: timed from one call"
    parity = {}
    with torch.no_grad():
        for name, case in live.items():
            if case.parity and case.reference_of in live:
                ref = live[case.reference_of]
                parity[f"{case.reference_of} vs {name}"] = float((ref.fn(x) - case.fn(x)).abs().max())
    return {name: out[name] for name in sorted(out, key=list(make_cases(shape, k, pkg, lapsum)).index)}, parity


def _ratios(res: dict[str, Any], cases: dict[str, Case]) -> dict[str, float]:
    """The other implementation's time / rankwise's (above 1: rankwise is faster)."""
    out = {}
    for name, case in cases.items():
        if case.reference_of is None:
            continue
        a, b = res.get(name, {}).get("median_ms"), res.get(case.reference_of, {}).get("median_ms")
        if a is not None and b:
            out[f"{name} / {case.reference_of}"] = a / b
    return out


def _commit() -> str | None:
    """HEAD of this checkout, with ``+dirty`` when ``src`` or ``benchmarks`` differ from it."""
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if not r.stdout.strip():
        return None
    diff = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "src", "benchmarks/topk.py"], check=False
    )
    return r.stdout.strip() + ("+dirty" if diff.returncode else "")


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    pkg = load_difftopk()
    lapsum = load_lapsum(args.lapsum_path) if args.lapsum_path is not None else None
    shapes = (
        QUICK_SHAPES if args.quick else [tuple(int(float(v)) for v in s.split("x")) for s in args.shapes.split(",")]
    )
    ks = [1, 4] if args.quick else [int(v) for v in args.k.split(",")]
    load_before, commit = loadavg(), _commit()  # the code that runs: read before the run
    t_start = time.perf_counter()
    import rankwise._kernels as kernel_layer

    for family in list(vars(kernel_layer).values()):  # numba kernels loaded before timing (no torch stand-in)
        if hasattr(family, "FAMILY"):
            family.FAMILY.load()
    x0 = torch.randn(2, 8)  # numba compilation and first-call costs outside the timed shapes
    for case in _selected(make_cases((2, 8), 2, pkg, lapsum), args.methods).values():
        _call(case, x0)
    results: dict[str, Any] = {}
    for shape in shapes:
        for k in ks:
            if k >= shape[1]:
                continue
            key = f"{shape[0]}x{shape[1]} k={k}"
            res, parity = bench(shape, k, args, pkg, lapsum)  # type: ignore[arg-type]
            ratios = _ratios(res, make_cases(shape, k, pkg, lapsum))  # type: ignore[arg-type]
            results[key] = {"results": res, "ratios": ratios, "parity": parity, "load": loadavg()}
            print(f"== {args.threads} thread(s), {key} (fwd+bwd median ms [q1, q3], repeats, peak MiB)", flush=True)
            for name, r in res.items():
                if "skipped" in r:
                    print(f"  {name:<22} skipped: {r['skipped']}")
                else:
                    print(
                        f"  {name:<22} {r['median_ms']:10.2f}  [{r['q1_ms']:.2f}, {r['q3_ms']:.2f}]  "
                        f"n={r['repeats']:<3} {r['peak_mib']:9.1f}"
                    )
            for name, v in ratios.items():
                print(f"  ratio {name:<40} {v:8.2f}")
            for name, v in parity.items():
                print(f"  parity {name:<39} {v:.2e}")
    payload = {
        "meta": {
            "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(),
            "load_before": load_before,
            "load_after": loadavg(),
            "wall_s": round(time.perf_counter() - t_start, 1),
            "rankwise": rankwise.__version__,
            "difftopk": "0.2.0" if pkg is not None else None,
            "lapsum_authors": str(args.lapsum_path) if lapsum is not None else None,
            "threads": args.threads,
            "dtype": "float32",
            "timing": "median wall-clock of one soft_topk forward + (m * w).sum().backward(), cases interleaved",
            "repeats": (
                f"up to {args.repeats} per case; a case stops once it has {args.min_repeats} repeats and "
                f"more than {args.max_seconds:g} s (the slow cases at large n have {args.min_repeats}); "
                f"'repeats' of each case says how many"
            ),
            "peak_memory": "largest running sum of torch's CPU allocations during one profiled call (MiB)",
            "settings": {
                "rankwise": "soft_topk defaults; diffsort_bitonic = method 'diffsort', network 'bitonic'",
                "difftopk": "DiffTopkNet(network, n, k, sparse=False, steepness=10, cauchy); NeuralSort/SoftSort tau 1",
                "difftopk not timed": "sparse_bitonic and sparse_splitter_selection (they need torch-sparse)",
                "lapsum_authors": "soft_topk(x, k * ones(B, 1), alpha=tensor(1.0), dim=1, largest=True), CPU C++",
            },
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        },
        "runs": results,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {args.out}")
    return payload


# ----------------------------------------------------------------------------------------------
# the docs table
# ----------------------------------------------------------------------------------------------
RANKWISE_COLUMNS = (*TOPK_METHODS, "diffsort_bitonic")
PAIRS = (
    ("lapsum", "lapsum_authors", "LapSum authors' C++"),
    ("diffsort", "difftopk_odd_even", "difftopk odd-even"),
    ("diffsort_bitonic", "difftopk_bitonic", "difftopk bitonic"),
    ("neuralsort", "difftopk_NeuralSort", "difftopk NeuralSort"),
    ("softsort", "difftopk_SoftSort", "difftopk SoftSort"),
    ("lapsum", "lapsum_torch", "its torch-ops path"),
)


def _ms(r: dict[str, Any] | None) -> str:
    if r is None or "median_ms" not in r:
        return "–"
    v = r["median_ms"]
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.2f}"


def _mib(r: dict[str, Any] | None) -> str:
    if r is None or "peak_mib" not in r:
        return "–"
    v = r["peak_mib"]
    return f"{v:,.0f}" if v >= 10 else f"{v:.1f}" if v >= 0.1 else f"{v:.2f}"


def _size(key: str) -> str:
    shape, k = key.split(" ")
    rows, n = shape.split("x")
    return f"{int(rows):,} × {int(n):,}, {k.replace('=', ' = ')}"


def _threads(t: int) -> str:
    return f"{t} thread" + ("s" if t != 1 else "")


def markdown(paths: list[Path]) -> str:
    """Tables of the JSON files (one per thread count; times of several are shown ``a / b``)."""
    runs = [json.loads(p.read_text()) for p in paths]
    keys = list(runs[0]["runs"])
    present = {m for r in runs for v in r["runs"].values() for m in v.get("results", {})}
    columns = [m for m in (*RANKWISE_COLUMNS, "lapsum_torch") if m in present]
    threads = " / ".join(str(r["meta"]["threads"]) for r in runs) + " thread" + ("s" if len(runs) > 1 else "")
    lines = [
        f"Forward + backward, median ms ({threads}), of `soft_topk(x, k, method=...)` at its defaults:",
        "",
        "| rows × n, k | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for key in keys:
        cells = [" / ".join(_ms(r["runs"].get(key, {}).get("results", {}).get(m)) for r in runs) for m in columns]
        lines.append(f"| {_size(key)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Peak tensor memory, MiB (1 thread; profiled torch CPU allocations):",
        "",
        "| rows × n, k | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for key in keys:
        res = runs[0]["runs"][key]["results"]
        lines.append(f"| {_size(key)} | " + " | ".join(_mib(res.get(m)) for m in columns) + " |")
    lines += [
        "",
        "Against the authors' code: ratio = their time / rankwise's (above 1, rankwise is faster) at k = 1 / 10 / "
        "100 (`–`: k >= n or a side skipped), with the k = 10 times and peak tensor memory at 1 thread:",
        "",
        "| case | rows × n | "
        + " | ".join(f"ratio, {_threads(r['meta']['threads'])}" for r in runs)
        + " | ms, rankwise / theirs | MiB, rankwise / theirs |",
        "|---" * (4 + len(runs)) + "|",
    ]
    shapes = list(dict.fromkeys(key.split(" ")[0] for key in keys))
    for ours, theirs, label in PAIRS:
        for shape in shapes:
            ratios, any_ratio = [], False
            for r in runs:
                cells = []
                for k in KS:
                    res = r["runs"].get(f"{shape} k={k}", {}).get("results", {})
                    a, b = res.get(ours, {}).get("median_ms"), res.get(theirs, {}).get("median_ms")
                    cells.append("–" if a is None or b is None else f"{b / a:,.0f}" if b / a >= 100 else f"{b / a:.2f}")
                    any_ratio |= a is not None and b is not None
                ratios.append(" / ".join(cells))
            if not any_ratio:
                continue
            r10 = runs[0]["runs"].get(f"{shape} k=10", {}).get("results", {})
            rows, n = shape.split("x")
            lines.append(
                f"| `{ours}` vs {label} | {int(rows):,} × {int(n):,} | " + " | ".join(ratios) + " | "
                f"{_ms(r10.get(ours))} / {_ms(r10.get(theirs))} | {_mib(r10.get(ours))} / {_mib(r10.get(theirs))} |"
            )
    m = runs[0]["meta"]["machine"]
    prov = "; ".join(
        f"{_threads(r['meta']['threads'])}: rankwise commit `{(r['meta']['commit'] or 'unknown')[:7]}` "
        f"({r['meta']['date'][:10]}, 1-minute load average {r['meta']['load_before'][0]:.1f}-"
        f"{r['meta']['load_after'][0]:.1f}, {r['meta']['wall_s']:.0f} s)"
        for r in runs
    )
    lines += ["", f"*Numbers recorded in {prov}; torch {m['torch']}, {m['cpu_count']}-core {m['platform']}.*"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in SHAPES), help="e.g. 1x1000,256x1000")
    parser.add_argument(
        "--k", default=",".join(map(str, KS)), help="comma-separated k (cases with k >= n are left out)"
    )
    parser.add_argument("--repeats", type=int, default=10, help="timed repeats per case at most")
    parser.add_argument("--min-repeats", type=int, default=3, help="repeats every case gets regardless of time")
    parser.add_argument("--max-seconds", type=float, default=2.0, help="stop timing a case after this long (s)")
    parser.add_argument("--max-first-call", type=float, default=8.0, help="time slower cases from one call")
    parser.add_argument("--mem-budget-gb", type=float, default=4.0, help="skip cases estimated to need more memory")
    parser.add_argument("--max-work", type=float, default=2e10, help="skip cases estimated to need more element ops")
    parser.add_argument("--lapsum-path", type=Path, default=None, help="a checkout of github.com/gmum/LapSum")
    parser.add_argument(
        "--methods",
        type=lambda v: [m.strip() for m in v.split(",") if m.strip()],
        default=None,
        help="comma-separated cases to time (e.g. lapsum,lapsum_torch,lapsum_authors; default: all but lapsum_torch)",
    )
    parser.add_argument("--quick", action="store_true", help="toy shapes (1x16, 4x32), k 1 and 4: a smoke run")
    parser.add_argument("--out", type=Path, default=None, help="JSON to write")
    parser.add_argument("--markdown", type=Path, nargs="+", default=None, help="print the docs tables of these JSON")
    args = parser.parse_args(argv)
    if args.markdown is not None:
        print(markdown(args.markdown))
        return None
    if args.repeats < 1 or args.min_repeats < 1:
        parser.error(f"--repeats and --min-repeats must be >= 1, got {args.repeats} and {args.min_repeats}")
    known = {*TOPK_METHODS, "diffsort_bitonic", "lapsum_torch", "lapsum_authors", "difftopk_odd_even"}
    known |= {"difftopk_bitonic", "difftopk_NeuralSort", "difftopk_SoftSort"}
    unknown = sorted(set(args.methods or ()) - known)
    if unknown:
        parser.error(
            f"--methods: unknown case(s) {', '.join(unknown)}; expected names among {', '.join(sorted(known))}"
        )
    if args.quick:
        args.repeats, args.min_repeats = min(args.repeats, 2), 1
    return run(args)


if __name__ == "__main__":
    main()
