"""The retrieval recipe: balanced batches, config checks, metrics of a tiny run."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("lightning")

from rankwise.recipes import load_config
from rankwise.recipes.config import ConfigError
from rankwise.recipes.retrieval import BalancedBatches
from rankwise.recipes.runner import train


def test_balanced_batches_draw_p_classes_of_m_distinct_images() -> None:
    y = torch.arange(5).repeat_interleave(7)
    x = torch.arange(35).float()
    ds = BalancedBatches(x, y, 3, 4, length=10, seed=0)
    for g in range(10):
        xb, yb = ds[g]
        classes, counts = torch.unique(yb, return_counts=True)
        assert len(classes) == 3 and counts.tolist() == [4, 4, 4]
        assert len(torch.unique(xb)) == 12 and torch.equal(y[xb.long()], yb)
    assert torch.equal(ds[3][0], BalancedBatches(x, y, 3, 4, length=10, seed=0)[3][0])  # seeded by the item
    assert not torch.equal(ds[3][0], ds[4][0])


def test_unknown_loss_and_option_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"task\.loss"):
        load_config("digits_smooth_ap", ["task.loss=ranksim"])
    with pytest.raises(ConfigError, match=r"task\.loss_options\.tau"):
        load_config("digits_fastap", ["task.loss_options={tau: 1.0}"])


def test_tiny_run_reports_retrieval_metrics(tmp_path) -> None:
    sets = ["task.steps=3", "trainer.num_threads=1", "report.tsne=false", "model.options.feature_dim=8"]
    cfg = load_config("digits_recall_at_k", sets)
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False)
    m = json.loads((res.run_dir / "metrics.json").read_text())
    test = m["test"]
    assert set(test) == {"recall@1", "recall@2", "recall@4", "recall@8", "map@r", "r_precision"}
    assert 0 <= test["recall@1"] <= test["recall@2"] <= test["recall@4"] <= test["recall@8"] <= 100
    assert m["seconds_per_step"] > 0
