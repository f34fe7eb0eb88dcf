r"""Gumbel-Sinkhorn relaxed permutations and the exact assignment (Hungarian algorithm).

Mena et al., ICLR 2018, "Learning Latent Permutations with Gumbel-Sinkhorn Networks". The Sinkhorn
operator :math:`S` alternately normalises the rows and the columns of :math:`\exp(X)`; in the log
domain, as in the authors' code (rows first, then columns, ``n_iters`` times),

.. math::
    X \leftarrow X - \operatorname{logsumexp}_{\text{cols}}(X)\,\mathbf 1^\top, \qquad
    X \leftarrow X - \mathbf 1\,\operatorname{logsumexp}_{\text{rows}}(X), \qquad S(X) = \exp(X),

which converges to a doubly stochastic matrix. The Gumbel-Sinkhorn sample is
:math:`S((X + \nu\,G) / \tau)` with :math:`G` i.i.d. standard Gumbel noise, :math:`\nu` the
``noise_factor`` and :math:`\tau` the ``temperature``; as :math:`\tau \to 0` (and enough
iterations) it tends to the permutation matrix :math:`M(X + \nu G)`, the solution of the assignment
problem :math:`\arg\max_P \langle P, X + \nu G\rangle` that :func:`matching` computes exactly.
"""

from __future__ import annotations

import math

import torch

from rankwise._twin import FunctionModule
from rankwise._validation import (
    check_floating_nd,
    check_generator,
    check_int,
    check_positive,
    compute_dtype,
    nan_slices,
)
from rankwise.ops._registry import register_op
from rankwise.ops.permutation import gumbel_noise

__all__ = ["GumbelSinkhorn", "gumbel_sinkhorn", "matching"]


def _check_square(x: torch.Tensor, name: str) -> None:
    if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"`{name}` must have shape (..., n, n) (square in its last two dims), got {tuple(x.shape)}")


def _sinkhorn_log(z: torch.Tensor, n_iters: int) -> torch.Tensor:
    """``n_iters`` row-then-column normalisations of ``exp(z)`` in the log domain; returns the log matrix."""
    for _ in range(n_iters):
        z = z - torch.logsumexp(z, dim=-1, keepdim=True)
        z = z - torch.logsumexp(z, dim=-2, keepdim=True)
    return z


