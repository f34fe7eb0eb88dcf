"""Row-parallel dispatch of the CPU kernels: torch's OpenMP team through ``GOMP_parallel`` against
numba's own parallel layer (``prange``), side by side (float32).

Usage::

    python benchmarks/kernel_dispatch.py                      # omp and workqueue layers, 1 and 2 threads
    python benchmarks/kernel_dispatch.py --layers workqueue --threads 2 --shapes 256x256
    python benchmarks/kernel_dispatch.py --markdown benchmarks/results/kernel_dispatch.json   # docs table

Routes, each timed on the same input with the same kernels (the isotonic soft-rank forward,
``regularization`` l2 and kl, and the stable row sort):

* ``gomp``: the kernel layer's own call (``rankwise._kernels.isotonic.rank_forward`` /
  ``rankwise._kernels.sort.sort_rows``): rows in chunks on torch's OpenMP team through
  ``GOMP_parallel`` (:mod:`rankwise._kernels._parallel`), serial with one thread.
* ``pool``: the same call with the OpenMP-team route turned off: rows on Python threads (the
  dispatcher's fallback route).
* ``prange``: a ``numba.njit(parallel=True)`` function whose ``prange`` loop runs the same row
  kernel over the same chunks, on numba's threading layer (``omp`` or ``workqueue``), with
  ``numba.set_num_threads`` threads; the same allocations as the ``gomp`` route.

numba fixes its threading layer once per process, so every layer runs in its own child process;
inside that process the three routes run side by side (median of repeats after a warm-up, one
repeat running every case once in a fresh random order, ``benchmarks/_timing.py``). The JSON
(``benchmarks/results/kernel_dispatch.json``) holds every median and quartile, the ratios
``gomp / prange`` (above 1: ``prange`` is faster) and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SHAPES = "256x256,64x4096,4096x64"


def _child(layer: str, threads_list: list[int], shapes: list[tuple[int, int]], repeats: int) -> dict[str, Any]:
    import numba
    import numpy as np

    numba.config.THREADING_LAYER = layer
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from _timing import loadavg, time_cases
    from rankwise._kernels import _numba_isotonic as nbi
    from rankwise._kernels import _numba_sort as nbs
    from rankwise._kernels import _parallel, isotonic, sort

    isotonic.FAMILY.require()
    sort.FAMILY.require()
    _parallel.find_gomp()
    gomp = _parallel.gomp

    @numba.njit(parallel=True, nogil=True)
    def rank_prange(z, perm, w, kl, out, ids, x, div, x_max, chunks):  # type: ignore[no-untyped-def]
        rows = z.shape[0]
        for c in numba.prange(chunks):
            r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
            nbi.soft_rank_forward(z[r0:r1], perm[r0:r1], w, kl, out[r0:r1], ids[r0:r1], x[r0:r1], div, x_max[r0:r1])

    @numba.njit(parallel=True, nogil=True)
    def sort_prange(z, descending, perm, chunks):  # type: ignore[no-untyped-def]
        rows = z.shape[0]
        for c in numba.prange(chunks):
            r0, r1 = c * rows // chunks, (c + 1) * rows // chunks
            nbs.sort_rows(z[r0:r1], descending, perm[r0:r1])

    def rank_numba(x: torch.Tensor, kl: bool) -> torch.Tensor:
        rows, n = x.shape
        w = isotonic._rank_weights(n, kl)
        out = torch.empty((rows, n), dtype=x.dtype)
        ids = torch.empty((rows, n), dtype=torch.int64)
        z = torch.empty((rows, n), dtype=x.dtype)
        perm = torch.empty((rows, n), dtype=torch.int64)
        chunks = min(rows, numba.get_num_threads() * _parallel.CHUNKS_PER_THREAD)
        x_max = np.empty(rows, np.float64)
        rank_prange(
            z.numpy(), perm.numpy(), w.numpy(), kl, out.numpy(), ids.numpy(), x.numpy(), np.float32(1.0), x_max, chunks
        )
        return out

    def sort_numba(x: torch.Tensor) -> torch.Tensor:
        rows, n = x.shape
        perm = torch.empty((rows, n), dtype=torch.int64)
        chunks = min(rows, numba.get_num_threads() * _parallel.CHUNKS_PER_THREAD)
        sort_prange(x.numpy(), False, perm.numpy(), chunks)
        return perm

    def pool(fn: Any) -> Any:
        def run() -> Any:
            _parallel.gomp = None
            try:
                return fn()
            finally:
                _parallel.gomp = gomp

        return run

    out: dict[str, Any] = {"layer": layer, "gomp_found": gomp is not None, "results": {}}
    for threads in threads_list:
        torch.set_num_threads(threads)
        numba.set_num_threads(threads)
        for rows, n in shapes:
            x = torch.randn(rows, n, generator=torch.Generator().manual_seed(rows * n))
            cases: dict[str, Any] = {}
            for kl in (False, True):
                tag = f"isotonic_{'kl' if kl else 'l2'}"
                ref = isotonic.rank_forward(x, 1.0, False, kl)[0]
                if not torch.allclose(rank_numba(x, kl), ref, rtol=1e-5, atol=1e-5):
                    raise SystemExit(f"prange route disagrees ({tag}, {rows}x{n})")
                cases[f"{tag} gomp"] = lambda x=x, kl=kl: isotonic.rank_forward(x, 1.0, False, kl)
                cases[f"{tag} pool"] = pool(lambda x=x, kl=kl: isotonic.rank_forward(x, 1.0, False, kl))
                cases[f"{tag} prange"] = lambda x=x, kl=kl: rank_numba(x, kl)
            if not torch.equal(sort_numba(x), sort.sort_rows(x, False)):
                raise SystemExit(f"prange route disagrees (sort, {rows}x{n})")
            cases["sort gomp"] = lambda x=x: sort.sort_rows(x, False)
            cases["sort pool"] = pool(lambda x=x: sort.sort_rows(x, False))
            cases["sort prange"] = lambda x=x: sort_numba(x)
            t = time_cases(cases, repeats, warmup=3)
            for kernel in ("isotonic_l2", "isotonic_kl", "sort"):
                g, p, q = (t[f"{kernel} {r}"]["median_ms"] for r in ("gomp", "pool", "prange"))
                key = f"threads={threads} {kernel} {rows}x{n}"
                out["results"][key] = {
                    "layer": layer,
                    "threads": threads,
                    "kernel": kernel,
                    "shape": [rows, n],
                    "times": {r: t[f"{kernel} {r}"] for r in ("gomp", "pool", "prange")},
                    "gomp_over_prange": g / q,
                    "loadavg": loadavg(),
                }
                print(
                    f"{layer:9s} threads={threads} {kernel:11s} {rows:>5}x{n:<5} gomp {g:8.3f} ms  pool {p:8.3f} ms  "
                    f"prange {q:8.3f} ms  gomp/prange {g / q:5.2f}  load {loadavg()[:1]}",
                    file=sys.stderr,
                    flush=True,
                )
    out["threading_layer_used"] = numba.threading_layer()
    return out


def markdown(result: dict[str, Any]) -> str:
    """The docs table of a result: median ms of each route per layer, threads, kernel and shape."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _tables import load_range, ms, provenance, ratio

    lines = [
        "Median ms; GOMP / prange below 1: the GOMP team is faster.",
        "",
        "| layer | threads | kernel | shape | GOMP team | Python threads | numba prange | GOMP / prange |",
        "|---|---|---|---|---|---|---|---|",
    ]
    loads = [result.get("loadavg_start"), result.get("loadavg_end")]
    threads: set[int] = set()
    for layer, lay in result["layers"].items():
        for r in lay["results"].values():
            t = r["times"]
            rows, n = r["shape"]
            threads.add(r["threads"])
            loads.append(r.get("loadavg"))
            lines.append(
                f"| {layer} | {r['threads']} | {r['kernel']} | {rows}x{n} | {ms(t['gomp']['median_ms'])} | "
                f"{ms(t['pool']['median_ms'])} | {ms(t['prange']['median_ms'])} | {ratio(r['gomp_over_prange'])} |"
            )
    lines += [
        "",
        provenance(
            "kernel_dispatch.py",
            commit=result.get("commit"),
            date=result.get("date"),
            machine=result,
            load=load_range(*loads),
            threads=" and ".join(map(str, sorted(threads))),
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", default="omp,workqueue", help="numba threading layers (default omp,workqueue)")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--shapes", default=SHAPES, help=f"comma-separated ROWSxN (default {SHAPES})")
    p.add_argument("--repeats", type=int, default=41, help="timed repeats")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "kernel_dispatch.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--markdown", type=Path, default=None, help="print the docs table of this result JSON and stop")
    args = p.parse_args()
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    threads = [int(v) for v in args.threads.split(",")]
    shapes = [(int(a), int(b)) for a, b in (s.split("x") for s in args.shapes.split(","))]
    if args.child:
        print(json.dumps(_child(args.child, threads, shapes, args.repeats)))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from _timing import loadavg, machine

    result: dict[str, Any] = {"device": "cpu", **machine(), "loadavg_start": loadavg(), "layers": {}}
    env = {**os.environ, "RANKWISE_NUMBA": "sync"}
    for layer in args.layers.split(","):
        cmd = [sys.executable, __file__, "--child", layer, "--threads", args.threads, "--shapes", args.shapes]
        cmd += ["--repeats", str(args.repeats)]
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
        result["layers"][layer] = json.loads(proc.stdout)
    result["loadavg_end"] = loadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
