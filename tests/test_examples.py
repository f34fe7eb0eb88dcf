"""Every script of examples/ runs (``--tiny``: a few steps on little data) and prints its result line."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rankwise

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# torchsort-style calls need soft_rank's default method="isotonic"
_TORCHSORT_CALLS = inspect.signature(rankwise.soft_rank).parameters["method"].default == "isotonic"

CASES = [
    pytest.param("spearman_pytorch.py", "test Spearman", (), id="spearman_pytorch"),
    pytest.param("metric_learning.py", "triplet, batch-hard: test 1-NN accuracy", ("sklearn",), id="metric_learning"),
    pytest.param("gumbel_sinkhorn_jigsaw.py", "test tiles placed right", ("sklearn",), id="gumbel_sinkhorn_jigsaw"),
    pytest.param(
        "from_torchsort.py",
        "Spearman before",
        (),
        id="from_torchsort",
        marks=pytest.mark.xfail(
            not _TORCHSORT_CALLS, reason="soft_rank/soft_sort have no default method yet", strict=True
        ),
    ),
    pytest.param(
        "supcon_lightning.py",
        "linear-probe accuracy",
        ("lightning", "sklearn"),
        id="supcon_lightning",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "imbalanced_csv.py", "L1 + LDS", ("lightning", "sklearn", "yaml"), id="imbalanced_csv", marks=pytest.mark.slow
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("script", "expected", "needs"), CASES)
def test_example_runs(script: str, expected: str, needs: tuple[str, ...], tmp_path: Path) -> None:
    for module in needs:
        pytest.importorskip(module)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    src = str(Path(rankwise.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])  # the rankwise under test
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--tiny"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert expected in proc.stdout, proc.stdout[-3000:]
