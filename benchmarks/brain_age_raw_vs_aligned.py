"""TSAN on raw scans through ``rankwise preprocess`` against the same subjects' aligned volumes.

One synthetic cohort (``rankwise data make brain-age-synthetic --raw --spacing 4``: every subject's
aligned 4 mm MNI volume is kept in ``truth/``, the raw scan beside it) gives two arms:

* *aligned*: the generator's MNI-space volumes (``truth/aligned.csv``); checked voxel for voxel
  against the aligned mode of the generator (``--spacing 4`` without ``--raw``, same ``--n`` and seed);
* *raw*: the raw scans through ``rankwise preprocess --template mni152_4mm``.

Both CSVs carry the same ``split`` column (a seeded permutation of the subjects that preprocessing kept:
10 % val, 20 % test), so both arms train, select and test on the same subjects. Each arm trains the
``brain_age_tsan_synthetic`` preset (``rankwise train`` subprocesses, ``trainer.num_threads=1``) for
each seed in ``--seeds``, the two arms of a seed (``--together``: all runs) at the same time so that the
machine's load falls on both alike. Recorded per run: test MAE, the bias-corrected test MAEs the run
reports, validation MAE, wall seconds; per arm mean and SD over seeds; the difference of the means and
a Welch t-test. "Within the seed noise" is ``|difference| <= the larger of the two SDs``. JSON:
``benchmarks/results/brain_age_raw_vs_aligned.json`` (``--out``).

    PYTHONPATH=src nice -n 5 python benchmarks/brain_age_raw_vs_aligned.py --n 100 --work /tmp/rva

``--epochs E,S`` overrides the two stages' epochs (a quick check of the script: ``--n 12 --epochs 1,1``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import loadavg, machine

PRESET = "brain_age_tsan_synthetic"
ROOT = Path(__file__).resolve().parent.parent


def _cli() -> list[str]:
    """The venv's ``rankwise`` console script (this checkout's ``src`` first on ``PYTHONPATH``, see :func:`_env`)."""
    return [str(Path(sys.executable).parent / "rankwise")]


def _env() -> dict[str, str]:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    return env


def _run(cmd: list[str], log: Path, commands: list[str]) -> float:
    """Run ``cmd`` (output to ``log``), return its wall seconds; stop on a failure other than exit 1 of preprocess."""
    commands.append(shlex.join(cmd))
    print("$", shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    with log.open("w") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env()).returncode
    wall = time.perf_counter() - t0
    if rc != 0 and not (cmd[1] == "preprocess" and rc == 1):
        sys.exit(f"error: `{shlex.join(cmd)}` exited {rc}; see {log}")
    return wall


def _start(cmd: list[str], log: Path, commands: list[str]) -> tuple[subprocess.Popen[bytes], float, Any]:
    """Start ``cmd`` in the background (output to ``log``): ``(process, start time, log file)``."""
    commands.append(shlex.join(cmd))
    print("$", shlex.join(cmd), "&", flush=True)
    fh = log.open("w")
    return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env()), time.perf_counter(), fh


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _splits(subjects: list[str], seed: int = 0) -> dict[str, str]:
    order = np.random.default_rng(seed).permutation(len(subjects))
    n_val, n_test = round(0.1 * len(subjects)), round(0.2 * len(subjects))
    names = sorted(subjects)
    return {names[k]: "val" if r < n_val else "test" if r < n_val + n_test else "train" for r, k in enumerate(order)}


def _summary(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else float("nan")}


def _welch(a: list[float], b: list[float]) -> dict[str, float]:
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return {"t": float("nan"), "p": float("nan")}
    res = stats.ttest_ind(a, b, equal_var=False)
    return {"t": float(res.statistic), "p": float(res.pvalue)}


def markdown(res: dict[str, Any]) -> str:
    """The docs table of a result: per arm the test MAE of each seed, mean ± SD, the bias-corrected MAE."""

    def cell(arm: str, key: str = "test_mae") -> str:
        per = [r for r in res["runs"] if r["arm"] == arm]
        return ", ".join("-" if r.get(key) is None else f"{r[key]:.2f}" for r in per)

    lines = [
        "| | aligned volumes | raw scans + `rankwise preprocess` |",
        "|---|---|---|",
        f"| test MAE, years, seeds {', '.join(map(str, res['seeds']))} | {cell('aligned')} | {cell('raw')} |",
    ]
    a, r = res["arms"]["aligned"], res["arms"]["raw"]
    lines.append(
        f"| mean ± SD | {a['test_mae']['mean']:.2f} ± {a['test_mae']['sd']:.2f} "
        f"| {r['test_mae']['mean']:.2f} ± {r['test_mae']['sd']:.2f} |"
    )
    for m in ("gap", "prediction"):
        if m in a["test_mae_bias_corrected"] and m in r["test_mae_bias_corrected"]:
            x, y = a["test_mae_bias_corrected"][m], r["test_mae_bias_corrected"][m]
            lines.append(
                f"| bias-corrected MAE (`{m}`), mean ± SD | {x['mean']:.2f} ± {x['sd']:.2f} "
                f"| {y['mean']:.2f} ± {y['sd']:.2f} |"
            )
    rows = (
        ("test_prediction_sd", "SD of the test predictions, years"),
        ("stage1_test_mae", "first stage alone: test MAE"),
        ("test_pearson", "test Pearson r"),
    )
    seeds = ", ".join(map(str, res["seeds"]))
    for key, what in rows:
        lines.append(f"| {what}, seeds {seeds} | {cell('aligned', key)} | {cell('raw', key)} |")
    lines.append(f"| train wall s per run (mean) | {a['wall_s']['mean']:.0f} | {r['wall_s']['mean']:.0f} |")
    w = res["welch_t_test"]
    lines.append("")
    lines.append(
        f"Difference of the means (raw - aligned): {res['difference_raw_minus_aligned']:+.2f} years; the larger "
        f"SD over seeds {res['seed_noise_larger_sd']:.2f}: "
        f"{res['verdict']} (Welch t = {w['t']:.2f}, p = {w['p']:.2f})."
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument(
        "--use", type=int, default=0, help="train on the first USE subjects of a cohort of --n made before (all)"
    )
    ap.add_argument("--together", action="store_true", help="train every seed's two runs at the same time")
    ap.add_argument("--markdown", type=Path, default=None, help="print the docs table of a result JSON and stop")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--workers", type=int, default=2, help="rankwise preprocess --workers")
    ap.add_argument("--epochs", default="", help="E,S: first- and second-stage epochs (the preset's 8,2)")
    ap.add_argument("--work", type=Path, default=None, help="a folder for the cohort, the runs and the logs")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "brain_age_raw_vs_aligned.json")
    args = ap.parse_args()
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    if args.work is None:
        ap.error("the following arguments are required: --work")
    seeds = [int(s) for s in args.seeds.split(",")]
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    commands: list[str] = []
    load = {"start": loadavg()}
    t_all = time.perf_counter()

    # the cohort: raw scans + the aligned volumes of the same subjects; and the aligned mode, to check them
    make = [*_cli(), "data", "make", "brain-age-synthetic", "--n", str(args.n), "--spacing", "4"]
    raw_dir, aligned_dir = work / "raw", work / "aligned"
    gen_raw: float | None = None  # None: made by an earlier call
    gen_aligned: float | None = None
    if not (raw_dir / "participants.csv").exists():
        gen_raw = _run([*make, "--raw", "--out", str(raw_dir)], logs / "make_raw.log", commands)
    if not (aligned_dir / "participants.csv").exists():
        gen_aligned = _run([*make, "--out", str(aligned_dir)], logs / "make_aligned.log", commands)
    import nibabel as nib

    use = slice(0, args.use or None)  # the same first rows of both modes (a cohort's sexes depend on its n)
    raw_rows = _read(raw_dir / "participants.csv")[use]
    aligned_rows = _read(aligned_dir / "participants.csv")[use]
    truth_rows = _read(raw_dir / "truth" / "aligned.csv")[use]
    keys = ("age", "sex", "site", "subject")
    same_table = [{k: r[k] for k in keys} for r in raw_rows] == [{k: r[k] for k in keys} for r in aligned_rows]
    same_table &= [{k: r[k] for k in keys} for r in truth_rows] == [{k: r[k] for k in keys} for r in aligned_rows]
    same_volumes = all(
        np.array_equal(
            np.asarray(nib.load(str(aligned_dir / a["path"])).dataobj),
            np.asarray(nib.load(str(raw_dir / "truth" / t["path"])).dataobj),
        )
        for a, t in zip(aligned_rows, truth_rows, strict=True)
    )
    if not (same_table and same_volumes):
        sys.exit("error: the raw cohort's aligned volumes are not the aligned mode's subjects")

    # preprocess the raw scans (absolute paths: the CSV is read from the work folder)
    raw_csv = work / "raw_input.csv"
    _write(raw_csv, [r | {"path": str(raw_dir / r["path"])} for r in raw_rows])
    pre_dir = work / "preprocessed"
    pre = [*_cli(), "preprocess", str(raw_csv), "--out", str(pre_dir), "--template", "mni152_4mm"]
    pre += ["--workers", str(args.workers), "--no-progress"]
    preprocess_wall = _run(pre, logs / "preprocess.log", commands)
    pre_rows = _read(pre_dir / "participants.csv")
    kept = [r["subject"] for r in pre_rows]
    failed = sorted(set(r["subject"] for r in raw_rows) - set(kept))
    records = {r["subject"]: json.loads((pre_dir / "records" / f"{r['subject']}.json").read_text()) for r in pre_rows}

    # one split for both arms, over the subjects both have
    split = _splits(kept)
    csvs = {
        "aligned": work / "aligned_split.csv",
        "raw": work / "raw_split.csv",
    }
    _write(
        csvs["aligned"],
        [
            {k: r[k] for k in keys} | {"path": str(aligned_dir / r["path"]), "split": split[r["subject"]]}
            for r in aligned_rows
            if r["subject"] in split
        ],
    )
    _write(
        csvs["raw"],
        [
            {k: r[k] for k in keys} | {"path": str((pre_dir / r["path"]).resolve()), "split": split[r["subject"]]}
            for r in pre_rows
        ],
    )

    sets = ["trainer.num_threads=1"]
    if args.epochs:
        e, s = args.epochs.split(",")
        sets += [f"trainer.max_epochs={int(e)}", f"task.stage2_epochs={int(s)}"]
    runs: list[dict[str, Any]] = []
    # the two arms of a seed (with --together: of every seed) train at the same time: the load falls on all alike
    for group in [seeds] if args.together else [[s] for s in seeds]:
        started = {}
        for seed in group:
            for arm in ("aligned", "raw"):
                out = work / "runs" / f"{arm}_seed{seed}"
                cmd = [*_cli(), "train", PRESET, "--set", f"data.options.csv={csvs[arm]}"]
                cmd += ["--set", f"run.seed={seed}", "--set", f"data.options.cache_dir={work / 'cache' / out.name}"]
                for s in sets:
                    cmd += ["--set", s]
                cmd += ["--out", str(out), "--overwrite", "--no-progress"]
                log = logs / f"train_{arm}_seed{seed}.log"
                started[arm, seed] = (out, cmd, _start(cmd, log, commands), loadavg())
        for (arm, seed), (out, cmd, (proc, t0, fh), before) in started.items():
            rc = proc.wait()
            wall = time.perf_counter() - t0
            fh.close()
            if rc != 0:
                sys.exit(f"error: `{shlex.join(cmd)}` exited {rc}; see {fh.name}")
            metrics = json.loads((out / "metrics.json").read_text())
            test = metrics["test"]
            preds = [float(p["pred"]) for p in _read(out / "predictions.csv") if p["split"] == "test"]
            runs.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "test_mae": test["mae"],
                    "test_mae_bias_corrected": {m: test.get(f"mae_{m}") for m in ("gap", "prediction")},
                    "test_pearson": test.get("pearson"),
                    "stage1_test_mae": test.get("stage1_mae"),
                    "test_prediction_sd": statistics.pstdev(preds),
                    "val_mae": metrics.get("val", {}).get("mae"),
                    "n_test": test.get("n"),
                    "wall_s": wall,
                    "load_before": before,
                    "load_after": loadavg(),
                }
            )
            print(f"{arm} seed {seed}: test MAE {test['mae']:.3f} ({wall:.0f} s)", flush=True)

    arms: dict[str, Any] = {}
    for arm in ("aligned", "raw"):
        maes = [r["test_mae"] for r in runs if r["arm"] == arm]
        arms[arm] = {"test_mae": _summary(maes), "wall_s": _summary([r["wall_s"] for r in runs if r["arm"] == arm])}
        corrected: dict[str, list[float]] = {}
        for r in runs:
            if r["arm"] == arm:
                for k, v in r["test_mae_bias_corrected"].items():
                    if v is not None:
                        corrected.setdefault(k, []).append(v)
        arms[arm]["test_mae_bias_corrected"] = {k: _summary(v) for k, v in corrected.items()}
    a = [r["test_mae"] for r in runs if r["arm"] == "aligned"]
    b = [r["test_mae"] for r in runs if r["arm"] == "raw"]
    diff = arms["raw"]["test_mae"]["mean"] - arms["aligned"]["test_mae"]["mean"]
    noise = max(arms["raw"]["test_mae"]["sd"], arms["aligned"]["test_mae"]["sd"])
    sim = [records[s]["similarity"] for s in kept]
    flat = all(r["test_prediction_sd"] < 0.1 for r in runs)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    status = subprocess.run(["git", "status", "--porcelain", "src"], capture_output=True, text=True, cwd=ROOT)
    dirty = bool(status.stdout)
    load["end"] = loadavg()
    result = {
        "what": f"TSAN ({PRESET}) on raw scans through rankwise preprocess vs the same subjects' aligned volumes",
        "n": len(raw_rows),
        "cohort_n": args.n,
        "seeds": seeds,
        "trained_together": "all seeds at once" if args.together else "the two arms of each seed at once",
        "epochs": args.epochs or "preset (8 + 2)",
        "split": {k: sum(v == k for v in split.values()) for k in ("train", "val", "test")},
        "test_subjects": sorted(s for s, v in split.items() if v == "test"),
        "same_subjects_checked": {"table": same_table, "volumes_identical": same_volumes},
        "preprocess": {
            "failed": failed,
            "wall_s": preprocess_wall,
            "scan_seconds_median": float(np.median([records[s]["seconds"] for s in kept])),
            "scan_seconds_sum": float(sum(records[s]["seconds"] for s in kept)),
            "workers": args.workers,
            "similarity_min": min(sim),
            "similarity_median": float(np.median(sim)),
            "low_similarity_subjects": sorted(s for s in kept if records[s]["similarity"] < 0.6),
            "restarted": sorted(s for s in kept if records[s].get("restarted")),
        },
        "generate_wall_s": {"raw": gen_raw, "aligned": gen_aligned},
        "runs": runs,
        "arms": arms,
        "difference_raw_minus_aligned": diff,
        "seed_noise_larger_sd": noise,
        # a run whose test predictions are one constant age learned no age signal: nothing to compare then
        "constant_prediction_runs": [f"{r['arm']} seed {r['seed']}" for r in runs if r["test_prediction_sd"] < 0.1],
        "within_seed_noise": None if flat else bool(abs(diff) <= noise),
        "verdict": (
            "not measured: every run predicts one constant age (no age signal learned)"
            if flat
            else "within the seed noise"
            if abs(diff) <= noise
            else "outside the seed noise"
        ),
        "rule": "within the seed noise: |mean raw - mean aligned| <= the larger of the two arms' SDs over seeds",
        "welch_t_test": _welch(b, a),
        "total_wall_s": time.perf_counter() - t_all,
        "commit": commit + ("+dirty" if dirty else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "load_average": load,
        "nice": os.nice(0),
        "commands": commands,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    keys_shown = ("arms", "difference_raw_minus_aligned", "verdict", "welch_t_test")
    print(json.dumps({k: result[k] for k in keys_shown}, indent=1))


if __name__ == "__main__":
    main()
