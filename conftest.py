"""Doctest collection over ``src/rankwise`` (``--doctest-modules``, see ``[tool.pytest.ini_options]``).

rankwise's core needs only torch, numpy and numba; the CLI and the training recipes import the
``train`` extra (lightning, typer, yaml, ...) at module level, and some examples call a loader or a
backbone that needs one. Without those packages their modules are not collected and their examples
are reported as skipped (naming the missing package) instead of failing; with them everything runs.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

_SRC = Path(__file__).resolve().parent / "src"


def _missing_optional(exc: BaseException) -> str | None:
    """Top-level name of a missing third-party package behind ``exc`` (None if it is something else)."""
    while exc is not None:
        if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[0] != "rankwise":
            return exc.name.split(".")[0]
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.suffix != ".py" or _SRC not in collection_path.parents:
        return None
    module = ".".join(collection_path.relative_to(_SRC).with_suffix("").parts)
    module = module.removesuffix(".__init__")
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if _missing_optional(e) is not None:
            return True
        raise
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if call.when == "call" and report.failed and call.excinfo is not None:
        exc = call.excinfo.value
        if isinstance(exc, doctest.UnexpectedException):
            # also rankwise's own "X needs Y: `pip install Y`" ImportErrors, raised from the original
            missing = _missing_optional(exc.exc_info[1])
            if missing is not None:
                report.outcome = "skipped"
                report.longrepr = (str(item.path), 0, f"Skipped: needs the optional package {missing!r}")
    return report


#: reference packages of the parity tests: never dependencies of rankwise; how to install each
PARITY_PACKAGES = {
    "torchsort": "pip install --no-build-isolation torchsort  (builds from source: a C++ compiler, a few minutes)",
    "diffsort": 'pip install -e ".[parity]"',
    "coral_pytorch": 'pip install -e ".[parity]"  (or: pip install --no-deps coral-pytorch==1.4.0)',
    "condor_pytorch": 'pip install -e ".[parity]"  (or: pip install --no-deps condor-pytorch==1.1.0)',
}


def parity_skip_summary(reasons: list[str]) -> list[str]:
    """Lines naming the parity tests skipped for want of a reference package (from the skip reasons)."""
    counts = dict.fromkeys(PARITY_PACKAGES, 0)
    for reason in reasons:
        for pkg in PARITY_PACKAGES:
            if f"'{pkg}'" in reason or f"import {pkg}" in reason:
                counts[pkg] += 1
    return [
        f"{n} parity test(s) against {pkg} skipped ({pkg} is not installed); to run them: {PARITY_PACKAGES[pkg]}"
        for pkg, n in counts.items()
        if n
    ]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    reasons = []
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(rep, "longrepr", None)
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            reasons.append(str(longrepr[2]))
    lines = parity_skip_summary(reasons)
    if lines:
        terminalreporter.section("parity tests skipped")
        for line in lines:
            terminalreporter.write_line(line)
