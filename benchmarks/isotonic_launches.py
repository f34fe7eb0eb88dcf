"""Launches of the isotonic soft operators' CUDA route, counted on CPU under the Triton interpreter.

Usage::

    python benchmarks/isotonic_launches.py                    # 1 x 1000 and 4 x 64, l2 and kl
    python benchmarks/isotonic_launches.py --shapes 1x1000 --out /tmp/launches.json

On a GPU the isotonic operators at small sizes (1 x 1,000, 256 x 256) are bound by the host: the
time of a call is the Python, dispatcher and launch work of its torch operations and Triton
kernels, not the kernels' run time (``benchmarks/results/gpu_profile.json``). This script counts
that work per forward + backward without a GPU: the operators run on CPU tensors with the CUDA
route forced (``rankwise.ops.isotonic._BACKEND = "triton"``, the Triton kernels under
``TRITON_INTERPRET=1``, numba off so that no CPU kernel is taken, and the projection's row pieces
chosen as on CUDA), inside a ``TorchDispatchMode`` that records every aten operation (views and
metadata operations apart, allocations counted separately: they launch nothing) and a wrapper that
counts the Triton launches. The interpreter's own tensor operations inside a launch are not counted.
The harness's ``y.sum().backward()`` adds two of the operations (``sum`` and the autograd engine's
seed ``ones_like``).
The default shapes take both routes of the projection: rows cut into pieces solved in parallel and
merged (few long rows: 1 x 1,000), and one program per row (short rows: 4 x 64; 256 x 256 on a GPU
takes the pieces too, with the same counts as 1 x 1,000). No
times: the interpreted kernels' speed says nothing about a GPU.

It re-executes itself with the interpreter's environment (it must be set before triton is
imported). ``--src`` runs another checkout's ``src`` (e.g. an older commit, for a before/after).
JSON: ``benchmarks/results/isotonic_launches.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: operations that only create a view or read metadata (no kernel, no allocation)
VIEW_OPS = frozenset(
    "view _unsafe_view _reshape_alias reshape detach expand slice select t transpose permute alias diagonal "
    "unsqueeze squeeze as_strided unbind split lift_fresh".split()
)
#: allocations (host work, no kernel launch on CUDA)
ALLOC_OPS = frozenset("empty empty_like new_empty empty_strided".split())


def _count(shape: tuple[int, int], op_name: str, reg: str, descending: bool) -> dict[str, Any]:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
    from triton.runtime.interpreter import InterpretedFunction

    import rankwise
    from rankwise.ops import isotonic as iso

    iso._BACKEND = "triton"
    tk = iso._triton_kernels()
    if hasattr(tk, "_chunk_length"):  # the projection's row pieces as on CUDA
        rule = tk._chunk_length
        tk._chunk_length = lambda rows, n, device: rule(rows, n, torch.device("cuda"))

    launches: collections.Counter[str] = collections.Counter()
    run = InterpretedFunction.run

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        launches[self.fn.__name__] += 1
        with _disable_current_modes():  # the interpreter's own tensor work is not the route's
            return run(self, *args, **kwargs)

    InterpretedFunction.run = counted  # type: ignore[method-assign]

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: collections.Counter[str] = collections.Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = func.overloadpacket.__name__
            if func.namespace != "prim" and name not in VIEW_OPS:
                self.ops[name] += 1
            return func(*args, **(kwargs or {}))

    fn = getattr(rankwise, op_name)
    gen = torch.Generator().manual_seed(0)

    def call(x: torch.Tensor) -> None:
        fn(x, regularization=reg, descending=descending).sum().backward()

    call(torch.randn(*shape, generator=gen, requires_grad=True))  # first-call work (imports, caches)
    x = torch.randn(*shape, generator=gen, requires_grad=True)
    launches.clear()
    with Ops() as mode:
        call(x)
    kernels = {k: v for k, v in mode.ops.items() if k not in ALLOC_OPS}
    allocs = {k: v for k, v in mode.ops.items() if k in ALLOC_OPS}
    return {
        "torch_ops": sum(kernels.values()),
        "allocations": sum(allocs.values()),
        "triton_launches": sum(launches.values()),
        "launching_calls": sum(kernels.values()) + sum(launches.values()),
        "ops": dict(sorted(kernels.items())),
        "triton": dict(launches),
    }


def _child(args: argparse.Namespace) -> None:
    res = {}
    for shape_s in args.shapes.split(","):
        rows, n = (int(v) for v in shape_s.split("x"))
        for op_name in ("soft_rank_isotonic", "soft_sort_isotonic"):
            for reg in ("l2", "kl"):
                r = _count((rows, n), op_name, reg, False)
                res[f"{op_name} {reg} {shape_s}"] = r
                print(
                    f"{op_name:20s} {reg} {shape_s:9s} torch ops {r['torch_ops']:3d}  allocations "
                    f"{r['allocations']:3d}  triton launches {r['triton_launches']}",
                    file=sys.stderr,
                    flush=True,
                )
    print(json.dumps(res))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="1x1000,4x64")
    p.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "isotonic_launches.json"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        _child(a)
        return
    env = {**os.environ, "TRITON_INTERPRET": "1", "RANKWISE_NUMBA": "off", "PYTHONPATH": a.src}
    cmd = [sys.executable, __file__, "--child", "--shapes", a.shapes]
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
    commit = subprocess.run(
        ["git", "-C", a.src, "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    out = {"src": a.src, "commit": commit, "cases": json.loads(done.stdout.strip().splitlines()[-1])}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
