"""Retrieval losses: rankwise beside pytorch-metric-learning, forward + backward time and peak memory.

Usage::

    python benchmarks/retrieval_losses.py                       # the default grid, 1 and 2 threads
    python benchmarks/retrieval_losses.py --batches 256,512 --threads 1 --repeats 3

Every case is ``loss(embeddings, labels).backward()`` on CPU, float32, D = 128, labels of
``B / 16`` classes with 16 embeddings each (the class-balanced batches these losses are trained
with), all cases in one process and, for each ``--threads`` setting, timed side by side
(median over repeats; one repeat runs every case of a batch size once, in a fresh random order, so
that load from other jobs hits all of them alike). Peak memory is the largest resident-set growth
(``/proc/self/statm``, sampled every millisecond by a thread) above the resident set before the
call, measured on the first (warm-up) call of each case: an approximation (the allocator may reuse memory that the
process already holds), comparable between cases of one run.

References: pytorch-metric-learning's ``SmoothAPLoss`` and ``FastAPLoss`` (it has neither blackbox
AP nor the Recall@k surrogate, so those two are timed alone). Smooth-AP and Recall@k cost
:math:`O(B^3)` sigmoids: their batches stop at ``--cubic-max`` (default 512), and
pytorch-metric-learning's Smooth-AP, which also holds several :math:`B^3` tensors at once, at
``--pml-smooth-ap-max`` (default 512). The JSON goes to ``benchmarks/results/retrieval_losses.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import loadavg, machine
from rankwise.losses import blackbox_ap_loss, fastap_loss, recall_at_k_loss, smooth_ap_loss

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def peak_mib(fn: Callable[[], Any]) -> float:
    """Largest resident-set growth (MiB) above the level before ``fn()``, sampled every millisecond."""
    base = _rss()
    peak = [base]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        fn()
    finally:
        done.set()
        t.join()
    peak[0] = max(peak[0], _rss())
    return (peak[0] - base) / 2**20


def cases_for(b: int, args: argparse.Namespace) -> dict[str, Callable[[], None]]:
    from pytorch_metric_learning import losses as pml

    g = torch.Generator().manual_seed(b)
    emb = torch.randn(b, 128, generator=g).requires_grad_()
    labels = torch.arange(b // 16).repeat_interleave(16)

    def case(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            emb.grad = None
            fn().backward()

        return run

    out: dict[str, Callable[[], None]] = {
        "rankwise.fastap_loss": case(lambda: fastap_loss(emb, labels)),
        "pml.FastAPLoss": case(lambda: pml.FastAPLoss(num_bins=10)(emb, labels)),
        "rankwise.blackbox_ap_loss": case(lambda: blackbox_ap_loss(emb, labels)),
    }
    if b <= args.cubic_max:
        out["rankwise.smooth_ap_loss"] = case(lambda: smooth_ap_loss(emb, labels))
        out["rankwise.recall_at_k_loss"] = case(lambda: recall_at_k_loss(emb, labels))
    if b <= args.pml_smooth_ap_max:
        out["pml.SmoothAPLoss"] = case(lambda: pml.SmoothAPLoss(temperature=0.01)(emb, labels))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="256,512,1024,2048,4096")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=20.0, help="per batch size and thread count (>= 3 repeats)")
    ap.add_argument("--cubic-max", type=int, default=512)
    ap.add_argument("--pml-smooth-ap-max", type=int, default=512)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "retrieval_losses.json"))
    args = ap.parse_args()
    batches = [int(v) for v in args.batches.split(",")]
    threads = [int(v) for v in args.threads.split(",")]
    result: dict[str, Any] = {
        "machine": machine(),
        "note": "CPU shared with other jobs (load averages recorded); float32, D=128, 16 embeddings per class",
        "load_before": loadavg(),
        "settings": vars(args),
        "cases": [],
    }
    for th in threads:
        torch.set_num_threads(th)
        for b in batches:
            cases = cases_for(b, args)
            mems = {name: peak_mib(fn) for name, fn in cases.items()}  # (also the warm-up call)
            times: dict[str, list[float]] = {k: [] for k in cases}
            start = time.perf_counter()
            for rep in range(args.repeats):
                order = list(cases)
                random.shuffle(order)
                for name in order:
                    t0 = time.perf_counter()
                    cases[name]()
                    times[name].append((time.perf_counter() - t0) * 1e3)
                if rep >= 2 and time.perf_counter() - start > args.budget_s:
                    break
            for name in cases:
                mem = mems[name]
                rec = {
                    "case": name,
                    "batch": b,
                    "threads": th,
                    "median_ms": statistics.median(times[name]),
                    "min_ms": min(times[name]),
                    "repeats": len(times[name]),
                    "peak_rss_growth_mib": round(mem, 1),
                    "load": loadavg(),
                }
                result["cases"].append(rec)
                print(
                    f"threads={th} B={b:5d} {name:28s} {rec['median_ms']:10.1f} ms  peak +{mem:8.1f} MiB"
                    f"  (n={rec['repeats']}, load {rec['load'][0] if rec['load'] else float('nan')})",
                    flush=True,
                )
    result["load_after"] = loadavg()
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
