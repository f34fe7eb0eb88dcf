"""The DIR recipe on image (generated AgeDB-style split file) and sentence-pair (STS-B-DIR) data."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("torchvision")
PIL = pytest.importorskip("PIL.Image")

from rankwise.recipes import load_config  # noqa: E402
from rankwise.recipes.runner import train  # noqa: E402

FAST = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.num_threads=1",
    "trainer.enable_progress_bar=false",
    "report.plots=false",
    "data.num_workers=0",
]


def _finite(m):
    assert math.isfinite(m["test"]["all"]["mae"])


@pytest.fixture
def image_split(tmp_path):
    rng = np.random.default_rng(0)
    rows = ["age,path,split"]
    (tmp_path / "img").mkdir()
    i = 0
    for split, n in (("train", 24), ("val", 6), ("test", 6)):
        for _ in range(n):
            age = int(rng.integers(10, 20))
            arr = (rng.random((20, 20, 3)) * 255).astype(np.uint8)
            PIL.fromarray(arr).save(tmp_path / "img" / f"{i}.png")
            rows.append(f"{age},img/{i}.png,{split}")
            i += 1
    (tmp_path / "agedb.csv").write_text("\n".join(rows) + "\n")
    return tmp_path


def test_image_recipe_resnet18_with_lds_fds_ranksim(image_split, tmp_path):
    cfg = load_config(
        "agedb_dir_lds_fds_ranksim",
        [
            *FAST,
            f"data.options.root={image_split}",
            f"data.options.csv={image_split / 'agedb.csv'}",
            "data.options.image_size=32",
            "data.batch_size=8",
            "model.backbone=resnet18",
        ],
    )
    res = train(cfg, out=tmp_path / "img_run", progress=False, verbose=False)
    _finite(res.metrics)
    assert res.metrics["test"]["all"]["count"] == 6


def test_image_rnc_two_views(image_split, tmp_path):
    cfg = load_config(
        "agedb_dir_rnc",
        [
            *FAST,
            f"data.options.root={image_split}",
            f"data.options.csv={image_split / 'agedb.csv'}",
            "data.options.image_size=32",
            "data.batch_size=8",
            "task.pretrain_epochs=1",
            "optimizer.lr=0.01",
            "task.lr=0.01",
        ],
    )
    res = train(cfg, out=tmp_path / "rnc_run", progress=False, verbose=False)
    _finite(res.metrics)
    assert res.metrics["test"]["all"]["count"] == 6
    # stage 1 ran to its end and handed its backbone to stage 2, which kept it frozen
    pre = res.run_dir / "pretrain"
    assert (pre / "done").is_file()
    pretrained = torch.load(pre / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    final = torch.load(res.run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    backbone = {k: v for k, v in pretrained.items() if k.startswith("backbone.") and v.is_floating_point()}
    assert backbone
    for k, v in backbone.items():
        torch.testing.assert_close(final[k], v, msg=f"{k} changed in stage 2")
    # the two views differ (flip + noise), so stage 1's contrastive loss was a real, finite number
    logs = list((res.run_dir / "logs").rglob("metrics.csv"))
    assert any("pretrain/loss/rnc" in p.read_text() for p in logs)


def test_text_pair_recipe_on_sts_b(shared_dir, tmp_path):
    root = shared_dir / "data" / "sts-b-dir"
    if not (root / "train_new.tsv").is_file():
        pytest.skip("STS-B-DIR TSVs absent")
    cfg = load_config(
        "sts_b_dir_ranksim",
        [
            *FAST,
            f"data.options.root={root}",
            "data.options.max_len=24",
            "data.batch_size=32",
            "data.eval_batch_size=500",
            "model.options={embed_dim: 16, hidden: 16, feature_dim: 16}",
            "task.lds={reweight: inverse, lds: true}",
        ],
    )
    res = train(cfg, out=tmp_path / "sts_run", progress=False, verbose=False)
    _finite(res.metrics)
    assert res.metrics["test"]["all"]["count"] == 1000
    assert res.metrics["test"]["pearson"] is None or -1 <= res.metrics["test"]["pearson"] <= 1


def test_generic_csv_recipe(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 3))
    y = np.round(10 + 3 * x[:, 0] + rng.normal(scale=0.5, size=200), 1)
    rows = ["a,b,c,target"] + [f"{r[0]:.4f},{r[1]:.4f},{r[2]:.4f},{t}" for r, t in zip(x, y)]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    cfg = load_config(
        "abalone_ranksim_lds",
        [
            *FAST,
            "data.name=csv",
            f"data.options={{path: {tmp_path / 't.csv'}, target: target}}",
            "data.batch_size=32",
            "model.options.hidden=[8]",
            "model.options.feature_dim=4",
        ],
    )
    res = train(cfg, out=tmp_path / "csv_run", progress=False, verbose=False)
    _finite(res.metrics)
    assert res.metrics["test"]["all"]["count"] == 40
