r"""Learning-to-rank losses on padded lists, with allRank's option names, defaults and conventions.

Every loss takes ``(y_pred, y_true, *, ...)``: predicted scores and graded relevance labels of shape
``(batch, n)`` (any leading dims are flattened into the batch); a slot whose label equals
``padded_value_indicator`` (default ``-1``) is padding and takes no part. Every other label is a
grade ``>= 0``: a negative one is a ``ValueError`` naming ``y_true`` (a device-side assertion off the
CPU), as ``rankwise.data.read_letor`` refuses it in a file. The option names, defaults
and reductions are those of allRank 1.4.3 (``allrank.models.losses``), so its users can swap the
import; where allRank gives NaN (a list made only of padding, no valid pair) these losses give 0
and keep the graph.

* :func:`listnet_loss` — ListNet (Cao et al., ICML 2007, "Learning to Rank: From Pairwise Approach to
  Listwise Approach"), top-one cross entropy.
* :func:`listmle_loss` — ListMLE (Xia et al., ICML 2008, "Listwise Approach to Learning to Rank:
  Theory and Algorithm"), Plackett-Luce likelihood of the label order.
* :func:`ranknet_loss` — RankNet (Burges et al., ICML 2005, "Learning to Rank using Gradient Descent").
* :func:`lambda_loss` — the LambdaLoss framework (Wang et al., CIKM 2018, "The LambdaLoss Framework for
  Ranking Metric Optimization"): NDCG-Loss1/2/2++, LambdaRank and RankNet weighings.
* :func:`approx_ndcg_loss` — ApproxNDCG (Qin et al., Information Retrieval 2010, "A General Approximation
  Framework for Direct Optimization of Information Retrieval Measures").
* :func:`neural_ndcg_loss` — NeuralNDCG (Pobrotyn & Białobrzeski, 2021, "NeuralNDCG: Direct Optimisation of
  a Ranking Metric via Differentiable Relaxation of Sorting"): rankwise's NeuralSort, Sinkhorn scaling.
* :func:`pirank_ndcg_loss` — the PiRank NDCG surrogate (Swezey et al., NeurIPS 2021, "PiRank: Scalable
  Learning To Rank via Differentiable Sorting") through any soft sorting method of rankwise.

Each loss has an ``nn.Module`` twin and is registered with ``register_loss``.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rankwise._autograd import graph_vjp
from rankwise._kernels import ltr as kernels
from rankwise._random import rand_from, randperm_from
from rankwise._twin import FunctionModule
from rankwise._validation import (
    batch_loss,
    check_bool,
    check_choice,
    check_floating,
    check_grades,
    check_positive,
    check_positive_int,
    check_real,
    common_compute_dtype,
    finite_checked,
    sort_padding_last,
)
from rankwise.losses._registry import register_loss
from rankwise.ops.permutation import neural_sort, softsort_matrix
from rankwise.ops.soft import list_soft_methods, soft_rank
from rankwise.ops.sorting_network import diffsort

__all__ = [
    "WEIGHING_SCHEMES",
    "ApproxNDCGLoss",
    "LambdaLoss",
    "ListMLELoss",
    "ListNetLoss",
    "NeuralNDCGLoss",
    "PiRankNDCGLoss",
    "RankNetLoss",
    "approx_ndcg_loss",
    "lambda_loss",
    "listmle_loss",
    "listnet_loss",
    "neural_ndcg_loss",
    "pirank_ndcg_loss",
    "ranknet_loss",
]

#: allRank's padding label and epsilon
PADDED_Y_VALUE = -1
DEFAULT_EPS = 1e-10

#: the ``weighing_scheme`` values of :func:`lambda_loss` (allRank's function names)
WEIGHING_SCHEMES = (
    "ndcgLoss1_scheme",
    "ndcgLoss2_scheme",
    "lambdaRank_scheme",
    "ndcgLoss2PP_scheme",
    "rankNet_scheme",
    "rankNetWeightedByGTDiff_scheme",
    "rankNetWeightedByGTDiffPowed_scheme",
)


# --------------------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------------------
def _check_indicator(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(float(value)):
        raise TypeError(f"`padded_value_indicator` must be a number, got {value!r}")
    return float(value)


def _check_k(k: Any) -> int | None:
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"`k` must be None or a positive int, got {type(k).__name__} {k!r}")
    return check_positive_int(k, "k")


def _lists(y_pred: Any, y_true: Any, padded_value_indicator: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(B, n)`` predictions and labels in the compute dtype and the mask of real (unpadded) slots."""
    p, t, ind = _flat_lists(y_pred, y_true, padded_value_indicator)
    return p, t, t != ind


def _flat_lists(y_pred: Any, y_true: Any, padded_value_indicator: Any) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(B, n)`` predictions and labels in the compute dtype and the padding label (checked)."""
    check_floating(y_pred, "y_pred")
    check_real(y_true, "y_true")
    if y_pred.dim() == 0 or y_pred.shape != y_true.shape:
        raise ValueError(
            "`y_pred` and `y_true` must have the same shape (batch, n) (any leading dims), "
            f"got {tuple(y_pred.shape)} and {tuple(y_true.shape)}"
        )
    ind = _check_indicator(padded_value_indicator)
    check_grades(y_true, ind)
    dt = common_compute_dtype(y_pred, y_true)
    p, t = y_pred, y_true.detach()
    if p.dim() != 2:
        shape = (math.prod(p.shape[:-1]), p.shape[-1])
        p, t = p.reshape(shape), t.reshape(shape)
    # (no-op conversions skipped: they cost as much as the small lists' arithmetic)
    return (p if p.dtype == dt else p.to(dt)), (t if t.dtype == dt else t.to(dt)), ind


def _zero(p: torch.Tensor) -> torch.Tensor:
    """A 0 that keeps the graph of ``p``."""
    return p.sum() * 0.0


def _discounts(n: int, like: torch.Tensor) -> torch.Tensor:
    """``log2(r + 1)`` for the 1-based ranks ``r = 1..n``."""
    return torch.log2(torch.arange(2, n + 2, device=like.device, dtype=like.dtype))


def _ideal_dcg(t: torch.Tensor, valid: torch.Tensor, k: int | None, powered: bool) -> torch.Tensor:
    """DCG@k of the labels sorted by themselves (padding last with gain 0), labels clamped at 0."""
    ideal, _ = sort_padding_last(t, valid)
    ideal = ideal.clamp(min=0.0)
    gains = torch.pow(2.0, ideal) - 1.0 if powered else ideal
    return (gains / _discounts(t.shape[-1], t))[:, :k].sum(dim=-1)


# --------------------------------------------------------------------------------------------------
# ListNet, ListMLE, RankNet
# --------------------------------------------------------------------------------------------------
@batch_loss("y_pred", "y_true")
def listnet_loss(
    y_pred: torch.Tensor,
    y_true: torch.Tensor,
    *,
    eps: float = DEFAULT_EPS,
    padded_value_indicator: float = PADDED_Y_VALUE,
) -> torch.Tensor:
    r"""ListNet's top-one cross entropy (Cao et al., ICML 2007), as allRank's ``listNet``.

    .. math::
        L = \frac{1}{B} \sum_{b} -\sum_{i} \operatorname{softmax}(y)_i \,
            \log\bigl(\operatorname{softmax}(\hat y)_i + \epsilon\bigr)

    with both softmaxes over the real (unpadded) slots of a list; the labels are the logits of the
    target distribution. A list made only of padding adds 0 (allRank: NaN) and still counts in :math:`B`.

    Shape:
        - y_pred: :math:`(*, n)` floating; y_true: the same shape (real), padding ``== padded_value_indicator``.
        - output: scalar, float32 for fp16/bf16 inputs.

    Example:
        >>> import torch
        >>> from rankwise.losses import listnet_loss
        >>> listnet_loss(torch.tensor([[0.5, 0.2, 0.9]]), torch.tensor([[1.0, 0.0, -1.0]]))
        tensor(0.6350)
    """
    e = check_positive(eps, "eps", allow_zero=True)
    p, t, ind = _flat_lists(y_pred, y_true, padded_value_indicator)
    if p.numel() == 0:
        return _zero(p)
    if p.device.type == "cpu" and kernels.ready():
        return _kernel_loss(_ListNetKernel.apply(p, t, ind, e, p.requires_grad and torch.is_grad_enabled()))
    return _ListNet.apply(p, t, t == ind, e)


def _listnet_composite(p: torch.Tensor, t: torch.Tensor, invalid: torch.Tensor, e: float) -> torch.Tensor:
    """:class:`_ListNet`'s value in differentiable torch ops (double backward)."""
    valid = ~invalid
    dead = ~valid.any(dim=-1, keepdim=True)

    def soft(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x.masked_fill(invalid, float("-inf")).masked_fill(dead, 0.0), dim=-1) * valid

    denom = (soft(p) + e).masked_fill(invalid, 1.0)
    return -(soft(t) * torch.log(denom)).sum() / p.shape[0]


