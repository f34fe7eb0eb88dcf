r"""Top-k classification, ``recipe: topk``: a classifier trained with a top-k loss or cross-entropy.

A backbone (``model.backbone``: ``mlp`` for feature vectors, ``small_cnn`` / ``resnet18`` for
images) and a linear layer to the dataset's classes give the logits. The loss is ``task.loss``:

* ``cross_entropy`` -- :func:`torch.nn.functional.cross_entropy` (the baseline; ``task.loss_options``
  may set its ``label_smoothing``);
* a registered loss of a classifier's logits and classes (registry ``takes="class_logits"``):
  ``topk_cross_entropy``, the differentiable top-k cross-entropy of Petersen et al. (ICML 2022,
  "Differentiable Top-k Classification Learning"), :func:`rankwise.losses.topk_cross_entropy_loss`,
  with ``task.loss_options`` as its keyword options (``p_k``, ``method`` = ``odd_even`` / ``bitonic``
  / ``splitter_selection`` / ``neuralsort`` / ``softsort``, ``inverse_temperature``, ``m``, ...).

The loss is the run's :class:`~rankwise.recipes.loss_terms.Objective` (logged as ``train/loss`` and
``train/loss/<name>``). Training: ``data.batch_size`` examples per step in a seeded order that
depends only on ``(run.seed, epoch)``, ``trainer.max_epochs`` epochs; ``task.augment: flip_crop``
adds a random horizontal flip and a random crop of the image padded by 4 pixels (CIFAR's standard
augmentation) to every training image, drawn from the step's seed.

Validation: the dataset's validation split, else a stratified ``task.val_fraction`` of the training
split (seeded by ``task.val_seed``, the same for every run seed; 0: no validation, best = last
epoch). After every epoch ``val/top<k>`` for each ``k`` of ``task.ks`` (percent,
:class:`~rankwise.recipes.eval_metrics.TopKAccuracy`: over every rank, each example once) and
``val/<task.val_metric>`` selects ``checkpoints/best.ckpt``.

Test (best checkpoint): ``test/top<k>`` for each ``k`` (percent), logged by the module's test step
with the same metrics; metrics.json ``test`` = ``{top1, top5, ...}``, ``seconds_per_step`` the wall
time of one training step. ``rankwise predict`` (:meth:`TopKRecipe.predict_file`): the classes of
new rows -- image files listed in a CSV (``path`` column), or the feature columns of
``topk_synthetic`` -- with the top-1 probability and the ``max(task.ks)`` most likely classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import lightning as L
import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from rankwise.recipes._progress import StepTimer
from rankwise.recipes.common import (
    EpochShuffleSampler,
    build_backbone,
    check_finite,
    device_name,
    loader_workers,
    reseed,
    tensors,
)
from rankwise.recipes.config import Config, ConfigError, Options, check_kwargs
from rankwise.recipes.datamodules import LoaderData
from rankwise.recipes.eval_metrics import TopKAccuracy, shard_keep_mask, val_sampler
from rankwise.recipes.loss_terms import Objective, Term, build_term, check_takes
from rankwise.recipes.optim import configure
from rankwise.recipes.registry import Recipe, register_recipe
from rankwise.recipes.rundir import Run
from rankwise.recipes.stages import Stage

__all__ = ["TopKModule", "TopKOptions", "TopKRecipe", "augment_flip_crop"]

#: the recipe's own baseline loss (no registry entry): torch's cross-entropy of the logits
CROSS_ENTROPY = "cross_entropy"
#: the arguments of F.cross_entropy that the recipe supplies or that are not options
_CE_SUPPLIED = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction")


def _topk_losses() -> tuple[str, ...]:
    """The registered losses the recipe can train with: those whose registry entry takes a classifier's
    logits and classes (``takes="class_logits"``)."""
    from rankwise.recipes.loss_terms import usable_losses

    return tuple(usable_losses(("class_logits",)))


class TopKOptions(Options):
    """A classifier trained with a top-k loss (or cross-entropy), evaluated by top-k accuracy."""

    loss: str = Field(
        "topk_cross_entropy",
        description="cross_entropy (the baseline) or a registered loss of (logits, classes): "
        + ", ".join(_topk_losses()),
    )
    loss_options: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword options of the loss (topk_cross_entropy: {p_k: [0.5, 0, 0, 0, 0.5], method: odd_even, "
        "inverse_temperature: 2.0, m: 16}; cross_entropy: {label_smoothing: 0.1})",
    )
    ks: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [1, 5], description="k of the reported top-k accuracies (val/top<k>, test/top<k>)"
    )
    val_metric: str = Field("top5", description="validation metric selecting best.ckpt: top<k> for a k of task.ks")
    val_fraction: float = Field(
        0.1,
        description="stratified share of the training split held out for validation when the dataset has no "
        "validation split (0: no validation, best = last epoch)",
        ge=0,
        lt=1,
    )
    val_seed: int = Field(0, description="seed of that held-out share (the same for every run.seed)", ge=0)
    augment: Literal["none", "flip_crop"] = Field(
        "none", description="training augmentation of images: flip_crop = random horizontal flip + 4-pixel pad-crop"
    )


def augment_flip_crop(x: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """A random horizontal flip (probability 1/2) and a random ``H x W`` crop of the image zero-padded by ``pad``
    pixels, for every image of ``x`` ``(B, C, H, W)``, from torch's global RNG (the recipe seeds it per step).

    Example:
        >>> x = torch.arange(16.0).view(1, 1, 4, 4)
        >>> augment_flip_crop(x, pad=1).shape
        torch.Size([1, 1, 4, 4])
    """
    if x.dim() != 4:
        raise ValueError(f"`x` must be a batch of images (B, C, H, W), got shape {tuple(x.shape)}")
    b, _, h, w = x.shape
    flip = torch.rand(b, device=x.device) < 0.5
    x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
    padded = F.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (b,), device=x.device)
    dx = torch.randint(0, 2 * pad + 1, (b,), device=x.device)
    rows = (dy.view(-1, 1) + torch.arange(h, device=x.device)).view(b, 1, h, 1).expand(-1, x.shape[1], -1, w + 2 * pad)
    out = padded.gather(2, rows)
    cols = (dx.view(-1, 1) + torch.arange(w, device=x.device)).view(b, 1, 1, w).expand(-1, x.shape[1], h, -1)
    return out.gather(3, cols)


def _cross_entropy(options: Mapping[str, Any]) -> Term:
    smoothing = float(options.get("label_smoothing", 0.0))

    def ce(t: Mapping[str, Any]) -> torch.Tensor:
        return F.cross_entropy(t["logits"], t["classes"], label_smoothing=smoothing)

    return Term(CROSS_ENTROPY, ce)


def _loader_sampler(loaders: Any) -> Any:
    if isinstance(loaders, (list, tuple)):
        loaders = loaders[0] if loaders else None
    return getattr(loaders, "sampler", None)


class TopKModule(L.LightningModule):
    """Backbone + linear classifier; ``batch`` = ``(inputs (B, ...), classes (B,))``.

    ``validation_step`` / ``test_step`` update one :class:`~rankwise.recipes.eval_metrics.TopKAccuracy`
    per ``k`` of ``task.ks`` and log them as ``val/top<k>`` / ``test/top<k>``; ``predict_step``
    returns the float32 logits.
    """

    def __init__(self, cfg: Config, *, num_classes: int, meta: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.hparams.update({"num_classes": int(num_classes)})
        self.cfg = cfg
        self.task: TopKOptions = cfg.task
        self.num_classes = int(num_classes)
        self.net, dim = build_backbone(cfg.model, meta=meta)
        self.head = nn.Linear(int(dim), self.num_classes)
        t = self.task
        if t.loss == CROSS_ENTROPY:
            self.objective = Objective(_cross_entropy(t.loss_options))
        else:
            self.loss_term = build_term(t.loss, t.loss_options, "task.loss_options")
            self.objective = Objective(self.loss_term)
        # hit counts and example counts over every rank, each example once (rankwise.recipes.eval_metrics)
        self.val_acc = nn.ModuleList(TopKAccuracy(k=k) for k in t.ks)
        self.test_acc = nn.ModuleList(TopKAccuracy(k=k) for k in t.ks)
        self._seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.net(x)
        return self.head(f.flatten(1) if f.dim() > 2 else f).float()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed, self.global_step, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.task.augment == "flip_crop" and x.dim() == 4:
            x = augment_flip_crop(x)
        value = self.objective({"logits": self(x), "classes": y})
        check_finite(value.total, self, self.objective.task.name)
        self.objective.log(self, value, batch_size=y.numel())
        return value.total

    def on_validation_epoch_start(self) -> None:
        self._seen = 0

    def on_test_epoch_start(self) -> None:
        self._seen = 0

    def _update(self, batch: Any, metrics: nn.ModuleList, sampler: Any, prefix: str) -> None:
        x, y = batch
        # an example the DistributedSampler repeats to even out the shards counts once
        keep = shard_keep_mask(sampler, self._seen, y.numel(), y.device)
        self._seen += y.numel()
        logits = self(x).detach()
        for k, module in zip(self.task.ks, metrics, strict=True):
            metric = cast(TopKAccuracy, module)
            metric.update(logits[keep], y[keep])
            # a Metric object: Lightning computes it over the whole split at the epoch's end and resets it
            key = f"top{k}"
            self.log(f"{prefix}/{key}", metric, prog_bar=key == self.task.val_metric, on_step=False, on_epoch=True)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._update(batch, self.val_acc, val_sampler(self.trainer), "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._update(batch, self.test_acc, _loader_sampler(getattr(self.trainer, "test_dataloaders", None)), "test")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0] if isinstance(batch, (list, tuple)) else batch)

    def configure_optimizers(self) -> Any:
        return configure(self, self.cfg.optimizer, self.cfg.schedule)


def _splits(run: Run) -> tuple[Any, Any, Any]:
    """``(train, val or None, test)`` datasets: the dataset's validation split, else a stratified
    ``task.val_fraction`` of the training split (seed ``task.val_seed``)."""
    import numpy as np

    from rankwise.data import TensorPairDataset
    from rankwise.data.mnist import stratified_split

    data, t = run.data, run.cfg.task
    if data.val is not None and len(data.val) > 0:
        return data.train, data.val, data.test
    if t.val_fraction == 0:
        return data.train, None, data.test
    x, y = tensors(data.train)
    held = stratified_split(y.numpy(), t.val_fraction, np.random.default_rng(t.val_seed))
    if len(held) == 0 or len(held) == len(y):
        raise ConfigError(
            f"`task.val_fraction` = {t.val_fraction} of the {len(y)} training examples of `{run.cfg.data.name}` "
            f"leaves {len(y) - len(held)} for training and {len(held)} for validation; both need at least one "
            "(another fraction, or 0 for no validation)"
        )
    rest = torch.from_numpy(np.setdiff1d(np.arange(len(y)), held))
    idx = torch.from_numpy(held)
    return TensorPairDataset(x[rest], y[rest]), TensorPairDataset(x[idx], y[idx]), data.test


class TopKRecipe(Recipe):
    """A classifier trained with a top-k loss or cross-entropy; test top-1 / top-5 accuracy."""

    name = "topk"
    per_step = True
    description = "top-k classification: a classifier trained with a differentiable top-k loss or cross-entropy"
    options: type = TopKOptions

    def method(self, cfg: Config) -> str:
        t: TopKOptions = cfg.task
        inner = t.loss_options.get("method")
        return f"{t.loss}({inner})" if t.loss != CROSS_ENTROPY and inner else str(t.loss)

    def check(self, cfg: Config) -> None:
        t: TopKOptions = cfg.task
        if t.loss == CROSS_ENTROPY:
            check_kwargs(F.cross_entropy, dict(t.loss_options), "task.loss_options", supplied=_CE_SUPPLIED)
            smoothing = t.loss_options.get("label_smoothing", 0.0)
            if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
                raise ConfigError(f"`task.loss_options.label_smoothing` must be a number in [0, 1), got {smoothing!r}")
        else:
            from rankwise._validation import did_you_mean
            from rankwise.losses import LOSSES

            if t.loss not in LOSSES:
                choices = [CROSS_ENTROPY, *_topk_losses()]
                raise ConfigError(f"`task.loss`: unknown loss {t.loss!r}; " + did_you_mean(t.loss, choices, "losses"))
            entry = check_takes(t.loss, "task.loss", ("class_logits",))
            built = entry.module if entry.module is not None else entry.fn
            check_kwargs(
                built, dict(t.loss_options), "task.loss_options", supplied=(*(entry.inputs or {}), "distributed")
            )
            build_term(t.loss, t.loss_options, "task.loss_options")  # the options' values (p_k sums to 1, ...)
        if not t.ks or len(set(t.ks)) != len(t.ks):
            raise ConfigError(f"`task.ks` must be a non-empty list of distinct positive ints; got {t.ks!r}")
        valid = [f"top{k}" for k in t.ks]
        if t.val_metric not in valid:
            raise ConfigError(
                f"`task.val_metric` must be one of {', '.join(valid)} (top<k> for k in `task.ks`); got {t.val_metric!r}"
            )

    def load_data(self, cfg: Config) -> Any:
        """The run's dataset, checked against the task before the run directory is made: a ``k`` of
        ``task.ks`` above the classes is a ConfigError naming ``task.ks``, a ``p_k`` longer than the
        classes or an ``m`` above them one naming ``task.loss_options``."""
        data = super().load_data(cfg)
        c = getattr(data, "num_classes", None)
        t: TopKOptions = cfg.task
        if isinstance(c, int) and t.loss != CROSS_ENTROPY:
            p_k, m = t.loss_options.get("p_k"), t.loss_options.get("m")
            if isinstance(p_k, list) and len(p_k) > c:
                raise ConfigError(
                    f"`task.loss_options.p_k` has {len(p_k)} entries, more than the {c} classes of `{cfg.data.name}`"
                )
            if isinstance(m, int) and m > c:
                raise ConfigError(f"`task.loss_options.m` = {m} is more than the {c} classes of `{cfg.data.name}`")
        if isinstance(c, int) and max(t.ks) > c:
            raise ConfigError(
                f"`task.ks` = {t.ks} has a k above the {c} classes of `{cfg.data.name}` (top-k accuracy needs k <= {c})"
            )
        return data

    def _module(self, run: Run) -> TopKModule:
        return TopKModule(run.cfg, num_classes=int(run.data.num_classes), meta=run.data.meta)

    def _loaders(self, run: Run) -> LoaderData:
        from torch.utils.data import DataLoader

        cfg = run.cfg
        train, val, test = _splits(run)
        n, bs = len(train), cfg.data.batch_size
        kw: dict[str, Any] = loader_workers(cfg.data.num_workers)
        train_dl = DataLoader(
            train, batch_size=bs, sampler=EpochShuffleSampler(n, cfg.run.seed), drop_last=n > bs, **kw
        )

        def evaluation(ds: Any) -> Any:
            return DataLoader(ds, batch_size=cfg.data.eval_batch_size, shuffle=False, **kw)

        return LoaderData(train_dl, None if val is None else evaluation(val), lambda: evaluation(test))

    def fit(self, run: Run) -> dict[str, Any]:
        cfg = run.cfg
        torch.manual_seed(cfg.run.seed)
        module = self._module(run)
        data = self._loaders(run)
        timer = StepTimer()
        monitor = f"val/{cfg.task.val_metric}" if data.has("val") else None
        stage = Stage(
            "",
            module,
            data,
            epochs=cfg.trainer.max_epochs,
            monitor=monitor,
            mode="max",
            hand_on=None,
            callbacks=[timer],
        )
        run.run_stage(stage)
        return run.rank_zero(self._test, run, module, data, "best", timer)

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        return self._test(run, self._module(run), self._loaders(run), checkpoint or "best")

    def _test(
        self, run: Run, module: TopKModule, data: LoaderData, checkpoint: str, timer: StepTimer | None = None
    ) -> dict[str, Any]:
        """Test top-k accuracies of ``checkpoints/<checkpoint>.ckpt`` (``Trainer.test`` loads it)."""
        got, ckpt = run.test(module, data, checkpoint)
        test = {f"top{k}": float(got[f"test/top{k}"]) for k in run.cfg.task.ks}
        out: dict[str, Any] = {
            "test": test,
            "checkpoint": str(ckpt.relative_to(run.dir)),
            "device": device_name(run.cfg),
        }
        if timer is not None and timer.steps:
            out["seconds_per_step"] = timer.seconds / timer.steps
        return out

    def predict_file(self, run: Run, path: Path, checkpoint: str | None) -> dict[str, Any]:
        """The classes of the rows of a new file: a CSV whose ``path`` column lists image files (relative to
        the CSV's folder; image datasets) or that holds the feature columns ``x0`` .. of ``topk_synthetic``,
        read as the run's dataset reads its items (:func:`~rankwise.recipes.predict_data.class_prediction_rows`).

        ``checkpoints/<checkpoint>.ckpt`` (None: ``best``, as :meth:`evaluate`) gives the logits. Columns:
        the CSV's own (text, as read), ``probability`` (softmax of the predicted class, float32),
        ``top<K>`` (the ``K = max(task.ks)`` most likely classes, most likely first, separated by spaces)
        and ``prediction``: the most likely class, by the dataset's name for it (``image_folder``: its
        folder; CIFAR: its label name), else its index. A computed name the CSV already has gets ``_1``.
        """
        from rankwise.recipes.common import encode
        from rankwise.recipes.predict_data import (
            append_columns,
            check_class_predictable,
            class_names,
            class_prediction_rows,
            require_checkpoint,
        )

        check_class_predictable(run.cfg)
        name = checkpoint or "best"
        require_checkpoint(run, name)
        module = self._module(run)
        run.checked(module, name)  # every key and shape, before the file is read
        new = class_prediction_rows(run, path)
        k = min(max(run.cfg.task.ks), module.num_classes)
        if len(new.images) == 0:
            prob, top = torch.zeros(0), torch.zeros((0, k), dtype=torch.long)
        else:
            logits = encode(run, module, new.images, checkpoint=name)
            p = torch.softmax(logits.float(), dim=-1)
            # the stable descending order of rankwise.metrics.topk_accuracy (equal logits: lower class first)
            top = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]
            prob = p.gather(-1, top[:, :1]).squeeze(-1)
        meta = run.data.meta
        ranked = [" ".join(str(c) for c in class_names(meta, row)) for row in top.numpy()]
        computed = {"probability": prob.numpy(), f"top{k}": ranked, "prediction": class_names(meta, top[:, 0].numpy())}
        return append_columns(new.header, new.rows, computed)


register_recipe(TopKRecipe())
