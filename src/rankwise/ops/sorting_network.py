r"""Differentiable sorting networks (Petersen et al., ICML'21 and ICLR'22).

A sorting network is a fixed sequence of layers of comparators ``(a, b)``; each comparator writes
``min(x_a, x_b)`` to one wire and ``max`` to the other. The differentiable version replaces the
hard swap with a blend: for ``d = x_b - x_a`` and a sigmoid-like CDF :math:`f`,

.. math::
    \alpha = f(\beta d), \qquad
    \mathrm{min} = \alpha x_a + (1 - \alpha) x_b, \qquad
    \mathrm{max} = (1 - \alpha) x_a + \alpha x_b,

(:math:`\beta` = ``steepness``). Every layer is a doubly stochastic matrix, so the product ``P``
of all layers is doubly stochastic and ``sorted = x @ P``. Here each layer is computed as two
gathers and an element-wise blend over all ``n`` wires at once (no Python loop over comparators
or batch elements); ``P`` is only built when asked for (``return_matrix=True``, the default).

Networks (``network=``): ``"odd_even"`` (odd-even transposition sort, ``n`` layers of ``(i, i+1)``
comparators alternating between even and odd ``i``) and ``"bitonic"`` (``log2(N)(log2(N)+1)/2``
layers, ``N`` = the next power of two); for ``n`` that is not a power of two the bitonic network of
size ``N`` is used with its first ``N - n`` wires removed: comparators between two removed wires
are dropped and those between a removed and a kept wire leave the kept wire unchanged, as in the
authors' implementation. For some such ``n`` (22 and 38 among 2..39) that network does not sort every
input, in the authors' packages as here; rankwise keeps their construction (their numbers) and warns
once per ``n`` and device where a test on random rows shows that it does not sort.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, overload

import torch

from rankwise._registry import RelaxationInfo
from rankwise._twin import FunctionModule
from rankwise._validation import (
    check_bool,
    check_choice,
    check_dim,
    check_floating_nd,
    check_positive,
    compute_dtype,
    nan_slices,
)
from rankwise.ops._registry import register_op
from rankwise.ops.soft import register_soft_method

__all__ = ["DiffSort", "diffsort"]

Network = Literal["odd_even", "bitonic"]
Distribution = Literal["cauchy", "logistic", "logistic_phi", "optimal", "gaussian", "reciprocal"]
NETWORKS: tuple[str, ...] = ("odd_even", "bitonic")
DISTRIBUTIONS: tuple[str, ...] = ("cauchy", "logistic", "logistic_phi", "optimal", "gaussian", "reciprocal")

# the small constants of the authors' implementation (kept so that values match it to rounding)
_PHI_EPS = 1e-10  # logistic_phi: |d| + eps before the power (ART's division at d = 0)
_OPTIMAL_EPS = 1e-10  # optimal: |v| + eps in the 1 / (16 |v|) tails


# ----------------------------------------------------------------------------------------------
# networks
# ----------------------------------------------------------------------------------------------
Comparator = tuple[int, int, bool]  # (a, b, flipped) with a < b; flipped: the min goes to b


def _odd_even_comparators(n: int) -> tuple[list[list[Comparator]], list[int]]:
    """Odd-even transposition sort: ``n`` layers, layer ``l`` compares ``(i, i+1)`` for ``i ≡ l (mod 2)``.

    Returns the two distinct layers and the order in which the ``n`` layers use them.
    """
    patterns = [[(i, i + 1, False) for i in range(start, n - 1, 2)] for start in (0, 1)]
    order = [layer % 2 for layer in range(n) if patterns[layer % 2]]
    return patterns, order


def _bitonic_comparators(n: int) -> tuple[list[list[Comparator]], list[int]]:
    """Bitonic sorting network on ``N = 2^ceil(log2 n)`` wires with the first ``N - n`` wires removed."""
    if n <= 1:
        return [], []
    blocks = math.ceil(math.log2(n))
    size = 1 << blocks
    pad = size - n
    layers: list[list[Comparator]] = []
    for block in range(blocks):
        for stage in range(block + 1):
            m = 1 << (block - stage)  # comparator span
            layer: list[Comparator] = []
            for start in range(0, size, 2 * m):
                for a in range(start, start + m):
                    if a < pad:  # a removed wire takes part: the comparator is dropped / the identity
                        continue
                    flipped = (a >> (block + 1)) & 1 == 1  # the sub-sequence is sorted descending
                    layer.append((a - pad, a + m - pad, flipped))
            layers.append(layer)
    return layers, list(range(len(layers)))


class _LayerTables(NamedTuple):
    """Per-wire tables of one layer (see :class:`_Layers`): indices ``(n,)``, masks and signs ``(n, 1)``."""

    a: torch.Tensor
    b: torch.Tensor
    is_min: torch.Tensor
    u: torch.Tensor
    w: torch.Tensor
    is_a: torch.Tensor
    hsign: torch.Tensor
    msign: torch.Tensor


@dataclass(frozen=True)
class _Layers:
    """A network as per-wire tables of its distinct layers and the order in which it uses them.

    Forward blend (a layer applied to the wires' values): wire ``p`` becomes
    ``wa[p] v[a[p]] + wb[p] v[b[p]]``, where ``(a[p], b[p])`` is the comparator touching ``p``
    (``(p, p)`` for an idle wire) and ``(wa, wb) = (α, 1-α)`` if ``p`` receives the minimum
    (``is_min``), ``(1-α, α)`` otherwise. Transposed blend (the layer's matrix times a vector,
    its adjoint): wire ``q`` becomes ``ta[q] v[u[q]] + tb[q] v[w[q]]`` with ``u``/``w`` the min/max
    destinations of ``q``'s comparator and ``(ta, tb) = (α, 1-α)`` if ``q`` is its ``a`` wire
    (``is_a``), ``(1-α, α)`` otherwise. ``hsign`` is -1 on ``a`` wires, +1 on ``b`` wires and 0 on
    idle ones (the sign of ``∂(x_b - x_a)/∂x_q``); ``msign`` is -1 on wires receiving the minimum,
    +1 on the others. ``α`` is computed per wire (both wires of a
    comparator get the same value; an idle wire gets ``f(0) = 1/2``). Odd-even has only two
    distinct layers, so its tables are O(n), not O(n²).
    """

    tables: tuple[_LayerTables, ...]
    order: tuple[int, ...]

    @property
    def depth(self) -> int:
        return len(self.order)

    def __getitem__(self, layer: int) -> _LayerTables:
        return self.tables[self.order[layer]]


def _splitter_selection_comparators(n: int, k: int) -> tuple[list[list[Comparator]], list[int]]:
    """Splitter selection network selecting (and ordering) the ``k`` largest of ``n`` wires.

    Built on descending ranks (lane 0 shall receive the largest value) and mirrored at the end so that
    the largest values end on the last wires, as in the other networks. Each lane carries the smallest
    rank it can still have. A *splitter cascade* on a group of lanes ``g_0 < ... < g_{s-1}`` has
    ``ceil(log2 s)`` layers; layer ``i`` compares ``g_j`` with ``g_{j+h}`` (max to ``g_j``),
    ``h = 2^(ceil(log2 s) - 1 - i)``, for every ``j`` in the first half of each block of ``2h``
    lanes; afterwards lane ``g_j`` is known to be at least ``2^popcount(j) - 1`` places below the
    group's best, so its rank grows by that. Rounds of cascades (on every group of lanes sharing a
    rank below ``k``, highest rank first, each starting at the first layer where all its lanes are
    free) run until every rank below ``k`` is held by one lane.
    """
    rank, free_at = [0] * n, [0] * n
    layers: list[list[tuple[int, int]]] = []
    lowest, added = 0, True
    while added:
        added = False
        for r in range(k - 1, lowest - 1, -1):
            group = [lane for lane in range(n) if rank[lane] == r]
            size = len(group)
            if size < 2:
                continue
            depth = (size - 1).bit_length()  # ceil(log2 size)
            start = max(free_at[lane] for lane in group)
            while len(layers) < start + depth:
                layers.append([])
            for i in range(depth):
                h = 1 << (depth - 1 - i)
                for block in range(0, size, 2 * h):
                    layers[start + i].extend((group[j], group[j + h]) for j in range(block, min(block + h, size - h)))
            for j, lane in enumerate(group):
                rank[lane] += (1 << bin(j).count("1")) - 1
                free_at[lane] = start + depth
            added = True
        lowest += 1
    # mirror: lane l -> wire n - 1 - l, so the comparator (hi, lo) with the max on hi becomes (a, b), a < b,
    # with the min on a (not flipped)
    patterns = [[(n - 1 - lo, n - 1 - hi, False) for hi, lo in layer] for layer in layers if layer]
    return patterns, list(range(len(patterns)))


def _tables(patterns: list[list[Comparator]], order: list[int], n: int, device: torch.device) -> _Layers:
    tables = []
    for cs in patterns:
        a, b, u, w = list(range(n)), list(range(n)), list(range(n)), list(range(n))
        is_min, is_a, hsign = [True] * n, [True] * n, [0] * n
        for ca, cb, flipped in cs:
            lo, hi = (cb, ca) if flipped else (ca, cb)  # destinations of the min and the max
            a[lo] = a[hi] = ca
            b[lo] = b[hi] = cb
            is_min[hi] = False
            u[ca] = u[cb] = lo
            w[ca] = w[cb] = hi
            is_a[cb] = False
            hsign[ca], hsign[cb] = -1, 1
        idx = [torch.tensor(t, dtype=torch.long, device=device) for t in (a, b, u, w)]
        col = [torch.tensor(t, device=device).unsqueeze(-1) for t in (is_min, is_a)]  # broadcast over B
        sign = torch.tensor(hsign, dtype=torch.int8, device=device).unsqueeze(-1)
        msign = torch.tensor([-1 if m else 1 for m in is_min], dtype=torch.int8, device=device).unsqueeze(-1)
        tables.append(_LayerTables(idx[0], idx[1], col[0], idx[2], idx[3], col[1], sign, msign))
    return _Layers(tuple(tables), tuple(order))


@functools.lru_cache(maxsize=64)
def _layers(network: str, n: int, device: torch.device) -> _Layers:
    patterns, order = _odd_even_comparators(n) if network == "odd_even" else _bitonic_comparators(n)
    if network == "bitonic" and n & (n - 1) and not torch.compiler.is_compiling():  # a host-side check
        _warn_if_not_sorting(patterns, n)
    return _tables(patterns, order, n, device)


def _sorts_random_rows(patterns: list[list[Comparator]], n: int) -> bool:
    """Whether the comparators (applied as exact swaps) sort random permutations of ``0..n-1`` (a test on
    a few rows, on the host, run by the cached :func:`_layers`: a failure proves the network does not sort)."""
    import numpy as np

    rows = max(2, min(256, (1 << 20) // max(n, 1)))
    v = np.argsort(np.random.default_rng(0).random((rows, n)), axis=1)
    for layer in patterns:
        if not layer:
            continue
        c = np.array(layer, dtype=np.int64)
        a, b, flipped = c[:, 0], c[:, 1], c[:, 2].astype(bool)
        lo, hi = np.minimum(v[:, a], v[:, b]), np.maximum(v[:, a], v[:, b])
        v[:, a], v[:, b] = np.where(flipped, hi, lo), np.where(flipped, lo, hi)
    return bool((v == np.arange(n)).all())


def _warn_if_not_sorting(patterns: list[list[Comparator]], n: int) -> None:
    """Warn (once per ``n`` and device: :func:`_layers` is cached) when the bitonic network with removed wires
    does not sort: the construction of the authors' code (Petersen et al.) fails for some ``n`` that are not
    powers of two (22 and 38 among 2..39), and rankwise keeps it to give the authors' numbers."""
    if not _sorts_random_rows(patterns, n):
        import os
        import sys
        import warnings

        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        frame: Any = sys._getframe(0)
        level = 1
        while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
            frame, level = frame.f_back, level + 1  # the warning names the caller's line, outside rankwise
        warnings.warn(
            f"the bitonic network of n = {n} (the network of the next power of two with its first wires "
            "removed, as in the diffsort / difftopk packages) does not sort every input; its results are not "
            "a relaxed sort: use network='odd_even', or pad the input to a power of two",
            UserWarning,
            stacklevel=level,
        )


