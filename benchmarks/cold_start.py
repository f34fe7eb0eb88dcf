"""Cold start: import time, the first isotonic call in a fresh process, and ``rankwise --help``.

Usage::

    python benchmarks/cold_start.py --runs 5
    python benchmarks/cold_start.py --markdown benchmarks/results/cold_start.json   # docs table

Every measurement runs in fresh Python processes (median over ``--runs``):

* ``import rankwise`` - the time of ``import torch; import rankwise`` minus ``import torch``,
  measured inside one process (the package loads lazily: torch is imported on first use);
* the first ``soft_rank(x, method="isotonic")`` forward + backward on a (4, 100) input, timed from
  after ``import torch`` (so it includes loading rankwise's operators), in the default mode
  (``RANKWISE_NUMBA=background``: the first calls take the PyTorch path while numba loads) and in
  ``RANKWISE_NUMBA=sync`` mode with a warm numba cache and with an empty one (a fresh install:
  ``NUMBA_CACHE_DIR`` pointing to a new folder);
* ``rankwise --help`` (``python -m rankwise.cli --help``), wall time of the whole process, and
  ``python -c pass`` for comparison.

The 1-minute load average is recorded with every figure; JSON in ``benchmarks/results/cold_start.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _tables import load_range, provenance, read
from _timing import loadavg, machine

IMPORT = """
import time
t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); import rankwise; t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""

FIRST_CALL = """
import time, torch
x = torch.randn(4, 100, requires_grad=True)
t0 = time.perf_counter()
import rankwise
rankwise.soft_rank(x, method="isotonic").sum().backward()
print(time.perf_counter() - t0)
"""


def _python(code: str, env: dict[str, str] | None = None) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return res.stdout.strip()


def _wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True, env=env)
    return time.perf_counter() - t0


def _summary(values: list[float]) -> dict[str, Any]:
    return {"median_s": statistics.median(values), "runs_s": values, "loadavg": loadavg()}


#: (key, what) of the docs table
_TABLE_ROWS = (
    ("import_torch", "`import torch`"),
    ("import_rankwise_after_torch", "`import rankwise` after `import torch`"),
    ("first_soft_rank_background", "first isotonic `soft_rank`, warm numba cache"),
    ("first_soft_rank_background_empty_cache", "first isotonic `soft_rank`, empty numba cache"),
    ("first_soft_rank_sync", "first isotonic `soft_rank` waiting for numba, warm cache"),
    ("first_soft_rank_sync_empty_cache", "first isotonic `soft_rank` waiting for numba, empty cache"),
    ("rankwise_help", "`rankwise --help`"),
    ("python_pass", "`python -c pass`"),
)


def markdown(result: dict[str, Any]) -> str:
    """The docs table of a result: the median seconds of each measurement, with its number of runs."""
    lines = ["| measurement (fresh processes) | median, s | runs |", "|---|---|---|"]
    loads = [result.get("loadavg_start"), result.get("loadavg_end")]
    for key, what in _TABLE_ROWS:
        if key in result:
            r = result[key]
            lines.append(f"| {what} | {r['median_s']:.4f} | {len(r['runs_s'])} |")
            loads.append(r.get("loadavg"))
    lines += [
        "",
        provenance(
            "cold_start.py",
            commit=result.get("commit"),
            date=result.get("date"),
            machine=result,
            load=load_range(*loads),
            threads=str(result.get("threads", "not recorded")),
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "cold_start.json")
    p.add_argument("--markdown", type=Path, default=None, help="print the docs table of this result JSON and stop")
    args = p.parse_args()
    if args.markdown is not None:
        print(markdown(read(args.markdown)))
        return
    base = dict(os.environ)
    base.pop("RANKWISE_NUMBA", None)
    result: dict[str, Any] = {**machine(), "loadavg_start": loadavg()}

    torch_s, delta_s = [], []
    for _ in range(args.runs):
        t, d = (float(v) for v in _python(IMPORT, base).split())
        torch_s.append(t)
        delta_s.append(d)
    result["import_torch"] = _summary(torch_s)
    result["import_rankwise_after_torch"] = _summary(delta_s)
    print(f"import torch {statistics.median(torch_s):.3f} s, then import rankwise {statistics.median(delta_s):.4f} s")

    _python(FIRST_CALL, {**base, "RANKWISE_NUMBA": "sync"})  # warm the numba cache
    for mode in ("background", "sync"):
        times = [float(_python(FIRST_CALL, {**base, "RANKWISE_NUMBA": mode})) for _ in range(args.runs)]
        result[f"first_soft_rank_{mode}"] = _summary(times)
        print(f"first soft_rank, RANKWISE_NUMBA={mode}, warm numba cache: {statistics.median(times):.3f} s")
    for mode in ("background", "sync"):
        times = []
        for _ in range(max(1, args.runs // 2)):
            with tempfile.TemporaryDirectory() as cache:  # a fresh install: nothing compiled yet
                env = {**base, "RANKWISE_NUMBA": mode, "NUMBA_CACHE_DIR": cache}
                times.append(float(_python(FIRST_CALL, env)))
        result[f"first_soft_rank_{mode}_empty_cache"] = _summary(times)
        print(f"first soft_rank, RANKWISE_NUMBA={mode}, empty numba cache: {statistics.median(times):.3f} s")

    help_s = [_wall([sys.executable, "-m", "rankwise.cli", "--help"], base) for _ in range(args.runs)]
    pass_s = [_wall([sys.executable, "-c", "pass"], base) for _ in range(args.runs)]
    result["rankwise_help"] = _summary(help_s)
    result["python_pass"] = _summary(pass_s)
    print(f"rankwise --help {statistics.median(help_s):.3f} s (python -c pass {statistics.median(pass_s):.3f} s)")
    result["loadavg_end"] = loadavg()
    result["targets"] = {
        "import_rankwise_after_torch": "< 0.5 s",
        "first_soft_rank_background_empty_cache": "< 0.5 s",
        "rankwise_help": "< 1 s",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
