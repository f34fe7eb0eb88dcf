"""Loss benchmarks: vectorized rankwise losses vs straightforward loop implementations, side by side.

Usage::

    python benchmarks/losses.py --repeats 7 --out benchmarks/results/losses.json

CPU, one torch thread by default (``--threads``): on a shared, oversubscribed host several threads
make every case many times slower and noisier; the ratios are what matters.

Everything is timed forward + backward (median over repeats; one repeat runs every case of a section
once, in a fresh random order, so that load on a shared machine hits all of them alike):

* **RankSim** at B=256, d=512 (distinct labels): ``rankwise.losses.ranksim_loss`` vs a per-row loop
  written from the formula (for every row: cosine similarities, ``blackbox_rank`` of that row, MSE
  against the label ranks; rows summed), and the *floor*: one similarity matmul plus one row-wise
  ``torch.sort`` of the B x B matrix.
* **RnC** at B=128 and B=256 (two views, 20 distinct labels so there are ties):
  ``rankwise.losses.rnc_loss`` (O(N^2 log N)) vs the O(N^3) loop over positive columns that the
  public code uses (vectorized over anchors, one iteration per column).
* **SupCon** at B=4096, V=2, D=128: ``rankwise.losses.supcon_loss`` (default automatic blocks, which
  here are 512 anchors; ``chunk_size=512``; a single 8192-anchor block) vs the plain masked (B V)^2
  implementation.

Peak memory (SupCon): every case runs in a fresh subprocess; after the inputs are built and a small
warm-up call has loaded the kernels, the kernel's peak-RSS counter is reset (``echo 5 >
/proc/self/clear_refs``) and the peak of one forward + backward is read back as ``VmHWM - VmRSS``
(Linux). The subprocess runs with ``MALLOC_MMAP_THRESHOLD_=65536`` so that glibc serves every
allocation of 64 KiB or more with its own mapping and returns it to the OS when torch frees it:
RSS then follows the live tensor memory (``memory``). With glibc's default, dynamic threshold,
blocks of up to 32 MiB come from the heap, which keeps freed memory mapped, so the peak RSS also
counts allocator retention; those numbers are reported too (``memory_default_malloc``). As a third,
allocator-independent number the subprocess reports the bytes autograd saves for backward
(``torch.autograd.graph.saved_tensors_hooks``; a tensor saved twice is counted twice).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import rankwise
from rankwise.losses import rnc_loss, supcon_loss

Case = Callable[[], None]


# ---------------------------------------------------------------- loop / plain implementations
def ranksim_loop(features: torch.Tensor, targets: torch.Tensor, lam: float = 2.0) -> torch.Tensor:
    """RankSim from the formula, one row at a time (all rows kept: the labels are distinct)."""
    z = F.normalize(features.flatten(1), dim=1)
    y = targets.reshape(-1)
    total = features.new_zeros(())
    for i in range(z.shape[0]):
        sim_row = z[i : i + 1] @ z.T  # (1, B)
        r = rankwise.blackbox_rank(sim_row, lam, descending=True, normalize=True)
        t = rankwise.rank(-(y[i] - y).abs()[None], descending=True, normalize=True)
        total = total + F.mse_loss(r, t)
    return total


def ranksim_floor(features: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """One similarity matmul plus one row-wise sort of the B x B matrix."""
    z = F.normalize(features.flatten(1), dim=1)
    return (torch.sort(z @ z.T, dim=1).values * weights).sum()


def rnc_column_loop(features: torch.Tensor, labels: torch.Tensor, temperature: float = 2.0) -> torch.Tensor:
    """Rank-N-Contrast with one loop iteration per positive column: O(N^3) in total."""
    b, v, d = features.shape
    n = b * v
    z = features.transpose(0, 1).reshape(n, d)
    y = labels.reshape(b, -1).repeat(v, 1)
    s = -torch.cdist(z, z) / temperature
    ld = (y[:, None, :] - y[None, :, :]).abs().sum(-1)
    off = ~torch.eye(n, dtype=torch.bool, device=z.device)
    total = z.new_zeros(())
    for j in range(n):
        den = (ld >= ld[:, j : j + 1]) & off
        lse = torch.logsumexp(s.masked_fill(~den, float("-inf")), dim=1)
        total = total + ((lse - s[:, j]) * off[:, j]).sum()
    return total / (n * (n - 1))


def supcon_plain(features: torch.Tensor, labels: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    """The textbook masked (B V)^2 SupCon (every anchor is assumed to have a positive)."""
    b, v, d = features.shape
    z = F.normalize(features, dim=-1).transpose(0, 1).reshape(b * v, d)
    y = labels.repeat(v)
    logits = z @ z.T / temperature
    logits = logits - logits.max(1, keepdim=True).values.detach()
    not_self = (~torch.eye(b * v, dtype=torch.bool, device=z.device)).to(z.dtype)
    pos = (y[:, None] == y[None, :]).to(z.dtype) * not_self
    log_prob = logits - torch.log((torch.exp(logits) * not_self).sum(1, keepdim=True))
    return -((pos * log_prob).sum(1) / pos.sum(1)).mean()


# ---------------------------------------------------------------- timing helpers
def _fwd_bwd(loss_fn: Callable[[], torch.Tensor], *leaves: torch.Tensor) -> Case:
    def run() -> None:
        for t in leaves:
            t.grad = None
        loss_fn().backward()

    return run


def _time_section(cases: dict[str, Case], repeats: int, warmup: int = 1) -> dict[str, dict[str, float]]:
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    for _ in range(repeats):
        order = list(cases)
        random.shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            cases[name]()
            times[name].append((time.perf_counter() - t0) * 1e3)
    out = {}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
        out[name] = {"median_ms": statistics.median(ts), "q1_ms": q[0], "q3_ms": q[2], "repeats": len(ts)}
    return out


def bench_ranksim(repeats: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    b, d = 256, 512
    x = torch.randn(b, d, generator=g, requires_grad=True)
    y = torch.randperm(b, generator=g).float()  # distinct labels: the unique-label subset is the whole batch
    w = torch.randn(b, b, generator=g)
    gen = torch.Generator().manual_seed(1)
    ranksim = rankwise.losses.ranksim_loss
    lib = ranksim(x, y, generator=gen)
    loop = ranksim_loop(x, y)
    cases = {
        "rankwise.ranksim_loss": _fwd_bwd(lambda: ranksim(x, y, generator=gen), x),
        "rankwise.ranksim_loss(unique_labels=False)": _fwd_bwd(lambda: ranksim(x, y, unique_labels=False), x),
        "per-row loop": _fwd_bwd(lambda: ranksim_loop(x, y), x),
        "floor (matmul + row sort)": _fwd_bwd(lambda: ranksim_floor(x, w), x),
    }
    t = _time_section(cases, repeats)
    med = {k: v["median_ms"] for k, v in t.items()}
    return {
        "shape": {"B": b, "d": d},
        "times": t,
        "values_agree": bool(torch.allclose(lib, loop, rtol=1e-5, atol=1e-6)),
        "speedup_vs_loop": med["per-row loop"] / med["rankwise.ranksim_loss"],
        "ratio_to_floor": med["rankwise.ranksim_loss"] / med["floor (matmul + row sort)"],
        "targets": {"speedup_vs_loop": ">= 15 (never < 10)", "ratio_to_floor": "<= 2.5"},
    }


def bench_rnc(repeats: int, loop_repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for b in (128, 256):
        g = torch.Generator().manual_seed(b)
        x = torch.randn(b, 2, 128, generator=g, requires_grad=True)
        y = torch.randint(0, 20, (b,), generator=g).float()
        agree = bool(torch.allclose(rnc_loss(x, y), rnc_loss_loop_value(x, y), rtol=1e-4, atol=1e-5))
        fast = _time_section({"rankwise.rnc_loss": _fwd_bwd(partial(rnc_loss, x, y), x)}, repeats)
        loop = _time_section(
            {"O(N^3) column loop": _fwd_bwd(partial(rnc_column_loop, x, y), x)}, loop_repeats, warmup=0
        )
        t = {**fast, **loop}
        out[f"B={b}"] = {
            "shape": {"B": b, "V": 2, "D": 128},
            "times": t,
            "values_agree": agree,
            "speedup_vs_loop": t["O(N^3) column loop"]["median_ms"] / t["rankwise.rnc_loss"]["median_ms"],
        }
    out["targets"] = {"B=256": ">= 30", "B=128": ">= 10"}
    return out


def rnc_loss_loop_value(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return rnc_column_loop(x, y)


def bench_supcon(repeats: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    b, v, d = 4096, 2, 128
    x = torch.randn(b, v, d, generator=g, requires_grad=True)
    y = torch.randint(0, 100, (b,), generator=g)
    with torch.no_grad():
        agree = bool(torch.allclose(supcon_loss(x, y), supcon_plain(x, y), rtol=1e-4, atol=1e-5))
        agree_chunk = bool(torch.allclose(supcon_loss(x, y, chunk_size=512), supcon_loss(x, y), rtol=1e-5))
    cases = {
        "rankwise.supcon_loss": _fwd_bwd(lambda: supcon_loss(x, y), x),
        "rankwise.supcon_loss(chunk_size=512)": _fwd_bwd(lambda: supcon_loss(x, y, chunk_size=512), x),
        "rankwise.supcon_loss(one block)": _fwd_bwd(lambda: supcon_loss(x, y, chunk_size=b * v), x),
        "plain masked (BV)^2": _fwd_bwd(lambda: supcon_plain(x, y), x),
    }
    t = _time_section(cases, repeats)
    med = {k: val["median_ms"] for k, val in t.items()}
    names = ("plain", "rankwise", "rankwise_chunk512")
    mem = {name: _memory_subprocess(name, force_mmap=True) for name in names}
    mem_default = {name: _memory_subprocess(name, force_mmap=False) for name in names}
    return {
        "shape": {"B": b, "V": v, "D": d},
        "times": t,
        "values_agree": agree,
        "chunked_agrees": agree_chunk,
        "time_ratio_rankwise_over_plain": med["rankwise.supcon_loss"] / med["plain masked (BV)^2"],
        "time_ratio_chunked_over_plain": med["rankwise.supcon_loss(chunk_size=512)"] / med["plain masked (BV)^2"],
        "time_ratio_one_block_over_plain": med["rankwise.supcon_loss(one block)"] / med["plain masked (BV)^2"],
        "memory": mem,
        "peak_ratio_chunked_over_plain": mem["rankwise_chunk512"]["peak_rss_bytes"] / mem["plain"]["peak_rss_bytes"],
        "peak_ratio_rankwise_over_plain": mem["rankwise"]["peak_rss_bytes"] / mem["plain"]["peak_rss_bytes"],
        "saved_ratio_chunked_over_plain": mem["rankwise_chunk512"]["saved_for_backward_MiB"]
        / mem["plain"]["saved_for_backward_MiB"],
        "memory_default_malloc": mem_default,
        "peak_ratio_chunked_over_plain_default_malloc": mem_default["rankwise_chunk512"]["peak_rss_bytes"]
        / mem_default["plain"]["peak_rss_bytes"],
        "targets": {"time_ratio_rankwise_over_plain": "<= 1", "peak_ratio_chunked_over_plain": "<= 0.25"},
    }


# ---------------------------------------------------------------- memory (runs in a subprocess)
def _status_bytes(key: str) -> int:
    txt = Path("/proc/self/status").read_text()
    m = re.search(rf"{key}:\s+(\d+) kB", txt)
    if m is None:
        raise RuntimeError(f"{key} not in /proc/self/status")
    return int(m.group(1)) * 1024


def _memory_child(case: str) -> dict[str, Any]:
    fns: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "plain": supcon_plain,
        "rankwise": lambda f, lab: supcon_loss(f, lab),
        "rankwise_chunk512": lambda f, lab: supcon_loss(f, lab, chunk_size=512),
    }
    fn = fns[case]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 2, 128, generator=g, requires_grad=True)
    y = torch.randint(0, 100, (4096,), generator=g)
    fn(x[:64], y[:64]).backward()  # load kernels, allocate small buffers
    x.grad = torch.zeros_like(x)
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    base = _status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM (peak RSS) to the current RSS
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(x, y)
    loss.backward()
    peak = _status_bytes("VmHWM") - base
    return {"peak_rss_bytes": peak, "peak_rss_MiB": peak / 2**20, "saved_for_backward_MiB": saved / 2**20}


def _memory_subprocess(case: str, *, force_mmap: bool) -> dict[str, Any]:
    env = dict(os.environ)
    if force_mmap:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    else:
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
    cmd = [sys.executable, __file__, "--memory-child", case, "--threads", str(torch.get_num_threads())]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1]
    result: dict[str, Any] = json.loads(line)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per case (median reported)")
    p.add_argument("--loop-repeats", type=int, default=3, help="repeats of the slow O(N^3) RnC loop")
    p.add_argument("--only", choices=["ranksim", "rnc", "supcon"], action="append", help="run only these sections")
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 avoids oversubscription on shared hosts)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "losses.json")
    p.add_argument("--memory-child", choices=["plain", "rankwise", "rankwise_chunk512"], help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_child:
        print(json.dumps(_memory_child(args.memory_child)))
        return
    random.seed(args.seed)
    sections = args.only or ["ranksim", "rnc", "supcon"]
    result: dict[str, Any] = {
        "device": "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "repeats": args.repeats,
    }
    if "ranksim" in sections:
        result["ranksim"] = bench_ranksim(args.repeats)
        print("ranksim", json.dumps({k: v for k, v in result["ranksim"].items() if k != "times"}), flush=True)
    if "rnc" in sections:
        result["rnc"] = bench_rnc(args.repeats, args.loop_repeats)
        print(
            "rnc",
            json.dumps({k: v.get("speedup_vs_loop") for k, v in result["rnc"].items() if k != "targets"}),
            flush=True,
        )
    if "supcon" in sections:
        result["supcon"] = bench_supcon(args.repeats)
        print("supcon", json.dumps({k: v for k, v in result["supcon"].items() if k not in ("times",)}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
