r"""Retrieval losses on embeddings and class labels: Smooth-AP, blackbox AP, Recall@k surrogate, FastAP.

Every loss treats each embedding of the batch as a query and the batch as its retrieval set, with
cosine similarity (the embeddings are L2-normalized first), positives = items of the query's label.
Conventions shared by the four losses:

* ``include_query`` (Smooth-AP, blackbox AP, Recall@k): ``True`` reproduces the authors' code, in
  which the query is also an item of its own retrieval set (similarity 1 to itself, so it ranks first);
  ``False`` uses the rest of the batch only, as the papers' equations are written.
* The loss is the mean over the queries that have at least one positive; a batch without any gives a
  zero that keeps the graph.
* ``distributed=True`` / ``"auto"`` (see :mod:`rankwise.distributed`): embeddings (with gradient) and
  labels of all ranks are gathered, this rank's embeddings are the queries and the retrieval set is the
  **global** batch; each rank returns ``world_size * (sum over its queries) / (valid queries of all
  ranks)`` (the mean over ranks is the single-process loss, and DDP's gradient averaging gives the
  single-process gradient). Blackbox AP puts the ``world_size`` factor on the gradient of the gathered
  embeddings instead (its surrogate gradient is not linear in the incoming gradient).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rankwise._random import rand_from, randn_from
from rankwise._twin import FunctionModule
from rankwise._validation import (
    batch_loss,
    check_bool,
    check_floating,
    check_generator,
    check_positive,
    check_positive_int,
    to_compute,
)
from rankwise.distributed import (
    DistributedFlag,
    all_gather_no_grad,
    all_gather_with_grad,
    all_reduce_sum,
    batch_layout,
    get_world_size,
    global_batch_on,
    scale_grad,
)
from rankwise.losses._contrastive_common import as_labels, safe_normalize, zero_with_graph
from rankwise.losses._registry import register_loss
from rankwise.ops.ranking import BlackboxRankFunction, rank_last

__all__ = [
    "BlackboxAPLoss",
    "FastAPLoss",
    "RecallAtKLoss",
    "SmoothAPLoss",
    "blackbox_ap_loss",
    "fastap_loss",
    "recall_at_k_loss",
    "smooth_ap_loss",
]

# Smooth-AP and Recall@k build a (queries, anchors, N) tensor of pairwise sigmoids (the anchors: the
# items whose soft rank the loss needs, see `_anchors`): queries are processed in blocks of at most
# this many elements; the gradient on the similarities is formed per block in forward (analytic) and
# kept, (B, B).
_BLOCK_ELEMENTS = 1 << 22


@dataclass
class _Batch:
    """Queries (this rank's rows) against the retrieval set (the local or global batch)."""

    sim: torch.Tensor  # (m, N) cosine similarities
    pos: torch.Tensor  # (m, N) bool: same label, the query itself excluded
    own: torch.Tensor  # (m, N) bool: the query's own column
    world: int  # ranks (1 without DDP)
    zg: torch.Tensor  # the gathered, normalized embeddings (for a zero that keeps the graph)


def _check_embeddings(embeddings: Any) -> torch.Tensor:
    check_floating(embeddings, "embeddings")
    if embeddings.dim() != 2:
        raise ValueError(
            f"`embeddings` must have shape (B, D), got shape {tuple(embeddings.shape)} ({embeddings.dim()} dims)"
        )
    return embeddings


def _batch(
    embeddings: torch.Tensor, labels: torch.Tensor, distributed: DistributedFlag, *, grad_scale: bool = False
) -> _Batch:
    """Normalize, gather under DDP (``grad_scale``: multiply the gathered gradient by the world size)."""
    x = _check_embeddings(embeddings)
    b = x.shape[0]
    y = as_labels(labels, b).detach()
    z = safe_normalize(to_compute(x), dim=1)
    world, rows = 1, slice(None)
    zg, yg = z, y
    if global_batch_on(distributed):
        world = get_world_size()
        layout = batch_layout(b, device=x.device)
        zg = all_gather_with_grad(z, sizes=layout)
        if grad_scale:
            zg = scale_grad(zg, world)
        yg = all_gather_no_grad(y, sizes=layout)
        rows = layout.local
    n = zg.shape[0]
    q_index = torch.arange(n, device=x.device)[rows]
    own = q_index[:, None] == torch.arange(n, device=x.device)[None, :]
    sim = zg[rows] @ zg.T
    pos = (yg[rows][:, None] == yg[None, :]) & ~own
    return _Batch(sim, pos, own, world, zg)


def _mean_over_valid(per_query: torch.Tensor, valid: torch.Tensor, bt: _Batch, *, scale: bool = True) -> torch.Tensor:
    """Mean of ``per_query`` over ``valid`` queries (of all ranks: world * local sum / global count;
    without ``scale`` the world factor is left out)."""
    per_query = torch.where(valid, per_query, torch.zeros_like(per_query))
    count = valid.sum().to(per_query.dtype)
    if bt.world > 1:
        count = all_reduce_sum(count)
    total = per_query.sum() / count.clamp(min=1)
    return (total * bt.world if scale else total) + zero_with_graph(bt.zg)


class _PerQuery(torch.autograd.Function):
    """Per-query values of a block function with their gradients on the similarities formed in forward.

    ``block_fn(sim, *masks, need_grad) -> (values (c,), grads (c, N) or None)`` runs on blocks of
    query rows (at most ``_BLOCK_ELEMENTS`` elements of the (c, P, N) pairwise tensor each, ``P`` the
    width of the last mask: the anchors); each value depends on its own row of ``sim`` only, so
    backward is one multiplication by the saved (m, N) gradients: memory O(block + m N) and no
    recomputation.
    """

    @staticmethod
    def forward(ctx: Any, sim: torch.Tensor, block_fn: Any, need_grad: bool, *masks: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        values, grads = _blocks(sim, block_fn, need_grad, masks)
        if need_grad:
            ctx.save_for_backward(grads)
        return values

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_values: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        (grads,) = ctx.saved_tensors
        return (grads * grad_values[:, None], None, None, *[None] * (len(ctx.needs_input_grad) - 3))


def _blocks(
    sim: torch.Tensor, block_fn: Any, need_grad: bool, masks: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``block_fn`` over blocks of query rows: the per-query values and (``need_grad``) their gradients."""
    m, n = sim.shape
    width = masks[-1].shape[1] if masks else n  # the anchors per query (the last mask)
    step = max(1, _BLOCK_ELEMENTS // max(1, width * n))
    values, grads = [], []
    for start in range(0, max(m, 1), step):
        rows = slice(start, start + step)
        v, g = block_fn(sim[rows], *[t[rows] for t in masks], need_grad)
        values.append(v)
        if g is not None:
            grads.append(g)
    return torch.cat(values, 0), (torch.cat(grads, 0) if need_grad else None)


def _per_query(block_fn: Any, sim: torch.Tensor, *masks: torch.Tensor) -> torch.Tensor:
    need_grad = sim.requires_grad and torch.is_grad_enabled()
    if not need_grad:  # no autograd.Function: dynamo inlines one without grad and loses its arguments
        return _blocks(sim, block_fn, False, masks)[0]
    return _PerQuery.apply(sim, block_fn, need_grad, *masks)


def _anchors(pos: torch.Tensor, *, gather: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The items whose soft rank is needed, per query: ``(index (m, P), mask (m, P))``.

    Both losses use the ranks of the positives only. In eager CPU code they are gathered: ``P`` is the
    largest number of positives of a query (one host read of it, free on the CPU), the rows with fewer
    are padded and masked, so the pairwise tensor is (queries, P, N) instead of (queries, N, N): for
    batches of classes of ``m`` items, ``O(B^2 m)`` sigmoids instead of ``O(B^3)``. Elsewhere (other
    devices: no host synchronization; a traced graph: no data-dependent shape) every item is an
    anchor, masked by ``pos``. Same values either way (the other rows are multiplied by 0). ``gather``
    forces one way (None: as just said)."""
    m, n = pos.shape
    if gather is None:
        gather = pos.device.type == "cpu" and not torch.compiler.is_compiling()
    if not gather:
        return torch.arange(n, device=pos.device).expand(m, n), pos
    counts = pos.sum(dim=1)
    width = max(1, int(counts.max())) if m else 1
    index = torch.argsort(pos.to(torch.uint8), dim=1, descending=True, stable=True)[:, :width]
    return index, torch.arange(width, device=pos.device) < counts[:, None]


def _pair_sigmoids(sim: torch.Tensor, index: torch.Tensor, tau: float) -> torch.Tensor:
    """(c, P, N): ``[q, a, j] = sigmoid((s_qj - s_qi) / tau)`` for the anchor ``i = index[q, a]``
    (item ``j`` ranked above item ``i``)."""
    scaled = sim / tau
    return torch.sub(scaled[:, None, :], scaled.gather(1, index)[:, :, None]).sigmoid_()


def _through_ranks(
    sig: torch.Tensor, sets: torch.Tensor, weights: torch.Tensor, index: torch.Tensor, tau: float
) -> torch.Tensor:
    r"""Gradient on the similarities (c, N) of :math:`\sum_{a,k} w_{ak} r_{ak}` with the soft ranks
    :math:`r_{ak} = 1 + \sum_j \sigma_{aj} S_{jk}` of the anchors :math:`i_a` (``index``; ``sets`` S
    (c, N, K), ``weights`` w (c, P, K)).

    :math:`\partial \sigma_{aj} / \partial s_j = -\partial \sigma_{aj} / \partial s_{i_a} = \sigma'_{aj} / \tau`
    with :math:`\sigma' = \sigma (1 - \sigma)`, so the gradient is
    :math:`(\sum_k S_{jk} (\sigma'^\top w_k)_j - [\sum_k w_{ak} (\sigma' S_k)_a \text{ at } i_a]) / \tau`:
    two batched products with K columns and a scatter (the constant :math:`\sigma_{a i_a} = 1/2` terms cancel).
    """
    deriv = torch.addcmul(sig, sig, sig, value=-1.0)  # sigma (1 - sigma) in one pass
    cols = torch.bmm(deriv.transpose(1, 2), weights)
    rows = torch.bmm(deriv, sets)
    grad = (sets * cols).sum(2)
    return grad.scatter_add_(1, index, (weights * rows).sum(2).neg_()).div_(tau)


def _soft_ranks(sig: torch.Tensor, sets: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    r"""(c, P, K): :math:`1 + \sum_{j \in S_k, j \ne i} \sigma_{ij}` for each anchor ``i`` (``index``)
    and each of the ``K`` item sets ``sets`` ((c, N, K) 0/1 in the compute dtype)."""
    # the j = i term is sigmoid(0) = 1/2 for every anchor that belongs to the set
    own = sets.gather(1, index[..., None].expand(-1, -1, sets.shape[2]))
    return 1.0 + torch.bmm(sig, sets) - 0.5 * own


def _retrieval_set(bt: _Batch, include_query: bool) -> torch.Tensor:
    """(m, N) bool: the items ranked for each query (all but the query itself unless ``include_query``)."""
    return torch.ones_like(bt.own) if include_query else ~bt.own


# --------------------------------------------------------------------------------------------------
# Smooth-AP
# --------------------------------------------------------------------------------------------------
def _smooth_ap_block(
    sim: torch.Tensor,
    omega: torch.Tensor,
    pos: torch.Tensor,
    index: torch.Tensor,
    anchor: torch.Tensor,
    tau: float,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Smooth-AP of each query of the block and (``need_grad``) its gradient on the similarities; the
    anchors ``index`` (masked by ``anchor``) are the positives."""
    sig = _pair_sigmoids(sim, index, tau)
    sets = torch.stack([omega, pos], dim=2)
    ranks = _soft_ranks(sig, sets, index)
    r_all, r_pos = ranks[..., 0], ranks[..., 1]
    inv_np = 1.0 / pos.sum(1, keepdim=True).clamp(min=1)
    ap = (anchor * r_pos / r_all * inv_np).sum(1)
    if not need_grad:
        return ap, None
    w_pos = anchor / r_all * inv_np  # d ap / d r_pos
    w_all = -w_pos * r_pos / r_all  # d ap / d r_all
    return ap, _through_ranks(sig, sets, torch.stack([w_all, w_pos], dim=2), index, tau)


@batch_loss("embeddings", "labels")
def smooth_ap_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 0.01,
    include_query: bool = True,
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""Smooth-AP (Brown et al., ECCV 2020, "Smooth-AP: Smoothing the Path Towards Large-Scale Image Retrieval").

    For a query :math:`q` with cosine similarities :math:`s_j` to the items :math:`j` of its retrieval
    set :math:`\Omega`, positives :math:`P \subset \Omega` (same label) and
    :math:`\mathcal{G}(x) = \sigma(x / \tau)`, the average precision with the indicator of
    :math:`s_j > s_i` replaced by the sigmoid (eq. 9 of the paper):

    .. math::
        \mathrm{AP}_q = \frac{1}{|P|} \sum_{i \in P}
            \frac{1 + \sum_{j \in P, j \ne i} \mathcal{G}(s_j - s_i)}
                 {1 + \sum_{j \in \Omega, j \ne i} \mathcal{G}(s_j - s_i)}

    and the loss is the mean of :math:`1 - \mathrm{AP}_q` over the queries with a positive other
    than themselves. ``include_query=True`` (default) is the authors' code and pytorch-metric-learning's
    ``SmoothAPLoss``: the query belongs to :math:`\Omega` and to :math:`P` (it ranks itself first and
    adds a term close to 1); ``False``: :math:`\Omega` is the rest of the batch (eq. 9 as written).
    Unlike those two, any labels are accepted (not only equal-size classes sorted by class).

    Cost: the soft ranks of the positives only, each against every item: :math:`O(B \sum_q |P_q|)`
    sigmoids (:math:`O(B^2 m)` for classes of :math:`m` items; in eager CPU code, elsewhere
    :math:`O(B^3)`: every item is ranked and the others masked), computed in blocks of queries of at
    most :math:`2^{22}` elements; the exact gradient on the similarities is formed in the same pass (a
    few batched products with two columns) and kept, so memory is :math:`O(B^2)` and backward
    recomputes nothing. Only first-order gradients (double backward raises).

    Shape:
        - embeddings: :math:`(B, D)`; labels :math:`(B,)` or :math:`(B, 1)`.
        - output: scalar; float32 for float16/bfloat16 input.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> emb = torch.randn(8, 16, generator=g, requires_grad=True)
        >>> loss = rankwise.losses.smooth_ap_loss(emb, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
        >>> loss.backward()
        >>> bool(0 <= loss <= 1), emb.grad.shape
        (True, torch.Size([8, 16]))
    """
    tau = check_positive(temperature, "temperature")
    check_bool(include_query, "include_query")
    bt = _batch(embeddings, labels, distributed)
    pos = bt.pos | bt.own if include_query else bt.pos
    omega = _retrieval_set(bt, include_query)
    dt = bt.sim.dtype
    index, anchor = _anchors(pos)
    ap = _per_query(
        lambda s, o, p, i, a, g: _smooth_ap_block(s, o, p, i, a, tau, g),
        bt.sim,
        omega.to(dt),
        pos.to(dt),
        index,
        anchor.to(dt),
    )
    return _mean_over_valid(1.0 - ap, bt.pos.any(1), bt)


# --------------------------------------------------------------------------------------------------
# Recall@k surrogate
# --------------------------------------------------------------------------------------------------
def _recall_block(
    sim: torch.Tensor,
    omega: torch.Tensor,
    pos: torch.Tensor,
    index: torch.Tensor,
    anchor: torch.Tensor,
    ks: torch.Tensor,
    k_taus: torch.Tensor,
    tau: float,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mean smooth recall over ``ks`` of each query of the block and (``need_grad``) its gradient; the
    anchors ``index`` (masked by ``anchor``) are the positives."""
    sig = _pair_sigmoids(sim, index, tau)
    sets = omega[..., None]
    rank = _soft_ranks(sig, sets, index)[..., 0]  # (c, P)
    hits = torch.sigmoid((ks - rank[..., None]) / k_taus)  # (c, P, K)
    found = (hits * anchor[..., None]).sum(1)  # (c, K)
    inv_norm = 1.0 / torch.minimum(ks, pos.sum(1, keepdim=True)).clamp(min=1) / ks.shape[0]
    recall = (torch.minimum(found, ks) * inv_norm).sum(1)
    if not need_grad:
        return recall, None
    # d recall / d rank_a = -sum_k [found_k < k] inv_norm_k p_a h'_ak / tau_k (the min's branch)
    w = (found < ks) * inv_norm  # (c, K)
    d_rank = -(anchor[..., None] * hits * (1.0 - hits) / k_taus * w[:, None, :]).sum(2)
    return recall, _through_ranks(sig, sets, d_rank[..., None], index, tau)


def _similarity_mixup(bt: _Batch, labels: torch.Tensor, generator: torch.Generator | None) -> _Batch:
    r"""Similarity Mixup (SiMix) of a single-process batch: one virtual item per unordered pair of
    items of the same label, :math:`\tilde z = \alpha z_a + (1 - \alpha) z_b` with
    :math:`\alpha \sim U(0, 1)` per pair and the pair's label, its similarities obtained by mixing
    the similarities, :math:`S' = M S M^\top` with the mixing matrix :math:`M` ((B + F, B): the identity
    on top of one row :math:`\alpha e_a + (1 - \alpha) e_b` per virtual item), so no embedding is
    formed or re-normalized. The virtual items are queries and retrieval items like the real ones."""
    sim = bt.sim
    b = sim.shape[0]
    dt, dev = sim.dtype, sim.device
    first, second = torch.triu_indices(b, b, offset=1, device=dev)
    # the number of same-label pairs depends on the labels: one host sync (nonzero)
    same = (labels[first] == labels[second]).nonzero().squeeze(1)
    first, second = first[same], second[same]
    count = first.shape[0]
    alpha = rand_from((count,), generator, device=dev if generator is None else generator.device)
    alpha = alpha.to(device=dev, dtype=dt)
    rows = torch.arange(count, device=dev)
    mix = torch.zeros(count, b, dtype=dt, device=dev)
    mix = mix.index_put((rows, first), alpha).index_put((rows, second), 1.0 - alpha, accumulate=True)
    m = torch.cat([torch.eye(b, dtype=dt, device=dev), mix], 0)  # (B + F, B)
    mixed_sim = m @ sim @ m.T
    y = torch.cat([labels, labels[first]])
    own = torch.eye(b + count, dtype=torch.bool, device=dev)
    pos = (y[:, None] == y[None, :]) & ~own
    return _Batch(mixed_sim, pos, own, bt.world, bt.zg)


def _check_ks(k: Any, name: str) -> tuple[int, ...]:
    if isinstance(k, int) and not isinstance(k, bool):
        ks: tuple[Any, ...] = (k,)
    elif isinstance(k, (tuple, list)):
        ks = tuple(k)
    else:
        raise TypeError(f"`{name}` must be an int or a sequence of ints, got {type(k).__name__} {k!r}")
    if not ks:
        raise ValueError(f"`{name}` must hold at least one k, got {k!r}")
    for v in ks:
        check_positive_int(v, name)
    return ks


@batch_loss("embeddings", "labels")
def recall_at_k_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    k: int | Sequence[int] = (1, 2, 4, 8, 16),
    temperature: float = 0.01,
    k_temperatures: Sequence[float] | None = None,
    include_query: bool = True,
    mixup: bool = False,
    generator: torch.Generator | None = None,
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""Recall@k surrogate (Patel et al., CVPR 2022, "Recall@k Surrogate Loss with Large Batches and Similarity Mixup").

    For a query with cosine similarities :math:`s_j`, positives :math:`P` (same label, never the query
    itself) and the smooth rank of a positive :math:`r_i = 1 + \sum_{j \in \Omega, j \ne i}
    \sigma((s_j - s_i) / \tau_1)`, the recall at each :math:`k` is
    :math:`R_k = \min\bigl(\sum_{i \in P} \sigma((k - r_i) / \tau_2^{(k)}), k\bigr) / \min(k, |P|)` and
    the loss is the mean over the queries with a positive of :math:`1 - \frac{1}{|K|}\sum_k R_k`.

    Defaults are the authors': ``k = (1, 2, 4, 8, 16)``, :math:`\tau_1` = ``temperature`` = 0.01 and
    :math:`\tau_2^{(k)} = k` (``k_temperatures=None``); each ``k`` is clipped to the batch size.
    ``include_query=True`` (default) is the authors' code, in which the query is one of the ranked
    items :math:`\Omega` (so every other item ranks behind it) while not being a positive; ``False``:
    :math:`\Omega` is the rest of the batch.

    ``mixup=True`` adds the paper's Similarity Mixup (SiMix), as the authors' code does it: for every
    unordered pair :math:`(a, b)` of items with the same label a virtual item
    :math:`\tilde z = \alpha z_a + (1 - \alpha) z_b` (normalized :math:`z`, the mixture itself not
    re-normalized), :math:`\alpha \sim U(0, 1)` drawn per pair (from ``generator``), with the label
    of :math:`a` and :math:`b`. Its similarities are the same mixture of similarities,
    :math:`\tilde z \cdot z_j = \alpha s_{aj} + (1 - \alpha) s_{bj}` (and bilinearly between two
    virtual items), so the extended similarity matrix is :math:`M S M^\top` with :math:`M` the
    (B + F, B) mixing matrix: no new embedding is formed. Virtual items are queries, positives and
    ranked items like real ones; ``k`` is still clipped to the real batch size. The number of pairs
    depends on the labels (one host synchronization); not available with a global batch under DDP.

    Cost as :func:`smooth_ap_loss`: the soft ranks of the positives against every item, in blocks, with the
    gradient formed in forward.

    Shape:
        - embeddings: :math:`(B, D)`; labels :math:`(B,)` or :math:`(B, 1)`.
        - output: scalar; float32 for float16/bfloat16 input.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> emb = torch.randn(8, 16, generator=g, requires_grad=True)
        >>> loss = rankwise.losses.recall_at_k_loss(emb, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), k=(1, 2))
        >>> loss.backward()
        >>> bool(0 <= loss <= 1), emb.grad.shape
        (True, torch.Size([8, 16]))
    """
    ks = _check_ks(k, "k")
    tau = check_positive(temperature, "temperature")
    if k_temperatures is None:
        k_taus: tuple[float, ...] = tuple(float(v) for v in ks)
    else:
        k_taus = tuple(check_positive(v, "k_temperatures") for v in k_temperatures)
        if len(k_taus) != len(ks):
            raise ValueError(f"`k_temperatures` must have one value per k ({len(ks)}), got {len(k_taus)}")
    check_bool(include_query, "include_query")
    check_bool(mixup, "mixup")
    if mixup and global_batch_on(distributed):
        raise ValueError("`mixup=True` needs a single-process batch, got `distributed` with a global batch")
    bt = _batch(embeddings, labels, distributed)
    gen = check_generator(generator, embeddings)
    n = bt.sim.shape[1]
    if mixup:
        bt = _similarity_mixup(bt, as_labels(labels, embeddings.shape[0]).detach(), gen)
    dt, dev = bt.sim.dtype, bt.sim.device
    # filled on the device (a fill kernel per k): no blocking host-to-device copy
    kt = torch.stack([torch.full((), float(min(v, max(n, 1))), dtype=dt, device=dev) for v in ks])
    taus = torch.stack([torch.full((), v, dtype=dt, device=dev) for v in k_taus])
    omega = _retrieval_set(bt, include_query).to(dt)
    index, anchor = _anchors(bt.pos)
    recall = _per_query(
        lambda s, o, p, i, a, g: _recall_block(s, o, p, i, a, kt, taus, tau, g),
        bt.sim,
        omega,
        bt.pos.to(dt),
        index,
        anchor.to(dt),
    )
    return _mean_over_valid(1.0 - recall, bt.pos.any(1), bt)


# --------------------------------------------------------------------------------------------------
# Blackbox AP
# --------------------------------------------------------------------------------------------------
@batch_loss("embeddings", "labels")
def blackbox_ap_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    interpolation_lambda: float = 4.0,
    margin: float = 0.02,
    include_query: bool = True,
    random_margin: bool = False,
    generator: torch.Generator | None = None,
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""Blackbox AP (Rolínek et al., CVPR 2020, "Optimizing Rank-based Metrics with Blackbox Differentiation").

    Exact average precision of every query's ranking of the batch by cosine similarity, with
    gradients from blackbox differentiation of the ranks (:func:`rankwise.blackbox_rank`, Vlastelica
    et al. ICLR 2020). The scores of the positives :math:`P` are lowered and those of the negatives
    raised by ``margin`` / 2 (:math:`\alpha` of the paper) before ranking; with :math:`r_i` the rank of
    item :math:`i` among all items and :math:`r^+_i` its rank among the positives (no gradient),

    .. math::
        \mathrm{AP}_q = \frac{1}{|P|} \sum_{i \in P} \frac{r^+_i}{r_i},

    and the loss is the mean of :math:`1 - \mathrm{AP}_q` over the queries with a positive. The
    backward of the ranks is :math:`-\frac{1}{\lambda}(r(s) - r(s + \lambda\, \partial L / \partial r))`
    with :math:`\lambda` = ``interpolation_lambda`` (4 in the authors' retrieval code, margin 0.02).
    ``include_query=True`` (default, the authors' code): the query is a positive of itself in its own
    ranking; ``False``: it is left out. By default the margin shift is deterministic (:math:`\pm`
    margin / 2, as in the paper); ``random_margin=True`` is the authors' retrieval code, which scales
    the shift of every (query, item) entry by a fresh :math:`|\xi|`, :math:`\xi \sim \mathcal{N}(0, 1)`
    (drawn from ``generator`` as a (queries, N) float32 tensor): the scores ranked are
    :math:`s - \alpha\, |\xi|\, (y - \tfrac12)` with :math:`y` the 0/1 positive indicator.

    The gradient is a surrogate (it depends non-linearly on the incoming gradient, so scaling the
    loss changes it); ties are broken by index (ordinal ranks).

    Shape:
        - embeddings: :math:`(B, D)`; labels :math:`(B,)` or :math:`(B, 1)`.
        - output: scalar; float32 for float16/bfloat16 input.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> emb = torch.randn(8, 16, generator=g, requires_grad=True)
        >>> loss = rankwise.losses.blackbox_ap_loss(emb, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
        >>> loss.backward()
        >>> bool(0 <= loss <= 1), emb.grad.shape
        (True, torch.Size([8, 16]))
    """
    lam = check_positive(interpolation_lambda, "interpolation_lambda")
    alpha = check_positive(margin, "margin", allow_zero=True)
    check_bool(include_query, "include_query")
    check_bool(random_margin, "random_margin")
    bt = _batch(embeddings, labels, distributed, grad_scale=True)
    gen = check_generator(generator, embeddings)
    pos = bt.pos | bt.own if include_query else bt.pos
    n = bt.sim.shape[1]
    if n == 0:  # an empty global batch (the same on every rank: no collective is skipped)
        return zero_with_graph(bt.zg)
    dt = bt.sim.dtype
    posf = pos.to(dt)
    shift = posf - 0.5
    if random_margin:
        noise = randn_from(bt.sim.shape, gen, device=bt.sim.device if gen is None else gen.device)
        shift = shift * noise.to(device=bt.sim.device, dtype=dt).abs()
    scores = bt.sim - alpha * shift
    if not include_query:  # the query's own column ranks last and takes no part
        scores = scores.masked_fill(bt.own, -math.inf)
    ranks = BlackboxRankFunction.apply(scores, lam, True, False, False)  # 1..N, descending, ordinal
    within = rank_last(scores.detach().masked_fill(~pos, -math.inf), True, "ordinal")
    ap = (within / ranks * posf).sum(1) / posf.sum(1).clamp(min=1)
    share = _mean_over_valid(1.0 - ap, bt.pos.any(1), bt, scale=False)  # world: on the gathered gradient
    return share + (bt.world - 1) * share.detach()  # value: world * share; gradient: see grad_scale


# --------------------------------------------------------------------------------------------------
# FastAP
# --------------------------------------------------------------------------------------------------
@batch_loss("embeddings", "labels")
def fastap_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_bins: int = 10,
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""FastAP (Cakir et al., CVPR 2019, "Deep Metric Learning to Rank"), as pytorch-metric-learning's ``FastAPLoss``.

    Squared Euclidean distances of the L2-normalized embeddings, :math:`d \in [0, 4]`, are soft-binned
    into ``num_bins + 1`` triangular bins centred at :math:`c_b = 4b / L` (width :math:`\Delta = 4 / L`,
    :math:`L` = ``num_bins``): :math:`\delta_b(d) = \max(0, 1 - |d - c_b| / \Delta)`. With the
    histograms of the query's positives :math:`h^+_b` and of all other items :math:`h_b` and their
    cumulative sums :math:`H^+_b, H_b`,

    .. math::
        \mathrm{FastAP}_q = \frac{1}{|P|} \sum_b \frac{h^+_b H^+_b}{H_b}

    (terms with :math:`h^+_b H^+_b = 0` or :math:`H_b = 0` left out), and the loss is the mean of
    :math:`1 - \mathrm{FastAP}_q` over the queries with a positive. The query itself is never an item.
    Each distance falls into two adjacent bins, so the histograms are two ``scatter_add`` of
    :math:`O(B^2)` (no :math:`B \times B \times L` tensor).

    Shape:
        - embeddings: :math:`(B, D)`; labels :math:`(B,)` or :math:`(B, 1)`.
        - output: scalar; float32 for float16/bfloat16 input.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> emb = torch.randn(8, 16, generator=g, requires_grad=True)
        >>> loss = rankwise.losses.fastap_loss(emb, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
        >>> loss.backward()
        >>> bool(0 <= loss <= 1), emb.grad.shape
        (True, torch.Size([8, 16]))
    """
    bins = check_positive_int(num_bins, "num_bins")
    bt = _batch(embeddings, labels, distributed)
    m, n = bt.sim.shape
    if n == 0:  # an empty global batch (the same on every rank: no collective is skipped)
        return zero_with_graph(bt.zg)
    dt = bt.sim.dtype
    delta = 4.0 / bins
    t = ((2.0 - 2.0 * bt.sim) / delta).clamp(0.0, float(bins))  # distance in bin units
    lo = t.detach().nan_to_num(0.0).floor().clamp(0, bins - 1).long()  # (NaN: the loss is NaN anyway)
    hi_w = t - lo.to(dt)
    items = (~bt.own).to(dt)
    posf = bt.pos.to(dt)

    def hist(weight: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(m, bins + 1, dtype=dt, device=t.device)
        h = h.scatter_add(1, lo, (1.0 - hi_w) * weight)
        return h.scatter_add(1, lo + 1, hi_w * weight)

    h_pos, h_all = hist(posf), hist(items)
    cum_pos, cum_all = h_pos.cumsum(1), h_all.cumsum(1)
    num = h_pos * cum_pos
    ok = (num > 0) & (cum_all > 0)
    terms = torch.where(ok, num / torch.where(ok, cum_all, torch.ones_like(cum_all)), torch.zeros_like(num))
    npos = posf.sum(1)
    fast_ap = terms.sum(1) / npos.clamp(min=1)
    return _mean_over_valid(1.0 - fast_ap, npos > 0, bt)


# --------------------------------------------------------------------------------------------------
# module twins
# --------------------------------------------------------------------------------------------------
class SmoothAPLoss(FunctionModule):
    """Module twin of :func:`smooth_ap_loss`."""

    _function = staticmethod(smooth_ap_loss)
    _options = ("temperature", "include_query", "distributed")
    _shown = ("temperature", "include_query")

    def __init__(
        self, *, temperature: float = 0.01, include_query: bool = True, distributed: DistributedFlag = False
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.include_query = check_bool(include_query, "include_query")
        self.distributed = distributed


class RecallAtKLoss(FunctionModule):
    """Module twin of :func:`recall_at_k_loss`."""

    _function = staticmethod(recall_at_k_loss)
    _options = ("k", "temperature", "k_temperatures", "include_query", "mixup", "generator", "distributed")
    _shown = ("k", "temperature", "include_query", "mixup")

    def __init__(
        self,
        *,
        k: int | Sequence[int] = (1, 2, 4, 8, 16),
        temperature: float = 0.01,
        k_temperatures: Sequence[float] | None = None,
        include_query: bool = True,
        mixup: bool = False,
        generator: torch.Generator | None = None,
        distributed: DistributedFlag = False,
    ) -> None:
        super().__init__()
        self.k = _check_ks(k, "k")
        self.temperature = check_positive(temperature, "temperature")
        self.k_temperatures = None if k_temperatures is None else tuple(k_temperatures)
        self.include_query = check_bool(include_query, "include_query")
        self.mixup = check_bool(mixup, "mixup")
        self.generator = generator
        self.distributed = distributed


class BlackboxAPLoss(FunctionModule):
    """Module twin of :func:`blackbox_ap_loss`."""

    _function = staticmethod(blackbox_ap_loss)
    _options = ("interpolation_lambda", "margin", "include_query", "random_margin", "generator", "distributed")
    _shown = ("interpolation_lambda", "margin", "random_margin")

    def __init__(
        self,
        *,
        interpolation_lambda: float = 4.0,
        margin: float = 0.02,
        include_query: bool = True,
        random_margin: bool = False,
        generator: torch.Generator | None = None,
        distributed: DistributedFlag = False,
    ) -> None:
        super().__init__()
        self.interpolation_lambda = check_positive(interpolation_lambda, "interpolation_lambda")
        self.margin = check_positive(margin, "margin", allow_zero=True)
        self.include_query = check_bool(include_query, "include_query")
        self.random_margin = check_bool(random_margin, "random_margin")
        self.generator = generator
        self.distributed = distributed


class FastAPLoss(FunctionModule):
    """Module twin of :func:`fastap_loss`."""

    _function = staticmethod(fastap_loss)
    _options = ("num_bins", "distributed")
    _shown = ("num_bins",)

    def __init__(self, *, num_bins: int = 10, distributed: DistributedFlag = False) -> None:
        super().__init__()
        self.num_bins = check_positive_int(num_bins, "num_bins")
        self.distributed = distributed


# --------------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------------
register_loss(
    "smooth_ap", module=SmoothAPLoss, inputs={"embeddings": "embeddings", "labels": "labels"}, takes="embeddings_labels"
)(smooth_ap_loss)
register_loss(
    "recall_at_k",
    module=RecallAtKLoss,
    inputs={"embeddings": "embeddings", "labels": "labels"},
    takes="embeddings_labels",
)(recall_at_k_loss)
register_loss(
    "blackbox_ap",
    module=BlackboxAPLoss,
    gradient="surrogate",
    inputs={"embeddings": "embeddings", "labels": "labels"},
    takes="embeddings_labels",
)(blackbox_ap_loss)
register_loss(
    "fastap", module=FastAPLoss, inputs={"embeddings": "embeddings", "labels": "labels"}, takes="embeddings_labels"
)(fastap_loss)
