"""NeuralSort's experiments (Grover et al., ICLR'19) on mnist5k: large-MNIST sorting and median regression.

**Sorting** (``recipe: sort``). A list holds ``task.n`` numbers of ``task.digits`` (4) digits;
each number is drawn as that many MNIST digits side by side (28 x 112 for 4 digits). Digit images
come from DISJOINT pools: training lists use mnist5k's training split minus ``task.val_fraction`` of
it (the validation digits, fixed by :data:`VAL_SEED`), validation lists the held-out validation
digits, test lists the test split; lists containing a tied number are resampled. A CNN
(``model.backbone``, e.g. ``small_cnn``; images average-pooled by ``task.downsample``, 1 = full
resolution) scores each image. Methods (``task.method``): a relaxation from :data:`RELAXATIONS`
and ``vanilla``. Permutation relaxations give :math:`\\hat P` (row ``i`` softly selects the
``i``-th largest score), trained with the row-wise cross-entropy to the true (descending)
permutation :math:`P`: :math:`-\frac1n \\sum_{i,j} P_{ij} \\log \\hat P_{ij}` -- ``neuralsort``
(deterministic, :func:`rankwise.neural_sort`), ``stochastic`` (:func:`rankwise.stochastic_neural_sort`
on the scores as log-scores, averaged over ``task.n_samples`` samples), ``softsort``
(:func:`rankwise.softsort_matrix`), ``diffsort_odd_even`` / ``diffsort_bitonic``
(:func:`rankwise.diffsort` with ``descending=True``, transposed: its ``P[i, j]`` is the weight of
input ``i`` in position ``j``), ``diffsort_odd_even_error_free`` / ``diffsort_bitonic_error_free``
(the same networks with error-free swaps, Kim, Yoon & Cho, ICLR 2024: ``error_free=True``, an exact
permutation forward; trained with the authors' loss, :func:`error_free_loss`, instead of the
cross-entropy), ``sinkhorn`` (``n`` times the transpose of
:func:`rankwise.sinkhorn_transport` to ``n`` descending targets). Rank relaxations have no
:math:`\\hat P` and train a loss on ranks against the true ranks (1..n, ascending): ``isotonic``
(mean squared error of :func:`rankwise.soft_rank` ``method="isotonic"``), ``lapsum`` (the same loss on
:func:`rankwise.lapsum_rank`, option ``alpha``) and ``perturbed``
(:func:`rankwise.perturbed_fy_loss`, Berthet et al.'s Fenchel-Young loss). More with
:func:`register_relaxation`. ``vanilla`` is the paper's "vanilla RS": an MLP over the concatenated
image embeddings outputs ``n x n`` logits, row ``i`` = which item is the ``i``-th largest, trained
with cross-entropy (the reference trains it at lr 1e-4, see its preset). With ``task.hard: true`` the
permutation relaxations train straight-through: the forward pass uses the exact permutation of the
(perturbed) scores, the backward pass the relaxation's gradients. At test time the predicted order
is the argsort of the scores (argmax of each row for ``vanilla``). Metrics on ``task.test_lists``
fixed test lists: ``all_correct`` (fraction of lists entirely correct) and ``rank_correct``
(fraction of positions correct).

**Median regression** (``recipe: median``, n = 5 by default), as in the reference's
``run_median.py``: a score network scores every image, a second network of the same architecture
(own weights) regresses every image's value :math:`r_j` scaled to [0, 1] (``value / (10**digits -
1)``), and the normalised middle row :math:`p` of :math:`\\hat P` combines them
(:func:`median_loss`): ``task.median_objective: expected`` minimises the expected loss
:math:`\\sum_j p_j (r_j - y)^2` (the paper's objective; the reference's stochastic branch),
``point`` the loss of the point estimate :math:`(\\sum_j p_j r_j - y)^2` (the reference's
deterministic branch); ``embedding`` is the earlier one-CNN variant (the middle row selects the
image embedding, a linear layer regresses it). Test: the value regressed for the hard median (argsort
of the scores); reported ``mse_1e4`` = test MSE of the scaled values x 1e4 (our reading of the
paper's "x 1e-4" unit) and ``median_correct`` (fraction of lists whose median image is found).

**Training** is Lightning's: :class:`SortingModule` (sort, median) is a
LightningModule fitted through the run lifecycle on ``trainer.devices`` / ``strategy`` (DDP included) for
``E = ceil(task.steps / task.steps_per_epoch)`` epochs of ``ceil(task.steps / E)`` batches (so
``task.steps`` batches, rounded up to a multiple of ``E``; with ``W`` DDP processes each rank takes
``1 / W`` of every epoch's batches, i.e. the same lists in ``W``-times larger global batches). The
training data are random draws seeded by their index (:class:`RandomLists` with
:class:`~rankwise.recipes.common.EpochIndexSampler`: fresh every epoch, identical after a
resume). After every epoch the ``task.val_lists`` fixed validation lists are evaluated and
``RUN_DIR/checkpoints/best.ckpt`` keeps the best (highest ``val/all_correct`` for sort, lowest
``val/mse_1e4`` for median; the reference keeps its best validation epoch); ``last.ckpt`` is written
every epoch and ``rankwise train ... --resume`` continues from it. The test uses the best checkpoint
(``task.val_fraction: 0``: no validation, best = last). Before the test, the BatchNorm running
statistics are re-estimated with the tested weights over ``task.bn_recalibration`` batches of
training lists (:func:`recalibrate_bn`; 0 = off). A ``schedule`` (the presets: cosine per step)
spans the steps actually trained. ``seconds_per_step`` in ``metrics.json`` (and the ``s/step``
column of ``compare``) is the mean wall time of a training step. The test evaluation runs on one
device of rank 0; ``rankwise evaluate`` repeats it from the checkpoint (default ``best``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal, cast

import lightning as L
import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from rankwise._registry import Registry, RegistryEntry, RelaxationInfo
from rankwise.ops import OPS, diffsort, gumbel_sinkhorn
from rankwise.recipes._progress import StepTimer
from rankwise.recipes.common import (
    EpochIndexSampler,
    build_backbone,
    check_finite,
    device_name,
    epochs_and_batches,
    item_seed,
    loader_workers,
    reseed,
    tensors,
)
from rankwise.recipes.config import Config, ConfigError, StepBudget
from rankwise.recipes.datamodules import LoaderData
from rankwise.recipes.loss_terms import Objective, Term
from rankwise.recipes.optim import configure
from rankwise.recipes.registry import Recipe, register_recipe
from rankwise.recipes.rundir import Run
from rankwise.recipes.stages import Stage

__all__ = [
    "RELAXATIONS",
    "VAL_SEED",
    "ListSampler",
    "MedianOptions",
    "MedianRecipe",
    "MedianRegressor",
    "NumberScorer",
    "RandomLists",
    "Relaxation",
    "SortOptions",
    "SortRecipe",
    "SortingModule",
    "VanillaRanker",
    "error_free_loss",
    "median_loss",
    "recalibrate_bn",
    "register_relaxation",
    "relaxation_options",
    "relaxed_permutation",
    "sort_loss",
    "true_permutation",
    "true_ranks",
]

#: seed of the fixed test lists (the same for every run and method)
TEST_SEED = 12345
#: the BatchNorm recalibration lists use the seed ``run.seed + _BN_SEED_OFFSET``
_BN_SEED_OFFSET = 1_000_003


class SortOptions(StepBudget, unit="batches", after="bn_recalibration"):
    """NeuralSort's large-MNIST tasks (Grover et al. 2019): sort lists of 4-digit numbers / regress their median."""

    n: int = Field(5, description="numbers per list", ge=2)
    method: str = Field(
        "neuralsort",
        description="a relaxation of RELAXATIONS (neuralsort, stochastic, softsort, diffsort_odd_even, "
        "diffsort_bitonic, sinkhorn, isotonic, lapsum, perturbed, ...) or vanilla (sort only)",
    )
    tau: float = Field(1.0, description="temperature of the relaxation", gt=0)
    n_samples: int = Field(5, description="relaxed samples per list (stochastic relaxations)", ge=1)
    power: float = Field(1.0, description="SoftSort's distance power", gt=0)
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="extra options of a relaxation registered with its own (see register_relaxation)",
    )
    hard: bool = Field(
        False,
        description="straight-through: exact permutation forward, the relaxation's gradients backward (not vanilla)",
    )
    bn_recalibration: int = Field(
        50,
        description="before testing, re-estimate BatchNorm statistics over this many training batches (0 = off)",
        ge=0,
    )
    lists_per_batch: int = Field(16, description="lists per training batch", ge=1)
    test_lists: int = Field(1000, description="fixed test lists", ge=1)
    digits: int = Field(4, description="digits per number", ge=1)
    downsample: int = Field(
        1, description="average-pool the images by this factor before the CNN (1 = full resolution)", ge=1
    )
    val_fraction: float = Field(
        0.1,
        description="fraction of the training digits held out for validation lists (best checkpoint); "
        "0 = none (best = last)",
        ge=0,
        lt=1,
    )
    val_lists: int = Field(200, description="fixed validation lists (evaluated after every epoch)", ge=1)


