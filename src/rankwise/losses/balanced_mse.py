r"""Balanced MSE (Ren, Zhang, Yu & Wang, CVPR'22 "Balanced MSE for Imbalanced Visual Regression").

MSE fits the training conditional :math:`p_{train}(y|x)`, which inherits the label imbalance of
:math:`p_{train}(y)`. Balanced MSE fits the balanced conditional instead: with the prediction as the
mean of an isotropic Gaussian :math:`\mathcal N(\hat y, \sigma^2 I)`, the likelihood is renormalized by
the training label density,

.. math::
    \mathcal L = -\log \mathcal N(y; \hat y, \sigma^2 I)
        + \log \int \mathcal N(y'; \hat y, \sigma^2 I)\, p_{train}(y')\, dy',

and the three implementations of the paper differ in how the integral is evaluated. The loss is then
multiplied by :math:`2\sigma^2` *treated as a constant in backward* (``.detach()`` in the authors'
training code), so that its gradient w.r.t. :math:`\hat y` has the scale of plain MSE's.
:math:`\sigma` is usually learnt jointly (:class:`BalancedMSELoss` holds it as a parameter, to be given
its own learning rate: ``sigma_lr`` in the reference, e.g. 1e-2).

Data preparation (the training label density) lives in :mod:`rankwise.imbalanced`:
:func:`~rankwise.imbalanced.fit_label_gmm` (GAI) and :func:`~rankwise.imbalanced.bni_buckets` (BNI).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from rankwise._validation import (
    MissingTrainLabelsError,
    check_choice,
    check_floating,
    check_positive,
    check_real,
    compute_dtype,
    nan_if_nonfinite,
)
from rankwise.losses._registry import register_loss

__all__ = ["BalancedMSELoss", "balanced_mse_loss"]

Method = Literal["bmc", "gai", "bni"]
Reduction = Literal["mean", "sum", "none"]
_METHODS = ("bmc", "gai", "bni")
_REDUCTIONS = ("mean", "sum", "none")

GMM = tuple[Any, Any, Any]


# --------------------------------------------------------------------------------------------------
# argument preparation
# --------------------------------------------------------------------------------------------------
def _as_tensor(x: Any, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        if x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"`{name}` must hold real numbers, got dtype {x.dtype}")
        if x.device != device:
            raise ValueError(f"`{name}` must be on the device of `pred` ({device}), got {x.device}")
        return x.to(dtype=dtype)
    try:
        return torch.as_tensor(x, dtype=dtype, device=device)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"`{name}` must be a tensor, array or sequence of numbers, got {type(x).__name__}") from None


def _check_gmm(gmm: Any, d: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``(means (K, d), variances, weights (K,))``; variances ``(K, d)`` (diagonal) or ``(K, d, d)`` (full)."""
    if not isinstance(gmm, (tuple, list)) or len(gmm) != 3:
        raise TypeError(
            "`gmm` must be a (means, variances, weights) tuple (see rankwise.imbalanced.fit_label_gmm), "
            f"got {type(gmm).__name__}"
        )
    means = _as_tensor(gmm[0], "gmm means", dtype, device)
    var = _as_tensor(gmm[1], "gmm variances", dtype, device)
    weights = _as_tensor(gmm[2], "gmm weights", dtype, device)
    if weights.dim() != 1 or weights.numel() == 0:
        raise ValueError(f"`gmm` weights must have shape (K,) with K >= 1, got {tuple(weights.shape)}")
    k = weights.numel()
    if means.dim() == 1 and d == 1:
        means = means.unsqueeze(-1)
    if tuple(means.shape) != (k, d):
        raise ValueError(f"`gmm` means must have shape ({k}, {d}) for {d}-d targets, got {tuple(means.shape)}")
    if tuple(var.shape) == (k, d, d) and d > 1:
        return means, var, weights
    if tuple(var.shape) in ((k,), (k, 1, 1)) or (d == 1 and tuple(var.shape) == (k, 1)):
        var = var.reshape(k, 1).expand(k, d)  # isotropic: Sigma_k = v_k I
    if tuple(var.shape) != (k, d):
        raise ValueError(
            f"`gmm` variances must have shape ({k}, {d}, {d}) (full), ({k}, {d}) (diagonal) or ({k},) "
            f"(isotropic), got {tuple(var.shape)}"
        )
    return means, var, weights


