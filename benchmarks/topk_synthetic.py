"""Top-1 / top-5 test accuracy of cross-entropy vs the differentiable top-k losses on ``topk_synthetic``.

Usage::

    python benchmarks/topk_synthetic.py                      # 5 presets x seeds 0, 1, 2, every setting
    python benchmarks/topk_synthetic.py --seeds 0 --settings clean
    python benchmarks/topk_synthetic.py --markdown           # print the docs tables of the saved JSON only

Every preset ``topk_synthetic_{ce,odd_even,bitonic,neuralsort,softsort}`` is trained through
``rankwise compare`` (the ``rankwise train`` lifecycle: best checkpoint by ``val/top5``, then the
test split) with the same model (MLP 32-256-256-100), data, epochs (30), batch (100) and Adam
learning rate (1e-3) -- they differ only in ``task.loss`` / ``task.loss_options`` -- for every run
seed (initialisation and batch order; the dataset is ``data.options.seed: 0`` for all). Settings:
``clean`` (the presets as shipped), ``label_noise`` (``--set data.options.label_noise=0.4``:
40 % of the training labels drawn uniformly anew; validation and test labels clean) and
``temperature_2`` (NeuralSort and SoftSort at inverse temperature 2 with the softmax top-1 term,
the difftopk README's example values, instead of the authors' CIFAR-100 values 1/16 and ``smce``
of the presets; cross-entropy beside them).

The JSON (``benchmarks/results/topk_synthetic.json``, ``--out``) holds every run's test top-1 /
top-5, their mean and sample std over the seeds, the training seconds, the commit, date, machine and
load average; ``--markdown`` prints the tables of docs/topk.md from it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import loadavg, machine

ROOT = Path(__file__).resolve().parents[1]
PRESETS = [
    "topk_synthetic_ce",
    "topk_synthetic_odd_even",
    "topk_synthetic_bitonic",
    "topk_synthetic_neuralsort",
    "topk_synthetic_softsort",
]
#: setting -> (presets, overrides of every preset)
SETTINGS: dict[str, tuple[list[str], list[str]]] = {
    "clean": (PRESETS, []),
    "label_noise": (PRESETS, ["data.options.label_noise=0.4"]),
    # NeuralSort / SoftSort at the inverse temperature of the difftopk README's example (2, i.e. tau 0.5) and
    # the softmax top-1 term, instead of the authors' CIFAR-100 setting (1/16, smce) of the presets
    "temperature_2": (
        ["topk_synthetic_ce", "topk_synthetic_neuralsort", "topk_synthetic_softsort"],
        ["task.loss_options.inverse_temperature=2.0", "task.loss_options.top1_mode=sm"],
    ),
}
#: the loss of each preset, in words (the docs tables)
LOSS = {
    "topk_synthetic_ce": "cross-entropy",
    "topk_synthetic_odd_even": "top-k CE, odd-even network",
    "topk_synthetic_bitonic": "top-k CE, bitonic network",
    "topk_synthetic_neuralsort": "top-k CE, NeuralSort",
    "topk_synthetic_softsort": "top-k CE, SoftSort",
}


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        return out.stdout.strip() + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _summary(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def run(seeds: list[int], settings: list[str], work: Path) -> dict[str, Any]:
    from rankwise.recipes import compare

    out: dict[str, Any] = {
        "benchmark": "topk_synthetic",
        "commit": _commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "loadavg_before": loadavg(),
        "seeds": seeds,
        "presets": PRESETS,
        "settings": {},
    }
    for name in settings:
        presets, sets = SETTINGS[name]
        # the overrides of a setting are top-k loss options: the cross-entropy baseline runs without them
        loss_sets = [s for s in sets if s.startswith("task.loss_options.")]
        other = [s for s in sets if s not in loss_sets]
        t0 = time.perf_counter()
        results: dict[str, list[dict[str, Any]]] = {}
        for group in (
            [p for p in presets if p == "topk_synthetic_ce"],
            [p for p in presets if p != "topk_synthetic_ce"],
        ):
            if not group:
                continue
            extra = loss_sets if group[0] != "topk_synthetic_ce" else []
            res = compare(group, seeds=seeds, out=work / name, overrides=[*other, *extra], overwrite=True)
            results.update(res.results)
        methods = {}
        for preset in presets:
            runs = results[preset]
            methods[preset] = {
                "loss": LOSS[preset],
                "method": runs[0]["method"],
                "top1": [r["test"]["top1"] for r in runs],
                "top5": [r["test"]["top5"] for r in runs],
                "train_seconds": [r.get("train_seconds") for r in runs],
                "top1_summary": _summary([r["test"]["top1"] for r in runs]),
                "top5_summary": _summary([r["test"]["top5"] for r in runs]),
            }
        out["settings"][name] = {
            "overrides": sets,
            "command": "rankwise compare "
            + " ".join(presets)
            + " --seeds "
            + ",".join(map(str, seeds))
            + "".join(f" --set {s}" for s in sets)
            + (" (the --set task.loss_options.* for the top-k presets only)" if loss_sets else ""),
            "wall_seconds": time.perf_counter() - t0,
            "loadavg_after": loadavg(),
            "methods": methods,
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = []
    for name, block in result["settings"].items():
        lines.append(f"**{name}** (`{block['command']}`)\n")
        lines.append("| preset | loss | test top-1 (%) | test top-5 (%) | train s / run |")
        lines.append("|---|---|---|---|---|")
        for preset, m in block["methods"].items():
            t1, t5 = m["top1_summary"], m["top5_summary"]
            secs = [s for s in m["train_seconds"] if s is not None]
            wall = f"{statistics.fmean(secs):.0f}" if secs else "–"
            lines.append(
                f"| `{preset}` | {m['loss']} | {t1['mean']:.2f} ± {t1['std']:.2f} | {t5['mean']:.2f} ± {t5['std']:.2f} "
                f"| {wall} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="run seeds, comma-separated")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated among {', '.join(SETTINGS)}")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "topk_synthetic.json")
    p.add_argument("--work", type=Path, default=None, help="folder of the run directories (default: a temporary one)")
    p.add_argument("--markdown", action="store_true", help="only print the docs tables of the JSON at --out")
    a = p.parse_args()
    if a.markdown:
        print(markdown(json.loads(a.out.read_text())))
        return
    settings = [s for s in a.settings.split(",") if s]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        p.error(f"--settings: unknown {', '.join(unknown)}; expected among {', '.join(SETTINGS)}")
    seeds = [int(s) for s in a.seeds.split(",") if s]
    if a.work is not None:
        result = run(seeds, settings, a.work)
    else:
        with tempfile.TemporaryDirectory(prefix="topk_synthetic_") as tmp:
            result = run(seeds, settings, Path(tmp))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