class MedianOptions(SortOptions):
    """The median task (``recipe: median``): :class:`SortOptions` and the objective of the median regression."""

    median_objective: Literal["expected", "point", "embedding"] = Field(
        "expected",
        description="expected (sum_j p_j (r_j - y)^2, the paper's), point ((sum_j p_j r_j - y)^2), "
        "or embedding (one CNN; the median row selects the embedding a linear layer regresses)",
    )


# ------------------------------------------------------------------------------------------ relaxations


@dataclasses.dataclass(frozen=True)
class Relaxation:
    """A relaxed sorting operator for the sort / median recipes.

    ``returns="permutation"``: ``fn(scores (B, n), t) -> P̂`` of shape ``(B, n, n)`` or ``(S, B, n, n)``
    (S samples), row ``i`` softly selecting the ``i``-th LARGEST score; the sort recipe trains it
    with the row-wise cross-entropy :func:`sort_loss`, the median recipe reads its middle row.
    ``returns="rank_loss"``: relaxations that give soft RANKS, not a permutation matrix (isotonic,
    perturbed); ``fn(scores (B, n), ranks (B, n), t) -> scalar loss`` with ``ranks`` the true
    ranks 1..n, ascending (the largest number gets ``n``); sort recipe only.
    ``t`` is the :class:`SortOptions` (``tau``, ``n_samples``, ``power``, ``hard``); the extra
    ``options`` it declares (name -> default) are read with :func:`relaxation_options`
    (``task.options`` overrides the defaults).
    """

    fn: Callable[..., torch.Tensor]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    description: str = ""
    returns: Literal["permutation", "rank_loss"] = "permutation"
    #: permutation relaxations: the sort recipe's training loss ``loss(scores (B, n), values (B, n),
    #: images (B, n, ...), t) -> scalar`` in place of :func:`sort_loss` of ``fn``'s P̂ (``None``: that)
    loss: Callable[..., torch.Tensor] | None = None
    #: ``fn``'s forward is already the exact permutation (``task.hard`` does not apply)
    exact_forward: bool = False


