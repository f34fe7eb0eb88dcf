"""Shared by the command-line and recipe tests: tiny abalone overrides and the one-error-line check."""

from __future__ import annotations

from typing import Any

#: ``--set`` overrides that make an abalone preset train in about a second
TINY = [
    "model.options.hidden=[16]",
    "model.options.feature_dim=8",
    "data.batch_size=128",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=3",
    "trainer.num_threads=1",
    "run.plots=false",
]


def one_error_line(r: Any, code: int = 2) -> str:
    """The command failed with ``code`` and printed exactly one ``error: ...`` line, no traceback and
    no "unexpected" catch-all; returns that line."""
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, r.output
    assert "Traceback" not in r.output and not errors[0].startswith("error: unexpected"), r.output
    return errors[0]
