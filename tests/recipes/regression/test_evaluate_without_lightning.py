"""`rankwise evaluate` of a regression run rebuilds the plain torch network and never imports Lightning,
and gives exactly the metrics and predictions of the evaluation after training and of the Lightning
Trainer's prediction (dir with LDS + FDS, with a regularizer, in float64, rrt, rnc), at every precision
the plain loop mirrors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

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
    (abalone_lds_fds, and trained in float64: its weights in float64), a RankSim regularizer
    (abalone_ranksim), a re-trained head (rrt) and a Rank-N-Contrast encoder (rnc); metrics.json and
    predictions.npz as written after training."""
    root = tmp_path_factory.mktemp("eval_plain")
    out = {}
    for name, extra in [
        ("abalone_lds_fds", []),
        ("float64", ["trainer.precision=64-true"]),
        ("abalone_ranksim", []),
        ("abalone_rrt", [f"task.init_checkpoint={root / 'abalone_lds_fds'}"]),
        ("abalone_rnc", ["task.pretrain_epochs=1"]),
    ]:
        preset = "abalone_lds_fds" if name == "float64" else name
        cfg = load_config(preset, [*TINY, "trainer.accelerator=cpu", *extra])
        res = train(cfg, out=root / name, progress=False, verbose=False, data=abalone)
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


@pytest.mark.parametrize("name", ["abalone_lds_fds", "float64", "abalone_ranksim", "abalone_rrt"])
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
    """The same checkpoint through the Lightning module + Trainer.predict and through DIRNet + the plain loop."""
    from rankwise.recipes.common import regression_loaders
    from rankwise.recipes.regression.module import DIRRegressor
    from rankwise.recipes.regression.net import write_evaluation
    from rankwise.recipes.regression.predict import concat_predictions
    from rankwise.recipes.regression.recipe import build_net, build_regressor, evaluate_regressor
    from rankwise.recipes.rundir import Run
    from rankwise.recipes.runner import load_run_config

    frozen = name != "abalone_lds_fds"
    out = {}
    for kind in ("lightning", "plain"):
        run_dir = tmp_path / kind
        shutil.copytree(runs[name], run_dir, ignore=shutil.ignore_patterns(".lock"))
        run = Run(load_run_config(run_dir), run_dir, abalone, plots=False)
        if kind == "lightning":
            module = build_regressor(run, freeze_backbone=frozen)
            assert isinstance(module, DIRRegressor)
            _, val_dl, test_dl = regression_loaders(abalone, run.cfg)
            (test, ckpt), (val, _) = (run.predict(module, dl, checkpoint) for dl in (test_dl, val_dl))
            metrics = write_evaluation(run, concat_predictions(test), concat_predictions(val), ckpt)
        else:
            net = build_net(run, freeze_backbone=frozen)
            assert not isinstance(net, DIRRegressor)
            metrics = evaluate_regressor(run, net, checkpoint)
        out[kind] = metrics, _saved(run_dir)[1]
    assert out["plain"][0] == out["lightning"][0]
    assert out["plain"][0]["checkpoint"] == f"checkpoints/{checkpoint}.ckpt"
    _assert_same_predictions(out["plain"][1], out["lightning"][1])
    if checkpoint == "best":  # and both equal the evaluation written after training
        saved = json.loads((runs[name] / "metrics.json").read_text())
        assert out["plain"][0]["test"] == saved["test"] and out["plain"][0]["val"] == saved["val"]


def _predictions(run, module, name: str, *, lightning: bool) -> dict[str, np.ndarray]:
    from rankwise.recipes.common import regression_loaders
    from rankwise.recipes.regression.predict import concat_predictions
    from rankwise.recipes.regression.recipe import predict_regressor

    _, _, test_dl = regression_loaders(run.data, run.cfg)
    if lightning:
        outs, _ = run.predict(module, test_dl, name)
        return concat_predictions(outs)
    (out,), _ = predict_regressor(run, module, [test_dl], name)
    return out


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize(
    ("source", "accelerator"),
    [("abalone_lds_fds", "cpu"), ("float64", "cpu"), pytest.param("abalone_lds_fds", "gpu", marks=_CUDA)],
)
def test_the_plain_loop_predicts_as_trainer_predict_at_each_precision(runs, abalone, source, accelerator):
    """At 32-true, 64-true, bf16-mixed, 16-mixed (bfloat16 autocast on the CPU) and bf16-true, the plain
    network in the plain loop gives bit for bit the predictions of a fresh Lightning module through
    Trainer.predict on the same checkpoint, on the CPU and on a CUDA device (of a float32 run; a float64
    run's weights keep their float64 bits in the plain loop, which a fresh float32 Lightning module
    rounds: there 32-true only)."""
    from rankwise.recipes.regression.recipe import build_net, build_regressor
    from rankwise.recipes.rundir import Run
    from rankwise.recipes.runner import load_run_config

    precisions = ["32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true"] if source != "float64" else ["32-true"]
    got = {}
    for precision in precisions:
        cfg = load_run_config(runs[source], [f"trainer.precision={precision}", f"trainer.accelerator={accelerator}"])
        run = Run(cfg, runs[source], abalone, plots=False)
        plain = _predictions(run, build_net(run), "best", lightning=False)
        trained = _predictions(run, build_regressor(run), "best", lightning=True)
        assert set(plain) == set(trained) == {"pred", "label", "features"}
        for k in plain:
            assert plain[k].dtype == np.float32 == trained[k].dtype, (precision, k)
            assert np.array_equal(plain[k], trained[k]), (precision, k)
        got[precision] = plain["pred"]
    if source != "float64":  # the precisions change the numbers (the comparison above is not vacuous)
        assert not np.array_equal(got["bf16-mixed"], got["32-true"])
        assert not np.array_equal(got["bf16-true"], got["32-true"])
        assert not np.array_equal(got["64-true"], got["32-true"])
        # Lightning's substitution on the CPU; float16 autocast on a GPU
        assert np.array_equal(got["16-mixed"], got["bf16-mixed"]) == (accelerator == "cpu")


