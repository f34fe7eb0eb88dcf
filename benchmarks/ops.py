"""Forward+backward time and peak memory of every sorting relaxation beside its reference code, one process.

Usage::

    python benchmarks/ops.py --out benchmarks/results/ops.json            # 1 and 2 threads, all shapes
    python benchmarks/ops.py --threads 1 --shapes 32x256 --repeats 5      # a quick look

For each input shape (rows x n: 32x256, 8x1024, 1x4096; float32, CPU unless ``--device``) every case
below runs ``out = f(x)`` and ``(out * w).sum().backward()`` with fixed random ``w`` (every floating
output of a tuple enters the sum):

* floor: ``torch.sort`` (values), ``rankwise.rank`` (no backward), ``blackbox_rank``;
* isotonic soft ranks l2 / kl (``rankwise.soft_rank``, strength 1) beside ``torchsort.soft_rank``;
* NeuralSort's relaxed permutation matrix (``rankwise.neural_sort``, tau 1) beside the reference
  formula as the authors wrote it (``A_s @ 1 1^T``, O(n^3); a transcription, their code is not on
  PyPI), and stochastic NeuralSort (1 sample);
* SoftSort's matrix (``rankwise.softsort_matrix``, tau 1) beside the authors' one-line formula;
* differentiable sorting networks (``rankwise.diffsort``, steepness 10, cauchy), odd-even and
  bitonic, sorted values only and with ``P``, beside the authors' ``diffsort`` package (which
  always builds ``P``, with O(n^3) matrix products per layer);
* optimal transport (``soft_rank(method="sinkhorn")``, epsilon 1e-2, m = n targets) when installed
  (the authors' code is TensorFlow);
* perturbed ranks (``rankwise.perturbed_rank``, 100 Gumbel samples; the authors' code is
  TensorFlow/JAX).

Timing: the cases run interleaved in a fresh random order every repeat (load on a shared machine
hits all alike); an operator stops being timed once it has ``--min-repeats`` samples and more than
``--max-seconds`` in total; one whose first call exceeds ``--max-first-call`` seconds is reported
from that call alone. Cases whose estimated memory exceeds ``--mem-budget-gb`` (the diffsort
package keeps O(L n^2) per row for autograd) or whose estimated work exceeds ``--max-work`` are
skipped with the reason in the JSON. Peak memory: the largest increase of the CPU allocator's
total during one profiled forward+backward call (``torch.profiler`` allocation events; numba's
own scratch arrays are not seen), in MiB. Values of each reference pair are compared and the
largest absolute differences stored under ``parity``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import rankwise

SHAPES = [(32, 256), (8, 1024), (1, 4096)]
Fn = Callable[[torch.Tensor], Any]


@dataclass
class Case:
    fn: Fn
    backward: bool = True
    reference_of: str | None = None  # name of the rankwise case this reference reproduces
    mem_bytes: float = 0.0  # estimated peak memory
    work: float = 0.0  # estimated element operations
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# reference implementations (transcriptions of published PyTorch formulas / packages)
# ----------------------------------------------------------------------------------------------
def neural_sort_cubic(s: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    r"""NeuralSort's :math:`\hat P` as the reference code writes it: :math:`A_s 1 1^T` as a matrix product (O(n^3))."""
    n = s.shape[-1]
    col = s.unsqueeze(-1)
    a_s = (col - col.transpose(-1, -2)).abs()
    ones = torch.ones(n, 1, dtype=s.dtype, device=s.device)
    b = a_s @ (ones @ ones.T)
    scaling = (n + 1 - 2 * (torch.arange(n, dtype=s.dtype, device=s.device) + 1)).unsqueeze(-1)
    c = col.transpose(-1, -2) * scaling
    return torch.softmax((c - b.transpose(-1, -2)) / tau, dim=-1)


def softsort_formula(s: torch.Tensor, tau: float = 1.0, power: float = 1.0) -> torch.Tensor:
    """SoftSort (Prillo & Eisenschlos) as the authors' module computes it: softmax(-|sort(s) 1^T - 1 s^T|^p / tau)."""
    s_sorted = s.sort(descending=True, dim=-1).values
    pairwise = (s.unsqueeze(-2) - s_sorted.unsqueeze(-1)).abs().pow(power).neg() / tau
    return pairwise.softmax(-1)


