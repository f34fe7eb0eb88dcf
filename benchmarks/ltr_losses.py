"""Learning-to-rank losses: rankwise beside allRank 1.4.3, forward + backward time and peak memory.

Usage::

    python benchmarks/ltr_losses.py                      # the full grid, 1 and 2 threads
    python benchmarks/ltr_losses.py --quick              # a few losses, n = 10 and 100, B = 256 and 1024
    python benchmarks/ltr_losses.py --lengths 1000 --threads 1   # one part of the grid (merged into the JSON)

Every case is ``loss(y_pred, y_true).backward()`` on CPU, float32, on ``B`` lists of ``n`` slots:
scores ``randn``, labels ``0..4``, each list of random length between ``n / 2`` and ``n`` padded at
the end with ``y_true = -1`` (allRank's convention). For each list length ``n``, batch ``B`` and
thread count, every case is timed in this one process side by side with the others (median over
repeats after one warm-up call; one repeat runs every case once, in a fresh random order, so that
load from other jobs hits all of them alike). ``ratio`` = allRank / rankwise (how many times faster
rankwise is).

Peak memory is measured in a fresh subprocess per ``(n, B)`` (1 thread, ``MALLOC_MMAP_THRESHOLD_``
low so that freed blocks return to the OS): the growth of the resident set (``VmHWM`` after a reset
minus ``VmRSS`` before) over one forward + backward after a small warm-up call, case after case.
The same subprocess times that single call. A case is dropped at a ``(n, B)`` when the peak
predicted from the previous batch (linear in ``B``; the first batch is predicted from a probe at
``--probe-batch``) exceeds ``--memory-limit-mib``, when the predicted single call exceeds four times
``--budget-call-s``, or when the measured single call exceeds ``--budget-call-s``; the JSON records
every drop and its reason.

Cases: every learning-to-rank loss of ``rankwise.losses`` (``listnet``, ``listmle``, ``ranknet``,
``lambda_loss`` with each weighing scheme, ``approx_ndcg``, ``neural_ndcg`` deterministic and
stochastic, ``pirank_ndcg``) beside allRank's function of the same name and options (PiRank has no
allRank counterpart and is timed alone). The JSON goes to ``benchmarks/results/ltr_losses.json``;
a run replaces the entries of the ``(n, B, threads)`` it measured and keeps the others.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import loadavg, machine, peak_rss_growth, time_cases
from rankwise.losses import (
    WEIGHING_SCHEMES,
    approx_ndcg_loss,
    lambda_loss,
    listmle_loss,
    listnet_loss,
    neural_ndcg_loss,
    pirank_ndcg_loss,
    ranknet_loss,
)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _allrank() -> Any:
    """allRank's loss package; what its modules import without using (``gcsfs``; ``Requirement`` of
    ``pkg_resources`` on new setuptools) is stubbed."""
    for name, attrs in (
        ("gcsfs", {"GCSFileSystem": object}),
        ("pkg_resources", {"Requirement": object, "resource_filename": lambda *a: ""}),
    ):
        try:
            module = importlib.import_module(name)
        except ImportError:
            module = sys.modules[name] = types.ModuleType(name)
        for key, value in attrs.items():
            if not hasattr(module, key):
                setattr(module, key, value)
    return importlib.import_module("allrank.models.losses")


def loss_pairs() -> dict[str, tuple[LossFn, LossFn | None]]:
    """name -> (rankwise, allRank or None), with the same options."""
    ar = _allrank()
    pairs: dict[str, tuple[LossFn, LossFn | None]] = {
        "listnet": (listnet_loss, ar.listNet),
        "listmle": (listmle_loss, ar.listMLE),
        "ranknet": (ranknet_loss, ar.rankNet),
    }
    for scheme in (None, *WEIGHING_SCHEMES):
        name = "lambda_loss" if scheme is None else f"lambda_loss.{scheme.removesuffix('_scheme')}"
        pairs[name] = (
            lambda p, t, s=scheme: lambda_loss(p, t, weighing_scheme=s),
            lambda p, t, s=scheme: ar.lambdaLoss(p, t, weighing_scheme=s),
        )
    pairs["approx_ndcg"] = (approx_ndcg_loss, ar.approxNDCGLoss)
    pairs["neural_ndcg"] = (neural_ndcg_loss, ar.neuralNDCG)
    pairs["neural_ndcg.stochastic"] = (
        lambda p, t: neural_ndcg_loss(p, t, stochastic=True),
        lambda p, t: ar.neuralNDCG(p, t, stochastic=True),
    )
    pairs["pirank_ndcg"] = (pirank_ndcg_loss, None)
    return pairs


QUICK_LOSSES = ("listnet", "listmle", "ranknet", "lambda_loss.ndcgLoss2PP", "approx_ndcg", "neural_ndcg", "pirank_ndcg")


def cases(losses: list[str]) -> dict[str, LossFn]:
    """Case name (``rankwise.<loss>`` / ``allrank.<loss>``) -> loss function."""
    out: dict[str, LossFn] = {}
    pairs = loss_pairs()
    for name in losses:
        ours, ref = pairs[name]
        out[f"rankwise.{name}"] = ours
        if ref is not None:
            out[f"allrank.{name}"] = ref
    return out


def inputs(b: int, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``B`` lists of ``n`` slots, random lengths in ``[n / 2, n]``, padded at the end with -1."""
    g = torch.Generator().manual_seed(seed * 100_003 + b * 7 + n)
    y_pred = torch.randn(b, n, generator=g)
    y_true = torch.randint(0, 5, (b, n), generator=g).float()
    lengths = torch.randint(max(1, n // 2), n + 1, (b, 1), generator=g)
    y_true = torch.where(torch.arange(n)[None, :] < lengths, y_true, -1.0)
    return y_pred.requires_grad_(), y_true


def _fwd_bwd(fn: LossFn, y_pred: torch.Tensor, y_true: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        y_pred.grad = None
        fn(y_pred, y_true).backward()

    return run


# ---------------------------------------------------------------- memory (in a fresh subprocess)
def _memory_child(n: int, b: int, names: list[str]) -> dict[str, Any]:
    """Peak RSS growth (MiB) and wall time (s) of one forward + backward of each case at (n, B)."""
    fns = cases(sorted({nm.split(".", 1)[1] for nm in names}))
    warm_p, warm_t = inputs(8, n, seed=1)
    out: dict[str, Any] = {}
    for name in names:
        torch.manual_seed(0)
        _fwd_bwd(fns[name], warm_p, warm_t)()  # load kernels, allocate small buffers
        y_pred, y_true = inputs(b, n)
        peak, wall = peak_rss_growth(_fwd_bwd(fns[name], y_pred, y_true))
        out[name] = {"peak_rss_MiB": round(peak / 2**20, 1), "single_call_s": round(wall, 4)}
        del y_pred, y_true
    return out


def measure_memory(n: int, b: int, names: list[str]) -> dict[str, Any]:
    if not names:
        return {}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, __file__, "--memory-child", json.dumps({"n": n, "b": b, "names": names})]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"memory child n={n} B={b} failed:\n{res.stderr[-2000:]}")
    return json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])


