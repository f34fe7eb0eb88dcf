"""Time of ``rankwise evaluate RUN_DIR`` on a trained abalone run, side by side with a baseline checkout.

    python benchmarks/evaluate_cli.py --run runs/abalone_vanilla --baseline-src /path/to/old/src --repeats 3

Each repeat runs every case once, in a fresh random order, as separate processes: the wall time
(Python's start and the imports included, as a user sees it) and the CPU time of the process
(user + system: the primary figure on a shared machine, where the wall time mostly measures the
other jobs); medians over the repeats after one warm-up round. ``import torch`` alone (the floor
of any command that runs a model) and ``import lightning`` alone are timed too. Before timing, the
metrics.json written by the baseline and by this checkout are compared (``same_metrics``).
Writes ``benchmarks/results/evaluate_cli.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import loadavg, machine

ROOT = Path(__file__).resolve().parents[1]


def _cmd(src: Path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(src), "RANKWISE_DEBUG": "0"}
    subprocess.run([sys.executable, "-m", "rankwise.cli", *args], env=env, check=True, capture_output=True)


def _metrics_after(src: Path, run: Path) -> dict:
    _cmd(src, ["evaluate", str(run), "--no-plots"])
    return json.loads((run / "metrics.json").read_text())


def _commit(src: Path) -> str | None:
    out = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or None if out.returncode == 0 else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, required=True, help="a finished abalone run directory")
    p.add_argument("--baseline-src", type=Path, required=True, help="the src/ folder of the baseline checkout")
    p.add_argument("--baseline-label", default="", help="e.g. the baseline's commit (recorded in the JSON)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "evaluate_cli.json")
    a = p.parse_args()
    src = ROOT / "src"
    cases = {
        "evaluate (baseline)": lambda: _cmd(a.baseline_src, ["evaluate", str(a.run)]),
        "evaluate": lambda: _cmd(src, ["evaluate", str(a.run)]),
        "evaluate --no-plots (baseline)": lambda: _cmd(a.baseline_src, ["evaluate", str(a.run), "--no-plots"]),
        "evaluate --no-plots": lambda: _cmd(src, ["evaluate", str(a.run), "--no-plots"]),
        "python -c 'import lightning'": lambda: subprocess.run([sys.executable, "-c", "import lightning"], check=True),
        "python -c 'import torch'": lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True),
    }
    same = _metrics_after(a.baseline_src, a.run) == _metrics_after(src, a.run)
    before = loadavg()
    res = _time(cases, a.repeats)
    out = {
        "machine": machine(),
        "shared_machine": "other jobs ran during the measurement: compare the CPU seconds; wall times are noisy",
        "baseline": a.baseline_label or str(a.baseline_src),
        "commit": _commit(ROOT),
        "run": str(a.run),
        "same_metrics": same,
        "loadavg_before": before,
        "loadavg_after": loadavg(),
        "results_s": res,
    }
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"metrics.json of the baseline and of this checkout identical: {same}")
    for name, r in res.items():
        print(f"{name:<34} CPU {r['cpu_s']:6.2f} s   wall {r['wall_s']:6.2f} s")


def _time(cases: dict[str, Callable[[], None]], repeats: int) -> dict[str, dict[str, float]]:
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    for rep in range(repeats + 1):  # round 0 warms the file cache
        order = list(cases)
        random.shuffle(order)
        for name in order:
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            cases[name]()
            t1 = time.perf_counter()
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if rep:
                wall[name].append(t1 - t0)
                cpu[name].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return {
        k: {
            "cpu_s": statistics.median(cpu[k]),
            "wall_s": statistics.median(wall[k]),
            "repeats": repeats,
            "cpu_samples_s": [round(x, 3) for x in cpu[k]],
            "wall_samples_s": [round(x, 3) for x in wall[k]],
        }
        for k in cases
    }


if __name__ == "__main__":
    main()
