"""Two-stage supervised contrastive learning (Khosla et al., NeurIPS'20) vs SimCLR vs cross-entropy.

Stage 1 trains an encoder (``model.backbone``, e.g. ``small_cnn``) for ``trainer.max_epochs`` epochs:

* ``task.method: supcon`` — a projection head (Linear-ReLU-Linear to ``task.projection_dim``) on two
  augmented views of every image, :func:`rankwise.losses.supcon_loss` with the labels (over the
  global batch of all processes under DDP)
  (``task.temperature``, ``task.variant`` = L_out or L_in), scaled by ``temperature /
  task.base_temperature`` with ``base_temperature`` 0.07 as the reference code (so SimCLR at
  tau 0.5 takes 7.1x the steps of an unscaled NT-Xent, SupCon at tau 0.1 1.4x);
* ``simclr`` — the same with ``labels=None`` (NT-Xent: the other view is the only positive);
* ``ce`` — a linear classifier with cross-entropy on one augmented view.

Stage 2 freezes the encoder, extracts features of the un-augmented train/test images and trains a
linear probe (:class:`LinearProbe`: Adam, ``task.probe_epochs``, features standardized with the
training statistics).
The reported metric is the probe's test accuracy in percent (``probe_acc``) — for every method, so
the three encoders are compared alike.

Optimizer (``optimizer.name``): SGD, LARS from ``timm.optim.Lars`` (as the paper), Adam or AdamW,
with ``optimizer.lr``/``momentum``/``weight_decay``; the presets anneal with ``schedule.kind:
cosine`` per step (``schedule.interval: step``) after ``schedule.warmup_epochs`` of linear warm-up.
Augmentations (``task.augment``) are torchvision transforms applied per image: ``digits`` =
RandomResizedCrop(scale 0.6-1) + RandomAffine(±15°, 10 % shift, shear 10), ``digits_elastic`` adds
ElasticTransform, ``autoaugment`` / ``randaugment`` use torchvision's policies followed by RandomResizedCrop.

Both stages are LightningModules (:class:`ContrastivePretrainer`, :class:`LinearProbe`) trained
through the run lifecycle (:mod:`rankwise.recipes.rundir`): stage 1 runs on ``trainer.devices`` /
``strategy`` (DDP included), logs to ``RUN_DIR/logs`` and ``RUN_DIR/tb``, writes
``RUN_DIR/checkpoints/{best,last}.ckpt`` after every epoch (no validation split: best = the
evaluated last epoch) and resumes from ``last.ckpt``; the augmentations of item ``i`` in epoch
``e`` are seeded by ``(run.seed, e, i)`` (:class:`~rankwise.recipes.common.EpochIndexSampler`), so a
resumed run replays the same views. Stage 2 (cheap) is a local
:class:`~rankwise.recipes.stages.Stage` named ``probe``: one device of rank 0, redone on resume
(and by ``rankwise evaluate``); its log and checkpoint are in ``RUN_DIR/probe``. Plots:
training curves and a t-SNE of the test digits' encoder features coloured by class.

Data: any :class:`~rankwise.data.ClassificationData` — ``mnist5k`` (held-out stratified test
split), ``image_folder`` (a torchvision ImageFolder directory) or ``cifar_dir`` (CIFAR pickles).
``rankwise predict`` (:meth:`SupConRecipe.predict_file`): the probe's class of new images listed
in a CSV.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast

import lightning as L
import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from rankwise.recipes.common import (
    EpochIndexSampler,
    EpochShuffleSampler,
    build_backbone,
    check_finite,
    device_name,
    encode,
    item_seed,
    loader_workers,
    plot_embedding,
    reseed,
    tensors,
)
from rankwise.recipes.config import Config, Options
from rankwise.recipes.datamodules import LoaderData
from rankwise.recipes.loss_terms import LossTerm, Objective, Term, build_term
from rankwise.recipes.optim import configure
from rankwise.recipes.registry import Recipe, register_recipe
from rankwise.recipes.rundir import Run
from rankwise.recipes.stages import Stage

__all__ = [
    "ContrastivePretrainer",
    "LinearProbe",
    "SupConOptions",
    "SupConRecipe",
    "TwoViewDataset",
    "build_augmentation",
    "linear_probe",
]


class SupConOptions(Options):
    """Two-stage contrastive recipe (Khosla et al. 2020) and its baselines; ``trainer.max_epochs`` = stage-1 epochs."""

    method: Literal["supcon", "simclr", "ce"] = Field(
        "supcon",
        description="supcon (labels), simclr (labels=None, NT-Xent) or ce (cross-entropy on one augmented view)",
    )
    temperature: float = Field(0.1, description="supcon_loss temperature", gt=0)
    base_temperature: float = Field(
        0.07,
        description="supcon_loss base_temperature: the loss is scaled by temperature / base_temperature "
        "(0.07 as the reference main_supcon.py / losses.py: x1.43 at tau 0.1, x7.14 at tau 0.5)",
        gt=0,
    )
    variant: Literal["out", "in"] = Field("out", description="L_out (sum over positives outside the log) or L_in")
    augment: Literal["digits", "digits_elastic", "autoaugment", "randaugment", "none"] = Field(
        "digits",
        description="per-image augmentation (digits: RandomResizedCrop + RandomAffine; +Elastic; torchvision policies)",
    )
    projection_dim: int = Field(64, description="output width of the projection head", ge=1)
    train_subset: int | None = Field(
        None, description="use only this many training images (seeded subset); null = all", ge=2
    )
    probe_epochs: int = Field(30, description="epochs of the linear probe (stage 2)", ge=1)
    probe_lr: float = Field(0.01, description="Adam learning rate of the linear probe", gt=0)


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
    :class:`~rankwise.recipes.common.EpochIndexSampler` for fresh, reproducible views every epoch.
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


class ContrastivePretrainer(L.LightningModule):
    """Stage 1: encoder + projection head (SupCon / SimCLR) or linear classifier (CE).

    Args:
        cfg: the run's typed config (``task`` = :class:`SupConOptions`).
        num_classes: classes of the dataset (the CE head's width).
        meta: the dataset's ``meta`` (``backbone_options``, e.g. ``in_channels``).

    ``batch`` = ``(views (B, V, C, H, W), labels (B,))``; ``predict_step`` returns encoder features.
    """

    def __init__(self, cfg: Config, *, num_classes: int, meta: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.hparams.update({"num_classes": int(num_classes)})
        self.cfg = cfg
        self.task: SupConOptions = cfg.task
        self.encoder, dim = build_backbone(cfg.model, meta=meta)
        self.feature_dim = int(dim)
        self.head: nn.Module
        self.contrastive: LossTerm | None = None
        if self.task.method == "ce":
            self.head = nn.Linear(dim, num_classes)
        else:
            self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, self.task.projection_dim))
            # supcon_loss from the loss registry, through a LossTerm like the regularizers; distributed="auto":
            # under DDP every anchor is contrasted with the GLOBAL batch (as the paper's large batches), with
            # gradients flowing back to each rank's own views
            t = self.task
            options = {"temperature": t.temperature, "base_temperature": t.base_temperature, "variant": t.variant}
            self.contrastive = build_term("supcon", options, "task")
        self.objective = Objective(
            self.contrastive if self.contrastive is not None else Term("cross_entropy", self._ce)
        )

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed, self.global_step, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        v, y = batch
        t, bsz, views = self.task, v.shape[0], v.shape[1]
        h = self.encoder(v.flatten(0, 1))
        if self.contrastive is None:  # the CE head's logits of every view, against the labels
            tensors = {"predictions": self.head(h), "labels": y}
        else:
            z = F.normalize(self.head(h).float(), dim=-1).view(bsz, views, -1)
            tensors = {"embeddings": z, "labels": y if t.method == "supcon" else None}
        value = self.objective(tensors)
        check_finite(value.total, self, f"stage-1 {t.method}")
        self.objective.log(self, value, batch_size=bsz)
        return value.total

    @staticmethod
    def _ce(tensors: Mapping[str, Any]) -> torch.Tensor:
        return F.cross_entropy(tensors["predictions"], tensors["labels"])

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        f = self.encoder(x)
        return (f.flatten(1) if f.dim() > 2 else f).float()

    def configure_optimizers(self) -> Any:
        return configure(self, self.cfg.optimizer, self.cfg.schedule)


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
        # the probe's own small Adam (not the recipe's optimizer: stage 2 is the fixed linear evaluation protocol)
        return torch.optim.Adam(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


def linear_probe(
    run: Run,
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
    """Test accuracy (%) of a :class:`LinearProbe` trained (Adam) on frozen features, on one device.

    A local stage named ``probe``: its CSV log (``RUN_DIR/probe/logs``, plotted as
    ``plots/probe_curves.png``) and last checkpoint (``RUN_DIR/probe/last.ckpt``) are written; the
    accuracy is ``Trainer.test`` of that checkpoint.
    """
    from torch.utils.data import DataLoader, TensorDataset

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        probe = LinearProbe(ftr.mean(0), ftr.std(0), num_classes, lr=lr)
    train_dl = DataLoader(
        TensorDataset(ftr.float(), ytr.long()), batch_size=batch, sampler=EpochShuffleSampler(len(ytr), seed)
    )
    test_dl = DataLoader(TensorDataset(fte.float(), yte.long()), batch_size=1024)
    data = LoaderData(train_dl, test=test_dl)
    stage = Stage("probe", probe, data, epochs=epochs, local=True, precision=False, hand_on=None, curves="linear probe")
    trainer = run.run_stage(stage).trainer
    out, _ = run.test(probe, data, "last", "probe", trainer=trainer)
    return float(out["test/acc"])


def _train_images(run: Run) -> tuple[torch.Tensor, torch.Tensor]:
    t: SupConOptions = run.cfg.task
    xtr, ytr = tensors(run.data.train)
    if t.train_subset is not None and t.train_subset < xtr.shape[0]:
        keep = torch.randperm(xtr.shape[0], generator=torch.Generator().manual_seed(run.cfg.run.seed))[: t.train_subset]
        xtr, ytr = xtr[keep], ytr[keep]
    return xtr, ytr


class SupConRecipe(Recipe):
    """SupCon / SimCLR / cross-entropy encoder (stage 1), then a linear probe on its frozen features (stage 2)."""

    name = "supcon"
    description = "two-stage contrastive learning (SupCon / SimCLR / CE) + linear probe accuracy"
    options: type = SupConOptions

    def fit(self, run: Run) -> dict[str, Any]:
        from torch.utils.data import DataLoader

        cfg, t = run.cfg, run.cfg.task
        xtr, ytr = _train_images(run)
        torch.manual_seed(cfg.run.seed)
        module = ContrastivePretrainer(cfg, num_classes=int(run.data.num_classes), meta=run.data.meta)
        aug = build_augmentation(t.augment, (int(xtr.shape[1]), int(xtr.shape[2]), int(xtr.shape[3])))
        ds = TwoViewDataset(xtr, ytr, aug, n_views=1 if t.method == "ce" else 2, seed=cfg.run.seed)
        bs = min(cfg.data.batch_size, len(ds))
        loader = DataLoader(
            ds,
            batch_size=bs,
            sampler=EpochIndexSampler(len(ds), cfg.run.seed),
            drop_last=len(ds) > bs,
            **loader_workers(cfg.data.num_workers),
        )
        # no validation split: best = the last epoch, whose features the probe is trained and tested on
        run.run_stage(Stage("", module, LoaderData(loader), epochs=cfg.trainer.max_epochs, hand_on=None))
        return run.rank_zero(self._test, run, module, xtr, ytr, "last")

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        xtr, ytr = _train_images(run)
        module = ContrastivePretrainer(run.cfg, num_classes=int(run.data.num_classes), meta=run.data.meta)
        return self._test(run, module, xtr, ytr, checkpoint or "last")

    def predict_file(self, run: Run, path: Path, checkpoint: str | None) -> dict[str, Any]:
        """The linear probe's classes of new images: a CSV whose ``path`` column lists image files (relative
        to the CSV's folder), read as the run's dataset reads its images
        (:func:`~rankwise.recipes.predict_data.class_prediction_rows`).

        The encoder is ``checkpoints/<checkpoint>.ckpt`` (None: ``last``, as :meth:`evaluate`), the probe
        ``probe/last.ckpt`` (trained by the last ``train`` / ``evaluate`` on that encoder's features).
        Columns: the CSV's own (text, as read), ``probability`` (softmax of the predicted class, float32)
        and ``prediction``: the class by the dataset's name for it (``image_folder``: its folder), else its
        index. A computed name the CSV already has gets ``_1``.
        """
        from rankwise.recipes.predict_data import (
            append_columns,
            check_class_predictable,
            class_names,
            class_prediction_rows,
            require_checkpoint,
        )

        check_class_predictable(run.cfg)
        name = checkpoint or "last"
        require_checkpoint(run, name)
        require_checkpoint(run, "last", "probe")
        module = ContrastivePretrainer(run.cfg, num_classes=int(run.data.num_classes), meta=run.data.meta)
        dim = module.feature_dim
        probe = LinearProbe(torch.zeros(dim), torch.ones(dim), int(run.data.num_classes))
        run.load(probe, "last", "probe")  # every key and shape checked, before the images are read
        run.checked(module, name)
        new = class_prediction_rows(run, path)
        if len(new.images) == 0:
            prob, idx = torch.zeros(0), torch.zeros(0, dtype=torch.long)
        else:
            features = encode(run, module, new.images, checkpoint=name)
            with torch.no_grad():
                prob, idx = torch.softmax(probe.eval()(features).float(), dim=-1).max(dim=-1)
        computed = {"probability": prob.numpy(), "prediction": class_names(run.data.meta, idx.numpy())}
        return append_columns(new.header, new.rows, computed)

    def _test(
        self, run: Run, module: ContrastivePretrainer, xtr: torch.Tensor, ytr: torch.Tensor, checkpoint: str
    ) -> dict[str, Any]:
        """The linear probe's test accuracy on the features of ``checkpoints/<checkpoint>.ckpt``."""
        cfg, t = run.cfg, run.cfg.task
        xte, yte = tensors(run.data.test)
        ftr, fte = encode(run, module, xtr, checkpoint=checkpoint), encode(run, module, xte, checkpoint=checkpoint)
        acc = linear_probe(
            run,
            ftr,
            ytr.cpu(),
            fte,
            yte.cpu(),
            int(run.data.num_classes),
            epochs=t.probe_epochs,
            lr=t.probe_lr,
            seed=cfg.run.seed,
        )
        plot_embedding(run, fte, yte)
        return {"test": {"probe_acc": acc}, "device": device_name(cfg)}


register_recipe(SupConRecipe())
