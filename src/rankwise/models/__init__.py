"""Backbones (feature extractors) for the training recipes.

Every backbone maps a batch to features ``(B, feature_dim)``; :func:`build_backbone` returns the
module and its feature dimension. torchvision is imported only when a ResNet is built.
"""

from rankwise.models._registry import BACKBONES, backbone_info, build_backbone, list_backbones, register_backbone
from rankwise.models.mlp import MLPBackbone, mlp_backbone

__all__ = [
    "BACKBONES",
    "MLPBackbone",
    "backbone_info",
    "build_backbone",
    "list_backbones",
    "mlp_backbone",
    "register_backbone",
]