def _check_mixture(var: torch.Tensor | None, weights: torch.Tensor, var_name: str, w_name: str) -> torch.Tensor:
    """Refuse a mixture whose finite entries are invalid; return the weights divided by their sum.

    ``var`` (``None`` for BNI's buckets): diagonal/isotropic variances (K, d) must be > 0, full
    covariances (K, d, d) positive definite; ``weights`` (K,) must be >= 0 with a positive sum. Non-finite
    entries are left to the NaN policy (a NaN loss). On CPU tensors an invalid mixture raises a
    ValueError (one host read of small tensors); on other devices the check is ``torch._assert_async``
    (no host synchronization: an invalid mixture fails asynchronously with a device-side assertion).
    """
    w_fin = torch.isfinite(weights)
    bad_w = w_fin & (weights < 0)
    w_sum = weights.sum()
    flags = [bad_w.any(), w_fin.all() & ~(w_sum > 0)]
    bad_v = None
    if var is not None:
        if var.dim() == 3:
            fin = torch.isfinite(var).flatten(1).all(-1)
            eye = torch.eye(var.shape[-1], dtype=var.dtype, device=var.device)  # no host-to-device copy
            info = torch.linalg.cholesky_ex(torch.where(fin[:, None, None], var, eye))[1]
            bad_v = fin & (info != 0)
        else:
            bad_v = (torch.isfinite(var) & (var <= 0)).any(-1)
        flags.append(bad_v.any())
    if weights.device.type != "cpu" or torch.compiler.is_compiling():  # no host read: an assertion in the graph
        torch._assert_async(~torch.stack(flags).any(), f"invalid mixture: {var_name} or {w_name}")
        return weights / w_sum
    if bool(torch.stack(flags).any()):
        if var is not None and bad_v is not None and bool(bad_v.any()):
            k = int(bad_v.nonzero()[0, 0])
            if var.dim() == 3:
                raise ValueError(
                    f"{var_name} must be positive definite covariance matrices, got a matrix that is not "
                    f"(component {k}: {var[k].tolist()})"
                )
            raise ValueError(f"{var_name} must be > 0, got {var[k].tolist()} (component {k})")
        if bool(bad_w.any()):
            k = int(bad_w.nonzero()[0, 0])
            raise ValueError(f"{w_name} must be >= 0, got {weights[k].item()!r} (entry {k})")
        raise ValueError(f"{w_name} must have a positive sum, got weights summing to {w_sum.item()!r}")
    return weights / w_sum


