"""Differentiable kNN (NeuralSort, Grover et al. ICLR'19, sec. 5.3) vs plain kNN on pixels, ``recipe: dknn``.

``task.method: dknn`` trains a CNN embedding (L2-normalized, dimension ``task.embedding_dim``) with
the dkNN loss :math:`-\\frac1k \\sum_j m_{qj} [\\ell_j = y_q]` (:func:`rankwise.dknn` memberships of
``task.queries`` random training queries among ``task.neighbors`` random training candidates,
one episode per step, ``task.steps`` steps in epochs of at most ``task.steps_per_epoch``). The test
accuracy is that of a hard kNN (scikit-learn ``KNeighborsClassifier``, ``task.k`` neighbours) in the
learned space, the training split being the neighbours. ``knn_pixels``: the same kNN on raw pixels
(nothing is trained, so its run directory has no checkpoints or logs; config, meta, metrics and the
t-SNE of the test pixels are written).

Episodes are random draws seeded by their index (:class:`Episodes` with
:class:`~rankwise.recipes.common.EpochIndexSampler`): fresh every epoch, identical after a resume.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import lightning as L
import torch
from pydantic import Field
from torch.nn import functional as F

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
from rankwise.recipes.config import Config, StepBudget
from rankwise.recipes.datamodules import LoaderData
from rankwise.recipes.loss_terms import Objective, Term
from rankwise.recipes.optim import configure
from rankwise.recipes.registry import Recipe, register_recipe
from rankwise.recipes.rundir import Run
from rankwise.recipes.stages import Stage

__all__ = ["DKNNModule", "DKNNOptions", "DKNNRecipe", "Episodes"]


class DKNNOptions(StepBudget, unit="episodes", after="n_samples"):
    """Differentiable kNN (NeuralSort sec. 5.3) vs plain kNN on raw pixels."""

    method: Literal["dknn", "knn_pixels"] = Field(
        "dknn", description="dknn: train a CNN embedding with the dkNN loss; knn_pixels: sklearn kNN on raw pixels"
    )
    k: int = Field(9, description="neighbours of the (soft and hard) kNN", ge=1)
    tau: float = Field(0.1, description="temperature of the relaxed sort", gt=0)
    relaxation: Literal["deterministic", "stochastic"] = Field(
        "deterministic", description="deterministic NeuralSort or stochastic (Gumbel) samples"
    )
    n_samples: int = Field(5, description="relaxed samples (stochastic)", ge=1)
    queries: int = Field(100, description="query images per episode", ge=1)
    neighbors: int = Field(100, description="candidate neighbour images per episode", ge=1)
    embedding_dim: int = Field(
        64, description="embedding width (the backbone's feature_dim unless model.options sets it)", ge=1
    )


class Episodes(torch.utils.data.Dataset):
    """Item ``g``: ``size`` distinct random training images and labels (seed ``item_seed(seed, g)``)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, size: int, length: int, seed: int) -> None:
        self.x, self.y, self.size, self.length, self.seed = x, y, int(size), int(length), int(seed)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(item_seed(self.seed, int(g)))
        idx = torch.randperm(self.x.shape[0], generator=gen)[: self.size]
        return self.x[idx], self.y[idx]


class DKNNModule(L.LightningModule):
    """Differentiable-kNN embedding (:class:`DKNNOptions`): ``batch`` = one episode ``(images (Q+M, ...), labels)``.

    The first ``queries`` images are queries, the rest candidate neighbours; loss
    :math:`-\\frac1k \\sum_j m_{qj} [\\ell_j = y_q]`. ``predict_step`` returns L2-normalized embeddings.
    """

    def __init__(self, cfg: Config, *, num_classes: int, queries: int, meta: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.hparams.update({"num_classes": int(num_classes), "queries": int(queries)})
        self.cfg = cfg
        self.task: DKNNOptions = cfg.task
        self.num_classes, self.queries = int(num_classes), int(queries)
        self.net, _ = build_backbone(cfg.model, meta=meta, feature_dim=self.task.embedding_dim)
        self.objective = Objective(Term("dknn", self._dknn_loss))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(x).float(), dim=-1)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed, self.global_step, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        from rankwise.ops import dknn, dknn_class_scores

        x, y = batch
        t, nq = self.task, self.queries
        k = min(t.k, x.shape[0] - nq)
        emb = self(x)
        m = dknn(emb[:nq], emb[nq:], k, tau=t.tau, method=t.relaxation, n_samples=t.n_samples)
        scores = dknn_class_scores(m, y[nq:], self.num_classes)
        value = self.objective({"scores": scores, "labels": y[:nq], "k": k})
        check_finite(value.total, self, "dkNN")
        self.objective.log(self, value, batch_size=nq)
        return value.total

    @staticmethod
    def _dknn_loss(tensors: Mapping[str, Any]) -> torch.Tensor:
        """Minus the mean relaxed fraction of each query's ``k`` neighbours that share its label."""
        scores, labels = tensors["scores"], tensors["labels"]
        return -(scores.gather(-1, labels[:, None]) / tensors["k"]).mean()

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0] if isinstance(batch, (list, tuple)) else batch)

    def configure_optimizers(self) -> Any:
        return configure(self, self.cfg.optimizer, self.cfg.schedule)


