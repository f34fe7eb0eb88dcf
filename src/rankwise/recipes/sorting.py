"""NeuralSort's experiments (Grover et al., ICLR'19) on mnist5k: large-MNIST sorting and median regression.

**Sorting** (``recipe: sort``). A list holds ``task.n`` numbers of ``task.digits`` (4) digits;
each number is drawn as that many MNIST digits side by side (28 x 112 for 4 digits). Digit images
come from DISJOINT pools: training lists use mnist5k's training split, test lists its held-out
test split; lists containing a tied number are resampled. A CNN (``model.backbone``, e.g.
``small_cnn``; images average-pooled by ``task.downsample``) scores each image and the loss is the
row-wise cross-entropy between the relaxed permutation :math:`\\hat P` of the scores and the true
(descending) permutation :math:`P`: :math:`-\\frac1n \\sum_{i,j} P_{ij} \\log \\hat P_{ij}`.
Methods (``task.method``): a relaxation from :data:`RELAXATIONS` -- ``neuralsort`` (deterministic,
:func:`rankwise.neural_sort`), ``stochastic`` (:func:`rankwise.stochastic_neural_sort` on the scores
as log-scores, loss averaged over ``task.n_samples`` samples), ``softsort``
(:func:`rankwise.softsort_matrix`), or any relaxation added with :func:`register_relaxation` -- and ``vanilla``
(the paper's "vanilla RS": an MLP over the concatenated image embeddings outputs ``n x n`` logits,
row ``i`` = which item is the ``i``-th largest, trained with cross-entropy). With ``task.hard: true`` the
relaxed methods train straight-through: the forward pass uses the exact permutation of the
(perturbed) scores, the backward pass the relaxation's gradients. At test time the
predicted order is the argsort of the scores (argmax of each row for ``vanilla``). Metrics on
``task.test_lists`` fixed test lists: ``all_correct`` (fraction of lists entirely correct) and
``rank_correct`` (fraction of positions correct).

**Median regression** (``recipe: median``, n = 5 by default). The CNN embeds each image, a
linear layer scores it, :math:`\\hat P` of the scores softly selects the median row
(:math:`\\hat P_{\\lceil n/2 \\rceil} \\cdot E`) and a linear regressor maps that embedding to the
median value, scaled to [0, 1] (``value / (10**digits - 1)``); loss = MSE. Test: the hard median
(argsort of the scores) is regressed; reported ``mse_1e4`` = test MSE of the scaled values x 1e4
(our reading of the paper's "x 1e-4" unit).

**Training** is Lightning's: :class:`SortingModule` (sort, median) is a
LightningModule fitted through the run lifecycle on ``trainer.devices`` / ``strategy`` (DDP included) for
``E = ceil(task.steps / task.steps_per_epoch)`` epochs of ``ceil(task.steps / E)`` batches (so
``task.steps`` batches, rounded up to a multiple of ``E``; with ``W`` DDP processes each rank takes
``1 / W`` of every epoch's batches, i.e. the same lists in ``W``-times larger global batches). The
training data are random draws seeded by their index (:class:`RandomLists` with
:class:`~rankwise.recipes.common.EpochIndexSampler`: fresh every epoch, identical after a
resume). Before the test, the BatchNorm running statistics are re-estimated with the final
weights over ``task.bn_recalibration`` batches of training lists (:func:`recalibrate_bn`; 0 = off).
Logs go to ``RUN_DIR/logs`` (CSV) and ``RUN_DIR/tb``; ``RUN_DIR/checkpoints/{best,last}.ckpt``
are written at the end of every epoch (no validation split: best = the evaluated last epoch) and
``rankwise train ... --resume`` continues from last. A ``schedule`` spans the ``E`` epochs actually
trained. The
test evaluation runs on one device of rank 0; ``rankwise evaluate`` repeats it from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F

from rankwise.recipes.base import RecipeBase
from rankwise.recipes.common import (
    EpochIndexSampler,
    build_backbone,
    check_finite,
    device_name,
    item_seed,
    reseed,
    tensors,
)
from rankwise.recipes.config import Config, ConfigError, opt
from rankwise.recipes.optim import configure
from rankwise.recipes.registry import register_recipe
from rankwise.recipes.rundir import Run, load_state_dict

__all__ = [
    "RELAXATIONS",
    "ListSampler",
    "MedianRecipe",
    "MedianRegressor",
    "NumberScorer",
    "RandomLists",
    "Relaxation",
    "SortOptions",
    "SortRecipe",
    "SortingModule",
    "VanillaRanker",
    "recalibrate_bn",
    "register_relaxation",
    "relaxation_options",
    "relaxed_permutation",
    "sort_loss",
    "true_permutation",
]

#: seed of the fixed test lists (the same for every run and method)
TEST_SEED = 12345
#: the BatchNorm recalibration lists use the seed ``run.seed + _BN_SEED_OFFSET``
_BN_SEED_OFFSET = 1_000_003


@dataclasses.dataclass
class SortOptions:
    """NeuralSort's large-MNIST tasks (Grover et al. 2019): sort lists of 4-digit numbers / regress their median."""

    n: int = opt(5, doc="numbers per list", ge=2)
    method: str = opt(
        "neuralsort", doc="a relaxation of RELAXATIONS (neuralsort, stochastic, softsort, ...) or vanilla (sort only)"
    )
    tau: float = opt(1.0, doc="temperature of the relaxation", gt=0)
    n_samples: int = opt(5, doc="relaxed samples per list (stochastic relaxations)", ge=1)
    power: float = opt(1.0, doc="SoftSort's distance power", gt=0)
    options: dict[str, Any] = opt(
        factory=dict, doc="extra options of a relaxation registered with its own (see register_relaxation)"
    )
    hard: bool = opt(
        False, doc="straight-through: exact permutation forward, the relaxation's gradients backward (not vanilla)"
    )
    bn_recalibration: int = opt(
        50, doc="before testing, re-estimate BatchNorm statistics over this many training batches (0 = off)", ge=0
    )
    steps: int = opt(300, doc="training batches, in epochs of at most steps_per_epoch", ge=1)
    steps_per_epoch: int = opt(100, doc="batches per epoch (a checkpoint after each)", ge=1)
    lists_per_batch: int = opt(16, doc="lists per training batch", ge=1)
    test_lists: int = opt(1000, doc="fixed test lists", ge=1)
    digits: int = opt(4, doc="digits per number", ge=1)
    downsample: int = opt(2, doc="average-pool the images by this factor before the CNN (1 = full resolution)", ge=1)


