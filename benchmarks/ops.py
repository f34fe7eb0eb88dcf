"""Forward+backward median times of the rankwise operators, side by side in one run.

Usage::

    python benchmarks/ops.py --repeats 50 --device cpu --out benchmarks/results/ops.json

For every shape, (256, 256), (1, 4096) and (64, 1024), each operator is timed on the same input:
``torch.sort`` (the floor), ``rankwise.rank`` (forward only: not differentiable),
``rankwise.blackbox_rank``, ``rankwise.soft_rank(method="isotonic")`` with l2 and kl,
``torchsort.soft_rank`` l2 / kl when torchsort is installed, and ``rankwise.neural_sort`` against a
direct O(n^3) transcription of NeuralSort's reference formula (``A_s @ 1 1^T``). One repeat runs every
operator once, in a fresh random order, so that load on a shared machine hits all of them alike;
the JSON holds medians (and quartiles) in milliseconds plus the ratios the issue asks for.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import rankwise
from rankwise.ops.permutation import neural_sort

SHAPES = [(256, 256), (1, 4096), (64, 1024)]
Case = Callable[[torch.Tensor], torch.Tensor]


def neural_sort_cubic(s: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    r"""NeuralSort's :math:`\hat P` exactly as the reference formula is written (O(n^3)).

    :math:`\hat P = \mathrm{softmax}\bigl(((n + 1 - 2i)\, s^\top - A_s \mathbf 1 \mathbf 1^\top) / \tau\bigr)`
    row-wise, with :math:`A_s = |s_j - s_k|`; the product with the all-ones matrix is O(n^3).
    """
    n = s.shape[-1]
    col = s.unsqueeze(-1)  # (..., n, 1)
    a_s = (col - col.transpose(-1, -2)).abs()  # (..., n, n)
    ones = torch.ones(n, 1, dtype=s.dtype, device=s.device)
    b = a_s @ (ones @ ones.T)  # (..., n, n): row sums of A_s repeated along the columns; O(n^3)
    scaling = (n + 1 - 2 * (torch.arange(n, dtype=s.dtype, device=s.device) + 1)).unsqueeze(-1)  # (n, 1)
    c = col.transpose(-1, -2) * scaling  # (..., n, n): C[i, j] = (n + 1 - 2 i) s_j
    p_max = (c - b.transpose(-1, -2)) / tau
    return torch.softmax(p_max, dim=-1)


def _cases(shape: tuple[int, int], args: argparse.Namespace) -> dict[str, Case]:
    cases: dict[str, Case] = {
        "torch.sort": lambda x: torch.sort(x, dim=-1).values,
        "rank (fwd only)": lambda x: rankwise.rank(x),
        "blackbox_rank": lambda x: rankwise.blackbox_rank(x, 2.0),
        "isotonic_l2": lambda x: rankwise.soft_rank(x, method="isotonic", regularization="l2"),
        "isotonic_kl": lambda x: rankwise.soft_rank(x, method="isotonic", regularization="kl"),
    }
    try:
        import torchsort  # type: ignore[import-not-found]

        cases["torchsort_l2"] = lambda x: torchsort.soft_rank(x, regularization="l2")
        cases["torchsort_kl"] = lambda x: torchsort.soft_rank(x, regularization="kl")
    except ImportError:
        pass
    rows, n = shape
    cases["neural_sort"] = lambda x: neural_sort(x, tau=1.0)
    if rows * n**3 <= args.max_cubic_flops:
        cases["neural_sort_cubic"] = neural_sort_cubic
    return cases


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_once(fn: Case, x: torch.Tensor, grad: bool) -> float:
    a = x.detach().requires_grad_(grad)
    _sync(x.device)
    t0 = time.perf_counter()
    y = fn(a)
    if grad:
        y.sum().backward()
    _sync(x.device)
    return time.perf_counter() - t0


def bench_shape(shape: tuple[int, int], args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).to(device=device, dtype=torch.float32)
    cases = _cases(shape, args)
    grads = {name: not name.startswith("rank ") for name in cases}
    for name, fn in cases.items():  # warm-up (JIT compilation, caches)
        for _ in range(args.warmup):
            _run_once(fn, x, grads[name])
    times: dict[str, list[float]] = {name: [] for name in cases}
    order = list(cases)
    rng = random.Random(0)
    for _ in range(args.repeats):
        rng.shuffle(order)
        for name in order:
            ts = times[name]
            if len(ts) >= args.min_repeats and sum(ts) > args.max_seconds:
                continue  # slow operator (the O(n^2)/O(n^3) NeuralSort): enough samples for a median
            ts.append(_run_once(cases[name], x, grads[name]))
    out: dict[str, Any] = {}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
        out[name] = {
            "median_ms": 1e3 * statistics.median(ts),
            "q1_ms": 1e3 * q[0],
            "q3_ms": 1e3 * q[2],
            "repeats": len(ts),
            "backward": grads[name],
        }
    return out


def _ratios(res: dict[str, Any]) -> dict[str, float]:
    def med(name: str) -> float | None:
        return res[name]["median_ms"] if name in res else None

    pairs = {
        "isotonic_l2 / torchsort_l2": ("isotonic_l2", "torchsort_l2"),
        "isotonic_kl / torchsort_kl": ("isotonic_kl", "torchsort_kl"),
        "isotonic_l2 / torch.sort": ("isotonic_l2", "torch.sort"),
        "isotonic_kl / torch.sort": ("isotonic_kl", "torch.sort"),
        "torchsort_l2 / torch.sort": ("torchsort_l2", "torch.sort"),
        "blackbox_rank / torch.sort": ("blackbox_rank", "torch.sort"),
        "neural_sort_cubic / neural_sort (speed-up)": ("neural_sort_cubic", "neural_sort"),
    }
    out = {}
    for key, (a, b) in pairs.items():
        ma, mb = med(a), med(b)
        if ma is not None and mb is not None and mb > 0:
            out[key] = ma / mb
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed repeats per operator and shape")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per operator and shape")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=20.0,
        help="stop timing an operator on a shape after this many seconds (once it has --min-repeats)",
    )
    parser.add_argument("--min-repeats", type=int, default=7, help="repeats every operator gets regardless of time")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: leave torch's default)")
    parser.add_argument(
        "--max-cubic-flops", type=float, default=2e10, help="skip the O(n^3) NeuralSort where rows * n^3 exceeds this"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ops.json"))
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    results: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    for shape in SHAPES:
        key = f"{shape[0]}x{shape[1]}"
        results[key] = bench_shape(shape, args, device)
        ratios[key] = _ratios(results[key])
        print(f"== {key} (fwd+bwd median ms [q1, q3], up to {args.repeats} repeats)")
        for name, r in results[key].items():
            print(f"  {name:<20} {r['median_ms']:9.3f}  [{r['q1_ms']:.3f}, {r['q3_ms']:.3f}]  n={r['repeats']}")
        for name, v in ratios[key].items():
            print(f"  ratio {name:<45} {v:6.2f}")

    try:
        import torchsort  # type: ignore[import-not-found]

        ts_version = getattr(torchsort, "__version__", "installed")
    except ImportError:
        ts_version = None
    meta = {
        "torch": torch.__version__,
        "rankwise": rankwise.__version__,
        "torchsort": ts_version,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "warmup": args.warmup,
        "max_seconds_per_operator": args.max_seconds,
        "min_repeats": args.min_repeats,
        "dtype": "float32",
        "timing": "median of fwd+bwd (sum().backward()) wall-clock per call, operators interleaved",
        "regularization_strength": 1.0,
        "neural_sort_tau": 1.0,
        "blackbox_lambda": 2.0,
    }
    payload = {"meta": meta, "results": results, "ratios": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")
    return payload


if __name__ == "__main__":
    main()
