"""Training step of a small model with each main loss: ``torch.compile`` against eager (CPU).

Usage::

    python benchmarks/compile.py                     # every loss, 1 and 2 threads
    python benchmarks/compile.py --losses supcon,rnc --threads 1 --repeats 10

A two-layer MLP (64 -> 128 -> 32) embeds a batch of 256 inputs (two views for the contrastive
losses); one step is forward, loss, backward and an SGD update. The same step is timed eagerly and with
the model and loss compiled (``torch.compile(forward, fullgraph=True)``, default inductor backend,
which compiles the backward too; the update stays eager; the first call's time, compilation
included, is reported separately), median over repeats after warm-up, both in one process, for
each ``--threads`` setting. Each line gives eager ms, compiled ms and their ratio (eager / compiled:
above 1 means compiling pays). JSON: ``benchmarks/results/compile.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

import rankwise
from _timing import loadavg, machine, time_cases
from rankwise import losses

B, D_IN, D_HID, D_OUT = 256, 64, 128, 32


def _loss_fns() -> dict[str, Any]:
    return {
        "supcon": lambda z, y: losses.supcon_loss(z, y),
        "rnc": lambda z, y: losses.rnc_loss(z, y),
        "ranksim": lambda z, y: losses.ranksim_loss(z[:, 0], y),
        "spearman_isotonic": lambda z, y: losses.spearman_loss(z[:, 0, 0], y, ranker="isotonic"),
        "soft_rank_isotonic": lambda z, y: (rankwise.soft_rank(z[:, 0], method="isotonic") ** 2).mean(),
    }


def _forward(model: torch.nn.Module, loss_fn: Any) -> Any:
    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = model(x.reshape(-1, D_IN)).reshape(x.shape[0], x.shape[1], D_OUT)
        out: torch.Tensor = loss_fn(z, y)
        return out

    return forward


def _step(model: torch.nn.Module, forward: Any, lr: float = 1e-3) -> Any:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = forward(x, y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.sub_(p.grad, alpha=lr)
                    p.grad = None
        return loss.detach()

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--losses", default=",".join(_loss_fns()), help="comma-separated losses")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts (default 1,2)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "compile.json"))
    args = ap.parse_args()
    fns = _loss_fns()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, 2, D_IN, generator=g)
    y = torch.randint(0, 20, (B,), generator=g).float()
    results: dict[str, Any] = {"machine": machine(), "load_before": loadavg(), "cases": []}
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for name in args.losses.split(","):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(D_IN, D_HID), torch.nn.ReLU(), torch.nn.Linear(D_HID, D_OUT))
            fwd = _forward(model, fns[name])
            step = _step(model, fwd)
            torch._dynamo.reset()
            compiled = _step(model, torch.compile(fwd, fullgraph=True))
            t0 = time.perf_counter()
            compiled(x, y)
            compile_s = time.perf_counter() - t0
            timing = time_cases(
                {"eager": lambda step=step: step(x, y), "compiled": lambda c=compiled: c(x, y)},
                args.repeats,
                warmup=2,
            )
            eager, comp = timing["eager"]["median_ms"], timing["compiled"]["median_ms"]
            load = loadavg()
            print(
                f"{name:20s} threads={threads}  eager: {eager:8.2f} ms  compiled: {comp:8.2f} ms  "
                f"ratio {eager / comp:5.2f}x  compile {compile_s:6.1f} s  load {load[0] if load else float('nan'):.2f}",
                flush=True,
            )
            results["cases"].append(
                {"loss": name, "threads": threads, "compile_s": compile_s, "timing": timing, "load": load}
            )
    results["load_after"] = loadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
