"""Where the time of a few GPU cases goes: device time, host time, kernel launches and the top kernels.

Usage (repository root, a CUDA device)::

    python benchmarks/gpu_profile.py --out $OUT/gpu_profile.json
    python benchmarks/gpu_profile.py --dry-run --out /tmp/gpu_profile_dry.json   # tiny shapes on CPU

For each case (forward + backward of one call): the median device time (CUDA events, after warm-up),
the median host time to enqueue the call (``time.perf_counter`` around the call after a
synchronization, without synchronizing after it: when it is close to the device time the case is
bound by Python and launch overhead, not by the GPU), the number of kernels launched per call and the
kernels that take most of the device time (``torch.profiler``). Cases: the isotonic soft rank (l2)
beside ``torchsort.soft_rank`` at (1, 1e3), (256, 256), (1, 1e5); SupCon beside the public
``SupConLoss`` formula (``benchmarks/losses.py``) at batch 256 and 1,024; and the Triton isotonic
projection alone at (1, 1e5) on inputs that pool into few blocks (random) and into none (gaps of 10),
forward (row cut into pieces solved in parallel, and one sequential PAV) and backward.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rankwise
from _timing import machine
from losses import supcon_reference
from ops import _torchsort
from rankwise.losses import supcon_loss


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _device_ms(fn: Callable[[], Any], dev: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync(dev)
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _host_ms(fn: Callable[[], Any], dev: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    _sync(dev)
    return statistics.median(times)


def _kernels(fn: Callable[[], Any], dev: torch.device, calls: int = 5) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    _sync(dev)
    with profile(activities=acts) as prof:
        for _ in range(calls):
            fn()
        _sync(dev)
    rows = []
    launches = 0
    for ev in prof.key_averages():
        dev_us = getattr(ev, "self_device_time_total", getattr(ev, "self_cuda_time_total", 0.0))
        if dev.type == "cuda" and dev_us <= 0:
            continue
        if dev.type == "cuda" and ev.device_type.name != "CUDA":
            continue
        launches += ev.count
        rows.append((dev_us / calls, ev.count / calls, ev.key[:90]))
    rows.sort(reverse=True)
    return {
        "kernels_per_call": launches / calls if dev.type == "cuda" else None,
        "top": [{"us_per_call": round(t, 1), "count_per_call": c, "name": k} for t, c, k in rows[:8]],
    }


def _case(name: str, fn: Callable[[], Any], dev: torch.device, repeats: int) -> dict[str, Any]:
    for _ in range(3):
        fn()
    _sync(dev)
    out = {
        "case": name,
        "device_ms": round(_device_ms(fn, dev, repeats), 4),
        "host_ms": round(_host_ms(fn, dev, repeats), 4),
    }
    try:
        out.update(_kernels(fn, dev))
    except Exception as err:  # the profiler's event fields differ between torch versions
        out.update({"kernels_per_call": None, "top": [], "profiler_error": repr(err)[:200]})
    print(
        f"{name:42s} device {out['device_ms']:9.3f} ms  host {out['host_ms']:8.3f} ms  "
        f"kernels/call {out['kernels_per_call']}",
        flush=True,
    )
    for row in out["top"][:5]:
        print(f"    {row['us_per_call']:10.1f} us  x{row['count_per_call']:.0f}  {row['name']}", flush=True)
    return out


def _fwd_bwd(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, w: torch.Tensor) -> Callable[[], Any]:
    def run() -> None:
        xi = x.detach().requires_grad_()
        (f(xi) * w).sum().backward()

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (checks the script)")
    args = ap.parse_args()
    dev = torch.device("cpu" if args.dry_run else "cuda")
    small = args.dry_run
    gen = torch.Generator(device="cpu").manual_seed(0)
    results: list[dict[str, Any]] = []
    ts = _torchsort()

    shapes = [(1, 50), (8, 16)] if small else [(1, 1000), (256, 256), (1, 100_000)]
    for rows, n in shapes:
        x = torch.randn(rows, n, generator=gen).to(dev)
        w = torch.randn(rows, n, generator=gen).to(dev)
        results.append(
            _case(f"rankwise soft_rank l2 {rows}x{n}", _fwd_bwd(rankwise.soft_rank, x, w), dev, args.repeats)
        )
        if ts is not None:
            results.append(
                _case(
                    f"torchsort soft_rank l2 {rows}x{n}",
                    _fwd_bwd(lambda t: ts.soft_rank(t, regularization="l2"), x, w),
                    dev,
                    args.repeats,
                )
            )

    for batch in [16] if small else [256, 1024]:
        feats = torch.randn(batch, 2, 128, generator=gen).to(dev)
        labels = torch.randint(0, 10, (batch,), generator=gen).to(dev)

        def sc(f: Callable[..., torch.Tensor], feats: torch.Tensor = feats, labels: torch.Tensor = labels) -> Any:
            def run() -> None:
                fi = feats.detach().requires_grad_()
                f(fi, labels).backward()

            return run

        results.append(_case(f"rankwise supcon B={batch}", sc(supcon_loss), dev, args.repeats))
        results.append(_case(f"public SupConLoss B={batch}", sc(supcon_reference), dev, args.repeats))

    # torch.compile: time per call after the first, how many graphs dynamo made, its graph breaks
    from torch._dynamo import reset as dynamo_reset
    from torch._dynamo.utils import counters

    for batch in [16] if small else [1024]:
        feats = torch.randn(batch, 2, 128, generator=gen).to(dev)
        labels = torch.randint(0, 10, (batch,), generator=gen).to(dev)
        dynamo_reset()
        counters.clear()
        compiled = torch.compile(supcon_loss)
        times = []
        for _ in range(6):
            fi = feats.detach().requires_grad_()
            _sync(dev)
            t0 = time.perf_counter()
            compiled(fi, labels).backward()
            _sync(dev)
            times.append((time.perf_counter() - t0) * 1e3)
        row = {
            "case": f"compiled supcon B={batch}",
            "call_ms": [round(t, 2) for t in times],
            "unique_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": {k[:120]: int(v) for k, v in counters["graph_break"].items()},
            "recompiles": int(counters["recompiles"].get("total", 0)) if "recompiles" in counters else None,
        }
        results.append(row)
        print(json.dumps(row)[:1500], flush=True)

    from rankwise.ops import neural_sort

    x = torch.randn(256, 256, generator=gen).to(dev)
    dynamo_reset()
    want = neural_sort(x)
    got = torch.compile(neural_sort)(x)
    row = {
        "case": "compiled neural_sort 256x256 vs eager",
        "max_abs_diff": float((got - want).abs().max()),
        "max_abs_value": float(want.abs().max()),
    }
    results.append(row)
    print(json.dumps(row), flush=True)

    if not small:
        from rankwise._kernels import triton_isotonic as tk

        n = 100_000
        w = torch.arange(n, 0, -1, dtype=torch.float32, device=dev).unsqueeze(0)
        pooled = torch.randn(1, n, generator=gen).sort(descending=True).values.to(dev)
        apart = (torch.arange(n, 0, -1, dtype=torch.float32) * 10.0).unsqueeze(0).to(dev)
        for tag, s in (("random (pools)", pooled), ("gaps of 10 (no pooling)", apart)):
            mu, state = tk.projection_forward(s, w, False)
            g = torch.randn_like(mu)
            results.append(
                _case(f"triton PAV forward 1x{n} {tag}", lambda s=s: tk.projection_forward(s, w, False), dev, 10)
            )
            results.append(
                _case(
                    f"triton PAV forward 1x{n} {tag}, one sequential PAV",
                    lambda s=s: tk.projection_forward(s, w, False, chunk=n),
                    dev,
                    10,
                )
            )
            results.append(
                _case(
                    f"triton PAV backward 1x{n} {tag}",
                    lambda s=s, g=g, state=state: tk.projection_backward(g, s, w, state, False, True, False),
                    dev,
                    10,
                )
            )
            blocks = int(state[0][0, -1]) + 1
            print(f"    blocks: {blocks}", flush=True)
            results[-1]["blocks"] = blocks

    Path(args.out).write_text(json.dumps({"machine": machine(), "results": results}, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
