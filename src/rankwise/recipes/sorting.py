"""NeuralSort's experiments (Grover et al., ICLR'19) on mnist5k: large-MNIST sorting, median regression, dkNN.

**Sorting** (``run.recipe: sort``). A list holds ``task.n`` numbers of ``task.digits`` (4) digits;
each number is drawn as that many MNIST digits side by side (28 x 112 for 4 digits). Digit images
come from DISJOINT pools: training lists use mnist5k's training split, test lists its held-out
test split; lists containing a tied number are resampled. A CNN (``model.backbone``, e.g.
``small_cnn``; images average-pooled by ``task.downsample``) scores each image and the loss is the
row-wise cross-entropy between the relaxed permutation :math:`\\hat P` of the scores and the true
(descending) permutation :math:`P`: :math:`-\\frac1n \\sum_{i,j} P_{ij} \\log \\hat P_{ij}`.
Methods (``task.method``): ``neuralsort`` (deterministic, :func:`rankwise.neural_sort`),
``stochastic`` (:func:`rankwise.stochastic_neural_sort` on the scores as log-scores, loss averaged
over ``task.n_samples`` samples), ``softsort`` (:func:`rankwise.softsort_matrix`) and ``vanilla``
(the paper's "vanilla RS": an MLP over the concatenated image embeddings outputs ``n x n`` logits,
row ``i`` = which item is the ``i``-th largest, trained with cross-entropy). With ``task.hard: true`` the
relaxed methods train straight-through: the forward pass uses the exact permutation of the
(perturbed) scores, the backward pass the relaxation's gradients. At test time the
predicted order is the argsort of the scores (argmax of each row for ``vanilla``). Metrics on
``task.test_lists`` fixed test lists: ``all_correct`` (fraction of lists entirely correct) and
``rank_correct`` (fraction of positions correct).

**Median regression** (``run.recipe: median``, n = 5 by default). The CNN embeds each image, a
linear layer scores it, :math:`\\hat P` of the scores softly selects the median row
(:math:`\\hat P_{\\lceil n/2 \\rceil} \\cdot E`) and a linear regressor maps that embedding to the
median value, scaled to [0, 1] (``value / (10**digits - 1)``); loss = MSE. Test: the hard median
(argsort of the scores) is regressed; reported ``mse_1e4`` = test MSE of the scaled values x 1e4
(our reading of the paper's "x 1e-4" unit).

**Differentiable kNN** (``run.recipe: dknn``). ``dknn``: a CNN embedding (L2-normalized, dimension
``task.embedding_dim``) trained with the dkNN loss :math:`-\\frac1k \\sum_j m_{qj} [\\ell_j = y_q]`
(:func:`rankwise.dknn` memberships of ``task.queries`` random training queries among
``task.neighbors`` random training candidates); test accuracy of a hard kNN
(scikit-learn ``KNeighborsClassifier``, ``task.k`` neighbours) in the learned space, the training
split being the neighbours. ``knn_pixels``: the same kNN on raw pixels (no training).

**Training** is Lightning's: :class:`SortingModule` (sort, median) and :class:`DKNNModule` are
LightningModules fitted by a Trainer on ``trainer.devices`` / ``strategy`` (DDP included) for
``E = ceil(task.steps / task.steps_per_epoch)`` epochs of ``ceil(task.steps / E)`` batches (so
``task.steps`` batches, rounded up to a multiple of ``E``; with ``W`` DDP processes each rank takes
``1 / W`` of every epoch's batches, i.e. the same lists in ``W``-times larger global batches). The
training data are random draws seeded by their index (:class:`RandomLists`, :class:`Episodes`
with :class:`~rankwise.recipes.modules.EpochIndexSampler`: fresh every epoch, identical after a
resume). Before the test, the BatchNorm running statistics are re-estimated with the final
weights over ``task.bn_recalibration`` batches of training lists (:func:`recalibrate_bn`; 0 = off).
Logs go to ``RUN_DIR/logs`` (CSV) and ``RUN_DIR/tb``; ``RUN_DIR/checkpoints/last.ckpt``
is written at the end of every epoch and ``rankwise train ... --resume`` continues from it. The
test evaluation runs on one device of rank 0.
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
from rankwise.recipes.modules import EpochIndexSampler, NonFiniteLossError, _configure_optimizers, item_seed, reseed
from rankwise.recipes.reproduce import DKNNTask, SortTask, task_options
from rankwise.recipes.supcon import encode, tensors

__all__ = [
    "DKNNModule",
    "Episodes",
    "ListSampler",
    "MedianRegressor",
    "NumberScorer",
    "RandomLists",
    "SortingModule",
    "VanillaRanker",
    "fit",
    "recalibrate_bn",
    "sort_loss",
    "true_permutation",
]

#: seed of the fixed test lists (the same for every run and method)
TEST_SEED = 12345
#: the BatchNorm recalibration lists use the seed ``run.seed + _BN_SEED_OFFSET``
_BN_SEED_OFFSET = 1_000_003


class ListSampler:
    """Random lists of ``n`` multi-digit numbers drawn from a pool of digit images (ties resampled).

    ``sample(batch, generator)`` returns ``images (batch, n, 1, 28, 28 * digits)`` and ``values
    (batch, n)`` float64 numbers in ``[0, 10**digits)``; every list holds ``n`` distinct numbers.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, n: int, digits: int = 4) -> None:
        if images.dim() == 3:
            images = images.unsqueeze(1)
        self.images, self.labels, self.n, self.digits = images, labels.long(), n, digits
        if 10**digits < n:
            raise ValueError(f"cannot draw n={n} distinct numbers with {digits} digits")

    def sample(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.labels.shape[0]
        idx = torch.randint(size, (batch, self.n, self.digits), generator=generator)
        place = 10 ** torch.arange(self.digits - 1, -1, -1)
        for _ in range(1000):
            values = (self.labels[idx] * place).sum(-1)
            s = values.sort(-1).values
            tied = (s[:, 1:] == s[:, :-1]).any(-1)
            if not bool(tied.any()):
                break
            idx[tied] = torch.randint(size, (int(tied.sum()), self.n, self.digits), generator=generator)
        imgs = self.images[idx]  # (B, n, D, C, H, W)
        b, n, d, c, h, w = imgs.shape
        strip = imgs.permute(0, 1, 3, 4, 2, 5).reshape(b, n, c, h, d * w)
        return strip, values.double()


class RandomLists(torch.utils.data.Dataset):
    """Item ``g``: one random list of :class:`ListSampler` drawn with the seed ``item_seed(seed, g)``.

    Returns ``(images (n, C, 28, 28 * digits), values (n,) float32)``; ``len`` = ``length`` (any
    index is valid: pair with :class:`~rankwise.recipes.modules.EpochIndexSampler` for fresh lists).
    """

    def __init__(self, sampler: ListSampler, length: int, seed: int) -> None:
        self.sampler, self.length, self.seed = sampler, int(length), int(seed)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, v = self.sampler.sample(1, torch.Generator().manual_seed(item_seed(self.seed, int(g))))
        return x[0], v[0].float()


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


def true_permutation(values: torch.Tensor) -> torch.Tensor:
    """Descending permutation matrix: row ``i`` has its 1 at the index of the ``i``-th largest value."""
    order = values.argsort(dim=-1, descending=True)
    return F.one_hot(order, values.shape[-1]).to(torch.float32)


def sort_loss(p_hat: torch.Tensor, p_true: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    """Row-wise cross-entropy :math:`-\\frac1n\\sum_{ij} P_{ij}\\log\\hat P_{ij}`, averaged over lists (and samples)."""
    return -(p_true * torch.log(p_hat.float().clamp_min(eps))).sum(-1).mean()


class NumberScorer(nn.Module):
    """CNN embedding of each (pooled) number image + a linear score: ``(B, n, C, H, W) -> (B, n)``."""

    def __init__(self, backbone: nn.Module, dim: int, downsample: int) -> None:
        super().__init__()
        self.backbone, self.downsample = backbone, downsample
        self.score = nn.Linear(dim, 1)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        b, n = x.shape[:2]
        x = x.flatten(0, 1)
        if self.downsample > 1:
            x = F.avg_pool2d(x, self.downsample)
        return self.backbone(x).view(b, n, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.score(self.embed(x)).squeeze(-1)


class VanillaRanker(nn.Module):
    """The paper's vanilla RS: embeddings of the ``n`` images -> MLP -> ``(B, n, n)`` rank logits."""

    def __init__(self, scorer: NumberScorer, dim: int, n: int, hidden: int = 256) -> None:
        super().__init__()
        self.scorer, self.n = scorer, n
        self.mlp = nn.Sequential(nn.Linear(n * dim, hidden), nn.ReLU(), nn.Linear(hidden, n * n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.scorer.embed(x)
        return self.mlp(e.flatten(1)).view(-1, self.n, self.n)


class MedianRegressor(nn.Module):
    """Scores + embeddings of the images; the relaxed sort's middle row picks the embedding to regress."""

    def __init__(self, scorer: NumberScorer, dim: int) -> None:
        super().__init__()
        self.scorer = scorer
        self.regress = nn.Linear(dim, 1)


def _relaxed(scores: torch.Tensor, t: SortTask) -> torch.Tensor:
    """``(B, n, n)`` or ``(S, B, n, n)`` relaxed permutations of the scores."""
    from rankwise.ops import neural_sort, softsort_matrix, stochastic_neural_sort

    if t.method == "stochastic":
        return stochastic_neural_sort(scores, tau=t.tau, n_samples=t.n_samples, log_scores=True, hard=t.hard)
    if t.method == "softsort":
        return softsort_matrix(scores, tau=t.tau, power=t.power, hard=t.hard)
    return neural_sort(scores, tau=t.tau, hard=t.hard)


def _check_finite(module: L.LightningModule, loss: torch.Tensor, what: str) -> None:
    if not bool(torch.isfinite(loss.detach())):
        raise NonFiniteLossError(
            f"the {what} loss became {loss.detach().item()} at global step {module.global_step}; stopping. "
            "The last good checkpoint is kept; try a smaller learning rate."
        )


class SortingModule(L.LightningModule):
    """Large-MNIST sorting (``run.recipe: sort``) or median regression (``median``) of :class:`SortTask`.

    ``batch`` = ``(images (B, n, C, H, W), values (B, n))``. ``test_step`` logs ``test/all_correct``
    and ``test/rank_correct`` (sort) or ``test/mse_1e4`` (median).
    """

    def __init__(self, config: dict[str, Any], *, meta: dict[str, Any] | None = None) -> None:
        from rankwise.models import build_backbone

        super().__init__()
        self.hparams.update({"config": config})
        self.cfg = config_from_dict(config)
        self.task: SortTask = task_options(self.cfg)
        self.median = self.cfg.run.recipe == "median"
        opts = {**(meta or {}).get("backbone_options", {}), **self.cfg.model.options}
        backbone, dim = build_backbone(self.cfg.model.backbone, **opts)
        scorer = NumberScorer(backbone, dim, self.task.downsample)
        self.model: nn.Module
        if self.median:
            self.model = MedianRegressor(scorer, dim)
        elif self.task.method == "vanilla":
            self.model = VanillaRanker(scorer, dim, self.task.n)
        else:
            self.model = scorer
        self.scale, self.mid = float(10**self.task.digits - 1), self.task.n // 2

    def _median_model(self) -> MedianRegressor:
        return cast(MedianRegressor, self.model)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed, self.global_step, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, v = batch
        t = self.task
        if self.median:
            target = v.float().median(-1).values / self.scale
            model = self._median_model()
            e = model.scorer.embed(x)  # (B, n, D)
            p_hat = _relaxed(model.scorer.score(e).squeeze(-1), t)  # (B, n, n) or (S, B, n, n)
            soft_median = p_hat[..., self.mid, :].unsqueeze(-2).to(e.dtype) @ e  # (..., B, 1, D)
            pred = model.regress(soft_median).squeeze(-1).squeeze(-1).float()
            loss = F.mse_loss(pred, target.expand_as(pred))
        else:
            p_true = true_permutation(v)
            out = self.model(x)
            if t.method == "vanilla":
                loss = F.cross_entropy(out.float().flatten(0, 1), p_true.argmax(-1).flatten())
            else:
                loss = sort_loss(_relaxed(out.float(), t), p_true)
        _check_finite(self, loss, f"{self.cfg.run.recipe} {t.method}")
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=True, batch_size=x.shape[0], sync_dist=True)
        return loss

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, v = batch
        b = x.shape[0]
        if self.median:
            model = self._median_model()
            e = model.scorer.embed(x)
            order = model.scorer.score(e).squeeze(-1).argsort(-1, descending=True)
            med = e.gather(1, order[:, self.mid, None, None].expand(-1, 1, e.shape[-1])).squeeze(1)
            pred = model.regress(med).squeeze(-1).float()
            err = (pred - v.float().median(-1).values / self.scale) ** 2 * 1e4
            self.log("test/mse_1e4", err.mean(), batch_size=b)
            return
        out = self.model(x)
        pred = out.argmax(-1) if self.task.method == "vanilla" else out.argsort(-1, descending=True)
        ok = pred == v.argsort(-1, descending=True)
        self.log("test/all_correct", ok.all(-1).float().mean(), batch_size=b)
        self.log("test/rank_correct", ok.float().mean(), batch_size=b)

    def configure_optimizers(self) -> Any:
        return _configure_optimizers(self, self.cfg)


class DKNNModule(L.LightningModule):
    """Differentiable-kNN embedding (:class:`DKNNTask`): ``batch`` = one episode ``(images (Q+M, ...), labels)``.

    The first ``task.queries`` images are queries, the rest candidate neighbours; loss
    :math:`-\\frac1k \\sum_j m_{qj} [\\ell_j = y_q]`. ``predict_step`` returns L2-normalized embeddings.
    """

    def __init__(
        self, config: dict[str, Any], *, num_classes: int, queries: int, meta: dict[str, Any] | None = None
    ) -> None:
        from rankwise.models import build_backbone

        super().__init__()
        self.hparams.update({"config": config, "num_classes": int(num_classes), "queries": int(queries)})
        self.cfg = config_from_dict(config)
        self.task: DKNNTask = task_options(self.cfg)
        self.num_classes, self.queries = int(num_classes), int(queries)
        opts = {**(meta or {}).get("backbone_options", {}), **self.cfg.model.options}
        opts.setdefault("feature_dim", self.task.embedding_dim)
        self.net, _ = build_backbone(self.cfg.model.backbone, **opts)

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
        loss = -(scores.gather(-1, y[:nq, None]) / k).mean()
        _check_finite(self, loss, "dkNN")
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=True, batch_size=nq, sync_dist=True)
        return loss

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0] if isinstance(batch, (list, tuple)) else batch)

    def configure_optimizers(self) -> Any:
        return _configure_optimizers(self, self.cfg)


def recalibrate_bn(module: SortingModule, sampler: ListSampler, t: SortTask, seed: int) -> bool:
    """Re-estimate the BatchNorm running statistics of ``module`` with its final weights (before testing).

    During training, BatchNorm's running averages (momentum 0.1) mix the statistics of the last ~10-20
    steps' weights; when the weights still move fast (short budgets), the lag makes eval-mode outputs
    differ from the trained ones (docs/results.md, median regression, measures it). This runs
    :func:`torch.optim.swa_utils.update_bn` (a cumulative average, weights untouched) over
    ``t.bn_recalibration`` batches of fresh training lists. Returns whether anything was recalibrated.
    """
    from torch.optim.swa_utils import update_bn
    from torch.utils.data import DataLoader

    net = module.model.scorer if isinstance(module.model, MedianRegressor) else module.model
    if t.bn_recalibration <= 0 or not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules()):
        return False
    lists = RandomLists(sampler, t.bn_recalibration * t.lists_per_batch, seed + _BN_SEED_OFFSET)
    update_bn(DataLoader(lists, batch_size=t.lists_per_batch), net, device=next(net.parameters()).device)
    return True


