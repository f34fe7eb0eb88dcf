r"""Collectives for global-batch losses under ``torch.distributed`` (DDP, torchrun, Lightning).

A batch-level loss (SupCon, Rank-N-Contrast, ConR, RankSim, Spearman) computed on each rank's
local batch is a *different* loss from the one on the global batch: the negatives, the rank sets
and the label subsets shrink with the per-device batch. With ``distributed=True`` (or ``"auto"``)
those losses gather the features, labels, predictions and weights of every rank with the
functions below, compute the loss terms of the **local anchors against the global batch**, and
scale the result so that, after DDP's averaging of parameter gradients over the ``W`` ranks, every
parameter receives exactly the single-process gradient of the loss on the concatenated batch.

Scaling convention (all rankwise losses): if the single-process loss on the concatenated batch is
:math:`L = \frac{1}{N}\sum_{a} \ell_a` (a sum over anchors divided by a normaliser :math:`N`
computed on the global batch), rank :math:`r` returns

.. math::
    L_r = \frac{W}{N} \sum_{a \in \text{rank } r} \ell_a ,
    \qquad \frac{1}{W}\sum_r L_r = L .

:func:`all_gather_with_grad` sends the gradient of every gathered slice back to the rank that
owns it, summed over ranks (``all_reduce`` then slice), so the gradient reaching rank ``r``'s local
features is :math:`\sum_q \partial L_q / \partial z_r = W\, \partial L / \partial z_r`, and DDP's
``1/W`` gradient averaging turns it into :math:`\partial L / \partial \theta`. The returned value
of one rank is a share of the loss, not the loss: log it with ``sync_dist=True`` (mean over ranks)
to see :math:`L`.

Unequal local batch sizes (the last batch of an epoch, ``drop_last=False``) are supported: the
sizes are exchanged first (:func:`batch_layout`, one tiny ``all_gather`` plus a **host
synchronization** to read the sizes), every tensor is padded to the largest size, gathered, and
stripped. Pass a precomputed :class:`BatchLayout` (or ``sizes=``) to avoid repeating the exchange
for several tensors of the same batch. Works with the ``gloo`` (CPU) and ``nccl`` (CUDA) backends:
the collectives run on the input's device.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = [
    "BatchLayout",
    "all_gather_no_grad",
    "all_gather_with_grad",
    "all_reduce_sum",
    "batch_layout",
    "broadcast",
    "get_rank",
    "get_world_size",
    "is_distributed",
    "local_slice",
    "resolve_distributed",
    "scale_grad",
    "torchrun_trainer_defaults",
]

DistributedFlag = bool | Literal["auto"]


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _initialized() -> bool:
    dist = _dist()
    return bool(dist.is_available() and dist.is_initialized())


def get_world_size(group: Any = None) -> int:
    """World size of ``group`` (default group), 1 when no process group is initialized."""
    return int(_dist().get_world_size(group)) if _initialized() else 1


def get_rank(group: Any = None) -> int:
    """Rank in ``group`` (default group), 0 when no process group is initialized."""
    return int(_dist().get_rank(group)) if _initialized() else 0


def is_distributed(group: Any = None) -> bool:
    """``True`` when a ``torch.distributed`` process group is initialized with world size > 1."""
    return _initialized() and get_world_size(group) > 1


def resolve_distributed(flag: DistributedFlag) -> bool:
    """Turn a loss's ``distributed`` argument into a bool.

    ``"auto"`` is on exactly when :func:`is_distributed` (a process group with world size > 1);
    ``False`` is always off; ``True`` requires an initialized process group (a world of size 1
    then behaves like a single process) and raises otherwise.

    Example:
        >>> from rankwise.distributed import resolve_distributed
        >>> resolve_distributed("auto"), resolve_distributed(False)
        (False, False)
    """
    if flag == "auto" and isinstance(flag, str):
        return is_distributed()
    if flag is False:
        return False
    if flag is True:
        if not _initialized():
            raise ValueError(
                "`distributed=True` needs an initialized torch.distributed process group "
                "(torch.distributed.init_process_group, torchrun or Lightning DDP); "
                "use distributed='auto' to fall back to the local batch, got no process group"
            )
        return True
    raise ValueError(f"`distributed` must be True, False or 'auto', got {flag!r}")


def global_batch_on(flag: DistributedFlag) -> bool:
    """Whether a loss with ``distributed=flag`` takes its global-batch path (on, and more than one rank)."""
    return resolve_distributed(flag) and get_world_size() > 1


@dataclass(frozen=True)
class BatchLayout:
    """Local batch sizes of every rank and the position of this rank's slice in the global batch."""

    sizes: tuple[int, ...]
    rank: int

    @property
    def world_size(self) -> int:
        return len(self.sizes)

    @property
    def total(self) -> int:
        """Global batch size (sum of the local sizes)."""
        return sum(self.sizes)

    @property
    def start(self) -> int:
        """Offset of this rank's first example in the global (rank-ordered) batch."""
        return sum(self.sizes[: self.rank])

    @property
    def stop(self) -> int:
        return self.start + self.sizes[self.rank]

    @property
    def local(self) -> slice:
        """``slice(start, stop)`` of this rank's examples in the global batch."""
        return slice(self.start, self.stop)


