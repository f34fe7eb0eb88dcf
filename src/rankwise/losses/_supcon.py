"""Supervised contrastive loss (SupCon) and SimCLR's NT-Xent, with optional anchor chunking."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from typing import Any, Literal

import torch

from rankwise._kernels import supcon as kernels
from rankwise._twin import FunctionModule
from rankwise._validation import (
    autocast_off,
    batch_loss,
    check_bool,
    check_choice,
    check_positive,
    finite_checked,
)
from rankwise.distributed import (
    DistributedFlag,
    all_gather_no_grad,
    all_gather_with_grad,
    all_reduce_sum,
    batch_layout,
    get_world_size,
    global_batch_on,
)
from rankwise.losses._contrastive_common import (
    as_labels,
    as_views,
    robust_norm,
    sample_mask,
    zero_with_graph,
)
from rankwise.losses._registry import register_loss

__all__ = ["SupConLoss", "supcon_loss"]

logger = logging.getLogger(__name__)

ContrastMode = Literal["all", "one"]
Variant = Literal["out", "in"]
# Automatic blocking: the anchors x contrast logits are computed in one piece (and kept for
# backward) when they have at most this many elements (2**26 float32 = 256 MiB, B = 4096 with
# two views); larger problems go blockwise, in blocks of about _AUTO_BLOCK_ELEMENTS logits that
# are recomputed in backward.
_DENSE_MAX_ELEMENTS = 1 << 26
_AUTO_BLOCK_ELEMENTS = 1 << 22
# Up to this many views, backward with all views as anchors forms W + W^T (two passes over the
# (N, N) softmax) and does one matmul instead of two; above it, the transposed add (cache-hostile)
# costs more than the second matmul.
_SYMMETRIC_MAX_N = 512
# Up to this many anchor x contrast logits, variant "out" on a local batch takes the one-pass path
# (:class:`_SupConOutSmall`): an explicit positive-weight matrix, the gradient formed in forward,
# few torch ops, because at this size per-op overhead costs more than passes over the logits.
_SMALL_MAX_ELEMENTS = 1 << 20
# On CUDA (launch-bound at these sizes: few ops matter more than passes) the one-pass path is taken up
# to the dense limit: 30 torch ops forward + backward at B = 1024 (two views, normalized, integer
# labels; counted by benchmarks/host_overhead.py) against the general path's 102; its (m, N) logits,
# log-probabilities and gradient weights take 768 MiB in float32 at 2**26 elements (B = 4096, two views).
_SMALL_MAX_ELEMENTS_CUDA = _DENSE_MAX_ELEMENTS


def _check_chunk(chunk_size: int | None) -> int | None:
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"`chunk_size` must be an int or None, got {type(chunk_size).__name__}")
    if chunk_size < 1:
        raise ValueError(f"`chunk_size` must be >= 1, got {chunk_size}")
    return chunk_size


def _block_size(chunk: int | None, n_anchor: int, n: int) -> int:
    """Anchors per block: all of them when the logits fit the budget (or ``chunk`` covers them)."""
    if chunk is None:
        chunk = n_anchor if n_anchor * n <= _DENSE_MAX_ELEMENTS else max(1, _AUTO_BLOCK_ELEMENTS // n)
    return max(1, min(chunk, n_anchor))


_MASK_MAX_SAMPLES = 256  # up to this many samples, label positives are a (B, B) matrix (fewer, larger ops)


class _Positives:
    """Which samples are positives of which, without a (B V) x (B V) mask.

    Either ``mask`` (B, B) (sample ``t`` is a positive of ``s`` when ``mask[s, t]``; from a user
    mask or, for small batches, from label equality), or ``group`` (B,) int64 ids, samples being
    positives when their ids are equal and ``self_pos`` holds (labels), or neither (SimCLR: each
    sample is its own only positive sample). ``self_pos``
    (B,) is 1 where the other views of the same sample are positives (the diagonal of the mask; 0
    for a NaN label, which equals nothing) and ``count`` (B,) is the number of positive samples
    (the sample itself included when ``self_pos``). A view is never its own positive.
    """

    def __init__(
        self, mask: torch.Tensor | None, group: torch.Tensor | None, self_pos: torch.Tensor, count: torch.Tensor
    ) -> None:
        self.mask, self.group, self.self_pos, self.count = mask, group, self_pos, count

    @classmethod
    def from_keys(cls, keys: torch.Tensor, dtype: torch.dtype) -> _Positives:
        """Per-sample keys compared with ``==``; large batches get group ids from one sort (no host sync)."""
        b = keys.shape[0]
        if b <= _MASK_MAX_SAMPLES:
            return cls.from_mask(keys[:, None] == keys[None, :], dtype)
        if keys.dtype == torch.bool:
            keys = keys.to(torch.uint8)
        sorted_keys, perm = torch.sort(keys)
        new = torch.ones(b, dtype=torch.bool, device=keys.device)
        new[1:] = sorted_keys[1:] != sorted_keys[:-1]  # NaN != NaN: every NaN starts its own group
        group = torch.empty_like(perm).scatter_(0, perm, new.cumsum(0) - 1)
        self_pos = (keys == keys).to(dtype)
        count = torch.zeros(b, dtype=dtype, device=keys.device).index_add_(0, group, self_pos)[group] * self_pos
        return cls(None, group, self_pos, count)

    @classmethod
    def simclr(cls, b: int, dtype: torch.dtype, device: torch.device) -> _Positives:
        ones = torch.ones(b, dtype=dtype, device=device)
        return cls(None, None, ones, ones)

    @classmethod
    def from_mask(cls, mask: torch.Tensor, dtype: torch.dtype) -> _Positives:
        m = mask.to(dtype)
        return cls(m, None, m.diagonal(), m.sum(1))

    def sample_sums(self, per_sample: torch.Tensor, *, transpose: bool = False) -> torch.Tensor:
        """(B, D) -> (B, D): for each sample, the sum of ``per_sample`` over its positive samples
        (``transpose``: over the samples it is a positive of; the same except for a user mask)."""
        if self.mask is not None:
            return (self.mask.T if transpose else self.mask) @ per_sample
        group = self.group
        if group is None:
            return per_sample
        return torch.zeros_like(per_sample).index_add_(0, group, per_sample)[group] * self.self_pos[:, None]

    def block(self, samples: torch.Tensor, col_samples: torch.Tensor) -> torch.Tensor:
        """(c, N) bool: sample ``samples[r]`` has the sample of column ``k`` as a positive (self included)."""
        if self.mask is not None:
            return self.mask[samples][:, col_samples] != 0
        group = self.group
        if group is None:
            return samples[:, None] == col_samples[None, :]
        same = group[samples][:, None] == group[col_samples][None, :]
        return same & (self.self_pos[samples] != 0)[:, None]


class _Anchors:
    """The anchors: views ``0 .. va - 1`` (all views, or view 0) of samples ``s0 .. s1 - 1``.

    The views are laid out sample-major, column ``k`` of the contrast set being view ``k % V`` of
    sample ``k // V``, so the anchors of a sample are consecutive rows and per-anchor values are
    (samples, va) arrays over which per-sample values broadcast. Anchor ``r`` (row-major over
    (sample, view)) is column ``(s0 + r // va) V + r % va``: for ``va = V`` column ``s0 V + r``,
    for ``va = 1`` column ``(s0 + r) V``, so the anchors' own columns form a strided diagonal of
    any block of rows of the logits.
    """

    def __init__(self, s0: int, s1: int, va: int, v: int, n: int) -> None:
        self.s0, self.s1, self.va, self.v, self.n = s0, s1, va, v, n
        self.b = s1 - s0
        self.m = self.b * va

    def own_columns(self, block: torch.Tensor, start: int) -> torch.Tensor:
        """The anchors' own entries of ``block`` (rows ``start ..`` of an (m, N) matrix), as a strided view."""
        step = 1 if self.va == self.v else self.v  # va is V or 1
        first = (self.s0 + start // self.va) * self.v + start % self.va
        return block.reshape(-1)[first :: self.n + step]

    def samples(self, start: int, stop: int, device: torch.device) -> torch.Tensor:
        """(stop - start,) sample of anchors ``start .. stop - 1``."""
        return self.s0 + torch.arange(start, stop, device=device) // self.va

    def per_anchor(self, per_sample: torch.Tensor) -> torch.Tensor:
        """(b,) per local sample -> (m,) per anchor."""
        return per_sample[:, None].expand(self.b, self.va).reshape(self.m)


def _positive_block(positives: _Positives, anchors: _Anchors, valid: torch.Tensor, device: torch.device) -> Any:
    """``(start, stop) -> (c, N)`` bool positives of anchors ``start .. stop - 1`` (never the anchor
    itself; every column for anchors without a positive, whose finite dummy values are discarded)."""
    col_samples = torch.arange(anchors.n, device=device) // anchors.v

    def block(start: int, stop: int) -> torch.Tensor:
        pos = positives.block(anchors.samples(start, stop, device), col_samples)
        anchors.own_columns(pos, start).fill_(False)
        return pos | ~valid[start:stop, None]

    return block


def _softmax_lse(logits: torch.Tensor, lse_out: torch.Tensor) -> torch.Tensor:
    """Row softmax of ``logits`` (returned) and its log-sum-exp (written to ``lse_out``).

    The largest probability of a row is ``1 / sum(exp(logits - max))``, so
    ``lse = max - log(max(prob))``: two cheap row maxima around one fused softmax, about twice as
    fast as ``torch.logsumexp`` (and ``exp(logits - lse)`` after it).
    """
    top = logits.amax(dim=1)
    prob = torch.softmax(logits, dim=1)
    torch.sub(top, prob.amax(dim=1).log_(), out=lse_out)
    return prob


def _autocast_off(fn: Any) -> Any:
    """Run an autograd Function's ``forward`` / ``backward`` with autocast off: its inputs are already
    in the compute dtype and its hand-written gradient mixes matmuls with in-place and ``out=`` ops
    that must keep that dtype (autocast would turn the matmuls into bfloat16 / float16)."""

    @functools.wraps(fn)
    def run(ctx: Any, *args: Any) -> Any:
        cpu, cuda = torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda")
        if not (cpu or cuda):  # the common case: no autocast context to enter (microseconds a call)
            return fn(ctx, *args)
        with torch.autocast("cpu", enabled=False) if cpu else contextlib.nullcontext():
            with torch.autocast("cuda", enabled=False) if cuda else contextlib.nullcontext():
                return fn(ctx, *args)

    return run


class _SupCon(torch.autograd.Function):
    r"""SupCon as one autograd node: (B, V, D) views -> the scalar loss, with an analytic backward.

    The views ``x`` are flattened sample-major to the contrast set (N, D) (L2-normalized when
    ``normalize``); the anchors are described by :class:`_Anchors`. With
    :math:`s_{ia} = z_i \cdot z_a / \tau`, :math:`P_{ia}` the softmax of :math:`s_{i,:}` over
    :math:`A(i)` (the anchor's own column set to ``-inf``) and :math:`q_{ia}` the target weights,
    :math:`\partial \ell_i / \partial s_{ia} = P_{ia} - q_{ia}`: :math:`q_{ia} = [a \in P(i)] / |P(i)|`
    for ``"out"``, the softmax over :math:`P(i)` for ``"in"``.

    ``"out"`` needs no (m, N) positive mask at all: the positives of a view are the views of its
    positive samples but itself, so :math:`\sum_{p \in P(i)} z_p` is a per-sample sum (of the
    positive samples' summed views) minus the anchor itself, and the :math:`q` part of the
    gradient is a per-sample sum too. With ``block >= m`` the logits are computed in one piece and
    the softmax is kept for backward; otherwise ``block`` anchors at a time, recomputed in
    backward, so that only O(N D) values are saved and the peak memory is O(block N). Anchors
    without a positive are computed on finite values (needs N >= 2; every column a "positive" for
    ``"in"``) and contribute 0. The result is ``scale`` times the sum of the
    per-anchor losses over the number of anchors with a positive (after ``reduce_count``, the
    all-reduce of the distributed case).
    """

    @staticmethod
    @_autocast_off
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        normalize: bool,
        anchors: _Anchors,
        positives: _Positives,
        tau: float,
        variant: str,
        block: int,
        scale: float,
        reduce_count: Any,
    ) -> torch.Tensor:
        n_samples, v, d = x.shape
        b, va, m = anchors.b, anchors.va, anchors.m
        contrast = x.reshape(n_samples * v, d)
        norm = radial = None
        if normalize:  # z = x / |x| (as safe_normalize: an all-zero vector stays 0 and gets a zero gradient)
            raw_norm = robust_norm(contrast, dim=1)
            radial = raw_norm > 0
            norm = torch.where(radial, raw_norm, torch.ones_like(raw_norm))
            contrast = contrast / norm
        own = contrast.view(n_samples, v, d)[anchors.s0 : anchors.s1, :va]  # (b, va, D)
        scaled = own * (1.0 / tau)
        flat = scaled.view(m, d)
        self_pos = positives.self_pos[anchors.s0 : anchors.s1]
        npos = positives.count[anchors.s0 : anchors.s1] * v - self_pos  # per local sample
        invalid = npos <= 0
        npos.clamp_(min=1)
        dense = block >= m
        lse = x.new_empty(m)
        pos_block = None
        if variant == "in":
            lse_pos = x.new_empty(m)
            pos_block = _positive_block(positives, anchors, ~anchors.per_anchor(invalid), x.device)
        probs: list[torch.Tensor] = []
        for start in range(0, m, block):
            stop = min(start + block, m)
            logits = flat[start:stop] @ contrast.T
            anchors.own_columns(logits, start).fill_(-math.inf)  # N >= 2: every row keeps a finite entry
            if pos_block is not None:
                prob_pos = _softmax_lse(logits.masked_fill(~pos_block(start, stop), -math.inf), lse_pos[start:stop])
                if dense:
                    probs.append(prob_pos)
            prob = _softmax_lse(logits, lse[start:stop])
            if dense:
                probs.insert(0, prob)
        if variant == "out":
            per_sample = positives.sample_sums(contrast.view(n_samples, v, d).sum(1))[anchors.s0 : anchors.s1]
            pos_sum = per_sample[:, None, :] - own * self_pos[:, None, None]  # (b, va, D)
            loss = lse.view(b, va) - (scaled * pos_sum).sum(2) / npos[:, None]
        else:
            pos_sum = lse_pos  # saved in the same slot
            loss = (lse - lse_pos).view(b, va) + torch.log(npos)[:, None]
        count = (b - invalid.sum()).to(x.dtype) * va
        if reduce_count is not None:
            count = reduce_count(count)
        factor = scale / count.clamp(min=1)
        total = loss.masked_fill(invalid[:, None], 0).sum() * factor
        ctx.save_for_backward(contrast, norm, radial, scaled, self_pos, npos, invalid, lse, pos_sum, factor, *probs)
        ctx.cfg = (anchors, positives, pos_block, tau, block, dense)
        return total

    @staticmethod
    @_autocast_off
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_total: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        saved = ctx.saved_tensors
        contrast, norm, radial, scaled, self_pos, npos, invalid, lse, pos_sum, factor = saved[:10]
        probs = saved[10:]
        anchors, positives, pos_block, tau, block, dense = ctx.cfg
        b, va, m, v = anchors.b, anchors.va, anchors.m, anchors.v
        n_samples, d = contrast.shape[0] // v, contrast.shape[1]
        g = (~invalid).to(contrast.dtype) * (grad_total * factor)  # per local sample: d total / d loss_i
        flat = scaled.view(m, d)
        if dense:
            p = probs[0]
            if pos_block is None and m == contrast.shape[0] and m <= _SYMMETRIC_MAX_N:
                # every view is an anchor, in column order: one matmul with W + W^T (W = g P)
                w = p * anchors.per_anchor(g / tau)[:, None]
                grad_contrast = (w + w.T) @ contrast
                grad_own = torch.zeros_like(scaled)
            elif pos_block is None:  # the per-anchor factor goes on the (m, D) operands, not on the (m, N) softmax
                grad_own = (p @ contrast).view(b, va, d).mul_((g / tau)[:, None, None])
                grad_contrast = p.T @ (scaled * g[:, None, None]).view(m, d)
            else:
                w = (p - probs[1]).mul_(anchors.per_anchor(g)[:, None])
                grad_own = (w @ contrast).div_(tau).view(b, va, d)
                grad_contrast = w.T @ flat
        else:
            g_anchor = anchors.per_anchor(g)
            grad_own = torch.empty_like(scaled)
            grad_flat = grad_own.view(m, d)
            grad_contrast = torch.zeros_like(contrast)
            for start in range(0, m, block):
                stop = min(start + block, m)
                logits = flat[start:stop] @ contrast.T
                anchors.own_columns(logits, start).fill_(-math.inf)
                if pos_block is not None:
                    q = logits.masked_fill(~pos_block(start, stop), -math.inf).sub_(pos_sum[start:stop, None])
                    w = logits.sub_(lse[start:stop, None]).exp_().sub_(q.exp_())
                else:
                    w = logits.sub_(lse[start:stop, None]).exp_()
                w.mul_(g_anchor[start:stop, None])
                torch.mm(w, contrast, out=grad_flat[start:stop])
                grad_contrast.addmm_(w.T, flat[start:stop])
            grad_own.div_(tau)
        grad_views = grad_contrast.view(n_samples, v, d)
        if pos_block is None:  # "out": minus the mean positive logit, through per-sample sums
            w_pos = g / npos
            grad_own.sub_(pos_sum * (w_pos / tau)[:, None, None])
            weighted = scaled * w_pos[:, None, None]
            per_sample = weighted.sum(1)
            if b != n_samples:
                per_sample = per_sample.new_zeros(n_samples, d).index_copy_(
                    0, torch.arange(anchors.s0, anchors.s1, device=per_sample.device), per_sample
                )
            grad_views.sub_(positives.sample_sums(per_sample, transpose=True)[:, None, :])
            grad_own.add_(weighted.mul_(self_pos[:, None, None]))  # a view is not its own positive
        grad_views[anchors.s0 : anchors.s1, :va] += grad_own
        if norm is not None:  # through z = x / |x|: (g - z (z . g)) / |x|, and 0 for an all-zero x
            along = (contrast * grad_contrast).sum(1, keepdim=True)
            grad_contrast.sub_(contrast * along).div_(norm).mul_(radial)
        return grad_views, *[None] * 9


#: ``B V`` up to which the one-pass path does its per-element work in the kernel of
#: :mod:`rankwise._kernels.supcon` (one call instead of ~25 small torch ops and the transposing
#: add); above, the torch ops (multi-threaded) win on more than one thread. Loaded as
#: ``RANKWISE_NUMBA`` says (see :mod:`rankwise._kernels._loader`): "background" (default): calls
#: before the kernel is loaded use the torch ops (same values up to float rounding) while a daemon
#: thread loads it; "sync": the first call loads it; "off": never.
_NUMBA_MAX_N = 512
#: Smallest temperature at which the kernel forms ``W + W^T`` of normalized views by row and column
#: scaling (``out=3``): with all views anchors the logits are symmetric, so
#: :math:`P_{ji} = P_{ij} e^{\operatorname{lse}_i - \operatorname{lse}_j}` and no transposed access is
#: needed (faster than the tiled transpose). Normalized logits lie in [-1/tau, 1/tau], so every
#: probability is at least :math:`e^{-2/\tau} / N` and stays far above the dtype's smallest normal
#: number at these temperatures (float32: 2e-21 at N = 512); the two logits of a pair differ only
#: by the matmul's rounding, as do the softmax's own inputs.
_FACTOR_MIN_TAU = {torch.float32: 0.05, torch.float64: 0.005}


def _norm_rows(x: torch.Tensor) -> torch.Tensor:
    """Row norms (N, 1) of ``x`` without overflow or underflow at any finite magnitude: float32 rows
    accumulate their squares in float64 (one pass: ``(3.4e38)^2`` and ``(1e-45)^2`` are normal
    float64 numbers), other dtypes take :func:`robust_norm`."""
    if x.dtype == torch.float32:
        return torch.linalg.vector_norm(x, dim=1, keepdim=True, dtype=torch.float64).to(torch.float32)
    return robust_norm(x, dim=1)


def _own_entries(t: torch.Tensor, va: int, v: int) -> torch.Tensor:
    """The anchors' own columns of an (m, N) matrix (m = B va anchors, N = B V views, sample-major):
    its diagonal for ``va == V``, every ``N + V``-th element for ``va == 1`` (a strided view)."""
    return t.diagonal() if va == v else t.view(-1)[:: t.shape[1] + v]


def _safe_normalize(xf: torch.Tensor, normalize: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(z, norm)``: the rows of ``xf`` over their norms (as safe_normalize: an all-zero row, whose
    norm is set to inf, stays 0 and gets a zero gradient), or ``(xf, None)`` without ``normalize``."""
    if not normalize:
        return xf, None
    norm = _norm_rows(xf)
    norm.masked_fill_(norm == 0, math.inf)
    return xf / norm, norm


def _through_normalize(grad: torch.Tensor, z: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """The gradient on ``z = x / |x|`` taken to ``x``: ``(g - z (z . g)) / |x|`` (0 where the norm is inf)."""
    along = (z * grad).sum(1, keepdim=True)
    return torch.addcmul(grad, z, along, value=-1).div_(norm)


def _out_small_kernel(
    xf: torch.Tensor,
    mask: torch.Tensor,
    b: int,
    v: int,
    va: int,
    tau: float,
    scale: float,
    normalize: bool,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:class:`_SupConOutSmall` on CPU with the numba kernels: (value, (N, D) gradient or None)."""
    d = xf.shape[1]
    # float32 views normalized by the kernel: one pass instead of five torch ops, the same values
    fused_norm = normalize and xf.dtype == torch.float32
    if fused_norm:
        z, zs, norm = kernels.normalize_rows(xf, 1.0 / tau)
    else:
        z, norm = _safe_normalize(xf, normalize)
        zs = z * (1.0 / tau)
    sym = va == v
    anchors = zs if sym else zs.view(b, v, d)[:, 0]
    logits = torch.mm(anchors, z.T)
    _own_entries(logits, va, v).fill_(torch.finfo(xf.dtype).min / 2)  # N >= 2: other entries remain
    prob = torch.softmax(logits, 1)
    # weights, value and W (+ W^T) in one kernel call
    # out: 0 the value only, 1 W, 2 W + W^T, 3 W + W^T from the symmetric logits (see below)
    factor = normalize and tau >= _FACTOR_MIN_TAU.get(xf.dtype, math.inf)
    out = ((3 if factor else 2) if sym else 1) if need_grad else 0
    total = kernels.supcon_out(prob, logits, mask, v, va, scale, out)
    if not need_grad:
        return total, None
    w = prob
    if not sym:
        grad = torch.mm(w.T, anchors)
        grad.view(b, v, d)[:, 0] += torch.mm(w, zs)
    else:  # w is W + W^T already
        grad = torch.mm(w, zs)
    if fused_norm:  # in place, as below
        kernels.normalize_rows_backward(grad, z, norm)
    elif norm is not None:
        grad = _through_normalize(grad, z, norm)
    return total, grad


def _out_small_torch(
    xf: torch.Tensor,
    mask: torch.Tensor,
    b: int,
    v: int,
    va: int,
    tau: float,
    scale: float,
    normalize: bool,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    r""":class:`_SupConOutSmall` with torch ops (CUDA, other devices, CPU without the kernels): (value,
    (N, D) gradient or None) in few ops, each one a kernel launch on CUDA (where these sizes are
    bound by the host): 28 in forward and 2 in backward (``benchmarks/host_overhead.py`` counts them
    at B = 1024 with two views, normalized, integer labels; the same at every size above ``N = 512``).

    The value is :math:`-\sum_{ia} T_{ia} \log P_{ia}` from one ``log_softmax`` (``P`` is then its
    ``exp``, the gradient's ``g P - T``); the factor :math:`1 / \tau` rides on the matrix products
    (``alpha``) instead of a scaled copy of the views.
    """
    n, d = xf.shape
    m = b * va
    z, norm = _safe_normalize(xf, normalize)
    anchors = z if va == v else z.view(b, v, d)[:, 0]
    inv_tau = 1.0 / tau
    # beta=0: the first argument is not read (only its shape, broadcast to the result's, matters)
    logits = torch.addmm(z[:1, :1], anchors, z.T, beta=0, alpha=inv_tau)
    _own_entries(logits, va, v).fill_(torch.finfo(xf.dtype).min / 2)  # N >= 2: other entries remain
    log_p = torch.log_softmax(logits, 1)  # finite at the own entries too (their P is exactly 0)
    # per sample (B,): minus the positives of each of its anchors, 0/1 weights g_i (scale over the
    # number of anchors with a positive) and -g_i / |P(i)|
    neg_npos = torch.add(mask.diagonal(), mask.sum(1, dtype=xf.dtype), alpha=-v)
    valid = neg_npos < 0
    count = valid.view(b, 1).expand(b, va).sum(dtype=xf.dtype).clamp_(min=1)  # anchors with a positive
    g = valid / (count if scale == 1.0 else count.div_(scale))  # per sample: d result / d lse_i
    neg_h = g / neg_npos.clamp_(max=-1)
    # -T (m, N) in one op from the (B, B) mask (sample-major rows and columns)
    w = torch.mul(mask.view(b, 1, b, 1).expand(b, va, b, v), neg_h.view(b, 1, 1, 1)).view(m, n)
    _own_entries(w, va, v).fill_(0.0)  # a view is not its own positive
    total = torch.dot(w.view(-1), log_p.view(-1))  # -sum T log P (0 x the finite own log P)
    if not need_grad:
        return total, None
    w.view(b, va, n).addcmul_(log_p.exp_().view(b, va, n), g.view(b, 1, 1))  # d total / d logits = g P - T
    if va != v:
        grad = torch.addmm(z, w.T, anchors, beta=0, alpha=inv_tau)
        grad.view(b, v, d)[:, 0].addmm_(w, z, alpha=inv_tau)
    elif n <= _SYMMETRIC_MAX_N:  # W + W^T: torch's transposing copy is blocked (faster than
        # `w + w.T` on one CPU thread) but single-threaded, the transposed add uses every thread
        # (on other devices, and under torch.compile where the thread count is not traceable)
        one_thread = xf.device.type == "cpu" and not torch.compiler.is_compiling() and torch.get_num_threads() == 1
        grad = torch.addmm(z, w.T.contiguous().add_(w) if one_thread else w + w.T, z, beta=0, alpha=inv_tau)
    else:
        grad = torch.addmm(z, w, z, beta=0, alpha=inv_tau).addmm_(w.T, z, alpha=inv_tau)
    if norm is not None:
        grad = _through_normalize(grad, z, norm)
    return total, grad


class _SupConOutSmall(torch.autograd.Function):
    r"""SupCon ``variant="out"`` on a local batch in one pass, for small problems (the fast path).

    With the (m, N) target weights :math:`T_{ia} = h_i [a \in P(i)]`, :math:`h_i = g_i / |P(i)|`,
    :math:`g_i` the anchor's weight in the result (``scale`` over the number of anchors with a
    positive, 0 for an anchor without one), the result is
    :math:`\sum_i g_i \operatorname{lse}_i - \sum_{ia} T_{ia} s_{ia} = -\sum_{ia} T_{ia} \log P_{ia}`
    (:math:`\sum_a T_{ia} = g_i`, :math:`P` the softmax over :math:`A(i)`) and its gradient on the
    logits is :math:`W = g P - T`, so the gradient on the normalized views is
    :math:`(W + W^\top) z / \tau` (all views anchors) or :math:`W^\top a` plus :math:`W z / \tau` on
    the anchors' rows. It is computed in forward (when ``need_grad``: ``x`` needs a gradient), so
    only the (B, V, D) gradient is kept and backward is one multiplication. ``mask`` (B, B) bool holds
    the positive samples of each sample (its diagonal: whether the other views of a sample are
    positives); N >= 2.

    The anchors' own logits are set to half the dtype's lowest value instead of ``-inf``: their
    probability is still exactly 0, and :math:`\sum T s` needs no mask (``0 * -inf`` would be NaN).
    With torch ops (:func:`_out_small_torch`) the value is :math:`-\sum T \log P` from one
    ``log_softmax`` (finite at the own entries, whose :math:`T` is 0), :math:`P` its ``exp``. On CPU
    up to ``N = _NUMBA_MAX_N`` the weights, the value and ``W`` (``W + W^T``) come from one call of
    the numba kernel (:func:`rankwise._kernels.supcon.supcon_out`, which visits only the positives
    besides one dense pass) after the softmax instead of ~12 torch ops; without ``need_grad`` it
    computes the value only. There, float32 views are also normalized before the logits, and the
    gradient taken through that normalization after the gradient matmul, by one kernel call each
    (:func:`rankwise._kernels.supcon.normalize_rows`: the squared norms summed in float64, so no
    overflow or underflow at any finite magnitude; the same values as the torch ops).
    """

    @staticmethod
    @_autocast_off
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        mask: torch.Tensor,
        va: int,
        tau: float,
        scale: float,
        normalize: bool,
        need_grad: bool,
        exact_positives: bool,
    ) -> torch.Tensor:
        b, v, d = x.shape
        n = b * v
        xf = x.reshape(n, d)
        if n <= _NUMBA_MAX_N and x.device.type == "cpu" and kernels.ready():
            total, grad = _out_small_kernel(xf, mask, b, v, va, tau, scale, normalize, need_grad)
        else:
            total, grad = _out_small_torch(xf, mask, b, v, va, tau, scale, normalize, need_grad)
            if normalize and exact_positives and not torch.compiler.is_compiling():
                # a non-finite feature makes its normalized view, hence every row of the logits and the
                # value, NaN (see _out_small_torch): batch_loss needs no separate pass over the features
                # (eager only: compiled, batch_loss always checks, and a traced side effect here breaks
                # the autograd.Function's graph)
                finite_checked()
        if grad is not None:  # (ctx.needs_input_grad is True under no_grad too)
            ctx.save_for_backward(grad.view(b, v, d))
        return total

    @staticmethod
    @_autocast_off
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_total: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        (grad,) = ctx.saved_tensors
        return grad * grad_total, None, None, None, None, None, None, None


def _floating(t: torch.Tensor | None) -> bool:
    return t is not None and t.is_floating_point()


@batch_loss("features", "labels", "mask")
def supcon_loss(
    features: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    mask: torch.Tensor | None = None,
    temperature: float = 0.1,
    base_temperature: float | None = None,
    contrast_mode: ContrastMode = "all",
    variant: Variant = "out",
    normalize: bool = True,
    chunk_size: int | None = None,
    distributed: DistributedFlag = False,
) -> torch.Tensor:
    r"""Supervised contrastive loss (Khosla et al., NeurIPS'20); SimCLR's NT-Xent without labels.

    The ``B x V`` views :math:`z_a` (L2-normalized when ``normalize``) are all contrasted with each
    other. For an anchor :math:`i`, :math:`A(i)` is every other view and :math:`P(i) \subset A(i)`
    its positives: views of samples with the same label (``labels``), of samples ``j`` with
    ``mask[i, j] != 0`` (``mask``, may be asymmetric), or — with neither — the other views of the
    same sample (SimCLR NT-Xent, Chen et al. 2020). With :math:`s_{ia} = z_i \cdot z_a / \tau`:

    .. math::
        \ell^{out}_i = -\frac{1}{|P(i)|} \sum_{p \in P(i)}
            \log \frac{e^{s_{ip}}}{\sum_{a \in A(i)} e^{s_{ia}}} \quad\text{(eq. 2, ``variant="out"``)}

        \ell^{in}_i = -\log \Bigl(\frac{1}{|P(i)|} \sum_{p \in P(i)}
            \frac{e^{s_{ip}}}{\sum_{a \in A(i)} e^{s_{ia}}}\Bigr) \quad\text{(eq. 3, ``variant="in"``)}

    The loss is :math:`\frac{\tau}{\tau_b}` times the mean of :math:`\ell_i` over the anchors that
    have at least one positive (``base_temperature`` :math:`\tau_b`, ``None`` = ``temperature``, so
    the factor is 1 by default). ``contrast_mode="all"`` uses every view as an anchor, ``"one"``
    only view 0 (the contrast set is always all views). Everything is computed with ``logsumexp``
    (self excluded by ``-inf`` masking), so large unnormalized features, ``temperature=0.01`` and
    half precision give finite values.

    Differences from the public SupCon code: features are normalized here by default (the public
    loss expects normalized input and gives NaN otherwise); anchors without any positive are
    *excluded* from the mean (the public code averages in zeros, pytorch-metric-learning excludes
    them); a batch without any positive gives ``0`` that keeps the graph.

    The loss is one custom autograd node with the analytic gradient (``softmax - target`` on the
    logits, then through the normalization): the positives' mean logit comes from per-sample
    feature sums, so no :math:`(BV)^2` positive mask is ever built for ``variant="out"``. Only
    first-order gradients are supported (double backward raises). With ``chunk_size=None`` the
    :math:`BV \times BV` logits are computed in one piece and their softmax is kept for backward
    when they have at most :math:`2^{26}` elements (256 MiB in float32: ``B = 4096`` with two
    views); larger batches are processed in blocks of about :math:`2^{22}` logits
    (``2**22 // (B V)`` anchors), recomputed in backward, so that peak memory is
    :math:`O(\text{block} \cdot BV)` instead of :math:`O((BV)^2)`. ``chunk_size`` forces blocks of
    that many anchors. The value and gradient are the same for every block size up to
    floating-point rounding. Small problems (``variant="out"``, a local batch, at most
    :math:`2^{20}` anchor x view logits: ``B = 512`` with two views) take a one-pass path with fewer,
    larger torch ops that forms the gradient already in forward (when ``features`` needs one)
    and keeps only that (B, V, D) gradient for backward; on CPU up to ``B V = 256`` its
    per-element work between the two matrix products is one numba call, and the normalization of
    float32 features one before and one after them (when numba is installed; loaded as
    ``RANKWISE_NUMBA`` says), same values up to float rounding.

    ``distributed=True`` / ``"auto"`` (see :mod:`rankwise.distributed`): the views (with gradient)
    and labels of all ranks are gathered; the anchors are this rank's views and :math:`A(i)`,
    :math:`P(i)` range over the **global** batch (without labels, the positives are the other
    views of the same sample, as in a single process). With :math:`V_g` the number of anchors
    with a positive over all ranks (an ``all_reduce``, no host sync), each rank returns
    ``world_size * (tau / tau_b) * (sum of its anchors' losses) / V_g``: the mean over ranks of
    the returned values is the single-process loss on the concatenated batch, and DDP's gradient
    averaging gives the single-process gradient. ``mask`` is not supported then (pass labels).

    Args:
        features: (B, V, D) views, or (B, D) for a single view.
        labels: (B,) or (B, 1) class labels (any dtype comparable with ``==``). Not with ``mask``.
        mask: (B, B) positives between samples (non-zero = positive). Not with ``labels``.
        temperature: :math:`\tau > 0` (0.1 for SupCon, 0.5 for SimCLR in the public recipes).
        base_temperature: :math:`\tau_b > 0` or ``None``.
        contrast_mode: ``"all"`` or ``"one"``.
        variant: ``"out"`` (recommended) or ``"in"``.
        normalize: L2-normalize the features along the last dim first.
        chunk_size: anchors per block, or ``None``: one block up to ``2**26`` logits, else blocks of ``2**22``.
        distributed: ``False`` (local batch), ``True`` or ``"auto"`` (global batch under DDP).

    Shape:
        - features: :math:`(B, V, D)` or :math:`(B, D)`.
        - output: scalar; float32 for float16/bfloat16 input, otherwise the dtype of ``features``.

    Example:
        >>> import torch, rankwise
        >>> g = torch.Generator().manual_seed(0)
        >>> feats = torch.randn(4, 2, 8, generator=g, requires_grad=True)
        >>> loss = rankwise.losses.supcon_loss(feats, torch.tensor([0, 1, 0, 1]))
        >>> loss.backward()
        >>> bool(loss > 0), feats.grad.shape
        (True, torch.Size([4, 2, 8]))
        >>> simclr = rankwise.losses.supcon_loss(feats, temperature=0.5)  # no labels: NT-Xent
    """
    tau = check_positive(temperature, "temperature")
    tau_b = tau if base_temperature is None else check_positive(base_temperature, "base_temperature")
    check_choice(contrast_mode, "contrast_mode", ("all", "one"))
    check_choice(variant, "variant", ("out", "in"))
    chunk = _check_chunk(chunk_size)
    check_bool(normalize, "normalize")
    if labels is not None and mask is not None:
        raise ValueError("`labels` and `mask` cannot both be given; pass one of them (or neither for SimCLR)")
    x = as_views(features)
    b, v, _ = x.shape
    if global_batch_on(distributed):
        if mask is not None:
            raise ValueError("`mask` is not supported with `distributed` on; pass `labels` (or neither for SimCLR)")
        y = None if labels is None else as_labels(labels, b).detach()
        return _supcon_global(x, y, tau, tau_b, contrast_mode, variant, chunk, normalize)
    n = b * v
    va = v if contrast_mode == "all" else 1
    small_max = _SMALL_MAX_ELEMENTS_CUDA if x.device.type == "cuda" else _SMALL_MAX_ELEMENTS
    if variant == "out" and n >= 2 and b * va * n <= small_max and (chunk is None or chunk >= b * va):
        if mask is not None:  # bool (B, B) positive samples: the kernel reads them as they are
            pos = sample_mask(mask, b)
        elif labels is not None:
            y = as_labels(labels, b)  # (the bool result needs no detach)
            pos = torch.eq(y.view(b, 1), y)  # NaN equals nothing, itself included
        else:
            pos = torch.eye(b, dtype=torch.bool, device=x.device)
        need_grad = x.requires_grad and torch.is_grad_enabled()
        with autocast_off(x.device):  # float32 (compute dtype) matmuls under torch.autocast too
            # floating labels / masks need batch_loss's NaN pass: a NaN label only removes positives
            exact = not _floating(labels) and not _floating(mask)
            return _SupConOutSmall.apply(x, pos, va, tau, tau / tau_b, normalize, need_grad, exact)
    if mask is not None:
        positives = _Positives.from_mask(sample_mask(mask, b), x.dtype)
    elif labels is not None:
        positives = _Positives.from_keys(as_labels(labels, b).detach(), x.dtype)
    else:
        positives = _Positives.simclr(b, x.dtype, x.device)
    if n < 2:  # no anchor can have a positive
        return zero_with_graph(features)
    anchors = _Anchors(0, b, va, v, n)
    block = _block_size(chunk, anchors.m, n)
    return _SupCon.apply(x, normalize, anchors, positives, tau, variant, block, tau / tau_b, None)


def _supcon_global(
    x: torch.Tensor,
    labels: torch.Tensor | None,
    tau: float,
    tau_b: float,
    contrast_mode: str,
    variant: str,
    chunk: int | None,
    normalize: bool,
) -> torch.Tensor:
    """Distributed SupCon: this rank's anchors against the gathered views of all ranks."""
    world = get_world_size()
    b, v, _ = x.shape
    layout = batch_layout(b, device=x.device)
    xg = all_gather_with_grad(x, sizes=layout)
    bg = layout.total
    if labels is None:
        positives = _Positives.simclr(bg, x.dtype, x.device)
    else:
        positives = _Positives.from_keys(all_gather_no_grad(labels, sizes=layout), x.dtype)
    n = bg * v
    if n < 2:  # no anchor can have a positive (the same on every rank)
        return zero_with_graph(xg)
    anchors = _Anchors(layout.start, layout.stop, v if contrast_mode == "all" else 1, v, n)
    if anchors.m == 0:
        all_reduce_sum(torch.zeros((), dtype=xg.dtype, device=x.device))  # keep the collectives aligned
        return zero_with_graph(xg)
    block = _block_size(chunk, anchors.m, n)
    scale = world * tau / tau_b
    return _SupCon.apply(xg, normalize, anchors, positives, tau, variant, block, scale, all_reduce_sum)


class SupConLoss(FunctionModule):
    """Module twin of :func:`supcon_loss` holding its hyperparameters."""

    _function = staticmethod(supcon_loss)
    _options = ("temperature", "base_temperature", "contrast_mode", "variant", "normalize", "chunk_size", "distributed")
    _shown = ("temperature", "base_temperature", "contrast_mode!r", "variant!r", "normalize", "chunk_size")

    def __init__(
        self,
        *,
        temperature: float = 0.1,
        base_temperature: float | None = None,
        contrast_mode: ContrastMode = "all",
        variant: Variant = "out",
        normalize: bool = True,
        chunk_size: int | None = None,
        distributed: DistributedFlag = False,
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        if base_temperature is not None:
            check_positive(base_temperature, "base_temperature")
        self.base_temperature = base_temperature
        self.contrast_mode = check_choice(contrast_mode, "contrast_mode", ("all", "one"))
        self.variant = check_choice(variant, "variant", ("out", "in"))
        self.normalize = normalize
        self.chunk_size = _check_chunk(chunk_size)
        self.distributed = distributed


register_loss(
    "supcon", module=SupConLoss, inputs={"features": "embeddings", "labels": "labels"}, takes="embeddings_labels"
)(supcon_loss)
