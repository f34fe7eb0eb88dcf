"""Host overhead of the CUDA route, measured on CPU: dispatched op counts and ``meta``-device time.

Usage::

    python benchmarks/host_overhead.py                          # every case, B = 256, 1024, 4096
    python benchmarks/host_overhead.py --losses supcon --batches 1024 --repeats 300

At the batch sizes where a GPU call is bound by the host (host time per call ~= device time), the
cost of a loss is the work of dispatching its operations: each torch operation on CUDA is one or
more kernel launches plus the dispatcher and Python around it. No GPU is needed to count or time
that work:

* **op count**: forward + backward under a ``TorchDispatchMode`` that records every aten operation
  reaching the dispatcher, pure views and metadata operations excluded (``view``, ``detach``,
  ``expand``, ``slice``, ``t``, ``transpose``, ``alias``, ``diagonal``, ... and ``prim.*``; see
  ``VIEW_OPS``). The count is of aten operations, not of kernels: an operation may launch more
  than one kernel on CUDA (e.g. a reduction with a dtype argument that first casts its input) and
  the autograd engine's own seed (``ones_like``) is included. The inputs live on the data-less
  ``meta`` device, where the library takes its non-CPU branches. Where a case's route chooses on
  ``device.type == "cuda"`` (which ``meta`` is not), ``META_AS_CUDA`` gives the patch that makes the
  meta route the CUDA one; every case's **forward** is also run on fake CUDA tensors
  (``FakeTensorMode``: exactly the branches a CUDA tensor takes; the autograd engine does not run
  them without a GPU) and the JSON says whether its op sequence equals the meta forward's
  (``forward_matches_fake_cuda``).
* **meta host time**: forward + backward on ``meta`` tensors, one thread, median over repeats after
  warm-up, rankwise and reference in the same process in a fresh random order each repeat
  (``benchmarks/_timing.py``). Meta operations allocate nothing and compute nothing, so this is
  the Python + dispatcher cost of a call. It is a *proxy* for the CUDA host time: the meta kernels
  of some operations are Python functions (slower than CUDA's C++ shape checks) and the CUDA
  caching allocator and the launches themselves are missing, so absolute numbers do not transfer;
  op counts are exact.

The case table ``CASES`` maps a name to ``(rankwise fn, reference fn or None, input factory)``; the
factory takes ``(batch, device)`` and returns the positional arguments (the floating tensors that
need a gradient are the leaves). JSON: ``benchmarks/results/host_overhead.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
import rankwise.losses._supcon as _supcon_module
from _timing import loadavg, machine, time_cases
from losses import supcon_reference
from rankwise.losses import supcon_loss

Factory = Callable[[int, torch.device], tuple[Any, ...]]
Case = tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor] | None, Factory]

#: operations that only create a view or read metadata (no kernel on CUDA)
VIEW_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "_reshape_alias",
        "reshape",
        "detach",
        "expand",
        "slice",
        "select",
        "t",
        "transpose",
        "permute",
        "alias",
        "diagonal",
        "unsqueeze",
        "squeeze",
        "as_strided",
        "unbind",
        "split",
        "lift_fresh",
    }
)


def _supcon_inputs(batch: int, device: torch.device) -> tuple[Any, ...]:
    """(B, 2, 128) float32 views needing a gradient and integer labels in [0, 100), as in ``benchmarks/gpu.py``."""
    g = torch.Generator().manual_seed(batch)
    xs = torch.randn(batch, 2, 128, generator=g).to(device).requires_grad_()
    ys = torch.randint(0, 100, (batch,), generator=g).to(device)
    return xs, ys


CASES: dict[str, Case] = {
    "supcon": (supcon_loss, supcon_reference, _supcon_inputs),
}


@contextlib.contextmanager
def _supcon_as_cuda() -> Iterator[None]:
    """``supcon_loss`` takes its one-pass path up to a larger size on CUDA than elsewhere."""
    saved = _supcon_module._SMALL_MAX_ELEMENTS
    _supcon_module._SMALL_MAX_ELEMENTS = _supcon_module._SMALL_MAX_ELEMENTS_CUDA
    try:
        yield
    finally:
        _supcon_module._SMALL_MAX_ELEMENTS = saved


@contextlib.contextmanager
def _supcon_cpu_as_cuda() -> Iterator[None]:
    """On CPU: the torch ops of the one-pass path (not the numba kernel) and the two gradient products
    that CUDA takes above ``B V = 512`` (not the one-thread transposing copy)."""
    saved = _supcon_module._NUMBA_MAX_N, _supcon_module._SYMMETRIC_MAX_N
    _supcon_module._NUMBA_MAX_N = _supcon_module._SYMMETRIC_MAX_N = 0
    try:
        yield
    finally:
        _supcon_module._NUMBA_MAX_N, _supcon_module._SYMMETRIC_MAX_N = saved


#: per case: a context in which the rankwise function takes its CUDA route on ``meta`` tensors
META_AS_CUDA: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {"supcon": _supcon_as_cuda}
#: per case: a context in which the rankwise function takes the CUDA route's torch ops on CPU
CPU_AS_CUDA: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {"supcon": _supcon_cpu_as_cuda}


class OpCounter(TorchDispatchMode):
    """Records every aten operation reaching the dispatcher, views and metadata excluded."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace != "prim" and func.overloadpacket.__name__ not in VIEW_OPS:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _leaves(args: tuple[Any, ...]) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def _count(fn: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> dict[str, Any]:
    """Ops of one forward and one backward on the given (meta) inputs, after one warm-up call."""
    fn(*args).backward()  # first-call work (lazy imports, caches) is not per-call work
    for t in _leaves(args):
        t.grad = None
    with OpCounter() as fwd:
        loss = fn(*args)
    with OpCounter() as bwd:
        loss.backward()
    return {
        "forward": len(fwd.ops),
        "backward": len(bwd.ops),
        "total": len(fwd.ops) + len(bwd.ops),
        "forward_ops": fwd.ops,
        "backward_ops": bwd.ops,
    }