#: relaxations by name (``task.method``): every operator whose registry entry carries
#: :class:`rankwise._registry.RelaxationInfo` (see :func:`_from_op`), and those added with
#: :func:`register_relaxation`
RELAXATIONS: Registry[Any] = Registry("relaxation")


def register_relaxation(
    name: str,
    fn: Callable[..., torch.Tensor],
    *,
    options: Mapping[str, Any] | None = None,
    description: str = "",
    returns: Literal["permutation", "rank_loss"] = "permutation",
    loss: Callable[..., torch.Tensor] | None = None,
    exact_forward: bool = False,
) -> None:
    """Make ``fn`` available as ``task.method: name`` (see :class:`Relaxation` for ``returns``, ``loss``
    and ``exact_forward``)."""
    if name == "vanilla" or name in RELAXATIONS:
        raise ValueError(f"relaxation {name!r} is already defined")
    if returns not in ("permutation", "rank_loss"):
        raise ValueError(f"`returns` must be 'permutation' or 'rank_loss', got {returns!r}")
    if loss is not None and returns != "permutation":
        raise ValueError(f"`loss` applies to permutation relaxations only, got returns={returns!r}")
    relaxation = Relaxation(fn, dict(options or {}), description, returns, loss, exact_forward)
    RELAXATIONS.add(name, relaxation, description=description)


