"""Global-batch losses on 2 CPU processes (gloo): value and gradients equal the single-process ones.

One ``torch.multiprocessing.spawn`` per group of checks (see ``_workers.py``) keeps the file fast;
each check is then asserted by its own test. Convention under test (``rankwise.distributed``): the
mean over ranks of the returned values is the single-process loss on the concatenated batch, and
each rank's local gradient is ``world_size`` times the single-process gradient of its slice.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import rankwise
from rankwise import distributed as rd

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(), reason="gloo unavailable"
)

WORLD = 2
LOSS_NAMES = [
    "supcon",
    "supcon_simclr_in",
    "supcon_one_chunked",
    "rnc",
    "triplet_all",
    "triplet_hard_sum",
    "smooth_ap",
    "recall_at_k",
    "blackbox_ap",
    "fastap",
    "npairs",
    "npairs_sum_nolabels",
    "conr",
    "conr_out",
    "conr_weights",
    "ranksim",
    "ranksim_all",
    "spearman_isotonic",
    "spearman_blackbox",
    "spearman_lead",
    "spearman_correlation",
    "pairwise_difference",
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(task: str, tmp: Path) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    from tests.distributed._workers import worker

    ctx = mp.start_processes(
        worker, args=(WORLD, _free_port(), str(tmp), task), nprocs=WORLD, start_method="spawn", join=False
    )
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail(f"distributed workers ({task}) did not finish in 240 s")
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def loss_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _spawn("losses", tmp_path_factory.mktemp("dist_losses"))


@pytest.fixture(scope="module")
def misc_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _spawn("misc", tmp_path_factory.mktemp("dist_misc"))


@pytest.mark.slow
@pytest.mark.parametrize("sizes", ["uneq", "empty"])
@pytest.mark.parametrize("name", LOSS_NAMES)
def test_loss_matches_single_process(loss_results: list[dict[str, Any]], name: str, sizes: str) -> None:
    for rank, res in enumerate(loss_results):
        assert "error" not in res, res.get("error")
        r = res[f"{name}[{sizes}]"]
        assert "error" not in r, r.get("error")
        assert r["value_err"] <= 1e-9 * max(1.0, abs(r["ref"])), (rank, r)
        assert r["grad_err"] <= 1e-9, (rank, r)
        assert r["ref_grad_norm"] > 0, (rank, r)  # a non-trivial check
    if sizes == "uneq" and name != "spearman_correlation":
        # each rank returns its own share, not the global value
        shares = [res[f"{name}[{sizes}]"]["local_value"] for res in loss_results]
        assert sum(shares) / WORLD == pytest.approx(loss_results[0][f"{name}[{sizes}]"]["ref"], rel=1e-9, abs=1e-12)


@pytest.mark.slow
def test_all_gather_uneven_sizes_and_gradient(misc_results: list[dict[str, Any]]) -> None:
    for res in misc_results:
        assert "error" not in res, res.get("error")
        g = res["gather"]
        assert g["value_err"] == 0 and g["grad_err"] == 0
        assert g["dim1_ok"] == 1 and g["bool_ok"] == 1 and g["layout_ok"] == 1


@pytest.mark.slow
def test_fds_statistics_all_reduced(misc_results: list[dict[str, Any]]) -> None:
    for res in misc_results:
        assert res["fds"]["max_err"] < 1e-6


@pytest.mark.slow
def test_auto_turns_on_in_a_process_group(misc_results: list[dict[str, Any]]) -> None:
    assert all(res["auto"]["on"] == 1 for res in misc_results)


# -------------------------------------------------------------------------------- single process


def test_single_process_helpers() -> None:
    assert not rd.is_distributed()
    assert rd.get_world_size() == 1 and rd.get_rank() == 0
    assert rd.resolve_distributed("auto") is False and rd.resolve_distributed(False) is False
    x = torch.randn(3, 2, requires_grad=True)
    assert rd.all_gather_with_grad(x) is x
    assert torch.equal(rd.all_gather_no_grad(x), x.detach())
    layout = rd.batch_layout(3)
    assert layout.sizes == (3,) and layout.local == slice(0, 3) and layout.total == 3
    assert rd.local_slice([2, 5, 1], 1) == slice(2, 7)
    assert torch.equal(rd.all_reduce_sum(x), x.detach()) and torch.equal(rd.broadcast(x), x.detach())


def test_resolve_distributed_errors() -> None:
    with pytest.raises(ValueError, match=r"initialized torch\.distributed process group"):
        rd.resolve_distributed(True)
    with pytest.raises(ValueError, match="`distributed` must be True, False or 'auto'"):
        rd.resolve_distributed("yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"initialized torch\.distributed process group"):
        rankwise.losses.ranksim_loss(torch.randn(4, 3), torch.arange(4.0), distributed=True)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: rankwise.losses.supcon_loss(torch.randn(4, 2, 3, generator=_g()), torch.tensor([0, 1, 0, 1]), **d),
        lambda d: rankwise.losses.triplet_loss(torch.randn(4, 2, 3, generator=_g()), torch.tensor([0, 1, 0, 1]), **d),
        lambda d: rankwise.losses.npairs_loss(torch.randn(4, 2, 3, generator=_g()), torch.tensor([0, 1, 0, 1]), **d),
        lambda d: rankwise.losses.rnc_loss(torch.randn(4, 2, 3, generator=_g()), torch.arange(4.0), **d),
        lambda d: rankwise.losses.conr_loss(
            torch.randn(4, 2, 3, generator=_g()), torch.arange(4.0), torch.tensor([0.0, 2.0, 1.5, 3.0]), **d
        ),
        lambda d: rankwise.losses.ranksim_loss(torch.randn(4, 3, generator=_g()), torch.arange(4.0), **d),
        lambda d: rankwise.losses.spearman_loss(torch.randn(5, generator=_g()), torch.arange(5.0), **d),
        lambda d: rankwise.losses.spearman_correlation(torch.randn(5, generator=_g()), torch.arange(5.0), **d),
        lambda d: rankwise.losses.pairwise_difference_loss(torch.randn(5, generator=_g()), torch.arange(5.0), **d),
    ],
)
def test_auto_is_local_without_process_group(call: Any) -> None:
    assert torch.equal(call({"distributed": "auto"}), call({}))


def _g() -> torch.Generator:
    return torch.Generator().manual_seed(0)
