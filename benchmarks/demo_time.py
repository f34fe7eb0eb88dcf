"""Wall time of ``rankwise demo`` (cold processes), side by side with a baseline checkout, and where it goes.

    python benchmarks/demo_time.py --baseline-src /work/main/src --repeats 3
    python benchmarks/demo_time.py --phases-only              # the breakdown alone (one in-process demo)
    python benchmarks/demo_time.py --markdown benchmarks/results/demo_time.json

Each timed case is one ``subprocess.run`` of the installed ``rankwise`` entry point (beside the running
interpreter) with ``PYTHONPATH`` set to a checkout's ``src``: ``rankwise demo --out TMP`` (nine runs:
three methods x seeds 0, 1, 2), Python's start, the imports, the training, the plots and the report, as
a user sees it. One warm-up round of ``rankwise demo --quick`` per checkout (bytecode and font caches),
then ``--repeats`` rounds, each running the baseline's and this checkout's demo in a fresh random order
so that the load of other jobs hits both alike; the median wall time, the CPU time (user + system) and
the 1-minute load average read just before each run are recorded. The demo's printed tables (every
line but those naming seconds) are compared between the two checkouts (``same_table``): the same seeds
must give the same numbers.

``phases``: one more demo of this checkout in this process, its runs one after the other (``--jobs 1``:
the forked workers of the default would time their phases out of sight), with a timer around each phase (exclusive
time: a phase's time excludes that of the phases it calls): the imports, reading the data, the
Trainer's construction, the training steps, validation, checkpoint writing, the loggers, testing and
prediction, the plots, the report and the files of each run; ``other`` is the rest.
Writes ``benchmarks/results/demo_time.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import io
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENTRY = Path(sys.executable).parent / "rankwise"
#: the goal of the issue: the demo in at most this many seconds of wall time on two quiet cores
GOAL_S = 15.0


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _env(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(src)
    env["RANKWISE_DEBUG"] = "0"
    env["COLUMNS"] = "120"  # the same table layout in every run
    env.pop("RANKWISE_DEMO_QUICK", None)
    return env


def _commit(path: Path) -> str | None:
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _dirty(path: Path) -> bool:
    out = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "src"], capture_output=True, text=True)
    return bool(out.stdout.strip())


def table_of(stdout: str) -> str:
    """The demo's result tables: its printed lines without the lines of single runs (they name seconds,
    which differ from run to run, in a layout of their own) and the lines naming seconds or the report."""
    keep = [
        line.rstrip()
        for line in stdout.splitlines()
        if not re.search(r"seed \d+: MAE|\d s\]|\d s\)|total |\(\d+ s\)", line) and not line.startswith("report:")
    ]
    return "\n".join(line for line in keep if line.strip())


def same_table(result: dict[str, Any]) -> bool:
    """Whether both checkouts printed the same result tables (compared again with :func:`table_of` where the
    JSON holds the tables of both)."""
    tables = result.get("tables")
    if not tables:
        return bool(result["same_table"])
    return len({table_of(t) for k in ("baseline", "this") for t in tables[k]}) == 1


# ---------------------------------------------------------------------------------------------- phases


class _Phases:
    """Exclusive wall time per phase: a timer stack, each patched function charged its own time only."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list[Any]] = []  # [phase, start, time of the phases it called]

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            frame = [phase, time.perf_counter(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self._stack.pop()
                total = time.perf_counter() - frame[1]
                self.seconds[phase] = self.seconds.get(phase, 0.0) + total - frame[2]
                self.calls[phase] = self.calls.get(phase, 0) + 1
                if self._stack:
                    self._stack[-1][2] += total

        return timed

    def patch(self, owner: Any, name: str, phase: str) -> None:
        setattr(owner, name, self.wrap(phase, getattr(owner, name)))


def phases() -> dict[str, Any]:
    """One ``rankwise demo`` in this process with a timer around each phase (see the module doc)."""
    t_start = time.perf_counter()
    ph = _Phases()
    t0 = time.perf_counter()
    import lightning.pytorch as lp
    import torch
    from lightning.pytorch.loops import evaluation_loop, training_epoch_loop

    import rankwise.cli as cli
    from rankwise.recipes import reports, rundir
    from rankwise.recipes.rundir import _files, _lifecycle, _record, _trainer

    ph.seconds["imports"] = time.perf_counter() - t0
    ph.calls["imports"] = 1
    ph.patch(rundir, "load_data", "read the data")
    ph.patch(lp.Trainer, "__init__", "Trainer construction")
    ph.patch(training_epoch_loop._TrainingEpochLoop, "advance", "training steps")
    ph.patch(evaluation_loop._EvaluationLoop, "run", "validation, test, predict loops")
    ph.patch(lp.Trainer, "save_checkpoint", "checkpoints (save, fsync)")
    ph.patch(_trainer.Run, "checked", "checkpoints (load, check)")
    for mod, name in [(lp.loggers.CSVLogger, "save"), (lp.loggers.CSVLogger, "log_metrics")]:
        ph.patch(mod, name, "loggers (CSV, TensorBoard)")
    for name in ("log_metrics", "save", "log_hyperparams", "finalize"):
        ph.patch(lp.loggers.TensorBoardLogger, name, "loggers (CSV, TensorBoard)")
    for name in dir(reports):
        if name.startswith("plot_") or name in ("save_figure", "pyplot"):
            ph.patch(reports, name, "plots")
    ph.patch(reports, "write_compare_report", "report")
    for owner, name in [
        (_lifecycle.RunDir, "open"),
        (_lifecycle.RunDir, "check"),
        (_lifecycle.RunDir, "write_config"),
        (_lifecycle.RunDir, "update_meta"),
        (_lifecycle, "write_json"),
        (_record, "record_data"),
        (_lifecycle, "git_hash"),
    ]:
        with contextlib.suppress(AttributeError):
            ph.patch(owner, name, "run files (config, meta, data record)")
    del _files
    out = Path(tempfile.mkdtemp(prefix="demo_phases_"))
    buf = io.StringIO()
    t_run = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        try:
            cli.app(["demo", "--out", str(out), "--jobs", "1"], standalone_mode=False)
        except SystemExit as e:  # pragma: no cover - a failed demo
            if e.code:
                raise
    total = time.perf_counter() - t_run
    seconds = {k: round(v, 3) for k, v in sorted(ph.seconds.items(), key=lambda kv: -kv[1])}
    accounted = sum(v for k, v in ph.seconds.items() if k != "imports")
    seconds["other"] = round(total - accounted, 3)
    return {
        "threads": torch.get_num_threads(),
        "total_in_process_s": round(total + ph.seconds["imports"], 3),
        "since_benchmark_start_s": round(time.perf_counter() - t_start, 3),
        "seconds": seconds,
        "calls": ph.calls,
        "table": table_of(buf.getvalue()),
    }


# ---------------------------------------------------------------------------------------------- runs


def _demo(src: Path, out: Path, quick: bool = False) -> tuple[float, float, str]:
    args = [str(ENTRY), "demo", "--out", str(out)] + (["--quick"] if quick else [])
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(args, env=_env(src), capture_output=True, text=True)
    t1 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"rankwise demo ({src}) exited {res.returncode}: {res.stderr[-2000:]}")
    return t1 - t0, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, res.stdout


def markdown(result: dict[str, Any]) -> str:
    """The docs table of a result of this script (wall times, the goal and the phase breakdown)."""
    m = result["machine"]
    lines = [
        f"`rankwise demo` (nine runs: 3 methods x 3 seeds), cold process, median of {result['repeats']}; "
        f"rankwise `{result['commit']}`{' (+ uncommitted changes)' if result.get('uncommitted_changes_in_src') else ''}"
        f" vs baseline `{result['baseline']['commit']}`, {result['date'][:10]}, {m['cpu_count']} CPUs, "
        f"torch {m['torch']}, {result['threads']} threads, load average "
        f"{result['loadavg_before'][0] if result['loadavg_before'] else 'n/a'} before / "
        f"{result['loadavg_after'][0] if result['loadavg_after'] else 'n/a'} after.",
        "",
        "| checkout | wall (s) | CPU (s) | load (1 min) | same table |",
        "|---|---|---|---|---|",
    ]
    for label in ("baseline", "this"):
        r = result["results"][label]
        lines.append(
            f"| {label} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['loadavg_1m_median']:.2f} | "
            f"{'yes' if same_table(result) else 'no'} |"
        )
    ph = result.get("phases")
    if ph:
        lines += [
            "",
            f"Where the demo's time goes (this checkout, one in-process demo, {ph['total_in_process_s']:.1f} s; "
            "exclusive seconds):",
            "",
            "| phase | seconds | calls |",
            "|---|---|---|",
        ]
        for name, sec in ph["seconds"].items():
            lines.append(f"| {name} | {sec:.2f} | {ph['calls'].get(name, '')} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline-src", type=Path, default=Path("/work/main/src"), help="src/ of the baseline checkout")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--phases-only", action="store_true", help="print the in-process breakdown alone (no JSON)")
    p.add_argument("--no-phases", action="store_true", help="skip the in-process breakdown")
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="print the docs table of a result")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "demo_time.json")
    a = p.parse_args()
    if a.markdown is not None:
        print(markdown(json.loads(a.markdown.read_text(encoding="utf-8"))))
        return
    if a.phases_only:
        print(json.dumps(phases(), indent=1))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _timing import machine

    tmp = Path(tempfile.mkdtemp(prefix="demo_time_"))
    sources = {"baseline": a.baseline_src, "this": ROOT / "src"}
    for label, src in sources.items():  # bytecode, matplotlib's font cache, the file cache
        _demo(src, tmp / f"warmup_{label}", quick=True)
    wall: dict[str, list[float]] = {k: [] for k in sources}
    cpu: dict[str, list[float]] = {k: [] for k in sources}
    load: dict[str, list[float]] = {k: [] for k in sources}
    tables: dict[str, set[str]] = {k: set() for k in sources}
    load_before = _loadavg()
    for rep in range(a.repeats):
        order = list(sources)
        random.shuffle(order)
        for label in order:
            la = _loadavg()
            w, c, stdout = _demo(sources[label], tmp / f"{label}_{rep}")
            wall[label].append(w)
            cpu[label].append(c)
            load[label].append(la[0] if la else float("nan"))
            tables[label].add(table_of(stdout))
    ph = None if a.no_phases else phases()
    import torch

    results = {
        k: {
            "wall_s": round(statistics.median(wall[k]), 2),
            "cpu_s": round(statistics.median(cpu[k]), 2),
            "loadavg_1m_median": round(statistics.median(load[k]), 2),
            "wall_samples_s": [round(x, 2) for x in wall[k]],
            "loadavg_1m_samples": [round(x, 2) for x in load[k]],
        }
        for k in sources
    }
    same = len(tables["baseline"] | tables["this"]) == 1
    result = {
        "benchmark": "demo_time",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(ROOT),
        "uncommitted_changes_in_src": _dirty(ROOT),
        "baseline": {"src": str(a.baseline_src), "commit": _commit(a.baseline_src)},
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "shared_machine": "other jobs may have run during the measurement: see the load average beside each number",
        "entry_point": str(ENTRY),
        "command": "rankwise demo --out TMP",
        "repeats": a.repeats,
        "goal_wall_s": GOAL_S,
        "loadavg_before": load_before,
        "loadavg_after": _loadavg(),
        "same_table": same,
        "table": sorted(tables["this"])[0],
        "results": results,
        "phases": ph,
    }
    if not same:
        result["tables"] = {k: sorted(v) for k, v in tables.items()}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