def batch_layout(local_size: int, *, device: torch.device | str | None = None, group: Any = None) -> BatchLayout:
    """Exchange the local batch sizes of all ranks (one ``all_gather`` of an int64 and a **host sync**).

    Without an initialized process group this is ``BatchLayout((local_size,), 0)`` and costs nothing.
    ``device`` must be a device the backend can communicate on (the inputs' device: CPU for gloo,
    CUDA for nccl).
    """
    if not _initialized():
        return BatchLayout((int(local_size),), 0)
    dist = _dist()
    world = get_world_size(group)
    mine = torch.tensor([int(local_size)], dtype=torch.int64, device=device)
    bufs = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(bufs, mine, group=group)
    sizes = tuple(int(s) for s in torch.cat(bufs).tolist())  # host sync: needed to pad and strip
    return BatchLayout(sizes, get_rank(group))


def local_slice(sizes: Sequence[int], rank: int | None = None) -> slice:
    """Slice of rank ``rank``'s (default: this rank's) examples in a batch gathered with ``sizes``."""
    r = get_rank() if rank is None else rank
    start = sum(sizes[:r])
    return slice(start, start + sizes[r])


def _sizes_for(x: torch.Tensor, dim: int, sizes: Sequence[int] | BatchLayout | None, group: Any) -> tuple[int, ...]:
    if isinstance(sizes, BatchLayout):
        out = sizes.sizes
    elif sizes is None:
        out = batch_layout(x.shape[dim], device=x.device, group=group).sizes
    else:
        out = tuple(int(s) for s in sizes)
    if len(out) != get_world_size(group):
        raise ValueError(f"`sizes` must have one entry per rank ({get_world_size(group)}), got {len(out)}")
    if out[get_rank(group)] != x.shape[dim]:
        raise ValueError(
            f"`sizes[{get_rank(group)}]` must equal the local size {x.shape[dim]} along dim {dim}, "
            f"got {out[get_rank(group)]}"
        )
    return out


def _gather(x: torch.Tensor, sizes: tuple[int, ...], group: Any) -> torch.Tensor:
    """All-gather ``x`` along dim 0 with per-rank ``sizes`` (pad to the max, gather, strip)."""
    longest = max(sizes)
    if len(sizes) == 1 or longest == 0:
        return x.clone() if len(sizes) == 1 else x.new_zeros((0, *x.shape[1:]))
    is_bool = x.dtype == torch.bool
    xt = x.to(torch.uint8) if is_bool else x
    xt = xt.contiguous()
    if xt.shape[0] < longest:
        xt = torch.cat([xt, xt.new_zeros((longest - xt.shape[0], *xt.shape[1:]))], 0)
    bufs = [torch.empty_like(xt) for _ in sizes]
    _dist().all_gather(bufs, xt, group=group)
    out = torch.cat([b[:s] for b, s in zip(bufs, sizes, strict=True)], 0)
    return out.to(torch.bool) if is_bool else out


