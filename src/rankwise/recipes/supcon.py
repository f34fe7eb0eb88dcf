"""Two-stage supervised contrastive learning (Khosla et al., NeurIPS'20) vs SimCLR vs cross-entropy.

Stage 1 trains an encoder (``model.backbone``, e.g. ``small_cnn``) for ``trainer.max_epochs`` epochs:

* ``task.method: supcon`` — a projection head (Linear-ReLU-Linear to ``task.projection_dim``) on two
  augmented views of every image, :func:`rankwise.losses.supcon_loss` with the labels (over the
  global batch of all processes under DDP)
  (``task.temperature``, ``task.variant`` = L_out or L_in);
* ``simclr`` — the same with ``labels=None`` (NT-Xent: the other view is the only positive);
* ``ce`` — a linear classifier with cross-entropy on one augmented view.

Stage 2 freezes the encoder, extracts features of the un-augmented train/test images and trains a
linear probe (:class:`LinearProbe`: Adam, ``task.probe_epochs``, features standardized with the
training statistics).
The reported metric is the probe's test accuracy in percent (``probe_acc``) — for every method, so
the three encoders are compared alike.

Optimizer (``task.optimizer``): SGD, LARS from ``timm.optim.Lars`` (as the paper) or Adam, with
``optimizer.lr``/``momentum``/``weight_decay``; ``schedule.kind: cosine`` anneals per step after
``schedule.warmup_epochs`` of linear warm-up. Augmentations (``task.augment``) are torchvision
transforms applied per image: ``digits`` = RandomResizedCrop(scale 0.6-1) + RandomAffine(±15°,
10 % shift, shear 10), ``digits_elastic`` adds ElasticTransform, ``autoaugment`` / ``randaugment``
use torchvision's policies followed by RandomResizedCrop.

Both stages are LightningModules (:class:`ContrastivePretrainer`, :class:`LinearProbe`) trained by
Lightning's Trainer: stage 1 runs on ``trainer.devices`` / ``strategy`` (DDP included), logs to
``RUN_DIR/logs`` and ``RUN_DIR/tb``, writes ``RUN_DIR/checkpoints/last.ckpt`` after every epoch and
resumes from it (``rankwise train ... --resume``); the augmentations of item ``i`` in epoch ``e`` are
seeded by ``(run.seed, e, i)`` (:class:`~rankwise.recipes.modules.EpochIndexSampler`), so a resumed
run replays the same views. Stage 2 (cheap) runs on one device of rank 0 and is redone on resume;
its log and checkpoint are in ``RUN_DIR/probe``.

Data: any :class:`~rankwise.data.ClassificationData` — ``mnist5k`` (held-out stratified test
split), ``image_folder`` (a torchvision ImageFolder directory) or ``cifar_dir`` (CIFAR pickles).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F

from rankwise.recipes.config import Config, config_from_dict, config_to_dict
from rankwise.recipes.modules import EpochIndexSampler, EpochShuffleSampler, NonFiniteLossError, item_seed, reseed
from rankwise.recipes.reproduce import SupConTask, task_options

__all__ = [
    "ContrastivePretrainer",
    "LinearProbe",
    "TwoViewDataset",
    "build_augmentation",
    "encode",
    "fit",
    "linear_probe",
    "tensors",
]


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
    """``(views, y)`` with ``views`` = ``n_views`` augmentations of image ``i % len``: ``(V, C, H, W)``.

    The augmentations of index ``i`` are drawn from the seed ``item_seed(seed, i)`` (torch's global
    RNG is forked, so the caller's state is untouched): pair it with
    :class:`~rankwise.recipes.modules.EpochIndexSampler` for fresh, reproducible views every epoch.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, transform: Any, n_views: int = 2, seed: int = 0) -> None:
        self.x, self.y, self.transform, self.n_views, self.seed = x, y, transform, n_views, seed

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = int(i) % len(self)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(item_seed(self.seed, int(i)))
            views = torch.stack([self.transform(self.x[j]) for _ in range(self.n_views)])
        return views, self.y[j]


