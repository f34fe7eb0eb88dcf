"""Two-stage supervised contrastive learning (Khosla et al., NeurIPS'20) vs SimCLR vs cross-entropy.

Stage 1 trains an encoder (``model.backbone``, e.g. ``small_cnn``) for ``trainer.max_epochs`` epochs:

* ``task.method: supcon`` — a projection head (Linear-ReLU-Linear to ``task.projection_dim``) on two
  augmented views of every image, :func:`rankwise.losses.supcon_loss` with the labels
  (``task.temperature``, ``task.variant`` = L_out or L_in);
* ``simclr`` — the same with ``labels=None`` (NT-Xent: the other view is the only positive);
* ``ce`` — a linear classifier with cross-entropy on one augmented view.

Stage 2 freezes the encoder, extracts features of the un-augmented train/test images and trains a
linear probe (Adam, ``task.probe_epochs``, features standardized with the training statistics).
The reported metric is the probe's test accuracy in percent (``probe_acc``) — for every method, so
the three encoders are compared alike.

Optimizer (``task.optimizer``): SGD, LARS from ``timm.optim.Lars`` (as the paper) or Adam, with
``optimizer.lr``/``momentum``/``weight_decay``; ``schedule.kind: cosine`` anneals per step after
``schedule.warmup_epochs`` of linear warm-up. Augmentations (``task.augment``) are torchvision
transforms applied per image: ``digits`` = RandomResizedCrop(scale 0.6-1) + RandomAffine(±15°,
10 % shift, shear 10), ``digits_elastic`` adds ElasticTransform, ``autoaugment`` / ``randaugment``
use torchvision's policies followed by RandomResizedCrop.

Data: any :class:`~rankwise.data.ClassificationData` — ``mnist5k`` (held-out stratified test
split), ``image_folder`` (a torchvision ImageFolder directory) or ``cifar_dir`` (CIFAR pickles).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.recipes.config import Config
from rankwise.recipes.reproduce import SupConTask, device_of, task_options

__all__ = ["TwoViewDataset", "build_augmentation", "linear_probe", "run"]

log = logging.getLogger("rankwise")


def build_augmentation(kind: str, image_shape: tuple[int, int, int]) -> Any:
    """Per-image torchvision (v2) augmentation for float images in [0, 1] of shape ``image_shape``."""
    from torchvision.transforms import v2 as T

    _, h, w = image_shape
    crop = T.RandomResizedCrop((h, w), scale=(0.6, 1.0), ratio=(0.8, 1.25), antialias=True)
    if kind == "none":
        return T.Identity()
    if kind in ("digits", "digits_elastic"):
        ops = [crop, T.RandomAffine(degrees=15, translate=(0.1, 0.1), shear=10)]
        if kind == "digits_elastic":
            ops.append(T.ElasticTransform(alpha=30.0, sigma=4.0))
        return T.Compose(ops)
    policy = T.AutoAugment() if kind == "autoaugment" else T.RandAugment(num_ops=2, magnitude=9)
    return T.Compose([T.ToDtype(torch.uint8, scale=True), policy, T.ToDtype(torch.float32, scale=True), crop])


class TwoViewDataset(torch.utils.data.Dataset):
    """``(views, y)`` with ``views`` = ``n_views`` independent augmentations of ``x``: ``(V, C, H, W)``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, transform: Any, n_views: int = 2) -> None:
        self.x, self.y, self.transform, self.n_views = x, y, transform, n_views

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([self.transform(self.x[i]) for _ in range(self.n_views)]), self.y[i]


