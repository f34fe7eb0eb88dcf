"""RankSim gamma sweep on abalone: ``rankwise compare abalone_ranksim`` for each gamma (and variant), one table + PNG.

Each (variant, gamma) is exactly the command printed before it runs, e.g.::

    rankwise compare abalone_ranksim --seeds 0,1,2 --set loss.regularizers.ranksim.weight=0.3 \
        --set run.plots=false --set run.tsne=false --set trainer.num_threads=1 --out runs/ranksim_sweep/default/g0.3

gamma = 0 drops the term (the L1 baseline, ``abalone_vanilla``'s numbers). Variants (``--variants``):
``default`` (the preset: one example per distinct label, 32-d linear features), ``all_labels``
(``options.unique_labels=false``: every example of the batch), ``relu`` (ReLU features,
``model.options.final_activation=true``), ``lr3e-4`` (Adam lr 3e-4), and any ``name=set;set``.
Writes ``--json`` (per variant and gamma: test MAE/GM all/many/medium/few, Pearson, Spearman per seed,
wall seconds) and ``--png`` (test MAE all / few vs gamma, mean ± std over seeds).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

VARIANTS = {
    "default": [],
    "all_labels": ["loss.regularizers.ranksim.options.unique_labels=false"],
    "relu": ["model.options.final_activation=true"],
    "lr3e-4": ["optimizer.lr=0.0003"],
}
COMMON = ["run.plots=false", "run.tsne=false", "trainer.num_threads=1"]


def _row(m: dict[str, Any]) -> dict[str, float]:
    t = m["test"]
    out = {f"mae_{g}": t[g]["mae"] for g in ("all", "many", "medium", "few")}
    out.update({f"gm_{g}": t[g]["gmean"] for g in ("all", "many", "medium", "few")})
    out.update({f"mse_{g}": t[g]["mse"] for g in ("all", "many", "medium", "few")})
    for k in ("pearson", "spearman"):
        if k in t.get("all", {}):
            out[k] = t["all"][k]
        elif k in t:
            out[k] = t[k]
    return out


def main() -> None:
    from rankwise.recipes.runner import compare

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gammas", default="0,0.03,0.1,0.3,1,10,100")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--variants", default="default", help="comma list of names (or name=set;set)")
    ap.add_argument("--preset", default="abalone_ranksim")
    ap.add_argument("--out", type=Path, default=Path("runs/ranksim_sweep"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/ranksim_sweep.json"))
    ap.add_argument("--png", type=Path, default=None)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    results: dict[str, Any] = json.loads(a.json.read_text()) if a.json.is_file() else {}
    for v in a.variants.split(","):
        name, _, sets = v.partition("=")
        vsets = [s for s in sets.split(";") if s] if sets else VARIANTS[name]
        for g in a.gammas.split(","):
            sets_all = [f"loss.regularizers.ranksim.weight={g}", *vsets, *COMMON]
            out = a.out / name / f"g{g}"
            cmd = f"rankwise compare {a.preset} --seeds {a.seeds} " + " ".join(f"--set {s}" for s in sets_all)
            print(cmd + f" --out {out}", flush=True)
            t0 = time.perf_counter()
            res = compare([a.preset], seeds=seeds, out=out, overrides=sets_all)
            wall = time.perf_counter() - t0
            rows = [_row(m) for m in res.results[a.preset]]
            results.setdefault(name, {})[g] = {
                "command": cmd,
                "seeds": seeds,
                "wall_s": wall,
                "train_s": [m.get("train_seconds") for m in res.results[a.preset]],
                "per_seed": rows,
            }
            mae = [r["mae_all"] for r in rows]
            few = [r["mae_few"] for r in rows]
            print(
                f"  {name} gamma={g}: MAE all {np.mean(mae):.3f} ± {np.std(mae):.3f}, "
                f"few {np.mean(few):.3f} ({wall:.0f} s)"
            )
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(results, indent=1))
    if a.png is not None:
        plot(results, a.png)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, by_g in results.items():
        gs = sorted(by_g, key=float)
        xs = [max(float(g), 3e-3) for g in gs]  # gamma 0 drawn at 3e-3 on the log axis
        for ax, key in zip(axes, ("mae_all", "mae_few"), strict=True):
            vals = [[r[key] for r in by_g[g]["per_seed"]] for g in gs]
            ax.errorbar(
                xs, [np.mean(v) for v in vals], yerr=[np.std(v) for v in vals], marker="o", capsize=3, label=name
            )
    for ax, t in zip(axes, ("test MAE, all", "test MAE, few-shot"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("RankSim gamma (0 drawn at 3e-3)")
        ax.set_ylabel("years")
        ax.set_title(t)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("abalone_ranksim: mean ± std over seeds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
