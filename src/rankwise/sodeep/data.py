"""Synthetic sequences for training and evaluating SoDeep sorters (generated on the fly, vectorized).

Every family draws a whole batch ``(batch, n)`` at once from a ``torch.Generator`` (reproducible
with a seed) and then applies a random scale (log-uniform in ``[1e-2, 1e2]``) and offset
(``N(0, 10^2)``) per sequence; sorters standardize their input, so these only test invariance.

Families (:data:`FAMILIES`):

* ``uniform`` — i.i.d. ``U(0, 1)``;
* ``normal`` — i.i.d. ``N(0, 1)``;
* ``ramp`` — evenly spaced values in increasing or decreasing order (already sorted);
* ``shuffled_ramp`` — evenly spaced values in random order;
* ``concat`` — concatenation of a uniform block and a normal block of random sizes, scales and
  offsets (two sub-populations at different scales);
* ``mixture`` — each element from one of two Gaussians with random means and widths;
* ``heavy_tail`` — log-normal / Student-like values with outliers;
* ``walk`` — random walk (cumulative sum of normal steps): strongly trending sequences;
* ``ties`` — integers drawn from a few levels (many exact ties), e.g. labels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rankwise._validation import check_choice

__all__ = ["FAMILIES", "generate", "mixed_batch", "true_positions"]

_Gen = Callable[[int, int, torch.Generator], torch.Tensor]


def _uniform(b: int, n: int, g: torch.Generator) -> torch.Tensor:
    return torch.rand(b, n, generator=g)


def _normal(b: int, n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(b, n, generator=g)


def _ramp(b: int, n: int, g: torch.Generator) -> torch.Tensor:
    base = torch.linspace(0, 1, n).expand(b, n)
    flip = torch.rand(b, 1, generator=g) < 0.5
    return torch.where(flip, base.flip(-1), base).clone()


def _shuffled_ramp(b: int, n: int, g: torch.Generator) -> torch.Tensor:
    perm = torch.rand(b, n, generator=g).argsort(-1)
    return perm.to(torch.get_default_dtype()) / max(n - 1, 1)


def _concat(b: int, n: int, g: torch.Generator) -> torch.Tensor:
    u = torch.rand(b, n, generator=g) * torch.exp(torch.randn(b, 1, generator=g)) + torch.randn(b, 1, generator=g)
    v = torch.randn(b, n, generator=g) * torch.exp(torch.randn(b, 1, generator=g)) + torch.randn(b, 1, generator=g)
    cut = torch.randint(1, max(n, 2), (b, 1), generator=g)
    return torch.where(torch.arange(n).expand(b, n) < cut, u, v)


def _mixture(b: int, n: int, g: torch.Generator) -> torch.Tensor:
    mu = torch.randn(b, 2, generator=g) * 3
    sd = torch.exp(torch.randn(b, 2, generator=g) * 0.7)
    pick = (torch.rand(b, n, generator=g) < torch.rand(b, 1, generator=g)).long()
    return mu.gather(1, pick) + sd.gather(1, pick) * torch.randn(b, n, generator=g)


def _heavy_tail(b: int, n: int, g: torch.Generator) -> torch.Tensor:
    lognormal = torch.exp(torch.randn(b, n, generator=g) * (0.5 + torch.rand(b, 1, generator=g)))
    cauchy_like = torch.randn(b, n, generator=g) / (torch.rand(b, n, generator=g) + 0.05)
    which = torch.rand(b, 1, generator=g) < 0.5
    return torch.where(which, lognormal, cauchy_like)


def _walk(b: int, n: int, g: torch.Generator) -> torch.Tensor:
    drift = torch.randn(b, 1, generator=g) * 0.3
    return (torch.randn(b, n, generator=g) + drift).cumsum(-1)


def _ties(b: int, n: int, g: torch.Generator) -> torch.Tensor:
    levels = torch.randint(2, max(n // 2, 3), (b, 1), generator=g)
    return torch.floor(torch.rand(b, n, generator=g) * levels)


_FAMILY_FNS: dict[str, _Gen] = {
    "uniform": _uniform,
    "normal": _normal,
    "ramp": _ramp,
    "shuffled_ramp": _shuffled_ramp,
    "concat": _concat,
    "mixture": _mixture,
    "heavy_tail": _heavy_tail,
    "walk": _walk,
    "ties": _ties,
}

#: names of the synthetic families, in a fixed order.
FAMILIES: tuple[str, ...] = tuple(_FAMILY_FNS)


def generate(
    family: str,
    batch: int,
    seq_len: int,
    *,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    scale_offset: bool = True,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``(batch, seq_len)`` sequences of one family (see the module docstring).

    Pass ``generator`` (a CPU ``torch.Generator``) or ``seed`` for reproducibility; with neither the
    global RNG is used. Data are drawn on the CPU and then moved to ``device``.

    Example:
        >>> from rankwise.sodeep.data import generate
        >>> generate("shuffled_ramp", 2, 5, seed=0).shape
        torch.Size([2, 5])
    """
    check_choice(family, "family", FAMILIES)
    if batch < 0 or seq_len < 1:
        raise ValueError(f"`batch` must be >= 0 and `seq_len` >= 1, got batch={batch}, seq_len={seq_len}")
    g = generator
    if g is None:
        g = torch.Generator()
        g.manual_seed(int(seed) if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    x = _FAMILY_FNS[family](batch, seq_len, g).to(torch.float64)
    if scale_offset:
        scale = torch.exp((torch.rand(batch, 1, generator=g, dtype=torch.float64) * 2 - 1) * 4.6)  # 1e-2 .. 1e2
        offset = torch.randn(batch, 1, generator=g, dtype=torch.float64) * 10
        if family == "ties":  # keep ties exact after the affine map
            scale = scale.round().clamp_min(1)
            offset = offset.round()
        x = x * scale + offset
    return x.to(device=device, dtype=dtype)


def mixed_batch(
    batch: int,
    seq_len: int,
    *,
    generator: torch.Generator,
    families: tuple[str, ...] = FAMILIES,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A batch mixing all ``families`` (as equal as possible), rows shuffled."""
    k = len(families)
    sizes = [batch // k + (1 if i < batch % k else 0) for i in range(k)]
    parts = [generate(f, s, seq_len, generator=generator, dtype=dtype) for f, s in zip(families, sizes) if s > 0]
    x = torch.cat(parts, 0)
    x = x[torch.randperm(x.shape[0], generator=generator)]
    return x.to(device)


def true_positions(x: torch.Tensor) -> torch.Tensor:
    """Training target: ascending fractional positions ``(r_avg - 1) / (n - 1)`` in ``[0, 1]``.

    ``r_avg`` are ascending average (tie-aware) ranks, so tied elements share one target.
    """
    from rankwise.ops.ranking import rank

    n = x.shape[-1]
    r = rank(x, ties="average")
    return (r - 1) / max(n - 1, 1)