def gumbel_sinkhorn(
    log_alpha: torch.Tensor,
    *,
    temperature: float = 1.0,
    n_iters: int = 20,
    noise_factor: float = 1.0,
    n_samples: int = 1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""Gumbel-Sinkhorn samples: :math:`S((X + \nu G) / \tau)`, nearly doubly stochastic matrices.

    Mena et al., ICLR 2018, "Learning Latent Permutations with Gumbel-Sinkhorn Networks": ``log_alpha``
    :math:`X` scores assigning row ``i`` to column ``j``; each sample perturbs it with i.i.d. standard
    Gumbel noise :math:`G` scaled by ``noise_factor`` :math:`\nu`, divides by ``temperature``
    :math:`\tau` and applies ``n_iters`` log-domain Sinkhorn iterations (rows normalised first, then
    columns, as the authors' ``sinkhorn``): after the last one the columns sum to 1 exactly and the
    rows up to the convergence of the iteration. ``noise_factor=0`` is the deterministic Sinkhorn
    operator :math:`S(X / \tau)`. Gradients flow through :math:`X` (reparameterization; the noise is
    constant), by autograd through the iterations: O(``n_iters`` n²) time and memory per matrix.
    As :math:`\tau \to 0` with enough iterations a sample tends to the permutation matrix of
    :func:`matching` on the perturbed scores; small temperatures need more iterations.

    The noise is drawn from ``generator`` (on the device of ``log_alpha``) or the global RNG, so equal
    generator seeds give equal samples. The authors' code returns ``(batch, n_samples, n, n)``; here
    the samples come first, as in :func:`rankwise.stochastic_neural_sort`.

    Shape:
        - log_alpha: :math:`(*, n, n)` floating.
        - output: :math:`(\text{n\_samples}, *, n, n)`; dtype of ``log_alpha`` (float16/bfloat16
          computed in float32).

    A matrix holding a NaN or inf gives NaN for the whole matrix (docs/conventions.md).

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 1.0, 0.0]])
        >>> g = torch.Generator().manual_seed(0)
        >>> p = rankwise.gumbel_sinkhorn(x, temperature=0.1, n_samples=4, generator=g)
        >>> p.shape
        torch.Size([4, 3, 3])
        >>> rankwise.gumbel_sinkhorn(x, temperature=0.05, noise_factor=0.0)[0].round(decimals=3)
        tensor([[1., 0., 0.],
                [0., 0., 1.],
                [0., 1., 0.]])
    """
    check_floating_nd(log_alpha, "log_alpha")
    _check_square(log_alpha, "log_alpha")
    t = check_positive(temperature, "temperature")
    iters = check_int(n_iters, "n_iters", low=0)
    nu = check_positive(noise_factor, "noise_factor", allow_zero=True)
    m = check_int(n_samples, "n_samples", low=1)
    gen = check_generator(generator, log_alpha)
    x = log_alpha.to(compute_dtype(log_alpha.dtype))
    z = x.unsqueeze(0).expand(m, *x.shape)
    if nu > 0:
        z = z + nu * gumbel_noise(tuple(z.shape), x, gen)
    out = torch.exp(_sinkhorn_log(z / t, iters))
    return nan_slices(out, z.flatten(-2), out_dims=2).to(log_alpha.dtype)


def matching(log_alpha: torch.Tensor) -> torch.Tensor:
    r"""The exact assignment :math:`\arg\max_{\sigma} \sum_i X_{i,\sigma(i)}` of every ``(n, n)`` matrix.

    Solved by the Hungarian algorithm (``scipy.optimize.linear_sum_assignment`` on the negated
    matrix, as in the code of Mena et al., ICLR 2018, "Learning Latent Permutations with
    Gumbel-Sinkhorn Networks"), one matrix at a time on a detached host copy: **not differentiable**,
    and on an accelerator it synchronises with the host. ``perm[..., i]`` is the column assigned to
    row ``i``; the permutation matrix is ``torch.nn.functional.one_hot(perm, n)``. It is the limit of
    :func:`gumbel_sinkhorn` with ``noise_factor=0`` as the temperature goes to 0 (ties: one of the
    optimal assignments).

    Shape:
        - log_alpha: :math:`(*, n, n)` floating, finite.
        - output: :math:`(*, n)` int64 on the device of ``log_alpha``.

    Example:
        >>> import torch, rankwise
        >>> x = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 1.0, 0.0]])
        >>> rankwise.matching(x)
        tensor([0, 2, 1])
    """
    check_floating_nd(log_alpha, "log_alpha")
    _check_square(log_alpha, "log_alpha")
    from scipy.optimize import linear_sum_assignment

    n = log_alpha.shape[-1]
    batch = math.prod(log_alpha.shape[:-2])
    host = log_alpha.detach().to("cpu", torch.float64).reshape(batch, n, n).numpy()
    out = torch.empty(host.shape[:2], dtype=torch.int64)
    for b in range(host.shape[0]):
        if n > 0 and not bool((abs(host[b]) < float("inf")).all()):
            raise ValueError(f"`log_alpha` must be finite, got a matrix with NaN or inf at batch index {b}")
        out[b] = torch.from_numpy(linear_sum_assignment(-host[b])[1])
    return out.reshape(log_alpha.shape[:-1]).to(log_alpha.device)


class GumbelSinkhorn(FunctionModule):
    """Module twin of :func:`gumbel_sinkhorn` (the optional ``generator`` is kept by reference)."""

    _function = staticmethod(gumbel_sinkhorn)
    _options = ("temperature", "n_iters", "noise_factor", "n_samples", "generator")
    _shown = ("temperature", "n_iters", "noise_factor", "n_samples")

    def __init__(
        self,
        *,
        temperature: float = 1.0,
        n_iters: int = 20,
        noise_factor: float = 1.0,
        n_samples: int = 1,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.n_iters = check_int(n_iters, "n_iters", low=0)
        self.noise_factor = check_positive(noise_factor, "noise_factor", allow_zero=True)
        self.n_samples = check_int(n_samples, "n_samples", low=1)
        self.generator = generator


register_op("gumbel_sinkhorn", module=GumbelSinkhorn, stochastic=True)(gumbel_sinkhorn)