def tensors(ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` tensors of a dataset of ``(x, y)`` items (fast path for ``TensorPairDataset``)."""
    if hasattr(ds, "x") and hasattr(ds, "y"):
        return ds.x, ds.y
    xs, ys = zip(*(ds[i] for i in range(len(ds))), strict=True)
    return torch.stack(xs), torch.as_tensor(ys)


def _lr_factor(step: int, total: int, warmup: int, kind: str) -> float:
    if warmup and step < warmup:
        return (step + 1) / warmup
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, total - warmup) / max(1, total - warmup)))
    return 1.0


class ContrastivePretrainer(L.LightningModule):
    """Stage 1: encoder + projection head (SupCon / SimCLR) or linear classifier (CE).

    Args:
        config: the run's :class:`~rankwise.recipes.config.Config` as a dict (``task`` = :class:`SupConTask`).
        num_classes: classes of the dataset (the CE head's width).
        meta: the dataset's ``meta`` (``backbone_options``, e.g. ``in_channels``).

    ``batch`` = ``(views (B, V, C, H, W), labels (B,))``; ``predict_step`` returns encoder features.
    """

    def __init__(self, config: dict[str, Any], *, num_classes: int, meta: dict[str, Any] | None = None) -> None:
        from rankwise.models import build_backbone

        super().__init__()
        self.hparams.update({"config": config, "num_classes": int(num_classes)})
        self.cfg = config_from_dict(config)
        self.task: SupConTask = task_options(self.cfg)
        opts = {**(meta or {}).get("backbone_options", {}), **self.cfg.model.options}
        self.encoder, dim = build_backbone(self.cfg.model.backbone, **opts)
        self.feature_dim = int(dim)
        self.head: nn.Module
        if self.task.method == "ce":
            self.head = nn.Linear(dim, num_classes)
        else:
            self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, self.task.projection_dim))

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed, self.global_step, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        from rankwise.losses import supcon_loss

        v, y = batch
        t, bsz, views = self.task, v.shape[0], v.shape[1]
        h = self.encoder(v.flatten(0, 1))
        if t.method == "ce":
            loss = F.cross_entropy(self.head(h), y)
        else:
            z = F.normalize(self.head(h).float(), dim=-1).view(bsz, views, -1)
            labels = y if t.method == "supcon" else None
            # distributed="auto": under DDP every anchor is contrasted with the GLOBAL batch (as the paper's
            # large batches), with gradients flowing back to each rank's own views
            loss = supcon_loss(z, labels, temperature=t.temperature, variant=t.variant, distributed="auto")
        if not bool(torch.isfinite(loss.detach())):
            raise NonFiniteLossError(
                f"the stage-1 {t.method} loss became {loss.detach().item()} at epoch {self.current_epoch}, global "
                f"step {self.global_step}; stopping. The last good checkpoint is kept; try a smaller learning rate."
            )
        self.log(f"train/{t.method}_loss", loss.detach(), on_step=True, on_epoch=True, batch_size=bsz, sync_dist=True)
        return loss

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        f = self.encoder(x)
        return (f.flatten(1) if f.dim() > 2 else f).float()

    def configure_optimizers(self) -> Any:
        o, t, s = self.cfg.optimizer, self.task, self.cfg.schedule
        opt: torch.optim.Optimizer
        if t.optimizer == "lars":
            from timm.optim import Lars

            opt = Lars(self.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
        elif t.optimizer == "adam":
            opt = torch.optim.Adam(self.parameters(), lr=o.lr, weight_decay=o.weight_decay)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = s.warmup_epochs * max(1, total // max(1, self.trainer.max_epochs or 1))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: _lr_factor(step, total, warmup, s.kind))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class LinearProbe(L.LightningModule):
    """Stage 2: a linear classifier on frozen features, standardized with the training mean / std.

    ``batch`` = ``(features (B, D), labels (B,))``; ``test_step`` logs ``test/acc`` in percent.
    """

    def __init__(
        self,
        mean: torch.Tensor,
        std: torch.Tensor,
        num_classes: int,
        *,
        lr: float = 0.01,
        weight_decay: float = 1e-4,
    ) -> None:
        super().__init__()
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self.register_buffer("mean", mean.detach().float().clone())
        self.register_buffer("std", std.detach().float().clamp_min(1e-6).clone())
        self.linear = nn.Linear(int(mean.numel()), int(num_classes))

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        mean, std = cast(torch.Tensor, self.mean), cast(torch.Tensor, self.std)
        return self.linear((f - mean) / std)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        f, y = batch
        loss = F.cross_entropy(self(f), y)
        self.log("probe/loss", loss.detach(), on_step=False, on_epoch=True, batch_size=y.numel())
        return loss

    def test_step(self, batch: Any, batch_idx: int) -> None:
        f, y = batch
        acc = (self(f).argmax(-1) == y).float().mean() * 100.0
        self.log("test/acc", acc, on_epoch=True, batch_size=y.numel())

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


def _quiet_trainer(**kwargs: Any) -> L.Trainer:
    defaults: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return L.Trainer(**{**defaults, **kwargs})


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
    root_dir: str | Path | None = None,
    accelerator: str = "cpu",
) -> float:
    """Test accuracy (%) of a :class:`LinearProbe` trained by Lightning (Adam) on frozen features.

    With ``root_dir``, the probe's CSV log (``root_dir/logs``) and last checkpoint
    (``root_dir/last.ckpt``) are written there; otherwise nothing is written.
    """
    from torch.utils.data import DataLoader, TensorDataset

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        probe = LinearProbe(ftr.mean(0), ftr.std(0), num_classes, lr=lr)
    train_dl = DataLoader(
        TensorDataset(ftr.float(), ytr.long()), batch_size=batch, sampler=EpochShuffleSampler(len(ytr), seed)
    )
    test_dl = DataLoader(TensorDataset(fte.float(), yte.long()), batch_size=1024)
    kw: dict[str, Any] = {"max_epochs": epochs, "accelerator": accelerator}
    if root_dir is not None:
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.loggers import CSVLogger

        from rankwise.recipes.runner import AtomicCheckpointIO

        kw |= {
            "default_root_dir": str(root_dir),
            "logger": CSVLogger(root_dir, name="logs", version=""),
            "enable_checkpointing": True,
            "callbacks": [ModelCheckpoint(dirpath=root_dir, save_top_k=0, save_last=True)],
            "plugins": [AtomicCheckpointIO()],
            "log_every_n_steps": 1,
        }
    trainer = _quiet_trainer(**kw)
    trainer.fit(probe, train_dl)
    out = trainer.test(probe, test_dl, verbose=False)
    return float(out[0]["test/acc"])


def encode(module: L.LightningModule, x: torch.Tensor, cfg: Config, batch: int = 512) -> torch.Tensor:
    """Features ``module.predict_step`` of images ``x`` (CPU float32), on one device (``trainer.accelerator``)."""
    from torch.utils.data import DataLoader, TensorDataset

    from rankwise.recipes.runner import eval_trainer

    out = eval_trainer(cfg).predict(module, DataLoader(TensorDataset(x), batch_size=batch))
    return torch.cat([o.cpu().float() for o in out])  # type: ignore[union-attr]


def fit(cfg: Config, run_dir: Path, *, data: Any = None, resume: bool = False, progress: bool = False) -> Any:
    """Stage 1 (Lightning, resumable, DDP) + linear probe; returns ``{"probe_acc": %}`` (``None`` on rank > 0)."""
    from torch.utils.data import DataLoader

    from rankwise.recipes import _deps, runner

    t: SupConTask = task_options(cfg)
    if data is None:
        data = _deps.get_dataset(cfg.data.name, **cfg.data.options)
    if not hasattr(data, "num_classes"):
        raise ValueError(f"recipe 'supcon' needs a classification dataset, got `data.name` {cfg.data.name!r}")
    xtr, ytr = tensors(data.train)
    xte, yte = tensors(data.test)
    if t.train_subset is not None and t.train_subset < xtr.shape[0]:
        keep = torch.randperm(xtr.shape[0], generator=torch.Generator().manual_seed(cfg.run.seed))[: t.train_subset]
        xtr, ytr = xtr[keep], ytr[keep]
    torch.manual_seed(cfg.run.seed)
    module = ContrastivePretrainer(config_to_dict(cfg), num_classes=int(data.num_classes), meta=data.meta)
    aug = build_augmentation(t.augment, (int(xtr.shape[1]), int(xtr.shape[2]), int(xtr.shape[3])))
    ds = TwoViewDataset(xtr, ytr, aug, n_views=1 if t.method == "ce" else 2, seed=cfg.run.seed)
    bs = min(cfg.data.batch_size, len(ds))
    loader = DataLoader(
        ds,
        batch_size=bs,
        sampler=EpochIndexSampler(len(ds), cfg.run.seed),
        drop_last=len(ds) > bs,
        num_workers=cfg.data.num_workers,
        persistent_workers=cfg.data.num_workers > 0,
    )
    ckpt_dir = run_dir / "checkpoints"
    last = ckpt_dir / "last.ckpt"
    trainer = runner._trainer(
        cfg, run_dir, ckpt_dir, max_epochs=cfg.trainer.max_epochs, monitor=None, progress=progress
    )
    trainer.fit(module, loader, ckpt_path=str(last) if resume and last.is_file() else None, weights_only=True)
    if trainer.global_rank != 0:
        return None
    ftr, fte = encode(module, xtr, cfg), encode(module, xte, cfg)
    acc = linear_probe(
        ftr,
        ytr.cpu(),
        fte,
        yte.cpu(),
        int(data.num_classes),
        epochs=t.probe_epochs,
        lr=t.probe_lr,
        seed=cfg.run.seed,
        root_dir=run_dir / "probe",
        accelerator=str(cfg.trainer.accelerator),
    )
    return {"probe_acc": acc}
