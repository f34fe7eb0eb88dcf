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
row ``i`` = which item is the ``i``-th largest, trained with cross-entropy). At test time the
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
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.recipes.config import Config
from rankwise.recipes.reproduce import DKNNTask, SortTask, device_of, task_options
from rankwise.recipes.supcon import features, tensors

__all__ = ["ListSampler", "NumberScorer", "VanillaRanker", "run", "sort_loss", "true_permutation"]

log = logging.getLogger("rankwise")


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


def true_permutation(values: torch.Tensor) -> torch.Tensor:
    """Descending permutation matrix: row ``i`` has its 1 at the index of the ``i``-th largest value."""
    order = values.argsort(dim=-1, descending=True)
    return F.one_hot(order, values.shape[-1]).to(torch.float32)


def sort_loss(p_hat: torch.Tensor, p_true: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    """Row-wise cross-entropy :math:`-\\frac1n\\sum_{ij} P_{ij}\\log\\hat P_{ij}`, averaged over lists (and samples)."""
    return -(p_true * torch.log(p_hat.clamp_min(eps))).sum(-1).mean()


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


def _relaxed(scores: torch.Tensor, t: SortTask) -> torch.Tensor:
    """``(B, n, n)`` or ``(S, B, n, n)`` relaxed permutations of the scores."""
    from rankwise.ops import neural_sort, softsort_matrix, stochastic_neural_sort

    if t.method == "stochastic":
        return stochastic_neural_sort(scores, tau=t.tau, n_samples=t.n_samples, log_scores=True)
    if t.method == "softsort":
        return softsort_matrix(scores, tau=t.tau, power=t.power)
    return neural_sort(scores, tau=t.tau)


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


def _optimizer(model: nn.Module, cfg: Config) -> torch.optim.Optimizer:
    o = cfg.optimizer
    if o.name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    cls = torch.optim.AdamW if o.name == "adamw" else torch.optim.Adam
    return cls(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)


def _log(progress: bool, what: str, step: int, steps: int, loss: torch.Tensor, t0: float) -> None:
    if progress and (step + 1) % max(1, steps // 10) == 0:
        log.warning(
            "%s step %d/%d loss %.4f (%.0f s)", what, step + 1, steps, float(loss.detach()), time.perf_counter() - t0
        )


def _lists_and_backbone(cfg: Config, t: SortTask, data: Any) -> tuple[ListSampler, ListSampler, nn.Module, int]:
    """Train/test list samplers of ``t.n`` numbers and the seeded backbone ``(module, feature dim)``."""
    from rankwise.models import build_backbone

    xtr, ytr, xte, yte, data = _pools(cfg, data)
    train_lists = ListSampler(xtr, ytr, t.n, t.digits)
    test_lists = ListSampler(xte, yte, t.n, t.digits)
    opts = {**data.meta.get("backbone_options", {}), **cfg.model.options}
    torch.manual_seed(cfg.run.seed)
    backbone, dim = build_backbone(cfg.model.backbone, **opts)
    return train_lists, test_lists, backbone, dim


def _train_sort(cfg: Config, t: SortTask, data: Any, progress: bool) -> tuple[dict[str, float], dict[str, Any]]:
    device = device_of(cfg)
    train_lists, test_lists, backbone, dim = _lists_and_backbone(cfg, t, data)
    scorer = NumberScorer(backbone, dim, t.downsample)
    model: nn.Module = VanillaRanker(scorer, dim, t.n) if t.method == "vanilla" else scorer
    model.to(device)
    opt = _optimizer(model, cfg)
    gen = torch.Generator().manual_seed(cfg.run.seed)
    t0 = time.perf_counter()
    model.train()
    for step in range(t.steps):
        x, v = train_lists.sample(t.lists_per_batch, gen)
        x, p_true = x.to(device), true_permutation(v).to(device)
        out = model(x)
        if t.method == "vanilla":
            loss = F.cross_entropy(out.flatten(0, 1), p_true.argmax(-1).flatten())
        else:
            loss = sort_loss(_relaxed(out, t), p_true)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _log(progress, f"sort {t.method} n={t.n}", step, t.steps, loss, t0)
    model.eval()
    test_gen = torch.Generator().manual_seed(12345)
    right_lists, right_ranks, total = 0.0, 0.0, 0
    with torch.no_grad():
        for i in range(0, t.test_lists, 100):
            x, v = test_lists.sample(min(100, t.test_lists - i), test_gen)
            out = model(x.to(device)).cpu()
            pred = out.argmax(-1) if t.method == "vanilla" else out.argsort(-1, descending=True)
            ok = pred == v.argsort(-1, descending=True)
            right_lists += float(ok.all(-1).sum())
            right_ranks += float(ok.float().mean(-1).sum())
            total += x.shape[0]
    return {"all_correct": right_lists / total, "rank_correct": right_ranks / total}, model.state_dict()


class MedianRegressor(nn.Module):
    """Scores + embeddings of the images; the relaxed sort's middle row picks the embedding to regress."""

    def __init__(self, scorer: NumberScorer, dim: int) -> None:
        super().__init__()
        self.scorer = scorer
        self.regress = nn.Linear(dim, 1)


def _train_median(cfg: Config, t: SortTask, data: Any, progress: bool) -> tuple[dict[str, float], dict[str, Any]]:
    device = device_of(cfg)
    train_lists, test_lists, backbone, dim = _lists_and_backbone(cfg, t, data)
    model = MedianRegressor(NumberScorer(backbone, dim, t.downsample), dim).to(device)
    opt = _optimizer(model, cfg)
    gen = torch.Generator().manual_seed(cfg.run.seed)
    scale, mid = float(10**t.digits - 1), t.n // 2
    t0 = time.perf_counter()
    model.train()
    for step in range(t.steps):
        x, v = train_lists.sample(t.lists_per_batch, gen)
        x = x.to(device)
        target = (v.median(-1).values / scale).float().to(device)
        e = model.scorer.embed(x)  # (B, n, D)
        p_hat = _relaxed(model.scorer.score(e).squeeze(-1), t)  # (B, n, n) or (S, B, n, n)
        soft_median = p_hat[..., mid, :].unsqueeze(-2) @ e  # (..., B, 1, D)
        pred = model.regress(soft_median).squeeze(-1).squeeze(-1)
        loss = F.mse_loss(pred, target.expand_as(pred))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _log(progress, f"median {t.method} n={t.n}", step, t.steps, loss, t0)
    model.eval()
    test_gen = torch.Generator().manual_seed(12345)
    sq, total = 0.0, 0
    with torch.no_grad():
        for i in range(0, t.test_lists, 100):
            x, v = test_lists.sample(min(100, t.test_lists - i), test_gen)
            e = model.scorer.embed(x.to(device))
            order = model.scorer.score(e).squeeze(-1).argsort(-1, descending=True)
            med = e.gather(1, order[:, mid, None, None].expand(-1, 1, e.shape[-1])).squeeze(1)
            pred = model.regress(med).squeeze(-1).cpu().double()
            sq += float(((pred - v.median(-1).values / scale) ** 2).sum())
            total += x.shape[0]
    return {"mse_1e4": sq / total * 1e4}, model.state_dict()


def _train_dknn(cfg: Config, t: DKNNTask, data: Any, progress: bool) -> tuple[dict[str, float], dict[str, Any] | None]:
    from sklearn.neighbors import KNeighborsClassifier

    from rankwise.models import build_backbone
    from rankwise.ops import dknn, dknn_class_scores

    device = device_of(cfg)
    xtr, ytr, xte, yte, data = _pools(cfg, data)
    if t.method == "knn_pixels":
        knn = KNeighborsClassifier(n_neighbors=t.k).fit(xtr.flatten(1).numpy(), ytr.numpy())
        return {"accuracy": float((knn.predict(xte.flatten(1).numpy()) == yte.numpy()).mean()) * 100.0}, None
    opts = {**data.meta.get("backbone_options", {}), **cfg.model.options}
    opts.setdefault("feature_dim", t.embedding_dim)
    torch.manual_seed(cfg.run.seed)
    net, _ = build_backbone(cfg.model.backbone, **opts)
    net.to(device)
    opt = _optimizer(net, cfg)
    gen = torch.Generator().manual_seed(cfg.run.seed)
    nq, nn_ = min(t.queries, xtr.shape[0] // 2), min(t.neighbors, xtr.shape[0] // 2)
    k = min(t.k, nn_)
    t0 = time.perf_counter()
    net.train()
    for step in range(t.steps):
        idx = torch.randperm(xtr.shape[0], generator=gen)[: nq + nn_]
        emb = F.normalize(net(xtr[idx].to(device)), dim=-1)
        y = ytr[idx].to(device)
        m = dknn(emb[:nq], emb[nq:], k, tau=t.tau, method=t.relaxation, n_samples=t.n_samples)
        scores = dknn_class_scores(m, y[nq:], int(data.num_classes))
        loss = -(scores.gather(-1, y[:nq, None]) / k).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _log(progress, "dknn", step, t.steps, loss, t0)
    ftr = F.normalize(features(net, xtr, device), dim=-1).numpy()
    fte = F.normalize(features(net, xte, device), dim=-1).numpy()
    knn = KNeighborsClassifier(n_neighbors=t.k).fit(ftr, ytr.numpy())
    return {"accuracy": float((knn.predict(fte) == yte.numpy()).mean()) * 100.0}, net.state_dict()


def run(cfg: Config, *, data: Any = None, progress: bool = False) -> tuple[dict[str, float], dict[str, Any] | None]:
    """Run the ``sort`` / ``median`` / ``dknn`` recipe of ``cfg``; returns ``(test metrics, state_dict)``."""
    t = task_options(cfg)
    if cfg.run.recipe == "sort":
        return _train_sort(cfg, t, data, progress)
    if cfg.run.recipe == "median":
        return _train_median(cfg, t, data, progress)
    return _train_dknn(cfg, t, data, progress)
