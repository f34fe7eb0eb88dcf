"""`rankwise evaluate` of a DIR run on the CPU rebuilds the plain torch network and never imports
Lightning, and gives exactly the metrics and predictions of the evaluation after training, i.e. of
the Lightning Trainer's prediction (dir with LDS + FDS, with a regularizer, rrt, rnc)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lightning")
pytest.importorskip("sklego")

from rankwise.recipes import load_config
from rankwise.recipes.runner import evaluate, train
from tests.cli_helpers import TINY, cli_in_fresh_interpreter


@pytest.fixture(scope="module")
def abalone():
    from rankwise.data import get_dataset

    return get_dataset("abalone")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, abalone):
    """Tiny trained runs whose checkpoints hold every kind of DIR state: LDS table + FDS statistics
    (abalone_lds_fds), a RankSim regularizer (abalone_ranksim), a re-trained head (rrt) and a
    Rank-N-Contrast encoder (rnc); metrics.json and predictions.npz as written after training."""
    root = tmp_path_factory.mktemp("eval_plain")
    out = {}
    for name, extra in [
        ("abalone_lds_fds", []),
        ("abalone_ranksim", []),
        ("abalone_rrt", [f"task.init_checkpoint={root / 'abalone_lds_fds'}"]),
        ("abalone_rnc", ["task.pretrain_epochs=1"]),
    ]:
        res = train(load_config(name, [*TINY, *extra]), out=root / name, progress=False, verbose=False, data=abalone)
        out[name] = res.run_dir
    return out


def _saved(run: Path) -> tuple[dict, dict[str, np.ndarray]]:
    metrics = json.loads((run / "metrics.json").read_text())
    with np.load(run / "predictions.npz") as z:
        return metrics, {k: z[k] for k in z.files}


def _assert_same_predictions(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


@pytest.mark.parametrize("name", ["abalone_lds_fds", "abalone_ranksim", "abalone_rrt"])
def test_cli_evaluate_imports_no_lightning_and_repeats_the_training_time_evaluation(runs, tmp_path, name):
    run = tmp_path / "run"
    shutil.copytree(runs[name], run, ignore=shutil.ignore_patterns(".lock"))
    metrics, preds = _saved(run)
    stale = {**metrics, "test": {}, "val": {}}  # rewritten from the checkpoint; the training time kept
    (run / "metrics.json").write_text(json.dumps(stale))
    (run / "predictions.npz").unlink()
    probe, output = cli_in_fresh_interpreter(["evaluate", str(run), "--no-plots"])
    assert probe == {"code": 0, "heavy": []}, output
    again, again_preds = _saved(run)
    assert again == metrics  # every metric, the checkpoint, the thresholds and the training time
    _assert_same_predictions(again_preds, preds)


@pytest.mark.parametrize("checkpoint", ["best", "last"])
@pytest.mark.parametrize("name", ["abalone_lds_fds", "abalone_ranksim", "abalone_rrt", "abalone_rnc"])
def test_plain_network_gives_the_lightning_trainers_metrics(runs, abalone, tmp_path, name, checkpoint):
    """The same checkpoint through the Lightning module + Trainer.predict and through DIRNet + predict."""
    from rankwise.recipes.dir import build_net, build_regressor, evaluate_regressor
    from rankwise.recipes.dir_module import DIRRegressor
    from rankwise.recipes.dir_net import DIRNet
    from rankwise.recipes.rundir import Run
    from rankwise.recipes.runner import load_run_config

    out = {}
    for kind, build in (("lightning", build_regressor), ("plain", build_net)):
        run_dir = tmp_path / kind
        shutil.copytree(runs[name], run_dir, ignore=shutil.ignore_patterns(".lock"))
        run = Run(load_run_config(run_dir), run_dir, abalone, plots=False)
        module = build(run, freeze_backbone=name != "abalone_lds_fds")
        assert isinstance(module, DIRRegressor) == (kind == "lightning") and isinstance(module, DIRNet)
        out[kind] = evaluate_regressor(run, module, checkpoint), _saved(run_dir)[1]
    assert out["plain"][0] == out["lightning"][0]
    assert out["plain"][0]["checkpoint"] == f"checkpoints/{checkpoint}.ckpt"
    _assert_same_predictions(out["plain"][1], out["lightning"][1])
    if checkpoint == "best":  # and both equal the evaluation written after training
        saved = json.loads((runs[name] / "metrics.json").read_text())
        assert out["plain"][0]["test"] == saved["test"] and out["plain"][0]["val"] == saved["val"]


def test_rnc_evaluate_repeats_the_training_time_metrics(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["abalone_rnc"], run, ignore=shutil.ignore_patterns(".lock"))
    metrics, preds = _saved(run)
    assert evaluate(run, plots=False) == metrics
    _assert_same_predictions(_saved(run)[1], preds)


@pytest.mark.parametrize(
    ("sets", "plain"),
    [
        (["trainer.accelerator=cpu"], True),
        (["trainer.accelerator=cpu", "trainer.precision=32"], True),
        (["trainer.accelerator=cpu", "trainer.precision=64-true"], False),
        (["trainer.accelerator=cpu", "trainer.precision=bf16-mixed"], False),
        (["trainer.accelerator=gpu"], False),
        (["trainer.accelerator=mps"], False),
    ],
)
def test_only_cpu_float32_evaluations_skip_the_trainer(sets, plain):
    from rankwise.recipes.dir_net import predicts_on_cpu

    assert predicts_on_cpu(load_config("abalone_vanilla", sets)) is plain


def test_auto_accelerator_predicts_without_lightning_only_without_an_accelerator(monkeypatch):
    import torch

    from rankwise.recipes.dir_net import predicts_on_cpu

    cfg = load_config("abalone_vanilla", ["trainer.accelerator=auto"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert predicts_on_cpu(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not predicts_on_cpu(cfg)
