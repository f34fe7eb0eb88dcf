"""Why a median-regression run learns slowly: what its two networks know (docs/results.md, section 2).

For a run directory of ``large_mnist_median_*`` and a checkpoint (``best``, ``last``, or ``init`` =
the run's initial weights, rebuilt from its seed), prints

* over 20 training batches (train mode, as in training): the gradient norms of the score network's
  and the regression network's parameters, and the cosine between the score network's gradient from
  the run's median loss and from the sorting loss of section 1 (which is known to teach the order);
* on 500 lists of the held-out *validation* digits (never the test digits), after the BatchNorm
  recalibration the test uses: median found, within-list Spearman of scores and of regressions vs
  values, MSE x 1e4 at the score network's median and at the true median image, and the regression
  network's MSE x 1e4 on single images against each image's own value::

    python tools/median_diagnostics.py runs/median_2000/runs/large_mnist_median_stochastic/seed0 best
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import torch
from torch.nn import functional as F

from rankwise.data import get_dataset
from rankwise.recipes.rundir import load_state_dict
from rankwise.recipes.runner import load_run_config
from rankwise.recipes.sorting import (
    ListSampler,
    SortingModule,
    digit_pools,
    median_loss,
    recalibrate_bn,
    relaxed_permutation,
    sort_loss,
    true_permutation,
)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over lists of the Spearman correlation along the last dim (no ties in the values)."""
    ra = a.argsort(-1).argsort(-1).float()
    rb = b.argsort(-1).argsort(-1).float()
    ra, rb = ra - ra.mean(-1, keepdim=True), rb - rb.mean(-1, keepdim=True)
    return float(((ra * rb).sum(-1) / (ra.norm(dim=-1) * rb.norm(dim=-1))).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("checkpoint", nargs="?", default="best", help="best, last or init")
    args = parser.parse_args()
    cfg = load_run_config(args.run_dir)
    t = cfg.task
    torch.set_num_threads(1)
    data = get_dataset(cfg.data.name, **cfg.data.options)
    xtr, ytr, xva, yva, _, _ = digit_pools(SimpleNamespace(cfg=cfg, data=data))  # type: ignore[arg-type]
    torch.manual_seed(cfg.run.seed)
    module = SortingModule(cfg, meta=data.meta)  # the run's initial weights (same seed, same order)
    if args.checkpoint != "init":
        module.load_state_dict(load_state_dict(f"{args.run_dir}/checkpoints/{args.checkpoint}.ckpt"))
    model = module._median_model()
    if model.regressor is None:
        raise SystemExit("this tool needs median_objective expected or point (a regression network)")
    tag, scale = f"[{args.checkpoint}]", module.scale
    train_sampler = ListSampler(xtr, ytr, t.n, t.digits)

    g = torch.Generator().manual_seed(777)
    gs, gr, cos, units = [], [], [], []
    module.train()
    score_params = list(model.scorer.parameters())
    for _ in range(20):
        x, v = train_sampler.sample(t.lists_per_batch, g)
        x, v = x.float(), v.float()
        module.zero_grad()
        p_hat = relaxed_permutation(model.scorer(x).float(), t)
        loss = median_loss(p_hat, model.regressor(x), v.median(-1).values / scale, objective=t.median_objective)
        loss.backward(retain_graph=True)
        g_med = torch.cat([p.grad.flatten().clone() for p in score_params if p.grad is not None])
        gs.append(g_med.norm())
        gr.append(torch.cat([p.grad.flatten() for p in model.regressor.parameters() if p.grad is not None]).norm())
        g_sort = torch.cat(
            [q.flatten() for q in torch.autograd.grad(sort_loss(p_hat, true_permutation(v)), score_params)]
        )
        cos.append(F.cosine_similarity(g_med, g_sort, dim=0))
        units.append(g_med / g_med.norm())
    c = torch.stack(cos)
    print(
        f"{tag} gradient norm (mean of 20 batches): score network {float(torch.stack(gs).mean()):.3e}, "
        f"regression network {float(torch.stack(gr).mean()):.3e}"
    )
    print(
        f"{tag} cos(score-network gradient of the median loss, of the sorting loss): mean {float(c.mean()):+.3f} "
        f"(min {float(c.min()):+.3f}, max {float(c.max()):+.3f}); |mean unit gradient| "
        f"{float(torch.stack(units).mean(0).norm()):.3f} (random directions: {20**-0.5:.3f})"
    )

    recalibrate_bn(module, train_sampler, t, cfg.run.seed)
    module.eval()
    x, v = ListSampler(xva, yva, t.n, t.digits).sample(500, torch.Generator().manual_seed(4321))
    x, v = x.float(), v.float()
    with torch.no_grad():
        s, r = model.scorer(x).float(), model.regressor(x).float()
    vs = v / scale
    y = vs.median(-1).values
    mid = t.n // 2
    idx = s.argsort(-1, descending=True)[:, mid]
    true_mid = v.argsort(-1, descending=True)[:, mid]
    at = lambda i: float(((r.gather(1, i[:, None]).squeeze(1) - y) ** 2).mean() * 1e4)  # noqa: E731
    rf, vf = r.flatten(), vs.flatten()
    corr = float(torch.corrcoef(torch.stack([rf, vf]))[0, 1])
    print(
        f"{tag} 500 validation lists: median found {float((idx == true_mid).float().mean()):.3f}; within-list "
        f"Spearman vs values: scores {spearman(s, v):+.3f}, regressions {spearman(r, v):+.3f}"
    )
    print(
        f"{tag} MSE x1e4 at the score network's median {at(idx):.1f}, at the true median image {at(true_mid):.1f}, "
        f"constant {float(((y - y.mean()) ** 2).mean() * 1e4):.1f}"
    )
    print(
        f"{tag} regression network on single images: MSE x1e4 vs own value {float(((r - vs) ** 2).mean() * 1e4):.1f} "
        f"(constant {float(((vs - vs.mean()) ** 2).mean() * 1e4):.1f}), correlation {corr:+.3f}, "
        f"outputs {float(rf.min()):.3f}..{float(rf.max()):.3f}"
    )


if __name__ == "__main__":
    main()
