"""The one optimizer / learning-rate schedule factory of every recipe.

:func:`configure` is what a LightningModule's ``configure_optimizers`` returns. The schedule length
is the stage's ACTUAL length, read from its Trainer (``trainer.estimated_stepping_batches`` and
``trainer.max_epochs``: the epochs a recipe derives from ``task.steps``, a pretraining stage's own
epochs, ``limit_train_batches``, DDP sharding), never a config default.

The learning rate of step ``s`` (epoch ``e = s // steps_per_epoch``) is ``lr * warm(s) * decay(u)``:

* ``warm(s) = min(1, (s + 1) / W)`` with ``W = schedule.warmup_epochs * steps_per_epoch`` (linear
  warm-up per optimizer step; 1 without warm-up);
* ``u`` is ``e`` (``schedule.interval: epoch``) or ``s`` (``step``), ``U_w`` the warm-up and ``U``
  the total length in the same unit;
* ``decay``: ``none`` -> 1; ``multistep`` -> ``gamma ** #{milestones <= e}`` (milestones in epochs);
  ``cosine`` -> ``0.5 (1 + cos(pi * min(u - U_w, U - U_w) / max(1, U - U_w)))`` after the warm-up.

Parameter groups: a module may define ``param_groups() -> list[dict]`` (e.g. a task loss with
learnable parameters and its own ``lr``); otherwise all trainable parameters form one group.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rankwise.recipes.config import OptimizerConfig, ScheduleConfig

__all__ = ["build_optimizer", "configure", "lr_factor"]


def build_optimizer(params: Any, o: OptimizerConfig, *, lr: float | None = None) -> torch.optim.Optimizer:
    """The optimizer ``o.name`` over ``params`` (tensors or param-group dicts); ``lr`` overrides ``o.lr``."""
    lr = o.lr if lr is None else lr
    if o.name == "adam":
        return torch.optim.Adam(params, lr=lr, eps=o.eps, weight_decay=o.weight_decay)
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=lr, eps=o.eps, weight_decay=o.weight_decay)
    if o.name == "lars":
        from timm.optim import Lars

        return Lars(params, lr=lr, momentum=o.momentum, weight_decay=o.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=o.momentum, weight_decay=o.weight_decay)


def lr_factor(step: int, s: ScheduleConfig, *, total_steps: int, epochs: int) -> float:
    """The multiplier of the base learning rate at optimizer step ``step`` of ``total_steps`` in ``epochs``."""
    spe = max(1, total_steps // max(1, epochs))
    epoch = step // spe
    warm_steps = s.warmup_epochs * spe
    if s.interval == "step":
        u, u_warm, u_total = step, warm_steps, total_steps
    else:
        u, u_warm, u_total = epoch, s.warmup_epochs, epochs
    decay = 1.0
    if s.kind == "multistep":
        decay = s.gamma ** sum(epoch >= m for m in s.milestones)
    elif s.kind == "cosine" and u >= u_warm:
        decay = 0.5 * (1.0 + math.cos(math.pi * min(u - u_warm, u_total - u_warm) / max(1, u_total - u_warm)))
    if warm_steps and step < warm_steps:
        return (step + 1) / warm_steps * decay
    return decay


def configure(module: Any, o: OptimizerConfig, s: ScheduleConfig, *, lr: float | None = None) -> Any:
    """``configure_optimizers`` output for ``module`` (attached to its Trainer), see the module doc."""
    groups = module.param_groups() if hasattr(module, "param_groups") else None
    params = groups if groups is not None else [p for p in module.parameters() if p.requires_grad]
    opt = build_optimizer(params, o, lr=lr)
    if s.kind == "none" and s.warmup_epochs == 0:
        return opt
    trainer = module.trainer
    total = max(1, int(trainer.estimated_stepping_batches))
    epochs = max(1, int(trainer.max_epochs or 1))

    def factor(step: int) -> float:
        return lr_factor(step, s, total_steps=total, epochs=epochs)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
