"""Fast stable sorting along the last dimension (shared by the ranking operators)."""

from __future__ import annotations

import torch

from rankwise._kernels import sort as kernels

__all__ = ["sort_last", "sorted_values_last"]

_RADIX_MIN_NUMEL = 2048


def sort_last(x: torch.Tensor, descending: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Stable sort along the last dim: ``(sorted values or None, permutation)``.

    On CPU, float32 inputs of at least ``_RADIX_MIN_NUMEL`` elements are sorted row by row by the
    kernel layer's radix sort (:func:`rankwise._kernels.sort.sort_rows`: linear in n, exactly
    ``torch.sort(stable=True)``'s order, NaN and +-0.0 included; rows on torch's OpenMP team with
    more than one thread) once it is loaded (a custom operator under ``torch.compile``).

    Until then (or without numba) they are sorted as ONE flat
    array of int64 keys ``row * 2^32 + v(x)``, where ``v`` maps float32 bits to int32
    monotonically (negatives' magnitude bits inverted, -0.0 equal to +0.0, NaN above +inf as
    ``torch.sort`` orders them): builds of torch that radix-sort integer arrays do that faster than
    the row-wise comparison sort of floats (benchmarks/ops.py measures both). Other dtypes/devices use
    ``torch.sort(stable=True)``, and so do CPU inputs with at least two rows when torch has more
    than one thread (``torch.sort`` splits the rows across its threads) or under ``torch.compile``
    (the thread count is not a traceable value). The sorted values are
    not gathered here (``None``): callers that need them gather them.
    """
    n = x.shape[-1]
    if x.dtype == torch.float32 and x.device.type == "cpu" and x.numel() >= _RADIX_MIN_NUMEL and kernels.ready():
        perm_rows = kernels.sort_rows(x.detach().reshape(-1, n), descending)
        return None, perm_rows.view(x.shape)
    if (
        x.dtype != torch.float32
        or x.device.type != "cpu"
        or x.numel() < _RADIX_MIN_NUMEL
        or (x.numel() > n and (torch.compiler.is_compiling() or torch.get_num_threads() > 1))
    ):
        vals, perm = torch.sort(x, dim=-1, descending=descending, stable=True)
        return vals, perm
    flat = (x.reshape(-1, n) + 0.0).contiguous()  # + 0.0 turns -0.0 into +0.0 (they tie in torch.sort)
    rows = flat.shape[0]
    bits = flat.view(torch.int32)
    # signed-int32 key with the order of the floats: negatives get their magnitude bits inverted
    v = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    v = torch.where(torch.isnan(flat), torch.full_like(v, 2**31 - 1), v)  # NaN above +inf
    if descending:
        v = torch.bitwise_not(v)
    offsets = torch.arange(rows, dtype=torch.int64, device=x.device).unsqueeze(1)
    key = (v.to(torch.int64) + (offsets << 32)).view(-1)  # row r occupies [r 2^32 - 2^31, r 2^32 + 2^31)
    idx = torch.sort(key, stable=True).indices.view(rows, n)
    perm = (idx - offsets * n).view(x.shape)
    return None, perm


def sorted_values_last(x: torch.Tensor, descending: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`sort_last` but always returns the sorted values (gathered: differentiable in ``x``)."""
    vals, perm = sort_last(x, descending)
    if vals is None:
        vals = x.gather(-1, perm)
    return vals, perm
