"""Shared fixtures: devices, dtypes, tolerances, gradcheck helper, data paths."""

from __future__ import annotations

import os
from pathlib import Path

# the numba kernels load synchronously in tests, so that the CPU path never depends on timing
# (tests/ops/test_isotonic.py checks the default background loading in a subprocess)
os.environ.setdefault("RANKWISE_NUMBA", "sync")

import pytest
import torch

DEVICES = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])

#: tolerance table per dtype: (rtol, atol)
TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def tol(dtype: torch.dtype) -> dict[str, float]:
    rtol, atol = TOL[dtype]
    return {"rtol": rtol, "atol": atol}


@pytest.fixture(params=DEVICES, ids=lambda d: d.type)
def device(request: pytest.FixtureRequest) -> torch.device:
    return request.param


@pytest.fixture(params=[torch.float32, torch.float64], ids=lambda d: str(d).split(".")[-1])
def dtype(request: pytest.FixtureRequest) -> torch.dtype:
    return request.param


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is absent")
    return SHARED


def gradcheck(fn, *inputs: torch.Tensor, **kwargs) -> bool:
    """float64 ``torch.autograd.gradcheck`` on ``fn`` (inputs are cast to float64 + requires_grad)."""
    xs = tuple(
        x.detach().to(torch.float64).requires_grad_(True)
        if isinstance(x, torch.Tensor) and x.is_floating_point()
        else x
        for x in inputs
    )
    kwargs.setdefault("eps", 1e-6)
    kwargs.setdefault("atol", 1e-5)
    kwargs.setdefault("rtol", 1e-4)
    return torch.autograd.gradcheck(fn, xs, **kwargs)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``extended`` tests run only with ``RANKWISE_EXTENDED=1`` (skipped, with the reason, otherwise)."""
    if os.environ.get("RANKWISE_EXTENDED") == "1":
        return
    skip = pytest.mark.skip(reason="extended sweep: set RANKWISE_EXTENDED=1 to run it")
    for item in items:
        if "extended" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Probe counts of the property/fuzz suite (tests/test_properties.py), when it ran in this process."""
    import json
    import os
    import sys

    mod = sys.modules.get("tests.test_properties")
    probes = getattr(mod, "PROBES", None)
    if not probes:
        return
    counts = {k: probes.get(k, 0) for k in ("ok", "clear_error", "crash", "silent_wrong")}
    tried = sum(counts.values())
    terminalreporter.write_line(
        f"fuzz probes: {tried} tried, {counts['ok']} ok, {counts['clear_error']} clear error, "
        f"{counts['crash']} crash, {counts['silent_wrong']} silent wrong"
    )
    for line in getattr(mod, "FINDINGS", [])[:40]:
        terminalreporter.write_line(f"  {line[:300]}")
    path = os.environ.get("RANKWISE_PROBE_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"tried": tried, **counts, "findings": getattr(mod, "FINDINGS", [])}, f, indent=1)
