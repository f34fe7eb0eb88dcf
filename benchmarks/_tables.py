"""Markdown helpers of the benchmark scripts' ``--markdown`` tables (standard library only).

Every generated table ends with a provenance line built by :func:`provenance` from the JSON alone:
a field the JSON does not hold is written as "not recorded", never guessed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NOT_RECORDED = "not recorded"


def read(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def ratio(value: float | None) -> str:
    """A ratio with three significant figures (``–`` for none)."""
    if value is None:
        return "–"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ms(value: float | None) -> str:
    """A time in ms with three significant figures (``–`` for none)."""
    if value is None:
        return "–"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def size(rows: int, n: int) -> str:
    return f"{rows:,} × {n:,}"


def load_range(*loads: list[float] | None) -> str:
    """The range of the 1-minute load averages among ``loads`` (lists as ``os.getloadavg`` gives)."""
    ones = [v[0] for v in loads if v]
    if not ones:
        return NOT_RECORDED
    lo, hi = min(ones), max(ones)
    return f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}"


def machine_text(m: dict[str, Any]) -> str:
    """``2-core Linux-..., torch X, Python Y`` from a ``_timing.machine()`` record."""
    parts = []
    if m.get("gpu"):
        parts.append(str(m["gpu"]))
    if m.get("cpu_count"):
        parts.append(f"{m['cpu_count']}-core {m.get('platform', '')}".strip())
    elif m.get("platform"):
        parts.append(str(m["platform"]))
    for key, label in (("torch", "torch"), ("triton", "triton"), ("python", "Python")):
        if m.get(key):
            parts.append(f"{label} {m[key]}")
    return ", ".join(parts) if parts else NOT_RECORDED


def provenance(
    script: str,
    *,
    commit: str | None,
    date: str | None,
    machine: dict[str, Any] | None,
    load: str,
    threads: str,
) -> str:
    """The italic provenance line under a generated table."""
    c = f"`{commit[:7]}`" if commit else NOT_RECORDED
    d = date[:10] if date else NOT_RECORDED
    return (
        f"*Recorded by `benchmarks/{script}`: rankwise commit {c}; date {d}; machine {machine_text(machine or {})}; "
        f"1-minute load average {load}; torch threads {threads}.*"
    )
