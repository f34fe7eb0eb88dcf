"""Every preset of ``rankwise presets`` trains on a tiny budget and writes the common run directory layout.

Image presets (AgeDB-DIR, IMDB-WIKI-DIR) run on a generated split file of random images, the
STS-B-DIR presets on the real TSVs in ../shared (skipped when absent), the others on their bundled
data; the RRT presets re-train the head of a tiny run of their source preset.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lightning")
pytest.importorskip("torchvision")
pytest.importorskip("sklego")
PIL = pytest.importorskip("PIL.Image")

from rankwise.recipes import load_config  # noqa: E402
from rankwise.recipes.config import list_presets  # noqa: E402
from rankwise.recipes.runner import train  # noqa: E402
from tests.conftest import SHARED  # noqa: E402

pytestmark = pytest.mark.slow

COMMON = ["trainer.num_threads=1", "trainer.enable_progress_bar=false", "report.tsne=false"]
#: the families whose recipes train a budget of steps (`task.steps`): trainer.max_epochs is refused there
STEP_FAMILIES = {"sort", "dknn", "retrieval"}
BY_FAMILY = {
    "abalone": ["trainer.limit_train_batches=2", "model.options.hidden=[8]", "model.options.feature_dim=4"],
    "dir_images": [
        "trainer.limit_train_batches=2",
        "data.options.image_size=32",
        "data.batch_size=8",
        "data.eval_batch_size=16",
        "data.num_workers=0",
    ],
    "sts": [
        "trainer.limit_train_batches=2",
        "data.options.max_len=16",
        "data.batch_size=16",
        "data.eval_batch_size=500",
        "model.options={embed_dim: 8, hidden: 8, feature_dim: 8}",
    ],
    "sort": [
        "task.steps=2",
        "task.test_lists=10",
        "task.val_lists=4",
        "task.lists_per_batch=2",
        "task.bn_recalibration=1",
    ],
    "supcon": ["task.train_subset=32", "data.batch_size=16", "task.probe_epochs=1", "model.options.feature_dim=8"],
    "dknn": ["task.steps=2", "task.queries=10", "task.neighbors=10", "model.options.feature_dim=8"],
    "brain_age": ["task.stage2_epochs=1", "data.batch_size=8", "data.num_workers=0", "data.options.shape=[32,36,32]"],
    "ltr": [
        "model.options={hidden: [8], feature_dim: 4, dropout: 0.1}",
        "data.batch_size=8",
        "data.num_workers=0",
        "task.slate_length=10",
    ],
    "topk": ["trainer.limit_train_batches=2", "data.batch_size=16", "data.eval_batch_size=64"],
    "retrieval": [
        "task.steps=2",
        "task.classes_per_batch=3",
        "task.samples_per_class=3",
        "model.options.feature_dim=8",
    ],
}
#: the topk presets: a tiny synthetic task; the CIFAR-100 / ImageNet ones a small CNN on generated files
TOPK_SYNTHETIC = [
    "data.options={seed: 0, num_classes: 20, clusters: 4, dim: 8, train_per_class: 4, val_per_class: 2, "
    "test_per_class: 2}",
    "model.options={hidden: [8], feature_dim: 8}",
]
TOPK_IMAGES = ["model.backbone=small_cnn", "model.options={feature_dim: 8}", "task.val_fraction=0.34"]
#: tiny networks of the brain-age presets (their model options differ per backbone)
BRAIN_AGE_MODELS = {
    "scale_dense": "model.options={nb_filter: 8, nb_block: 2, use_sex: true}",
    "sfcn": "model.options={channels: [4, 4, 4, 4, 4, 4], bins: 14, age_range: [20.0, 90.0], dropout: 0.5}",
}
MNIST = ["data.options.test_fraction=0.05"]
RRT_SOURCE = {
    "abalone_rrt": "abalone_vanilla",
    "agedb_dir_rrt_ranksim": "agedb_dir_ranksim",
    "imdb_wiki_dir_rrt_ranksim": "imdb_wiki_dir_ranksim",
}


def _family(name: str) -> str:
    if name.startswith("topk_") or "_topk_" in name:
        return "topk"
    if name.startswith(("ltr_", "mslr_web", "yahoo_ltr")):
        return "ltr"
    if name.startswith("brain_age"):
        return "brain_age"
    if name.startswith("abalone"):
        return "abalone"
    if name.startswith(("agedb", "imdb")):
        return "dir_images"
    if name.startswith("sts_b"):
        return "sts"
    if name.startswith("large_mnist"):
        return "sort"
    if name.endswith(("_smooth_ap", "_blackbox_ap", "_recall_at_k", "_fastap", "_retrieval")):
        return "retrieval"
    return "dknn" if "knn" in name else "supcon"


@pytest.fixture(scope="module")
def image_split(tmp_path_factory):
    """A tiny AgeDB/IMDB-WIKI-style split file (``age,path,split``) of random 20x20 images."""
    root = tmp_path_factory.mktemp("dir_images")
    rng = np.random.default_rng(0)
    (root / "img").mkdir()
    rows = ["age,path,split"]
    i = 0
    for split, n in (("train", 20), ("val", 6), ("test", 6)):
        for _ in range(n):
            PIL.fromarray((rng.random((20, 20, 3)) * 255).astype(np.uint8)).save(root / "img" / f"{i}.png")
            rows.append(f"{int(rng.integers(10, 16))},img/{i}.png,{split}")
            i += 1
    for name in ("agedb.csv", "imdb_wiki.csv"):
        (root / name).write_text("\n".join(rows) + "\n")
    return root


@pytest.fixture(scope="module")
def class_files(tmp_path_factory):
    """A CIFAR-100-style pickle folder and an ImageNet-style image folder of 20 classes (3 train / 2 test
    images, 8x8)."""
    import pickle

    root = tmp_path_factory.mktemp("topk_images")
    rng = np.random.default_rng(0)
    (root / "cifar").mkdir()
    for split, n in (("train", 3), ("test", 2)):
        labels = np.repeat(np.arange(20), n)
        data = rng.integers(0, 256, (len(labels), 3 * 8 * 8)).astype(np.uint8)
        with (root / "cifar" / split).open("wb") as fh:
            pickle.dump({"data": data, "fine_labels": labels.tolist()}, fh)
        for c in range(20):
            d = root / "folder" / split / f"n{c:02d}"
            d.mkdir(parents=True)
            for i in range(n):
                PIL.fromarray(rng.integers(0, 256, (8, 8, 3)).astype(np.uint8)).save(d / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def brain_cohort(tmp_path_factory):
    """A synthetic brain-age cohort of 24 subjects at 6 mm (or None without the mri extra)."""
    try:
        from rankwise.data import make_brain_age_synthetic

        root = tmp_path_factory.mktemp("brain_age")
        return make_brain_age_synthetic(root / "cohort", n=24, spacing=6.0), root / "cache"
    except ImportError:
        return None


@pytest.fixture(scope="module")
def letor_folders(tmp_path_factory):
    """Tiny LETOR folders in the MSLR-WEB layout (Fold1/, 136 features) and the Yahoo LTR layout (700 features)."""
    from rankwise.data import make_ltr_synthetic

    root = tmp_path_factory.mktemp("letor")
    sizes = {"train_queries": 12, "val_queries": 4, "test_queries": 4, "max_docs": 15}
    make_ltr_synthetic(root / "mslr" / "Fold1", num_features=136, **sizes)
    make_ltr_synthetic(root / "yahoo", num_features=700, **sizes)
    for split, name in (("train", "train"), ("vali", "valid"), ("test", "test")):
        (root / "yahoo" / f"{split}.txt").rename(root / "yahoo" / f"set1.{name}.txt")
    return root


def _ltr_overrides(name: str, folders: Path) -> list[str]:
    if name.startswith("ltr_synthetic"):
        return ["data.options={seed: 0, train_queries: 16, val_queries: 4, test_queries: 4, max_docs: 15}"]
    return [f"data.options.path={folders / ('mslr' if name.startswith('mslr') else 'yahoo')}"]


def _brain_age_overrides(name: str, cohort) -> list[str]:
    if cohort is None:
        pytest.skip("nibabel / nilearn / torchio (the mri extra) absent")
    csv, cache = cohort
    cfg = load_config(name)
    out = [f"data.options.csv={csv}", f"data.options.cache_dir={cache}", BRAIN_AGE_MODELS[cfg.model.backbone]]
    if any(r.name == "spearman" for r in cfg.loss.regularizers):
        out.append("loss.regularizers.spearman.options={ranker: isotonic}")  # SoDeep needs a batch of 32/64/128
    return out


def _topk_overrides(name: str, files) -> list[str]:
    if name.startswith("cifar100"):
        return [*TOPK_IMAGES, f"data.options.root={files / 'cifar'}"]
    if name.startswith("imagenet"):
        return [*TOPK_IMAGES, f"data.options.root={files / 'folder'}", "data.options.image_size=8"]
    return TOPK_SYNTHETIC


def _overrides(name: str, image_split, shared_dir: Path, cohort=None, letor=None, files=None) -> list[str]:
    fam = _family(name)
    out = [*COMMON, *([] if fam in STEP_FAMILIES else ["trainer.max_epochs=1"]), *BY_FAMILY[fam]]
    if fam == "topk":
        out += _topk_overrides(name, files)
    if fam == "ltr":
        out += _ltr_overrides(name, letor)
    if fam == "brain_age":
        out += _brain_age_overrides(name, cohort)
    if fam == "dir_images":
        out.append(f"data.options.root={image_split}")
    if fam == "sts":
        root = shared_dir / "data" / "sts-b-dir"
        if not (root / "train_new.tsv").is_file():
            pytest.skip("STS-B-DIR TSVs absent (../shared)")
        out.append(f"data.options.root={root}")
    if fam in ("sort", "supcon", "dknn", "retrieval"):
        out += MNIST
    if "rnc" in name:
        out.append("task.pretrain_epochs=1")
    return out


_EXTENDED = {
    "brain_age_tsan_synthetic",
    "brain_age_mse_synthetic",
    "brain_age_sfcn_synthetic",
    "brain_age_coral_synthetic",
    "brain_age_dldl_synthetic",
    "brain_age_dldl_ranking_synthetic",
    "brain_age_sfcn_dldl_synthetic",
    "brain_age_l1_synthetic",
    "brain_age_lds_synthetic",
    "brain_age_balanced_mse_synthetic",
    "brain_age_ranksim_synthetic",
    "brain_age_ordinal_entropy_synthetic",
    "brain_age_dist_loss_synthetic",
    "brain_age_corn_synthetic",
    "brain_age_cdw_ce_synthetic",
    "brain_age_sord_synthetic",
    "brain_age_mean_variance_synthetic",
}


@pytest.mark.parametrize(
    # the synthetic-cohort twins of the brain-age presets (about 9 s each; the TSAN one also trains in
    # tests/recipes/brain_age/test_recipe.py): extended here, over CI's time budget
    "name",
    [pytest.param(n, marks=pytest.mark.extended) if n in _EXTENDED else n for n in sorted(list_presets())],
)
def test_preset_trains_tiny(name, tmp_path, image_split, brain_cohort, letor_folders, class_files):
    # only the STS-B-DIR presets need ../shared (skipped without it); the others run anywhere
    shared_dir = SHARED
    sets = _overrides(name, image_split, shared_dir, brain_cohort, letor_folders, class_files)
    if name in RRT_SOURCE:
        src = RRT_SOURCE[name]
        train(load_config(src, _overrides(src, image_split, shared_dir)), out=tmp_path / "src", progress=False)
        sets.append(f"task.init_checkpoint={tmp_path / 'src'}")
    cfg = load_config(name, sets)
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False)
    d = res.run_dir
    metrics = json.loads((d / "metrics.json").read_text())
    assert metrics["recipe"] == cfg.recipe and metrics["test"]
    assert json.loads((d / "meta.json").read_text())["status"] == "completed"
    trains = getattr(cfg.task, "method", "") != "knn_pixels"  # a kNN on raw pixels trains nothing
    layout = ["config.yaml", "meta.json", "metrics.json"]
    layout += ["checkpoints/best.ckpt", "checkpoints/last.ckpt", "logs/metrics.csv"] if trains else []
    for f in layout:
        assert (d / f).is_file(), f
    assert (d / "plots").is_dir() and (any((d / "plots").iterdir()) or not trains)
    shutil.rmtree(tmp_path)  # the ResNet presets' checkpoints are ~0.5 GiB per test: free them now
