"""Import a script of ``benchmarks/`` as a module for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def import_script(name: str, module_name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as ``module_name`` (registered in ``sys.modules``: its dataclasses
    need it); the caller pops it from ``sys.modules`` when done."""
    spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
