"""Reference values of LapSum (soft rank, soft sort, soft top-k) from the authors' PyTorch code.

Struski et al., ICML 2025, "LapSum - One Method to Differentiate Them All: Ranking, Sorting and Top-k
Selection"; code: github.com/gmum/LapSum. The authors' package builds C++ extensions (CPU and CUDA);
this script takes their CPU sources and autograd wrappers from a local mirror of that repository
(``git show``, nothing is copied into rankwise), builds the CPU extensions with
``torch.utils.cpp_extension.load`` in a temporary directory, runs them on fixed inputs and writes the
inputs, outputs and vector-Jacobian products to ``tests/ops/data/lapsum_reference.npz``, which
``tests/ops/test_lapsum.py`` compares :mod:`rankwise.ops.lapsum` with.

    python tools/lapsum_reference.py --mirror /work/.mirror/gmum+LapSum/repo

Conventions of the authors' code (mapped in the test): ``soft_rank`` gives 0-based ranks and its
``alpha < 0`` ranks descending; ``soft_sort`` with ``alpha < 0`` sorts descending; ``soft_topk(x, k,
alpha, dim, largest)`` takes ``k`` as a ``(B, 1)`` tensor and the direction from ``largest``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "ops" / "data" / "lapsum_reference.npz"
#: scales (the authors' extensions take ``alpha`` as a C++ float: values exact in float32)
ALPHAS = (0.0625, 0.5, 2.0)
#: (package, C++ source stem, Python wrapper module) of the authors' operators used here
PARTS = (("rank", "soft_rank"), ("sort", "soft_sort"), ("topk", "soft_topk"))


def _show(mirror: Path, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(mirror), "show", f"HEAD:{path}"], check=True, capture_output=True, text=True
    ).stdout


def load_authors_code(mirror: Path, workdir: Path) -> dict[str, Any]:
    """Build the authors' CPU extensions and import their autograd wrappers; ``{op: function}``."""
    from torch.utils.cpp_extension import load

    pkg = workdir / "lapsum_ref"
    fns: dict[str, Any] = {}
    for sub, stem in PARTS:
        src = _show(mirror, f"lapsum/lapsum/{sub}/cpu/{stem}.cpp")
        # what the authors' setup.py does for PyTorch >= 2.6
        src = src.replace(".type()", ".scalar_type()")
        cpp = workdir / f"{stem}.cpp"
        cpp.write_text(src)
        build = workdir / f"build_{stem}"
        build.mkdir(exist_ok=True)
        ext = load(name=f"{stem}_cpu", sources=[str(cpp)], build_directory=str(build), extra_cflags=["-O2"])
        ext_pkg = pkg / sub / "extension"
        ext_pkg.mkdir(parents=True, exist_ok=True)
        for p in (pkg, pkg / sub, ext_pkg):
            (p / "__init__.py").touch()
        (ext_pkg / f"{stem}.py").write_text(_show(mirror, f"lapsum/lapsum/{sub}/extension/{stem}.py"))
        name = f"lapsum_ref.{sub}.extension"
        sys.modules[f"{name}.{stem}_cpu"] = ext
        sys.modules[f"{name}.{stem}_cuda"] = types.ModuleType(f"{name}.{stem}_cuda")  # CPU only here
    sys.path.insert(0, str(workdir))
    import importlib

    for sub, stem in PARTS:
        fns[sub] = getattr(importlib.import_module(f"lapsum_ref.{sub}.extension.{stem}"), stem)
    return fns


def _inputs(g: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    """Named ``(B, n)`` float64 inputs: random, with ties, widely spread, n = 1 and 2."""
    ties = torch.tensor([[0.5, -1.0, 0.5, 2.0, -1.0, 0.5], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    return [
        ("randn_4x7", torch.randn(4, 7, generator=g, dtype=torch.float64)),
        ("randn_2x17", torch.randn(2, 17, generator=g, dtype=torch.float64)),
        ("spread_2x12", 20 * torch.randn(2, 12, generator=g, dtype=torch.float64)),
        ("ties_2x6", ties),
        ("n1_3x1", torch.randn(3, 1, generator=g, dtype=torch.float64)),
        ("n2_3x2", torch.randn(3, 2, generator=g, dtype=torch.float64)),
    ]


def _vjp(fn: Any, x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_()
    out = fn(x)
    (grad,) = torch.autograd.grad(out, x, v)
    return out.detach(), grad


def generate(fns: dict[str, Any]) -> dict[str, np.ndarray]:
    g = torch.Generator().manual_seed(0)
    data: dict[str, np.ndarray] = {}
    case = 0
    for name, x64 in _inputs(g):
        n = x64.shape[1]
        for dtype in (torch.float64, torch.float32):
            x = x64.to(dtype)
            for alpha in ALPHAS:
                for descending in (False, True):
                    signed = -alpha if descending else alpha
                    v = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype)
                    runs: list[tuple[str, float, Any]] = [
                        # a tensor alpha: the authors' rank backward returns a gradient for it
                        ("rank", 0.0, lambda t, a=signed: fns["rank"](t, torch.tensor(a, dtype=t.dtype), 1)),
                        ("sort", 0.0, lambda t, a=signed: fns["sort"](t, a, 1)),
                    ]
                    for k in sorted({1.0, float(max(1, n // 3)), n / 2 + 0.25, float(n - 1)}):
                        if 0 < k < n:
                            runs.append(
                                (
                                    "topk",
                                    k,
                                    lambda t, a=alpha, kk=k, d=descending: fns["topk"](
                                        t,
                                        torch.full((t.shape[0], 1), kk, dtype=t.dtype),
                                        torch.tensor(a, dtype=t.dtype),
                                        1,
                                        d,
                                    ),
                                )
                            )
                    for op, k, fn in runs:
                        out, grad = _vjp(fn, x, v)
                        key = f"{case:04d}"
                        data[f"{key}/x"] = x.numpy()
                        data[f"{key}/v"] = v.numpy()
                        data[f"{key}/out"] = out.numpy()
                        data[f"{key}/grad"] = grad.numpy()
                        data[f"{key}/meta"] = np.array([op, name, str(alpha), str(descending), str(k)])
                        case += 1
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", type=Path, required=True, help="a git clone of github.com/gmum/LapSum")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--workdir", type=Path, default=None, help="build directory (default: a temporary one)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        data = generate(load_authors_code(args.mirror, work))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **data)
    print(f"wrote {len(data) // 5} cases to {args.out}")


if __name__ == "__main__":
    main()
