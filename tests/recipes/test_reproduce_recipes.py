"""The reproduction recipes on tiny budgets: SupCon two-stage, large-MNIST sorting, median, dkNN.

Every recipe runs a few steps so that it cannot rot; the full tables come from the commands in
docs/results.md.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

pytest.importorskip("torchvision")
pytest.importorskip("sklearn")
pytest.importorskip("typer")

from rankwise.data import ClassificationData, TensorPairDataset, get_dataset, load_mnist5k_arrays
from rankwise.recipes import ConfigError, load_config
from rankwise.recipes.rundir import load_state_dict
from rankwise.recipes.runner import compare, evaluate, train
from rankwise.recipes.sorting import ListSampler, sort_loss, true_permutation


@pytest.fixture(scope="module")
def tiny_digits() -> ClassificationData:
    """120 training / 60 test real digits (disjoint), as a ClassificationData."""
    images, labels = load_mnist5k_arrays()
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(labels))[:180]
    x = torch.from_numpy(images[idx]).unsqueeze(1)
    y = torch.from_numpy(labels[idx])
    return ClassificationData(
        name="mnist5k",
        train=TensorPairDataset(x[:120], y[:120]),
        test=TensorPairDataset(x[120:], y[120:]),
        val=None,
        num_classes=10,
        image_shape=tuple(x.shape[1:]),
        train_targets=labels[idx[:120]],
        test_targets=labels[idx[120:]],
        meta={"backbone_options": {"in_channels": 1}},
    )


TINY_SUPCON = [
    "report.tsne=true",
    "report.plot_samples=30",
    "data.batch_size=32",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.num_threads=1",
    "task.probe_epochs=2",
    "model.options.feature_dim=16",
]
TINY_SORT = [
    "task.steps=2",
    "task.test_lists=20",
    "task.val_lists=10",
    "task.lists_per_batch=4",
    "trainer.num_threads=1",
]


def _check_run(res, keys):
    m = json.loads((res.run_dir / "metrics.json").read_text())
    assert set(m["test"]) == set(keys)
    assert all(np.isfinite(v) for v in m["test"].values())
    assert json.loads((res.run_dir / "meta.json").read_text())["status"] == "completed"
    # the same run directory layout for every recipe (a kNN on raw pixels trains nothing: no checkpoint or log)
    trained = getattr(res.config.task, "method", "") != "knn_pixels"
    for f in ("config.yaml", "meta.json", "checkpoints/best.ckpt", "checkpoints/last.ckpt", "logs/metrics.csv"):
        assert (res.run_dir / f).is_file() or (not trained and "/" in f), f
    assert (res.run_dir / "plots" / "training_curves.png").is_file() or not trained
    return m


# ------------------------------------------------------------------------------------------ SupCon


@pytest.mark.parametrize(
    "preset,extra",
    [
        ("mnist5k_supcon", []),
        ("mnist5k_simclr", []),
        ("mnist5k_ce", []),
        ("mnist5k_supcon_lars", ["task.variant=in", "task.augment=digits_elastic"]),
        ("mnist5k_supcon", ["task.augment=randaugment", "optimizer.name=adam", "optimizer.lr=0.001"]),
        ("mnist5k_supcon", ["task.augment=autoaugment"]),
    ],
)
def test_supcon_recipe_tiny(tmp_path, tiny_digits, preset, extra):
    cfg = load_config(preset, [*TINY_SUPCON, *extra])
    res = train(cfg, out=tmp_path / "run", data=tiny_digits, progress=False, verbose=False)
    m = _check_run(res, ["probe_acc"])
    assert 0.0 <= m["test"]["probe_acc"] <= 100.0
    assert m["recipe"] == "supcon" and m["method"] == cfg.task.method
    assert (res.run_dir / "plots" / "tsne.png").is_file()
    assert (res.run_dir / "plots" / "probe_curves.png").is_file()  # the linear probe's loss and accuracy
    assert (
        evaluate(res.run_dir, data=tiny_digits)["test"] == m["test"]
    )  # probe re-trained from the checkpoint: the same accuracy
    state = load_state_dict(res.run_dir / "checkpoints" / "last.ckpt")
    assert any(k.startswith("encoder.") for k in state)
    assert (res.run_dir / "probe" / "last.ckpt").is_file()
    assert (res.run_dir / "logs" / "metrics.csv").is_file()


def _png_folder(root, classes=3, per_class=5, size=12):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        d = root / f"class{c}"
        d.mkdir(parents=True)
        for i in range(per_class):
            arr = (rng.random((size, size, 3)) * 80 + c * 60).astype(np.uint8)
            Image.fromarray(arr).save(d / f"{i}.png")


def test_supcon_on_image_folder(tmp_path):
    _png_folder(tmp_path / "imgs")
    data = get_dataset("image_folder", root=str(tmp_path / "imgs"), image_size=16, test_fraction=0.4)
    assert data.num_classes == 3 and data.image_shape == (3, 16, 16)
    assert len(data.train) == 9 and len(data.test) == 6
    cfg = load_config(
        "mnist5k_supcon",
        [
            *TINY_SUPCON,
            "data.name=image_folder",
            f"data.options={{root: {tmp_path / 'imgs'}, image_size: 16, test_fraction: 0.4}}",
            "data.batch_size=4",
        ],
    )
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False)
    _check_run(res, ["probe_acc"])


def test_image_folder_train_test_subfolders(tmp_path):
    _png_folder(tmp_path / "d" / "train", per_class=3)
    _png_folder(tmp_path / "d" / "test", per_class=2)
    data = get_dataset("image_folder", root=str(tmp_path / "d"), image_size=8, grayscale=True)
    assert data.image_shape == (1, 8, 8) and len(data.train) == 9 and len(data.test) == 6
    with pytest.raises(ValueError, match="`root` must be an existing directory"):
        get_dataset("image_folder", root=str(tmp_path / "missing"))


def test_cifar_dir(tmp_path):
    rng = np.random.default_rng(0)
    for name, n in (("data_batch_1", 12), ("data_batch_2", 8), ("test_batch", 6)):
        batch = {b"data": rng.integers(0, 256, (n, 3 * 8 * 8), dtype=np.uint8), b"labels": list(range(n))}
        batch[b"labels"] = [i % 4 for i in range(n)]
        with open(tmp_path / name, "wb") as fh:
            pickle.dump(batch, fh)
    with open(tmp_path / "batches.meta", "wb") as fh:
        pickle.dump({b"label_names": [b"a", b"b", b"c", b"d"]}, fh)
    data = get_dataset("cifar_dir", root=str(tmp_path))
    assert data.image_shape == (3, 8, 8) and len(data.train) == 20 and len(data.test) == 6
    assert data.meta["classes"] == ["a", "b", "c", "d"]
    x, y = data.train[0]
    assert x.dtype == torch.float32 and 0 <= float(x.min()) and float(x.max()) <= 1 and y.dtype == torch.int64
    cfg = load_config(
        "mnist5k_simclr",
        [*TINY_SUPCON, "data.name=cifar_dir", f"data.options={{root: {tmp_path}}}", "data.batch_size=8"],
    )
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False)
    _check_run(res, ["probe_acc"])
    with pytest.raises(ValueError, match="CIFAR pickle"):
        get_dataset("cifar_dir", root=str(tmp_path / "run"))


# ------------------------------------------------------------------------------------------ sorting


def test_list_sampler_numbers_images_and_ties():
    images = torch.arange(10, dtype=torch.float32).view(10, 1, 1, 1).expand(10, 1, 28, 28).clone()
    labels = torch.arange(10)
    s = ListSampler(images[:3], labels[:3], n=5, digits=2)  # only 9 distinct numbers: ties are frequent
    x, v = s.sample(50, torch.Generator().manual_seed(0))
    assert x.shape == (50, 5, 1, 28, 56) and v.shape == (50, 5)
    for b in range(50):  # slow check: distinct numbers, and each image spells its number left to right
        assert len(set(v[b].tolist())) == 5
        for j in range(5):
            tens, ones = float(x[b, j, 0, 0, 0]), float(x[b, j, 0, 0, 28])
            assert 10 * tens + ones == float(v[b, j])


def test_true_permutation_and_loss():
    v = torch.tensor([[3.0, 9.0, 1.0, 5.0]])
    p = true_permutation(v)
    for i, j in enumerate([1, 3, 0, 2]):  # descending order
        assert p[0, i, j] == 1 and p[0, i].sum() == 1
    assert float(sort_loss(p, p)) < 1e-6
    uniform = torch.full_like(p, 0.25)
    assert float(sort_loss(uniform, p)) == pytest.approx(np.log(4), rel=1e-5)


@pytest.mark.parametrize("method", ["neuralsort", "stochastic", "softsort"])
def test_relaxed_straight_through_is_exact_forward_with_relaxed_gradients(method):
    from rankwise.recipes.sorting import SortOptions, relaxed_permutation

    scores = torch.tensor([[0.3, -1.2, 2.0, 0.9, 0.1]], requires_grad=True)
    soft = relaxed_permutation(scores, SortOptions(method=method, n_samples=3))
    hard = relaxed_permutation(scores, SortOptions(method=method, n_samples=3, hard=True))
    assert hard.shape == soft.shape
    # forward: exact permutation matrices (0/1 entries, one 1 per row and column)
    assert torch.all((hard == 0) | (hard == 1))
    assert torch.all(hard.sum(-1) == 1) and torch.all(hard.sum(-2) == 1)
    if method != "stochastic":  # the unperturbed scores' descending order
        assert hard[0].argmax(-1).tolist() == [2, 3, 0, 4, 1]
        assert not torch.all((soft == 0) | (soft == 1))
    # backward: the relaxation's gradients (non-zero, finite)
    (hard * torch.arange(25.0).view(5, 5)).sum().backward()
    assert scores.grad is not None and torch.isfinite(scores.grad).all() and scores.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "preset,extra",
    [
        ("large_mnist_neuralsort", ["task.n=3"]),
        ("large_mnist_stochastic", ["task.n_samples=2"]),
        ("large_mnist_softsort", ["task.n=7"]),
        ("large_mnist_vanilla", []),
        ("large_mnist_neuralsort", ["task.hard=true"]),
        ("large_mnist_softsort", ["task.hard=true"]),
    ],
)
@pytest.mark.slow
def test_sort_recipe_tiny(tmp_path, tiny_digits, preset, extra):
    cfg = load_config(preset, [*TINY_SORT, *extra])
    res = train(cfg, out=tmp_path / "run", data=tiny_digits, progress=False, verbose=False)
    m = _check_run(res, ["all_correct", "rank_correct"])
    assert 0 <= m["test"]["all_correct"] <= m["test"]["rank_correct"] <= 1
    assert evaluate(res.run_dir, data=tiny_digits)["test"] == m["test"]


@pytest.mark.parametrize("preset", ["large_mnist_median_neuralsort", "large_mnist_neuralsort", "large_mnist_vanilla"])
def test_recalibrate_bn_sets_running_stats_from_final_weights(tiny_digits, preset):
    from torch import nn

    from rankwise.recipes.sorting import _BN_SEED_OFFSET, ListSampler, RandomLists, SortingModule, recalibrate_bn

    cfg = load_config(preset, ["task.bn_recalibration=1", "task.lists_per_batch=4", "task.n=3"])
    t = cfg.task
    module = SortingModule(cfg, meta=tiny_digits.meta).eval()
    bns = [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in bns:  # stale statistics, as after fast-moving training
        bn.running_mean.fill_(5.0)
        bn.running_var.fill_(7.0)
    weights = {k: v.clone() for k, v in module.state_dict().items() if "running" not in k and "num_batches" not in k}
    x, y = tiny_digits.train.x, tiny_digits.train.y
    sampler = ListSampler(x, y, t.n, t.digits)
    assert recalibrate_bn(module, sampler, t, cfg.run.seed)
    # the first BatchNorm now holds the statistics of its input on the one recalibration batch
    images = torch.stack([RandomLists(sampler, 4, cfg.run.seed + _BN_SEED_OFFSET)[i][0] for i in range(4)])
    conv_in = nn.functional.avg_pool2d(images.flatten(0, 1), t.downsample)
    first = getattr(module.model, "scorer", module.model).backbone.features[0]  # the scorer's first conv
    act = first(conv_in)
    torch.testing.assert_close(bns[0].running_mean, act.mean((0, 2, 3)), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bns[0].running_var, act.var((0, 2, 3)), rtol=1e-4, atol=1e-5)
    assert not module.training  # mode restored
    for k, v in module.state_dict().items():  # weights untouched
        if k in weights:
            assert torch.equal(v, weights[k]), k
    # 0 = off: statistics untouched
    off = load_config(preset, ["task.bn_recalibration=0", "task.n=3"])
    bns[0].running_mean.fill_(5.0)
    assert not recalibrate_bn(module, sampler, off.task, 0)
    assert torch.all(bns[0].running_mean == 5.0)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["large_mnist_median_neuralsort", "large_mnist_median_stochastic"])
@pytest.mark.parametrize("hard", [False, True])
def test_median_recipe_tiny(tmp_path, tiny_digits, preset, hard):
    cfg = load_config(preset, [*TINY_SORT, "task.n_samples=2", f"task.hard={str(hard).lower()}"])
    res = train(cfg, out=tmp_path / "run", data=tiny_digits, progress=False, verbose=False)
    m = _check_run(res, ["mse_1e4", "median_correct"])
    assert 0 <= m["test"]["median_correct"] <= 1
    assert 0 <= m["test"]["mse_1e4"] < 1e4


@pytest.mark.parametrize(
    "preset,extra",
    [
        ("mnist5k_dknn", []),
        ("mnist5k_dknn", ["task.relaxation=stochastic", "task.n_samples=2"]),
        ("mnist5k_knn_pixels", []),
    ],
)
def test_dknn_recipe_tiny(tmp_path, tiny_digits, preset, extra):
    cfg = load_config(preset, ["task.steps=2", "task.queries=20", "task.neighbors=30", *extra])
    res = train(cfg, out=tmp_path / "run", data=tiny_digits, progress=False, verbose=False)
    m = _check_run(res, ["accuracy"])
    assert 0 <= m["test"]["accuracy"] <= 100


# ------------------------------------------------------------------------------------------ config, compare, CLI


@pytest.mark.parametrize(
    "preset,overrides,match",
    [
        ("large_mnist_neuralsort", ["task.nn=3"], "unknown config key `task.nn`.*did you mean 'n'"),
        ("large_mnist_neuralsort", ["task.method=neural"], r"`task.method` must be one of .*did you mean 'neuralsort'"),
        ("large_mnist_neuralsort", ["task.tau=0"], r"`task.tau` must be > 0"),
        ("large_mnist_neuralsort", ["task.n=1"], r"`task.n` must be >= 2"),
        ("large_mnist_neuralsort", ["task.options.iters=3"], r"unknown option `task.options.iters` for relaxation"),
        ("large_mnist_median_neuralsort", ["task.method=vanilla"], "for the median task"),
        ("large_mnist_vanilla", ["task.hard=true"], "`task.hard` .* does not apply to `task.method` 'vanilla'"),
        ("large_mnist_neuralsort", ["task.bn_recalibration=-1"], r"`task.bn_recalibration` must be >= 0"),
        ("mnist5k_supcon", ["optimizer.name=lamb"], r"`optimizer.name` must be one of"),
        ("mnist5k_supcon", ["task.optimizer=lars"], r"unknown config key `task.optimizer`"),
        ("abalone_vanilla", ["task.n=3"], r"unknown config key `task.n`"),
        ("large_mnist_neuralsort", ["loss.kind=mse"], r"`loss` is not used by recipe 'sort'"),
    ],
)
def test_task_config_errors(preset, overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(preset, overrides)


@pytest.mark.slow
def test_compare_report(tmp_path, tiny_digits, monkeypatch):
    from rankwise import data

    monkeypatch.setattr(data, "get_dataset", lambda name, **kw: tiny_digits)
    res = compare(
        ["large_mnist_neuralsort", "large_mnist_vanilla"], seeds=[0, 1], out=tmp_path / "cmp", overrides=TINY_SORT
    )
    text = res.report.read_text()
    assert "| method | seeds | all_correct | rank_correct | s/step | train s |" in text
    assert "large_mnist_vanilla | 2 |" in text
    assert len(res.results["large_mnist_neuralsort"]) == 2
    assert res.recipe is not None and res.recipe.name == "sort"
    with pytest.raises(ConfigError, match="cannot compare recipes with different metrics"):
        compare(["large_mnist_neuralsort", "abalone_vanilla"], out=tmp_path / "mixed")


@pytest.mark.slow
def test_cli_train_and_compare(tmp_path):
    from typer.testing import CliRunner

    from rankwise.cli import app

    runner = CliRunner()
    sets = []
    for s in ["task.steps=1", "task.queries=10", "task.neighbors=10", "data.options.test_fraction=0.05"]:
        sets += ["--set", s]
    r = runner.invoke(app, ["train", "mnist5k_dknn", *sets, "--out", str(tmp_path / "t"), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "accuracy" in r.output
    r = runner.invoke(app, ["compare", "mnist5k_knn_pixels", "--seeds", "0", "--out", str(tmp_path / "c"), *sets[:2]])
    assert r.exit_code == 0, r.output
    assert "mnist5k_knn_pixels seed 0: accuracy" in r.output
    assert (tmp_path / "c" / "report.md").is_file()
    r = runner.invoke(app, ["evaluate", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output


# ------------------------------------------------------------------------------------------ ranking losses for age


@pytest.mark.parametrize(
    "preset,ranker",
    [
        ("abalone_spearman", "isotonic"),
        ("abalone_spearman_neuralsort", "neuralsort"),
        ("abalone_spearman_sodeep", "sodeep"),
    ],
)
def test_abalone_spearman_presets_tiny(tmp_path, preset, ranker):
    pytest.importorskip("sklego")
    pytest.importorskip("lightning")
    tiny = [
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "report.plots=false",
        "trainer.enable_progress_bar=false",
    ]
    cfg = load_config(preset, tiny)
    (reg,) = cfg.loss.regularizers
    assert (reg.name, reg.options["ranker"]) == ("spearman", ranker)
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False)
    assert np.isfinite(res.metrics["test"]["all"]["mae"]) and "spearman" in res.metrics["test"]
