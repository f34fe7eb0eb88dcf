"""Deep metric learning for retrieval, ``recipe: retrieval``: one embedding network, any retrieval loss.

A backbone (``model.backbone``, e.g. ``small_cnn``) and a linear layer to ``task.embedding_dim``
are trained with one registered loss taking ``(embeddings, labels)`` (``task.loss``: a loss whose
registry entry has ``takes="embeddings_labels"``: ``smooth_ap``, ``blackbox_ap``, ``recall_at_k``,
``fastap``, ``supcon``, ``triplet``, ...; ``task.loss_options`` are its keyword options; the
run's :class:`~rankwise.recipes.loss_terms.Objective` logs ``train/loss`` and ``train/loss/<name>``)
on class-balanced batches: ``task.classes_per_batch`` classes x
``task.samples_per_class`` images, drawn afresh for every step from a seed of the step index
(:class:`BalancedBatches`), ``task.steps`` steps in epochs of at most ``task.steps_per_epoch``. The
loss gets the global batch under DDP (``distributed="auto"``).

Evaluation: the test split is embedded and every test image queries all the others
(:func:`rankwise.metrics.retrieval_metrics`: ``recall@k`` for ``task.ks``, ``map@r``,
``r_precision``, in percent); ``seconds_per_step`` is the wall time of one training step. Data: any
:class:`~rankwise.data.ClassificationData` (the presets use ``mnist5k`` and scikit-learn's 8x8
digits through ``mnist5k`` with ``source: sklearn``). ``rankwise predict``
(:meth:`RetrievalRecipe.predict_file`): embeddings of new images listed in a CSV and their nearest
training image (:func:`nearest_neighbors`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from rankwise.recipes._progress import StepTimer
from rankwise.recipes.common import (
    EpochIndexSampler,
    build_backbone,
    check_finite,
    device_name,
    encode,
    epochs_and_batches,
    item_seed,
    loader_workers,
    plot_embedding,
    reseed,
    tensors,
)
from rankwise.recipes.config import Config, ConfigError, StepBudget, check_kwargs
from rankwise.recipes.datamodules import LoaderData
from rankwise.recipes.loss_terms import Objective, build_term, check_takes
from rankwise.recipes.optim import configure
from rankwise.recipes.registry import Recipe, register_recipe
from rankwise.recipes.rundir import Run
from rankwise.recipes.stages import Stage

__all__ = ["BalancedBatches", "RetrievalModule", "RetrievalOptions", "RetrievalRecipe", "nearest_neighbors"]


def _retrieval_losses() -> tuple[str, ...]:
    """The registered losses the recipe can train with: those whose registry entry takes embeddings and
    class labels (``takes="embeddings_labels"``)."""
    from rankwise.recipes.loss_terms import usable_losses

    return tuple(usable_losses(("embeddings_labels",)))


#: losses the recipe can train with (registry ``takes="embeddings_labels"``), at import
RETRIEVAL_LOSSES = _retrieval_losses()


class RetrievalOptions(StepBudget, unit="steps", after="samples_per_class"):
    """Embedding trained with a retrieval / metric-learning loss, evaluated by Recall@k and MAP@R."""

    loss: str = Field(
        "smooth_ap", description=f"registered loss of (embeddings, labels): one of {', '.join(RETRIEVAL_LOSSES)}"
    )
    loss_options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of the loss (e.g. {temperature: 0.01})"
    )
    classes_per_batch: int = Field(8, description="classes in every batch", ge=1)
    samples_per_class: int = Field(8, description="images of each class in every batch", ge=2)
    embedding_dim: int = Field(
        64, description="width of the embedding (a linear layer on the backbone's features)", ge=1
    )
    ks: list[int] = Field(default_factory=lambda: [1, 2, 4, 8], description="k of the reported recall@k")


class BalancedBatches(torch.utils.data.Dataset):
    """Item ``g``: ``P`` random classes x ``M`` random images of each (seed ``item_seed(seed, g)``), sorted by class.

    Classes with fewer than ``M`` images give all of theirs.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, p: int, m: int, length: int, seed: int) -> None:
        self.x, self.y, self.m, self.length, self.seed = x, y, int(m), int(length), int(seed)
        self.classes = torch.unique(y)
        self.p = min(int(p), len(self.classes))
        self.members = [torch.nonzero(y == c).flatten() for c in self.classes]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(item_seed(self.seed, int(g)))
        picked = torch.randperm(len(self.classes), generator=gen)[: self.p]
        idx = []
        for c in picked.tolist():
            members = self.members[c]
            idx.append(members[torch.randperm(len(members), generator=gen)[: self.m]])
        i = torch.cat(idx)
        return self.x[i], self.y[i]


