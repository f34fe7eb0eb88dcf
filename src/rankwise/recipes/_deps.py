"""Thin adapters from the recipes to ``rankwise.data`` / ``models`` / ``imbalanced`` / ``losses``.

Everything the training system needs from the rest of the package goes through here, so the
calling conventions of the library functions live in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from rankwise._binning import label_bins_np, snap_floor_np

__all__ = [
    "REGULARIZER_FNS",
    "build_backbone",
    "get_dataset",
    "lds_weight_table",
    "make_fds",
    "regression_loss",
    "regression_metrics",
    "regularizer_fn",
]


def get_dataset(name: str, **options: Any) -> Any:
    from rankwise import data

    return data.get_dataset(name, **options)


def build_backbone(
    kind: str, *, input_dim: int | None, meta: dict[str, Any], options: dict[str, Any]
) -> tuple[nn.Module, int]:
    """``rankwise.models.build_backbone(kind, **options)``, adding the data-dependent options."""
    from rankwise import models

    opts = dict(meta.get("backbone_options", {}) or {})
    opts.update(options)
    if kind == "mlp" and "in_dim" not in opts and input_dim is not None:
        opts["in_dim"] = input_dim
    module, feature_dim = models.build_backbone(kind, **opts)
    return module, int(feature_dim)


def regression_loss(
    pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None, *, kind: str, options: dict[str, Any]
) -> torch.Tensor:
    from rankwise.imbalanced import regression_loss as fn

    return fn(pred, target, weights, kind=kind, reduction="mean", **options)  # type: ignore[arg-type]


def lds_weight_table(
    train_labels: np.ndarray, bin_width: float, *, reweight: str, lds: bool, kernel: str, ks: int, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin weights ``(bins, weights)`` from ``rankwise.imbalanced.lds_weights`` on the full train labels.

    The per-sample weights only depend on the label's bin, so they are stored as a small table
    (sorted integer bins ``floor(y / bin_width)`` and their weight) and looked up for each batch.
    """
    from rankwise.imbalanced import lds_weights

    labels = np.asarray(train_labels, dtype=np.float64).reshape(-1)
    w = lds_weights(
        labels,
        bin_width=bin_width,
        reweight=reweight,  # type: ignore[arg-type]
        lds=lds,
        kernel=kernel,  # type: ignore[arg-type]
        ks=ks,
        sigma=sigma,
    )
    w = w.detach().cpu().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    bins = label_bins_np(labels, bin_width)  # the binning rule of lds_weights / FDS / shot metrics
    ubins, inv = np.unique(bins, return_inverse=True)
    table = np.bincount(inv, weights=w) / np.bincount(inv)
    return ubins, table


def make_fds(
    feature_dim: int,
    *,
    bin_width: float,
    kernel: str,
    ks: int,
    sigma: float,
    momentum: float,
    start_update: int,
    start_smooth: int,
    label_range: tuple[float, float],
) -> nn.Module:
    from rankwise.imbalanced import FDS

    lo = snap_floor_np(np.array(label_range[0]), bin_width) * bin_width
    hi = (snap_floor_np(np.array(label_range[1]), bin_width) + 1) * bin_width
    return FDS(
        feature_dim,
        bin_width=bin_width,
        label_range=(float(lo), float(hi)),
        kernel=kernel,  # type: ignore[arg-type]
        ks=ks,
        sigma=sigma,
        momentum=momentum,
        start_update=start_update,
        start_smooth=start_smooth,
    )


def fds_smooth(fds: nn.Module, features: torch.Tensor, labels: torch.Tensor, epoch: int) -> torch.Tensor:
    return fds(features, labels, epoch)


def fds_update(fds: nn.Module, features: torch.Tensor, labels: torch.Tensor, epoch: int) -> None:
    # sync: per-bin sums are all-reduced over the ranks of a DDP run (no-op in a single process)
    fds.update(features, labels, epoch, sync=True)  # type: ignore[operator]


def regression_metrics(
    preds: np.ndarray, labels: np.ndarray, train_labels: np.ndarray, *, many_shot: int, few_shot: int, bin_width: float
) -> dict[str, Any]:
    from rankwise.imbalanced import regression_metrics as fn

    out = fn(
        torch.as_tensor(preds),
        torch.as_tensor(labels),
        np.asarray(train_labels),
        many_shot=many_shot,
        few_shot=few_shot,
        bin_width=bin_width,
    )
    return _to_builtin(out)


def _to_builtin(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _to_builtin(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_builtin(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.item() if obj.numel() == 1 else obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj


# ---------------------------------------------------------------------------------------- regularizers
# each adapter: (features, preds, targets, weights, **options) -> scalar
# batch-level losses default to distributed="auto": under DDP they are computed on the global batch
# (see rankwise.distributed); a config may still set `distributed: false` in the options.


def _ranksim(features, preds, targets, weights, **opts):
    from rankwise.losses import ranksim_loss

    opts.setdefault("distributed", "auto")
    return ranksim_loss(features, targets, **opts)


def _conr(features, preds, targets, weights, **opts):
    from rankwise.losses import conr_loss

    opts.setdefault("distributed", "auto")
    return conr_loss(features, targets, preds, weights=weights, **opts)


def _spearman(features, preds, targets, weights, **opts):
    from rankwise.losses import spearman_loss

    opts.setdefault("distributed", "auto")
    return spearman_loss(preds, targets, **opts)


def _pairwise(features, preds, targets, weights, **opts):
    from rankwise.losses import pairwise_difference_loss

    opts.setdefault("distributed", "auto")
    return pairwise_difference_loss(preds, targets, **opts)


REGULARIZER_FNS: dict[str, Callable[..., torch.Tensor]] = {
    "ranksim": _ranksim,
    "conr": _conr,
    "spearman": _spearman,
    "pairwise": _pairwise,
}

_LOSS_NAMES = {
    "ranksim": "ranksim_loss",
    "conr": "conr_loss",
    "spearman": "spearman_loss",
    "pairwise": "pairwise_difference_loss",
}


def regularizer_fn(name: str) -> Callable[..., torch.Tensor]:
    return REGULARIZER_FNS[name]


def regularizer_signature_names(name: str) -> list[str] | None:
    """Keyword names the underlying loss accepts (``None`` if it cannot be inspected)."""
    import inspect

    from rankwise import losses

    fn = getattr(losses, _LOSS_NAMES[name], None)
    if fn is None:
        return None
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


def rnc_loss(features: torch.Tensor, labels: torch.Tensor, *, temperature: float) -> torch.Tensor:
    from rankwise.losses import rnc_loss as fn

    return fn(features, labels, temperature=temperature, distributed="auto")