def _fake_cuda_forward(fn: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> list[str]:
    mode = FakeTensorMode()
    fake: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            host = mode.from_tensor(a.detach(), static_shapes=True)
            with mode:
                t = host.to("cuda")
            fake.append(t.requires_grad_(a.requires_grad))
        else:
            fake.append(a)
    with mode:
        fn(*fake)  # warm-up, as for the meta count
    with mode, OpCounter() as c:
        fn(*fake)
    return c.ops


def run_case(name: str, batch: int, repeats: int, cpu_batch: int) -> dict[str, Any]:
    ours, ref, factory = CASES[name]
    as_cuda = META_AS_CUDA.get(name, contextlib.nullcontext)
    meta = torch.device("meta")
    out: dict[str, Any] = {}
    with as_cuda():
        args = factory(batch, meta)
        out["rankwise"] = _count(ours, args)
        cpu_args = factory(batch, torch.device("cpu"))
        out["rankwise"]["forward_matches_fake_cuda"] = (
            _fake_cuda_forward(ours, cpu_args) == out["rankwise"]["forward_ops"]
        )
        cases = {"rankwise": _fwd_bwd(ours, args)}
        if ref is not None:
            ref_args = factory(batch, meta)
            out["reference"] = _count(ref, ref_args)
            out["reference"]["forward_matches_fake_cuda"] = (
                _fake_cuda_forward(ref, cpu_args) == out["reference"]["forward_ops"]
            )
            cases["reference"] = _fwd_bwd(ref, ref_args)
        times = time_cases(cases, repeats, warmup=20)
    _store(out, times, "meta_host")
    # CPU at a tiny batch: the same operations (checked) on real tensors whose compute is negligible
    cpu = torch.device("cpu")
    with as_cuda(), CPU_AS_CUDA.get(name, contextlib.nullcontext)():
        tiny = factory(cpu_batch, cpu)
        cases = {"rankwise": _fwd_bwd(ours, tiny)}
        out["rankwise"]["cpu_tiny_same_ops"] = _count(ours, tiny)["forward_ops"] == out["rankwise"]["forward_ops"]
        if ref is not None:
            tiny_ref = factory(cpu_batch, cpu)
            cases["reference"] = _fwd_bwd(ref, tiny_ref)
            same = _count(ref, tiny_ref)["forward_ops"] == out["reference"]["forward_ops"]
            out["reference"]["cpu_tiny_same_ops"] = same
        times = time_cases(cases, repeats, warmup=20)
    _store(out, times, "cpu_tiny_host")
    if ref is not None:
        out["op_ratio"] = round(out["reference"]["total"] / out["rankwise"]["total"], 3)
        for key in ("meta_host", "cpu_tiny_host"):
            out[f"{key}_ratio"] = round(out["reference"][f"{key}_us"] / out["rankwise"][f"{key}_us"], 3)
    return out


def _store(out: dict[str, Any], times: dict[str, dict[str, float]], key: str) -> None:
    for side, t in times.items():
        out[side][f"{key}_us"] = round(t["median_ms"] * 1e3, 1)
        out[side][f"{key}_q1_us"] = round(t["q1_ms"] * 1e3, 1)
        out[side][f"{key}_q3_us"] = round(t["q3_ms"] * 1e3, 1)
        out[side][f"{key}_repeats"] = t["repeats"]


def _fwd_bwd(fn: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> Callable[[], None]:
    leaves = _leaves(args)

    def run() -> None:
        for t in leaves:
            t.grad = None
        fn(*args).backward()

    return run


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--losses", default=",".join(CASES), help=f"comma-separated cases of {sorted(CASES)}")
    p.add_argument("--batches", default="256,1024,4096")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--cpu-batch", type=int, default=8, help="batch of the CPU proxy (compute negligible)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "host_overhead.json"))
    a = p.parse_args(argv)
    names = [s for s in a.losses.split(",") if s]
    unknown = [s for s in names if s not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; choose from {sorted(CASES)}")
    torch.set_num_threads(1)
    res: dict[str, Any] = {"machine": machine(), "threads": 1, "loadavg_before": loadavg(), "cases": {}}
    for name in names:
        for batch in [int(s) for s in a.batches.split(",")]:
            r = run_case(name, batch, a.repeats, a.cpu_batch)
            res["cases"].setdefault(name, {})[f"B={batch}"] = r
            line = f"{name:10s} B={batch:5d}  ops rankwise {r['rankwise']['total']:3d}"
            line += f" (fwd {r['rankwise']['forward']}, bwd {r['rankwise']['backward']})"
            line += f" meta {r['rankwise']['meta_host_us']:7.0f} us cpu {r['rankwise']['cpu_tiny_host_us']:5.0f} us"
            if "reference" in r:
                rr = r["reference"]
                line += f" | reference ops {rr['total']:3d} meta {rr['meta_host_us']:7.0f} us"
                line += f" cpu {rr['cpu_tiny_host_us']:5.0f} us | ratio ops {r['op_ratio']:.2f}"
                line += f" meta {r['meta_host_ratio']:.2f} cpu {r['cpu_tiny_host_ratio']:.2f}"
            line += f" | fwd==fake cuda {r['rankwise']['forward_matches_fake_cuda']}"
            line += f" cpu ops same {r['rankwise']['cpu_tiny_same_ops']}"
            print(line, flush=True)
    res["loadavg_after"] = loadavg()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
