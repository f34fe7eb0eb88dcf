"""Reference values of the error-free differentiable sorting networks from the authors' PyTorch code.

Kim, Yoon & Cho, ICLR 2024, "Generalized Neural Sorting Networks with Error-Free Differentiable Swap
Functions"; code: github.com/jungtaekkim/error-free-differentiable-swap-functions (not on PyPI). Its
package ``error_free_dsf`` needs only torch and numpy. This script imports it from a directory given
on the command line (nothing of it is copied into rankwise), runs ``error_free_dsf.sort(network, x,
steepness, distribution=..., use_ste=True)`` in float64 on fixed inputs and writes the inputs, the
outputs ``(sorted, P)`` and two vector-Jacobian products (of ``sorted`` with ``g_values`` and of ``P``
with ``g_matrix``, each through its own backward pass) to
``tests/ops/data/error_free_diffsort_reference.npz``, which ``tests/ops/test_diffsort_error_free.py``
compares ``rankwise.diffsort(..., error_free=True)`` with.

    git -C /work/.mirror/jungtaekkim+error-free-differentiable-swap-functions/repo archive HEAD error_free_dsf \\
        | tar -x -C /tmp/efref
    python tools/error_free_reference.py --code /tmp/efref

Keys: ``<network>_n<n>_<distribution>_<steepness>_<what>`` with ``what`` one of ``x``, ``sorted``,
``matrix``, ``g_values``, ``g_matrix``, ``grad_values``, ``grad_matrix``; ``cases`` lists the prefixes.
The authors' ``P[b, i, j]`` is the weight of input ``i`` in (ascending) position ``j``, as rankwise's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "ops" / "data" / "error_free_diffsort_reference.npz"
#: (n, distribution, steepness) per network
CASES = (
    (3, "cauchy", 10.0),
    (5, "cauchy", 10.0),
    (8, "cauchy", 10.0),
    (5, "logistic", 2.0),
    (8, "optimal", 3.0),
)
BATCH = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, required=True, help="directory holding the authors' error_free_dsf")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    sys.path.insert(0, str(args.code))
    import error_free_dsf  # the authors' package

    torch.set_default_dtype(torch.float64)
    out: dict[str, np.ndarray] = {}
    cases = []
    for network in ("odd_even", "bitonic"):
        for n, distribution, steepness in CASES:
            key = f"{network}_n{n}_{distribution}_{steepness:g}"
            g = torch.Generator().manual_seed(1000 * n + len(cases))
            x = torch.randn(BATCH, n, generator=g, dtype=torch.float64)
            g_values = torch.randn(BATCH, n, generator=g, dtype=torch.float64)
            g_matrix = torch.randn(BATCH, n, n, generator=g, dtype=torch.float64)
            net = error_free_dsf.get_sorting_network(network, n, "cpu")
            grads = []
            for which in ("values", "matrix"):
                xr = x.clone().requires_grad_(True)
                s, p = error_free_dsf.sort(net, xr, steepness, distribution=distribution, use_ste=True)
                loss = (s * g_values).sum() if which == "values" else (p * g_matrix).sum()
                loss.backward()
                grads.append(xr.grad.detach().numpy())
            out.update(
                {
                    f"{key}_x": x.numpy(),
                    f"{key}_sorted": s.detach().numpy(),
                    f"{key}_matrix": p.detach().numpy(),
                    f"{key}_g_values": g_values.numpy(),
                    f"{key}_g_matrix": g_matrix.numpy(),
                    f"{key}_grad_values": grads[0],
                    f"{key}_grad_matrix": grads[1],
                }
            )
            cases.append(key)
    out["cases"] = np.array(cases)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **out)
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