def _diffsort_package() -> Any:
    try:
        import diffsort  # type: ignore[import-not-found]
    except ImportError:
        return None
    return diffsort


def _torchsort() -> Any:
    try:
        import torchsort  # type: ignore[import-not-found]
    except ImportError:
        return None
    return torchsort


def _depth(network: str, n: int) -> int:
    if network == "odd_even":
        return n
    k = math.ceil(math.log2(n))
    return k * (k + 1) // 2


# ----------------------------------------------------------------------------------------------
# the cases
# ----------------------------------------------------------------------------------------------
def make_cases(shape: tuple[int, int], device: torch.device) -> dict[str, Case]:
    rows, n = shape
    b4 = 4.0  # bytes per float32
    cases: dict[str, Case] = {
        "torch.sort": Case(lambda x: torch.sort(x, dim=-1).values),
        "rank (fwd only)": Case(lambda x: rankwise.rank(x), backward=False),
        "blackbox_rank": Case(lambda x: rankwise.blackbox_rank(x, 2.0)),
        "isotonic_l2": Case(lambda x: rankwise.soft_rank(x, method="isotonic", regularization="l2")),
        "isotonic_kl": Case(lambda x: rankwise.soft_rank(x, method="isotonic", regularization="kl")),
    }
    ts = _torchsort()
    if ts is not None:
        cases["torchsort_l2"] = Case(lambda x: ts.soft_rank(x, regularization="l2"), reference_of="isotonic_l2")
        cases["torchsort_kl"] = Case(lambda x: ts.soft_rank(x, regularization="kl"), reference_of="isotonic_kl")
    nn2 = rows * n * n
    cases["neural_sort"] = Case(lambda x: rankwise.neural_sort(x, tau=1.0), mem_bytes=4 * nn2 * b4, work=nn2)
    cases["neural_sort_reference"] = Case(
        neural_sort_cubic, reference_of="neural_sort", mem_bytes=6 * nn2 * b4, work=rows * n**3
    )
    cases["stochastic_neural_sort"] = Case(
        lambda x: rankwise.stochastic_neural_sort(x, tau=1.0, log_scores=True), mem_bytes=4 * nn2 * b4, work=nn2
    )
    cases["softsort"] = Case(lambda x: rankwise.softsort_matrix(x, tau=1.0), mem_bytes=4 * nn2 * b4, work=nn2)
    cases["softsort_reference"] = Case(softsort_formula, reference_of="softsort", mem_bytes=5 * nn2 * b4, work=nn2)
    pkg = _diffsort_package()
    for network in ("odd_even", "bitonic"):
        depth = _depth(network, n)
        kw = {"network": network, "steepness": 10.0, "distribution": "cauchy"}
        cases[f"diffsort_{network}"] = Case(
            lambda x, kw=kw: rankwise.diffsort(x, return_matrix=False, **kw),
            mem_bytes=3 * depth * rows * n * b4,
            work=depth * rows * n,
        )
        seg = math.isqrt(max(depth - 1, 0)) + 1
        cases[f"diffsort_{network}_P"] = Case(
            lambda x, kw=kw: rankwise.diffsort(x, **kw),
            mem_bytes=(depth / seg + seg + 4) * nn2 * b4,
            work=depth * nn2,
        )
        if pkg is not None:
            # the network is built on first use only (never for a skipped case): the package stores
            # dense (n, n) matrices per layer, 2 * depth * n^2 floats (17 GB for odd-even at n = 1024)
            nets: dict[str, Any] = {}

            def run_package(x: torch.Tensor, network: str = network, nets: dict[str, Any] = nets) -> Any:
                if "net" not in nets:
                    nets["net"] = pkg.get_sorting_network(network, n, str(device))
                return pkg.sort(nets["net"], x, 10.0, 0.25, "cauchy")

            # per layer the package keeps about four (rows, n, n/2)-sized products and the new X for
            # autograd, plus the network's own per-layer matrices
            cases[f"diffsort_package_{network}"] = Case(
                run_package,
                reference_of=f"diffsort_{network}_P",
                mem_bytes=(3 * rows + 2) * depth * n * n * b4,
                work=2 * depth * nn2 * n,
            )
    if "sinkhorn" in rankwise.list_soft_methods():
        cases["sinkhorn"] = Case(
            lambda x: rankwise.soft_rank(x, method="sinkhorn", epsilon=1e-2),
            mem_bytes=8 * nn2 * b4,
            work=rows * (50 * n * n + 10 * n**3),
        )
    cases["perturbed_rank"] = Case(
        lambda x: rankwise.perturbed_rank(x, sigma=0.1, n_samples=100), mem_bytes=300 * rows * n * b4, work=0
    )
    return cases