def _masked_softmax(x: torch.Tensor, invalid: torch.Tensor, *, zero_dead: bool = False) -> torch.Tensor:
    """Softmax over the last dim of the slots that are not ``invalid`` (a new buffer; 0 in the others).
    A row without a valid slot is uniform or all 0; all 0 with ``zero_dead``.

    Short rows: ``exp(x - max)`` over its sum in place with ``-inf`` in the invalid slots (the CPU
    softmax kernel is slow on short rows; ``exp`` is slow on huge finite negatives, fast on ``-inf``).
    Longer rows: the softmax kernel with the dtype's lowest value in the invalid slots (its exact 0
    there, no ``-inf - -inf`` NaN), written in place into the masked copy when that is large. A valid
    value is taken to be above the dtype's lowest one (a row of such values would count as empty).
    """
    low = torch.finfo(x.dtype).min
    if x.shape[-1] <= _SOFTMAX_KERNEL_MIN:
        y = x.masked_fill(invalid, float("-inf"))
        top = y.amax(dim=-1, keepdim=True)
        alive = top > low if zero_dead else None
        y.sub_(top.clamp_(min=low)).exp_()
        y.div_(y.sum(dim=-1, keepdim=True).clamp_(min=torch.finfo(x.dtype).tiny))
    else:
        y = x.masked_fill(invalid, low)
        alive = y.amax(dim=-1, keepdim=True) > low if zero_dead else None
        if y.numel() < _SOFTMAX_IN_PLACE_MIN:
            y = torch.softmax(y, dim=-1)
        else:
            torch.ops.aten._softmax.out(y, -1, False, out=y)
    return y if alive is None else y.mul_(alive)


#: rows up to this long: the in-place exp/sum softmax; from this many elements: the kernel in place
_SOFTMAX_KERNEL_MIN = 48
_SOFTMAX_IN_PLACE_MIN = 1 << 18


class _ListNet(torch.autograd.Function):
    """ListNet's mean over lists with the closed-form gradient: for ``s = softmax(p)``, target ``q`` and
    ``u = q s / (s + eps)``, ``dL/dp = -(u - s sum(u)) / B`` (one pass each instead of the autograd chain
    of the masked softmax, the log and the product).

    The padded slots get probability 0 (see :func:`_masked_softmax`); a list made only of padding gets
    its target ``q`` zeroed, so it adds 0 to the value and the gradient. The softmaxes are written into
    the masked copies and the backward reuses the buffer of ``log(s + eps)``: three ``(B, n)`` buffers
    in all (the run time of this memory-bound loss is mostly that of allocating buffers).
    """

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor, t: torch.Tensor, invalid: torch.Tensor, e: float) -> torch.Tensor:
        s = _masked_softmax(p, invalid)
        q = _masked_softmax(t, invalid, zero_dead=True)  # a list without a real slot adds 0
        logs = torch.add(s, e).log_()
        if e == 0.0:  # log(0) of the padded slots (their q is 0)
            logs.masked_fill_(invalid, 0.0)
        ctx.save_for_backward(p, t, invalid)
        ctx.buffers = (q, s, logs)
        ctx.e = e
        return torch.dot(q.view(-1), logs.view(-1)).mul_(-1.0 / p.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        p, t, invalid = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: through the differentiable formulation
            return graph_vjp(_listnet_composite, grad, p, t, invalid, ctx.e), None, None, None
        q, s, u = ctx.buffers  # u: the buffer of log(s + eps), overwritten (so backward can run twice)
        torch.add(s, ctx.e, out=u)
        if ctx.e == 0.0:
            u.masked_fill_(invalid, 1.0)
        torch.div(q, u, out=u).mul_(s)
        u.addcmul_(s, u.sum(dim=-1, keepdim=True), value=-1.0)
        return u.mul_(grad / -s.shape[0]), None, None, None


def _kernel_loss(out: torch.Tensor) -> torch.Tensor:
    """A loss from the kernels of :mod:`rankwise._kernels.ltr`, which is NaN already where an input is
    not finite: the ``batch_loss`` wrapper need not check again (eager mode)."""
    if not torch.compiler.is_compiling():
        finite_checked()
    return out


def _scaled_gradient(ctx: Any, grad: torch.Tensor, recompute: Any) -> torch.Tensor:
    """The saved gradient of the mean times ``grad``: in place the first time (eager mode; it is the
    result), recomputed by ``recompute()`` when backward runs again (``retain_graph``)."""
    g = ctx.grad
    if g is None:
        return recompute() * grad
    if torch.compiler.is_compiling():
        return g * grad
    ctx.grad = None
    return g.mul_(grad)


class _ListNetKernel(torch.autograd.Function):
    """ListNet on CPU through the kernel of :mod:`rankwise._kernels.ltr`: the value and (when ``p``
    needs a gradient) the gradient of every list in one pass over its row, so the backward is one
    multiplication by the incoming gradient; double backward goes through :func:`_listnet_composite`.
    """

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor, t: torch.Tensor, ind: float, e: float, need_grad: bool) -> torch.Tensor:
        out, grad = kernels.listnet(p, t, ind, e, need_grad)
        ctx.save_for_backward(p, t)
        ctx.ind, ctx.e, ctx.grad = ind, e, grad
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        p, t = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: through the differentiable formulation
            return graph_vjp(_listnet_composite, grad, p, t, t == ctx.ind, ctx.e), None, None, None, None
        g = _scaled_gradient(ctx, grad, lambda: kernels.listnet(p, t, ctx.ind, ctx.e, True)[1])
        return g, None, None, None, None