def _pools(cfg: Config, data: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Any]:
    from rankwise.recipes import _deps

    if data is None:
        data = _deps.get_dataset(cfg.data.name, **cfg.data.options)
    if not hasattr(data, "num_classes"):
        raise ValueError(
            f"recipe {cfg.run.recipe!r} needs a digit classification dataset (mnist5k), got {cfg.data.name!r}"
        )
    xtr, ytr = tensors(data.train)
    xte, yte = tensors(data.test)
    return xtr, ytr, xte, yte, data


def _knn_accuracy(ftr: Any, ytr: torch.Tensor, fte: Any, yte: torch.Tensor, k: int) -> float:
    from sklearn.neighbors import KNeighborsClassifier

    knn = KNeighborsClassifier(n_neighbors=k).fit(ftr, ytr.numpy())
    return float((knn.predict(fte) == yte.numpy()).mean()) * 100.0


def fit(cfg: Config, run_dir: Path, *, data: Any = None, resume: bool = False, progress: bool = False) -> Any:
    """Train and test the ``sort`` / ``median`` / ``dknn`` recipe of ``cfg`` with Lightning.

    Returns the test metrics (``None`` on rank > 0 of a distributed run).
    """
    from torch.utils.data import DataLoader

    from rankwise.recipes import runner

    t = task_options(cfg)
    epochs = math.ceil(t.steps / t.steps_per_epoch)
    per_epoch = math.ceil(t.steps / epochs)
    xtr, ytr, xte, yte, data = _pools(cfg, data)
    if isinstance(t, DKNNTask) and t.method == "knn_pixels":
        return {"accuracy": _knn_accuracy(xtr.flatten(1).numpy(), ytr, xte.flatten(1).numpy(), yte, t.k)}
    torch.manual_seed(cfg.run.seed)
    ds: Any
    kw: dict[str, Any] = {"num_workers": cfg.data.num_workers, "persistent_workers": cfg.data.num_workers > 0}
    module: L.LightningModule
    if isinstance(t, DKNNTask):
        nq, nn_ = min(t.queries, xtr.shape[0] // 2), min(t.neighbors, xtr.shape[0] // 2)
        module = DKNNModule(config_to_dict(cfg), num_classes=int(data.num_classes), queries=nq, meta=data.meta)
        ds = Episodes(xtr, ytr, nq + nn_, per_epoch, cfg.run.seed)
        loader = DataLoader(ds, batch_size=None, sampler=EpochIndexSampler(len(ds), cfg.run.seed, shuffle=False), **kw)
    else:
        module = SortingModule(config_to_dict(cfg), meta=data.meta)
        ds = RandomLists(ListSampler(xtr, ytr, t.n, t.digits), per_epoch * t.lists_per_batch, cfg.run.seed)
        sampler = EpochIndexSampler(len(ds), cfg.run.seed, shuffle=False)
        loader = DataLoader(ds, batch_size=t.lists_per_batch, sampler=sampler, **kw)
    ckpt_dir = run_dir / "checkpoints"
    last = ckpt_dir / "last.ckpt"
    trainer = runner._trainer(cfg, run_dir, ckpt_dir, max_epochs=epochs, monitor=None, progress=progress)
    trainer.fit(module, loader, ckpt_path=str(last) if resume and last.is_file() else None, weights_only=True)
    if trainer.global_rank != 0:
        return None
    if isinstance(module, DKNNModule):
        ftr, fte = encode(module, xtr, cfg).numpy(), encode(module, xte, cfg).numpy()
        return {"accuracy": _knn_accuracy(ftr, ytr, fte, yte, t.k)}
    recalibrate_bn(module, ds.sampler, t, cfg.run.seed)  # the training lists' sampler
    test = RandomLists(ListSampler(xte, yte, t.n, t.digits), t.test_lists, TEST_SEED)
    out = runner.eval_trainer(cfg).test(module, DataLoader(test, batch_size=100), verbose=False)[0]
    return {k.removeprefix("test/"): float(v) for k, v in out.items()}
