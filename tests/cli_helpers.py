"""Shared by the command-line and recipe tests: tiny abalone overrides and the one-error-line check."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

#: ``--set`` overrides that make an abalone preset train in about a second
TINY = [
    "model.options.hidden=[16]",
    "model.options.feature_dim=8",
    "data.batch_size=128",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=3",
    "trainer.num_threads=1",
    "report.plots=false",
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


#: the CLI in a fresh interpreter (argv from the command line), and the heavy packages it imported
_PROBE = """
import json, sys
from rankwise.cli import main
sys.argv = ["rankwise", *sys.argv[1:]]
code = 0
try:
    main()
except SystemExit as e:
    code = e.code or 0
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"lightning", "pytorch_lightning", "torchmetrics",
                                                        "matplotlib", "pandas", "sklearn", "torchvision"})
print("PROBE " + json.dumps({"code": code, "heavy": heavy}))
"""


def cli_in_fresh_interpreter(args: list[str], timeout: float = 300) -> tuple[dict[str, Any], str]:
    """Run ``rankwise ARGS`` in a new Python process: ``({"code": exit status, "heavy": heavy packages
    imported}, its output)``."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=timeout)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert line is not None, proc.stdout + proc.stderr
    return json.loads(line[6:]), proc.stdout + proc.stderr
