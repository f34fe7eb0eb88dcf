"""Learning curves of the large-MNIST sorting runs (docs/results.md, section 1).

Reads ``val/all_correct`` (fraction of the fixed validation lists sorted entirely correctly, after
every epoch) from ``logs/metrics.csv`` of each run directory of ``rankwise compare`` outputs and
draws one panel per list length ``n``, one line per method, with the per-digit-reader ceiling of
that ``n`` as a dashed reference line::

    python tools/sort_curves.py runs/relax_n3 runs/relax_n5 runs/relax_n7 \\
        --methods large_mnist_neuralsort,large_mnist_stochastic,large_mnist_softsort,large_mnist_vanilla \\
        --ceiling 3=0.935,5=0.830,7=0.732 --out docs/sort_learning_curves.png

One folder gives one panel, e.g. the long NeuralSort run of section 1::

    python tools/sort_curves.py runs/long_n5 --methods large_mnist_neuralsort --ceiling 5=0.880 \\
        --legend-loc "lower right" --out docs/sort_long_run.png
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import yaml


def read_curve(run_dir: Path) -> tuple[list[int], list[float]]:
    """``(steps, val/all_correct)`` of one run: the step count after each epoch's validation."""
    steps, acc = [], []
    with open(run_dir / "logs" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get("val/all_correct"):
                steps.append(int(row["step"]) + 1)
                acc.append(float(row["val/all_correct"]))
    return steps, acc


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("compare_dirs", nargs="+", type=Path, help="OUT folders of `rankwise compare` (one per n)")
    ap.add_argument("--methods", required=True, help="comma-separated method (preset) names to draw")
    ap.add_argument("--ceiling", default="", help="n=value,... per-digit-reader ceilings (dashed lines)")
    ap.add_argument("--ceiling-label", default="per-digit reader")
    ap.add_argument("--seeds", default="", help="comma-separated seeds to draw (default: every seed found)")
    ap.add_argument("--legend-loc", default="center left", help="matplotlib legend location of the last panel")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = a.methods.split(",")
    seeds = {f"seed{x}" for x in a.seeds.split(",") if x}
    ceiling = {int(k): float(v) for k, v in (kv.split("=") for kv in a.ceiling.split(",") if kv)}
    fig, axes = plt.subplots(1, len(a.compare_dirs), figsize=(4.2 * len(a.compare_dirs), 3.6), squeeze=False)
    for ax, d in zip(axes[0], a.compare_dirs, strict=True):
        n = None
        for m in methods:
            for seed_dir in sorted((d / "runs" / m).glob("seed*")):
                if seeds and seed_dir.name not in seeds:
                    continue
                cfg = yaml.safe_load((seed_dir / "config.yaml").read_text())
                n = cfg["task"]["n"]
                steps, acc = read_curve(seed_dir)
                label = m.removeprefix("large_mnist_") + ("" if seed_dir.name == "seed0" else f" ({seed_dir.name})")
                ax.plot(steps, acc, marker="o", ms=3, label=label)
        if n in ceiling:
            ax.axhline(ceiling[n], ls="--", color="k", lw=1, label=f"{a.ceiling_label} ({ceiling[n]:.3f})")
        ax.set_title(f"n = {n}")
        ax.set_xlabel("training steps (16 lists each)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation lists fully correct")
    axes[0][-1].legend(fontsize=7, loc=a.legend_loc)
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=110)
    print(a.out)


if __name__ == "__main__":
    main()
