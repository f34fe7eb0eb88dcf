"""Isotonic soft rank / soft sort: rankwise against torchsort, side by side (CPU, float32).

Usage::

    python benchmarks/isotonic.py                   # every shape, l2 and kl, 1 and 2 threads
    python benchmarks/isotonic.py --threads 2 --shapes 256x256
    python benchmarks/isotonic.py --markdown benchmarks/results/isotonic_soft_rank.json   # docs table

For every shape (rows x n) and regularization, ``rankwise.soft_rank(x, method="isotonic")`` and
``torchsort.soft_rank(x)`` (and the same for ``soft_sort``) are timed forward + backward on the
same input (strength 1.0 on standard-normal rows), median over repeats, one repeat running every
case once in a fresh random order, for each ``--threads`` setting in the same process. Each printed
line gives torchsort's time, rankwise's time, their ratio (torchsort / rankwise: above 1 means
rankwise is faster), the thread count and the 1-minute load average; the JSON
(``benchmarks/results/isotonic.json``) holds everything. torchsort is a reference only (built from
source on this machine); without it the script exits.

(The other operators, and the isotonic ops among them, are in ``benchmarks/ops.py``.)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import rankwise
from _tables import load_range, provenance, ratio, read, size
from _timing import fwd_bwd, loadavg, machine, row, time_cases

SHAPES = "1x100,1x1000,1x10000,1x100000,256x256,64x4096,4096x64"


def markdown(result: dict[str, Any]) -> str:
    """The docs table of a result: ratio torchsort / rankwise per op and shape, l2 / kl, per thread count."""
    res = result["results"]
    threads = sorted({r["threads"] for r in res.values()})
    cases: dict[tuple[str, tuple[int, int]], dict[tuple[int, str], float]] = {}
    for r in res.values():
        cases.setdefault((r["op"], tuple(r["shape"])), {})[(r["threads"], r["regularization"])] = r["ratio"]
    regs = list(dict.fromkeys(r["regularization"] for r in res.values()))
    head = " | ".join(f"{t} thread" + ("s" if t != 1 else "") for t in threads)
    lines = [
        f"Ratio = torchsort's time / rankwise's ({' / '.join(regs)}); above 1, rankwise is faster.",
        "",
        f"| case | ratio against | {head} |",
        "|---|---|" + "---|" * len(threads),
    ]
    for (op, (rows, n)), by in cases.items():
        cells = [" / ".join(ratio(by.get((t, g))) for g in regs) for t in threads]
        lines.append(f"| isotonic `{op}` {' / '.join(regs)}, {size(rows, n)} | torchsort | " + " | ".join(cells) + " |")
    loads = [result.get("loadavg_start"), result.get("loadavg_end"), *(r.get("loadavg") for r in res.values())]
    lines += [
        "",
        provenance(
            "isotonic.py",
            commit=result.get("commit"),
            date=result.get("date"),
            machine=result,
            load=load_range(*loads),
            threads=" and ".join(map(str, threads)),
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts (default 1,2)")
    p.add_argument("--shapes", default=SHAPES, help=f"comma-separated ROWSxN (default {SHAPES})")
    p.add_argument("--ops", default="soft_rank,soft_sort")
    p.add_argument("--regularizations", default="l2,kl")
    p.add_argument("--repeats", type=int, default=25, help="timed repeats (fewer for large shapes)")
    p.add_argument("--budget-s", type=float, default=20.0, help="stop repeating a case group after this long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "isotonic.json")
    p.add_argument("--markdown", type=Path, default=None, help="print the docs table of this result JSON and stop")
    args = p.parse_args()
    if args.markdown is not None:
        print(markdown(read(args.markdown)))
        return
    try:
        import torchsort  # type: ignore[import-not-found]
    except ImportError:
        sys.exit("torchsort is not installed: nothing to compare with")
    random.seed(args.seed)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    result: dict[str, Any] = {"device": "cpu", **machine(), "loadavg_start": loadavg(), "results": {}}
    for threads in (int(v) for v in args.threads.split(",")):
        torch.set_num_threads(threads)
        for rows, n in shapes:
            x = torch.randn(rows, n, generator=torch.Generator().manual_seed(rows * n)).requires_grad_()
            repeats = max(5, min(args.repeats, int(args.repeats * 65536 / (rows * n)) or 1))
            for op in args.ops.split(","):
                for reg in args.regularizations.split(","):
                    ours_fn = getattr(rankwise, op)
                    ref_fn = getattr(torchsort, op)

                    def ours(x=x, fn=ours_fn, reg=reg) -> torch.Tensor:
                        return (fn(x, method="isotonic", regularization=reg) ** 2).sum()

                    def ref(x=x, fn=ref_fn, reg=reg) -> torch.Tensor:
                        return (fn(x, regularization=reg) ** 2).sum()

                    with torch.no_grad():
                        agree = bool(torch.allclose(ours(), ref(), rtol=1e-4))
                    t = time_cases(
                        {"torchsort": fwd_bwd(ref, x), "rankwise": fwd_bwd(ours, x)}, repeats, budget_s=args.budget_s
                    )
                    ts, rw = t["torchsort"]["median_ms"], t["rankwise"]["median_ms"]
                    print(row(f"{op}", f"{rows}x{n} {reg}", threads, "torchsort", ts, rw), flush=True)
                    result["results"][f"threads={threads} {op} {reg} {rows}x{n}"] = {
                        "threads": threads,
                        "op": op,
                        "regularization": reg,
                        "shape": [rows, n],
                        "times": t,
                        "ratio": ts / rw,
                        "values_agree": agree,
                        "loadavg": loadavg(),
                    }
    result["loadavg_end"] = loadavg()
    result["target"] = "ratio >= 1 at every shape, 1 and 2 threads"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
