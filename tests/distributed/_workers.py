"""Code run inside the 2-process (gloo, CPU) test workers; results are written as JSON per rank.

Every rank builds the same GLOBAL inputs from fixed seeds, keeps its own (deliberately unequal)
slice, runs the loss with ``distributed=True`` and backpropagates; rank 0's reference is the same
loss with ``distributed=False`` on the concatenated batch. Documented convention (rankwise.distributed):
mean over ranks of the returned values == single-process loss, and each rank's local gradient ==
world_size * single-process gradient of its slice.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

SIZE_CASES = {"uneq": (5, 3), "empty": (4, 0)}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _compare(
    fn: Callable[..., torch.Tensor],
    feats: torch.Tensor,
    others: list[torch.Tensor | None],
    sizes: tuple[int, ...],
    *,
    dim: int = 0,
    kwargs: Callable[[], dict[str, Any]] = dict,
) -> dict[str, float]:
    from rankwise.distributed import all_reduce_sum, get_rank, get_world_size, local_slice

    rank, world = get_rank(), get_world_size()
    sl = local_slice(sizes, rank)
    idx = (slice(None),) * (dim % feats.dim()) + (sl,)

    xg = feats.clone().requires_grad_()
    ref = fn(xg, *others, distributed=False, **kwargs())
    ref.backward()

    def cut(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        return t[(slice(None),) * (dim % t.dim()) + (sl,)] if t.dim() else t

    x = feats[idx].clone().requires_grad_()
    out = fn(x, *[cut(o) for o in others], distributed=True, **kwargs())
    out.backward()
    assert xg.grad is not None and x.grad is not None
    mean = all_reduce_sum(out.detach()) / world
    grad_err = (x.grad / world - xg.grad[idx]).abs().max().item() if x.numel() else 0.0
    return {
        "ref": float(ref.item()),
        "mean": float(mean.item()),
        "value_err": abs(float(mean.item()) - float(ref.item())),
        "grad_err": float(grad_err),
        "ref_grad_norm": float(xg.grad.norm().item()),
        "local_value": float(out.item()),
    }


def _loss_cases(sizes: tuple[int, ...]) -> dict[str, Callable[[], dict[str, float]]]:
    from rankwise import losses

    total = sum(sizes)
    dt = torch.float64
    g = _gen(123)
    views = torch.randn(total, 2, 6, generator=g, dtype=dt)
    flat = torch.randn(total, 7, generator=g, dtype=dt)
    ints = torch.randint(0, 4, (total,), generator=g)
    reg_y = torch.tensor([1.0, 3.0, 2.0, 3.0, 0.5, 2.0, 4.0, 1.0][:total], dtype=dt)
    preds = 2.0 + 0.4 * torch.randn(total, generator=g, dtype=dt)  # confused: many negatives
    weights = torch.rand(total, generator=g, dtype=dt) + 0.5
    p1 = torch.randn(total, generator=g, dtype=dt)
    t1 = torch.randn(total, generator=g, dtype=dt)
    rep_y = torch.tensor([20.0, 25.0, 31.0, 20.0, 47.0, 25.0, 60.0, 31.0][:total], dtype=dt)

    return {
        "supcon": lambda: _compare(losses.supcon_loss, views, [ints], sizes, kwargs=lambda: {"temperature": 0.5}),
        "supcon_simclr_in": lambda: _compare(
            losses.supcon_loss, views, [], sizes, kwargs=lambda: {"temperature": 0.5, "variant": "in"}
        ),
        "supcon_one_chunked": lambda: _compare(
            losses.supcon_loss, views, [ints], sizes, kwargs=lambda: {"contrast_mode": "one", "chunk_size": 2}
        ),
        "rnc": lambda: _compare(losses.rnc_loss, views, [reg_y], sizes),
        "triplet_all": lambda: _compare(losses.triplet_loss, views, [ints], sizes, kwargs=lambda: {"margin": 0.5}),
        "triplet_hard_sum": lambda: _compare(
            losses.triplet_loss, views, [ints], sizes, kwargs=lambda: {"mining": "hard", "reduction": "sum"}
        ),
        "smooth_ap": lambda: _compare(losses.smooth_ap_loss, flat, [ints], sizes, kwargs=lambda: {"temperature": 0.1}),
        "recall_at_k": lambda: _compare(
            losses.recall_at_k_loss, flat, [ints], sizes, kwargs=lambda: {"k": (1, 2), "temperature": 0.1}
        ),
        "blackbox_ap": lambda: _compare(
            losses.blackbox_ap_loss, flat, [ints], sizes, kwargs=lambda: {"interpolation_lambda": 100.0, "margin": 1.0}
        ),
        "fastap": lambda: _compare(losses.fastap_loss, flat, [ints], sizes),
        "npairs": lambda: _compare(losses.npairs_loss, views, [ints], sizes, kwargs=lambda: {"temperature": 2.0}),
        "npairs_sum_nolabels": lambda: _compare(
            losses.npairs_loss, views, [], sizes, kwargs=lambda: {"reduction": "sum"}
        ),
        "conr": lambda: _compare(
            losses.conr_loss,
            views,
            [reg_y, preds],
            sizes,
            kwargs=lambda: {"window": 1.0, "temperature": 0.5, "eta": 0.1},
        ),
        "conr_out": lambda: _compare(
            losses.conr_loss,
            views,
            [reg_y, preds],
            sizes,
            kwargs=lambda: {"variant": "out", "window": 1.0, "temperature": 0.5},
        ),
        "conr_weights": lambda: _compare(
            lambda f, y, p, w, **kw: losses.conr_loss(f, y, p, weights=w, **kw),
            views,
            [reg_y, preds, weights],
            sizes,
            kwargs=lambda: {"window": 1.0, "temperature": 0.5, "eta": 0.1},
        ),
        "ranksim": lambda: _compare(losses.ranksim_loss, flat, [rep_y], sizes, kwargs=lambda: {"generator": _gen(7)}),
        "ranksim_all": lambda: _compare(
            losses.ranksim_loss, flat, [rep_y], sizes, kwargs=lambda: {"unique_labels": False}
        ),
        "spearman_isotonic": lambda: _compare(
            losses.spearman_loss, p1, [t1], sizes, kwargs=lambda: {"regularization_strength": 5.0, "l1_weight": 0.5}
        ),
        "spearman_blackbox": lambda: _compare(
            losses.spearman_loss, p1, [t1], sizes, kwargs=lambda: {"ranker": "blackbox", "lambda_val": 20.0}
        ),
        "spearman_lead": lambda: _compare(
            losses.spearman_loss,
            torch.stack([p1, t1]),
            [torch.stack([t1, p1])],
            sizes,
            dim=-1,
            kwargs=lambda: {"ranker": "neuralsort", "tau": 1.0},
        ),
        "spearman_correlation": lambda: _compare(
            losses.spearman_correlation, p1, [t1], sizes, kwargs=lambda: {"regularization_strength": 5.0}
        ),
        "pairwise_difference": lambda: _compare(losses.pairwise_difference_loss, p1, [t1], sizes),
    }


def _gather_checks() -> dict[str, float]:
    from rankwise.distributed import all_gather_no_grad, all_gather_with_grad, batch_layout, get_rank

    rank = get_rank()
    sizes = (3, 1)
    n = sizes[rank]
    x = (torch.arange(n * 2, dtype=torch.float64).reshape(n, 2) + 10 * rank).requires_grad_()
    layout = batch_layout(n)
    y = all_gather_with_grad(x, sizes=layout)
    expect = torch.cat([torch.arange(s * 2, dtype=torch.float64).reshape(s, 2) + 10 * r for r, s in enumerate(sizes)])
    coef = torch.arange(8, dtype=torch.float64).reshape(4, 2) * (rank + 1)  # rank-dependent upstream gradient
    (y * coef).sum().backward()
    assert x.grad is not None
    # sum over ranks of coef's slice: coef * (1 + 2)
    g_expect = (torch.arange(8, dtype=torch.float64).reshape(4, 2) * 3)[layout.local]
    # gather along dim 1 with uneven sizes and without grad; bool and int dtypes
    z = torch.full((2, n), rank, dtype=torch.int64)
    zg = all_gather_no_grad(z, dim=1)
    b = torch.tensor([True] * n) if rank == 0 else torch.tensor([False] * n)
    bg = all_gather_no_grad(b)
    return {
        "value_err": float((y.detach() - expect).abs().max()),
        "grad_err": float((x.grad - g_expect).abs().max()),
        "dim1_ok": float(zg.tolist() == [[0, 0, 0, 1], [0, 0, 0, 1]]),
        "bool_ok": float(bg.tolist() == [True, True, True, False] and bg.dtype == torch.bool),
        "layout_ok": float(layout.sizes == sizes and layout.total == 4 and layout.world_size == 2),
    }


def _fds_checks() -> dict[str, float]:
    from rankwise.distributed import get_rank
    from rankwise.imbalanced import FDS

    rank = get_rank()
    g = _gen(5)
    feats = torch.randn(11, 3, generator=g)
    labels = torch.randint(0, 6, (11,), generator=g).float()
    sl = slice(0, 7) if rank == 0 else slice(7, 11)
    ref, dd = FDS(3, label_range=(0, 6), ks=3), FDS(3, label_range=(0, 6), ks=3)
    for epoch in range(3):
        f = feats * (1 + epoch)
        ref.update(f, labels, epoch)
        dd.update(f[sl], labels[sl], epoch, sync=True)
    errs = [(a - b).abs().max().item() for a, b in zip(ref.buffers(), dd.buffers(), strict=True)]
    return {"max_err": float(max(errs))}


def worker(rank: int, world: int, port: int, out_dir: str, task: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results: dict[str, Any] = {}
    try:
        if task == "losses":
            for size_name, sizes in SIZE_CASES.items():
                for name, case in _loss_cases(sizes).items():
                    try:
                        results[f"{name}[{size_name}]"] = case()
                    except Exception:  # the same error on both ranks (e.g. a signature): keep going
                        results[f"{name}[{size_name}]"] = {"error": traceback.format_exc()}
        elif task == "misc":
            results["gather"] = _gather_checks()
            results["fds"] = _fds_checks()
            from rankwise.distributed import is_distributed, resolve_distributed

            results["auto"] = {"on": float(resolve_distributed("auto") and is_distributed())}
    except Exception:
        results["error"] = traceback.format_exc()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        os._exit(1)  # do not wait in a collective the other rank will never join
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
