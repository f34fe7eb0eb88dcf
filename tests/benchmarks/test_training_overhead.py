"""The hand-written loop of ``benchmarks/training_overhead.py`` does the work of ``rankwise train``."""

from __future__ import annotations

import sys

import pytest

from tests.benchmarks._scripts import import_script


@pytest.fixture(scope="module")
def bench():
    module = import_script("training_overhead", "training_overhead")
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


#: the cases of the other families at toy size: (case, --set overrides after the case's own)
TOY = {
    "mnist5k_supcon": ["task.train_subset=64", "data.batch_size=16", "task.probe_epochs=1", "report.plots=false"],
    "ltr_synthetic_listnet": ["trainer.max_epochs=2", "trainer.limit_train_batches=4", "report.plots=false"],
    "digits_smooth_ap": ["task.steps=6", "task.steps_per_epoch=3", "report.plots=false"],
    "large_mnist_neuralsort": ["task.steps=6", "task.val_lists=10", "task.test_lists=20", "report.plots=false"],
    "brain_age_tsan_synthetic": ["trainer.max_epochs=2", "report.plots=false"],
}


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    from rankwise.data.synthetic_mri import make_brain_age_synthetic

    return make_brain_age_synthetic(tmp_path_factory.mktemp("cohort") / "cohort", n=16, spacing=8.0)


def test_every_family_has_a_case(bench):
    assert set(TOY) | {"abalone_vanilla", "abalone_ranksim"} == set(bench.CASES)
    assert {c.family for c in bench.CASES.values()} == set(bench.FAMILIES)


@pytest.mark.parametrize("name", sorted(TOY))
def test_hand_loop_reaches_the_runs_weights_in_every_family(bench, tmp_path, cohort, name):
    data = cohort if bench.CASES[name].data == "cohort" else None
    row = bench.measure_case(name, 1, tmp_path, data, extra=TOY[name])
    assert row["rankwise"]["steps"] == row["hand"]["steps"] > 0
    assert row["max_abs_weight_diff"] <= bench.TOL


def test_hand_loop_detects_another_loss_in_another_family(bench, tmp_path, monkeypatch):
    # an L2 term on the scorer's head: other gradients, so the loop ends away from the run's weights
    fam = bench.FAMILIES["ltr"]

    def other(m, b):
        return fam.loss(m, b) + 0.01 * m["head"].weight.pow(2).sum()

    monkeypatch.setitem(bench.FAMILIES, "ltr", bench.Family(fam.modules, other))
    with pytest.raises(AssertionError, match="from rankwise's weights"):
        bench.measure_case("ltr_synthetic_listnet", 1, tmp_path, extra=TOY["ltr_synthetic_listnet"])


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
