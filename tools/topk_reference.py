"""Reference values of the authors' soft top-k implementations, for tests/ops/test_topk.py.

    # sparse top-k (Sander et al., ICML 2023): the authors' JAX package ``sparse_soft_topk``
    # (google-research/google-research, directory sparse_soft_topk), in a venv with jax + numba
    python tools/topk_reference.py sparse --authors-src DIR   # DIR holds the sparse_soft_topk package

    # SOFT top-k (Xie et al., NeurIPS 2020): the authors' PyTorch module ``TopK_custom``
    python tools/topk_reference.py ot --authors-src DIR       # DIR holds soft_topk/soft_topk.py

Each writes tests/ops/data/<method>_topk_reference.json: for each case the input row ``x``, ``k``, the
options, the authors' output and their vector-Jacobian product with a fixed cotangent ``g``. The
inputs are drawn from numpy's seeded generator, so the file is reproducible. The authors' code is
imported from ``--authors-src``, never copied here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "ops" / "data"


def _inputs() -> list[tuple[np.ndarray, int]]:
    rng = np.random.default_rng(20230201)
    out: list[tuple[np.ndarray, int]] = []
    for n, k in ((5, 2), (8, 3), (8, 1), (33, 10), (6, 6), (7, 4)):
        out.append((rng.normal(size=n), k))
    out.append((np.array([1.0, 1.0, 0.5, 0.5, -2.0, 3.0]), 3))  # ties
    return out


def sparse(src: str) -> list[dict[str, Any]]:
    sys.path.insert(0, src)
    import jax
    import jax.numpy as jnp
    import sparse_soft_topk as st  # the authors' package

    cases = []
    for x, k in _inputs():
        xs = jnp.asarray(x, dtype=jnp.float32)
        g = jnp.asarray(np.cos(np.arange(x.size) * 1.3), dtype=jnp.float32)
        for lam in (0.1, 1.0):
            for p, solver in ((2.0, "pav"), (4.0 / 3.0, "pav"), (2.0, "dykstra")):
                if solver == "pav":

                    def f(v: Any, lam: float = lam, p: float = p, k: int = k) -> Any:
                        return st.sparse_soft_topk_mask_pav(v, k, lam, p)
                else:

                    def f(v: Any, lam: float = lam, k: int = k) -> Any:
                        return st.sparse_soft_topk_mask_dykstra(v, k, lam, 500)

                out, vjp = jax.vjp(f, xs)
                cases.append(
                    {
                        "x": [float(v) for v in xs],
                        "k": k,
                        "regularization_strength": lam,
                        "p": p,
                        "solver": solver,
                        "out": [float(v) for v in out],
                        "g": [float(v) for v in g],
                        "vjp": [float(v) for v in vjp(g)[0]],
                    }
                )
    return cases


def ot(src: str) -> list[dict[str, Any]]:
    sys.path.insert(0, src)
    import torch
    from soft_topk.soft_topk import TopK_custom  # the authors' module

    cases = []
    for x, k in _inputs():
        if k == x.size:  # the authors' code needs a positive weight on both points
            continue
        for eps, iters in ((0.1, 200), (0.02, 1000)):
            xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
            g = torch.tensor(np.cos(np.arange(x.size) * 1.3), dtype=torch.float64)
            # TopK_custom keeps the k entries closest to the point 0: the k largest scores of -x
            out = TopK_custom(k, epsilon=eps, max_iter=iters, dtype=torch.float64)(-xt.unsqueeze(0))[0]
            (vjp,) = torch.autograd.grad((out * g).sum(), xt)
            cases.append(
                {
                    "x": x.tolist(),
                    "k": k,
                    "epsilon": eps,
                    "max_iter": iters,
                    "out": out.tolist(),
                    "g": g.tolist(),
                    "vjp": vjp.tolist(),
                }
            )
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("method", choices=("sparse", "ot"))
    parser.add_argument("--authors-src", required=True, help="directory holding the authors' package")
    args = parser.parse_args()
    cases = sparse(args.authors_src) if args.method == "sparse" else ot(args.authors_src)
    DATA.mkdir(parents=True, exist_ok=True)
    path = DATA / f"{args.method}_topk_reference.json"
    path.write_text(json.dumps({"method": args.method, "cases": cases}, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