def _shuffle(n: int, p: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"`generator` must be a torch.Generator or None, got {type(generator).__name__}")
    if generator is not None and generator.device.type != "cpu":  # a device generator draws there
        if generator.device.type != p.device.type:
            raise ValueError(f"`generator` is on {generator.device}, expected the device of y_pred ({p.device})")
        return torch.randperm(n, generator=generator, device=p.device)
    # drawn on the CPU like allRank's ``torch.randperm(n)``, so the same seed gives the same tie order;
    # copied without waiting for the device (a blocking copy would synchronize the host with it)
    return randperm_from(n, generator, device=torch.device("cpu")).to(p.device, non_blocking=True)


@batch_loss("y_pred", "y_true")
def listmle_loss(
    y_pred: torch.Tensor,
    y_true: torch.Tensor,
    *,
    eps: float = DEFAULT_EPS,
    padded_value_indicator: float = PADDED_Y_VALUE,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""ListMLE (Xia et al., ICML 2008): negative Plackett-Luce log-likelihood of the label order.

    With :math:`\pi` the real items sorted by descending label and :math:`m = \max_j \hat y_j`:

    .. math::
        L = \frac{1}{B}\sum_b \sum_{i} \Bigl[\log\Bigl(\sum_{j \ge i} e^{\hat y_{\pi(j)} - m}
            + \epsilon\Bigr) - (\hat y_{\pi(i)} - m)\Bigr]

    Ties among labels are broken at random, as in allRank: the list is shuffled with
    ``torch.randperm(n, generator=generator)`` (the global CPU generator by default, so a seed
    reproduces allRank's draw; a CUDA ``generator`` draws on the device) before a descending sort by
    label.

    Shape:
        - y_pred: :math:`(*, n)` floating; y_true: the same shape, padding ``== padded_value_indicator``.
        - output: scalar, float32 for fp16/bf16 inputs.

    Example:
        >>> import torch
        >>> from rankwise.losses import listmle_loss
        >>> listmle_loss(torch.tensor([[0.5, 0.3, 0.5]]), torch.tensor([[1.0, 0.0, -1.0]]))
        tensor(0.5981)
    """
    e = check_positive(eps, "eps", allow_zero=True)
    p, t, ind = _flat_lists(y_pred, y_true, padded_value_indicator)
    n = p.shape[-1]
    perm = _shuffle(n, p, generator)
    if p.numel() == 0:
        return _zero(p)
    if p.device.type == "cpu" and kernels.ready():
        # the label order of the shuffled list (padding last), sorted as the torch path below sorts it
        _, idx = kernels.listmle_keys(t, perm, ind).sort(descending=True, dim=-1)
        need_grad = p.requires_grad and torch.is_grad_enabled()
        return _kernel_loss(_ListMLEKernel.apply(p, perm, idx, t, ind, e, need_grad))
    valid = t != ind
    t, valid = t[:, perm], valid[:, perm]
    _, idx = sort_padding_last(t, valid)
    ps = p.gather(-1, perm[idx])
    vs = valid.gather(-1, idx)
    return _ListMLE.apply(ps, vs, e)


def _listmle_composite(ps: torch.Tensor, vs: torch.Tensor, e: float) -> torch.Tensor:
    """:class:`_ListMLE`'s value in differentiable torch ops (double backward)."""
    invalid = ~vs
    top = ps.masked_fill(invalid, float("-inf")).max(dim=-1, keepdim=True).values
    top = top.masked_fill(~vs.any(dim=-1, keepdim=True), 0.0)
    z = (ps - top).masked_fill(invalid, 0.0)
    ex = torch.exp(z).masked_fill(invalid, 0.0)
    denom = (ex.flip(-1).cumsum(dim=-1).flip(-1) + e).masked_fill(invalid, 1.0)
    return (torch.log(denom) - z).masked_fill(invalid, 0.0).sum() / ps.shape[0]


class _ListMLE(torch.autograd.Function):
    """ListMLE's mean over lists of ``sum_i log(T_i + eps) - z_i`` (``z = p - max p`` over the valid slots of
    the label-sorted list, ``T_i = sum_{j >= i} exp(z_j)``) with the closed-form gradient
    ``dL/dz_k = exp(z_k) * sum_{i <= k} 1 / (T_i + eps) - 1`` and ``-sum_k dL/dz_k`` to the arg-max
    (the path through the max, as autograd takes it: nonzero when ``eps > 0``)."""

    @staticmethod
    def forward(ctx: Any, ps: torch.Tensor, vs: torch.Tensor, e: float) -> torch.Tensor:
        invalid = ~vs
        top, arg = ps.masked_fill(invalid, float("-inf")).max(dim=-1, keepdim=True)
        top.masked_fill_(~vs.any(dim=-1, keepdim=True), 0.0)
        z = (ps - top).masked_fill_(invalid, 0.0)
        ex = torch.exp(z).masked_fill_(invalid, 0.0)
        denom = ex.flip(-1).cumsum(dim=-1).flip(-1).add_(e).masked_fill_(invalid, 1.0)
        ctx.save_for_backward(ex, denom, vs, arg, ps)
        ctx.e = e
        return (torch.log(denom) - z).masked_fill_(invalid, 0.0).sum() / ps.shape[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        ex, denom, vs, arg, ps = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: through the differentiable formulation
            return graph_vjp(_listmle_composite, grad, ps, vs, ctx.e), None, None
        gz = denom.reciprocal().masked_fill_(~vs, 0.0).cumsum(dim=-1).mul_(ex).sub_(vs.to(ex.dtype))
        gz.scatter_add_(-1, arg, -gz.sum(dim=-1, keepdim=True))
        return gz.mul_(grad / ex.shape[0]), None, None


def _listmle_ordered(
    p: torch.Tensor, perm: torch.Tensor, idx: torch.Tensor, t: torch.Tensor, ind: float, e: float
) -> torch.Tensor:
    """:class:`_ListMLEKernel`'s value in differentiable torch ops (double backward)."""
    order = perm[idx]
    return _listmle_composite(p.gather(-1, order), (t != ind).gather(-1, order), e)


class _ListMLEKernel(torch.autograd.Function):
    """ListMLE on CPU through the kernel of :mod:`rankwise._kernels.ltr`: the slots of each list in
    label order (``perm[idx[r]]``) are visited inside the kernel, which gives the value and (when
    ``p`` needs a gradient) the gradient on ``p`` in one pass per row; the backward is one
    multiplication by the incoming gradient, double backward goes through :func:`_listmle_ordered`."""

    @staticmethod
    def forward(
        ctx: Any,
        p: torch.Tensor,
        perm: torch.Tensor,
        idx: torch.Tensor,
        t: torch.Tensor,
        ind: float,
        e: float,
        need_grad: bool,
    ) -> torch.Tensor:
        out, grad = kernels.listmle(p, perm, idx, t, ind, e, need_grad)
        ctx.save_for_backward(p, perm, idx, t)
        ctx.ind, ctx.e, ctx.grad = ind, e, grad
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        p, perm, idx, t = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: through the differentiable formulation
            return graph_vjp(_listmle_ordered, grad, p, perm, idx, t, ctx.ind, ctx.e), *[None] * 6
        g = _scaled_gradient(ctx, grad, lambda: kernels.listmle(p, perm, idx, t, ctx.ind, ctx.e, True)[1])
        return g, *[None] * 6


@batch_loss("y_pred", "y_true")
def ranknet_loss(
    y_pred: torch.Tensor,
    y_true: torch.Tensor,
    *,
    padded_value_indicator: float = PADDED_Y_VALUE,
    weight_by_diff: bool = False,
    weight_by_diff_powed: bool = False,
) -> torch.Tensor:
    r"""RankNet (Burges et al., ICML 2005): logistic loss on the score difference of ordered pairs.

    Over every pair of real items of a list with :math:`y_i > y_j` (all lists together, :math:`N` pairs):

    .. math::
        L = \frac{1}{N} \sum_{(i, j)} w_{ij} \log\bigl(1 + e^{-(\hat y_i - \hat y_j)}\bigr)

    with :math:`w_{ij} = 1`, :math:`|y_i - y_j|` (``weight_by_diff``) or :math:`|y_i^2 - y_j^2|`
    (``weight_by_diff_powed``; ``weight_by_diff`` wins if both are set), as allRank's ``rankNet``
    (``BCEWithLogitsLoss(weight=w)``: the weights are not normalised). No pair gives 0 (allRank: NaN).

    Shape:
        - y_pred: :math:`(*, n)` floating; y_true: the same shape, padding ``== padded_value_indicator``.
        - output: scalar, float32 for fp16/bf16 inputs. Memory :math:`O(B n^2)`.

    Example:
        >>> import torch
        >>> from rankwise.losses import ranknet_loss
        >>> ranknet_loss(torch.tensor([[0.5, 0.2, 0.1]]), torch.tensor([[1.0, 0.0, 0.0]]))
        tensor(0.5337)
    """
    check_bool(weight_by_diff, "weight_by_diff")
    check_bool(weight_by_diff_powed, "weight_by_diff_powed")
    p, t, valid = _lists(y_pred, y_true, padded_value_indicator)
    if p.numel() == 0:
        return _zero(p)
    tt = torch.where(valid, t, 0.0)
    true_diff = tt[:, :, None] - tt[:, None, :]
    pairs = valid[:, :, None] & valid[:, None, :] & (true_diff > 0)
    losses = F.softplus(-(p[:, :, None] - p[:, None, :]))
    if weight_by_diff:
        losses = losses * true_diff.abs()
    elif weight_by_diff_powed:
        losses = losses * (tt[:, :, None] ** 2 - tt[:, None, :] ** 2).abs()
    count = pairs.sum().clamp(min=1).to(p.dtype)
    return torch.where(pairs, losses, 0.0).sum() / count


# --------------------------------------------------------------------------------------------------
# LambdaLoss and ApproxNDCG
# --------------------------------------------------------------------------------------------------
def _scheme_weights(
    scheme: str | None, g: torch.Tensor, d: torch.Tensor, mu: float, true_sorted: torch.Tensor
) -> torch.Tensor | float:
    """Pair weights :math:`w_{ij}` of the LambdaLoss weighing schemes (positions in predicted order)."""
    if scheme is None or scheme == "rankNet_scheme":
        return 1.0
    if scheme == "ndcgLoss1_scheme":
        return (g / d)[:, :, None]
    gap = (g[:, :, None] - g[:, None, :]).abs()
    inv = 1.0 / d
    lambda_rank = (inv[:, None] - inv[None, :]).abs() * gap
    if scheme == "lambdaRank_scheme":
        return lambda_rank
    if scheme in ("ndcgLoss2_scheme", "ndcgLoss2PP_scheme"):
        n = d.shape[0]
        pos = torch.arange(n, device=d.device)
        delta = (pos[:, None] - pos[None, :]).abs()
        # |1/D(|i-j|) - 1/D(|i-j|+1)| with D(r) = log2(1 + r): 0 on the diagonal
        deltas = (inv[(delta - 1).clamp(min=0)] - inv[delta]).abs() * (delta > 0)
        loss2 = deltas * gap
        return loss2 if scheme == "ndcgLoss2_scheme" else mu * loss2 + lambda_rank
    ts = true_sorted
    if scheme == "rankNetWeightedByGTDiff_scheme":
        return (ts[:, :, None] - ts[:, None, :]).abs()
    return (ts[:, :, None] ** 2 - ts[:, None, :] ** 2).abs()


@batch_loss("y_pred", "y_true")
def lambda_loss(
    y_pred: torch.Tensor,
    y_true: torch.Tensor,
    *,
    eps: float = DEFAULT_EPS,
    padded_value_indicator: float = PADDED_Y_VALUE,
    weighing_scheme: str | None = None,
    k: int | None = None,
    sigma: float = 1.0,
    mu: float = 10.0,
    reduction: str = "sum",
    reduction_log: str = "binary",
) -> torch.Tensor:
    r"""The LambdaLoss framework (Wang et al., CIKM 2018), as allRank's ``lambdaLoss``.

    Items are put in descending order of ``y_pred`` (positions :math:`i, j = 1..n`); with gains
    :math:`G_i = (2^{y_i} - 1)/\mathrm{IDCG@}k` (labels clamped at 0) and discounts
    :math:`D_i = \log_2(1 + i)`, the loss over the pairs of real items with :math:`y_i > y_j` (every
    pair for ``ndcgLoss1_scheme``) whose positions are both :math:`\le k` is

    .. math::
        L = -\sum_{(i, j)} \log_2 \Bigl(\max\bigl(\sigma(\sigma_s(\hat y_i - \hat y_j)), \epsilon\bigr)^{w_{ij}}\Bigr)

    (``reduction="mean"``: the mean over those pairs; ``reduction_log="natural"``: :math:`\ln`). The
    weights :math:`w_{ij}` of ``weighing_scheme``: ``None`` / ``"rankNet_scheme"``: 1;
    ``"ndcgLoss1_scheme"``: :math:`G_i / D_i`; ``"lambdaRank_scheme"``: :math:`|1/D_i - 1/D_j|\,|G_i - G_j|`;
    ``"ndcgLoss2_scheme"``: :math:`|1/D_{|i-j|} - 1/D_{|i-j|+1}|\,|G_i - G_j|`; ``"ndcgLoss2PP_scheme"``:
    :math:`\mu` times NDCG-Loss2's weight plus LambdaRank's; ``"rankNetWeightedByGTDiff_scheme"`` /
    ``"rankNetWeightedByGTDiffPowed_scheme"``: :math:`|y_i - y_j|` / :math:`|y_i^2 - y_j^2|`.
    Note the default ``reduction="sum"`` adds over the whole batch (allRank's convention).

    Shape:
        - y_pred: :math:`(*, n)` floating; y_true: the same shape, padding ``== padded_value_indicator``.
        - output: scalar, float32 for fp16/bf16 inputs. Memory :math:`O(B n^2)`.

    Example:
        >>> import torch
        >>> from rankwise.losses import lambda_loss
        >>> y_pred, y_true = torch.tensor([[0.5, 0.3, 0.5]]), torch.tensor([[0.5, 0.3, 0.5]])
        >>> lambda_loss(y_pred, y_true, weighing_scheme="ndcgLoss2PP_scheme")
        tensor(1.1244)
    """
    e = check_positive(eps, "eps", allow_zero=True)
    if weighing_scheme is not None:
        check_choice(weighing_scheme, "weighing_scheme", WEIGHING_SCHEMES)
    kk = _check_k(k)
    s = check_positive(sigma, "sigma")
    m = check_positive(mu, "mu", allow_zero=True)
    check_choice(reduction, "reduction", ("sum", "mean"))
    check_choice(reduction_log, "reduction_log", ("binary", "natural"))
    p, t, valid = _lists(y_pred, y_true, padded_value_indicator)
    n = p.shape[-1]
    if p.numel() == 0:
        return _zero(p)
    ps, idx = sort_padding_last(p, valid)
    vs = valid.gather(-1, idx)
    ps = torch.where(vs, ps, 0.0)
    ts = torch.where(vs, t.gather(-1, idx), 0.0)
    true_diff = ts[:, :, None] - ts[:, None, :]
    pairs = vs[:, :, None] & vs[:, None, :]
    if weighing_scheme != "ndcgLoss1_scheme":
        pairs = pairs & (true_diff > 0)
    if kk is not None and kk < n:
        top = torch.arange(n, device=p.device) < kk
        pairs = pairs & top[:, None] & top[None, :]
    ts0 = ts.clamp(min=0.0)
    d = _discounts(n, p)
    max_dcg = _ideal_dcg(t, valid, kk, powered=True).clamp(min=e)
    g = (torch.pow(2.0, ts0) - 1.0) / max_dcg[:, None]
    weights = _scheme_weights(weighing_scheme, g, d, m, ts0)
    diffs = (ps[:, :, None] - ps[:, None, :]).clamp_(min=-1e8, max=1e8)
    probas = torch.sigmoid(diffs if s == 1.0 else diffs.mul_(s)).clamp(min=e)
    log = torch.log2 if reduction_log == "binary" else torch.log
    if isinstance(weights, float) and weights == 1.0:  # x ** 1 and its clamp are x (value and gradient)
        logs = log(probas)
    elif e > 0.0:
        # log(max(p^w, eps)) = max(w log p, log eps) for p >= eps > 0 and w >= 0 (value, and the gradient
        # w / p where p^w > eps): no pow, whose forward and backward are the dearest passes over the pairs
        logs = log(probas).mul_(weights).clamp_(min=math.log2(e) if reduction_log == "binary" else math.log(e))
    else:  # (0 ** 0 is 1: the pow keeps a pair of weight 0 at log 1 = 0 when a probability is 0)
        logs = log((probas**weights).clamp(min=e))
    total = -torch.where(pairs, logs, 0.0).sum()
    if reduction == "mean":
        return total / pairs.sum().clamp(min=1).to(total.dtype)
    return total


@batch_loss("y_pred", "y_true")
def approx_ndcg_loss(
    y_pred: torch.Tensor,
    y_true: torch.Tensor,
    *,
    eps: float = DEFAULT_EPS,
    padded_value_indicator: float = PADDED_Y_VALUE,
    alpha: float = 1.0,
) -> torch.Tensor:
    r"""ApproxNDCG (Qin et al., Information Retrieval 2010), as allRank's ``approxNDCGLoss``.

    The rank of item :math:`i` is approximated by a sum of sigmoids over the other real items,
    :math:`\hat\pi_i = 1 + \sum_{j \ne i} \max(\sigma(-\alpha(\hat y_i - \hat y_j)), \epsilon)`, and

    .. math::
        L = -\frac{1}{B} \sum_b \sum_i \frac{2^{y_i} - 1}{\mathrm{IDCG}\,\log_2(1 + \hat\pi_i)}

    (labels clamped at 0, IDCG over the whole list clamped at :math:`\epsilon`; no truncation).
    Lists without a relevant item or made only of padding add 0 and count in :math:`B`.

    Shape:
        - y_pred: :math:`(*, n)` floating; y_true: the same shape, padding ``== padded_value_indicator``.
        - output: scalar, float32 for fp16/bf16 inputs. Memory :math:`O(B n^2)`.

    Example:
        >>> import torch
        >>> from rankwise.losses import approx_ndcg_loss
        >>> approx_ndcg_loss(torch.tensor([[0.5, 0.3, 0.5]]), torch.tensor([[0.5, 0.3, 0.5]]))
        tensor(-0.8499)
    """
    e = check_positive(eps, "eps", allow_zero=True)
    a = check_positive(alpha, "alpha")
    p, t, valid = _lists(y_pred, y_true, padded_value_indicator)
    n = p.shape[-1]
    if p.numel() == 0:
        return _zero(p)
    max_dcg = _ideal_dcg(t, valid, None, powered=True).clamp(min=e)
    g = (torch.pow(2.0, torch.where(valid, t, 0.0).clamp(min=0.0)) - 1.0) / max_dcg[:, None]
    pairs = valid[:, :, None] & valid[:, None, :] & ~torch.eye(n, dtype=torch.bool, device=p.device)
    # -a (s_i - s_j) as a (s_j - s_i) (the same floats); the pairs outside the mask are multiplied by 0
    diffs = p[:, None, :] - p[:, :, None]
    approx_pos = 1.0 + (pairs * torch.sigmoid(diffs if a == 1.0 else diffs.mul_(a)).clamp(min=e)).sum(dim=-1)
    return -(g / torch.log2(1.0 + approx_pos)).sum(dim=-1).mean()


# --------------------------------------------------------------------------------------------------
# NeuralNDCG
# --------------------------------------------------------------------------------------------------
def _masked_neural_sort(s: torch.Tensor, valid: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    r"""NeuralSort of the real items of each list (rows: positions ``0..n_valid-1``), 0 elsewhere.

    The padded slots get a score :math:`f` below every real score of their list. For a real item,
    :math:`A_s\mathbf 1` then gains :math:`m (s_i - f)` (:math:`m` padded slots), which with the
    row coefficient :math:`n + 1 - 2r` gives :math:`(n_{valid} + 1 - 2r) s_i - \sum_{valid} |s_i - s_k|`
    plus a constant of the row: restricted to the real columns, rows :math:`r \le n_{valid}` are
    exactly NeuralSort of the real items alone (the zeroed padded columns are renormalised by the
    Sinkhorn scaling that follows), whatever the position of the padding in the list.
    """
    big = torch.finfo(s.dtype).max
    # strictly below the smallest real score: |s_i - f| must not sit at the kink of abs for any real item
    f = torch.where(valid, s.detach(), big).amin(dim=-1, keepdim=True) - 1.0
    f = torch.where(valid.any(dim=-1, keepdim=True), f, torch.zeros_like(f))
    p = neural_sort(torch.where(valid, s, f), tau=tau)
    n = s.shape[-1]
    rows = torch.arange(n, device=s.device)[:, None] < valid.sum(dim=-1)[..., None, None]
    p = torch.where(rows & valid[..., None, :], p, 0.0)
    return p / torch.where(rows, p.sum(dim=-1, keepdim=True).clamp(min=1e-10), 1.0)


def _sinkhorn_scaling(mat: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Alternate column / row normalisation of the blocks ``rows x cols`` (allRank's Sinkhorn scaling:
    at most 50 iterations, tolerance 1e-6).

    allRank stops at the first iteration whose row and column sums are all within the tolerance of 1
    over the whole batch. On the CPU the loop stops there too (reading the flag is no device sync); on
    other devices and under ``torch.compile`` (a traced graph has no data-dependent branch) it runs the
    full 50 iterations without a host read, the iterations after the stop leaving the matrices
    unchanged. Either way values and gradients are allRank's.

    The constants are literals (not module globals or default arguments): ``torch.compile(dynamic=True)``
    lifts a global or default float into a symbolic graph input, and a hundred uses of symbolic floats
    over the unrolled iterations made its tracing take minutes. Each iteration's column sums are those
    the next iteration divides by (the same tensor, so the same floats as allRank's two reductions).
    """
    early = mat.device.type == "cpu" and not torch.compiler.is_compiling()
    done = torch.zeros((), dtype=torch.bool, device=mat.device)
    col_in, row_in = cols[..., None, :], rows[..., :, None]
    col_sum = mat.sum(dim=-2, keepdim=True)
    for _ in range(50):
        # outside the blocks the sums are 0: divide by 1 there (a clamped 0 would scale gradients by 1e10)
        cand = mat / torch.where(col_in, col_sum.clamp(min=1e-10), 1.0)
        cand = cand / torch.where(row_in, cand.sum(dim=-1, keepdim=True).clamp(min=1e-10), 1.0)
        mat = cand if early else torch.where(done, mat, cand)
        col_sum = mat.sum(dim=-2, keepdim=True)
        with torch.no_grad():  # the stopping check needs no graph
            row_err = torch.where(rows, (mat.sum(dim=-1) - 1.0).abs(), 0.0)
            col_err = torch.where(cols, (col_sum.squeeze(-2) - 1.0).abs(), 0.0)
            done = done | ((row_err < 1e-6).all() & (col_err < 1e-6).all())
        if early and bool(done):
            break
    return mat


def _batch_shift(p: torch.Tensor) -> torch.Tensor:
    """allRank's shift of the stochastic scores, ``|min p|`` over the whole batch, as a ``(B, 1)`` column.

    The minimum is taken over the finite scores only and its gradient reaches the lists without a
    non-finite score only, so that a NaN or ±inf score makes its own list NaN (loss and gradient) and
    leaves the other lists' gradients finite, as in the deterministic NeuralNDCG; on a finite batch the
    value is ``p.min().abs()`` and the gradient that of ``torch.min`` (shared evenly by tied minima). The
    gradient is routed by ``torch.where`` rather than multiplied by a mask (``NaN * 0`` is NaN): the
    same NaN pattern in eager mode and under ``torch.compile``, whose trace of ``torch.min``'s backward
    multiplies by the mask of the minima.
    """
    pd = p.detach()
    finite = torch.isfinite(pd)
    low = torch.where(finite, pd, math.inf).amin()
    at_low = finite & (pd == low)
    # exactly 0 in the forward pass (p == low there); the gradient of torch.min in the backward pass
    tie_share = torch.where(at_low, p - low, 0.0).sum() / at_low.sum().clamp(min=1)
    shift = (low + tie_share).abs()
    return torch.where(finite.all(dim=-1, keepdim=True), shift, shift.detach())


def _gumbel_like(shape: tuple[int, ...], like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Gumbel(0, 1) noise drawn like allRank's ``sample_gumbel`` (float32 uniforms, eps 1e-10)."""
    u = rand_from(shape, generator, device=like.device if generator is None else generator.device)
    return (-torch.log(-torch.log(u + 1e-10) + 1e-10)).to(device=like.device, dtype=like.dtype)


@batch_loss("y_pred", "y_true")
def neural_ndcg_loss(
    y_pred: torch.Tensor,
    y_true: torch.Tensor,
    *,
    padded_value_indicator: float = PADDED_Y_VALUE,
    temperature: float = 1.0,
    powered_relevancies: bool = True,
    k: int | None = None,
    stochastic: bool = False,
    n_samples: int = 32,
    beta: float = 0.1,
    log_scores: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""NeuralNDCG (Pobrotyn & Białobrzeski, 2021), as allRank's ``neuralNDCG``.

    The permutation matrix of the descending sort of each list is relaxed by rankwise's
    :func:`~rankwise.ops.neural_sort` at ``temperature`` (real items only) and made doubly stochastic
    by Sinkhorn scaling (at most 50 iterations, tolerance 1e-6); the relaxed sort of the gains
    :math:`\hat g = \hat P g`, :math:`g = 2^y - 1` (``powered_relevancies``) or :math:`y`, gives

    .. math::
        L = -\frac{1}{|\mathcal B|} \sum_{b \in \mathcal B}
            \frac{\sum_{r=1}^{k} \hat g_r / \log_2(r + 1)}{\mathrm{IDCG@}k + 10^{-10}}

    over the lists :math:`\mathcal B` with IDCG > 0 (0 if there is none). ``stochastic=True``
    averages ``n_samples`` relaxations of Gumbel-perturbed scores
    :math:`\log(\hat y + |\min \hat y| + 10^{-10}) + \beta g` (``log_scores``; without the log otherwise;
    the min over the whole batch as in allRank), the noise drawn from ``generator`` (or the global
    generator) with allRank's shapes, so a seed reproduces its draw. Under
    ``torch.compile(fullgraph=True)`` leave ``generator=None`` and seed with ``torch.manual_seed``: a
    ``torch.Generator`` cannot be a graph input (docs/architecture.md, "torch.compile").

    Non-finite scores: a NaN or ±inf score of a real item makes the loss NaN (the rule of every
    learning-to-rank loss here) and the gradient NaN on the real slots of its own list, finite on the
    other lists; in eager mode and under ``torch.compile`` alike. With ``stochastic=True`` the batch
    minimum of the shift is taken over the finite scores (the same value on a finite batch; allRank's
    minimum of a batch holding a NaN or ``-inf`` is NaN or ``-inf`` and makes every list NaN), and the
    lists holding a non-finite score pass no gradient to it.

    Shape:
        - y_pred: :math:`(*, n)` floating; y_true: the same shape, padding ``== padded_value_indicator``.
        - output: scalar, float32 for fp16/bf16 inputs. Memory :math:`O(S B n^2)` (:math:`S` samples).

    Example:
        >>> import torch
        >>> from rankwise.losses import neural_ndcg_loss
        >>> y_pred = torch.tensor([[0.5, 0.2, 0.1, 0.4, 1.0, -1.0, 0.63]])
        >>> y_true = torch.tensor([[1.0, 2.0, 2.0, 4.0, 1.0, 4.0, 3.0]])
        >>> neural_ndcg_loss(y_pred, y_true, temperature=1e-4)
        tensor(-0.6303)
    """
    tau = check_positive(temperature, "temperature")
    check_bool(powered_relevancies, "powered_relevancies")
    kk = _check_k(k)
    check_bool(stochastic, "stochastic")
    samples = check_positive_int(n_samples, "n_samples")
    b = check_positive(beta, "beta", allow_zero=True)
    check_bool(log_scores, "log_scores")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"`generator` must be a torch.Generator or None, got {type(generator).__name__}")
    p, t, valid = _lists(y_pred, y_true, padded_value_indicator)
    bsz, n = p.shape
    if p.numel() == 0:
        return _zero(p)
    if stochastic:
        s = p + _batch_shift(p)
        if log_scores:
            s = torch.log(s + 1e-10)
        s = s.unsqueeze(0) + b * _gumbel_like((samples, bsz, n), p, generator)
        mask = valid.expand(samples, bsz, n)
    else:
        s, mask = p.unsqueeze(0), valid.unsqueeze(0)
    rows = torch.arange(n, device=p.device) < valid.sum(dim=-1, keepdim=True)
    mat = _sinkhorn_scaling(_masked_neural_sort(s, mask, tau), rows.expand_as(mask), mask)
    gains = torch.where(valid, t, 0.0)
    if powered_relevancies:
        gains = torch.pow(2.0, gains) - 1.0
    sorted_gains = (mat @ gains.unsqueeze(-1)).squeeze(-1)
    dcg = (sorted_gains / _discounts(n, p))[..., :kk].sum(dim=-1)
    idcg = _ideal_dcg(t, valid, kk, powered=powered_relevancies)
    has = idcg != 0
    ndcg = torch.where(has, dcg / (idcg + 1e-10), 0.0)
    count = has.sum().clamp(min=1).to(p.dtype) * ndcg.shape[0]
    return -ndcg.sum() / count


# --------------------------------------------------------------------------------------------------
# PiRank
# --------------------------------------------------------------------------------------------------
def _permutation_matrix(
    s: torch.Tensor, valid: torch.Tensor, method: str, options: dict[str, Any]
) -> torch.Tensor | None:
    """Relaxed descending permutation matrix (row r selects the r-th largest) of the methods that have one."""
    if method == "neuralsort":
        return _masked_neural_sort(s, valid, **options)
    if method == "softsort":
        return softsort_matrix(s, **options)
    if method == "diffsort":
        _, pm = diffsort(s, **options)
        # diffsort: sort(x) = x @ P ascending; row r of the descending matrix is column n-1-r of P
        return pm.transpose(-1, -2).flip(-2)
    return None


@batch_loss("y_pred", "y_true")
def pirank_ndcg_loss(
    y_pred: torch.Tensor,
    y_true: torch.Tensor,
    *,
    method: str = "neuralsort",
    k: int | None = None,
    powered_relevancies: bool = True,
    padded_value_indicator: float = PADDED_Y_VALUE,
    **method_options: Any,
) -> torch.Tensor:
    r"""PiRank's NDCG@k surrogate (Swezey et al., NeurIPS 2021) through any soft sort of rankwise.

    PiRank relaxes the sorting permutation of the scores (NeuralSort in the paper) and computes
    NDCG@k on the relaxed sort of the gains, :math:`\hat g = \hat P g`:

    .. math::
        L = 1 - \frac{1}{|\mathcal B|}\sum_{b \in \mathcal B}
            \frac{\sum_{r=1}^{k} \hat g_r / \log_2(r + 1)}{\mathrm{IDCG@}k}

    over the lists with IDCG > 0 (0 if there is none). ``method`` is any method of
    :func:`rankwise.soft_rank`; ``"neuralsort"`` (default; option ``tau``), ``"softsort"`` and
    ``"diffsort"`` give :math:`\hat P` and use the formula above; the others (``"isotonic"``,
    ``"sinkhorn"``, ...) give soft ranks :math:`\hat r_i` and the gain of item :math:`i` is discounted
    at its soft rank, :math:`\sum_i g_i\, \min(1, \max(0, k + 1 - \hat r_i)) / \log_2(1 + \hat r_i)`
    (exact NDCG@k at exact ranks). ``method_options`` go to the method (e.g. ``tau=0.1``,
    ``regularization_strength=0.1``). Padded slots have gain 0; NeuralSort relaxes the real items
    alone (rows of the real positions, renormalised over the real items), the other methods see the
    padded slots as items scored below every real one (a small shift of the real items' soft ranks).

    Shape:
        - y_pred: :math:`(*, n)` floating; y_true: the same shape, padding ``== padded_value_indicator``.
        - output: scalar, float32 for fp16/bf16 inputs.

    Example:
        >>> import torch
        >>> from rankwise.losses import pirank_ndcg_loss
        >>> y_pred, y_true = torch.tensor([[2.0, 0.0, 1.0]]), torch.tensor([[2.0, 0.0, 1.0]])
        >>> pirank_ndcg_loss(y_pred, y_true, tau=1e-3).abs() < 1e-6
        tensor(True)
        >>> round(float(pirank_ndcg_loss(y_pred, y_true, method="isotonic", regularization_strength=1e-3)), 6)
        0.0
    """
    check_choice(method, "method", list_soft_methods())
    kk = _check_k(k)
    check_bool(powered_relevancies, "powered_relevancies")
    p, t, valid = _lists(y_pred, y_true, padded_value_indicator)
    n = p.shape[-1]
    if p.numel() == 0:
        return _zero(p)
    # padded slots: below every real score (with its gradient: the relaxations other than NeuralSort
    # let them shift the real items' soft positions a little); NeuralSort excludes them exactly
    lo = torch.where(valid, p, torch.finfo(p.dtype).max).amin(dim=-1, keepdim=True)
    hi = torch.where(valid, p, -torch.finfo(p.dtype).max).amax(dim=-1, keepdim=True)
    fill = torch.where(valid.any(dim=-1, keepdim=True), lo - (hi - lo) - 1.0, torch.zeros_like(lo))
    s = torch.where(valid, p, fill)
    gains = torch.where(valid, t, 0.0).clamp(min=0.0)
    if powered_relevancies:
        gains = torch.pow(2.0, gains) - 1.0
    d = _discounts(n, p)
    mat = _permutation_matrix(s, valid, method, method_options)
    if mat is not None:
        dcg = ((mat.to(p.dtype) @ gains.unsqueeze(-1)).squeeze(-1) / d)[..., :kk].sum(dim=-1)
    else:
        r = soft_rank(s, method=method, descending=True, **method_options).to(p.dtype)
        cut = (float(kk if kk is not None else n) + 1.0 - r).clamp(0.0, 1.0)
        dcg = (gains * cut / torch.log2(1.0 + r.clamp(min=1.0))).sum(dim=-1)
    idcg = _ideal_dcg(t, valid, kk, powered=powered_relevancies)
    has = idcg > 0
    ndcg = torch.where(has, dcg / torch.where(has, idcg, 1.0), 0.0)
    count = has.sum().clamp(min=1).to(p.dtype)
    return torch.where(has.any(), 1.0 - ndcg.sum() / count, 0.0) + _zero(p)


# --------------------------------------------------------------------------------------------------
# Module twins
# --------------------------------------------------------------------------------------------------
class _Twin(FunctionModule):
    """Module twin of a functional loss: the constructor's keyword-only options (``_options``, read from
    the subclass's ``__init__`` signature) are stored as attributes and passed on; ``repr`` shows each as
    ``name=repr(value)``, then the ``**`` options (``_kwargs``) where the twin takes them."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        params = inspect.signature(cls.__init__).parameters.values()
        cls._options = tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)
        cls._shown = (*(f"{name}!r" for name in cls._options), *(("**",) if cls._kwargs is not None else ()))

    def __init__(self, **options: Any) -> None:
        super().__init__()
        for name, value in options.items():
            setattr(self, name, value)


class ListNetLoss(_Twin):
    """Module twin of :func:`listnet_loss` (keyword options as the function)."""

    _function = staticmethod(listnet_loss)

    def __init__(self, *, eps: float = DEFAULT_EPS, padded_value_indicator: float = PADDED_Y_VALUE) -> None:
        super().__init__(eps=eps, padded_value_indicator=padded_value_indicator)


class ListMLELoss(_Twin):
    """Module twin of :func:`listmle_loss` (keyword options as the function)."""

    _function = staticmethod(listmle_loss)

    def __init__(
        self,
        *,
        eps: float = DEFAULT_EPS,
        padded_value_indicator: float = PADDED_Y_VALUE,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(eps=eps, padded_value_indicator=padded_value_indicator, generator=generator)


class RankNetLoss(_Twin):
    """Module twin of :func:`ranknet_loss` (keyword options as the function)."""

    _function = staticmethod(ranknet_loss)

    def __init__(
        self,
        *,
        padded_value_indicator: float = PADDED_Y_VALUE,
        weight_by_diff: bool = False,
        weight_by_diff_powed: bool = False,
    ) -> None:
        super().__init__(
            padded_value_indicator=padded_value_indicator,
            weight_by_diff=weight_by_diff,
            weight_by_diff_powed=weight_by_diff_powed,
        )


class LambdaLoss(_Twin):
    """Module twin of :func:`lambda_loss` (keyword options as the function)."""

    _function = staticmethod(lambda_loss)

    def __init__(
        self,
        *,
        eps: float = DEFAULT_EPS,
        padded_value_indicator: float = PADDED_Y_VALUE,
        weighing_scheme: str | None = None,
        k: int | None = None,
        sigma: float = 1.0,
        mu: float = 10.0,
        reduction: str = "sum",
        reduction_log: str = "binary",
    ) -> None:
        super().__init__(
            eps=eps,
            padded_value_indicator=padded_value_indicator,
            weighing_scheme=weighing_scheme,
            k=k,
            sigma=sigma,
            mu=mu,
            reduction=reduction,
            reduction_log=reduction_log,
        )


class ApproxNDCGLoss(_Twin):
    """Module twin of :func:`approx_ndcg_loss` (keyword options as the function)."""

    _function = staticmethod(approx_ndcg_loss)

    def __init__(
        self, *, eps: float = DEFAULT_EPS, padded_value_indicator: float = PADDED_Y_VALUE, alpha: float = 1.0
    ) -> None:
        super().__init__(eps=eps, padded_value_indicator=padded_value_indicator, alpha=alpha)


class NeuralNDCGLoss(_Twin):
    """Module twin of :func:`neural_ndcg_loss` (keyword options as the function)."""

    _function = staticmethod(neural_ndcg_loss)

    def __init__(
        self,
        *,
        padded_value_indicator: float = PADDED_Y_VALUE,
        temperature: float = 1.0,
        powered_relevancies: bool = True,
        k: int | None = None,
        stochastic: bool = False,
        n_samples: int = 32,
        beta: float = 0.1,
        log_scores: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(
            padded_value_indicator=padded_value_indicator,
            temperature=temperature,
            powered_relevancies=powered_relevancies,
            k=k,
            stochastic=stochastic,
            n_samples=n_samples,
            beta=beta,
            log_scores=log_scores,
            generator=generator,
        )


class PiRankNDCGLoss(_Twin):
    """Module twin of :func:`pirank_ndcg_loss` (keyword options as the function)."""

    _function = staticmethod(pirank_ndcg_loss)
    _kwargs = "method_options"

    def __init__(
        self,
        *,
        method: str = "neuralsort",
        k: int | None = None,
        powered_relevancies: bool = True,
        padded_value_indicator: float = PADDED_Y_VALUE,
        **method_options: Any,
    ) -> None:
        super().__init__(
            method=method,
            k=k,
            powered_relevancies=powered_relevancies,
            padded_value_indicator=padded_value_indicator,
            method_options=method_options,
        )


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------


def _register(name: str, fn: Any, module: type[nn.Module], *, stochastic: bool = False, description: str = "") -> None:
    register_loss(
        name,
        module=module,
        stochastic=stochastic,
        description=description,
        inputs={"y_pred": "predictions", "y_true": "targets"},
        takes="padded_lists",
    )(fn)


_register("listnet", listnet_loss, ListNetLoss, description="ListNet (allRank listNet)")
_register("listmle", listmle_loss, ListMLELoss, stochastic=True, description="ListMLE (allRank listMLE)")
_register("ranknet", ranknet_loss, RankNetLoss, description="RankNet (allRank rankNet)")
_register(
    "lambda_loss", lambda_loss, LambdaLoss, description="LambdaLoss, option `weighing_scheme` (allRank lambdaLoss)"
)
_register("approx_ndcg", approx_ndcg_loss, ApproxNDCGLoss, description="ApproxNDCG (allRank approxNDCGLoss)")
_register(
    "neural_ndcg",
    neural_ndcg_loss,
    NeuralNDCGLoss,
    description="NeuralNDCG with rankwise NeuralSort and Sinkhorn scaling (allRank neuralNDCG)",
)
_register(
    "pirank",
    pirank_ndcg_loss,
    PiRankNDCGLoss,
    description="PiRank NDCG@k surrogate through a soft sort (option `method`)",
)
