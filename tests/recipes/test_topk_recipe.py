"""The top-k classification recipe: the synthetic dataset, the DDP-correct top-k metric, one-epoch runs of
every ``topk`` preset, the logged keys and best checkpoint, evaluate / predict round trips, config errors."""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("torchvision")

from PIL import Image
from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.data import get_dataset, topk_synthetic_arrays
from rankwise.metrics import topk_accuracy
from rankwise.recipes import evaluate, load_config, predict
from rankwise.recipes.config import ConfigError, list_presets
from rankwise.recipes.eval_metrics import TopKAccuracy, shard_keep_mask
from rankwise.recipes.runner import load_run_config
from rankwise.recipes.topk import TopKModule, augment_flip_crop
from tests.cli_helpers import one_error_line

runner = CliRunner()

#: a tiny synthetic task (20 classes in 4 clusters, 8 features): a one-epoch run takes a second or two
TINY_DATA = (
    "data.options={seed: 0, num_classes: 20, clusters: 4, dim: 8, train_per_class: 6, val_per_class: 3, "
    "test_per_class: 4}"
)
TINY = [
    TINY_DATA,
    "trainer.max_epochs=1",
    "trainer.num_threads=1",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "data.batch_size=40",
    "model.options={hidden: [16], feature_dim: 16}",
    "report.plots=false",
]
#: the image presets on generated files: a small CNN instead of the ResNet-18, a validation image per class
IMAGES = [
    "trainer.max_epochs=1",
    "trainer.num_threads=1",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "data.batch_size=16",
    "data.eval_batch_size=32",
    "model.backbone=small_cnn",
    "model.options={feature_dim: 16}",
    "task.val_fraction=0.34",
    "report.plots=false",
]
TOPK_PRESETS = sorted(n for n in list_presets() if n.startswith("topk_") or "_topk_" in n)


def _sets(args: list[str]) -> list[str]:
    return [a for s in args for a in ("--set", s)]


def _train(preset: str, out: Path, args: list[str]) -> Path:
    r = runner.invoke(app, ["train", preset, "--no-progress", "-o", str(out), *_sets(args)])
    assert r.exit_code == 0, r.output
    return out


def _state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


# ---------------------------------------------------------------------------------------------- data


def test_synthetic_task_is_fixed_by_its_seed_and_balanced() -> None:
    a = topk_synthetic_arrays(seed=3, num_classes=10, clusters=2, dim=4, train_per_class=5)
    b = topk_synthetic_arrays(seed=3, num_classes=10, clusters=2, dim=4, train_per_class=5)
    c = topk_synthetic_arrays(seed=4, num_classes=10, clusters=2, dim=4, train_per_class=5)
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(a[split][0], b[split][0])
        assert a[split][0].dtype == np.float32 and a[split][1].dtype == np.int64
    assert not np.array_equal(a["train"][0], c["train"][0])
    assert np.bincount(a["train"][1]).tolist() == [5] * 10 and np.bincount(a["test"][1]).tolist() == [20] * 10
    data = get_dataset("topk_synthetic")
    assert (len(data.train), len(data.val), len(data.test), data.num_classes) == (3000, 1000, 2000, 100)
    assert data.meta["clusters"][:6] == [0, 0, 0, 0, 0, 1] and data.meta["backbone_options"] == {"in_dim": 32}


