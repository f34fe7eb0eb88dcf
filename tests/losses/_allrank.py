"""allRank 1.4.3 as a test-only reference: its loss and metric modules, with what they import but do
not use stubbed in ``sys.modules`` (``gcsfs``; ``pkg_resources.Requirement`` on new setuptools)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import pytest


def _stub(name: str, **attrs: Any) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError:
        module = types.ModuleType(name)
        sys.modules[name] = module
    for key, value in attrs.items():
        if not hasattr(module, key):
            setattr(module, key, value)


def load() -> tuple[Any, Any]:
    """``(allrank.models.losses, allrank.models.metrics)``, or skip when allRank is not installed."""
    pytest.importorskip("allrank")
    _stub("gcsfs", GCSFileSystem=object)
    _stub("pkg_resources", Requirement=object, resource_filename=lambda *a: "")
    losses = importlib.import_module("allrank.models.losses")
    metrics = importlib.import_module("allrank.models.metrics")
    return losses, metrics
