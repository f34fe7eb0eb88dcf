"""Parity of ``rankwise.diffsort`` with the authors' ``diffsort`` package (pip install --no-deps diffsort).

Usage::

    python benchmarks/diffsort_parity.py --out benchmarks/results/diffsort_parity.json

For each network x distribution x dtype: random inputs of 4 rows for n in ``--sizes``, steepness
``--steepness``; largest absolute difference of the sorted values, of ``P``, and of the gradient
of ``sum(w1 * sorted) + sum(w2 * P)`` w.r.t. the input (absolute, and relative to the largest
gradient entry). The package's ``gaussian`` backward rounds ``sigma = 1 / steepness`` to float32
(``torch.tensor(sigma)``); the ``gaussian_exact_sigma`` rows compare against the package with that
rounding removed.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch

import rankwise

NETWORKS = ("odd_even", "bitonic")
DISTRIBUTIONS = ("cauchy", "logistic", "logistic_phi", "optimal", "gaussian", "reciprocal")


class _ExactNormalCDF(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sigma: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.sigma = sigma
        return 0.5 + 0.5 * torch.erf(x / sigma / math.sqrt(2))

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        return g / ctx.sigma / math.sqrt(2 * math.pi) * torch.exp(-0.5 * (x / ctx.sigma) ** 2), None


def compare(pkg: Any, network: str, distribution: str, dtype: torch.dtype, sizes: list[int], steepness: float) -> dict:
    g = torch.Generator().manual_seed(0)
    worst = {"sorted": 0.0, "P": 0.0, "grad": 0.0, "grad_rel": 0.0}
    for n in sizes:
        x = torch.randn(4, n, generator=g, dtype=torch.float64).to(dtype)
        w1 = torch.randn(4, n, generator=g, dtype=torch.float64).to(dtype)
        w2 = torch.randn(4, n, n, generator=g, dtype=torch.float64).to(dtype)
        xo, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        so, po = rankwise.diffsort(xo, network=network, distribution=distribution, steepness=steepness)  # type: ignore[arg-type]
        sr, pr = pkg.sort(pkg.get_sorting_network(network, n, "cpu"), xr, steepness, 0.25, distribution)
        ((so * w1).sum() + (po * w2).sum()).backward()
        ((sr * w1).sum() + (pr * w2).sum()).backward()
        assert xo.grad is not None and xr.grad is not None
        gd = float((xo.grad - xr.grad).abs().max())
        worst["sorted"] = max(worst["sorted"], float((so - sr).detach().abs().max()))
        worst["P"] = max(worst["P"], float((po - pr).detach().abs().max()))
        worst["grad"] = max(worst["grad"], gd)
        worst["grad_rel"] = max(worst["grad_rel"], gd / float(xr.grad.abs().max()))
    return worst


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="2,3,5,7,8,13,16,32,33,64")
    parser.add_argument("--steepness", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/diffsort_parity.json"))
    args = parser.parse_args(argv)
    import diffsort as pkg  # type: ignore[import-not-found]

    sizes = [int(s) for s in args.sizes.split(",")]
    rows: dict[str, Any] = {}
    for network in NETWORKS:
        for distribution in (*DISTRIBUTIONS, "gaussian_exact_sigma"):
            for dtype in (torch.float64, torch.float32):
                dist = distribution
                original = pkg.functional.NormalCDF
                if distribution == "gaussian_exact_sigma":
                    dist, pkg.functional.NormalCDF = "gaussian", _ExactNormalCDF
                try:
                    res = compare(pkg, network, dist, dtype, sizes, args.steepness)
                finally:
                    pkg.functional.NormalCDF = original
                key = f"{network} {distribution} {str(dtype).split('.')[-1]}"
                rows[key] = res
                print(f"{key:<40} " + "  ".join(f"{k} {v:.1e}" for k, v in res.items()), flush=True)
    payload = {
        "meta": {"sizes": sizes, "steepness": args.steepness, "rows": 4, "torch": torch.__version__},
        "max_abs_diff": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    return payload


if __name__ == "__main__":
    main()
