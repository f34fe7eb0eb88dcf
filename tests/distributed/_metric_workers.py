"""Lightning DDP (2 CPU processes, gloo) runs of the DIR, LTR and top-k modules, for test_distributed_metrics.py.

Each rank trains the recipe's module for 2 epochs on a small training set and validates on a
validation set of an ODD size, so that the DistributedSampler gives the ranks unequal real shards
and pads one of them with a repeat. Rank 0 writes, per epoch, the logged ``val/*`` values and the
module's weights, and the epoch of the ``best.ckpt`` that a ModelCheckpoint on the recipe's
monitor chose.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

import torch

VAL_SIZE = {"dir": 41, "ltr": 13, "topk": 41}  # odd: shards of 21 + 20 (dir, topk) and 7 + 6 (ltr) samples
EVAL_BATCH = {"dir": 8, "ltr": 4, "topk": 8}
MONITOR = {"dir": ("val/mae", "min"), "ltr": ("val/ndcg@5", "max"), "topk": ("val/top5", "max")}


def setup(task: str) -> tuple[Any, Any, Any, Any]:
    """The task's module, training loader, validation split and validation loader (identical in every process)."""
    from torch.utils.data import DataLoader, Subset

    from rankwise.recipes import load_config

    if task == "dir":
        from rankwise.data import get_dataset
        from rankwise.recipes.regression.module import DIRRegressor

        cfg = load_config("abalone_vanilla", ["trainer.num_threads=1"])
        data = get_dataset(cfg.data.name, **cfg.data.options)
        torch.manual_seed(0)
        module = DIRRegressor(
            cfg, input_dim=data.input_dim, bin_width=data.bin_width, train_labels=data.train_labels, meta=data.meta
        )
        train = DataLoader(Subset(data.train, range(64)), batch_size=16, shuffle=False)
        val = Subset(data.val, range(VAL_SIZE[task]))
        return module, train, val, DataLoader(val, batch_size=EVAL_BATCH[task], shuffle=False)
    if task == "topk":
        from rankwise.data import get_dataset
        from rankwise.recipes.topk import TopKModule

        cfg = load_config(
            "topk_synthetic_odd_even",
            ["trainer.num_threads=1", "data.options={seed: 0, num_classes: 20, clusters: 4, dim: 8}"],
        )
        data = get_dataset(cfg.data.name, **cfg.data.options)
        torch.manual_seed(0)
        module = TopKModule(cfg, num_classes=data.num_classes, meta=data.meta)
        train = DataLoader(Subset(data.train, range(64)), batch_size=16, shuffle=False)
        val = Subset(data.val, range(VAL_SIZE[task]))
        return module, train, val, DataLoader(val, batch_size=EVAL_BATCH[task], shuffle=False)
    from rankwise.data import get_dataset, pad_lists
    from rankwise.recipes.learning_to_rank import LTRModule

    cfg = load_config("ltr_synthetic_listnet", ["trainer.num_threads=1", "model.options.dropout=0.0"])
    data = get_dataset(cfg.data.name, **cfg.data.options)
    torch.manual_seed(0)
    module = LTRModule(cfg, num_features=data.num_features, meta=data.meta)
    train = DataLoader(list(data.train)[:32], batch_size=8, shuffle=False, collate_fn=pad_lists)
    val = list(data.val)[: VAL_SIZE[task]]
    return module, train, val, DataLoader(val, batch_size=EVAL_BATCH[task], shuffle=False, collate_fn=pad_lists)


def reference(task: str, module: Any, val_dl: Any) -> dict[str, float]:
    """One process, the validation loader's batches in order: the metrics as rankwise defines them (per-sample
    errors / per-query values concatenated, then averaged in float64)."""
    module.eval()
    with torch.no_grad():
        if task == "dir":
            err = torch.cat([(module(x).float() - y.reshape(-1).float()).abs() for x, y in val_dl])
            logs = torch.log(err.clamp_min(1e-12)).double()
            return {"val/mae": float(err.double().mean()), "val/gm": float(torch.exp(logs.mean()))}
        if task == "topk":
            from rankwise.metrics import topk_accuracy

            logits = torch.cat([module(x) for x, _ in val_dl]).double()
            y = torch.cat([y for _, y in val_dl])
            top1, top5 = (topk_accuracy(logits, y, ks=(1, 5)) * 100.0).tolist()
            return {"val/top1": top1, "val/top5": top5}
        from rankwise.recipes.learning_to_rank import ltr_metrics

        parts = [ltr_metrics(module(x), y, module.task.ats) for x, y in val_dl]
        # float64 mean: the percent of a float32 mean has steps of 2e-6 above 16
        return {f"val/{k}": float(torch.cat([p[k] for p in parts]).double().mean() * 100.0) for k in parts[0]}


def worker(rank: int, world: int, port: int, out_dir: str, task: str) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), NODE_RANK="0", LOCAL_RANK=str(rank)
    )
    out = Path(out_dir)
    record: dict[str, Any] = {"epochs": []}

    class Record(Callback):
        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
            record["epochs"].append(logged)
            if trainer.global_rank == 0:
                torch.save(pl_module.state_dict(), out / f"epoch{trainer.current_epoch}.pt")

    try:
        module, train, _, val_dl = setup(task)
        monitor, mode = MONITOR[task]
        ckpt = ModelCheckpoint(dirpath=out / f"ckpt{rank}", filename="best", monitor=monitor, mode=mode)
        trainer = L.Trainer(
            accelerator="cpu",
            devices=world,
            strategy="ddp",
            max_epochs=2,
            num_sanity_val_steps=0,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[Record(), ckpt],
        )
        trainer.fit(module, train_dataloaders=train, val_dataloaders=val_dl)
        sampler = trainer.val_dataloaders.sampler
        record["shard"] = len(list(iter(sampler)))
        record["sampler"] = type(sampler).__name__
        record["best_epoch"] = int(torch.load(ckpt.best_model_path, map_location="cpu", weights_only=False)["epoch"])
    except Exception:
        record["error"] = traceback.format_exc()
        (out / f"rank{rank}.json").write_text(json.dumps(record))
        os._exit(1)  # do not wait in a collective the other rank will never join
    (out / f"rank{rank}.json").write_text(json.dumps(record))
