"""Wall time of ``rankwise evaluate RUN_DIR`` on a trained abalone run, side by side with a baseline checkout.

    python benchmarks/evaluate_cli.py --run runs/abalone_vanilla --baseline-src /path/to/old/src --repeats 3

Each repeat runs every case once, in a fresh random order (``_timing.time_cases``), as separate
processes (the command's wall time includes Python's start and the imports, as a user sees it);
``import lightning`` alone is timed too, as the floor of every command that loads a run. Writes
``benchmarks/results/evaluate_cli.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import loadavg, machine, time_cases

ROOT = Path(__file__).resolve().parents[1]


def _cmd(src: Path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(src), "RANKWISE_DEBUG": "0"}
    subprocess.run([sys.executable, "-m", "rankwise.cli", *args], env=env, check=True, capture_output=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, required=True, help="a finished abalone run directory")
    p.add_argument("--baseline-src", type=Path, required=True, help="the src/ folder of the baseline checkout")
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
    }
    before = loadavg()
    res = time_cases(cases, a.repeats, warmup=1)
    out = {"machine": machine(), "loadavg_before": before, "loadavg_after": loadavg(), "results_ms": res}
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, r in res.items():
        print(f"{name:<34} median {r['median_ms'] / 1000:6.2f} s")


if __name__ == "__main__":
    main()
