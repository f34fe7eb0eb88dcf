r"""Training-label densities for Balanced MSE (Ren et al., CVPR'22): a GMM (GAI) and a histogram (BNI).

Balanced MSE needs the training label distribution :math:`p_{train}(y)` in closed form:

* :func:`fit_label_gmm` fits a Gaussian mixture (scikit-learn ``GaussianMixture``, imported lazily,
  ``random_state=0`` and full covariances as in the authors' ``preprocess_gmm.py``) for
  ``method="gai"`` of :func:`rankwise.losses.balanced_mse_loss`;
* :func:`bni_buckets` turns the training label histogram (optionally LDS-smoothed) into the bucket
  centres and weights of ``method="bni"``, as the authors' ``get_bucket_info`` does for integer ages.

Both are data-preparation steps run once on the training labels (host syncs allowed; not differentiable).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from rankwise._binning import snap_floor
from rankwise._validation import check_choice, check_positive_int
from rankwise.imbalanced.lds import Kernel, as_float64_tensor, bin_labels, get_lds_kernel_window, smooth_bins

__all__ = ["bni_buckets", "fit_label_gmm"]

_KERNELS = ("gaussian", "triang", "laplace")


def _labels_2d(labels: Any) -> torch.Tensor:
    y = as_float64_tensor(labels, "labels")
    if y.dim() > 2:
        raise ValueError(f"`labels` must have shape (N,) or (N, d), got {tuple(y.shape)}")
    y = y.reshape(-1, 1) if y.dim() <= 1 else y
    if y.numel() and not bool(torch.isfinite(y).all()):
        raise ValueError("`labels` must be finite, got NaN or inf")
    return y


#: labels spanning more than this are fitted after scaling (their squares would overflow float64 in EM)
_GMM_RAW_SPAN = 1e100


def fit_label_gmm(
    labels: Any, n_components: int = 8, *, random_state: int | None = 0, **gmm_options: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Fit a Gaussian mixture to the training labels: ``(means (K, d), covariances (K, d, d), weights (K,))``.

    :math:`p_{train}(y) = \sum_k \phi_k \mathcal N(y; \mu_k, \Sigma_k)`, fitted by EM with scikit-learn's
    ``GaussianMixture(n_components, covariance_type="full", random_state=0)`` (the authors' GAI
    preprocessing; scikit-learn is a training dependency, imported here only). Extra keyword
    arguments go to ``GaussianMixture`` (e.g. ``max_iter``, ``tol``, ``n_init``). Pass the result as
    ``gmm=`` to :func:`rankwise.losses.balanced_mse_loss` / :class:`rankwise.losses.BalancedMSELoss`.

    Shape:
        - labels: :math:`(N,)` or :math:`(N, d)` real training labels (tensor, array or sequence),
          :math:`N \ge` ``n_components``.
        - output: float64 CPU tensors ``means`` :math:`(K, d)`, ``covariances`` :math:`(K, d, d)`,
          ``weights`` :math:`(K,)` (summing to 1).

    Example:
        >>> import torch
        >>> from rankwise.imbalanced import fit_label_gmm
        >>> y = torch.cat([torch.zeros(50), torch.full((50,), 10.0)]) + torch.linspace(-1, 1, 100)
        >>> means, covs, weights = fit_label_gmm(y, n_components=2)
        >>> means.flatten().sort().values.round(decimals=2), weights
        (tensor([-0.5100, 10.5100], dtype=torch.float64), tensor([0.5000, 0.5000], dtype=torch.float64))
    """
    k = check_positive_int(n_components, "n_components")
    y = _labels_2d(labels)
    if y.shape[0] < k:
        raise ValueError(f"`labels` must hold at least n_components={k} labels to fit the GMM, got {y.shape[0]}")
    try:
        from sklearn.mixture import GaussianMixture
    except ImportError:
        raise ImportError(
            "fit_label_gmm needs scikit-learn: `pip install scikit-learn` (or `pip install rankwise[train]`)"
        ) from None
    options = {"covariance_type": "full", **gmm_options}
    if options["covariance_type"] != "full":
        raise ValueError(f"`covariance_type` must be 'full' (the GAI loss takes full covariances), got {options!r}")
    yn = y.numpy()
    with np.errstate(over="ignore"):
        center = yn.mean(axis=0) if np.isfinite(yn.mean(axis=0)).all() else np.zeros(yn.shape[1])
    scale = float(np.max(np.abs(yn - center))) if yn.size else 1.0
    if scale <= _GMM_RAW_SPAN:  # scikit-learn on the labels themselves (the authors' preprocessing)
        center, scale = np.zeros(yn.shape[1]), 1.0
    else:  # squares of such labels overflow float64: EM on scaled labels, the mixture mapped back
        options.setdefault("reg_covar", 1e-6 / scale / scale)
    gmm = GaussianMixture(n_components=k, random_state=random_state, **options).fit((yn - center) / scale)
    with np.errstate(over="ignore"):
        means = np.asarray(gmm.means_, dtype=np.float64) * scale + center
        covs = np.asarray(gmm.covariances_, dtype=np.float64) * (scale * scale)
    if not (np.isfinite(means).all() and np.isfinite(covs).all()):
        raise ValueError(
            f"`labels` span {scale:.3g}: the variances of their mixture overflow float64; rescale the labels"
        )
    return (
        torch.from_numpy(means),
        torch.from_numpy(covs),
        torch.from_numpy(np.asarray(gmm.weights_, dtype=np.float64)),
    )