class RetrievalModule(L.LightningModule):
    """Backbone + linear embedding; ``batch`` = ``(images (B, ...), labels (B,))`` from :class:`BalancedBatches`."""

    def __init__(self, cfg: Config, *, meta: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.task: RetrievalOptions = cfg.task
        self.net, dim = build_backbone(cfg.model, meta=meta)
        self.head = nn.Linear(int(dim), self.task.embedding_dim)
        # the registered loss with its options (batch-level: distributed="auto", the global batch under DDP)
        self.loss_term = build_term(self.task.loss, self.task.loss_options, "task.loss")
        self.objective = Objective(self.loss_term)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.net(x)
        return self.head(f.flatten(1) if f.dim() > 2 else f).float()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed, self.global_step, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        value = self.objective({"embeddings": self(x), "labels": y})
        check_finite(value.total, self, self.task.loss)
        self.objective.log(self, value, batch_size=y.numel())
        return value.total

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return F.normalize(self(batch[0] if isinstance(batch, (list, tuple)) else batch), dim=-1)

    def configure_optimizers(self) -> Any:
        return configure(self, self.cfg.optimizer, self.cfg.schedule)


class RetrievalRecipe(Recipe):
    """An embedding trained with a retrieval loss; Recall@k, MAP@R and R-precision on the test split."""

    name = "retrieval"
    predict_reads_data = True  # the nearest training images
    per_step = True
    description = "metric learning: an embedding trained with a retrieval loss, test Recall@k / MAP@R"
    options: type = RetrievalOptions

    def method(self, cfg: Config) -> str:
        return str(cfg.task.loss)

    def check(self, cfg: Config) -> None:
        t: RetrievalOptions = cfg.task
        entry = check_takes(t.loss, "task.loss", ("embeddings_labels",))
        if not t.ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in t.ks):
            raise ConfigError(f"`task.ks` must be a non-empty list of positive ints; got {t.ks!r}")
        # the options against what the recipe builds (the loss's module twin), as the other recipes' losses
        built = entry.module if entry.module is not None else entry.fn
        check_kwargs(built, dict(t.loss_options), "task.loss_options", supplied=(*(entry.inputs or {}), "distributed"))

    def load_data(self, cfg: Config) -> Any:
        """The run's dataset, checked before the run directory is made (:func:`_check_splits`)."""
        data = super().load_data(cfg)
        if hasattr(data, "train") and hasattr(data, "test"):
            _check_splits(cfg, tensors(data.train)[1], tensors(data.test)[1])
        return data

    def fit(self, run: Run) -> dict[str, Any]:
        from torch.utils.data import DataLoader

        cfg, t = run.cfg, run.cfg.task
        epochs, per_epoch = epochs_and_batches(t)
        xtr, ytr = tensors(run.data.train)
        torch.manual_seed(cfg.run.seed)
        module = RetrievalModule(cfg, meta=run.data.meta)
        ds = BalancedBatches(xtr, ytr, t.classes_per_batch, t.samples_per_class, per_epoch, cfg.run.seed)
        kw: dict[str, Any] = loader_workers(cfg.data.num_workers)
        loader = DataLoader(ds, batch_size=None, sampler=EpochIndexSampler(len(ds), cfg.run.seed, shuffle=False), **kw)
        timer = StepTimer()
        run.run_stage(Stage("", module, LoaderData(loader), epochs=epochs, hand_on=None, callbacks=[timer]))
        return run.rank_zero(self._test, run, module, "last", timer)

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        module = RetrievalModule(run.cfg, meta=run.data.meta)
        return self._test(run, module, checkpoint or "last")

    def predict_file(self, run: Run, path: Path, checkpoint: str | None) -> dict[str, Any]:
        """Embeddings of new images and their nearest training image: a CSV whose ``path`` column lists
        image files (relative to the CSV's folder), read as the run's dataset reads its images
        (:func:`~rankwise.recipes.predict_data.class_prediction_rows`).

        ``checkpoints/<checkpoint>.ckpt`` (None: ``last``, as :meth:`evaluate`) embeds the new images and
        the whole training split (the gallery); each new image's neighbour is the training image of the
        highest cosine similarity (:func:`nearest_neighbors`, as the test metrics'
        ``distance="cosine"``). Columns: the CSV's own (text, as read), ``neighbor`` (the training image's
        file relative to the dataset's root where the data have files, ``image_folder``; else its index in
        the training split), ``similarity`` (its cosine), ``embedding_0`` .. ``embedding_{D-1}`` (the
        L2-normalised embedding, float32) and ``prediction``: the neighbour's class (1-NN) by the
        dataset's name for it, else its index. A computed name the CSV already has gets ``_1``.
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
        module = RetrievalModule(run.cfg, meta=run.data.meta)
        run.checked(module, name)  # before the images are read
        new = class_prediction_rows(run, path)
        xtr, ytr = tensors(run.data.train)
        n = len(new.images)
        if n == 0:
            emb, sim, idx = torch.zeros(0, run.cfg.task.embedding_dim), torch.zeros(0), torch.zeros(0, dtype=torch.long)
        else:  # the gallery and the new images in one pass
            both = encode(run, module, torch.cat([xtr.float(), new.images]), checkpoint=name)
            emb = both[len(xtr) :]
            sim, idx = nearest_neighbors(emb, both[: len(xtr)])
        paths = run.data.meta.get("train_paths")
        neighbor = [paths[i] for i in idx.tolist()] if paths is not None else idx.numpy()
        computed: dict[str, Any] = {"neighbor": neighbor, "similarity": sim.numpy()}
        computed |= {f"embedding_{j}": emb[:, j].numpy() for j in range(emb.shape[1])}
        computed["prediction"] = class_names(run.data.meta, ytr.cpu()[idx].numpy())
        return append_columns(new.header, new.rows, computed)

    def _test(
        self, run: Run, module: RetrievalModule, checkpoint: str, timer: StepTimer | None = None
    ) -> dict[str, Any]:
        """Retrieval metrics of the test embeddings of ``checkpoints/<checkpoint>.ckpt``."""
        from rankwise.metrics import retrieval_metrics

        xte, yte = tensors(run.data.test)
        emb = encode(run, module, xte, checkpoint=checkpoint)
        plot_embedding(run, emb, yte)
        m = retrieval_metrics(emb, yte, ks=tuple(run.cfg.task.ks), distance="cosine")
        test = {k: 100.0 * v for k, v in m.items() if k != "num_queries"}
        out: dict[str, Any] = {"test": test, "device": device_name(run.cfg)}
        if timer is not None and timer.steps:
            out["seconds_per_step"] = timer.seconds / timer.steps
        return out


def nearest_neighbors(
    queries: torch.Tensor, gallery: torch.Tensor, *, block_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The cosine similarity of each query to its most similar gallery item, and that item's index (the
    first one among equals).

    :math:`s_{ij} = \hat q_i \cdot \hat g_j` with :math:`\hat v = v / \max(\lVert v \rVert, 10^{-12})`
    (:func:`torch.nn.functional.normalize`); one matrix product per block of ``block_size`` queries.

    Shape:
        ``queries`` ``(N, D)``, ``gallery`` ``(M, D)`` with ``M >= 1`` -> ``(N,)`` similarities (float32,
        or float64 for float64 inputs) and ``(N,)`` int64 indices.

    Example:
        >>> g = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> nearest_neighbors(torch.tensor([[0.1, 3.0], [5.0, 0.0]]), g)
        (tensor([0.9994, 1.0000]), tensor([1, 0]))
    """
    if gallery.shape[0] == 0:
        raise ValueError("`gallery` must hold at least one item, got shape (0, ...)")
    dt = torch.float64 if torch.float64 in (queries.dtype, gallery.dtype) else torch.float32
    g = F.normalize(gallery.to(dt), dim=-1)
    q = F.normalize(queries.to(dt), dim=-1)
    if q.shape[0] == 0:
        return q.new_zeros(0), torch.zeros(0, dtype=torch.long, device=q.device)
    parts = [(block @ g.T).max(dim=-1) for block in q.split(block_size)]
    return torch.cat([p.values for p in parts]), torch.cat([p.indices for p in parts])


def _check_splits(cfg: Config, train_labels: torch.Tensor, test_labels: torch.Tensor) -> None:
    """Before training: a test split without two images of a class is an error, fewer training classes than
    ``task.classes_per_batch`` a warning (settings of a preset for another dataset)."""
    import warnings

    from rankwise.recipes.common import DataDefaultsWarning

    _, counts = torch.unique(test_labels, return_counts=True)
    if not bool((counts >= 2).any()):
        raise ConfigError(
            f"the test split of dataset `{cfg.data.name}` has no class with two images: every retrieval metric is "
            "undefined (a query needs another image of its class); give the test split more images per class "
            "(e.g. a larger `data.options.test_fraction`)"
        )
    classes = int(torch.unique(train_labels).numel())
    if classes < cfg.task.classes_per_batch:
        warnings.warn(
            f"`task.classes_per_batch` = {cfg.task.classes_per_batch} is more than the {classes} classes of the "
            f"training split of `{cfg.data.name}`: every batch holds {classes} classes x "
            f"{cfg.task.samples_per_class} images",
            DataDefaultsWarning,
            stacklevel=2,
        )


register_recipe(RetrievalRecipe())
