"""Retrieval losses: rankwise beside pytorch-metric-learning, forward + backward time and peak memory.

Usage::

    python benchmarks/retrieval_losses.py                       # the default grid, 1 and 2 threads
    python benchmarks/retrieval_losses.py --batches 256,512 --threads 1 --repeats 3

Every case is ``loss(embeddings, labels).backward()`` on CPU, float32, D = 128, labels of
``B / 16`` classes with 16 embeddings each (the class-balanced batches these losses are trained
with), all cases in one process and, for each ``--threads`` setting, timed side by side
(median over repeats; one repeat runs every case of a batch size once, in a fresh random order, so
that load from other jobs hits all of them alike). Peak memory is the most tensor memory a call
holds at once above what was live before it, from every allocation and free of torch's CPU allocator
during a second call of each case (after an untimed warm-up call; ``_timing.peak_allocated_bytes``):
exact for tensors, whatever ``malloc`` keeps or returns to the OS.

References: pytorch-metric-learning's ``SmoothAPLoss`` (the Smooth-AP authors' formulation: every
(query, item, item) sigmoid at once) and ``FastAPLoss``; for the Recall@k surrogate, the authors'
formulation written densely with autograd here (``authors_recall_at_k``: the (B, B, B) sigmoids of every
query, item and item, Patel et al.'s conventions as rankwise's defaults); blackbox AP is timed alone.
Those dense references hold several :math:`B^3` tensors: they stop at ``--dense-max`` (default 512).
``--before REV`` adds rankwise's Smooth-AP and Recall@k as they were at git revision ``REV`` (the module
``rankwise/losses/retrieval.py`` of that revision, loaded from ``git show``), up to ``--before-max``.
The relative difference of each value from rankwise's is recorded (``value_rel_diff``). The JSON goes
to ``benchmarks/results/retrieval_losses.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import loadavg, machine, peak_allocated_bytes
from rankwise.losses import blackbox_ap_loss, fastap_loss, recall_at_k_loss, smooth_ap_loss


def peak_mib(fn: Callable[[], Any]) -> float:
    """Warm-up call of ``fn``, then the peak tensor memory (MiB) of a second call."""
    fn()
    return peak_allocated_bytes(fn) / 2**20


def authors_recall_at_k(
    emb: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = (1, 2, 4, 8, 16), tau: float = 0.01
) -> torch.Tensor:
    """The Recall@k surrogate of Patel et al. (CVPR 2022) written densely, autograd gradient: for each query
    ``q``, item ``i`` and item ``j`` the sigmoid ``((s_qj - s_qi) / tau)`` (the query among the ranked items),
    ranks of the positives, ``min(sum_i sigmoid((k - r_i) / k), k) / min(k, |P|)`` averaged over ``ks``."""
    z = torch.nn.functional.normalize(emb, dim=1)
    s = z @ z.T
    b = s.shape[0]
    eye = torch.eye(b, dtype=torch.bool)
    pos = (labels[:, None] == labels[None, :]) & ~eye
    sig = torch.sigmoid((s[:, None, :] - s[:, :, None]) / tau)  # [q, i, j]
    rank = 1.0 + (sig * ~eye[None]).sum(2)  # (q, i): j != i
    npos = pos.sum(1)
    terms = []
    for k in ks:
        kk = float(min(k, b))
        found = (torch.sigmoid((kk - rank) / k) * pos).sum(1)
        terms.append(torch.clamp(found, max=kk) / torch.clamp(torch.clamp(npos, max=kk), min=1))
    recall = torch.stack(terms, 1).mean(1)
    valid = npos > 0
    return (1.0 - recall)[valid].mean()


def load_revision(rev: str) -> Any:
    """``rankwise.losses.retrieval`` as it was at git revision ``rev`` (a module object)."""
    root = Path(__file__).resolve().parents[1]
    src = subprocess.run(
        ["git", "show", f"{rev}:src/rankwise/losses/retrieval.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType(f"retrieval_at_{rev}")
    module.__file__ = f"{rev}:src/rankwise/losses/retrieval.py"
    sys.modules[module.__name__] = module  # (dataclasses look their module up)
    names = vars(importlib.import_module("rankwise.losses._registry"))
    register = names["register_loss"]
    names["register_loss"] = lambda *a, **k: lambda fn: fn  # its losses are registered already, by name
    try:
        exec(compile(src, module.__file__, "exec"), module.__dict__)
    finally:
        names["register_loss"] = register
    return module


def cases_for(b: int, args: argparse.Namespace, before: Any) -> tuple[dict[str, Callable[[], None]], dict[str, float]]:
    """The timed cases at batch ``b`` and the dict their runs write their loss values to."""
    from pytorch_metric_learning import losses as pml

    g = torch.Generator().manual_seed(b)
    emb = torch.randn(b, 128, generator=g).requires_grad_()
    labels = torch.arange(b // 16).repeat_interleave(16)

    values: dict[str, float] = {}

    def case(name: str, fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            emb.grad = None
            loss = fn()
            loss.backward()
            values[name] = float(loss.detach())

        return run

    fns: dict[str, Callable[[], torch.Tensor]] = {
        "rankwise.fastap_loss": lambda: fastap_loss(emb, labels),
        "pml.FastAPLoss": lambda: pml.FastAPLoss(num_bins=10)(emb, labels),
        "rankwise.blackbox_ap_loss": lambda: blackbox_ap_loss(emb, labels),
        "rankwise.smooth_ap_loss": lambda: smooth_ap_loss(emb, labels),
        "rankwise.recall_at_k_loss": lambda: recall_at_k_loss(emb, labels),
    }
    if before is not None and b <= args.before_max:
        fns["before.smooth_ap_loss"] = lambda: before.smooth_ap_loss(emb, labels)
        fns["before.recall_at_k_loss"] = lambda: before.recall_at_k_loss(emb, labels)
    if b <= args.dense_max:
        fns["pml.SmoothAPLoss"] = lambda: pml.SmoothAPLoss(temperature=0.01)(emb, labels)
        fns["authors.recall_at_k"] = lambda: authors_recall_at_k(emb, labels)
    return {name: case(name, fn) for name, fn in fns.items()}, values


def relative_differences(values: dict[str, float]) -> dict[str, float]:
    """|value - rankwise's value| / |rankwise's value| of each Smooth-AP / Recall@k case."""
    rel = {}
    for name, v in values.items():
        if "smooth" in name.lower() or "recall" in name:
            ours = values["rankwise.smooth_ap_loss" if "smooth" in name.lower() else "rankwise.recall_at_k_loss"]
            rel[name] = abs(v - ours) / max(abs(ours), 1e-12)
    return rel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="256,512,1024,2048,4096")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=20.0, help="per batch size and thread count (>= 3 repeats)")
    ap.add_argument("--min-repeats", type=int, default=3, help="repeats before --budget-s may stop a batch size")
    ap.add_argument("--dense-max", type=int, default=512, help="largest batch of the dense B^3 references")
    ap.add_argument("--before", help="git revision of rankwise to time beside (Smooth-AP and Recall@k)")
    ap.add_argument("--before-max", type=int, default=1024, help="largest batch of --before")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "retrieval_losses.json"))
    args = ap.parse_args()
    batches = [int(v) for v in args.batches.split(",")]
    before = load_revision(args.before) if args.before else None
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
            cases, values = cases_for(b, args, before)
            mems = {name: peak_mib(fn) for name, fn in cases.items()}  # (also the warm-up calls)
            rel = relative_differences(values)
            times: dict[str, list[float]] = {k: [] for k in cases}
            start = time.perf_counter()
            for rep in range(args.repeats):
                order = list(cases)
                random.shuffle(order)
                for name in order:
                    t0 = time.perf_counter()
                    cases[name]()
                    times[name].append((time.perf_counter() - t0) * 1e3)
                if rep >= args.min_repeats - 1 and time.perf_counter() - start > args.budget_s:
                    break
            for name in cases:
                mem = mems[name]
                rec: dict[str, Any] = {
                    "case": name,
                    "batch": b,
                    "threads": th,
                    "median_ms": statistics.median(times[name]),
                    "min_ms": min(times[name]),
                    "repeats": len(times[name]),
                    "peak_allocated_mib": round(mem, 1),
                    "value_rel_diff": rel.get(name),
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