def bni_buckets(
    labels: Any,
    *,
    bin_width: float = 1.0,
    bins: torch.Tensor | np.ndarray | Sequence[float] | None = None,
    label_range: tuple[float, float] | None = None,
    centers: Literal["left", "mid"] = "left",
    lds: bool = False,
    kernel: Kernel = "gaussian",
    ks: int = 5,
    sigma: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Bucket centres and weights of the training label histogram, for Balanced MSE's BNI.

    The labels are binned by :func:`rankwise.imbalanced.bin_labels` (unit bins by default; ``bin_width``,
    explicit ``bins`` edges or ``label_range`` as there), the counts are optionally smoothed with the LDS
    kernel window (``lds=True``, zero padding, as :func:`~rankwise.imbalanced.lds_weights`), buckets of
    weight 0 are dropped and the weights are normalized to sum to 1. A bucket's centre is its left
    edge (``centers="left"``: for integer labels with unit bins, the label value itself — the authors'
    ``get_bucket_info``, whose bucket ``k`` holds the ages ``k``) or its middle (``"mid"``, for
    continuous labels).

    Shape:
        - labels: :math:`(N,)` real training labels (tensor, array or sequence), :math:`N \ge 1`.
        - output: float64 CPU tensors ``bucket_centers`` :math:`(M,)` and ``bucket_weights`` :math:`(M,)`.

    Example:
        >>> from rankwise.imbalanced import bni_buckets
        >>> bni_buckets([1, 1, 1, 2, 5])
        (tensor([1., 2., 5.], dtype=torch.float64), tensor([0.6000, 0.2000, 0.2000], dtype=torch.float64))
        >>> bni_buckets([0.05, 0.12, 0.18], bin_width=0.1, centers="mid")[0]
        tensor([0.0500, 0.1500], dtype=torch.float64)
    """
    check_choice(centers, "centers", ("left", "mid"))
    check_choice(kernel, "kernel", _KERNELS)
    y = as_float64_tensor(labels, "labels").reshape(-1)
    if y.numel() == 0:
        raise ValueError("`labels` must hold at least one training label, got none")
    if not bool(torch.isfinite(y).all()):
        raise ValueError("`labels` must be finite, got NaN or inf")
    window = get_lds_kernel_window(kernel, ks, sigma) if lds else None
    idx, nb = bin_labels(y, bin_width=bin_width, bins=bins, label_range=label_range)
    counts = torch.bincount(idx, minlength=nb).to(torch.float64)
    if bins is not None:
        edges = as_float64_tensor(bins, "bins").reshape(-1)
        left, right = edges[:-1], edges[1:]
    else:
        w = float(bin_width)
        if label_range is not None:
            lo = float(label_range[0])
        else:  # data-driven bins start at the multiple of bin_width holding the smallest label
            lo = float(snap_floor(y, w).min()) * w
        left = lo + w * torch.arange(nb, dtype=torch.float64)
        right = left + w
    if window is not None:
        counts = smooth_bins(counts, window, mode="constant")
    keep = counts > 0
    center = left if centers == "left" else (left + right) / 2
    weights = counts[keep]
    return center[keep].clone(), weights / weights.sum()
