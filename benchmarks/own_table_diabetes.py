"""The own-table route on scikit-learn's diabetes data: docs/imbalanced.md's four-method table.

    python benchmarks/own_table_diabetes.py [--out runs/own_table_diabetes]

Writes ``diabetes.csv`` (``load_diabetes(as_frame=True, scaled=False)``) into OUT and trains, from
OUT, ``rankwise train --data diabetes.csv --target target --method M`` for M in vanilla, lds,
balanced_mse and ranksim (seed 0, one thread each, one after the other), then writes the test MAE
per shot group, the overall GM, the defaults line and the wall time of every run to
``benchmarks/results/own_table_diabetes.json`` with the commit, date and machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import loadavg, machine

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("vanilla", "lds", "balanced_mse", "ranksim")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/own_table_diabetes"))
    args = ap.parse_args()
    from sklearn.datasets import load_diabetes

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    load_diabetes(as_frame=True, scaled=False).frame.to_csv(out / "diabetes.csv", index=False)
    rows = {}
    for m in METHODS:
        cmd = ["train", "--data", "diabetes.csv", "--target", "target", "--method", m, "--no-progress"]
        cmd += ["--set", "report.tsne=false", "--set", "trainer.num_threads=1", "--out", f"runs/{m}", "--overwrite"]
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "rankwise.cli", *cmd], cwd=out, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"rankwise {' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
        wall = time.time() - t0
        test = json.loads((out / "runs" / m / "metrics.json").read_text())["test"]
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("defaults from")), None)
        rows[m] = {
            "mae": {g: test[g]["mae"] for g in ("all", "many", "medium", "few")},
            "gm_all": test["all"]["gmean"],
            "count": {g: test[g]["count"] for g in ("all", "many", "medium", "few")},
            "defaults_line": line,
            "wall_s": round(wall, 1),
        }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    result = {
        "command": "python benchmarks/own_table_diabetes.py",
        "commit": commit.stdout.strip(),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "loadavg_after": loadavg(),
        "methods": rows,
    }
    dest = ROOT / "benchmarks" / "results" / "own_table_diabetes.json"
    dest.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
