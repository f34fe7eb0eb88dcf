"""topk_accuracy: against torch.topk / torchmetrics, deterministic ties, shapes, errors."""

from __future__ import annotations

import math

import pytest
import torch

from rankwise.metrics import topk_accuracy


def _data(b: int, c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, c, generator=g), torch.randint(c, (b,), generator=g)


@pytest.mark.parametrize(("b", "c"), [(1, 1), (7, 3), (64, 10), (200, 100)])
def test_equals_torch_topk_without_ties(b: int, c: int) -> None:
    x, y = _data(b, c, seed=c)
    ks = tuple(k for k in (1, 2, 5, 10) if k <= c)
    want = torch.stack([(torch.topk(x, k, dim=-1).indices == y[:, None]).any(-1).float().mean() for k in ks])
    torch.testing.assert_close(topk_accuracy(x, y, ks=ks), want)


def test_equals_torchmetrics() -> None:
    torchmetrics = pytest.importorskip("torchmetrics")
    x, y = _data(300, 20, seed=0)
    for k in (1, 3, 5):
        acc = torchmetrics.classification.MulticlassAccuracy(num_classes=20, top_k=k, average="micro")
        torch.testing.assert_close(topk_accuracy(x, y, ks=k), acc(x, y))


def test_ties_follow_the_stable_descending_order() -> None:
    x = torch.tensor([[1.0, 1.0, 1.0, 0.0]] * 4)
    y = torch.tensor([0, 1, 2, 3])
    # stable order 0, 1, 2, 3: class t is at place t
    torch.testing.assert_close(topk_accuracy(x, y, ks=(1, 2, 3, 4)), torch.tensor([0.25, 0.5, 0.75, 1.0]))
    g = torch.Generator().manual_seed(1)
    z = torch.randint(0, 3, (500, 6), generator=g).float()  # many ties
    t = torch.randint(6, (500,), generator=g)
    order = torch.sort(z, dim=-1, descending=True, stable=True).indices
    for k in (1, 2, 4):
        want = (order[:, :k] == t[:, None]).any(-1).float().mean()
        torch.testing.assert_close(topk_accuracy(z, t, ks=k), want)


def test_nan_logits_rank_first_as_in_torch_sort() -> None:
    z = torch.tensor([[0.5, math.nan, 2.0], [math.nan, 1.0, math.nan], [1.0, 2.0, 3.0]])
    t = torch.tensor([0, 2, 1])
    order = torch.sort(z, dim=-1, descending=True, stable=True).indices
    for k in (1, 2, 3):
        want = (order[:, :k] == t[:, None]).any(-1).float().mean()
        torch.testing.assert_close(topk_accuracy(z, t, ks=k), want)


def test_shapes_dtypes_and_unpacking() -> None:
    x, y = _data(12, 6, seed=3)
    top1, top5 = topk_accuracy(x, y)
    assert top1.shape == () and top1 <= top5
    lead = topk_accuracy(x.reshape(3, 4, 6), y.reshape(3, 4), ks=(1, 5))
    torch.testing.assert_close(lead, topk_accuracy(x, y))
    assert topk_accuracy(x.double(), y, ks=[2]).dtype == torch.float64
    assert topk_accuracy(x.half(), y, ks=2).dtype == torch.float32
    assert topk_accuracy(x, y, ks=6).item() == 1.0
    assert topk_accuracy(torch.zeros(0, 6), torch.zeros(0, dtype=torch.long), ks=(1, 5)).isnan().all()
    assert topk_accuracy(x[:1], y[:1], ks=1).item() in (0.0, 1.0)


def test_errors_name_the_argument() -> None:
    x, y = _data(4, 5, seed=0)
    with pytest.raises(ValueError, match=r"`ks` must hold values in \[1, 5\] \(the number of classes\), got \(1, 10\)"):
        topk_accuracy(x, y, ks=(1, 10))
    with pytest.raises(ValueError, match="`ks`"):
        topk_accuracy(x, y, ks=0)
    with pytest.raises(TypeError, match="`ks`"):
        topk_accuracy(x, y, ks=(1.0,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`ks`"):
        topk_accuracy(x, y, ks=())
    with pytest.raises(TypeError, match="`targets` must hold integer class indices"):
        topk_accuracy(x, y.float())
    with pytest.raises(ValueError, match="`targets` must have the shape"):
        topk_accuracy(x, y[:2])
    with pytest.raises(TypeError, match="`logits`"):
        topk_accuracy(y, y)