@functools.lru_cache(maxsize=64)
def _selection_layers(n: int, k: int, device: torch.device) -> _Layers:
    """The splitter selection network of the ``k`` largest of ``n`` (:func:`_splitter_selection_comparators`)."""
    patterns, order = _splitter_selection_comparators(n, k)
    return _tables(patterns, order, n, device)


# ----------------------------------------------------------------------------------------------
# the relaxed comparator: alpha = f(steepness * (x_b - x_a)) and its derivative in d = x_b - x_a
# ----------------------------------------------------------------------------------------------
_SQRT_2PI = math.sqrt(2 * math.pi)


def _alpha(d: torch.Tensor, distribution: str, steepness: float, art_lambda: float, out: torch.Tensor) -> torch.Tensor:
    r"""Probability that the comparator's pair is already in order, :math:`f(\beta d)`, written to ``out``.

    (In-place chains: the same operations, so the same rounding, as the out-of-place formulas.)
    """
    if distribution == "logistic":
        return torch.mul(d, steepness, out=out).sigmoid_()
    if distribution == "logistic_phi":  # activation replacement trick: x / (|x| + eps)^lambda
        den = (d.abs() + _PHI_EPS).pow_(art_lambda)
        return torch.mul(d, steepness, out=out).div_(den).sigmoid_()
    if distribution == "optimal":  # v + 1/2 on [-1/4, 1/4], 1 - 1/(16 v) above, -1/(16 v) below
        v = steepness * d
        tail = 1 / (16 * (v.abs() + _OPTIMAL_EPS))
        return torch.where(v.abs() <= 0.25, v + 0.5, torch.where(v > 0, 1 - tail, tail), out=out)
    v = torch.mul(d, steepness, out=out)
    if distribution == "cauchy":
        return v.atan_().mul_(1 / math.pi).add_(0.5)
    if distribution == "reciprocal":  # (v / (2 + |v|) + 1) / 2
        return v.div_(v.abs().add_(2)).add_(1).mul_(0.5)
    return v.div_(math.sqrt(2.0)).erf_().mul_(0.5).add_(0.5)  # gaussian: Phi(v)


