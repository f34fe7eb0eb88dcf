"""The brain-age rows of the ordinal table (docs/results.md, section 9b): 12 methods x seeds on the synthetic cohort.

Usage::

    rankwise data make brain-age-synthetic --n 200 --spacing 8 --out data/brain_age_synthetic_8mm
    python benchmarks/ordinal_brain_age.py --csv data/brain_age_synthetic_8mm/participants.csv \\
        --out runs/ordinal_brain_age                   # trains: one `rankwise compare` pass per seed
    python benchmarks/ordinal_brain_age.py --summarize runs/ordinal_brain_age   # only the JSON, from the runs

Training: ``nice -n 19 rankwise compare <the 12 presets> --seeds <s> --out OUT`` once per seed (all
methods of seed 0, then of seed 1, ...: a pass that runs out of time leaves whole seeds), every run
with one torch thread, no plots, the cohort's shared preprocessing cache; then ``rankwise compare
... --seeds 0,1,2`` (the finished runs are reused, nothing retrains) writes ``OUT/report.md``.

Summary (``benchmarks/results/ordinal_brain_age.json``, ``--json``): per method and seed the test
MAE (all / many / medium / few shot), QWK and Pearson r from each run's ``metrics.json`` (through the
``results.json`` of ``rankwise compare``), their mean and SD (ddof 0) over the seeds, and for every
method against L1 the paired difference over seeds (mean, SD with ddof 1) with the paired t-test's
two-sided p (``scipy.stats.ttest_rel``); the MAE of predicting the training mean age for every test
subject; the commit, date, machine and commands.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import loadavg, machine

ROOT = Path(__file__).resolve().parents[1]
#: preset -> the row label of docs/results.md
METHODS = {
    "brain_age_l1_synthetic": "L1",
    "brain_age_lds_synthetic": "LDS",
    "brain_age_balanced_mse_synthetic": "Balanced MSE (BMC)",
    "brain_age_ranksim_synthetic": "RankSim (gamma 100)",
    "brain_age_coral_synthetic": "CORAL",
    "brain_age_corn_synthetic": "CORN",
    "brain_age_cdw_ce_synthetic": "CDW-CE",
    "brain_age_sord_synthetic": "SORD",
    "brain_age_mean_variance_synthetic": "mean-variance",
    "brain_age_dldl_synthetic": "DLDL-v2",
    "brain_age_ordinal_entropy_synthetic": "L1 + Ordinal Entropy (weight 1)",
    "brain_age_dist_loss_synthetic": "Dist Loss",
}
BASELINE = "brain_age_l1_synthetic"
METRICS = ("mae", "mae_many", "mae_medium", "mae_few", "qwk", "pearson")


def _sets(csv_path: str, cache: str) -> list[str]:
    sets = [f"data.options.csv={csv_path}", f"data.options.cache_dir={cache}", "trainer.num_threads=1"]
    sets += ["run.plots=false", "task.montage=0"]
    return [a for s in sets for a in ("--set", s)]


def train(csv_path: str, out: Path, seeds: list[int], cache: str) -> list[dict[str, Any]]:
    """One ``nice -n 19 rankwise compare`` pass per seed; their commands and wall times."""
    passes = []
    for seed in seeds:
        cmd = ["nice", "-n", "19", "rankwise", "compare", *METHODS, "--seeds", str(seed), "--out", str(out)]
        cmd += _sets(csv_path, cache)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        passes.append({"command": " ".join(cmd), "seed": seed, "wall_seconds": time.perf_counter() - t0})
    return passes


def _commit() -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def mean_predictor_mae(run_dir: Path, cohort_csv: Path) -> dict[str, Any]:
    """The test MAE of predicting the training mean age (the training subjects: the cohort's rows that
    the run's ``predictions.csv`` does not list as val or test)."""
    rows = list(csv.DictReader(open(run_dir / "predictions.csv")))
    held = {r["subject"]: r for r in rows}
    cohort = list(csv.DictReader(open(cohort_csv)))
    train = np.array([float(r["age"]) for r in cohort if r["subject"] not in held])
    test = np.array([float(r["age"]) for r in rows if r["split"] == "test"])
    return {
        "n_train": int(train.size),
        "n_val": sum(r["split"] == "val" for r in rows),
        "n_test": int(test.size),
        "train_mean_age": float(train.mean()),
        "mean_predictor_test_mae": float(np.abs(test - train.mean()).mean()),
    }


def summarize(out: Path, seeds: list[int]) -> dict[str, Any]:
    from scipy import stats

    results = json.loads((out / "results.json").read_text())["results"]
    per: dict[str, dict[str, list[float]]] = {}
    for preset in METHODS:
        runs = sorted(results.get(preset, []), key=lambda r: r["seed"])
        runs = [r for r in runs if r["seed"] in seeds]
        if [r["seed"] for r in runs] != seeds:
            raise SystemExit(f"{preset}: seeds {[r['seed'] for r in runs]} in {out}, expected {seeds}")
        per[preset] = {m: [float(r["test"][m]) for r in runs] for m in METRICS}
        per[preset]["train_seconds"] = [float(r["train_seconds"]) for r in runs]
    methods: dict[str, Any] = {}
    base = per[BASELINE]
    for preset, vals in per.items():
        entry: dict[str, Any] = {"label": METHODS[preset], "per_seed": vals}
        entry["mean"] = {m: float(np.mean(v)) for m, v in vals.items()}
        entry["std"] = {m: float(np.std(v)) for m, v in vals.items()}
        if preset != BASELINE:
            vs: dict[str, Any] = {}
            for m in METRICS:
                d = np.asarray(vals[m]) - np.asarray(base[m])
                p = float(stats.ttest_rel(vals[m], base[m]).pvalue) if np.std(d) > 0 else None
                vs[m] = {"diff_mean": float(d.mean()), "diff_sd": float(d.std(ddof=1)), "p_paired_t": p}
            entry["vs_l1"] = vs
        methods[preset] = entry
    return methods


def cell(mean: float, std: float, digits: int) -> str:
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def diff_cell(vs: dict[str, Any]) -> str:
    """``+0.12 ± 0.30 (p 0.551)``: the paired difference to L1 over seeds (mean ± SD) and the t-test's p."""
    p = vs["p_paired_t"]
    shown = "–" if p is None else "< 0.001" if p < 0.001 else f"{p:.3f}"
    return f"{vs['diff_mean']:+.2f} ± {vs['diff_sd']:.2f} (p {shown})"


def markdown_rows(report: dict[str, Any]) -> list[str]:
    """The table rows of docs/results.md section 9b, from the JSON."""
    rows = []
    for preset, m in report["methods"].items():
        mean, std = m["mean"], m["std"]
        cells = [f"{m['label']} (`{preset}`)"]
        cells += [cell(mean[k], std[k], 2) for k in ("mae", "mae_many", "mae_medium", "mae_few")]
        cells += [cell(mean[k], std[k], 3) for k in ("qwk", "pearson")]
        cells += ["–" if "vs_l1" not in m else diff_cell(m["vs_l1"]["mae"])]
        cells += ["–" if "vs_l1" not in m else diff_cell(m["vs_l1"]["mae_few"])]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", help="the synthetic cohort's participants.csv (trains)")
    p.add_argument("--summarize", type=Path, help="a finished compare folder: only write the JSON")
    p.add_argument("--out", type=Path, default=Path("runs/ordinal_brain_age"))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--cache", default=None, help="preprocessing cache (default: OUT/cache)")
    p.add_argument("--passes", type=Path, help="a JSON list of the passes (command, seed, wall_seconds) already run")
    p.add_argument("--commit", help="the rankwise commit that trained the runs (default: this checkout's HEAD)")
    p.add_argument("--markdown", action="store_true", help="print the table rows of the JSON (`--json`) and stop")
    p.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "ordinal_brain_age.json")
    a = p.parse_args()
    if a.markdown:
        print("\n".join(markdown_rows(json.loads(a.json.read_text()))))
        return
    seeds = [int(s) for s in a.seeds.split(",")]
    out = a.summarize or a.out
    passes: list[dict[str, Any]] = json.loads(a.passes.read_text()) if a.passes else []
    if a.summarize is None:
        if not a.csv:
            p.error("--csv is required to train (or --summarize a finished folder)")
        passes = train(a.csv, out, seeds, a.cache or str(out / "cache"))
    import yaml

    methods = summarize(out, seeds)
    l1_run = out / "runs" / BASELINE / f"seed{seeds[0]}"
    cohort_csv = Path(yaml.safe_load((l1_run / "config.yaml").read_text())["data"]["options"]["csv"])
    report = {
        "what": "docs/results.md section 9b: 12 methods on the synthetic brain-age cohort, test metrics",
        "commit": a.commit or _commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "loadavg_when_written": loadavg(),
        "passes": passes,
        "seeds": seeds,
        "cohort": {"csv": str(cohort_csv), **mean_predictor_mae(l1_run, cohort_csv)},
        "shot_thresholds": json.loads((l1_run / "metrics.json").read_text()).get("shot_thresholds"),
        "methods": methods,
    }
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(report, indent=2) + "\n")
    print(a.json)


if __name__ == "__main__":
    main()