def test_classes_of_a_cluster_are_confusable() -> None:
    """The nearest class mean of a class lies in its own cluster: top-1 errors stay mostly in the cluster."""
    x, y = topk_synthetic_arrays(seed=0, train_per_class=200)["train"]
    means = np.stack([x[y == c].mean(0) for c in range(100)])
    d = ((means[:, None] - means[None]) ** 2).sum(-1) + np.diag(np.full(100, np.inf))
    assert np.mean(d.argmin(1) // 5 == np.arange(100) // 5) > 0.9


def test_label_noise_changes_only_training_labels() -> None:
    clean = topk_synthetic_arrays(seed=0)
    noisy = topk_synthetic_arrays(seed=0, label_noise=0.5)
    np.testing.assert_array_equal(clean["train"][0], noisy["train"][0])
    np.testing.assert_array_equal(clean["test"][1], noisy["test"][1])
    changed = np.mean(clean["train"][1] != noisy["train"][1])
    assert 0.45 < changed < 0.52  # half drawn anew, 1 % of those land on their own class


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"clusters": 3}, "`clusters` must divide `num_classes`"),
        ({"noise": -1.0}, "`noise` must be finite and >= 0"),
        ({"label_noise": 1.5}, r"`label_noise` must be a fraction in \[0, 1\]"),
        ({"train_per_class": 0}, "`train_per_class` must be >= 1"),
    ],
)
def test_synthetic_options_are_checked(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        topk_synthetic_arrays(**options)


# -------------------------------------------------------------------------------------------- metric


def test_topk_metric_counts_each_example_once_over_padded_shards() -> None:
    """Two ranks of a DistributedSampler over 7 examples (one repeated to pad a shard): the summed states
    give the accuracy of one process over the 7, as rankwise.metrics.topk_accuracy computes it."""
    from torch.utils.data import DistributedSampler

    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(7, 6, generator=g), torch.randint(0, 6, (7,), generator=g)
    ranks = []
    for rank in range(2):
        s = DistributedSampler(range(7), num_replicas=2, rank=rank, shuffle=False)
        idx = torch.tensor(list(s))
        keep = shard_keep_mask(s, 0, len(idx))
        m = TopKAccuracy(k=2)
        m.update(logits[idx][keep], y[idx][keep])
        ranks.append(m)
    hits, count = sum(int(m.hits) for m in ranks), sum(int(m.count) for m in ranks)
    assert count == 7
    assert 100.0 * hits / count == pytest.approx(100.0 * float(topk_accuracy(logits, y, ks=2)))
    one = TopKAccuracy(k=2)
    one.update(logits, y)
    assert float(one.compute()) == pytest.approx(100.0 * hits / count)
    big = TopKAccuracy(k=9)  # k above the classes: every example is in its top k
    big.update(logits, y)
    assert float(big.compute()) == 100.0


def test_flip_crop_gives_a_crop_of_the_padded_or_flipped_image() -> None:
    torch.manual_seed(0)
    x = torch.rand(16, 3, 6, 5)
    out = augment_flip_crop(x, pad=2)
    assert out.shape == x.shape and not torch.equal(out, x)
    flips = set()
    for a, b in zip(x, out, strict=True):
        # by hand: every (flip, dy, dx) candidate of the zero-padded image; exactly the output is among them
        found = [
            (f, dy, dx)
            for f in (False, True)
            for dy in range(5)
            for dx in range(5)
            if torch.equal(
                torch.nn.functional.pad(a.flip(-1) if f else a, (2, 2, 2, 2))[:, dy : dy + 6, dx : dx + 5], b
            )
        ]
        assert found, "not a crop of the padded image"
        flips.add(found[0][0])
    assert flips == {False, True}


# ------------------------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CIFAR-100-style "python version" folder of 20 classes (train: 3 images each, test: 2), 8x8 pixels."""
    root = tmp_path_factory.mktemp("cifar100")
    rng = np.random.default_rng(0)
    for name, n in (("train", 3), ("test", 2)):
        labels = np.repeat(np.arange(20), n)
        data = rng.integers(0, 256, (len(labels), 3 * 8 * 8)).astype(np.uint8)
        with (root / name).open("wb") as fh:
            pickle.dump({"data": data, "fine_labels": labels.tolist()}, fh)
    with (root / "meta").open("wb") as fh:
        pickle.dump({"fine_label_names": [f"class{c}" for c in range(20)]}, fh)
    return root


@pytest.fixture(scope="module")
def imagenet_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageNet-style folder ``train/<class>/``, ``test/<class>/`` of 20 classes (3 / 1 images), 10x10 RGB."""
    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("test", 1)):
        for c in range(20):
            d = root / split / f"n{c:04d}"
            d.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (10, 10, 3)).astype(np.uint8)).save(d / f"{i}.png")
    return root


def _preset_args(name: str, cifar_root: Path, imagenet_root: Path) -> list[str]:
    if name.startswith("cifar100"):
        return [*IMAGES, f"data.options.root={cifar_root}"]
    if name.startswith("imagenet"):
        return [*IMAGES, f"data.options.root={imagenet_root}", "data.options.image_size=8"]
    return TINY


@pytest.mark.parametrize("name", TOPK_PRESETS)
def test_every_topk_preset_trains_one_epoch(name: str, tmp_path: Path, cifar_root: Path, imagenet_root: Path) -> None:
    run = _train(name, tmp_path / "run", _preset_args(name, cifar_root, imagenet_root))
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["recipe"] == "topk" and set(metrics["test"]) == {"top1", "top5"}
    assert 0.0 <= metrics["test"]["top1"] <= metrics["test"]["top5"] <= 100.0
    assert metrics["checkpoint"] == "checkpoints/best.ckpt"
    header = (run / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
    loss = load_config(name).task.loss
    assert {"train/loss_step", "train/loss_epoch", f"train/loss/{loss}", "val/top1", "val/top5"} <= set(header)


def test_preset_list_has_one_synthetic_preset_per_loss() -> None:
    methods = {n: load_config(n).task.loss_options.get("method") for n in TOPK_PRESETS if n.startswith("topk_")}
    assert methods == {
        "topk_synthetic_ce": None,
        "topk_synthetic_odd_even": "odd_even",
        "topk_synthetic_bitonic": "bitonic",
        "topk_synthetic_neuralsort": "neuralsort",
        "topk_synthetic_softsort": "softsort",
    }
    others = ["cifar100_topk_bitonic", "cifar100_topk_ce", "cifar100_topk_neuralsort", "imagenet_topk_bitonic"]
    assert [n for n in TOPK_PRESETS if not n.startswith("topk_")] == [*others, "imagenet_topk_ce"]
    for n in [*others, "imagenet_topk_ce"]:
        cfg = load_config(n)  # validated, though the data are the user's
        assert cfg.recipe == "topk" and cfg.data.name in ("cifar_dir", "image_folder")


@pytest.fixture(scope="module")
def odd_even_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sets = [*TINY, "trainer.max_epochs=3", "optimizer.lr=0.01"]
    return _train("topk_synthetic_odd_even", tmp_path_factory.mktemp("topk") / "run", sets)


def _test_logits(run: Path, name: str = "best") -> tuple[torch.Tensor, torch.Tensor]:
    cfg = load_run_config(run)
    data = get_dataset("topk_synthetic", **cfg.data.options)
    module = TopKModule(cfg, num_classes=data.num_classes, meta=data.meta)
    module.load_state_dict(_state(run / "checkpoints" / f"{name}.ckpt")["state_dict"])
    with torch.no_grad():
        return module.eval()(data.test.x), data.test.y


def test_test_metrics_are_those_of_the_best_checkpoint(odd_even_run: Path) -> None:
    metrics = json.loads((odd_even_run / "metrics.json").read_text())
    logits, y = _test_logits(odd_even_run)
    top1, top5 = (100.0 * topk_accuracy(logits, y, ks=(1, 5))).tolist()
    assert metrics["test"] == pytest.approx({"top1": top1, "top5": top5}, abs=1e-4)
    # best.ckpt is the epoch of the highest val/top5 (the first of equals)
    rows = list(csv.DictReader((odd_even_run / "logs" / "metrics.csv").open()))
    val = [(int(r["epoch"]), float(r["val/top5"])) for r in rows if r.get("val/top5")]
    best_epoch = max(val, key=lambda e: (e[1], -e[0]))[0]
    assert _state(odd_even_run / "checkpoints" / "best.ckpt")["epoch"] == best_epoch


def test_evaluate_reproduces_the_test_metrics(odd_even_run: Path) -> None:
    before = json.loads((odd_even_run / "metrics.json").read_text())
    again = evaluate(odd_even_run)
    assert again["test"] == pytest.approx(before["test"]) and again["checkpoint"] == "checkpoints/best.ckpt"
    last = evaluate(odd_even_run, checkpoint="last")
    logits, y = _test_logits(odd_even_run, "last")
    assert last["test"]["top5"] == pytest.approx(100.0 * float(topk_accuracy(logits, y, ks=5)), abs=1e-4)
    evaluate(odd_even_run)  # metrics.json of the best checkpoint again


def test_predict_gives_the_classes_of_the_best_checkpoint(odd_even_run: Path, tmp_path: Path) -> None:
    logits, _ = _test_logits(odd_even_run)
    x = get_dataset("topk_synthetic", **load_run_config(odd_even_run).data.options).test.x[:12]
    # the feature columns in another order, an id column first
    path = tmp_path / "new.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", *[f"x{j}" for j in reversed(range(8))]])
        for i, row in enumerate(x.tolist()):
            w.writerow([f"r{i}", *[repr(v) for v in reversed(row)]])
    out = predict(odd_even_run, path)
    assert list(out) == ["id", *[f"x{j}" for j in reversed(range(8))], "probability", "top5", "prediction"]
    order = torch.sort(logits[:12], dim=-1, descending=True, stable=True).indices
    assert out["prediction"].tolist() == order[:, 0].tolist()
    assert out["top5"] == [" ".join(str(c) for c in r) for r in order[:, :5].tolist()]
    p = torch.softmax(logits[:12], dim=-1).max(-1).values
    np.testing.assert_allclose(out["probability"], p.numpy(), rtol=1e-5)
    # the CLI writes the same columns
    dest = tmp_path / "p.csv"
    r = runner.invoke(app, ["predict", str(odd_even_run), "--data", str(path), "--out", str(dest)])
    assert r.exit_code == 0, r.output
    rows = list(csv.reader(dest.open()))
    assert rows[0][-3:] == ["probability", "top5", "prediction"]
    assert [int(r[-1]) for r in rows[1:]] == out["prediction"].tolist()


def test_predict_names_a_missing_feature_column(odd_even_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("x0,x1\n1,2\n")
    r = runner.invoke(app, ["predict", str(odd_even_run), "--data", str(path), "--out", str(tmp_path / "o.csv")])
    line = one_error_line(r)
    assert "bad.csv" in line and "'x2'" in line


def test_predict_names_the_classes_of_an_image_run(tmp_path: Path, cifar_root: Path) -> None:
    run = _train("cifar100_topk_ce", tmp_path / "run", [*IMAGES, f"data.options.root={cifar_root}"])
    rng = np.random.default_rng(1)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3)).astype(np.uint8)).save(tmp_path / f"{i}.png")
    (tmp_path / "new.csv").write_text("path\n0.png\n1.png\n2.png\n")
    out = predict(run, tmp_path / "new.csv")
    assert list(out) == ["path", "probability", "top5", "prediction"]
    assert all(p.startswith("class") for p in out["prediction"])
    assert [t.split()[0] for t in out["top5"]] == out["prediction"] and all(len(t.split()) == 5 for t in out["top5"])


# ------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        (["task.loss=smooth_ap"], r"`task\.loss`: loss 'smooth_ap' does not take a classifier's logits"),
        (
            ["task.loss=topk_ce"],
            r"`task\.loss`: unknown loss 'topk_ce'.*valid losses: cross_entropy, topk_cross_entropy$",
        ),
        (["task.loss_options={p_k: [0.5, 0.4]}"], r"`task\.loss_options`: .*p_k.* must sum to 1"),
        (["task.loss_options={p_k: [1.0], tau: 1.0}"], r"task\.loss_options\.tau"),
        (["task.loss_options={p_k: [1.0], method: bubble}"], r"`task\.loss_options`: .*method"),
        (["task.loss=cross_entropy", "task.loss_options={p_k: [1.0]}"], r"task\.loss_options\.p_k"),
        (["task.loss=cross_entropy", "task.loss_options={label_smoothing: 1.5}"], r"label_smoothing"),
        (["task.val_metric=top3"], r"`task\.val_metric` must be one of top1, top5"),
        (["task.ks=[1, 1]"], r"`task\.ks` must be a non-empty list of distinct"),
        (["task.val_fraction=1.0"], r"task\.val_fraction"),
        (["task.augment=mixup"], r"task\.augment"),
        (["loss.name=listnet"], r"`loss` is not used by recipe 'topk'"),
    ],
)
def test_config_errors_name_the_key(sets: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config("topk_synthetic_odd_even", sets)


def test_cli_config_error_is_one_line(tmp_path: Path) -> None:
    r = runner.invoke(
        app, ["train", "topk_synthetic_odd_even", "-o", str(tmp_path / "r"), "--set", "task.val_metric=top2"]
    )
    assert "task.val_metric" in one_error_line(r)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("classes", "message", "preset"),
    [
        (6, "`task.loss_options.m` = 16 is more than the 6 classes of `topk_synthetic`", "topk_synthetic_odd_even"),
        (
            4,
            "`task.loss_options.p_k` has 5 entries, more than the 4 classes of `topk_synthetic`",
            "topk_synthetic_odd_even",
        ),
        (4, "`task.ks` = [1, 5] has a k above the 4 classes of `topk_synthetic`", "topk_synthetic_ce"),
    ],
)
def test_loss_or_ks_larger_than_the_classes_is_refused_before_the_run(
    tmp_path: Path, classes: int, message: str, preset: str
) -> None:
    sets = [*TINY, f"data.options.num_classes={classes}", "data.options.clusters=2"]
    r = runner.invoke(app, ["train", preset, "-o", str(tmp_path / "r"), *_sets(sets)])
    assert message in one_error_line(r)
    assert not (tmp_path / "r").exists()