# ------------------------------------------------------------------------------------------ relaxations


@dataclasses.dataclass(frozen=True)
class Relaxation:
    """A relaxed sorting operator for the sort / median recipes.

    ``fn(scores (B, n), t) -> P̂`` of shape ``(B, n, n)`` or ``(S, B, n, n)`` (S samples), row ``i``
    softly selecting the ``i``-th LARGEST score; ``t`` is the :class:`SortOptions` (``tau``,
    ``n_samples``, ``power``, ``hard``); the extra ``options`` it declares (name -> default) are read
    with :func:`relaxation_options` (``task.options`` overrides the defaults).
    """

    fn: Callable[[torch.Tensor, SortOptions], torch.Tensor]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    description: str = ""


#: relaxations by name (``task.method``); extend with :func:`register_relaxation`
RELAXATIONS: dict[str, Relaxation] = {}


def register_relaxation(
    name: str,
    fn: Callable[[torch.Tensor, SortOptions], torch.Tensor],
    *,
    options: Mapping[str, Any] | None = None,
    description: str = "",
) -> None:
    """Make ``fn`` available as ``task.method: name`` (see :class:`Relaxation`)."""
    if name == "vanilla" or name in RELAXATIONS:
        raise ValueError(f"relaxation {name!r} is already defined")
    RELAXATIONS[name] = Relaxation(fn, dict(options or {}), description)


