"""`rankwise evaluate` does the work that changed: the plots are redrawn only when the predictions differ."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("lightning")
pytest.importorskip("sklego")
pytest.importorskip("matplotlib")

from rankwise.recipes import evaluate, load_config, train

TINY = [
    "model.options.hidden=[16]",
    "model.options.feature_dim=8",
    "data.batch_size=128",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=3",
    "trainer.num_threads=1",
    "report.tsne=false",
]


def _stamp(plots):
    return {p.name: p.stat().st_mtime_ns for p in sorted(plots.glob("*.png"))}


def test_evaluate_keeps_plots_of_unchanged_predictions_and_redraws_changed_ones(tmp_path):
    run = tmp_path / "run"
    train(load_config("abalone_vanilla", TINY), out=run, progress=False, verbose=False)
    plots = run / "plots"
    before = _stamp(plots)
    assert {"label_histogram.png", "per_label_mae.png", "similarity.png", "training_curves.png"} <= set(before)
    for p in plots.glob("*.png"):  # an old time stamp: a rewrite would change it
        os.utime(p, ns=(1, 1))
    old = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").unlink()
    m = evaluate(run)
    assert json.loads((run / "metrics.json").read_text())["test"] == m["test"] == old["test"]  # metrics rewritten
    assert all(t == 1 for t in _stamp(plots).values())  # same predictions: no plot redrawn

    # other predictions (the last checkpoint of a run whose best epoch was not the last): plots redrawn
    with np.load(run / "predictions.npz") as z:
        saved = {k: z[k] for k in z.files}
    saved["pred"] = saved["pred"] + 1.0
    np.savez_compressed(run / "predictions.npz", **saved)
    evaluate(run)
    redrawn = {k for k, t in _stamp(plots).items() if t != 1}
    assert redrawn == {"label_histogram.png", "per_label_mae.png", "similarity.png"}  # not the training curves
