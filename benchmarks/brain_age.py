"""Brain-age pipeline speed: the NIfTI loader (cold and warm cache) against the training step of ScaleDense and SFCN.

Usage::

    python benchmarks/brain_age.py                     # loader + models at 2 and 4 mm, 1 and 2 threads
    python benchmarks/brain_age.py --skip-models       # loader only
    python benchmarks/brain_age.py --device cuda       # the model cases on a GPU (peak CUDA memory)

Loader: a synthetic cohort (``--n`` subjects, ``rankwise.data.make_brain_age_synthetic``, not timed)
at each grid; *cold* = ``load_nifti_csv`` into an empty cache (gzip decode, TorchIO resampling,
brain z-score, float16 write), *warm* = one pass of a ``DataLoader`` (``--workers``) over the cached
memory maps, both in volumes per second. Models: forward + backward of one batch (``--batch``) of the
TSAN first stage (``ScaleDense(8, 5)``, 102 M parameters) and SFCN (``channels 32..256``), median
of ``--repeats`` after a warm-up, in seconds per volume; each CPU case runs in its own process so
that its peak resident memory (``ru_maxrss``) is its own. The goal line compares the warm loader
with the ScaleDense training step on 2 threads at 2 mm (the loader should deliver >= 10x the
volumes the step consumes). The machine is shared: the 1-minute load average is recorded.
JSON: ``benchmarks/results/brain_age.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import loadavg, machine

GRIDS = {"2mm": (91, 109, 91), "4mm": (46, 54, 46)}


def _model(name: str) -> torch.nn.Module:
    from rankwise.models import SFCN, ScaleDense

    return ScaleDense(8, 5) if name == "scale_dense" else SFCN()


def model_case(name: str, grid: str, threads: int, batch: int, repeats: int, device: str) -> dict[str, Any]:
    """Seconds per volume of forward + backward (median of ``repeats`` after one warm-up) and peak memory."""
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    dev = torch.device(device)
    net = _model(name).to(dev).train()
    x = torch.randn(batch, 1, *GRIDS[grid], device=dev)
    sex = torch.nn.functional.one_hot(torch.arange(batch) % 2, 2).float().to(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)

    def step() -> None:
        net.zero_grad(set_to_none=True)
        out = net(x, sex) if name == "scale_dense" else net(x)
        out.float().sum().backward()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if dev.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "model": name,
        "grid": grid,
        "threads": threads,
        "device": device,
        "batch": batch,
        "s_per_volume": statistics.median(times) / batch,
        "times_s": times,
        "peak_memory_mb": peak_mb,
        "load": loadavg(),
    }


def loader_cases(n: int, workers: int, root: Path) -> list[dict[str, Any]]:
    from torch.utils.data import DataLoader

    from rankwise.data import load_nifti_csv, make_brain_age_synthetic

    out = []
    for grid, spacing in (("2mm", 2.0), ("4mm", 4.0)):
        csv = make_brain_age_synthetic(root / grid, n=n, spacing=spacing)
        cache = root / f"cache_{grid}"
        t0 = time.perf_counter()
        data = load_nifti_csv(str(csv), cache_dir=str(cache), shape=list(GRIDS[grid]), val_fraction=0, test_fraction=0)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        load_nifti_csv(str(csv), cache_dir=str(cache), shape=list(GRIDS[grid]), val_fraction=0, test_fraction=0)
        reopen = time.perf_counter() - t0
        rates = {}
        for w in sorted({0, workers}):
            dl = DataLoader(data.train, batch_size=8, num_workers=w)
            for _ in dl:  # warm-up pass (page cache, worker start)
                pass
            t0 = time.perf_counter()
            for _ in dl:
                pass
            rates[f"warm_volumes_per_s_workers{w}"] = n / (time.perf_counter() - t0)
        out.append(
            {
                "grid": grid,
                "n": n,
                "cold_volumes_per_s": n / cold,
                "reopen_cached_s": reopen,
                **rates,
                "load": loadavg(),
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=24, help="subjects of the loader cohort")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=2, help=">= 2: SFCN's BatchNorm sees 1x1x1 maps at 4 mm")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--skip-models", action="store_true")
    p.add_argument("--skip-loader", action="store_true")
    p.add_argument("--models", default="scale_dense,sfcn", help="comma-separated: scale_dense, sfcn")
    p.add_argument("--grids", default="2mm,4mm", help="comma-separated: 2mm, 4mm")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "brain_age.json"))
    p.add_argument("--case", nargs=3, metavar=("MODEL", "GRID", "THREADS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.batch < 2:
        p.error("--batch must be >= 2 (BatchNorm in training mode needs more than one value per channel)")
    if a.case:
        print(json.dumps(model_case(a.case[0], a.case[1], int(a.case[2]), a.batch, a.repeats, a.device)))
        return
    result: dict[str, Any] = {"machine": machine(), "note": "shared machine; see `load` (1/5/15-min load averages)"}
    if not a.skip_loader:
        with tempfile.TemporaryDirectory() as tmp:
            result["loader"] = loader_cases(a.n, a.workers, Path(tmp))
    models = []
    threads = [int(t) for t in a.threads.split(",")]
    for name in a.models.split(",") if not a.skip_models else ():
        for grid in a.grids.split(","):
            for t in threads if a.device == "cpu" else [threads[-1]]:
                if a.device == "cpu":
                    cmd = [sys.executable, __file__, "--case", name, grid, str(t), "--batch", str(a.batch)]
                    cmd += ["--repeats", str(a.repeats)]
                    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                else:
                    res = model_case(name, grid, t, a.batch, a.repeats, a.device)
                print(json.dumps(res), flush=True)
                models.append(res)
    result["models"] = models
    step = [m for m in models if m["model"] == "scale_dense" and m["grid"] == "2mm" and m["threads"] == 2]
    load = [r for r in result.get("loader", []) if r["grid"] == "2mm"]
    if step and load and a.device == "cpu":
        warm = max(v for k, v in load[0].items() if k.startswith("warm_volumes_per_s"))
        step_rate = 1.0 / step[0]["s_per_volume"]
        result["goal"] = {
            "warm_loader_volumes_per_s": warm,
            "scale_dense_2mm_2threads_volumes_per_s": step_rate,
            "ratio": warm / step_rate,
            "goal_ratio": 10.0,
        }
        print(json.dumps(result["goal"]), flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