# ---------------------------------------------------------------- the grid
def run_length(
    n: int, args: argparse.Namespace, names: list[str], result: dict[str, Any], thread_counts: list[int]
) -> None:
    fns = cases(sorted({nm.split(".", 1)[1] for nm in names}))
    # a probe batch first (not timed): predicts the first batch's memory and time
    last = {"batch": args.probe_batch, **measure_memory(n, args.probe_batch, names)}
    result["probes"][f"n={n}"] = last
    alive = list(names)
    for b in args.batches:
        key = f"n={n}|B={b}"
        dropped: dict[str, str] = {}
        candidates = []
        for name in alive:
            prev = last[name]
            scale = b / last["batch"]
            pred_mib, pred_s = prev["peak_rss_MiB"] * scale, prev["single_call_s"] * scale
            if pred_mib > args.memory_limit_mib:
                dropped[name] = (
                    f"memory: predicted peak {pred_mib:.0f} MiB > {args.memory_limit_mib} MiB "
                    f"(linear in B from {prev['peak_rss_MiB']:.0f} MiB at B={last['batch']})"
                )
            elif pred_s > 4 * args.budget_call_s:
                dropped[name] = (
                    f"time: predicted single call {pred_s:.1f} s > 4 x {args.budget_call_s} s "
                    f"(linear in B from {prev['single_call_s']:.2f} s at B={last['batch']})"
                )
            else:
                candidates.append(name)
        mem = measure_memory(n, b, candidates)
        timed = []
        for name in candidates:
            if mem[name]["single_call_s"] > args.budget_call_s:
                dropped[name] = (
                    f"time: single call {mem[name]['single_call_s']:.2f} s > {args.budget_call_s} s (1 thread)"
                )
            else:
                timed.append(name)
        # once dropped, larger batches are dropped too (memory and time grow with B)
        alive = [nm for nm in alive if nm not in dropped]
        last = {"batch": b, **mem}
        entry: dict[str, Any] = {"n": n, "B": b, "memory_1thread": mem, "dropped": dropped, "threads": {}}
        y_pred, y_true = inputs(b, n)
        with torch.no_grad():
            agree = {}
            for loss in sorted({nm.split(".", 1)[1] for nm in timed}):
                if f"allrank.{loss}" in timed and f"rankwise.{loss}" in timed:
                    vals = []
                    for side in ("rankwise", "allrank"):
                        torch.manual_seed(0)
                        vals.append(float(fns[f"{side}.{loss}"](y_pred, y_true)))
                    agree[loss] = abs(vals[0] - vals[1]) / max(abs(vals[1]), 1e-12)
            entry["relative_value_difference"] = agree
        for threads in thread_counts:
            torch.set_num_threads(threads)
            load0 = loadavg()
            t = time_cases(
                {nm: _fwd_bwd(fns[nm], y_pred, y_true) for nm in timed}, args.repeats, budget_s=args.budget_s
            )
            ratios = {}
            for nm in timed:
                loss = nm.split(".", 1)[1]
                if nm.startswith("rankwise.") and f"allrank.{loss}" in t:
                    ratios[loss] = t[f"allrank.{loss}"]["median_ms"] / t[nm]["median_ms"]
            entry["threads"][str(threads)] = {
                "times": t,
                "ratio_allrank_over_rankwise": ratios,
                "loadavg": [load0, loadavg()],
            }
            for loss, r in sorted(ratios.items()):
                ref_ms, ours_ms = t[f"allrank.{loss}"]["median_ms"], t[f"rankwise.{loss}"]["median_ms"]
                ref_mib, ours_mib = mem[f"allrank.{loss}"]["peak_rss_MiB"], mem[f"rankwise.{loss}"]["peak_rss_MiB"]
                print(
                    f"n={n:5d} B={b:5d} threads={threads} {loss:32s} allRank {ref_ms:9.2f} ms"
                    f"  rankwise {ours_ms:9.2f} ms  ratio {r:6.2f}x  peak MiB {ref_mib:7.1f} / {ours_mib:7.1f}"
                    f"  load {load0[0] if load0 else float('nan')}",
                    flush=True,
                )
            for nm in timed:
                if nm.startswith("rankwise.") and nm.split(".", 1)[1] not in ratios:
                    print(f"n={n:5d} B={b:5d} threads={threads} {nm:41s} {t[nm]['median_ms']:9.2f} ms (alone)")
        for name, why in dropped.items():
            print(f"n={n:5d} B={b:5d} dropped {name}: {why}", flush=True)
        result["grid"][key] = entry
        # keep the file current (a long run can be stopped and its measured part kept)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few losses, n = 10 and 100, B = 256 and 1024, 1 thread")
    p.add_argument("--losses", help="comma-separated loss names (default: all)")
    p.add_argument("--lengths", default="10,100,1000")
    p.add_argument("--batches", default="256,512,1024,2048,4096")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--budget-s", type=float, default=12.0, help="per (n, B, threads): stop repeating (>= 3 repeats)")
    p.add_argument("--budget-call-s", type=float, default=2.0, help="drop a case whose single call takes longer")
    p.add_argument("--memory-limit-mib", type=float, default=4096.0, help="drop a case predicted to need more")
    p.add_argument("--probe-batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "ltr_losses.json")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_child:
        torch.set_num_threads(1)
        spec = json.loads(args.memory_child)
        print(json.dumps(_memory_child(spec["n"], spec["b"], spec["names"])))
        return
    if args.quick:
        args.losses = args.losses or ",".join(QUICK_LOSSES)
        args.lengths, args.batches, args.threads, args.repeats = "10,100", "256,1024", "1", 3
        if args.out == p.get_default("out"):
            args.out = args.out.with_name("ltr_losses_quick.json")
    random.seed(args.seed)
    losses = args.losses.split(",") if args.losses else list(loss_pairs())
    names = list(cases(losses))
    args.batches = [int(v) for v in args.batches.split(",")]
    thread_counts = [int(v) for v in args.threads.split(",")]
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.setdefault("grid", {})
    result.setdefault("probes", {})
    result["machine"] = {**machine(), "device": "cpu", "dtype": "float32"}
    result["note"] = (
        "CPU shared with other jobs (load averages recorded per case); ratio = allRank / rankwise median, "
        "both measured in one process, cases interleaved in random order per repeat"
    )
    result["settings"] = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "memory_child"
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for n in [int(v) for v in args.lengths.split(",")]:
        run_length(n, args, names, result, thread_counts)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