def test_rnc_evaluate_repeats_the_training_time_metrics(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["abalone_rnc"], run, ignore=shutil.ignore_patterns(".lock"))
    metrics, preds = _saved(run)
    assert evaluate(run, plots=False) == metrics
    _assert_same_predictions(_saved(run)[1], preds)


_PRECISIONS = ["32-true", "32", "64-true", "64", "16-true", "16-mixed", "16", "bf16-true", "bf16-mixed", "bf16"]


@pytest.mark.parametrize("precision", _PRECISIONS)
def test_the_placement_is_that_of_lightnings_precision_plugin(precision):
    """The device, dtypes and autocast of each trainer.precision on the CPU are those of the plugin a
    Lightning Trainer of that config predicts with."""
    import lightning as L
    import torch
    from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision

    from rankwise.recipes.regression.predict import placement

    sets = ["trainer.accelerator=cpu", f"trainer.precision={precision}", "optimizer.eps=1e-4"]
    where = placement(load_config("abalone_vanilla", sets))
    plugin = L.Trainer(accelerator="cpu", devices=1, precision=precision, logger=False).precision_plugin
    assert where.device == torch.device("cpu")
    if isinstance(plugin, MixedPrecision):
        assert (where.dtype, where.precision, where.device.type) == (None, plugin.precision, plugin.device)
        assert where.autocast == (torch.bfloat16 if plugin.precision == "bf16-mixed" else torch.float16)
    elif isinstance(plugin, HalfPrecision):
        assert (where.dtype, where.autocast) == (plugin._desired_input_dtype, None)
    elif isinstance(plugin, DoublePrecision):
        assert (where.dtype, where.autocast) == (torch.float64, None)
    else:
        assert type(plugin).__name__ == "Precision" and (where.dtype, where.autocast) == (None, None)
    module = where.convert_module(torch.nn.Linear(2, 1))
    batch = where.convert_input((torch.zeros(1, 2), torch.zeros(1, dtype=torch.int64)))
    assert module.weight.dtype == batch[0].dtype == (where.dtype or torch.float32)
    assert batch[1].dtype == torch.int64
    with where.forward_context():
        assert torch.get_default_dtype() == (where.dtype or torch.float32)
        assert module(batch[0]).dtype == (where.autocast or where.dtype or torch.float32)
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize(
    ("accelerator", "devices", "cuda", "device"),
    [
        ("cpu", "auto", True, "cpu"),
        ("auto", "auto", False, "cpu"),
        ("auto", "auto", True, "cuda:0"),
        ("gpu", [2, 3], True, "cuda:2"),
        ("cuda", 2, True, "cuda:0"),
    ],
)
def test_the_prediction_device_is_the_trainers(monkeypatch, accelerator, devices, cuda, device):
    import torch

    from rankwise.recipes.regression.predict import prediction_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    cfg = load_config("abalone_vanilla", [f"trainer.accelerator={accelerator}"])
    cfg.trainer.devices = devices
    assert prediction_device(cfg) == torch.device(device)


@pytest.mark.parametrize("accelerator", ["gpu", "cuda", "mps", "tpu"])
def test_a_device_the_machine_lacks_is_a_config_error_naming_the_accelerator(monkeypatch, accelerator):
    import torch

    from rankwise.recipes.config import ConfigError
    from rankwise.recipes.regression.predict import prediction_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"`trainer\.accelerator`"):
        prediction_device(load_config("abalone_vanilla", [f"trainer.accelerator={accelerator}"]))
