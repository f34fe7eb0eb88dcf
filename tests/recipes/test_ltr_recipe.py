"""The learning-to-rank recipe: config checks, a tiny end-to-end run that learns, evaluate, compare."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("sklearn")

from rankwise.recipes import load_config
from rankwise.recipes.config import ConfigError
from rankwise.recipes.learning_to_rank import ltr_metrics
from rankwise.recipes.runner import train

#: a small synthetic dataset and network: a run takes a few seconds
TINY = [
    "data.options={seed: 0, train_queries: 120, val_queries: 30, test_queries: 60, max_docs: 30}",
    "trainer.max_epochs=4",
    "trainer.num_threads=1",
    "trainer.enable_progress_bar=false",
    "task.slate_length=20",
    "optimizer.lr=0.003",
]


def test_ltr_metrics_equal_a_hand_computation() -> None:
    scores = torch.tensor([[0.3, 0.9, 0.1, 0.0], [0.5, 0.4, 0.0, 0.0]])
    rel = torch.tensor([[2.0, 0.0, 1.0, -1.0], [0.0, 0.0, -1.0, -1.0]])
    m = ltr_metrics(scores, rel, [1, 3])
    # list 1 ranks (0, 2, 1): DCG@3 = 3/log2(3) + 1/log2(4); IDCG@3 = 3 + 1/log2(3)
    dcg = 3 / np.log2(3) + 1 / 2
    idcg = 3 + 1 / np.log2(3)
    np.testing.assert_allclose(m["ndcg@3"].numpy(), [dcg / idcg, 1.0], rtol=1e-6)  # no relevant item: 1
    np.testing.assert_allclose(m["ndcg@1"].numpy(), [0.0, 1.0])
    np.testing.assert_allclose(m["mrr"].numpy(), [0.5, 0.0])  # the top grade at rank 2; none relevant: 0


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"loss\.name"):
        load_config("ltr_synthetic_listnet", ["loss.name=null"])
    with pytest.raises(ConfigError, match=r"`loss\.name`: loss 'balanced_mse' does not take padded query lists"):
        load_config("ltr_synthetic_listnet", ["loss.name=balanced_mse"])
    with pytest.raises(ConfigError, match=r"loss\.options\.tau"):
        load_config("ltr_synthetic_listnet", ["loss.options={tau: 1.0}"])
    with pytest.raises(ConfigError, match=r"task\.val_metric"):
        load_config("ltr_synthetic_listnet", ["task.val_metric=ndcg@7"])
    with pytest.raises(ConfigError, match=r"loss\.lds"):
        load_config("ltr_synthetic_listnet", ["loss.lds.reweight=sqrt_inv"])
    with pytest.raises(ConfigError, match=r"loss\.regularizers\.ranksim"):
        load_config("ltr_synthetic_listnet", ["loss.regularizers=[{name: ranksim, weight: 1.0}]"])
    with pytest.raises(ConfigError, match=r"task\.slate_length"):
        load_config("ltr_synthetic_listnet", ["task.slate_length=0"])


@pytest.mark.filterwarnings("ignore:data.name=")
def test_what_a_recipe_learns_is_checked_against_the_data(tmp_path) -> None:
    with pytest.raises(ConfigError, match="recipe 'ltr' needs a ranking dataset"):
        train(load_config("ltr_synthetic_listnet", [*TINY, "data.name=abalone", "data.options={}"]), out=tmp_path / "a")
    with pytest.raises(ConfigError, match="is a ranking"):
        cfg = load_config("abalone_vanilla", ["data.name=ltr_synthetic", "trainer.num_threads=1"])
        train(cfg, out=tmp_path / "b")


def test_tiny_run_learns_to_rank_and_evaluate_reproduces_it(tmp_path) -> None:
    from rankwise.data import QueryLists, get_dataset, pad_lists
    from rankwise.recipes.runner import evaluate

    cfg = load_config("ltr_synthetic_lambda_ndcgloss2", [*TINY, "loss.regularizers=[{name: listnet, weight: 0.5}]"])
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False)
    d = res.run_dir
    m = json.loads((d / "metrics.json").read_text())
    assert m["recipe"] == "ltr" and m["method"] == "lambda_loss(ndcgLoss2)"
    test = m["test"]
    assert set(test) == {"ndcg@1", "ndcg@3", "ndcg@5", "ndcg@10", "mrr"} and m["seconds_per_step"] > 0
    assert (d / "checkpoints" / "best.ckpt").is_file() and (d / "plots" / "ndcg_at_k.png").is_file()
    # the trained scorer beats random scores on the same test queries by a wide margin
    data = get_dataset("ltr_synthetic", seed=0, train_queries=120, val_queries=30, test_queries=60, max_docs=30)
    test_lists = data.test
    assert isinstance(test_lists, QueryLists)
    _, y = pad_lists([test_lists[i] for i in range(len(test_lists))])
    g = torch.Generator().manual_seed(0)
    chance = np.mean([ltr_metrics(torch.rand(y.shape, generator=g), y, [10])["ndcg@10"].mean() for _ in range(20)])
    assert test["ndcg@10"] > 100 * chance + 10, (test, chance)
    logged = (d / "logs" / "metrics.csv").read_text().splitlines()[0]
    assert "train/loss/lambda_loss" in logged and "train/loss/listnet" in logged and "val/ndcg@5" in logged
    again = evaluate(d, checkpoint="best")
    for k, v in test.items():
        assert again["test"][k] == pytest.approx(v, abs=1e-9)


def test_compare_tabulates_the_losses(tmp_path) -> None:
    from rankwise.recipes.runner import compare

    res = compare(
        ["ltr_synthetic_listnet", "ltr_synthetic_approx_ndcg"],
        seeds=[0],
        out=tmp_path / "cmp",
        overrides=[*TINY, "trainer.max_epochs=1", "report.plots=false"],
    )
    assert res.recipe is not None
    (header, rows), *_ = res.recipe.tables(res.results)
    assert header[:2] == ["method", "seeds"] and {"ndcg@1", "ndcg@5", "ndcg@10", "s/step"} <= set(header)
    assert [r[0] for r in rows] == ["ltr_synthetic_listnet", "ltr_synthetic_approx_ndcg"]
    report = res.report.read_text()
    assert "ndcg@10" in report and "ltr_synthetic_approx_ndcg" in report