def _dalpha(
    d: torch.Tensor, alpha: torch.Tensor, distribution: str, steepness: float, art_lambda: float
) -> torch.Tensor:
    """``dα/dd`` of :func:`_alpha` (``alpha`` is its value at ``d``); even in ``d``, so ``±d`` may be passed."""
    if distribution == "logistic":
        return steepness * alpha * (1 - alpha)
    if distribution == "logistic_phi":
        ad = d.abs()
        den = ad + _PHI_EPS
        return steepness * alpha * (1 - alpha) * den.pow(-art_lambda - 1) * (den - art_lambda * ad)
    v = steepness * d
    if distribution == "cauchy":
        return steepness / (math.pi * (1 + v * v))
    if distribution == "reciprocal":
        return steepness / (2 + v.abs()).square()
    if distribution == "gaussian":
        return (steepness / _SQRT_2PI) * torch.exp(-0.5 * v * v)
    inner = v.abs() <= 0.25
    return steepness * torch.where(inner, torch.ones_like(v), 1 / (16 * (v.abs() + _OPTIMAL_EPS).square()))


# ----------------------------------------------------------------------------------------------
# the three passes: values (x -> sorted), matrix (alphas -> P), ranks (alphas -> P @ v)
#
# Internally every tensor is "wires first": values (n, B), per-layer α (L, n, B) and the matrix
# (n wires, B, n inputs), B = the flattened leading dims, so each gather is an index_select on dim
# 0 (contiguous blocks: several times faster on CPU than gathering along the last dim).
# ----------------------------------------------------------------------------------------------
def _forward_blend(v: torch.Tensor, alpha: torch.Tensor, t: _LayerTables) -> torch.Tensor:
    beta = 1 - alpha
    wa, wb = torch.where(t.is_min, alpha, beta), torch.where(t.is_min, beta, alpha)
    return _blend(v, t.a, t.b, wa, wb)


def _transposed_blend(v: torch.Tensor, alpha: torch.Tensor, t: _LayerTables) -> torch.Tensor:
    beta = 1 - alpha
    ta, tb = torch.where(t.is_a, alpha, beta), torch.where(t.is_a, beta, alpha)
    return _blend(v, t.u, t.w, ta, tb)