class _AllGatherGrad(torch.autograd.Function):
    """Gather along dim 0; backward = all_reduce(SUM) of the global gradient, then this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sizes: tuple[int, ...], group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.sizes, ctx.group = sizes, group
        return _gather(x, sizes, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        sizes, group = ctx.sizes, ctx.group
        g = grad.contiguous().clone()
        if len(sizes) > 1 and g.numel() > 0:
            _dist().all_reduce(g, op=_dist().ReduceOp.SUM, group=group)
        sl = local_slice(sizes, get_rank(group))
        return g[sl], None, None


def all_gather_with_grad(
    x: torch.Tensor,
    dim: int = 0,
    *,
    sizes: Sequence[int] | BatchLayout | None = None,
    group: Any = None,
) -> torch.Tensor:
    r"""Concatenate every rank's ``x`` along ``dim`` (rank order), differentiably.

    Backward sends each rank the **sum over ranks** of the gradient of its slice (``all_reduce``
    then slice, the semantics of ``torch.distributed.nn.functional.all_gather``), so when every
    rank backpropagates its own loss :math:`L_r`, rank ``r``'s ``x`` receives
    :math:`\sum_q \partial L_q / \partial x_r`. Every rank must call backward (the reduction is a
    collective). Local sizes along ``dim`` may differ between ranks: they are exchanged first
    unless ``sizes`` (or a :class:`BatchLayout`) is given — that exchange is a host synchronization.
    Without a process group (or with world size 1) this returns ``x`` unchanged.

    Shape:
        - x: :math:`(\ldots, n_r, \ldots)` with :math:`n_r` at ``dim``, identical other dims on all ranks.
        - output: :math:`(\ldots, \sum_r n_r, \ldots)`, same dtype and device.

    Example:
        >>> import torch
        >>> from rankwise.distributed import all_gather_with_grad
        >>> x = torch.ones(3, 2, requires_grad=True)
        >>> all_gather_with_grad(x).shape  # no process group: identity
        torch.Size([3, 2])
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`x` must be a torch.Tensor, got {type(x).__name__}")
    if get_world_size(group) == 1:
        return x
    d = dim % max(x.dim(), 1)
    s = _sizes_for(x, d, sizes, group)
    moved = x.movedim(d, 0) if d else x
    out = _AllGatherGrad.apply(moved, s, group)
    return out.movedim(0, d) if d else out


def all_gather_no_grad(
    x: torch.Tensor,
    dim: int = 0,
    *,
    sizes: Sequence[int] | BatchLayout | None = None,
    group: Any = None,
) -> torch.Tensor:
    """:func:`all_gather_with_grad` without autograd (labels, predictions, weights); any dtype incl. bool.

    Example:
        >>> import torch
        >>> from rankwise.distributed import all_gather_no_grad
        >>> all_gather_no_grad(torch.tensor([1, 2]))
        tensor([1, 2])
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`x` must be a torch.Tensor, got {type(x).__name__}")
    x = x.detach()
    if get_world_size(group) == 1:
        return x
    d = dim % max(x.dim(), 1)
    s = _sizes_for(x, d, sizes, group)
    out = _gather(x.movedim(d, 0) if d else x, s, group)
    return out.movedim(0, d) if d else out


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:  # type: ignore[override]
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return grad * ctx.factor, None


def scale_grad(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Identity forward; multiplies the gradient by ``factor`` in backward.

    Used where a loss contains a non-linear gradient surrogate (blackbox ranks, whose backward
    depends on the size of the incoming gradient): the ``world_size`` factor of the distributed
    scaling is applied to the gathered features instead of the loss value, so the surrogate sees
    exactly the single-process upstream gradient.
    """
    return _ScaleGrad.apply(x, float(factor))


def all_reduce_sum(x: torch.Tensor, *, group: Any = None) -> torch.Tensor:
    """Sum of ``x`` over ranks, without gradient (a new tensor; ``x`` is untouched; no host sync)."""
    out = x.detach().clone()
    if get_world_size(group) > 1:
        _dist().all_reduce(out, op=_dist().ReduceOp.SUM, group=group)
    return out


def broadcast(x: torch.Tensor, src: int = 0, *, group: Any = None) -> torch.Tensor:
    """Rank ``src``'s ``x`` on every rank, without gradient (a new tensor; no host sync)."""
    out = x.detach().clone().contiguous()
    if get_world_size(group) > 1:
        _dist().broadcast(out, src=src, group=group)
    return out


def torchrun_trainer_defaults(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Lightning ``Trainer`` options matching a ``torchrun`` launch, ``{}`` outside one.

    Under ``torchrun`` (``TORCHELASTIC_RUN_ID`` set) with ``WORLD_SIZE > 1``, Lightning must be told
    ``devices = LOCAL_WORLD_SIZE``, ``num_nodes = WORLD_SIZE / LOCAL_WORLD_SIZE`` and a DDP
    strategy, otherwise every process trains alone. ``rankwise train`` fills these in for the
    options not given on its command line.

    Example:
        >>> from rankwise.distributed import torchrun_trainer_defaults
        >>> env = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
        >>> torchrun_trainer_defaults(env)
        {'devices': 4, 'num_nodes': 2, 'strategy': 'ddp'}
    """
    e = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" not in e:
        return {}
    try:
        world = int(e.get("WORLD_SIZE", "1"))
        local = int(e.get("LOCAL_WORLD_SIZE", str(world)))
    except ValueError:
        return {}
    if world <= 1 or local < 1:
        return {}
    return {"devices": local, "num_nodes": max(1, world // local), "strategy": "ddp"}
