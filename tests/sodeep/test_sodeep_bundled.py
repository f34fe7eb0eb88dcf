"""Bundled SoDeep sorters, soft_rank(method="sodeep") and the "sodeep_rank" operator."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import rankwise
from rankwise.ops import get_op_entry
from rankwise.sodeep import BUNDLED_SEQ_LENS, ExactSorter, SodeepRank, mixed_batch, sodeep_rank, sodeep_sorter
from rankwise.sodeep.train import sorter_metrics
from rankwise.sodeep.weights_io import bundled_path
from tests.conftest import gradcheck
from tests.registry_examples import factories


@pytest.mark.parametrize("seq_len", BUNDLED_SEQ_LENS)
def test_bundled_files_load_weights_only(seq_len: int) -> None:
    path = bundled_path(seq_len, "gru")
    assert path.is_file(), f"missing bundled weights {path}"
    assert path.stat().st_size <= 2 * 1024 * 1024
    payload = torch.load(path, weights_only=True)
    assert payload["model"] == "gru" and payload["hparams"]["seq_len"] == seq_len
    assert payload["train"]["seq_len"] == seq_len
    s = sodeep_sorter(seq_len)
    assert s.seq_len == seq_len and not s.training
    assert not any(p.requires_grad for p in s.parameters())
    assert all(p.requires_grad for p in sodeep_sorter(seq_len, trainable=True).parameters())


@pytest.mark.parametrize("seq_len", BUNDLED_SEQ_LENS)
def test_bundled_quality_floor(seq_len: int) -> None:
    g = torch.Generator().manual_seed(12345)
    x = mixed_batch(180, seq_len, generator=g)  # 20 sequences of each of the 9 families
    m = sorter_metrics(sodeep_sorter(seq_len), x)
    assert m["spearman"] >= 0.97, m
    assert m["mae_rank"] <= 0.05 * seq_len, m


def test_soft_rank_sodeep_conventions() -> None:
    x = torch.randn(3, 64, dtype=torch.float64, requires_grad=True)
    r = rankwise.soft_rank(x, method="sodeep")
    assert r.shape == x.shape and r.dtype == torch.float64
    exact = rankwise.rank(x)
    assert (r - exact).abs().mean() < 2.0
    rd = rankwise.soft_rank(x, method="sodeep", descending=True)
    torch.testing.assert_close(r + rd, torch.full_like(r, 65.0))
    r.sum().backward()
    assert torch.isfinite(x.grad).all()
    # any dim
    xt = x.detach().T.contiguous()
    torch.testing.assert_close(rankwise.soft_rank(xt, method="sodeep", dim=0), r.detach().T)
    # fp16 computed in float32, returned as fp16
    assert rankwise.soft_rank(x.detach().half(), method="sodeep").dtype == torch.float32  # ranks: float32 for half


def test_soft_rank_sodeep_explicit_sorter_and_exact() -> None:
    x = torch.randn(2, 10)
    r = rankwise.soft_rank(x, method="sodeep", sorter=ExactSorter(10, temperature=1e-3))
    torch.testing.assert_close(r, rankwise.rank(x), atol=1e-3, rtol=0)
    r2 = rankwise.soft_rank(x, method="sodeep", model="exact")
    assert r2.shape == x.shape


def test_soft_rank_sodeep_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"n=10.*bundled seq_lens: \[32, 64, 128\]"):
        rankwise.soft_rank(torch.randn(2, 10), method="sodeep")
    with pytest.raises(TypeError, match=r"`sorter` must be an nn.Module"):
        rankwise.soft_rank(torch.randn(2, 10), method="sodeep", sorter="gru")
    with pytest.raises(ValueError, match=r"`model` must be one of"):
        rankwise.soft_rank(torch.randn(2, 32), method="sodeep", model="cnn")
    with pytest.raises(ValueError, match=r"no bundled 'gru' sorter for seq_len=50"):
        sodeep_sorter(50)
    with pytest.raises(TypeError, match=r"floating-point"):
        rankwise.soft_rank(torch.arange(32), method="sodeep")


def test_trivial_lengths_keep_graph() -> None:
    for shape in [(0,), (3, 0), (1,), (4, 1)]:
        x = torch.zeros(shape, requires_grad=True)
        r = sodeep_rank(x)
        assert r.shape == x.shape
        torch.testing.assert_close(r, torch.ones(shape))
        r.sum().backward()
        assert x.grad is not None


def test_registered_op_module_matches_function() -> None:
    entry = get_op_entry("sodeep_rank")
    f = factories("op", "sodeep_rank")
    ex = f.example(torch.float32, torch.device("cpu"))
    torch.testing.assert_close(entry.fn(*ex.args, **ex.kwargs), SodeepRank(**ex.kwargs)(*ex.args))
    assert f.degenerate is not None
    for deg in f.degenerate(torch.float32, torch.device("cpu")):
        out = entry.fn(*deg.args, **deg.kwargs)
        assert torch.isfinite(out).all()
        out.sum().backward()


def test_gradcheck_bundled_sorter_float64() -> None:
    x = torch.randn(1, 32, dtype=torch.float64)
    assert gradcheck(lambda t: sodeep_rank(t), x)


def test_import_rankwise_does_not_pull_lightning() -> None:
    code = "import sys, rankwise; rankwise.sodeep_sorter(32); print('lightning' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"
