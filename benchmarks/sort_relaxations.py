"""Time of each sort-recipe relaxation's training loss (forward + backward on the scores), side by side.

The sort recipe's step = CNN forward/backward on ``B x n`` images + the relaxation's loss on the
``(B, n)`` scores. Wall times of whole steps on a shared machine (``seconds_per_step`` of the runs)
mix in the load of other jobs; this script times only the relaxation part, every relaxation once
per repeat in a random order (``_timing.time_cases``), so load hits them alike. The CNN part is
timed the same way for scale (forward + backward of ``small_cnn`` on the 2x-pooled 14 x 56 number
images, as in docs/results.md, and on the full-resolution 28 x 112 images). Gumbel-Sinkhorn
(Mena et al., ICLR 2018; ``rankwise.gumbel_sinkhorn``) takes an ``n x n`` assignment score matrix,
not the ``n`` scores the sort recipe's relaxations take, so it is not one of them; its row times the
op on ``X[b, i, j] = c_i s[b, j]`` (``c`` = ``linspace(1, -1, n)``: the largest score prefers position
0) at its defaults (temperature 1, 20 iterations, noise 1, one sample) under the same loss as the
permutation relaxations.

    python benchmarks/sort_relaxations.py --threads 1 --out benchmarks/results/sort_relaxations.json
    python benchmarks/sort_relaxations.py --markdown benchmarks/results/sort_relaxations.json  # docs table
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
from pathlib import Path

import torch

from _timing import fwd_bwd, loadavg, machine, time_cases

#: column labels of the docs table (docs/results.md), in its order
LABELS = {
    "neuralsort": "NeuralSort",
    "stochastic": "stochastic",
    "softsort": "SoftSort",
    "diffsort_odd_even": "odd-even",
    "diffsort_bitonic": "bitonic",
    "sinkhorn": "Sinkhorn",
    "isotonic": "isotonic",
    "lapsum": "LapSum",
    "perturbed": "perturbed",
    "(gumbel_sinkhorn op)": "Gumbel-Sinkhorn (op)",
    "(small_cnn, 14x56 images)": "CNN 14x56",
    "(small_cnn, 28x112 images)": "CNN 28x112",
}


def markdown(path: Path) -> str:
    """The docs table of a JSON this script wrote: median ms per n and case, with its provenance line."""
    data = json.loads(path.read_text())
    first = next(iter(data["results"].values()))
    names = [k for k in LABELS if k in first] + [k for k in first if k not in LABELS]
    lines = ["| n | " + " | ".join(LABELS.get(k, k) for k in names) + " |", "|---" * (len(names) + 1) + "|"]
    for key, res in data["results"].items():
        cells = []
        for k in names:
            v = res[k]["median_ms"] if k in res else None
            cells.append("–" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}")
        lines.append(f"| {key.removeprefix('n=')} | " + " | ".join(cells) + " |")
    load = "-".join(f"{x[0]:.1f}" for x in (data["load_before"], data["load_after"]))
    threads = f"{data['threads']} thread" + ("s" if data["threads"] != 1 else "")
    lines += [
        "",
        f"*Numbers recorded in rankwise commit `{data['commit'][:7]}` ({data['date'][:10]}, {threads}, "
        f"1-minute load average {load}); torch {data['machine']['torch']}.*",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16, help="lists per step")
    ap.add_argument("--n", default="3,5,7,15")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None, help="print the docs table of this JSON and exit")
    a = ap.parse_args(argv)
    if a.markdown is not None:
        print(markdown(a.markdown))
        return
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    from rankwise.models import build_backbone
    from rankwise.ops import gumbel_sinkhorn
    from rankwise.recipes import load_config
    from rankwise.recipes.sorting import RELAXATIONS, sort_loss, true_permutation, true_ranks

    commit = subprocess.run(
        ["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    out: dict[str, object] = {
        "commit": commit or None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_before": loadavg(),
        "threads": a.threads,
        "batch": a.batch,
        "repeats": a.repeats,
        "results": {},
    }
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
        c = torch.linspace(1.0, -1.0, n)

        def gs_loss(s: torch.Tensor = scores, p: torch.Tensor = p_true, c: torch.Tensor = c) -> torch.Tensor:
            return sort_loss(gumbel_sinkhorn(c[:, None] * s[:, None, :]), p)

        cases["(gumbel_sinkhorn op)"] = fwd_bwd(gs_loss, scores)
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
