"""Wall time of the small commands (cold process) of this checkout, side by side with a baseline checkout.

    python benchmarks/cli_latency.py --baseline-src /work/main/src --repeats 5
    python benchmarks/cli_latency.py --markdown benchmarks/results/cli_latency.json   # docs table

Each case is one ``subprocess.run`` of the installed ``rankwise`` entry point (beside the running
interpreter) with ``PYTHONPATH`` set to a checkout's ``src``: Python's start, the imports and the
work, as a user sees it. Cases: ``rankwise --help``, ``rankwise config``, ``rankwise config dir``,
``rankwise evaluate RUN`` (with and without plots) and ``rankwise predict RUN --data FILE`` of a
small abalone run (trained once here with ``trainer.max_epochs=1`` unless ``--run`` names one; FILE
is 500 rows of the abalone CSV), and the floors ``python -c pass`` and ``python -c 'import torch'``.
One warm-up round (it writes the bytecode caches), then ``--repeats`` rounds, each running every
case once in a fresh random order so that the load of other jobs hits all of them alike; the
median wall time and the 1-minute load average read just before each run are recorded, with the
CPU time (user + system) of the process. The standard output of each command is compared between
the baseline and this checkout (``same_output``). Writes ``benchmarks/results/cli_latency.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import load_range, provenance, read
from _timing import loadavg, machine

ROOT = Path(__file__).resolve().parents[1]
ENTRY = Path(sys.executable).parent / "rankwise"
#: goals of the small commands (seconds of wall time, cold process)
GOALS = {"--help": 0.3, "config": 0.3, "evaluate": 1.5, "predict": 1.5}


def _env(src: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    env["RANKWISE_DEBUG"] = "0"
    env["COLUMNS"] = "120"  # the same table layout in every run
    return env


def _commit(path: Path) -> str | None:
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _dirty(path: Path) -> bool:
    out = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "src"], capture_output=True, text=True)
    return bool(out.stdout.strip())


def _predict_file(tmp: Path, rows: int = 500) -> Path:
    """The first ``rows`` rows of the abalone CSV shipped with scikit-lego, as a plain CSV."""
    code = "from rankwise.data.tabular import abalone_path; print(abalone_path())"
    zpath = subprocess.run(
        [sys.executable, "-c", code], env=_env(ROOT / "src"), check=True, capture_output=True, text=True
    ).stdout.strip()
    with zipfile.ZipFile(zpath) as z:
        lines = z.read(z.namelist()[0]).decode().splitlines()
    out = tmp / "abalone_rows.csv"
    out.write_text("\n".join(lines[: rows + 1]) + "\n")
    return out


def _train(run: Path) -> None:
    args = ["train", "abalone_vanilla", "--set", "trainer.max_epochs=1", "--out", str(run)]
    subprocess.run([str(ENTRY), *args], env=_env(ROOT / "src"), check=True, capture_output=True)


def markdown(result: dict[str, Any]) -> str:
    """The docs table of a result: wall seconds of each command, this checkout beside the baseline."""
    res = result["results"]
    base = result.get("baseline", {}).get("commit")
    lines = [
        f"| command | this checkout, s | baseline `{base}`, s | same output | 1-minute load (median) |",
        "|---|---|---|---|---|",
    ]
    loads = [result.get("loadavg_before"), result.get("loadavg_after")]
    for key, r in res.items():
        if not key.endswith(" [this]"):
            continue
        case = key[: -len(" [this]")]
        b = res.get(f"{case} [baseline]", {})
        same = result.get("same_output", {}).get(case)
        verb, _, rest = case.partition(" ")
        cmd = " ".join(w for w in ("rankwise", verb, "RUN" if verb in ("evaluate", "predict") else "", rest) if w)
        label = f"`{cmd} --data FILE` ({result.get('predict_rows', '?')} rows)" if verb == "predict" else f"`{cmd}`"
        baseline = f"{b['wall_s']:.2f}" if "wall_s" in b else "–"
        lines.append(
            f"| {label} | {r['wall_s']:.2f} | {baseline} | {'yes' if same else 'no' if same is not None else '–'} | "
            f"{r.get('loadavg_1m_median', float('nan')):.1f} |"
        )
    for key in ("python -c pass", "import torch"):
        if key in res:
            cmd = "python -c pass" if key == "python -c pass" else "python -c 'import torch'"
            lines.append(f"| `{cmd}` | {res[key]['wall_s']:.2f} | – | – | {res[key].get('loadavg_1m_median', 0):.1f} |")
    lines += [
        "",
        provenance(
            "cli_latency.py",
            commit=result.get("commit"),
            date=result.get("date"),
            machine=result.get("machine"),
            load=load_range(*loads),
            threads="not set (each command's default)",
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline-src", type=Path, default=Path("/work/main/src"), help="src/ of the baseline checkout")
    p.add_argument("--run", type=Path, default=None, help="a finished abalone run (default: train one)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cli_latency.json")
    p.add_argument("--markdown", type=Path, default=None, help="print the docs table of this result JSON and stop")
    a = p.parse_args()
    if a.markdown is not None:
        print(markdown(read(a.markdown)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="cli_latency_"))
    run = a.run
    if run is None:
        run = tmp / "abalone_vanilla"
        _train(run)
    data = _predict_file(tmp)
    commands = {
        "--help": ["--help"],
        "config": ["config"],
        "config dir": ["config", "dir"],
        "evaluate": ["evaluate", str(run)],
        "evaluate --no-plots": ["evaluate", str(run), "--no-plots"],
        "predict": ["predict", str(run), "--data", str(data), "--out", str(tmp / "pred.csv"), "--overwrite"],
    }
    sources = {"baseline": a.baseline_src, "this": ROOT / "src"}
    cases: dict[str, list[str]] = {}
    for label in sources:
        for name, args in commands.items():
            cases[f"{name} [{label}]"] = [str(ENTRY), *args]
    floors = {"python -c pass": [sys.executable, "-c", "pass"], "import torch": [sys.executable, "-c", "import torch"]}
    cases.update(floors)

    def env_of(case: str) -> dict[str, str]:
        for label, src in sources.items():
            if case.endswith(f"[{label}]"):
                return _env(src)
        return _env(None)

    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    load: dict[str, list[float]] = {k: [] for k in cases}
    stdout: dict[str, str] = {}
    load_before = loadavg()
    for rep in range(a.repeats + 1):  # round 0 writes the bytecode caches and warms the file cache
        order = list(cases)
        random.shuffle(order)
        for name in order:
            la = loadavg()
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            out = subprocess.run(cases[name], env=env_of(name), capture_output=True, text=True)
            t1 = time.perf_counter()
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if out.returncode != 0:
                raise SystemExit(f"{name} exited {out.returncode}: {out.stderr[-2000:]}")
            stdout[name] = out.stdout
            if rep:
                wall[name].append(t1 - t0)
                cpu[name].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
                load[name].append(la[0] if la else float("nan"))
    results = {
        k: {
            "wall_s": round(statistics.median(wall[k]), 3),
            "cpu_s": round(statistics.median(cpu[k]), 3),
            "loadavg_1m_median": round(statistics.median(load[k]), 2),
            "wall_samples_s": [round(x, 3) for x in wall[k]],
            "loadavg_1m_samples": [round(x, 2) for x in load[k]],
        }
        for k in cases
    }
    same = {name: stdout[f"{name} [baseline]"] == stdout[f"{name} [this]"] for name in commands}
    result = {
        "benchmark": "cli_latency",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(ROOT),
        "uncommitted_changes_in_src": _dirty(ROOT),
        "baseline": {"src": str(a.baseline_src), "commit": _commit(a.baseline_src)},
        "machine": machine(),
        "shared_machine": "other jobs ran during the measurement: see the load average beside each number",
        "entry_point": str(ENTRY),
        "run": str(run),
        "predict_rows": 500,
        "repeats": a.repeats,
        "goals_wall_s": GOALS,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "same_output": same,
        "results": results,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'case':<22} {'baseline wall':>14} {'this wall':>10} {'load':>6}  same output")
    for name in commands:
        b, t = results[f"{name} [baseline]"], results[f"{name} [this]"]
        print(f"{name:<22} {b['wall_s']:>12.2f} s {t['wall_s']:>8.2f} s {t['loadavg_1m_median']:>6.2f}  {same[name]}")
    for name in floors:
        r = results[name]
        print(f"{name:<22} {r['wall_s']:>12.2f} s {'':>10} {r['loadavg_1m_median']:>6.2f}")


if __name__ == "__main__":
    main()
