"""Timing helpers shared by the benchmark scripts (side-by-side medians on a shared machine).

Importing this module sets ``RANKWISE_NUMBA=sync`` (unless set): the first call of each kernel
family loads the numba kernels and waits, so that no timed call takes the torch stand-in path that
runs while the kernels load in the background (cold start is ``benchmarks/cold_start.py``'s job).
"""

from __future__ import annotations

import os
import platform
import random
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("RANKWISE_NUMBA", "sync")

Case = Callable[[], Any]


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (``uptime``), or [] where unavailable."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine() -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def time_cases(
    cases: dict[str, Case], repeats: int, *, warmup: int = 1, budget_s: float | None = None
) -> dict[str, dict[str, float]]:
    """Median / quartiles (ms) of every case; one repeat runs every case once, in a fresh random
    order, so that load from other jobs hits all of them alike. ``budget_s`` stops early (after at
    least 3 repeats) once that much time has been spent."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    start = time.perf_counter()
    for rep in range(repeats):
        order = list(cases)
        random.shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            cases[name]()
            times[name].append((time.perf_counter() - t0) * 1e3)
        if budget_s is not None and rep >= 2 and time.perf_counter() - start > budget_s:
            break
    out = {}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
        out[name] = {"median_ms": statistics.median(ts), "q1_ms": q[0], "q3_ms": q[2], "repeats": len(ts)}
    return out


def fwd_bwd(loss_fn: Callable[[], torch.Tensor], *leaves: torch.Tensor) -> Case:
    """A case that runs ``loss_fn().backward()`` after clearing the leaves' gradients."""

    def run() -> None:
        for t in leaves:
            t.grad = None
        loss_fn().backward()

    return run


def row(section: str, size: str, threads: int, ref_name: str, ref_ms: float, ours_ms: float) -> str:
    """One printed line: reference ms, rankwise ms, ratio (reference / rankwise), threads, load."""
    load = loadavg()
    return (
        f"{section:9s} {size:18s} threads={threads}  {ref_name}: {ref_ms:10.2f} ms  rankwise: {ours_ms:10.2f} ms"
        f"  ratio {ref_ms / ours_ms:6.2f}x  load {load[0] if load else float('nan'):.2f}"
    )


def status_bytes(key: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (e.g. ``VmRSS``, ``VmHWM``) in bytes."""
    m = re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    if m is None:
        raise RuntimeError(f"{key} not in /proc/self/status")
    return int(m.group(1)) * 1024


def peak_rss_growth(fn: Callable[[], Any]) -> tuple[int, float]:
    """Peak resident-set growth (bytes) of ``fn()`` above the resident set before it, and its wall time (s).

    ``VmHWM - VmRSS`` after resetting the peak (``echo 5 > /proc/self/clear_refs``); meaningful in a
    fresh process started with ``MALLOC_MMAP_THRESHOLD_`` low (e.g. 65536), so that freed blocks go
    back to the OS and the resident set follows the live tensors.
    """
    base = status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    return status_bytes("VmHWM") - base, wall


def peak_allocated_bytes(fn: Callable[[], Any]) -> int:
    """Peak of the tensor memory ``fn()`` holds at once on the CPU (bytes above what was live before it).

    Exact for tensors: every allocation and free of torch's CPU allocator during the call, taken from
    the profiler's memory events in time order (the largest running sum), independent of what
    ``malloc`` keeps or returns to the OS. Memory outside torch's allocator (Python objects, numba's
    own buffers) is not counted.
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak
