"""Time of each sort-recipe relaxation's training loss (forward + backward on the scores), side by side.

The sort recipe's step = CNN forward/backward on ``B x n`` images + the relaxation's loss on the
``(B, n)`` scores. Wall times of whole steps on a shared machine (``seconds_per_step`` of the runs)
mix in the load of other jobs; this script times only the relaxation part, every relaxation once
per repeat in a random order (``_timing.time_cases``), so load hits them alike. The CNN part is
timed the same way for scale (forward + backward of ``small_cnn`` on the 2x-pooled 14 x 56 number
images, as in docs/results.md, and on the full-resolution 28 x 112 images).

    python benchmarks/sort_relaxations.py --threads 1 --out benchmarks/results/sort_relaxations.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from _timing import fwd_bwd, loadavg, machine, time_cases


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16, help="lists per step")
    ap.add_argument("--n", default="3,5,7,15")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    from rankwise.models import build_backbone
    from rankwise.recipes import load_config
    from rankwise.recipes.sorting import RELAXATIONS, sort_loss, true_permutation, true_ranks

    out: dict[str, object] = {"machine": machine(), "threads": a.threads, "batch": a.batch, "results": {}}
    for n in (int(v) for v in a.n.split(",")):
        values = torch.stack([torch.randperm(10_000)[:n] for _ in range(a.batch)]).float()
        scores = torch.randn(a.batch, n, requires_grad=True)
        p_true, ranks = true_permutation(values), true_ranks(values)
        cases = {}
        for name, r in RELAXATIONS.items():
            t = load_config(f"large_mnist_{name}", [f"task.n={n}"]).task
            if r.kind == "permutation":

                def loss(r=r, t=t, s=scores, p=p_true) -> torch.Tensor:
                    return sort_loss(r.fn(s, t), p)
            else:

                def loss(r=r, t=t, s=scores, k=ranks) -> torch.Tensor:
                    return r.fn(s, k, t)

            cases[name] = fwd_bwd(loss, scores)
        cnn, _ = build_backbone("small_cnn", in_channels=1, feature_dim=64)
        half = torch.rand(a.batch * n, 1, 14, 56)
        full = torch.rand(a.batch * n, 1, 28, 112)
        cases["(small_cnn, 14x56 images)"] = fwd_bwd(lambda cnn=cnn, x=half: cnn(x).sum(), half)
        cases["(small_cnn, 28x112 images)"] = fwd_bwd(lambda cnn=cnn, x=full: cnn(x).sum(), full)
        res = time_cases(cases, a.repeats, warmup=2)
        out["results"][f"n={n}"] = res  # type: ignore[index]
        for k, v in res.items():
            print(f"n={n:3d} {k:28s} {v['median_ms']:9.3f} ms  (q1 {v['q1_ms']:.3f}, q3 {v['q3_ms']:.3f})")
    out["load_after"] = loadavg()
    if a.out is not None:
        a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