def _neuralsort(scores: torch.Tensor, t: SortOptions) -> torch.Tensor:
    from rankwise.ops import neural_sort

    return neural_sort(scores, tau=t.tau, hard=t.hard)


def _stochastic(scores: torch.Tensor, t: SortOptions) -> torch.Tensor:
    from rankwise.ops import stochastic_neural_sort

    return stochastic_neural_sort(scores, tau=t.tau, n_samples=t.n_samples, log_scores=True, hard=t.hard)


def _softsort(scores: torch.Tensor, t: SortOptions) -> torch.Tensor:
    from rankwise.ops import softsort_matrix

    return softsort_matrix(scores, tau=t.tau, power=t.power, hard=t.hard)


register_relaxation("neuralsort", _neuralsort, description="deterministic NeuralSort (rankwise.neural_sort)")
register_relaxation(
    "stochastic", _stochastic, description="stochastic NeuralSort: Plackett-Luce Gumbel samples of the log-scores"
)
register_relaxation("softsort", _softsort, description="SoftSort (rankwise.softsort_matrix), distance power `power`")


def relaxation_options(t: SortOptions) -> dict[str, Any]:
    """The extra options of the relaxation ``t.method``: its declared defaults updated by ``task.options``."""
    return {**RELAXATIONS[t.method].options, **t.options}


def relaxed_permutation(scores: torch.Tensor, t: SortOptions) -> torch.Tensor:
    """``(B, n, n)`` or ``(S, B, n, n)`` relaxed permutations of the scores by the relaxation ``t.method``."""
    return RELAXATIONS[t.method].fn(scores, t)


# ------------------------------------------------------------------------------------------ data


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
    index is valid: pair with :class:`~rankwise.recipes.common.EpochIndexSampler` for fresh lists).
    """

    def __init__(self, sampler: ListSampler, length: int, seed: int) -> None:
        self.sampler, self.length, self.seed = sampler, int(length), int(seed)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, v = self.sampler.sample(1, torch.Generator().manual_seed(item_seed(self.seed, int(g))))
        return x[0], v[0].float()


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


class SortingModule(L.LightningModule):
    """Large-MNIST sorting (``recipe: sort``) or median regression (``median``) of :class:`SortOptions`.

    ``batch`` = ``(images (B, n, C, H, W), values (B, n))``. ``test_step`` logs ``test/all_correct``
    and ``test/rank_correct`` (sort) or ``test/mse_1e4`` (median).
    """

    def __init__(self, cfg: Config, *, meta: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.task: SortOptions = cfg.task
        self.median = cfg.recipe == "median"
        backbone, dim = build_backbone(cfg.model, meta=meta)
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
            p_hat = relaxed_permutation(model.scorer.score(e).squeeze(-1), t)  # (B, n, n) or (S, B, n, n)
            soft_median = p_hat[..., self.mid, :].unsqueeze(-2).to(e.dtype) @ e  # (..., B, 1, D)
            pred = model.regress(soft_median).squeeze(-1).squeeze(-1).float()
            loss = F.mse_loss(pred, target.expand_as(pred))
        else:
            p_true = true_permutation(v)
            out = self.model(x)
            if t.method == "vanilla":
                loss = F.cross_entropy(out.float().flatten(0, 1), p_true.argmax(-1).flatten())
            else:
                loss = sort_loss(relaxed_permutation(out.float(), t), p_true)
        check_finite(loss, self, f"{self.cfg.recipe} {t.method}")
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
        return configure(self, self.cfg.optimizer, self.cfg.schedule)


def recalibrate_bn(module: SortingModule, sampler: ListSampler, t: SortOptions, seed: int) -> bool:
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


def epochs_and_batches(t: Any) -> tuple[int, int]:
    """``(E, batches per epoch)`` for ``t.steps`` training batches in epochs of at most ``t.steps_per_epoch``."""
    epochs = math.ceil(t.steps / t.steps_per_epoch)
    return epochs, math.ceil(t.steps / epochs)


def digit_pools(run: Run) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training and test digit images and labels of the run's classification dataset."""
    xtr, ytr = tensors(run.data.train)
    xte, yte = tensors(run.data.test)
    return xtr, ytr, xte, yte


