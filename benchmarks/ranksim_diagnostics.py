"""Why does RankSim with a large gamma hurt abalone? Gradient scales, label ties, the sampled subset.

Trains ``abalone_ranksim`` (the DIR recipe: MLP 64-64-32 + linear head, L1, Adam 3e-3, cosine, 25
epochs, batch 256) at several gammas and, every ``--every`` optimizer steps, recomputes on the
current batch (after the step, in train mode):

* ``g_task`` / ``g_rank``: the L2 norms of the gradients of the task loss (weighted L1) and of the
  UNWEIGHTED RankSim term w.r.t. the backbone parameters, and their cosine;
* ``ranksim``: the RankSim value; ``subset``: |M| (one example per distinct label) of the batch;
* ``label_tie_frac``: among the pairs (j, k) of a row of M, the fraction with |y_i - y_j| =
  |y_i - y_k| (ties of the label ranks, which the loss breaks by index order);
* ``sim_grad_nonzero``: the fraction of non-zero entries of dRankSim/dS (the blackbox backward is
  zero wherever the perturbation ``S + lambda * dL/drank`` flips no rank);
* ``spearman``: the mean over rows of M of Spearman's rho between feature cosine similarities and
  label similarities (what RankSim tries to make 1);
* ``feat_norm``, ``eff_rank`` (exp of the entropy of the centred features' normalized squared
  singular values) and ``linear_r2`` (R^2 of a least-squares fit of the labels on the batch
  features): does the encoder keep the label information the linear head needs?

Writes ``--out`` (JSON) and a PNG. Usage::

    python benchmarks/ranksim_diagnostics.py --gammas 0,0.03,0.3,10 --out benchmarks/results/ranksim_diagnostics.json \
        --png docs/img/ranksim_diagnostics.png
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _spearman_rows(sim: torch.Tensor, ysim: torch.Tensor) -> float:
    from scipy.stats import spearmanr

    rhos = []
    for a, b in zip(sim.numpy(), ysim.numpy(), strict=True):
        if np.ptp(b) > 0 and np.ptp(a) > 0:
            rhos.append(spearmanr(a, b).statistic)
    return float(np.mean(rhos)) if rhos else float("nan")


def make_callback(every: int, lam: float, records: list[dict[str, Any]]) -> Any:
    import lightning as L

    from rankwise.losses import ranksim_loss
    from rankwise.losses.ranking import sample_unique_labels

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            step = int(trainer.global_step)
            if step % every:
                return
            x, y = batch
            y = y.reshape(-1).float()
            params = [p for p in module.backbone.parameters() if p.requires_grad]
            with torch.enable_grad():
                feats = module.features(x)
                pred = module.head(feats).squeeze(-1)
                w = module.sample_weights(y)
                err = (pred - y).abs()
                task = (err * w).mean() if w is not None else err.mean()
                gen = torch.Generator().manual_seed(step)
                rank = ranksim_loss(feats, y, interpolation_lambda=lam, generator=gen)
                g_task = torch.autograd.grad(task, params, retain_graph=True)
                g_rank = torch.autograd.grad(rank, params, retain_graph=True, allow_unused=True)
                keep = sample_unique_labels(y, generator=torch.Generator().manual_seed(step))
                z = torch.nn.functional.normalize(feats[keep], dim=1)
                sim = (z @ z.T).detach().requires_grad_()
            gt = torch.cat([g.reshape(-1) for g in g_task])
            gr = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(g_rank, params)])
            # the blackbox backward on the subset's similarity matrix: which entries get a gradient
            from rankwise.ops import blackbox_rank

            with torch.enable_grad():
                ys = y[keep]
                m = ys.numel()
                fr = blackbox_rank(sim, lam, descending=True, normalize=True)
                from rankwise import rank as hard_rank

                lr_ = hard_rank(-(ys[:, None] - ys[None, :]).abs(), descending=True).float() / m
                loss_sub = ((fr - lr_) ** 2).mean(dim=1).sum()
                (gs,) = torch.autograd.grad(loss_sub, sim)
            d = (ys[:, None] - ys[None, :]).abs()
            # how much label information the features keep: R^2 of a least-squares fit y ~ [feats, 1] on the batch
            fd = feats.detach().double()
            a = torch.cat([fd, torch.ones(fd.shape[0], 1, dtype=fd.dtype)], 1)
            yd = y.double()
            coef = torch.linalg.lstsq(a, yd[:, None]).solution
            r2 = 1 - float(((a @ coef).squeeze(1) - yd).pow(2).sum() / (yd - yd.mean()).pow(2).sum())
            sv = torch.linalg.svdvals(fd - fd.mean(0))
            p_ = sv**2 / (sv**2).sum()
            eff_rank = float(torch.exp(-(p_ * torch.log(p_.clamp_min(1e-30))).sum()))
            ties = (d[:, :, None] == d[:, None, :]).float()
            jk = 1 - torch.eye(m)[None]  # all pairs (j, k), j != k
            tie_frac = float(((ties * jk).sum() / (jk.sum() * m)).item()) if m > 1 else 0.0
            records.append(
                {
                    "step": step,
                    "epoch": int(trainer.current_epoch),
                    "task": float(task),
                    "ranksim": float(rank),
                    "g_task": float(gt.norm()),
                    "g_rank": float(gr.norm()),
                    "cos": float(torch.nn.functional.cosine_similarity(gt, gr, dim=0)) if gr.norm() > 0 else 0.0,
                    "subset": int(m),
                    "batch": int(y.numel()),
                    "label_tie_frac": tie_frac,
                    "sim_grad_nonzero": float((gs != 0).float().mean()),
                    "spearman": _spearman_rows(sim.detach(), -d),
                    "feat_norm": float(fd.norm(dim=1).mean()),
                    "linear_r2": r2,
                    "eff_rank": eff_rank,
                }
            )

    return Probe()


def run(gamma: float, seed: int, every: int, extra: list[str]) -> dict[str, Any]:
    from rankwise.recipes import load_config
    from rankwise.recipes.runner import train

    sets = [
        f"loss.regularizers.ranksim.weight={gamma}",
        f"run.seed={seed}",
        "run.plots=false",
        "run.tsne=false",
        "trainer.num_threads=1",
        "trainer.enable_progress_bar=false",
        *extra,
    ]
    if gamma == 0:  # weight 0 drops the term: keep a tiny weight out of the loss by probing only
        sets[0] = "loss.regularizers.ranksim.weight=0"
    cfg = load_config("abalone_ranksim", sets)
    lam = float(cfg.loss.regularizers[0].options.get("interpolation_lambda", 2.0))
    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = train(
            cfg, out=Path(tmp) / "run", progress=False, verbose=False, callbacks=[make_callback(every, lam, records)]
        )
    return {
        "gamma": gamma,
        "seed": seed,
        "extra": extra,
        "test_mae": res.metrics["test"]["all"]["mae"],
        "seconds": time.perf_counter() - t0,
        "records": records,
    }


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    axes = axes.reshape(-1)
    for r in results:
        rec = r["records"]
        s = [x["step"] for x in rec]
        lab = f"gamma={r['gamma']:g} {' '.join(r['extra'])} (MAE {r['test_mae']:.2f})"
        axes[0].plot(s, [r["gamma"] * x["g_rank"] / max(x["g_task"], 1e-12) for x in rec], label=lab)
        axes[1].plot(s, [x["ranksim"] for x in rec], label=lab)
        axes[2].plot(s, [x["spearman"] for x in rec], label=lab)
        axes[3].plot(s, [x["task"] for x in rec], label=lab)
        axes[4].plot(s, [x["linear_r2"] for x in rec], label=lab)
        axes[5].plot(s, [x["eff_rank"] for x in rec], label=lab)
    axes[0].set_yscale("symlog", linthresh=1e-3)
    axes[0].set_title("gamma * |grad RankSim| / |grad task| (backbone)")
    axes[1].set_title("RankSim value (unweighted)")
    axes[2].set_title("Spearman(feature cos sim, label sim), subset rows")
    axes[3].set_title("task loss (L1)")
    axes[4].set_title("R^2 of a linear fit of y on the batch features")
    axes[5].set_title("effective rank of the batch features")
    for a in axes:
        a.set_xlabel("step")
    axes[5].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gammas", default="0,0.03,0.3,10")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], help="extra --set overrides for every run")
    ap.add_argument("--variant", action="append", default=[], help="'gamma|override;override' extra runs")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/ranksim_diagnostics.json"))
    ap.add_argument("--png", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    results = [run(float(g), a.seed, a.every, list(a.set)) for g in a.gammas.split(",")]
    for v in a.variant:
        g, _, sets = v.partition("|")
        results.append(run(float(g), a.seed, a.every, [*a.set, *[s for s in sets.split(";") if s]]))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=1))
    for r in results:
        rec = r["records"]
        first, last = rec[0], rec[-1]
        ratio = [r["gamma"] * x["g_rank"] / max(x["g_task"], 1e-12) for x in rec]
        med = {k: float(np.median([x[k] for x in rec])) for k in ("g_rank", "g_task", "cos")}
        mean = {k: float(np.mean([x[k] for x in rec])) for k in ("subset", "label_tie_frac", "sim_grad_nonzero")}
        print(
            f"gamma={r['gamma']:<6g} {' '.join(r['extra']):<40} MAE {r['test_mae']:.3f} | "
            f"ranksim {first['ranksim']:.3f}->{last['ranksim']:.3f} "
            f"spearman {first['spearman']:.3f}->{last['spearman']:.3f} | "
            f"median gamma*|gR|/|gT| {np.median(ratio):.3g} | |gR| med {med['g_rank']:.3g} "
            f"|gT| med {med['g_task']:.3g} cos med {med['cos']:.2f} | "
            f"|M| {mean['subset']:.1f}/{first['batch']} ties {mean['label_tie_frac']:.3f} "
            f"dS nonzero {mean['sim_grad_nonzero']:.3f} | "
            f"R2 {first['linear_r2']:.2f}->{last['linear_r2']:.2f} "
            f"eff.rank {first['eff_rank']:.1f}->{last['eff_rank']:.1f} "
            f"|z| {first['feat_norm']:.2f}->{last['feat_norm']:.2f} | {r['seconds']:.1f} s"
        )
    if a.png is not None:
        plot(results, a.png)


if __name__ == "__main__":
    main()