# ----------------------------------------------------------------------------------------------
# timing and memory
# ----------------------------------------------------------------------------------------------
def _floats(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    return [t for o in out for t in _floats(o)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call(case: Case, x: torch.Tensor) -> Any:
    a = x.detach().requires_grad_(case.backward)
    out = case.fn(a)
    if case.backward:
        outs = _floats(out)
        loss = sum((o * _weights(o)).sum() for o in outs)
        loss.backward()  # type: ignore[union-attr]
    return out


_W: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def _weights(o: torch.Tensor) -> torch.Tensor:
    key = (tuple(o.shape), o.device)
    if key not in _W:
        g = torch.Generator().manual_seed(len(_W))
        _W[key] = torch.rand(o.shape, generator=g).to(device=o.device, dtype=o.dtype)
    return _W[key]


def _timed(case: Case, x: torch.Tensor) -> float:
    _sync(x.device)
    t0 = time.perf_counter()
    _call(case, x)
    _sync(x.device)
    return time.perf_counter() - t0


def peak_memory_mib(case: Case, x: torch.Tensor) -> float:
    """Largest increase of allocated memory during one forward+backward call, in MiB."""
    if x.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(x.device)
        base = torch.cuda.memory_allocated(x.device)
        _call(case, x)
        torch.cuda.synchronize(x.device)
        return (torch.cuda.max_memory_allocated(x.device) - base) / 2**20
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _call(case, x)

    def walk(nodes: Any) -> Any:
        for node in nodes:
            yield node
            yield from walk(node.children)

    tree = prof.profiler.kineto_results.experimental_event_tree()  # type: ignore[union-attr]
    allocs = sorted((n for n in walk(tree) if n.tag == _EventType.Allocation), key=lambda n: n.start_time_ns)
    if not allocs:
        return 0.0
    first = allocs[0].extra_fields
    base = first.total_allocated - first.alloc_size
    return max(0.0, (max(n.extra_fields.total_allocated for n in allocs) - base) / 2**20)


def _max_abs_diff(a: Any, b: Any) -> float:
    ta, tb = _floats(a), _floats(b)
    return max(float((p.detach().double() - q.detach().double()).abs().max()) for p, q in zip(ta, tb) if p.numel())


def bench_shape(shape: tuple[int, int], args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).to(device=device, dtype=torch.float32)
    cases = make_cases(shape, device)
    out: dict[str, Any] = {}
    live: dict[str, Case] = {}
    for name, case in cases.items():
        if case.mem_bytes > args.mem_budget_gb * 2**30:
            out[name] = {"skipped": f"estimated memory {case.mem_bytes / 2**30:.1f} GiB > {args.mem_budget_gb} GiB"}
        elif case.work > args.max_work:
            out[name] = {"skipped": f"estimated work {case.work:.1e} element operations > {args.max_work:.0e}"}
        else:
            live[name] = case
    times: dict[str, list[float]] = {name: [] for name in live}
    single: set[str] = set()
    for name, case in live.items():  # warm-up (JIT compilation, caches, network tables)
        for w in range(args.warmup):
            t = _timed(case, x)
            if w == 0 and t > args.max_first_call:
                times[name].append(t)
                single.add(name)
                break
    order = [name for name in live if name not in single]
    rng = random.Random(0)
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
            "backward": live[name].backward,
        }
        if name in single:
            out[name]["note"] = f"first call over {args.max_first_call} s: that call only"
        if args.memory:
            out[name]["peak_mib"] = peak_memory_mib(live[name], x)
    parity = {}
    for name, case in live.items():
        if case.reference_of in live:
            ref = case.reference_of
            with torch.no_grad():
                parity[f"{ref} vs {name}"] = _max_abs_diff(live[ref].fn(x), case.fn(x))
    return {"results": out, "parity": parity}


def _ratios(res: dict[str, Any], cases: dict[str, Case]) -> dict[str, float]:
    def med(name: str) -> float | None:
        r = res.get(name, {})
        return r.get("median_ms")

    out = {}
    for name, case in cases.items():
        if case.reference_of is not None:
            a, b = med(name), med(case.reference_of)
            if a is not None and b:
                out[f"{case.reference_of} speed-up vs {name}"] = a / b
    floor = med("torch.sort")
    for name in ("isotonic_l2", "diffsort_bitonic", "diffsort_odd_even", "sinkhorn", "perturbed_rank", "neural_sort"):
        a = med(name)
        if a is not None and floor:
            out[f"{name} / torch.sort"] = a / floor
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per operator and shape")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per operator and shape")
    parser.add_argument("--max-seconds", type=float, default=10.0, help="stop timing an operator after this long (s)")
    parser.add_argument("--min-repeats", type=int, default=3, help="repeats every operator gets regardless of time")
    parser.add_argument("--max-first-call", type=float, default=60.0, help="report slower operators from one call")
    parser.add_argument("--mem-budget-gb", type=float, default=4.0, help="skip cases estimated to need more memory")
    parser.add_argument("--max-work", type=float, default=2e10, help="skip cases estimated to need more element ops")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="do not profile peak memory")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--threads", default="1,2", help="comma-separated torch intra-op thread counts")
    parser.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in SHAPES), help="e.g. 32x256,8x1024")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ops.json"))
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    threads = [int(t) for t in args.threads.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    device = torch.device(args.device)

    runs: dict[str, Any] = {}
    for nt in threads:
        torch.set_num_threads(nt)
        per_shape: dict[str, Any] = {}
        for shape in shapes:
            key = f"{shape[0]}x{shape[1]}"
            res = bench_shape(shape, args, device)  # type: ignore[arg-type]
            res["ratios"] = _ratios(res["results"], make_cases(shape, device))  # type: ignore[arg-type]
            per_shape[key] = res
            print(f"== {nt} thread(s), {key} (fwd+bwd median ms [q1, q3], repeats, peak MiB)", flush=True)
            for name, r in res["results"].items():
                if "skipped" in r:
                    print(f"  {name:<26} skipped: {r['skipped']}")
                    continue
                mem = f"{r['peak_mib']:9.1f}" if "peak_mib" in r else ""
                print(
                    f"  {name:<26} {r['median_ms']:10.2f}  [{r['q1_ms']:.2f}, {r['q3_ms']:.2f}]  "
                    f"n={r['repeats']:<3} {mem}"
                )
            for name, v in res["ratios"].items():
                print(f"  ratio {name:<48} {v:8.2f}")
            for name, v in res["parity"].items():
                print(f"  parity {name:<45} {v:.2e}")
        runs[f"{nt}_threads"] = per_shape

    pkg, ts = _diffsort_package(), _torchsort()
    meta = {
        "torch": torch.__version__,
        "rankwise": rankwise.__version__,
        "torchsort": getattr(ts, "__version__", "installed") if ts is not None else None,
        "diffsort": "0.2.0" if pkg is not None else None,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "cpu_count": __import__("os").cpu_count(),
        "threads": threads,
        "dtype": "float32",
        "timing": "median wall-clock of one forward + (out * w).sum().backward(), operators interleaved",
        "peak_memory": "largest increase of allocated bytes during one profiled call (MiB)",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "settings": {
            "isotonic/torchsort regularization_strength": 1.0,
            "neural_sort/softsort tau": 1.0,
            "blackbox lambda": 2.0,
            "diffsort": "steepness 10, cauchy",
            "sinkhorn": "epsilon 1e-2, m = n",
            "perturbed_rank": "sigma 0.1, 100 gumbel samples",
        },
    }
    payload = {"meta": meta, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")
    return payload


if __name__ == "__main__":
    main()
