"""The hand-written loop of ``benchmarks/training_overhead.py`` does the work of ``rankwise train``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "training_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("training_overhead", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["training_overhead"] = module
    spec.loader.exec_module(module)
    yield module
    module.uninstall_timers()  # the timed checkpoint plug-in and plot functions must not reach other tests
    sys.modules.pop("training_overhead", None)


def test_hand_loop_reaches_the_runs_weights(bench, tmp_path):
    tiny = ["trainer.max_epochs=2", "trainer.limit_train_batches=4", "report.plots=false"]
    row = bench.measure_case("abalone_vanilla", 1, tmp_path, extra=tiny)
    assert row["rankwise"]["steps"] == row["hand"]["steps"] == 8
    assert row["max_abs_weight_diff"] <= bench.TOL
    fixed = row["rankwise"]["fixed_s"]
    assert set(fixed) == {
        "startup",
        "first_batch_extra",
        "validation",
        "checkpoints",
        "plots",
        "tsne",
        "evaluation_reports",
        "loop_other",
    }
    assert fixed["plots"] == fixed["tsne"] == 0.0
    assert fixed["checkpoints"] > 0.0


def test_hand_loop_detects_other_work(bench, tmp_path, monkeypatch):
    # a loop that trains with another loss ends elsewhere: the equivalence check is not vacuous
    fam = bench.FAMILIES["dir"]
    monkeypatch.setitem(bench.FAMILIES, "dir", bench.Family(fam.modules, lambda m, b: 2 * fam.loss(m, b)))
    tiny = ["trainer.max_epochs=2", "trainer.limit_train_batches=4", "report.plots=false"]
    with pytest.raises(AssertionError, match="from rankwise's weights"):
        bench.measure_case("abalone_vanilla", 1, tmp_path, extra=tiny)


def test_markdown_table_from_a_result(bench):
    keys = ["startup", "first_batch_extra", "validation", "checkpoints", "plots", "tsne", "evaluation_reports"]
    fixed = dict.fromkeys([*keys, "loop_other"], 0.5)
    result = {
        "commit": "abc1234",
        "date": "2026-12-07 15:00 UTC",
        "machine": {"platform": "Linux", "cpu_count": 2, "torch": "2.x"},
        "loadavg_before": [1.0, 2.0, 3.0],
        "threads": [1],
        "process_start_s": 2.0,
        "rows": [
            {
                "case": "abalone_vanilla",
                "threads": 1,
                "ratio": 1.05,
                "cpu_ratio": 1.5,
                "max_abs_weight_diff": 0.0,
                "rankwise": {"steps": 8, "step_ms": 2.1, "step_cpu_ms": 1.5, "fixed_s": fixed, "rss_peak_mib": 900.0},
                "hand": {"step_ms": 2.0, "step_cpu_ms": 1.0, "rss_peak_mib": 880.0},
            }
        ],
    }
    text = bench.markdown(result)
    assert "`abc1234`" in text and "load average 1/2/3" in text
    assert "| abalone_vanilla | 1 | 8 | 2.10 (1.50) | 2.00 (1.00) | 1.05 (1.50) |" in text


def test_the_timers_are_undone(bench):
    """install_timers replaces the checkpoint plug-in class (whatever arguments it takes) and the plot
    functions; uninstall_timers puts every one back."""
    from rankwise.recipes import reports
    from rankwise.recipes.rundir import _trainer

    bench.uninstall_timers()  # an earlier test of this module may have installed them
    cls, plot = _trainer.AtomicCheckpointIO, reports.plot_tsne
    bench.install_timers()
    try:
        assert _trainer.AtomicCheckpointIO is not cls and reports.plot_tsne is not plot
        io = _trainer.AtomicCheckpointIO(background=True)  # the plug-in's own arguments pass through
        assert callable(io.save_checkpoint) and io.save_checkpoint.__name__ == "timed"
    finally:
        bench.uninstall_timers()
    assert _trainer.AtomicCheckpointIO is cls and reports.plot_tsne is plot