class SortRecipe(RecipeBase):
    """Sort lists of multi-digit numbers from their images (fully / per-position correct)."""

    name = "sort"
    description = "NeuralSort large-MNIST sorting: lists of multi-digit numbers, relaxed-sort supervision"
    options: type = SortOptions

    def check(self, cfg: Config) -> None:
        t: SortOptions = cfg.task
        valid = sorted(RELAXATIONS) + ([] if self.name == "median" else ["vanilla"])
        if t.method not in valid:
            if self.name == "median" and t.method == "vanilla":
                raise ConfigError(
                    f"`task.method` must be a relaxation ({', '.join(valid)}) for the median task, got 'vanilla'"
                )
            import difflib

            close = difflib.get_close_matches(t.method, valid, n=2, cutoff=0.4)
            hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
            raise ConfigError(f"`task.method` must be one of {valid}, got {t.method!r}{hint}")
        if t.hard and t.method == "vanilla":
            raise ConfigError("`task.hard` (straight-through relaxation) does not apply to `task.method` 'vanilla'")
        extra = RELAXATIONS[t.method].options if t.method in RELAXATIONS else {}
        for k in t.options:
            if k not in extra:
                takes = sorted(extra) or "none"
                raise ConfigError(f"unknown option `task.options.{k}` for relaxation {t.method!r}; it takes: {takes}")
        if 10**t.digits < t.n:
            raise ConfigError(f"`task.n` ({t.n}) distinct numbers need more than `task.digits` = {t.digits} digits")

    def fit(self, run: Run) -> dict[str, Any]:
        from torch.utils.data import DataLoader

        cfg, t = run.cfg, run.cfg.task
        epochs, per_epoch = epochs_and_batches(t)
        xtr, ytr, _, _ = digit_pools(run)
        torch.manual_seed(cfg.run.seed)
        module = SortingModule(cfg, meta=run.data.meta)
        ds = RandomLists(ListSampler(xtr, ytr, t.n, t.digits), per_epoch * t.lists_per_batch, cfg.run.seed)
        sampler = EpochIndexSampler(len(ds), cfg.run.seed, shuffle=False)
        kw: dict[str, Any] = {"num_workers": cfg.data.num_workers, "persistent_workers": cfg.data.num_workers > 0}
        loader = DataLoader(ds, batch_size=t.lists_per_batch, sampler=sampler, **kw)
        trainer = run.trainer(max_epochs=epochs)
        run.fit(trainer, module, loader)
        if run.global_rank != 0:
            return {}
        return self._test(run, module, ds.sampler)

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        t = run.cfg.task
        xtr, ytr, _, _ = digit_pools(run)
        module = SortingModule(run.cfg, meta=run.data.meta)
        module.load_state_dict(load_state_dict(run.checkpoint(checkpoint or "last")))
        return self._test(run, module, ListSampler(xtr, ytr, t.n, t.digits))

    def _test(self, run: Run, module: SortingModule, sampler: ListSampler) -> dict[str, Any]:
        from torch.utils.data import DataLoader

        cfg, t = run.cfg, run.cfg.task
        recalibrate_bn(module, sampler, t, cfg.run.seed)  # the training lists' sampler
        _, _, xte, yte = digit_pools(run)
        test = RandomLists(ListSampler(xte, yte, t.n, t.digits), t.test_lists, TEST_SEED)
        out = run.local_trainer().test(module, DataLoader(test, batch_size=100), verbose=False)[0]
        return {"test": {k.removeprefix("test/"): float(v) for k, v in out.items()}, "device": device_name(cfg)}


class MedianRecipe(SortRecipe):
    """Regress the median of a list of multi-digit numbers through the relaxed sort's middle row."""

    name = "median"
    description = "NeuralSort median regression: the relaxed sort's middle row selects the embedding to regress"


register_recipe(SortRecipe())
register_recipe(MedianRecipe())
