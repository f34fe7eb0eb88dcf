"""DataLoader workers of every recipe: ``data.num_workers`` capped at the CPUs the process may use."""

from __future__ import annotations

import warnings
from typing import ClassVar

import pytest

from rankwise.recipes import common


@pytest.fixture
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(common, "_CAPPED_WORKERS", set())


def test_more_workers_than_cpus_are_capped_with_one_warning(two_cpus: None) -> None:
    message = r"data.num_workers=4 is more than the 2 CPUs .*: 2 DataLoader workers"
    with pytest.warns(common.DataDefaultsWarning, match=message):
        assert common.loader_workers(4) == {"num_workers": 2, "persistent_workers": True}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert common.loader_workers(4)["num_workers"] == 2  # said once per process


@pytest.mark.parametrize("n", [0, 1, 2])
def test_workers_within_the_cpus_are_kept_silently(two_cpus: None, n: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert common.loader_workers(n) == {"num_workers": n, "persistent_workers": n > 0}


def test_the_regression_loaders_use_the_capped_count(two_cpus: None) -> None:
    import torch
    from torch.utils.data import TensorDataset

    from rankwise.recipes import load_config
    from rankwise.recipes.common import regression_loaders

    class Data:
        train = val = test = TensorDataset(torch.zeros(8, 1), torch.zeros(8))
        meta: ClassVar[dict[str, object]] = {}

    cfg = load_config("abalone_vanilla", ["data.num_workers=6"])
    with pytest.warns(UserWarning, match="num_workers=6"):
        loaders = regression_loaders(Data(), cfg)
    assert [dl.num_workers for dl in loaders] == [2, 2, 2]
