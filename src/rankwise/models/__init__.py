"""Backbones (feature extractors) for the training recipes.

Every backbone maps a batch to features ``(B, feature_dim)``; :func:`build_backbone` returns the
module and its feature dimension. torchvision is imported only when a ResNet is built.
"""

from rankwise.models._registry import BACKBONES, backbone_info, build_backbone, list_backbones, register_backbone
from rankwise.models.cnn import SmallCNN, small_cnn
from rankwise.models.mlp import MLPBackbone, mlp_backbone
from rankwise.models.ordinal import *  # noqa: F403
from rankwise.models.ordinal import __all__ as _ordinal_all
from rankwise.models.resnet import RESNET_FEATURE_DIMS, resnet_backbone
from rankwise.models.text import TextPairEncoder, text_pair_encoder
from rankwise.models.volumetric import SFCN, ScaleDense, TSANSecondStage, load_tsan_checkpoint, sex_one_hot

__all__ = [
    "BACKBONES",
    "RESNET_FEATURE_DIMS",
    "SFCN",
    "MLPBackbone",
    "ScaleDense",
    "SmallCNN",
    "TSANSecondStage",
    "TextPairEncoder",
    "backbone_info",
    "build_backbone",
    "list_backbones",
    "load_tsan_checkpoint",
    "mlp_backbone",
    "register_backbone",
    "resnet_backbone",
    "sex_one_hot",
    "small_cnn",
    "text_pair_encoder",
    *_ordinal_all,
]