# --------------------------------------------------------------------------------------------------
# the three implementations, per sample (B,), before the 2 sigma^2 scale
# --------------------------------------------------------------------------------------------------
def _half_sq_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(|a|^2 - |b|^2) / 2`` summed over the last dim, as ``(a - b)(a + b) / 2``: finite wherever the
    result is, even when ``|a|^2`` and ``|b|^2`` overflow (a zero difference gives 0, never ``0 * inf``)."""
    dif = a - b
    prod = dif * (a + b)
    return 0.5 * torch.where(dif == 0, torch.zeros_like(prod), prod).sum(-1)


def _bmc(p: torch.Tensor, t: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    # ell_i = lse_j(-|yhat_i - y_j|^2 / 2 var) + |yhat_i - y_i|^2 / 2 var, the two squares taken together:
    # logits[i, j] = (|yhat_i - y_i|^2 - |yhat_i - y_j|^2) / 2 var = (y_j - y_i).(2 yhat_i - y_i - y_j) / 2 var
    sd = var.sqrt()
    dt = (t.unsqueeze(0) - t.unsqueeze(1)) / sd  # [i, j] = (y_j - y_i) / sigma
    sm = ((p - t).unsqueeze(1) + (p.unsqueeze(1) - t.unsqueeze(0))) / sd  # (2 yhat_i - y_i - y_j) / sigma
    logits = 0.5 * (dt * sm).sum(-1)
    return torch.logsumexp(logits, dim=1)


def _gai(p: torch.Tensor, t: torch.Tensor, var: torch.Tensor, gmm: tuple[torch.Tensor, ...]) -> torch.Tensor:
    # ell = d/2 log var + lse_k(log phi_k - logdet(S_k)/2 + (|a|^2 - |b_k|^2) / 2) with a = (yhat - y) / sigma and
    # |b_k|^2 the Mahalanobis distance of yhat to mu_k under S_k: the two squares taken together (no overflow)
    means, cov, weights = gmm
    log_w = weights.log()  # a zero-weight component contributes nothing (log 0 = -inf in the log-sum-exp)
    d = p.shape[-1]
    a = ((p - t) / var.sqrt()).unsqueeze(1)  # (B, 1, d)
    diff = p.unsqueeze(1) - means.unsqueeze(0)  # (B, K, d)
    if cov.dim() == 2:  # diagonal covariances: S_k = diag(v_k) + var I
        s = cov + var  # (K, d)
        logdet = torch.log(s).sum(-1)  # (K,)
        b = diff / s.sqrt()  # (B, K, d)
    else:  # full covariances: Cholesky of S_k = Sigma_k + var I (no host sync; NaN if not positive definite)
        s = cov + var * torch.eye(d, dtype=p.dtype, device=p.device)
        chol, _ = torch.linalg.cholesky_ex(s)
        logdet = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
        b = torch.linalg.solve_triangular(chol, diff.permute(1, 2, 0), upper=False).permute(2, 0, 1)  # (B, K, d)
    return 0.5 * d * torch.log(var) + torch.logsumexp(log_w - 0.5 * logdet + _half_sq_diff(a, b), dim=-1)


def _bni(
    p: torch.Tensor, t: torch.Tensor, var: torch.Tensor, centers: torch.Tensor, log_w: torch.Tensor
) -> torch.Tensor:
    # ell = lse_b(log w_b + (|yhat - y|^2 - |yhat - c_b|^2) / 2 var), the squares as (c_b - y).(2 yhat - y - c_b)
    sd = var.sqrt()
    dc = (centers.unsqueeze(0) - t.unsqueeze(1)) / sd  # (B, M, d)
    sm = ((p - t).unsqueeze(1) + (p.unsqueeze(1) - centers.unsqueeze(0))) / sd
    return torch.logsumexp(log_w + 0.5 * (dc * sm).sum(-1), dim=-1)


def balanced_mse_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    noise_var: torch.Tensor | float,
    *,
    method: Method = "bmc",
    gmm: GMM | None = None,
    bucket_centers: torch.Tensor | Sequence[float] | None = None,
    bucket_weights: torch.Tensor | Sequence[float] | None = None,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    r"""Balanced MSE (Ren et al., CVPR'22) for 1-d or d-dimensional regression targets.

    With predictions :math:`\hat y_i`, targets :math:`y_i \in \mathbb R^d`, noise variance
    :math:`\sigma^2` (``noise_var``) and :math:`\lVert\cdot\rVert` the Euclidean norm, the per-sample loss
    :math:`\ell_i` is (additive constants dropped; they cancel between the two terms)

    * ``"bmc"`` (Batch-based Monte-Carlo; the batch's targets sample :math:`p_{train}`): a
      cross-entropy over the batch,

      .. math:: \ell_i = -\log \frac{\exp(-\lVert \hat y_i - y_i\rVert^2 / 2\sigma^2)}
                {\sum_j \exp(-\lVert \hat y_i - y_j\rVert^2 / 2\sigma^2)};

    * ``"gai"`` (GMM-based Analytical Integration; ``gmm=(means, variances, weights)`` fitted on the
      training labels, :func:`rankwise.imbalanced.fit_label_gmm`), with
      :math:`S_k = \Sigma_k + \sigma^2 I`:

      .. math:: \ell_i = \frac{\lVert \hat y_i - y_i\rVert^2}{2\sigma^2} + \frac d2 \log\sigma^2
                + \log\sum_k \phi_k \lvert S_k\rvert^{-1/2}
                  \exp\bigl(-\tfrac12 (\hat y_i - \mu_k)^\top S_k^{-1} (\hat y_i - \mu_k)\bigr);

    * ``"bni"`` (Bin-based Numerical Integration; the training histogram's ``bucket_centers``
      :math:`c_b` and ``bucket_weights`` :math:`w_b`, :func:`rankwise.imbalanced.bni_buckets`):

      .. math:: \ell_i = \frac{\lVert \hat y_i - y_i\rVert^2}{2\sigma^2}
                + \log\sum_b w_b \exp\bigl(-\lVert \hat y_i - c_b\rVert^2 / 2\sigma^2\bigr).

    Each :math:`\ell_i` is multiplied by :math:`2\sigma^2` **detached** (a constant in backward, as in
    the authors' training code), then reduced: ``"mean"`` over the batch (the reference), ``"sum"`` or
    ``"none"`` (shape ``(B,)``). Each :math:`\ell_i` is evaluated with its two squared distances taken
    together (as :math:`(a - b)\cdot(a + b)`, e.g. :math:`(y_j - y_i)\cdot(2\hat y_i - y_i - y_j)` for BMC), so
    it stays finite wherever it is representable even when the squares themselves overflow (float32
    predictions near 1e20); a loss beyond the dtype's range is ``inf``. Values and gradients w.r.t.
    ``pred`` and ``noise_var`` equal the authors' ``bmc_loss``/``gai_loss``/``bni_loss`` (1-d) and
    ``bmc_loss_md``/``gai_loss_md`` (d-dim).
    The GMM's ``variances`` may be full covariances ``(K, d, d)`` (scikit-learn's ``covariances_``),
    diagonal ``(K, d)`` or isotropic ``(K,)``. Mixtures are validated (a ``ValueError`` naming the
    argument): variances > 0 (full covariances positive definite), ``weights`` and ``bucket_weights``
    >= 0 with a positive sum; the weights are then divided by their sum (the rule for weights that do
    not sum to 1; non-finite entries make the loss NaN instead). This check reads the (small) mixture
    tensors on the host: one synchronization per call on a GPU. ``noise_var`` must be positive (a tensor is not checked:
    that would need a host sync). An empty batch gives 0 keeping the graph; a batch of one gives 0 for
    ``"bmc"`` (nothing to contrast with).

    Shape:
        - pred, target: :math:`(B,)` or :math:`(B, d)`, the same shape; floating ``pred``.
        - noise_var: scalar tensor (usually ``sigma ** 2`` of a learnt ``sigma``) or a positive float.
        - gmm: ``means`` :math:`(K, d)` (or :math:`(K,)` for d = 1), ``variances`` as above, ``weights`` :math:`(K,)`.
        - bucket_centers: :math:`(M,)` (d = 1) or :math:`(M, d)`; bucket_weights: :math:`(M,)` (normalised to sum 1).
        - output: scalar, or :math:`(B,)` for ``reduction="none"``; fp16/bf16 computed and returned in float32.

    Example:
        >>> import torch
        >>> from rankwise.losses import balanced_mse_loss
        >>> pred = torch.tensor([[1.0], [2.0], [4.0]], requires_grad=True)
        >>> target = torch.tensor([[1.5], [2.0], [1.0]])
        >>> balanced_mse_loss(pred, target, torch.tensor(1.0))
        tensor(3.1934, grad_fn=<MeanBackward0>)
        >>> gmm = (torch.tensor([[1.0], [3.0]]), torch.tensor([[[0.5]], [[2.0]]]), torch.tensor([0.7, 0.3]))
        >>> balanced_mse_loss(pred, target, torch.tensor(1.0), method="gai", gmm=gmm)
        tensor(1.2539, grad_fn=<MeanBackward0>)
        >>> balanced_mse_loss(pred, target, 1.0, method="bni", bucket_centers=[1.0, 2.0], bucket_weights=[0.5, 0.5])
        tensor(1.0484, grad_fn=<MeanBackward0>)
    """
    check_floating(pred, "pred")
    check_real(target, "target")
    check_choice(method, "method", _METHODS)
    check_choice(reduction, "reduction", _REDUCTIONS)
    if pred.dim() not in (1, 2):
        raise ValueError(f"`pred` must have shape (B,) or (B, d), got {tuple(pred.shape)}")
    if pred.shape != target.shape:
        raise ValueError(
            f"`target` must have the shape of `pred` {tuple(pred.shape)}, got {tuple(target.shape)}; "
            "reshape one of them (e.g. `target.view_as(pred)`)"
        )
    if target.device != pred.device:
        raise ValueError(f"`target` must be on the device of `pred` ({pred.device}), got {target.device}")
    dt = compute_dtype(pred.dtype)
    if target.is_floating_point():
        dt = torch.promote_types(dt, compute_dtype(target.dtype))
    if isinstance(noise_var, torch.Tensor):
        if noise_var.numel() != 1:
            raise ValueError(f"`noise_var` must be a scalar (one element), got shape {tuple(noise_var.shape)}")
        if not noise_var.is_floating_point():
            raise TypeError(f"`noise_var` must be a floating-point tensor or a float, got dtype {noise_var.dtype}")
        if noise_var.device != pred.device:
            raise ValueError(f"`noise_var` must be on the device of `pred` ({pred.device}), got {noise_var.device}")
        dt = torch.promote_types(dt, compute_dtype(noise_var.dtype))
        var = noise_var.to(dt).reshape(())
    else:
        var = torch.full((), check_positive(noise_var, "noise_var"), dtype=dt, device=pred.device)  # no host copy
    p = pred.to(dt)
    t = target.to(dt)
    if p.dim() == 1:
        p, t = p.unsqueeze(-1), t.unsqueeze(-1)
    d = p.shape[-1]

    shared: tuple[torch.Tensor, ...] = (var,)  # inputs every sample's loss depends on (NaN policy)
    if method == "gai":
        if gmm is None:
            raise ValueError("`gmm` is required for method='gai': fit it with rankwise.imbalanced.fit_label_gmm")
        g = _check_gmm(gmm, d, dt, p.device)
        g = (g[0], g[1], _check_mixture(g[1], g[2], "`gmm` variances", "`gmm` weights"))
        shared = (*shared, *g)
        loss = _gai(p, t, var, g)
    elif method == "bni":
        if bucket_centers is None or bucket_weights is None:
            raise ValueError(
                "`bucket_centers` and `bucket_weights` are required for method='bni': build them with "
                "rankwise.imbalanced.bni_buckets"
            )
        centers = _as_tensor(bucket_centers, "bucket_centers", dt, p.device)
        w = _as_tensor(bucket_weights, "bucket_weights", dt, p.device)
        if w.dim() != 1 or w.numel() == 0:
            raise ValueError(f"`bucket_weights` must have shape (M,) with M >= 1, got {tuple(w.shape)}")
        if centers.dim() == 1 and d == 1:
            centers = centers.unsqueeze(-1)
        if tuple(centers.shape) != (w.numel(), d):
            raise ValueError(
                f"`bucket_centers` must have shape ({w.numel()},) or ({w.numel()}, {d}) to match `bucket_weights` "
                f"and {d}-d targets, got {tuple(centers.shape)}"
            )
        w = _check_mixture(None, w, "", "`bucket_weights`")
        shared = (*shared, centers, w)
        loss = _bni(p, t, var, centers, w.log())
    else:
        shared = (*shared, p, t)  # BMC contrasts every sample with the whole batch
        loss = _bmc(p, t, var)
    # NaN/inf policy (docs/conventions.md): a non-finite noise variance, GMM or bucket (or, for BMC, any
    # sample) makes the whole loss NaN; a non-finite pred/target of GAI/BNI its own sample's
    loss = nan_if_nonfinite(loss, *shared)

    loss = loss * (2.0 * var).detach()
    if reduction == "none":
        return loss
    if reduction == "sum" or loss.numel() == 0:
        return loss.sum()
    return loss.mean()


class BalancedMSELoss(nn.Module):
    r"""Module twin of :func:`balanced_mse_loss` holding the noise scale :math:`\sigma` as a parameter.

    ``noise_var = noise_sigma ** 2``; ``noise_sigma`` (initialized to ``init_noise_sigma``) is an
    ``nn.Parameter`` that trains with the model when ``learnable`` (the reference gives it its own
    learning rate, ``sigma_lr``: put ``loss.noise_sigma`` in a separate optimizer param group), and a
    frozen parameter (``requires_grad=False``) otherwise. The GMM and the buckets are stored as buffers
    (they follow ``.to(device)`` and the state dict).

    ``forward(pred, target, noise_var=None)``: ``noise_var`` overrides the module's own
    ``noise_sigma ** 2`` (e.g. to evaluate with a fixed variance).

    ``train_labels`` (the full training labels; the recipes pass them) fits what GAI / BNI need
    when it is not given: ``gmm = fit_label_gmm(train_labels, n_components=gmm_components)`` for
    ``"gai"``, ``bni_buckets(train_labels, bin_width=bucket_width, centers=bucket_center)`` for ``"bni"``
    (``"left"``: unit buckets at the label values for integer ages, as the authors'
    ``get_bucket_info``; ``"mid"`` for labels at bin centres, e.g. abalone's rings + 1.5). They are
    ignored for ``"bmc"``.

    Example:
        >>> import torch
        >>> from rankwise.losses import BalancedMSELoss
        >>> crit = BalancedMSELoss(init_noise_sigma=1.0, method="bmc")
        >>> pred = torch.tensor([[1.0], [2.0], [4.0]], requires_grad=True)
        >>> crit(pred, torch.tensor([[1.5], [2.0], [1.0]]))
        tensor(3.1934, grad_fn=<MeanBackward0>)
        >>> [name for name, _ in crit.named_parameters()]
        ['noise_sigma']
    """

    gmm_means: torch.Tensor | None
    gmm_variances: torch.Tensor | None
    gmm_weights: torch.Tensor | None
    bucket_centers: torch.Tensor | None
    bucket_weights: torch.Tensor | None

    def __init__(
        self,
        init_noise_sigma: float = 1.0,
        *,
        method: Method = "bmc",
        learnable: bool = True,
        gmm: GMM | None = None,
        bucket_centers: torch.Tensor | Sequence[float] | None = None,
        bucket_weights: torch.Tensor | Sequence[float] | None = None,
        reduction: Reduction = "mean",
        train_labels: torch.Tensor | Sequence[float] | None = None,
        gmm_components: int = 8,
        bucket_width: float = 1.0,
        bucket_center: Literal["left", "mid"] = "left",
    ) -> None:
        super().__init__()
        check_choice(method, "method", _METHODS)
        check_choice(reduction, "reduction", _REDUCTIONS)
        sigma = check_positive(init_noise_sigma, "init_noise_sigma")
        if not isinstance(learnable, bool):
            raise TypeError(f"`learnable` must be a bool, got {type(learnable).__name__}")
        width = check_positive(bucket_width, "bucket_width")
        check_choice(bucket_center, "bucket_center", ("left", "mid"))
        if isinstance(gmm_components, bool) or not isinstance(gmm_components, int) or gmm_components < 1:
            raise ValueError(f"`gmm_components` must be a positive int, got {gmm_components!r}")
        try:  # the helpers' messages name `labels`: say that it is `train_labels` here
            if train_labels is not None and method == "gai" and gmm is None:
                from rankwise.imbalanced import fit_label_gmm

                gmm = fit_label_gmm(train_labels, n_components=gmm_components)
            if train_labels is not None and method == "bni" and bucket_centers is None and bucket_weights is None:
                from rankwise.imbalanced import bni_buckets

                bucket_centers, bucket_weights = bni_buckets(train_labels, bin_width=width, centers=bucket_center)
        except (TypeError, ValueError) as e:
            raise type(e)(f"`train_labels` ({method.upper()} fit): {e}") from None
        if method == "gai" and gmm is None:
            raise MissingTrainLabelsError(
                "`gmm` is required for method='gai': fit it with rankwise.imbalanced.fit_label_gmm "
                "(or pass `train_labels`)"
            )
        if method == "bni" and (bucket_centers is None or bucket_weights is None):
            raise MissingTrainLabelsError(
                "`bucket_centers` and `bucket_weights` are required for method='bni': build them with "
                "rankwise.imbalanced.bni_buckets (or pass `train_labels`)"
            )
        self.method, self.reduction, self.learnable = method, reduction, learnable
        self.noise_sigma = nn.Parameter(torch.tensor(sigma, dtype=torch.get_default_dtype()), requires_grad=learnable)

        def buffer(x: Any) -> torch.Tensor | None:
            if x is None:
                return None
            t = x.detach().clone() if isinstance(x, torch.Tensor) else torch.as_tensor(x)
            return t if t.is_floating_point() else t.to(torch.get_default_dtype())

        if gmm is not None and (not isinstance(gmm, (tuple, list)) or len(gmm) != 3):
            raise TypeError(
                "`gmm` must be a (means, variances, weights) tuple (see rankwise.imbalanced.fit_label_gmm), "
                f"got {type(gmm).__name__}"
            )
        g = (None, None, None) if gmm is None else tuple(buffer(v) for v in gmm)
        self.register_buffer("gmm_means", g[0])
        self.register_buffer("gmm_variances", g[1])
        self.register_buffer("gmm_weights", g[2])
        self.register_buffer("bucket_centers", buffer(bucket_centers))
        self.register_buffer("bucket_weights", buffer(bucket_weights))

    @property
    def noise_var(self) -> torch.Tensor:
        """``noise_sigma ** 2``."""
        return self.noise_sigma**2

    def forward(
        self, pred: torch.Tensor, target: torch.Tensor, noise_var: torch.Tensor | float | None = None
    ) -> torch.Tensor:
        var = self.noise_var.to(pred.device) if noise_var is None else noise_var
        gmm = None
        if self.gmm_means is not None and self.gmm_variances is not None and self.gmm_weights is not None:
            gmm = (self.gmm_means, self.gmm_variances, self.gmm_weights)
        return balanced_mse_loss(
            pred,
            target,
            var,
            method=self.method,  # type: ignore[arg-type]
            gmm=gmm,
            bucket_centers=self.bucket_centers,
            bucket_weights=self.bucket_weights,
            reduction=self.reduction,  # type: ignore[arg-type]
        )

    def extra_repr(self) -> str:
        return f"method={self.method!r}, learnable={self.learnable}, reduction={self.reduction!r}"


# --------------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------------


# one entry for every method (option `method`); a training recipe passes it the batch tensors below
register_loss(
    "balanced_mse",
    module=BalancedMSELoss,
    description="Balanced MSE (Ren et al., CVPR'22), any method (option `method`, default 'bmc')",
    inputs={"pred": "predictions", "target": "targets"},
    takes="predictions",
)(balanced_mse_loss)