def _blend(v: torch.Tensor, i1: torch.Tensor, i2: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """``w1 * v[i1] + w2 * v[i2]`` over the wires (dim 0); ``w`` are (n, B), ``v`` (n, B) or (n, B, m)."""
    if v.dim() == 3:
        w1, w2 = w1.unsqueeze(-1), w2.unsqueeze(-1)
    if torch.is_grad_enabled():
        return v.index_select(0, i1) * w1 + v.index_select(0, i2) * w2
    # separate products and sum (no fused multiply-add): the same rounding as the authors' code
    return v.index_select(0, i1).mul_(w1).add_(v.index_select(0, i2).mul_(w2))


def _alpha_differentiable(d: torch.Tensor, distribution: str, steepness: float, art_lambda: float) -> torch.Tensor:
    """:func:`_alpha` with out-of-place torch ops (autograd can differentiate it any number of times)."""
    v = d * steepness
    if distribution == "logistic":
        return torch.sigmoid(v)
    if distribution == "logistic_phi":
        return torch.sigmoid(v / (d.abs() + _PHI_EPS).pow(art_lambda))
    if distribution == "optimal":
        tail = 1 / (16 * (v.abs() + _OPTIMAL_EPS))
        return torch.where(v.abs() <= 0.25, v + 0.5, torch.where(v > 0, 1 - tail, tail))
    if distribution == "cauchy":
        return torch.atan(v) / math.pi + 0.5
    if distribution == "reciprocal":
        return (v / (2 + v.abs()) + 1) * 0.5
    return torch.erf(v / math.sqrt(2.0)) * 0.5 + 0.5


def _straight_through(hard: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    """The value of ``hard`` (to rounding) with the derivatives of ``soft``."""
    return soft + (hard - soft).detach()


def _network_differentiable(
    x: torch.Tensor, lay: _Layers, distribution: str, steepness: float, art_lambda: float, error_free: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`_SortingNetwork`'s forward from differentiable torch ops (for higher derivatives); with
    ``error_free`` every layer is the hard swap forward and the relaxed blend backward."""
    alphas = []
    for layer in range(lay.depth):
        t = lay[layer]
        xa, xb = x.index_select(0, t.a), x.index_select(0, t.b)
        alpha = _alpha_differentiable(xb - xa, distribution, steepness, art_lambda)
        alphas.append(alpha)
        beta = 1 - alpha
        x = xa * torch.where(t.is_min, alpha, beta) + xb * torch.where(t.is_min, beta, alpha)
        if error_free:
            x = _straight_through(torch.where(t.is_min, torch.minimum(xa, xb), torch.maximum(xa, xb)), x)
    return x, torch.stack(alphas)


def _matrix_differentiable(alphas: torch.Tensor, lay: _Layers, hard_alphas: torch.Tensor | None) -> torch.Tensor:
    """:class:`_NetworkMatrix`'s forward from differentiable torch ops (for higher derivatives)."""
    n, batch = alphas.shape[1], alphas.shape[2]
    pt = torch.eye(n, dtype=alphas.dtype, device=alphas.device).unsqueeze(1).expand(n, batch, n)
    for layer in range(lay.depth):
        t = lay[layer]
        soft = _forward_blend(pt, alphas[layer], t)
        pt = soft if hard_alphas is None else _straight_through(_forward_blend(pt, hard_alphas[layer], t), soft)
    return pt.permute(1, 2, 0)


def _ranks_differentiable(
    alphas: torch.Tensor, v: torch.Tensor, lay: _Layers, hard_alphas: torch.Tensor | None
) -> torch.Tensor:
    """:class:`_NetworkRanks`'s forward from differentiable torch ops (for higher derivatives); error-free:
    ``P @ v`` with the error-free ``P`` of :func:`_matrix_differentiable` (O(L n²))."""
    if hard_alphas is not None:
        return torch.einsum("biw,wb->ib", _matrix_differentiable(alphas, lay, hard_alphas), v)
    for layer in reversed(range(lay.depth)):
        v = _transposed_blend(v, alphas[layer], lay[layer])
    return v


def _grad_of(
    outputs: list[torch.Tensor | None], grads: list[torch.Tensor | None], inputs: list[torch.Tensor]
) -> list[Any]:
    """``d(sum <grads, outputs>)/d(inputs)`` with a graph (double backward); ``None`` pairs are skipped."""
    pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if o is not None and g is not None]
    wanted = [t for t in inputs if t.requires_grad]
    if not pairs or not wanted:
        return [None] * len(inputs)
    got = iter(
        torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], create_graph=True, allow_unused=True)
    )
    return [next(got) if t.requires_grad else None for t in inputs]