def tensors(ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` tensors of a dataset of ``(x, y)`` items (fast path for ``TensorPairDataset``)."""
    if hasattr(ds, "x") and hasattr(ds, "y"):
        return ds.x, ds.y
    xs, ys = zip(*(ds[i] for i in range(len(ds))), strict=True)
    return torch.stack(xs), torch.as_tensor(ys)


@torch.no_grad()
def features(encoder: nn.Module, x: torch.Tensor, device: torch.device, batch: int = 512) -> torch.Tensor:
    encoder.eval()
    return torch.cat([encoder(x[i : i + batch].to(device)).float().cpu() for i in range(0, x.shape[0], batch)])


def linear_probe(
    ftr: torch.Tensor,
    ytr: torch.Tensor,
    fte: torch.Tensor,
    yte: torch.Tensor,
    num_classes: int,
    *,
    epochs: int = 30,
    lr: float = 0.01,
    seed: int = 0,
    batch: int = 256,
) -> float:
    """Test accuracy (%) of a linear classifier trained with Adam on standardized frozen features."""
    g = torch.Generator().manual_seed(seed)
    mu, sd = ftr.mean(0), ftr.std(0).clamp_min(1e-6)
    ftr, fte = (ftr - mu) / sd, (fte - mu) / sd
    clf = nn.Linear(ftr.shape[1], num_classes)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        clf.reset_parameters()
    opt = torch.optim.Adam(clf.parameters(), lr=lr, weight_decay=1e-4)
    n = ftr.shape[0]
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, batch):
            idx = perm[i : i + batch]
            loss = F.cross_entropy(clf(ftr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return float((clf(fte).argmax(1) == yte).float().mean()) * 100.0


def _optimizer(params: Any, t: SupConTask, cfg: Config) -> torch.optim.Optimizer:
    o = cfg.optimizer
    if t.optimizer == "lars":
        from timm.optim import Lars

        return Lars(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)  # type: ignore[no-any-return]
    if t.optimizer == "adam":
        return torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay)
    return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)


def _lr_factor(step: int, total: int, warmup: int, kind: str) -> float:
    if warmup and step < warmup:
        return (step + 1) / warmup
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    return 1.0


def run(cfg: Config, *, data: Any = None, progress: bool = False) -> tuple[dict[str, float], dict[str, Any]]:
    """Stage 1 + linear probe; returns ``({"probe_acc": %}, state_dict)`` (see module doc)."""
    from rankwise.losses import supcon_loss
    from rankwise.models import build_backbone
    from rankwise.recipes import _deps

    t: SupConTask = task_options(cfg)
    device = device_of(cfg)
    if data is None:
        data = _deps.get_dataset(cfg.data.name, **cfg.data.options)
    if not hasattr(data, "num_classes"):
        raise ValueError(f"recipe 'supcon' needs a classification dataset, got `data.name` {cfg.data.name!r}")
    xtr, ytr = tensors(data.train)
    xte, yte = tensors(data.test)
    if t.train_subset is not None and t.train_subset < xtr.shape[0]:
        keep = torch.randperm(xtr.shape[0], generator=torch.Generator().manual_seed(cfg.run.seed))[: t.train_subset]
        xtr, ytr = xtr[keep], ytr[keep]
    opts = {**data.meta.get("backbone_options", {}), **cfg.model.options}
    torch.manual_seed(cfg.run.seed)
    encoder, dim = build_backbone(cfg.model.backbone, **opts)
    head: nn.Module
    if t.method == "ce":
        head = nn.Linear(dim, data.num_classes)
    else:
        head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, t.projection_dim))
    model = nn.ModuleDict({"encoder": encoder, "head": head}).to(device)
    aug = build_augmentation(t.augment, (int(xtr.shape[1]), int(xtr.shape[2]), int(xtr.shape[3])))
    views = 1 if t.method == "ce" else 2
    ds = TwoViewDataset(xtr, ytr, aug, n_views=views)
    g = torch.Generator().manual_seed(cfg.run.seed)
    bs = min(cfg.data.batch_size, len(ds))
    loader = torch.utils.data.DataLoader(
        ds, batch_size=bs, shuffle=True, drop_last=len(ds) > bs, generator=g, num_workers=cfg.data.num_workers
    )
    opt = _optimizer(model.parameters(), t, cfg)
    epochs = cfg.trainer.max_epochs
    limit = cfg.trainer.limit_train_batches
    per_epoch = len(loader) if not isinstance(limit, int) else min(len(loader), limit)
    total = epochs * per_epoch
    warmup = cfg.schedule.warmup_epochs * per_epoch
    base = [pg["lr"] for pg in opt.param_groups]
    step, t0, loss = 0, time.perf_counter(), torch.zeros(())
    model.train()
    for epoch in range(epochs):
        for b, (v, y) in enumerate(loader):
            if b >= per_epoch:
                break
            for pg, lr in zip(opt.param_groups, base, strict=True):
                pg["lr"] = lr * _lr_factor(step, total, warmup, cfg.schedule.kind)
            v, y = v.to(device), y.to(device)
            bsz = v.shape[0]
            h = model["encoder"](v.flatten(0, 1))
            if t.method == "ce":
                loss = F.cross_entropy(model["head"](h), y)
            else:
                z = F.normalize(model["head"](h), dim=-1).view(bsz, views, -1)
                labels = y if t.method == "supcon" else None
                loss = supcon_loss(z, labels, temperature=t.temperature, variant=t.variant)
            if not torch.isfinite(loss):
                from rankwise.recipes.modules import NonFiniteLossError

                raise NonFiniteLossError(f"non-finite stage-1 loss {float(loss)} at step {step}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        if progress:
            log.warning(
                "supcon %s epoch %d/%d loss %.4f (%.0f s)",
                t.method,
                epoch + 1,
                epochs,
                float(loss.detach()),
                time.perf_counter() - t0,
            )
    ftr = features(model["encoder"], xtr, device)
    fte = features(model["encoder"], xte, device)
    acc = linear_probe(
        ftr, ytr.cpu(), fte, yte.cpu(), data.num_classes, epochs=t.probe_epochs, lr=t.probe_lr, seed=cfg.run.seed
    )
    return {"probe_acc": acc}, model.state_dict()