def _knn_accuracy(ftr: Any, ytr: torch.Tensor, fte: Any, yte: torch.Tensor, k: int) -> float:
    from sklearn.neighbors import KNeighborsClassifier

    knn = KNeighborsClassifier(n_neighbors=k).fit(ftr, ytr.numpy())
    return float((knn.predict(fte) == yte.numpy()).mean()) * 100.0


def _sizes(run: Run, n_train: int) -> tuple[int, int]:
    t: DKNNOptions = run.cfg.task
    return min(t.queries, n_train // 2), min(t.neighbors, n_train // 2)


class DKNNRecipe(Recipe):
    """CNN embedding trained with the differentiable-kNN loss (or kNN on pixels); hard kNN test accuracy."""

    name = "dknn"
    description = "differentiable kNN: a CNN embedding trained with the dkNN loss, hard kNN test accuracy"
    options: type = DKNNOptions

    def _module(self, run: Run, n_train: int) -> DKNNModule:
        nq, _ = _sizes(run, n_train)
        return DKNNModule(run.cfg, num_classes=int(run.data.num_classes), queries=nq, meta=run.data.meta)

    def fit(self, run: Run) -> dict[str, Any]:
        from torch.utils.data import DataLoader

        cfg, t = run.cfg, run.cfg.task
        xtr, ytr = tensors(run.data.train)
        if t.method == "knn_pixels":
            return self._pixels(run)
        epochs, per_epoch = epochs_and_batches(t)
        torch.manual_seed(cfg.run.seed)
        module = self._module(run, xtr.shape[0])
        nq, nn_ = _sizes(run, xtr.shape[0])
        ds = Episodes(xtr, ytr, nq + nn_, per_epoch, cfg.run.seed)
        kw: dict[str, Any] = loader_workers(cfg.data.num_workers)
        loader = DataLoader(ds, batch_size=None, sampler=EpochIndexSampler(len(ds), cfg.run.seed, shuffle=False), **kw)
        run.run_stage(Stage("", module, LoaderData(loader), epochs=epochs, hand_on=None))
        return run.rank_zero(self._test, run, module, "last")

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        if run.cfg.task.method == "knn_pixels":
            return self._pixels(run)
        module = self._module(run, len(run.data.train))
        return self._test(run, module, checkpoint or "last")

    def _pixels(self, run: Run) -> dict[str, Any]:
        xtr, ytr = tensors(run.data.train)
        xte, yte = tensors(run.data.test)
        acc = _knn_accuracy(xtr.flatten(1).numpy(), ytr, xte.flatten(1).numpy(), yte, run.cfg.task.k)
        plot_embedding(run, xte.flatten(1).float(), yte)
        return {"test": {"accuracy": acc}, "device": "cpu"}

    def _test(self, run: Run, module: DKNNModule, checkpoint: str) -> dict[str, Any]:
        """Hard kNN test accuracy on the embeddings of ``checkpoints/<checkpoint>.ckpt``."""
        xtr, ytr = tensors(run.data.train)
        xte, yte = tensors(run.data.test)
        ftr, fte = encode(run, module, xtr, checkpoint=checkpoint), encode(run, module, xte, checkpoint=checkpoint)
        plot_embedding(run, fte, yte)
        acc = _knn_accuracy(ftr.numpy(), ytr, fte.numpy(), yte, run.cfg.task.k)
        return {"test": {"accuracy": acc}, "device": device_name(run.cfg)}


register_recipe(DKNNRecipe())
