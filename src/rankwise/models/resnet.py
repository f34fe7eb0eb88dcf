"""torchvision ResNet backbones without the classification layer (no weight downloads)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from rankwise._fileio import UnreadableWeightsError, load_weights_only
from rankwise._validation import check_positive_int
from rankwise.models._registry import register_backbone

__all__ = ["RESNET_FEATURE_DIMS", "resnet_backbone"]

RESNET_FEATURE_DIMS = {"resnet18": 512, "resnet34": 512, "resnet50": 2048, "resnet101": 2048}


def _clean_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip ``module.`` (DataParallel) / ``encoder.`` / ``backbone.`` prefixes; drop ``fc.*``."""
    out = {}
    for key, value in state.items():
        k = key
        for prefix in ("module.", "encoder.", "backbone."):
            if k.startswith(prefix):
                k = k[len(prefix) :]
        if k.startswith("fc."):
            continue
        out[k] = value
    return out


def resnet_backbone(
    name: str = "resnet18", *, weights_path: str | Path | None = None, in_channels: int = 3
) -> tuple[nn.Module, int]:
    """A torchvision ResNet with ``fc`` replaced by ``Identity``: ``(module, feature_dim)``.

    ``module(x)`` maps images ``(B, in_channels, H, W)`` (any ``H, W`` >= 32) to the pooled
    features ``(B, feature_dim)`` (512 for ResNet-18/34, 2048 for ResNet-50/101), the layer the
    DIR papers regularize. Weights are randomly initialized (the DIR papers train from scratch);
    nothing is downloaded. ``weights_path``: a local ``state_dict`` file (loaded with
    ``torch.load(..., weights_only=True)``; ``module.``/``encoder.``/``backbone.`` prefixes are
    stripped and ``fc.*`` keys ignored, every other key must match). ``in_channels != 3``
    replaces the first convolution (e.g. 1 for grey images).

    Example:
        >>> import torch
        >>> net, dim = resnet_backbone("resnet18")
        >>> net(torch.randn(2, 3, 32, 32)).shape, dim
        (torch.Size([2, 512]), 512)
    """
    if name not in RESNET_FEATURE_DIMS:
        raise ValueError(f"`name` must be one of {sorted(RESNET_FEATURE_DIMS)}; got {name!r}")
    check_positive_int(in_channels, "in_channels")
    try:
        from torchvision import models
    except ImportError:
        raise ImportError("ResNet backbones need torchvision: `pip install torchvision`") from None
    net = getattr(models, name)(weights=None)
    if in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    net.fc = nn.Identity()
    if weights_path is not None:
        path = Path(weights_path)
        if not path.is_file():
            raise FileNotFoundError(f"`weights_path` not found: {path}")
        try:
            state = load_weights_only(path)
        except UnreadableWeightsError as e:
            raise ValueError(f"`weights_path` {path} is not a readable weights file: {e.reason}") from None
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        if not isinstance(state, dict):
            raise ValueError(f"`weights_path` {path} must hold a state_dict, got {type(state).__name__}")
        try:
            result = net.load_state_dict(_clean_state_dict(state), strict=False)
        except RuntimeError as err:  # shape mismatches
            raise ValueError(
                f"`weights_path` {path} does not match {name} (in_channels={in_channels}): {err}"
            ) from None
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(
                f"`weights_path` {path} does not match {name} (in_channels={in_channels}): "
                f"missing keys {result.missing_keys[:5]}, unexpected keys {result.unexpected_keys[:5]}"
            )
    net.feature_dim = RESNET_FEATURE_DIMS[name]  # type: ignore[assignment]
    return net, RESNET_FEATURE_DIMS[name]


def _factory(name: str):
    def build(*, weights_path: str | Path | None = None, in_channels: int = 3) -> tuple[nn.Module, int]:
        return resnet_backbone(name, weights_path=weights_path, in_channels=in_channels)

    build.__doc__ = (
        f"torchvision {name} without fc, {RESNET_FEATURE_DIMS[name]}-d features "
        "(options ``weights_path``, ``in_channels``; see :func:`resnet_backbone`)."
    )
    return build


for _name in RESNET_FEATURE_DIMS:
    register_backbone(_name)(_factory(_name))


@register_backbone("resnet")
def _resnet(
    name: str = "resnet18", *, weights_path: str | Path | None = None, in_channels: int = 3
) -> tuple[nn.Module, int]:
    """torchvision ResNet chosen by ``name`` (see :func:`resnet_backbone`)."""
    return resnet_backbone(name, weights_path=weights_path, in_channels=in_channels)
