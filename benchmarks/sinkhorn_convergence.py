"""Convergence evidence for the optimal-transport soft sort/rank (``rankwise.ops.sinkhorn``): no timings.

Usage::

    python benchmarks/sinkhorn_convergence.py --seeds 5 --out benchmarks/results/sinkhorn_convergence.json

For every (n, epsilon, dtype) and seed (batch of 8 standard-normal rows, m = n targets, p = 2):

* ``solver``: rankwise's log-domain sweeps (epsilon scaling) and Newton steps to the default
  tolerance (``tol``; the solver stops earlier only when round-off stalls it, and warns above
  ``accepted``), the final relative column-marginal error (rows are exact);
* ``authors_default_rule``: the authors' iteration and stopping rule (epsilon decaying from 0.1 by 0.95
  per sweep, relative error checked every 5 sweeps, threshold 1e-2, at most 2,000 sweeps), float64:
  sweeps used and the max difference of its soft ranks from the converged ones;
* ``plain_to_tol`` (float64): sweeps the authors' iteration needs to reach the solver's tolerance
  (1e-10), capped at ``--cap``.

``float32_stability``: soft ranks and sorts at ``epsilon=1e-3`` in float32 for n = 2..256 and six
kinds of input (normal, x 1e4, 3 + 1e-4 noise, integer ties, 1 + 1e-5 noise, one outlier), batch 8:
count of non-finite outputs or gradients, of warnings, and the largest float32-float64 difference
(values relative to the largest float64 value, gradients to the largest float64 gradient; cases whose
float64 gradient is below 1e-8 everywhere are left out of the gradient comparison).
"""

from __future__ import annotations

import argparse
import json
import statistics
import warnings
from pathlib import Path

import torch

import rankwise
from rankwise.ops import sinkhorn as sk


def _authors_iteration(cost: torch.Tensor, eps: float, threshold: float, max_sweeps: int) -> tuple[torch.Tensor, int]:
    g = torch.zeros(cost.shape[0], cost.shape[-1], dtype=cost.dtype)
    e, sweeps = 0.1, 0
    while sweeps < max_sweeps:
        for _ in range(5):
            g = sk._sweep(g, cost, e)
            e = max(e * 0.95, eps)
            sweeps += 1
        if e <= eps and float(sk._col_error(sk._log_plan(g, cost, eps)).max()) <= threshold:
            break
    return g, sweeps


def float32_stability() -> dict:
    gen = torch.Generator().manual_seed(0)
    cases = bad = warned = 0
    worst_value = worst_grad = 0.0
    for n in (2, 5, 16, 32, 64, 128, 256):
        inputs = {
            "normal": torch.randn(8, n, generator=gen),
            "scaled_1e4": torch.randn(8, n, generator=gen) * 1e4,
            "offset_3_spread_1e-4": torch.randn(8, n, generator=gen) * 1e-4 + 3,
            "integer_ties": torch.randint(0, 4, (8, n), generator=gen).float(),
            "offset_1_spread_1e-5": 1 + torch.randn(8, n, generator=gen) * 1e-5,
            "outlier": torch.cat([torch.full((8, 1), 1e3), torch.zeros(8, n - 1)], dim=-1),
        }
        for x in inputs.values():
            w = torch.randn(8, n, generator=gen, dtype=torch.float64)
            for fn in (rankwise.soft_rank_sinkhorn, rankwise.soft_sort_sinkhorn):
                cases += 1
                x32, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
                with warnings.catch_warnings(record=True) as rec:
                    warnings.simplefilter("always")
                    o32 = fn(x32, epsilon=1e-3)
                o64 = fn(x64, epsilon=1e-3)
                (g32,) = torch.autograd.grad((o32 * w.float()).sum(), x32)
                (g64,) = torch.autograd.grad((o64 * w).sum(), x64)
                warned += len(rec)
                bad += int(not (torch.isfinite(o32).all() and torch.isfinite(g32).all()))
                o32, o64 = o32.detach().double(), o64.detach()
                worst_value = max(worst_value, float((o32 - o64).abs().max() / o64.abs().max().clamp_min(1e-30)))
                if float(g64.abs().max()) > 1e-8:
                    worst_grad = max(worst_grad, float((g32.double() - g64).abs().max() / g64.abs().max()))
    return {
        "cases": cases,
        "non_finite": bad,
        "warnings": warned,
        "max_rel_value_diff_vs_float64": worst_value,
        "max_rel_grad_diff_vs_float64": worst_grad,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--cap", type=int, default=20_000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for n in (16, 32, 128):
        for eps in (0.1, 1e-2, 1e-3):
            for dtype in (torch.float64, torch.float32):
                rec: dict = {"n": n, "epsilon": eps, "dtype": str(dtype).split(".")[-1]}
                newton, sweeps, errors, authors_sweeps, authors_gap, plain = [], [], [], [], [], []
                for seed in range(args.seeds):
                    gen = torch.Generator().manual_seed(seed)
                    x = torch.randn(8, n, generator=gen, dtype=torch.float64)
                    cost = sk._cost(sk._squash(x.to(dtype)), sk._targets(n, False, x.to(dtype)), 2.0)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        g, _, info = sk._solve(cost, eps, sk._default_tol(dtype, eps)[0], 50, False)
                    newton.append(info.newton_steps)
                    sweeps.append(info.sweeps)
                    errors.append(info.error)
                    if dtype == torch.float64:
                        ranks = sk._rank_from_plan(sk._log_plan(g, cost, eps).exp())
                        ga, used = _authors_iteration(cost, eps, 1e-2, 2000)
                        ranks_a = sk._rank_from_plan(sk._log_plan(ga, cost, eps).exp())
                        authors_sweeps.append(used)
                        authors_gap.append(float((ranks_a - ranks).abs().max()))
                        _, used_tol = _authors_iteration(cost, eps, 1e-10, args.cap)
                        plain.append(used_tol)
                rec["solver"] = {
                    "sweeps": sweeps[0],
                    "newton_steps": {"min": min(newton), "median": statistics.median(newton), "max": max(newton)},
                    "max_error": max(errors),
                    "tol": sk._default_tol(dtype, eps)[0],
                    "accepted": sk._default_tol(dtype, eps)[1],
                }
                if authors_sweeps:
                    rec["authors_default_rule"] = {
                        "sweeps_median": statistics.median(authors_sweeps),
                        "max_rank_gap_to_converged": max(authors_gap),
                    }
                    rec["plain_to_tol"] = {
                        "sweeps_median": statistics.median(plain),
                        "sweeps_max": max(plain),
                        "capped": sum(p >= args.cap for p in plain),
                    }
                rows.append(rec)
                print(json.dumps(rec), flush=True)
    stability = float32_stability()
    print(json.dumps({"float32_stability": stability}), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"seeds": args.seeds, "rows": rows, "float32_stability": stability}
        args.out.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
