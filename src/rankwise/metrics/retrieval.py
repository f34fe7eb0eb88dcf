"""Retrieval metrics of embeddings: Recall@k, MAP@R and R-precision (query set = reference set)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from rankwise._validation import check_choice, check_floating, check_positive_int, check_real

__all__ = ["retrieval_metrics"]

Distance = Literal["euclidean", "cosine"]


@torch.no_grad()
def retrieval_metrics(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    ks: Sequence[int] = (1, 2, 4, 8),
    distance: Distance = "euclidean",
    block_size: int = 256,
) -> dict[str, float]:
    r"""Recall@k, MAP@R and R-precision of every embedding queried against all the others.

    Each embedding is a query; the reference set is every other embedding (the query itself is
    excluded), ranked by increasing Euclidean distance (``distance="euclidean"``, the default of
    pytorch-metric-learning's ``AccuracyCalculator``) or decreasing cosine similarity (``"cosine"``).
    With :math:`R` the number of other embeddings of the query's label and :math:`\mathrm{rel}(i)`
    whether the :math:`i`-th neighbour has it:

    * ``recall@k``: fraction of queries with at least one positive among their :math:`k` nearest
      neighbours (the Recall@k of the metric-learning literature; ``recall@1`` is
      ``AccuracyCalculator``'s ``precision_at_1``);
    * ``map@r``: mean of :math:`\frac{1}{R}\sum_{i=1}^{R} P(i)\,\mathrm{rel}(i)`, :math:`P(i)` the
      precision of the first :math:`i` neighbours (Musgrave et al., ECCV 2020, "A Metric Learning
      Reality Check"; ``mean_average_precision_at_r``);
    * ``r_precision``: mean fraction of positives among the first :math:`R` neighbours.

    Averages run over the queries with at least one positive (as ``AccuracyCalculator``, which
    leaves out "lone" query labels); ``num_queries`` is their number (``nan`` metrics when it is 0, and
    when an embedding is NaN or infinite: distances to it have no order).
    Queries are processed in blocks of ``block_size`` rows against all embeddings, keeping only the
    :math:`\max(R, k)` nearest neighbours of each block, so memory is
    :math:`O(\text{block\_size} \cdot B)` (100k embeddings fit easily). The embeddings are first
    centred (their mean subtracted, which leaves every Euclidean distance as it is) and scaled in
    float64; in cosine mode they are normalised to unit vectors there before centring, and ranked
    by the Euclidean distance of the unit vectors (:math:`|u - v|^2 = 2 - 2\cos`, the same order).
    The distances are then computed in float64 for float64 input, float32 otherwise, on the
    embeddings' device, so embeddings far from the origin (an offset of 1e4 on clusters of spread 1)
    keep their float64 neighbours in float32. Ties in distance are broken by
    ``torch.topk`` (in no documented order), as the nearest-neighbour search of the reference.

    Shape:
        - embeddings: :math:`(B, D)`; labels :math:`(B,)` or :math:`(B, 1)` (any real dtype).
        - output: ``{"recall@k" for k in ks, "map@r", "r_precision", "num_queries"}`` (Python floats).

    Example:
        >>> import torch, rankwise
        >>> emb = torch.tensor([[0.0], [0.1], [1.0], [1.2], [0.04]])
        >>> m = rankwise.metrics.retrieval_metrics(emb, torch.tensor([0, 0, 1, 1, 1]), ks=(1, 2))
        >>> m["recall@1"], m["recall@2"], m["num_queries"]
        (0.4, 0.8, 5.0)
    """
    check_floating(embeddings, "embeddings")
    if embeddings.dim() != 2:
        raise ValueError(f"`embeddings` must have shape (B, D), got shape {tuple(embeddings.shape)}")
    check_real(labels, "labels")
    y = labels.reshape(-1) if labels.dim() == 2 and labels.shape[1] == 1 else labels
    if y.dim() != 1 or y.shape[0] != embeddings.shape[0]:
        raise ValueError(
            f"`labels` must have shape ({embeddings.shape[0]},) (one per embedding), got shape {tuple(labels.shape)}"
        )
    if isinstance(ks, int) or not isinstance(ks, (tuple, list)) or not ks:
        raise TypeError(f"`ks` must be a non-empty sequence of ints, got {ks!r}")
    ks = tuple(check_positive_int(k, "ks") for k in ks)
    check_choice(distance, "distance", ("euclidean", "cosine"))
    block = check_positive_int(block_size, "block_size")
    dt = torch.float64 if embeddings.dtype == torch.float64 else torch.float32
    x = embeddings.detach().to(dt)
    y = y.to(x.device)
    n = x.shape[0]
    # prepared in float64 (O(B D)), searched in ``dt``: cosine mode ranks the unit vectors by Euclidean
    # distance (-|u - v|^2 = 2 cos - 2, the same order); the mean is subtracted (distances unchanged)
    # and one positive scale brings the largest |coordinate| to 1, so the expanded
    # 2 x.y - |x|^2 - |y|^2 below neither cancels on embeddings far from the origin nor overflows
    z = x.to(torch.float64) if x.device.type != "mps" else x
    finite = bool(torch.isfinite(z).all())
    if finite and z.numel():
        if distance == "cosine":  # each row scaled to max |x| = 1 first: no row's norm underflows
            z = z / z.abs().amax(1, keepdim=True).clamp(min=torch.finfo(z.dtype).tiny)
            z = torch.nn.functional.normalize(z, dim=1)
        z = z - z.mean(0)
        top = z.abs().amax()
        if float(top) > 0:
            z = z / top
        x = z.to(dt)
    _, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
    r_all = counts[inverse] - 1  # other embeddings of the same label
    valid = r_all > 0
    nq = int(valid.sum())
    out = {f"recall@{k}": 0.0 for k in ks}
    out.update({"map@r": 0.0, "r_precision": 0.0})
    if nq == 0 or not finite:  # no query with a positive, or a NaN/inf embedding (no order)
        return {**{k: float("nan") for k in out}, "num_queries": float(nq)}
    k_top = min(n - 1, max(int(r_all.max()), *ks))
    sq = (x * x).sum(1)
    sums = torch.zeros(len(ks) + 2, dtype=torch.float64, device=x.device)
    k_index = torch.arange(1, k_top + 1, device=x.device)
    for start in range(0, n, block):
        stop = min(start + block, n)
        rows = torch.arange(start, stop, device=x.device)
        score = 2 * (x[start:stop] @ x.T) - sq[start:stop, None] - sq[None, :]  # minus squared distance
        score[torch.arange(stop - start, device=x.device), rows] = -torch.inf  # never the query itself
        nn_idx = score.topk(k_top, dim=1, largest=True, sorted=True).indices
        rel = y[nn_idx] == y[start:stop, None]  # (c, k_top)
        r = r_all[start:stop]
        ok = valid[start:stop]
        for j, k in enumerate(ks):
            sums[j] += (rel[:, : min(k, k_top)].any(1) & ok).sum()
        within_r = k_index[None, :] <= r[:, None]
        rel_r = rel & within_r
        prec = rel_r.cumsum(1).to(torch.float64) / k_index[None, :]
        rr = r.clamp(min=1).to(torch.float64)
        sums[len(ks)] += ((prec * rel_r).sum(1) / rr)[ok].sum()
        sums[len(ks) + 1] += (rel_r.sum(1) / rr)[ok].sum()
    means = (sums / nq).tolist()
    for j, k in enumerate(ks):
        out[f"recall@{k}"] = means[j]
    out["map@r"], out["r_precision"] = means[len(ks)], means[len(ks) + 1]
    out["num_queries"] = float(nq)
    return out
