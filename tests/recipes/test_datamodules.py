"""Recipe stages get their data as a LightningDataModule, and the final test evaluation is Lightning's
``Trainer.test`` / ``Trainer.predict`` of the selected checkpoint (``ckpt_path``), with the numbers of
loading that checkpoint into the module by hand and testing it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("torchvision")
pytest.importorskip("sklego")

import lightning as L
from torch.utils.data import DataLoader, TensorDataset

from rankwise.data import ClassificationData, TensorPairDataset, load_mnist5k_arrays
from rankwise.recipes import load_config
from rankwise.recipes.datamodules import LoaderData
from rankwise.recipes.rundir import Run, load_weights
from rankwise.recipes.runner import train
from tests.recipes.test_recipe_training import TINY

QUIET = ["trainer.num_threads=1", "report.plots=false", "trainer.enable_progress_bar=false"]
SORT = [*QUIET, "task.steps=4", "task.steps_per_epoch=2", "task.test_lists=10", "task.val_lists=4"]
SORT += ["task.lists_per_batch=2", "task.bn_recalibration=1"]
SUPCON = [*QUIET, "task.train_subset=32", "data.batch_size=16", "task.probe_epochs=2", "model.options.feature_dim=8"]
SUPCON += ["trainer.max_epochs=1"]
LTR_DATA = "data.options={seed: 0, train_queries: 16, val_queries: 4, test_queries: 4, max_docs: 15}"
#: preset -> (tiny overrides, the stage folders it trains)
RECIPES = {
    "abalone_vanilla": (TINY, [""]),
    "abalone_rnc": ([*TINY, "task.pretrain_epochs=1"], ["pretrain", ""]),
    "mnist5k_supcon": (SUPCON, ["", "probe"]),
    "large_mnist_neuralsort": (SORT, [""]),
    "mnist5k_dknn": (
        [*QUIET, "task.steps=2", "task.queries=10", "task.neighbors=10", "model.options.feature_dim=8"],
        [""],
    ),
    "mnist5k_smooth_ap": (
        [*QUIET, "task.steps=2", "task.classes_per_batch=3", "task.samples_per_class=3", "model.options.feature_dim=8"],
        [""],
    ),
    "ltr_synthetic_listnet": (
        [*QUIET, "model.options={hidden: [8], feature_dim: 4, dropout: 0.1}", "data.batch_size=8", LTR_DATA],
        [""],
    ),
}


@pytest.fixture(scope="module")
def digits() -> ClassificationData:
    """160 training / 60 test real digits."""
    images, labels = load_mnist5k_arrays()
    idx = np.random.default_rng(1).permutation(len(labels))[:220]
    x, y = torch.from_numpy(images[idx]).unsqueeze(1), torch.from_numpy(labels[idx])
    return ClassificationData(
        name="mnist5k",
        train=TensorPairDataset(x[:160], y[:160]),
        test=TensorPairDataset(x[160:], y[160:]),
        val=None,
        num_classes=10,
        image_shape=tuple(x.shape[1:]),
        train_targets=labels[idx[:160]],
        test_targets=labels[idx[160:]],
        meta={"backbone_options": {"in_channels": 1}},
    )


@pytest.fixture
def record(monkeypatch):
    """The stages run (with their results), the ``Trainer.test`` / ``Trainer.predict`` calls made and the
    checkpoints ``Run.load`` loaded."""
    calls: dict[str, list] = {"stages": [], "test": [], "predict": [], "load": []}
    run_stage, run_load = Run.run_stage, Run.load

    def recording_run_stage(run, stage):
        result = run_stage(run, stage)
        calls["stages"].append(result)
        return result

    def recording_load(run, *args, **kwargs):
        path = run_load(run, *args, **kwargs)
        calls["load"].append(path)
        return path

    monkeypatch.setattr(Run, "run_stage", recording_run_stage)
    monkeypatch.setattr(Run, "load", recording_load)
    for name in ("test", "predict"):
        original = getattr(L.Trainer, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            calls[_name].append(kwargs)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(L.Trainer, name, wrapper)
    return calls


def _train(preset, overrides, tmp_path, data=None):
    cfg = load_config(preset, overrides)
    return train(cfg, out=tmp_path / "run", progress=False, verbose=False, data=data)


@pytest.mark.parametrize("preset", sorted(RECIPES))
def test_every_recipe_stage_trains_on_a_lightning_datamodule(preset, tmp_path, record, digits):
    overrides, names = RECIPES[preset]
    data = digits if preset.startswith(("mnist5k", "large_mnist")) else None
    res = _train(preset, overrides, tmp_path, data)
    assert [r.stage.name for r in record["stages"]] == names
    for r in record["stages"]:
        assert isinstance(r.stage.data, L.LightningDataModule), (preset, r.stage.name)
        assert r.trainer is not None and r.trainer.datamodule is r.stage.data  # Lightning trained on it
    # the test split is evaluated from a checkpoint file: one Lightning loads (Trainer.test / predict), or, for
    # the regression recipes, best.ckpt loaded into the plain network (no Trainer: rankwise.recipes.regression)
    evaluations = record["test"] + record["predict"]
    assert all(str(c.get("ckpt_path", "")).endswith(".ckpt") for c in evaluations), evaluations
    if preset.startswith("abalone"):
        assert not evaluations and record["load"][-1] == res.run_dir / "checkpoints" / "best.ckpt", record
    else:
        assert evaluations
    assert res.metrics["test"]


def test_a_stage_without_a_datamodule_is_refused(tmp_path):
    from rankwise.recipes.stages import Stage

    loader = DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2)
    with pytest.raises(TypeError, match=r"`data` of stage 'x' must be a lightning.LightningDataModule.*DataLoader"):
        Run(None, tmp_path, None).run_stage(Stage("x", None, loader))


def test_loader_data_builds_a_lazy_split_once_and_leaves_missing_splits_undefined():
    from lightning.pytorch.utilities.model_helpers import is_overridden

    built = []

    def make():
        built.append(1)
        return DataLoader(TensorDataset(torch.arange(3.0)), batch_size=2)

    train_dl = DataLoader(TensorDataset(torch.arange(5.0)), batch_size=2)
    dm = LoaderData(train_dl, test=make)
    assert dm.train_dataloader() is train_dl and not built
    assert dm.test_dataloader() is dm.test_dataloader() and built == [1]
    assert [dm.has(s) for s in ("train", "val", "test", "predict")] == [True, False, True, False]
    # Lightning runs no validation / prediction loop over a split that is not defined
    assert is_overridden("train_dataloader", dm) and not is_overridden("val_dataloader", dm)
    with pytest.raises(ValueError, match="`split` must be one of"):
        dm.has("valid")


def _tested_checkpoint(calls, kind):
    assert len(calls[kind]) >= 1
    paths = {str(c["ckpt_path"]) for c in calls[kind]}
    assert len(paths) == 1, paths
    return paths.pop()


def test_sort_tests_its_best_checkpoint_with_trainer_test(tmp_path, record, digits):
    from rankwise.recipes.sorting import (
        TEST_SEED,
        ListSampler,
        RandomLists,
        SortingModule,
        digit_pools,
        recalibrate_bn,
    )

    res = _train("large_mnist_neuralsort", SORT, tmp_path, digits)
    run_dir = res.run_dir
    assert _tested_checkpoint(record, "test") == str(run_dir / "checkpoints" / "best.ckpt")
    assert isinstance(record["test"][0]["datamodule"], LoaderData)
    # the previous evaluation: best.ckpt loaded by hand, BatchNorm recalibrated, the module tested in memory
    cfg, t = res.config, res.config.task

    class _Run:
        pass

    run = _Run()
    run.cfg, run.data = cfg, digits
    xtr, ytr, _, _, xte, yte = digit_pools(run)
    module = SortingModule(cfg, meta=digits.meta)
    load_weights(module, run_dir / "checkpoints" / "best.ckpt")
    assert recalibrate_bn(module, ListSampler(xtr, ytr, t.n, t.digits), t, cfg.run.seed)
    lists = DataLoader(RandomLists(ListSampler(xte, yte, t.n, t.digits), t.test_lists, TEST_SEED), batch_size=100)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    out = trainer.test(module, lists, verbose=False)[0]
    assert res.metrics["test"] == {k.removeprefix("test/"): float(v) for k, v in out.items()}


def test_dir_evaluates_its_best_checkpoint_without_a_trainer(tmp_path, record):
    from rankwise.recipes.common import regression_loaders
    from rankwise.recipes.regression.module import DIRRegressor
    from rankwise.recipes.regression.net import shot_metrics
    from rankwise.recipes.regression.predict import concat_predictions

    res = _train("abalone_vanilla", [*TINY, "trainer.max_epochs=3"], tmp_path)
    run_dir = res.run_dir
    assert record["predict"] == []  # the plain prediction loop (rankwise.recipes.regression.predict)
    assert res.metrics["checkpoint"] == "checkpoints/best.ckpt"
    # best.ckpt loaded into the Lightning regressor by hand and predicted by a Trainer: the same metrics
    from rankwise.data import get_dataset

    data = get_dataset(res.config.data.name, **res.config.data.options)
    d = data
    module = DIRRegressor(
        cfg=res.config, input_dim=d.input_dim, bin_width=d.bin_width, train_labels=d.train_labels, meta=d.meta
    )
    load_weights(module, run_dir / "checkpoints" / "best.ckpt")
    _, val_dl, test_dl = regression_loaders(data, res.config)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    for split, dl in (("test", test_dl), ("val", val_dl)):
        pred = concat_predictions(trainer.predict(module, dl))
        assert res.metrics[split] == shot_metrics(pred["pred"], pred["label"], data, res.config), split


def test_supcon_tests_the_probe_checkpoint_with_trainer_test(tmp_path, record, digits):
    from rankwise.recipes.common import EpochShuffleSampler, tensors
    from rankwise.recipes.supcon import ContrastivePretrainer, LinearProbe

    res = _train("mnist5k_supcon", SUPCON, tmp_path, digits)
    run_dir, cfg, t = res.run_dir, res.config, res.config.task
    assert _tested_checkpoint(record, "test") == str(run_dir / "probe" / "last.ckpt")
    assert _tested_checkpoint(record, "predict") == str(run_dir / "checkpoints" / "last.ckpt")  # the features
    # the previous evaluation: the encoder's last.ckpt loaded by hand, the probe trained and tested in memory
    module = ContrastivePretrainer(cfg, num_classes=10, meta=digits.meta)
    load_weights(module, run_dir / "checkpoints" / "last.ckpt")
    keep = torch.randperm(160, generator=torch.Generator().manual_seed(cfg.run.seed))[: t.train_subset]
    xtr, ytr = tensors(digits.train)
    xtr, ytr = xtr[keep], ytr[keep]
    xte, yte = tensors(digits.test)

    def trainer(**kw):
        return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, **kw)

    def features(x):
        return torch.cat([o.float() for o in trainer().predict(module, DataLoader(TensorDataset(x), batch_size=512))])

    ftr, fte = features(xtr), features(xte)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.run.seed)
        probe = LinearProbe(ftr.mean(0), ftr.std(0), 10, lr=t.probe_lr)
    sampler = EpochShuffleSampler(len(ytr), cfg.run.seed)
    train_dl = DataLoader(TensorDataset(ftr, ytr.long()), batch_size=256, sampler=sampler)
    fit = trainer(max_epochs=t.probe_epochs, enable_checkpointing=False)
    fit.fit(probe, train_dl)
    out = fit.test(probe, DataLoader(TensorDataset(fte, yte.long()), batch_size=1024), verbose=False)
    assert res.metrics["test"]["probe_acc"] == float(out[0]["test/acc"])


def test_brain_age_stages_train_on_datamodules_and_test_their_best_checkpoints(tmp_path, record):
    for extra in ("nibabel", "nilearn", "torchio"):
        pytest.importorskip(extra)
    from rankwise.data import make_brain_age_synthetic
    from tests.recipes.brain_age.test_recipe import TINY as BRAIN

    csv_path = make_brain_age_synthetic(tmp_path / "cohort", n=16, spacing=6.0)
    sets = [
        f"data.options.csv={csv_path}",
        f"data.options.cache_dir={tmp_path / 'cache'}",
        *BRAIN,
        "report.plots=false",
    ]
    res = _train("brain_age_tsan_synthetic", sets, tmp_path)
    assert [r.stage.name for r in record["stages"]] == ["stage1", ""]
    assert all(isinstance(r.stage.data, LoaderData) and r.trainer.datamodule is r.stage.data for r in record["stages"])
    # stage 1 hands its best weights on to stage 2; both are evaluated from their best.ckpt by Trainer.predict
    assert [r.stage.hand_on for r in record["stages"]] == ["best", None]
    paths = [str(c["ckpt_path"]) for c in record["predict"]]
    stage1, stage2 = (str(res.run_dir / d / "best.ckpt") for d in ("stage1", "checkpoints"))
    assert paths == [stage1, stage1, stage2, stage2]  # val and test of each


def test_a_redone_probe_is_tested_from_its_own_fresh_checkpoint(tmp_path, digits):
    """``rankwise evaluate`` retrains the local probe stage: its test must load the probe just trained, which
    replaces ``probe/last.ckpt`` (a stale probe left there would otherwise be tested)."""
    from rankwise.recipes.runner import evaluate

    res = _train("mnist5k_supcon", SUPCON, tmp_path, digits)
    last = res.run_dir / "probe" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    ckpt["state_dict"] = {k: torch.zeros_like(v) for k, v in ckpt["state_dict"].items()}
    torch.save(ckpt, last)  # a probe that predicts nothing useful
    again = evaluate(res.run_dir, data=digits)
    assert again["test"]["probe_acc"] == res.metrics["test"]["probe_acc"]
    assert sorted(p.name for p in last.parent.glob("*.ckpt")) == ["last.ckpt"]
