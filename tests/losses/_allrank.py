"""allRank 1.4.3 as a test-only reference: its loss and metric modules, with what they import but do
not use stubbed in ``sys.modules`` (``gcsfs``; ``pkg_resources.Requirement`` on new setuptools)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import pytest


def _stub(name: str, **attrs: Any) -> bool:
    """Provide ``name`` with ``attrs``; True when a stand-in module was put into ``sys.modules``."""
    try:
        module = importlib.import_module(name)
        created = False
    except ImportError:
        module = types.ModuleType(name)
        sys.modules[name] = module
        created = True
    for key, value in attrs.items():
        if not hasattr(module, key):
            setattr(module, key, value)
    return created


def load() -> tuple[Any, Any]:
    """``(allrank.models.losses, allrank.models.metrics)``, or skip when allRank is not installed."""
    pytest.importorskip("allrank")
    created = [name for name in ("gcsfs",) if _stub(name, GCSFileSystem=object)]
    _stub("pkg_resources", Requirement=object, resource_filename=lambda *a: "")
    try:
        losses = importlib.import_module("allrank.models.losses")
        metrics = importlib.import_module("allrank.models.metrics")
    finally:
        # a stand-in without a module spec makes importlib.util.find_spec (Lightning, fsspec) raise
        # later in the same process: allRank keeps its reference, the process forgets the stand-in
        for name in created:
            sys.modules.pop(name, None)
    return losses, metrics
