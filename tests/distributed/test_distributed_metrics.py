"""Validation metrics under Lightning DDP (2 CPU processes, gloo, unequal shards) equal the single-process ones.

The DistributedSampler pads the shorter shard with a repeat of the first sample; the logged
``val/*`` values must count every validation sample once and equal, to 1e-6, the metrics of one
process on the whole validation split with the same weights; the ``best.ckpt`` the monitor chose
must be the epoch one process would choose.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed.test_distributed_losses import WORLD, _free_port

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(), reason="gloo unavailable"
)


def _spawn(task: str, tmp: Path) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    from tests.distributed._metric_workers import worker

    ctx = mp.start_processes(
        worker, args=(WORLD, _free_port(), str(tmp), task), nprocs=WORLD, start_method="spawn", join=False
    )
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail(f"DDP workers ({task}) did not finish in 240 s")
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("task", ["dir", "ltr", "topk"])
def test_ddp_validation_metrics_equal_single_process(tmp_path: Path, task: str) -> None:
    from tests.distributed._metric_workers import MONITOR, VAL_SIZE, reference, setup

    ranks = _spawn(task, tmp_path)
    for r in ranks:
        assert "error" not in r, r.get("error")
    # unequal real shards, padded to the same length by a DistributedSampler
    assert all(r["sampler"] == "DistributedSampler" for r in ranks)
    assert [r["shard"] for r in ranks] == [(VAL_SIZE[task] + 1) // 2] * WORLD
    assert ranks[0]["epochs"] == ranks[1]["epochs"]  # every rank logs the same (synced) values
    module, _, _, val_dl = setup(task)
    single = []
    for epoch, logged in enumerate(ranks[0]["epochs"]):
        module.load_state_dict(torch.load(tmp_path / f"epoch{epoch}.pt", weights_only=True))
        ref = reference(task, module, val_dl)
        assert set(logged) == set(ref)
        for key, value in ref.items():
            assert logged[key] == pytest.approx(value, abs=1e-6, rel=0), (epoch, key)
        single.append(ref)
    assert len(single) == 2
    monitor, mode = MONITOR[task]
    values = [s[monitor] for s in single]
    best = values.index(min(values) if mode == "min" else max(values))
    assert ranks[0]["best_epoch"] == ranks[1]["best_epoch"] == best


@pytest.mark.slow
def test_ddp_retrieval_metrics_equal_single_process(tmp_path: Path) -> None:
    """Retrieval: rank 0 embeds the whole test split on one device (query vs gallery, no shard, no
    repeat); the metrics a 2-process run writes equal those of a 1-process ``rankwise evaluate``."""
    import sys

    from tests.distributed.test_distributed_train import TINY, _run

    run = tmp_path / "ddp"
    sets = ["task.steps=4", "task.steps_per_epoch=2", "data.options.test_fraction=0.1", "report.tsne=false"]
    cli = [sys.executable, "-m", "rankwise.cli"]
    args = [a for s in sets for a in ("--set", s)]
    i = TINY.index("trainer.max_epochs=1")  # a step-budget recipe refuses trainer.max_epochs
    tiny = [*TINY[: i - 1], *TINY[i + 1 :]]
    _run(
        [*cli, "train", "digits_smooth_ap", "--out", str(run), "--devices", "2", "--strategy", "ddp", *tiny, *args],
        tmp_path,
    )
    ddp = json.loads((run / "metrics.json").read_text())["test"]
    _run([*cli, "evaluate", str(run), "--no-plots"], tmp_path)
    single = json.loads((run / "metrics.json").read_text())["test"]
    assert ddp and set(ddp) == set(single)
    for key, value in single.items():
        assert ddp[key] == pytest.approx(value, abs=1e-6, rel=0), key