def _straight_through(p_soft: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Exact descending permutation of ``scores`` forward, the gradients of ``p_soft`` backward."""
    exact = true_permutation(scores.detach()).to(p_soft.dtype)
    return exact + p_soft - p_soft.detach()


def true_ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks 1..n of ``values`` along the last dim, ascending (the largest gets ``n``; values distinct)."""
    return values.argsort(-1).argsort(-1).to(torch.float32) + 1


def _option(value: Any, default: Any) -> Any:
    """A ``task.options`` value in the type of its declared default (YAML gives ``1`` for ``1.0``)."""
    if isinstance(default, (int, float)) and not isinstance(default, bool) and isinstance(value, (int, float)):
        return type(default)(value)
    return value


def _from_op(entry: RegistryEntry, info: RelaxationInfo) -> Relaxation:
    """The relaxation ``info`` of an operator's registry entry (:class:`rankwise._registry.RelaxationInfo`)."""
    op = entry.fn

    def kwargs(t: SortOptions) -> dict[str, Any]:
        o = relaxation_options(t)
        extra = {k: _option(o[k], d) for k, d in info.options.items()}
        return {**info.fixed, **{k: getattr(t, k) for k in info.params}, **extra}

    if info.returns == "permutation":

        def permutation(scores: torch.Tensor, t: SortOptions) -> torch.Tensor:
            p = op(scores, **kwargs(t))
            p = p[info.output] if info.output is not None else p
            p = p * scores.shape[-1] if info.mass == "uniform" else p
            p = p.transpose(-1, -2) if info.orientation == "columns" else p
            return _straight_through(p, scores) if t.hard and info.straight_through else p

        return Relaxation(permutation, dict(info.options), info.description, "permutation")

    def rank_loss(scores: torch.Tensor, ranks: torch.Tensor, t: SortOptions) -> torch.Tensor:
        if info.returns == "soft_rank":
            return (op(scores.float(), **kwargs(t)) - ranks).pow(2).mean()
        out: torch.Tensor = op(scores.float(), ranks, **kwargs(t))
        return out

    return Relaxation(rank_loss, dict(info.options), info.description, "rank_loss")


for _entry in OPS.entries():
    for _info in _entry.relaxations:
        RELAXATIONS.add(_info.name, _from_op(_entry, _info), description=_info.description)


def _error_free_chunks(n: int, size: int = 4) -> list[tuple[int, int]]:
    """``(start, length)`` of the input groups of :func:`error_free_loss`: consecutive groups of ``size``
    inputs, the last one taking one more when a single input would remain (groups of one input, whose
    term is identically zero, are left out)."""
    out: list[tuple[int, int]] = []
    for start in range(0, n, size):
        length = min(size + (n == start + size + 1), n - start)
        if length > 1 and (not out or start >= out[-1][0] + out[-1][1]):
            out.append((start, length))
    return out


def _chunk_sorted(p: torch.Tensor, items: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """The items ``start .. start + length - 1`` in the order ``p`` gives them: ``(B, length, D)``.

    ``p`` (B, n, n) is an exact permutation (in value) with ``p[b, i, j]`` = input ``i`` at position ``j``;
    its rows of the group select the positions the group occupies (columns summing to one over those
    rows), in increasing order, and ``p_sel^T @ items`` lists the group's items in that order."""
    rows = p[:, start : start + length, :]  # (B, length, n)
    held = (rows.detach().sum(1) - 1).abs() < 1e-2  # (B, n): the positions the group occupies
    cols = torch.argsort((~held).to(torch.int8), dim=-1, stable=True)[:, :length]  # ascending positions
    sel = rows.gather(2, cols.unsqueeze(1).expand(-1, length, -1))  # (B, length, length)
    return sel.transpose(-1, -2) @ items[:, start : start + length]


def error_free_loss(
    scores: torch.Tensor,
    values: torch.Tensor,
    items: torch.Tensor,
    *,
    network: str = "odd_even",
    steepness: float = 10.0,
    distribution: str = "cauchy",
    art_lambda: float = 0.25,
    loss_weight: float = 1.0,
    soft_loss: bool = True,
) -> torch.Tensor:
    r"""The sorting loss of Kim, Yoon & Cho (ICLR 2024) for error-free differentiable sorting networks.

    With :math:`P` the true (ascending) permutation of ``values`` (:math:`P_{ij} = 1` if input
    :math:`i` holds position :math:`j`), :math:`\hat P_s` the relaxed and :math:`\hat P_h` the
    error-free matrix of :func:`rankwise.diffsort` (ascending) on ``scores``, and :math:`X` the items
    (``items`` flattened per item: ``(B, n, D)``)

    .. math::
        \ell = \mathrm{BCE}(\hat P_s, P) + \lambda \sum_{g} \mathrm{MSE}\bigl(\hat P_{h,g}^\top X_g,\;
        P_g^\top X_g\bigr),

    the BCE averaged over all entries, its logarithms clamped at -100 as ``torch.nn.BCELoss`` (only
    with ``soft_loss``), :math:`\lambda` = ``loss_weight``, ``g`` the groups of consecutive inputs
    ``0..3``, ``4..7``, ... (the last group takes a fifth input when one would be left alone; as the
    authors' ``main_multidigit.py``): :math:`P_g^\top X_g` lists the group's items in their true
    order, :math:`\hat P_{h,g}^\top X_g` in the predicted one (the exact order forward, the relaxed
    swaps' gradients backward); the MSE averages over the batch, the group and the item's entries.
    ``scores`` / ``values`` (B, n), ``items`` (B, n, ...); values distinct.
    """
    b, n = scores.shape
    kw: dict[str, Any] = {
        "network": network,
        "steepness": steepness,
        "distribution": distribution,
        "art_lambda": art_lambda,
    }
    p_true = F.one_hot(values.argsort(-1), n).transpose(-1, -2).to(scores.dtype)
    loss = scores.new_zeros(())
    if soft_loss:  # BCELoss written out (F.binary_cross_entropy refuses to run under autocast)
        p_soft = diffsort(scores, **kw)[1]
        log_p, log_q = p_soft.log().clamp_min(-100), (1 - p_soft).log().clamp_min(-100)
        loss = -(p_true * log_p + (1 - p_true) * log_q).mean()
    p_hard = diffsort(scores, error_free=True, **kw)[1]
    flat = items.reshape(b, n, -1).to(scores.dtype)
    sorted_terms = [
        F.mse_loss(_chunk_sorted(p_hard, flat, start, k), _chunk_sorted(p_true, flat, start, k))
        for start, k in _error_free_chunks(n)
    ]
    if sorted_terms:
        loss = loss + loss_weight * torch.stack(sorted_terms).sum()
    return loss


def _error_free_relaxation(network: str) -> None:
    """``diffsort_<network>_error_free``: error-free swaps, the authors' loss (:func:`error_free_loss`)."""

    def network_options(t: SortOptions) -> dict[str, Any]:
        o = relaxation_options(t)
        opts = {k: _option(o[k], d) for k, d in _ERROR_FREE_OPTIONS.items()}
        for k in ("loss_weight", "soft_loss"):
            opts.pop(k)
        return opts

    def permutation(scores: torch.Tensor, t: SortOptions) -> torch.Tensor:
        kw: dict[str, Any] = {"network": network, "descending": True, "error_free": True, **network_options(t)}
        return diffsort(scores, **kw)[1].transpose(-1, -2)

    def loss(scores: torch.Tensor, values: torch.Tensor, images: torch.Tensor, t: SortOptions) -> torch.Tensor:
        o = relaxation_options(t)
        weight = _option(o["loss_weight"], _ERROR_FREE_OPTIONS["loss_weight"])
        soft = o["soft_loss"]
        if not isinstance(soft, bool):
            raise TypeError(f"`task.options.soft_loss` must be a bool, got {soft!r}")
        if not weight >= 0:
            raise ValueError(f"`task.options.loss_weight` must be >= 0, got {weight!r}")
        kw = network_options(t)
        return error_free_loss(scores, values, images, network=network, loss_weight=weight, soft_loss=soft, **kw)

    description = (
        f"{network.replace('_', '-')} sorting network with error-free swaps (rankwise.diffsort error_free=True, "
        "Kim et al. ICLR 2024), trained with the authors' loss"
    )
    register_relaxation(
        f"diffsort_{network}_error_free",
        permutation,
        options=_ERROR_FREE_OPTIONS,
        description=description,
        loss=loss,
        exact_forward=True,
    )


#: options of the error-free relaxations (the authors' defaults: cauchy, steepness 10, weight 1, both terms)
_ERROR_FREE_OPTIONS: dict[str, Any] = {
    "steepness": 10.0,
    "distribution": "cauchy",
    "art_lambda": 0.25,
    "loss_weight": 1.0,
    "soft_loss": True,
}
for _network in ("odd_even", "bitonic"):
    _error_free_relaxation(_network)


#: options of the Gumbel-Sinkhorn relaxation (the op's defaults: 20 iterations, noise scale 1)
_GUMBEL_SINKHORN_OPTIONS: dict[str, Any] = {"n_iters": 20, "noise_factor": 1.0}


def _gumbel_sinkhorn_permutation(scores: torch.Tensor, t: SortOptions) -> torch.Tensor:
    r"""``(S, B, n, n)`` Gumbel-Sinkhorn samples (Mena et al., ICLR 2018) of the rank-one assignment
    scores :math:`X_{ij} = c_i s_j`, :math:`c = \mathrm{linspace}(1, -1, n)`, at temperature ``t.tau``
    with ``t.n_samples`` samples: the matching of :math:`X` puts the largest score in row 0
    (rearrangement inequality), so the noiseless limit :math:`\tau \to 0` is the descending sort."""
    o = relaxation_options(t)
    opts = {k: _option(o[k], d) for k, d in _GUMBEL_SINKHORN_OPTIONS.items()}
    n = scores.shape[-1]
    c = torch.linspace(1.0, -1.0, n, device=scores.device, dtype=scores.dtype)
    log_alpha = c[:, None] * scores.unsqueeze(-2)
    return gumbel_sinkhorn(log_alpha, temperature=t.tau, n_samples=t.n_samples, **opts)


register_relaxation(
    "gumbel_sinkhorn",
    _gumbel_sinkhorn_permutation,
    options=_GUMBEL_SINKHORN_OPTIONS,
    description="Gumbel-Sinkhorn (Mena et al. ICLR 2018, rankwise.gumbel_sinkhorn) of the rank-one "
    "assignment scores c_i s_j (c = linspace(1, -1, n)): task.tau, task.n_samples samples",
)


def _try_relaxation(t: SortOptions) -> None:
    """Run the relaxation once on a tiny batch: its own checks of ``task.options`` values become a ConfigError."""
    r = RELAXATIONS[t.method]
    scores = torch.linspace(0.0, 1.0, t.n).reshape(1, t.n)
    try:
        with torch.no_grad():
            if r.returns == "permutation":
                r.fn(scores, t)
                if r.loss is not None:
                    r.loss(scores, scores, scores.unsqueeze(-1), t)
            else:
                r.fn(scores, true_ranks(scores), t)
    except (ValueError, TypeError, KeyError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"invalid options of relaxation {t.method!r} (`task.options` {t.options}): {msg}") from None


def relaxation_options(t: SortOptions) -> dict[str, Any]:
    """The extra options of the relaxation ``t.method``: its declared defaults updated by ``task.options``."""
    return {**RELAXATIONS[t.method].options, **t.options}


def relaxed_permutation(scores: torch.Tensor, t: SortOptions) -> torch.Tensor:
    """``(B, n, n)`` or ``(S, B, n, n)`` relaxed permutations of the scores by the relaxation ``t.method``."""
    r = RELAXATIONS[t.method]
    if r.returns != "permutation":
        raise ValueError(f"relaxation {t.method!r} gives soft ranks, not a permutation matrix (returns {r.returns!r})")
    return r.fn(scores, t)


def median_loss(
    p_hat: torch.Tensor,
    values: torch.Tensor,
    target: torch.Tensor,
    *,
    objective: Literal["expected", "point"] = "expected",
) -> torch.Tensor:
    """Median-regression loss through the middle row of a relaxed sort (Grover et al. 2019, sec. 6.3).

    With :math:`m = \\lfloor n/2 \\rfloor` (0-based; the median of odd ``n``), the normalised middle
    row :math:`p_j = \\hat P_{mj} / \\sum_k \\hat P_{mk}` (as in the authors' ``run_median.py``), the
    per-image regressions :math:`r_j` (``values``) and the true median :math:`y`:

    * ``expected``: :math:`\\sum_j p_j (r_j - y)^2`, the expected loss when the median image is drawn
      from :math:`p` (the paper's objective, used there for stochastic NeuralSort);
    * ``point``: :math:`(\\sum_j p_j r_j - y)^2`, the loss of the point estimate (the authors'
      deterministic NeuralSort branch).

    Averaged over lists (and samples).

    Shape:
        - p_hat: :math:`(B, n, n)` or :math:`(S, B, n, n)`; values: :math:`(B, n)`; target: :math:`(B,)`.
        - output: scalar.
    """
    mid = p_hat.shape[-1] // 2
    row = p_hat[..., mid, :].float()
    row = row / row.sum(-1, keepdim=True).clamp_min(1e-12)
    r, y = values.float(), target.float()
    if objective == "expected":
        return (row * (r - y.unsqueeze(-1)).pow(2)).sum(-1).mean()
    if objective == "point":
        return ((row * r).sum(-1) - y).pow(2).mean()
    raise ValueError(f"`objective` must be 'expected' or 'point', got {objective!r}")


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
    """The median task's networks: a score network for the sort and the median regression.

    Objectives ``expected`` / ``point`` (the paper's architecture, ``run_median.py``): ``scorer``
    scores every image and ``regressor`` -- a second CNN of the same architecture with its own
    weights -- regresses every image's value ``r_j``; :func:`median_loss` combines them through the
    relaxed sort's middle row. Objective ``embedding``: one CNN; the middle row softly selects the
    median image's embedding and the linear layer ``regress`` maps it to the median value.
    """

    def __init__(self, scorer: NumberScorer, dim: int, regressor: NumberScorer | None = None) -> None:
        super().__init__()
        self.scorer = scorer
        self.regressor = regressor
        self.regress = nn.Linear(dim, 1) if regressor is None else None

    def bn_networks(self) -> list[nn.Module]:
        """The CNNs whose BatchNorm statistics :func:`recalibrate_bn` re-estimates (images -> ``(B, n)``)."""
        return [self.scorer] if self.regressor is None else [self.scorer, self.regressor]


class SortingModule(L.LightningModule):
    """Large-MNIST sorting (``recipe: sort``, :class:`SortOptions`) or median regression (``median``,
    :class:`MedianOptions`).

    ``batch`` = ``(images (B, n, C, H, W), values (B, n))``. ``test_step`` logs ``test/all_correct``
    and ``test/rank_correct`` (sort) or ``test/mse_1e4`` and ``test/median_correct`` (median);
    ``validation_step`` the same under ``val/``.
    """

    def __init__(self, cfg: Config, *, meta: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.task: SortOptions = cfg.task
        self.median = isinstance(self.task, MedianOptions)
        backbone, dim = build_backbone(cfg.model, meta=meta)
        scorer = NumberScorer(backbone, dim, self.task.downsample)
        self.model: nn.Module
        if self.median:
            regressor = None
            if cast(MedianOptions, self.task).median_objective != "embedding":
                backbone_r, dim_r = build_backbone(cfg.model, meta=meta)
                regressor = NumberScorer(backbone_r, dim_r, self.task.downsample)
            self.model = MedianRegressor(scorer, dim, regressor)
        elif self.task.method == "vanilla":
            self.model = VanillaRanker(scorer, dim, self.task.n)
        else:
            self.model = scorer
        self.scale, self.mid = float(10**self.task.digits - 1), self.task.n // 2
        #: one term, named by the task: ``median`` or ``sort``
        self.objective = Objective(Term("median" if self.median else "sort", self._train_loss))

    def _median_model(self) -> MedianRegressor:
        return cast(MedianRegressor, self.model)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed, self.global_step, self.global_rank)

    def _median_train_loss(self, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t, model = cast(MedianOptions, self.task), self._median_model()
        target = v.float().median(-1).values / self.scale
        if model.regressor is not None:
            p_hat = relaxed_permutation(model.scorer(x).float(), t)  # (B, n, n) or (S, B, n, n)
            objective = cast(Literal["expected", "point"], t.median_objective)
            return median_loss(p_hat, model.regressor(x), target, objective=objective)
        regress = cast(nn.Linear, model.regress)  # set whenever regressor is None
        e = model.scorer.embed(x)  # (B, n, D)
        p_hat = relaxed_permutation(model.scorer.score(e).squeeze(-1).float(), t)
        soft_median = p_hat[..., self.mid, :].unsqueeze(-2).to(e.dtype) @ e  # (..., B, 1, D)
        pred = regress(soft_median).squeeze(-1).squeeze(-1).float()
        return F.mse_loss(pred, target.expand_as(pred))

    def _sort_train_loss(self, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = self.task
        out = self.model(x)
        if t.method == "vanilla":
            return F.cross_entropy(out.float().flatten(0, 1), true_permutation(v).argmax(-1).flatten())
        r = RELAXATIONS[t.method]
        if r.returns == "rank_loss":
            return r.fn(out.float(), true_ranks(v), t)
        if r.loss is not None:
            return r.loss(out.float(), v, x, t)
        return sort_loss(relaxed_permutation(out.float(), t), true_permutation(v))

    def _train_loss(self, tensors: Mapping[str, Any]) -> torch.Tensor:
        """The task loss of a batch of lists (images ``x``, values ``v``): :func:`median_loss` for the
        median, else the relaxation's loss (:func:`sort_loss` of its permutation, or its rank loss) or
        the vanilla network's cross-entropy."""
        x, v = tensors["images"], tensors["values"]
        return self._median_train_loss(x, v) if self.median else self._sort_train_loss(x, v)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, v = batch
        value = self.objective({"images": x, "values": v})
        check_finite(value.total, self, f"{self.cfg.recipe} {self.task.method}")
        self.objective.log(self, value, batch_size=x.shape[0])
        return value.total

    def _evaluate(self, batch: Any, prefix: str) -> None:
        x, v = batch
        b = x.shape[0]
        sync = prefix == "val"  # under DDP every rank validates a shard of the lists: average them
        if self.median:
            model = self._median_model()
            true_mid = v.argsort(-1, descending=True)[:, self.mid]
            if model.regressor is not None:
                idx = model.scorer(x).argsort(-1, descending=True)[:, self.mid]
                pred = model.regressor(x).gather(1, idx[:, None]).squeeze(1).float()
            else:
                regress = cast(nn.Linear, model.regress)
                e = model.scorer.embed(x)
                idx = model.scorer.score(e).squeeze(-1).argsort(-1, descending=True)[:, self.mid]
                med = e.gather(1, idx[:, None, None].expand(-1, 1, e.shape[-1])).squeeze(1)
                pred = regress(med).squeeze(-1).float()
            err = (pred - v.float().median(-1).values / self.scale) ** 2 * 1e4
            self.log(f"{prefix}/mse_1e4", err.mean(), batch_size=b, sync_dist=sync)
            self.log(f"{prefix}/median_correct", (idx == true_mid).float().mean(), batch_size=b, sync_dist=sync)
            return
        out = self.model(x)
        pred = out.argmax(-1) if self.task.method == "vanilla" else out.argsort(-1, descending=True)
        ok = pred == v.argsort(-1, descending=True)
        full, positions = ok.all(-1).float().mean(), ok.float().mean()
        self.log(f"{prefix}/all_correct", full, batch_size=b, sync_dist=sync)
        self.log(f"{prefix}/rank_correct", positions, batch_size=b, sync_dist=sync)
        if prefix == "val":
            # best-checkpoint criterion: fully correct lists, ties broken by correct positions (the
            # positions term, < 0.5 / val_lists, never outweighs one more fully correct list), so
            # that a run whose lists are never fully correct does not keep its first epoch
            tie = 0.5 / max(1, self.task.val_lists)
            self.log("val/selection", full + tie * positions, batch_size=b, sync_dist=sync)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> Any:
        return configure(self, self.cfg.optimizer, self.cfg.schedule)


def recalibrate_bn(module: SortingModule, sampler: ListSampler, t: SortOptions, seed: int) -> bool:
    """Re-estimate the BatchNorm running statistics of ``module`` with its final weights (before testing).

    During training, BatchNorm's running averages (momentum 0.1) mix the statistics of the last ~10-20
    steps' weights; when the weights still move fast (short budgets), the lag makes eval-mode outputs
    differ from the trained ones (docs/results.md, median regression, measures it). This runs
    :func:`torch.optim.swa_utils.update_bn` (a cumulative average, weights untouched) over
    ``t.bn_recalibration`` batches of fresh training lists, for each CNN of the module (the median
    task's score and regression networks). Returns whether anything was recalibrated.
    """
    from torch.optim.swa_utils import update_bn
    from torch.utils.data import DataLoader

    nets = module.model.bn_networks() if isinstance(module.model, MedianRegressor) else [module.model]
    nets = [n for n in nets if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in n.modules())]
    if t.bn_recalibration <= 0 or not nets:
        return False
    lists = RandomLists(sampler, t.bn_recalibration * t.lists_per_batch, seed + _BN_SEED_OFFSET)
    for net in nets:
        update_bn(DataLoader(lists, batch_size=t.lists_per_batch), net, device=next(net.parameters()).device)
    return True


class RecalibrateBN(L.Callback):
    """:func:`recalibrate_bn` when a test starts: after ``Trainer.test`` has loaded the tested checkpoint."""

    def __init__(self, sampler: ListSampler, t: SortOptions, seed: int) -> None:
        self.sampler, self.t, self.seed = sampler, t, seed

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        with torch.inference_mode(False):  # the test loop runs in inference mode; the statistics are plain buffers
            recalibrate_bn(pl_module, self.sampler, self.t, self.seed)


#: seed of the fixed validation lists and of the held-out validation digits
VAL_SEED = 54321


def digit_pools(
    run: Run,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training, validation and test digit images and labels of the run's classification dataset.

    The validation digits are ``round(task.val_fraction * N)`` of the ``N`` training digits, drawn with
    the fixed seed :data:`VAL_SEED` (the same for every run seed); the training lists use the rest.
    """
    xtr, ytr = tensors(run.data.train)
    xte, yte = tensors(run.data.test)
    n_val = round(run.cfg.task.val_fraction * len(ytr))
    perm = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(VAL_SEED))
    val, train = perm[:n_val].sort().values, perm[n_val:].sort().values
    return xtr[train], ytr[train], xtr[val], ytr[val], xte, yte


class SortRecipe(Recipe):
    """Sort lists of multi-digit numbers from their images (fully / per-position correct)."""

    name = "sort"
    per_step = True
    description = "NeuralSort large-MNIST sorting: lists of multi-digit numbers, relaxed-sort supervision"
    options: type = SortOptions
    #: ``(metric, mode)`` of the best checkpoint: the reference keeps the best validation accuracy
    #: (fully correct lists, ties broken by correct positions, see ``val/selection``)
    monitor: tuple[str, Literal["min", "max"]] = ("val/selection", "max")
    #: the task reads a permutation matrix (its middle row): no rank relaxation, no ``vanilla``
    needs_permutation = False

    def check(self, cfg: Config) -> None:
        t: SortOptions = cfg.task
        valid = sorted(RELAXATIONS) + ([] if self.needs_permutation else ["vanilla"])
        if t.method not in valid:
            if self.needs_permutation and t.method == "vanilla":
                raise ConfigError(
                    f"`task.method` must be a relaxation ({', '.join(valid)}) for the {self.name} task, got 'vanilla'"
                )
            from rankwise._validation import suggestion

            hint = f" ({close})" if (close := suggestion(t.method, valid)) else ""
            raise ConfigError(f"`task.method` must be one of {valid}, got {t.method!r}{hint}")
        if self.needs_permutation and RELAXATIONS[t.method].returns != "permutation":
            perm = sorted(k for k, r in RELAXATIONS.items() if r.returns == "permutation")
            raise ConfigError(
                f"`task.method` {t.method!r} gives soft ranks, not a permutation matrix; "
                f"the {self.name} task needs one of {perm}"
            )
        if t.hard and (t.method == "vanilla" or RELAXATIONS[t.method].returns != "permutation"):
            raise ConfigError(f"`task.hard` (straight-through relaxation) does not apply to `task.method` {t.method!r}")
        if t.hard and RELAXATIONS[t.method].exact_forward:
            raise ConfigError(
                f"`task.hard` (straight-through relaxation) does not apply to `task.method` {t.method!r}: "
                "its forward is already the exact permutation"
            )
        extra = RELAXATIONS[t.method].options if t.method in RELAXATIONS else {}
        for k in t.options:
            if k not in extra:
                takes = sorted(extra) or "none"
                raise ConfigError(f"unknown option `task.options.{k}` for relaxation {t.method!r}; it takes: {takes}")
        if 10**t.digits < t.n:
            raise ConfigError(f"`task.n` ({t.n}) distinct numbers need more than `task.digits` = {t.digits} digits")
        if t.method in RELAXATIONS:
            _try_relaxation(t)

    def fit(self, run: Run) -> dict[str, Any]:
        from torch.utils.data import DataLoader

        cfg, t = run.cfg, run.cfg.task
        epochs, per_epoch = epochs_and_batches(t)
        xtr, ytr, xva, yva, _, _ = digit_pools(run)
        torch.manual_seed(cfg.run.seed)
        module = SortingModule(cfg, meta=run.data.meta)
        ds = RandomLists(ListSampler(xtr, ytr, t.n, t.digits), per_epoch * t.lists_per_batch, cfg.run.seed)
        sampler = EpochIndexSampler(len(ds), cfg.run.seed, shuffle=False)
        kw: dict[str, Any] = loader_workers(cfg.data.num_workers)
        loader = DataLoader(ds, batch_size=t.lists_per_batch, sampler=sampler, **kw)
        val_loader = None
        monitor: str | None = None
        mode: Literal["min", "max"] = "min"
        if len(yva):
            val = RandomLists(ListSampler(xva, yva, t.n, t.digits), t.val_lists, VAL_SEED)
            val_loader = DataLoader(val, batch_size=100)
            monitor, mode = self.monitor
        timer = StepTimer()
        data = LoaderData(loader, val_loader, test=lambda: _test_loader(run))
        # the reference tests the best validation checkpoint (without validation, best = last)
        stage = Stage("", module, data, epochs=epochs, monitor=monitor, mode=mode, hand_on=None, callbacks=[timer])
        run.run_stage(stage)
        return run.rank_zero(self._test, run, module, data, ds.sampler, "best", timer)

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        t = run.cfg.task
        xtr, ytr, *_ = digit_pools(run)
        module = SortingModule(run.cfg, meta=run.data.meta)
        data = LoaderData(test=lambda: _test_loader(run))
        return self._test(run, module, data, ListSampler(xtr, ytr, t.n, t.digits), checkpoint or "best")

    def _test(
        self,
        run: Run,
        module: SortingModule,
        data: LoaderData,
        sampler: ListSampler,
        checkpoint: str,
        timer: StepTimer | None = None,
    ) -> dict[str, Any]:
        """``Trainer.test`` of ``checkpoints/<checkpoint>.ckpt``, its BatchNorm statistics first re-estimated on
        lists of the training ``sampler``."""
        cfg = run.cfg
        recalibrate = RecalibrateBN(sampler, cfg.task, cfg.run.seed)
        out, _ = run.test(module, data, checkpoint, callbacks=[recalibrate])
        result: dict[str, Any] = {"test": {k.removeprefix("test/"): float(v) for k, v in out.items()}}
        result["device"] = device_name(cfg)
        if timer is not None and timer.steps:
            result["seconds_per_step"] = timer.seconds / timer.steps
        return result


def _test_loader(run: Run) -> Any:
    """The fixed test lists (seed :data:`TEST_SEED`) of the held-out digits."""
    from torch.utils.data import DataLoader

    t = run.cfg.task
    *_, xte, yte = digit_pools(run)
    return DataLoader(RandomLists(ListSampler(xte, yte, t.n, t.digits), t.test_lists, TEST_SEED), batch_size=100)


class MedianRecipe(SortRecipe):
    """Regress the median of a list of multi-digit numbers through the relaxed sort's middle row."""

    name = "median"
    description = "NeuralSort median regression: the relaxed sort's middle row selects the embedding to regress"
    options: type = MedianOptions
    #: the reference keeps the best validation loss
    monitor: tuple[str, Literal["min", "max"]] = ("val/mse_1e4", "min")
    needs_permutation = True


register_recipe(SortRecipe())
register_recipe(MedianRecipe())