class _SortingNetwork(torch.autograd.Function):
    """``x`` (n, B) -> (sorted values (n, B), per-layer per-wire ``α`` (L, n, B), hard ``α``).

    Saves ``d = x_b - x_a`` and ``α`` of every layer (O(L n B)); the backward runs the layers'
    transposes from the last to the first, adding the path through ``α`` (which also receives
    the gradient of the returned ``α``, used by the matrix and rank passes). With ``error_free``
    each layer writes the exact ``min`` / ``max`` (``α`` is then computed on the exactly swapped
    values) and the third output is the hard ``α`` (1 where ``x_a <= x_b``, not differentiable);
    the backward is the same pass, through the relaxed blends. Without it the third output is empty.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        lay: _Layers,
        distribution: str,
        steepness: float,
        art_lambda: float,
        error_free: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x_in = x
        alphas = x.new_empty((lay.depth, *x.shape))
        signed_d = x.new_empty((lay.depth, *x.shape))
        hard = x.new_empty((lay.depth, *x.shape) if error_free else (0,))
        for layer in range(lay.depth):
            t = lay[layer]
            xa, xb = x.index_select(0, t.a), x.index_select(0, t.b)
            d = torch.sub(xb, xa, out=signed_d[layer])
            alpha = _alpha(d, distribution, steepness, art_lambda, out=alphas[layer])
            if error_free:  # the exact swap: min(x_a, x_b) to the min wire (x_a on a tie), max to the other
                hard[layer] = d >= 0
                x = torch.where(t.is_min, torch.minimum(xa, xb), torch.maximum(xa, xb))
            else:
                beta = 1 - alpha
                # separate products and sum (no fused multiply-add): the same rounding as the authors' code
                x = xa.mul_(torch.where(t.is_min, alpha, beta)).add_(xb.mul_(torch.where(t.is_min, beta, alpha)))
            d.mul_(t.msign)  # keep ∂x_new/∂α = ±(x_a - x_b) = ∓d for backward
        ctx.lay, ctx.opts = lay, (distribution, steepness, art_lambda, error_free)
        ctx.mark_non_differentiable(hard)
        ctx.save_for_backward(alphas, signed_d, x_in)
        return x, alphas, hard

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, g: torch.Tensor, g_alphas: torch.Tensor | None, _g_hard: torch.Tensor | None
    ) -> tuple[Any, ...]:
        alphas, signed_d, x_in = ctx.saved_tensors
        lay: _Layers = ctx.lay
        if torch.is_grad_enabled():  # double backward: through the differentiable formulation
            with torch.enable_grad():
                out, alphas_d = _network_differentiable(x_in, lay, *ctx.opts)
                (gx,) = _grad_of([out, alphas_d], [g, g_alphas], [x_in])
            return gx, None, None, None, None, None
        g, g_alphas = g.detach(), None if g_alphas is None else g_alphas.detach()
        for layer in reversed(range(lay.depth)):
            alpha, sd, t = alphas[layer], signed_d[layer], lay[layer]
            g_alpha = sd * g  # x_new = wa x_a + wb x_b, (wa, wb) = (α, 1-α) or (1-α, α)
            if g_alphas is not None:
                g_alpha.add_(g_alphas[layer])
            h = g_alpha.mul_(_dalpha(sd, alpha, *ctx.opts[:3]))  # gradient w.r.t. d = x_b - x_a, per wire
            hsum = h.index_select(0, t.u).add_(h.index_select(0, t.w)).mul_(t.hsign)
            g = _transposed_blend(g, alpha, t).add_(hsum)
        return g, None, None, None, None, None


class _NetworkMatrix(torch.autograd.Function):
    """``P`` (B, n, n) = product of the layers' matrices, from the per-layer ``α`` (L, n, B).

    Built as (wires, B, inputs). Keeps it only every ``c ≈ sqrt(L)`` layers and recomputes each
    segment in backward: O((L/c + c) n² B) memory instead of autograd's O(L n² B). With
    ``hard_alphas`` (error-free) the layers are applied with the hard ``α`` (an exact permutation
    matrix) and the backward differentiates every layer's relaxed blend at those hard inputs.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, alphas: torch.Tensor, lay: _Layers, hard_alphas: torch.Tensor | None = None
    ) -> torch.Tensor:
        depth, n, batch = lay.depth, alphas.shape[1], alphas.shape[2]
        fwd = alphas if hard_alphas is None else hard_alphas
        pt = torch.eye(n, dtype=alphas.dtype, device=alphas.device).unsqueeze(1).expand(n, batch, n).contiguous()
        seg = math.isqrt(max(depth - 1, 0)) + 1
        checkpoints = []
        for layer in range(depth):
            if layer % seg == 0:
                checkpoints.append(pt)
            pt = _forward_blend(pt, fwd[layer], lay[layer])
        ctx.lay, ctx.seg, ctx.error_free = lay, seg, hard_alphas is not None
        ctx.save_for_backward(alphas, fwd, *checkpoints)
        return pt.permute(1, 2, 0).contiguous()  # P[b, input, wire]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:  # type: ignore[override]
        alphas, fwd, *checkpoints = ctx.saved_tensors
        lay: _Layers = ctx.lay
        if torch.is_grad_enabled():  # double backward: through the differentiable formulation
            with torch.enable_grad():
                hard = fwd if ctx.error_free else None
                (ga,) = _grad_of([_matrix_differentiable(alphas, lay, hard)], [grad], [alphas])
            return ga, None, None
        grad = grad.detach()
        seg, depth = ctx.seg, lay.depth
        g_alphas = torch.empty_like(alphas)
        gt = grad.permute(2, 0, 1).contiguous()  # (wires, B, inputs)
        for start in reversed(range(0, depth, seg)):
            stop = min(start + seg, depth)
            inputs = [checkpoints[start // seg]]
            for layer in range(start, stop - 1):
                inputs.append(_forward_blend(inputs[-1], fwd[layer], lay[layer]))
            for layer in reversed(range(start, stop)):
                pin, t = inputs.pop(), lay[layer]
                diff = pin.index_select(0, t.a).sub_(pin.index_select(0, t.b))
                g_alpha = (gt * diff).sum(-1)
                g_alphas[layer] = torch.where(t.is_min, g_alpha, -g_alpha)
                gt = _transposed_blend(gt, alphas[layer], t)
        return g_alphas, None, None


class _NetworkRanks(torch.autograd.Function):
    """``P @ v`` (n, B) from the per-layer ``α`` without ``P``: transposed blends, last layer first.

    With ``hard_alphas`` (error-free), ``P @ v`` for the error-free ``P`` of :class:`_NetworkMatrix`:
    the output is the hard chain; its backward (``P``'s relaxed blends differentiated at the hard
    partial products ``M_1 ... M_{l-1}``) runs the upstream gradient through the hard layers and
    takes ``∂/∂α_l`` against the relaxed chain ``M_{l+1} ... M_L v``, saved from a second pass.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, alphas: torch.Tensor, v: torch.Tensor, lay: _Layers, hard_alphas: torch.Tensor | None = None
    ) -> torch.Tensor:
        v_in = v
        inputs = alphas.new_empty(alphas.shape)
        for layer in reversed(range(lay.depth)):
            inputs[layer] = v
            v = _transposed_blend(v, alphas[layer], lay[layer])
        if hard_alphas is not None:  # the output: the hard chain (the relaxed one is kept for backward)
            v = v_in
            for layer in reversed(range(lay.depth)):
                v = _transposed_blend(v, hard_alphas[layer], lay[layer])
        fwd = alphas if hard_alphas is None else hard_alphas
        ctx.lay, ctx.error_free = lay, hard_alphas is not None
        ctx.save_for_backward(alphas, fwd, inputs, v_in)
        return v

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:  # type: ignore[override]
        alphas, fwd, inputs, v_in = ctx.saved_tensors
        lay: _Layers = ctx.lay
        if torch.is_grad_enabled():  # double backward: through the differentiable formulation
            with torch.enable_grad():
                hard = fwd if ctx.error_free else None
                (ga,) = _grad_of([_ranks_differentiable(alphas, v_in, lay, hard)], [g], [alphas])
            return ga, None, None, None
        g = g.detach()
        g_alphas = torch.empty_like(alphas)
        for layer in range(lay.depth):
            vin, t = inputs[layer], lay[layer]
            diff = vin.index_select(0, t.u) - vin.index_select(0, t.w)
            g_alphas[layer] = torch.where(t.is_a, diff, -diff) * g
            g = _forward_blend(g, fwd[layer], t)
        return g_alphas, None, None, None


class _Alphas(NamedTuple):
    """The per-layer ``α`` (L, n, B) of a run and, for an error-free run, the hard ``α`` (else ``None``)."""

    soft: torch.Tensor
    hard: torch.Tensor | None


def _run(
    x: torch.Tensor,
    network: str,
    steepness: float,
    distribution: str,
    art_lambda: float,
    descending: bool,
    error_free: bool = False,
) -> tuple[torch.Tensor, _Layers, _Alphas]:
    """Network on ``x`` (sorted dim last, compute dtype): (sorted, layers, per-layer α)."""
    n = x.shape[-1]
    lay = _layers(network, n, x.device)
    if lay.depth == 0:  # n <= 1
        return x, lay, _Alphas(x.new_empty((0, n, math.prod(x.shape[:-1]))), None)
    z = (-x if descending else x).reshape(-1, n).T.contiguous()
    out, alphas, hard = _SortingNetwork.apply(z, lay, distribution, steepness, art_lambda, error_free)
    out = out.T.reshape(x.shape)
    return (-out if descending else out), lay, _Alphas(alphas, hard if error_free else None)


def _matrix(lay: _Layers, alphas: _Alphas, like: torch.Tensor) -> torch.Tensor:
    n = like.shape[-1]
    if lay.depth == 0:  # n <= 1: the identity, connected to the graph
        return torch.eye(n, dtype=like.dtype, device=like.device) + like.unsqueeze(-1) * 0
    out: torch.Tensor = _NetworkMatrix.apply(alphas.soft, lay, alphas.hard)
    return out.reshape(*like.shape, n)


def _ranks(lay: _Layers, alphas: _Alphas, like: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``P @ w`` per row of ``like`` without building ``P``: ``w`` = ``weights`` (n,) of the sorted
    positions, default the positions 1..n (the soft ranks)."""
    n = like.shape[-1]
    pos = torch.arange(1, n + 1, dtype=like.dtype, device=like.device) if weights is None else weights
    if lay.depth == 0:
        return pos + like * 0
    v = pos.unsqueeze(-1).expand(n, alphas.soft.shape[-1]).contiguous()
    out: torch.Tensor = _NetworkRanks.apply(alphas.soft, v, lay, alphas.hard)
    return out.T.reshape(like.shape)


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------
def _check_options(network: Any, distribution: Any, steepness: Any, art_lambda: Any) -> tuple[float, float]:
    check_choice(network, "network", NETWORKS)
    check_choice(distribution, "distribution", DISTRIBUTIONS)
    return check_positive(steepness, "steepness"), check_positive(art_lambda, "art_lambda", allow_zero=True)


@overload
def diffsort(
    x: torch.Tensor,
    *,
    network: Network = ...,
    steepness: float = ...,
    distribution: Distribution = ...,
    art_lambda: float = ...,
    descending: bool = ...,
    dim: int = ...,
    return_matrix: Literal[True] = ...,
    error_free: bool = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def diffsort(
    x: torch.Tensor,
    *,
    network: Network = ...,
    steepness: float = ...,
    distribution: Distribution = ...,
    art_lambda: float = ...,
    descending: bool = ...,
    dim: int = ...,
    return_matrix: Literal[False],
    error_free: bool = ...,
) -> torch.Tensor: ...


def diffsort(
    x: torch.Tensor,
    *,
    network: Network = "odd_even",
    steepness: float = 10.0,
    distribution: Distribution = "cauchy",
    art_lambda: float = 0.25,
    descending: bool = False,
    dim: int = -1,
    return_matrix: bool = True,
    error_free: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    r"""Differentiable sorting network (Petersen et al., ICML'21; monotonic: ICLR'22).

    Runs a sorting network (``network="odd_even"`` or ``"bitonic"``) whose comparators are
    relaxed: for a comparator on wires ``(a, b)`` with :math:`d = x_b - x_a`,
    :math:`\alpha = f(\beta d)` (:math:`\beta` = ``steepness``), the wire receiving the minimum
    gets :math:`\alpha x_a + (1-\alpha) x_b` and the other :math:`(1-\alpha) x_a + \alpha x_b`.
    ``distribution`` picks :math:`f` (``v = βd``):

    * ``"cauchy"`` (default, monotonic): :math:`\arctan(v)/\pi + 1/2`;
    * ``"optimal"`` (monotonic, the optimal sigmoid of ICLR'22): :math:`v + 1/2` on
      :math:`|v| \le 1/4`, :math:`1 - 1/(16 v)` above and :math:`-1/(16 v)` below;
    * ``"reciprocal"`` (monotonic): :math:`\bigl(v / (2 + |v|) + 1\bigr) / 2`;
    * ``"gaussian"``: :math:`\Phi(v)`, the standard normal CDF;
    * ``"logistic"``: :math:`\sigma(v)`;
    * ``"logistic_phi"`` (logistic with ICML'21's activation replacement trick):
      :math:`\sigma\bigl(v / (|d| + 10^{-10})^{\lambda}\bigr)`, :math:`\lambda` = ``art_lambda``.

    (The small constants, ``1e-10`` here and in the ``optimal`` tails, are those of the authors'
    implementation, so that values match it.) The product of the layers is the relaxed permutation
    matrix ``P``, doubly stochastic, with ``P[..., i, j]`` = weight of input ``i`` in sorted
    position ``j`` (the authors' code's orientation, the transpose of the papers' notation):

    .. math::
        \mathrm{sorted}_j = \sum_i x_i P_{ij}, \qquad \texttt{sorted == einsum("...i,...ij->...j", x, P)}.

    Ascending by default; ``descending=True`` applies the network to :math:`-x` and negates the
    result (``-diffsort(-x)``, with that ``P``; for odd-even this is not the flip of the ascending
    output). As ``steepness → ∞``, ``sorted → torch.sort(x).values`` and ``P`` tends to the sorting
    permutation. Values and gradients equal those of the authors' ``diffsort`` package (both
    networks, every distribution) to rounding; the ``gaussian`` backward differs from it by
    ~1e-8 relative because that package rounds ``1 / steepness`` to float32 in its backward.

    Error-free swaps (``error_free=True``; Kim, Yoon & Cho, ICLR 2024, "Generalized Neural Sorting
    Networks with Error-Free Differentiable Swap Functions"): every comparator writes the exact
    :math:`\min(x_a, x_b)` / :math:`\max(x_a, x_b)` forward, so ``sorted`` equals
    ``torch.sort(x).values`` exactly and ``P`` is the exact permutation matrix (on a tie the pair
    is not swapped), while the backward differentiates each layer's relaxed blend (the formulas
    above, ``α`` computed from the exactly swapped values entering that layer): per layer, values
    and matrix are :math:`h + (s - \mathrm{sg}(s))` with :math:`h` the hard and :math:`s` the
    relaxed swap, as in the authors' ``use_ste`` code. The gradient is a surrogate (the forward
    is piecewise constant in ``P``, piecewise linear in ``sorted``); values and gradients equal the
    authors' code to rounding.

    Gradients of any order: the first-order backward is a hand-written pass over the layers; under
    ``create_graph=True`` (Hessian-vector products, ``torch.autograd.gradgradcheck``) the backward
    instead differentiates the same network written with differentiable torch ops, so second
    derivatives are exact (at autograd's memory cost, O(L n²) per row for ``P``).

    Cost: ``L`` layers (``n`` for odd-even, ``⌈log2 n⌉(⌈log2 n⌉+1)/2`` for bitonic), each O(n)
    per row (two gathers and an element-wise blend). With ``return_matrix=False`` only the sorted
    values are computed: O(L n) time and memory. ``P`` costs O(L n²) time and
    O(sqrt(L) n²) memory (segment checkpointing); the authors' code uses O(L n³) time and
    O(L n²) memory.

    Shape:
        - x: :math:`(*, n, *)` floating, sorted along ``dim``.
        - sorted: same shape as ``x``.
        - P (``return_matrix=True``): :math:`(*', n, n)`, :math:`*'` = ``x.shape`` without ``dim``.
        - dtype of ``x`` (float16/bfloat16 computed in float32 and cast back).

    Degenerate inputs: ``n = 0`` gives empty outputs (``P`` of shape ``(*', 0, 0)``), ``n = 1``
    gives ``x`` and ``[[1.]]``; all-equal values give ``sorted == x`` (every :math:`\alpha = 1/2`).
    A NaN or ±inf anywhere in a slice makes that slice's ``sorted`` and ``P`` NaN.

    Returns:
        ``(sorted, P)``, or only ``sorted`` when ``return_matrix=False``.

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[3.0, 1.0, 2.0]])
        >>> s, p = rankwise.diffsort(x, steepness=100.0)
        >>> s.round(decimals=2)
        tensor([[1.0100, 2.0000, 2.9900]])
        >>> torch.allclose(torch.einsum("...i,...ij->...j", x, p), s)
        True
        >>> torch.allclose(p.sum(-1), torch.ones(1, 3)), torch.allclose(p.sum(-2), torch.ones(1, 3))
        (True, True)
        >>> rankwise.diffsort(x, network="bitonic", distribution="optimal", return_matrix=False)
        tensor([[1.0125, 2.0000, 2.9875]])
        >>> s, p = rankwise.diffsort(x, error_free=True)  # exact forward, relaxed backward
        >>> s, p
        (tensor([[1., 2., 3.]]), tensor([[[0., 0., 1.],
                 [1., 0., 0.],
                 [0., 1., 0.]]]))
    """
    check_floating_nd(x, "x")
    beta, lam = _check_options(network, distribution, steepness, art_lambda)
    check_bool(descending, "descending")
    check_bool(return_matrix, "return_matrix")
    check_bool(error_free, "error_free")
    d = check_dim(x, dim)
    xc = x.movedim(d, -1)
    xc = xc.to(compute_dtype(xc.dtype))
    out, layers, alphas = _run(xc, network, beta, distribution, lam, descending, error_free)
    # NaN/inf policy (docs/conventions.md): a non-finite entry makes its whole slice NaN
    sorted_x = nan_slices(out, xc).to(x.dtype).movedim(-1, d)
    if not return_matrix:
        return sorted_x
    return sorted_x, nan_slices(_matrix(layers, alphas, xc), xc, out_dims=2).to(x.dtype)


class DiffSort(FunctionModule):
    """Module twin of :func:`diffsort` holding the network and its relaxation."""

    _function = staticmethod(diffsort)
    _options = (
        "network",
        "steepness",
        "distribution",
        "art_lambda",
        "descending",
        "dim",
        "return_matrix",
        "error_free",
    )
    _shown = (
        "network!r",
        "steepness",
        "distribution!r",
        "art_lambda",
        "descending",
        "dim",
        "return_matrix",
        "error_free",
    )

    def __init__(
        self,
        *,
        network: Network = "odd_even",
        steepness: float = 10.0,
        distribution: Distribution = "cauchy",
        art_lambda: float = 0.25,
        descending: bool = False,
        dim: int = -1,
        return_matrix: bool = True,
        error_free: bool = False,
    ) -> None:
        super().__init__()
        self.steepness, self.art_lambda = _check_options(network, distribution, steepness, art_lambda)
        self.network, self.distribution = network, distribution
        self.descending = check_bool(descending, "descending")
        self.return_matrix = check_bool(return_matrix, "return_matrix")
        self.error_free = check_bool(error_free, "error_free")
        self.dim = dim


# ----------------------------------------------------------------------------------------------
# soft_sort / soft_rank(method="diffsort")
# ----------------------------------------------------------------------------------------------
def _checked_run(
    x: torch.Tensor,
    network: Any,
    steepness: Any,
    distribution: Any,
    art_lambda: Any,
    descending: bool,
    error_free: Any,
) -> tuple[torch.Tensor, torch.Tensor, _Layers, _Alphas]:
    """The options checked, ``x`` (selected dim last) in its compute dtype, and :func:`_run` on it:
    ``(x_compute, sorted values, layers, alphas)`` (the prologue of the soft-method entries)."""
    beta, lam = _check_options(network, distribution, steepness, art_lambda)
    check_bool(error_free, "error_free")
    xc = x.to(compute_dtype(x.dtype))
    out, lay, alphas = _run(xc, network, beta, distribution, lam, descending, error_free)
    return xc, out, lay, alphas


def _diffsort_soft_sort(
    x: torch.Tensor,
    *,
    descending: bool,
    network: Network = "odd_even",
    steepness: float = 10.0,
    distribution: Distribution = "cauchy",
    art_lambda: float = 0.25,
    error_free: bool = False,
) -> torch.Tensor:
    _, out, _, _ = _checked_run(x, network, steepness, distribution, art_lambda, descending, error_free)
    return out.to(x.dtype)


def _diffsort_soft_rank(
    x: torch.Tensor,
    *,
    descending: bool,
    network: Network = "odd_even",
    steepness: float = 10.0,
    distribution: Distribution = "cauchy",
    art_lambda: float = 0.25,
    error_free: bool = False,
) -> torch.Tensor:
    """Soft rank of input ``i`` = :math:`\\sum_j j P_{ij}` (1-based), computed as ``P @ (1..n)``
    through the layers' transposes: O(L n), ``P`` is never built (``error_free``: the exact ranks
    forward, the error-free swaps' gradients backward)."""
    xc, _, layers, alphas = _checked_run(x, network, steepness, distribution, art_lambda, descending, error_free)
    return _ranks(layers, alphas, xc).to(x.dtype)


register_soft_method("diffsort", sort=_diffsort_soft_sort, rank=_diffsort_soft_rank)


def diffsort_topk_mask(
    x: torch.Tensor,
    k: int,
    *,
    network: Network = "odd_even",
    steepness: float = 10.0,
    distribution: Distribution = "cauchy",
    art_lambda: float = 0.25,
    error_free: bool = False,
) -> torch.Tensor:
    """Relaxed top-``k`` membership of the rows of ``x`` (selected dim last): input ``i``'s weight in
    the first ``k`` positions of the descending network, :math:`\\sum_{j < k} P_{ij}`, computed as
    ``P @ u`` (``u`` the indicator of the first ``k`` positions) through the layers' transposes:
    O(L n) per row, ``P`` is never built (``error_free``: the exact membership forward, the error-free
    swaps' gradients backward). ``k`` is checked by the caller (:func:`rankwise.soft_topk`)."""
    xc, _, lay, alphas = _checked_run(x, network, steepness, distribution, art_lambda, True, error_free)
    first = (torch.arange(xc.shape[-1], device=xc.device) < k).to(xc.dtype)
    return _ranks(lay, alphas, xc, first).to(x.dtype)


# ----------------------------------------------------------------------------------------------
# registration
# ----------------------------------------------------------------------------------------------


def _relaxation(network: Network) -> RelaxationInfo:
    """``diffsort(scores, descending=True)`` as a relaxed sort: ``P[i, j]`` is the weight of input ``i``
    in position ``j`` of the descending order (columns), the matrix is the second output."""
    return RelaxationInfo(
        f"diffsort_{network}",
        orientation="columns",
        output=1,
        fixed={"network": network, "descending": True},
        options={"steepness": 10.0, "distribution": "cauchy"},
        straight_through=True,
        description=f"differentiable {network.replace('_', '-')} sorting network (rankwise.diffsort, Petersen et al.)",
    )


register_op("diffsort", module=DiffSort, relaxation=(_relaxation("odd_even"), _relaxation("bitonic")))(diffsort)


# ----------------------------------------------------------------------------------------------
# top-k rows of one input (the top-k classification loss)
# ----------------------------------------------------------------------------------------------
def network_topk_route(
    x: torch.Tensor,
    index: torch.Tensor,
    k: int,
    *,
    network: str,
    steepness: float,
    distribution: str,
    art_lambda: float,
) -> torch.Tensor:
    """Where a network sends input ``index[b]`` of row ``x[b]``: ``out[b, r] = P[b, index[b], n - 1 - r]``
    for ``r < k`` (``P`` as returned by :func:`diffsort`, ascending; ``r = 0`` is the largest wire).

    ``x`` (B, n) in the compute dtype, ``index`` (B,) int64; ``network`` is ``"odd_even"``,
    ``"bitonic"`` or ``"splitter_selection"`` (the selection network of the ``k`` largest). The
    one-hot of ``index`` is pushed through the layers' blends: O(L n B), ``P`` is never built.
    """
    n = x.shape[-1]
    lay = _selection_layers(n, k, x.device) if network == "splitter_selection" else _layers(network, n, x.device)
    onehot = torch.nn.functional.one_hot(index, n).to(x.dtype).T  # (wires, B)
    if lay.depth == 0:  # n <= 1: the identity, connected to the graph
        route = onehot + x.T * 0
    else:
        _, alphas, _ = _SortingNetwork.apply(x.T.contiguous(), lay, distribution, steepness, art_lambda)
        route = onehot
        for layer, alpha in enumerate(alphas.unbind(0)):  # (one unbind: its backward is one stack, not L)
            t = lay[layer]
            beta = 1 - alpha
            wa, wb = torch.where(t.is_min, alpha, beta), torch.where(t.is_min, beta, alpha)
            route = route.index_select(0, t.a) * wa + route.index_select(0, t.b) * wb
    return route.flip(0)[:k].T
