"""The reproduction recipes run on Lightning: index-seeded data, checkpoints, resume after SIGKILL."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("torchvision")
pytest.importorskip("sklearn")
pytest.importorskip("typer")

from rankwise.recipes.config import load_config
from rankwise.recipes.modules import EpochIndexSampler, item_seed
from rankwise.recipes.runner import ENV_KILL_AT_STEP, load_state_dict, train
from rankwise.recipes.sorting import Episodes, ListSampler, RandomLists
from rankwise.recipes.supcon import TwoViewDataset, build_augmentation
from tests.recipes.test_recipe_training import _cli


def test_epoch_index_sampler_fresh_indices_every_epoch():
    s = EpochIndexSampler(5, seed=3)
    e0 = list(s)
    assert sorted(e0) == [0, 1, 2, 3, 4] and e0 == list(s)  # a permutation, fixed for the epoch
    s.set_epoch(2)
    e2 = list(s)
    assert sorted(e2) == [10, 11, 12, 13, 14]
    big = EpochIndexSampler(50, seed=3)
    first = list(big)
    big.set_epoch(1)
    assert [i - 50 for i in big] != first  # a new order every epoch
    other = EpochIndexSampler(5, seed=4)
    other.set_epoch(2)
    assert sorted(other) == sorted(e2)
    seq = EpochIndexSampler(4, seed=0, shuffle=False)
    seq.set_epoch(1)
    assert list(seq) == [4, 5, 6, 7] and len(seq) == 4


def test_item_seed_distinct_and_in_range():
    seeds = {item_seed(s, i) for s in range(4) for i in range(1000)}
    assert len(seeds) == 4000
    assert all(0 <= s < 2**63 - 1 for s in seeds)


def _digits(n=40):
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 1, 28, 28, generator=g), torch.arange(n) % 10


def test_two_view_dataset_is_seeded_by_index_and_leaves_global_rng_alone():
    x, y = _digits()
    ds = TwoViewDataset(x, y, build_augmentation("digits", (1, 28, 28)), n_views=2, seed=7)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    v1, y1 = ds[3]
    assert torch.equal(torch.get_rng_state(), state)
    v2, _ = ds[3]
    assert v1.shape == (2, 1, 28, 28) and torch.equal(v1, v2) and int(y1) == 3
    assert not torch.equal(v1[0], v1[1])  # two different views
    later, y_later = ds[3 + len(ds)]  # the same image in a later epoch: new views
    assert int(y_later) == 3 and not torch.equal(later, v1)
    assert not torch.equal(TwoViewDataset(x, y, ds.transform, seed=8)[3][0], v1)


def test_random_lists_and_episodes_are_seeded_by_index():
    x, y = _digits()
    lists = RandomLists(ListSampler(x, y, n=3, digits=2), length=10, seed=1)
    a, va = lists[4]
    b, vb = lists[4]
    assert a.shape == (3, 1, 28, 56) and va.dtype == torch.float32
    assert torch.equal(a, b) and torch.equal(va, vb)
    assert not torch.equal(lists[5][1], va) or not torch.equal(lists[5][0], a)
    eps = Episodes(x, y, size=12, length=5, seed=1)
    ex, ey = eps[2]
    assert ex.shape == (12, 1, 28, 28) and torch.equal(ey, eps[2][1])
    assert len(set(ey.tolist())) <= 10 and len({tuple(t.flatten()[:5].tolist()) for t in ex}) == 12  # distinct images


SORT_SETS = [
    "task.n=3",
    "task.steps=6",
    "task.steps_per_epoch=2",
    "task.lists_per_batch=4",
    "task.test_lists=40",
    "model.options.feature_dim=16",
    "trainer.num_threads=1",
    "trainer.log_every_n_steps=1",
    "data.options.test_fraction=0.05",
]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["large_mnist_stochastic", "large_mnist_median_stochastic"])
def test_sort_resume_after_sigkill_matches_uninterrupted_run(tmp_path, preset):
    ref = train(load_config(preset, SORT_SETS), out=tmp_path / "ref", progress=False, verbose=False)
    ref_state = load_state_dict(tmp_path / "ref" / "checkpoints" / "last.ckpt")
    assert (tmp_path / "ref" / "logs" / "metrics.csv").is_file()

    args = ["train", preset, "--out", str(tmp_path / "killed"), "--no-progress"]
    for s in SORT_SETS:
        args += ["--set", s]
    killed = _cli(args, {ENV_KILL_AT_STEP: "3"})  # mid-epoch 1 (2 steps per epoch)
    assert killed.returncode == -9, killed.stderr[-2000:]
    ck = torch.load(tmp_path / "killed" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ck["epoch"] == 0 and ck["global_step"] == 2
    assert not (tmp_path / "killed" / "metrics.json").exists()

    resumed = _cli(["train", preset, "--out", str(tmp_path / "killed"), "--resume", "--no-progress"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = json.loads((tmp_path / "killed" / "metrics.json").read_text())
    assert got["test"] == ref.metrics["test"]
    state = load_state_dict(tmp_path / "killed" / "checkpoints" / "last.ckpt")
    assert state.keys() == ref_state.keys()
    assert all(torch.equal(state[k], ref_state[k]) for k in state)
    ck = torch.load(tmp_path / "killed" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ck["global_step"] == 6


@pytest.mark.slow
def test_supcon_resume_after_sigkill_matches_uninterrupted_run(tmp_path):
    sets = [
        "task.train_subset=48",
        "data.batch_size=16",  # 3 steps per epoch
        "trainer.max_epochs=2",
        "task.probe_epochs=2",
        "model.options.feature_dim=16",
        "trainer.num_threads=1",
        "data.options.test_fraction=0.05",
    ]
    ref = train(load_config("mnist5k_supcon", sets), out=tmp_path / "ref", progress=False, verbose=False)
    args = ["train", "mnist5k_supcon", "--out", str(tmp_path / "killed"), "--no-progress"]
    for s in sets:
        args += ["--set", s]
    killed = _cli(args, {ENV_KILL_AT_STEP: "4"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert torch.load(tmp_path / "killed" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    resumed = _cli(["train", "mnist5k_supcon", "--out", str(tmp_path / "killed"), "--resume", "--no-progress"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = json.loads((tmp_path / "killed" / "metrics.json").read_text())
    assert got["test"] == ref.metrics["test"]
    a = load_state_dict(tmp_path / "killed" / "checkpoints" / "last.ckpt")
    b = load_state_dict(tmp_path / "ref" / "checkpoints" / "last.ckpt")
    assert all(torch.equal(a[k], b[k]) for k in b)
