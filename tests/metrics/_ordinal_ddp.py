"""Code run inside the 2-process (gloo, CPU) workers of the streaming ordinal metrics' DDP test.

Every rank builds the same dataset from a fixed generator, feeds its own part of it to
``OrdinalMetrics`` in pieces and writes ``compute()`` (synchronized over both ranks) as JSON; the
reference, computed by each rank on the whole dataset in one process, is ``ordinal_metrics``.
Scenarios: unequal shards with padded duplicates masked out; a ``DistributedSampler`` with its own
padding and :func:`real_sample_mask`; a rank that never calls ``update``.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

N, K = 29, 7


def dataset() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    targets = torch.randint(0, K, (N,), generator=g)
    predictions = (targets + torch.randn(N, generator=g, dtype=torch.float64)).to(torch.float32)
    predictions[3] = predictions[4]  # ties in the predictions
    train = torch.randint(0, K, (300,), generator=g) ** 2 % K  # uneven training counts
    return predictions, targets, train


def _values(out: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in out.items()}


def _metric(train: torch.Tensor) -> Any:
    from rankwise.metrics.streaming import OrdinalMetrics

    return OrdinalMetrics(num_classes=K, train_labels=train, many_shot=60, few_shot=30)


def _unequal_shards(rank: int) -> dict[str, float]:
    p, t, train = dataset()
    m = _metric(train)
    if rank == 0:  # 17 samples in pieces of 5, 0 and 12
        for a, b in ((0, 5), (5, 5), (5, 17)):
            m.update(p[a:b], t[a:b])
    else:  # 12 samples and 3 padded duplicates of samples 0..2, masked out, in pieces of 4, 7 and 4
        idx = torch.cat([torch.arange(17, N), torch.arange(3)])
        keep = idx >= 17
        for a, b in ((0, 4), (4, 11), (11, 15)):
            m.update(p[idx[a:b]], t[idx[a:b]], mask=keep[a:b])
    return _values(m.compute())


def _sampler(rank: int, world: int) -> dict[str, float]:
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from rankwise.metrics.streaming import real_sample_mask

    p, t, train = dataset()
    data = TensorDataset(p, t)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    m = _metric(train)
    seen = 0
    for bp, bt in DataLoader(data, batch_size=4, sampler=sampler):
        positions = seen + torch.arange(bp.shape[0])
        seen += bp.shape[0]
        m.update(bp, bt, mask=real_sample_mask(positions, dataset_size=len(data)))
    return _values(m.compute())


def _idle_rank(rank: int) -> dict[str, float]:
    p, t, train = dataset()
    m = _metric(train)
    if rank == 0:
        m.update(p[:10], t[:10])
        m.update(p[10:], t[10:])
    return _values(m.compute())


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results: dict[str, Any] = {}
    try:
        from rankwise.metrics import ordinal_metrics

        p, t, train = dataset()
        results["reference"] = ordinal_metrics(p, t, num_classes=K, train_labels=train, many_shot=60, few_shot=30)
        results["unequal_shards"] = _unequal_shards(rank)
        results["sampler"] = _sampler(rank, world)
        results["idle_rank"] = _idle_rank(rank)
    except Exception:
        results["error"] = traceback.format_exc()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        os._exit(1)  # do not wait in a collective the other rank will never join
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
