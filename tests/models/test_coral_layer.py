"""CoralLayer (rankwise.models.ordinal) against coral-pytorch 1.4.0's CoralLayer: the same parameters (names,
shapes, bias pre-initialisation), the same initialisation under a seed, the same forward with copied
weights (float32 and float64), and a short CORAL fit through it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rankwise.losses import coral_loss, coral_predict, levels_from_labels
from rankwise.models import CoralLayer

KS = [2, 3, 5, 10]


def _ref() -> Any:
    pytest.importorskip("coral_pytorch")
    from coral_pytorch.layers import CoralLayer as RefCoralLayer

    return RefCoralLayer


@pytest.mark.parametrize("preinit_bias", [True, False])
@pytest.mark.parametrize("k", KS)
def test_parameters_and_initialisation_equal_the_reference(k: int, preinit_bias: bool) -> None:
    ref_cls = _ref()
    torch.manual_seed(k)
    ref = ref_cls(7, k, preinit_bias=preinit_bias)
    torch.manual_seed(k)
    ours = CoralLayer(7, k, preinit_bias=preinit_bias)
    ours_params = {n: p.shape for n, p in ours.named_parameters()}
    assert ours_params == {n: p.shape for n, p in ref.named_parameters()}
    assert ours_params == {"coral_weights.weight": (1, 7), "coral_bias": (k - 1,)}
    assert ours.coral_weights.bias is None
    assert torch.equal(ours.coral_bias, ref.coral_bias)  # [(K-1)/(K-1), ..., 1/(K-1)] or zeros
    assert torch.equal(ours.coral_weights.weight, ref.coral_weights.weight)  # the same draws under one seed
    if preinit_bias:
        want = torch.tensor([(k - 1 - j) / (k - 1) for j in range(k - 1)])
        torch.testing.assert_close(ours.coral_bias.detach(), want, rtol=0, atol=0)
    else:
        assert (ours.coral_bias == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("k", KS)
def test_forward_equals_the_reference_with_copied_weights(k: int, dtype: torch.dtype) -> None:
    ref = _ref()(6, k).to(dtype)
    ours = CoralLayer(6, k).to(dtype)
    g = torch.Generator().manual_seed(k)
    with torch.no_grad():
        ref.coral_weights.weight.copy_(torch.randn(1, 6, generator=g, dtype=dtype))
        ref.coral_bias.copy_(torch.randn(k - 1, generator=g, dtype=dtype))
    ours.load_state_dict(ref.state_dict())  # the same names: a reference checkpoint loads as it is
    for b in (1, 4, 33):
        x = torch.randn(b, 6, generator=g, dtype=dtype)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), ref(xb)
        assert ya.shape == (b, k - 1) and ya.dtype == dtype
        torch.testing.assert_close(ya, yb, rtol=0, atol=0)
        w = torch.randn(b, k - 1, generator=g, dtype=dtype)
        (ya * w).sum().backward()
        (yb * w).sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad)
        torch.testing.assert_close(ours.coral_bias.grad, ref.coral_bias.grad)
        torch.testing.assert_close(ours.coral_weights.weight.grad, ref.coral_weights.weight.grad)
        ours.zero_grad()
        ref.zero_grad()
    # and a rankwise state dict loads into the reference
    ref2 = _ref()(6, k).to(dtype)
    ref2.load_state_dict(ours.state_dict())
    x = torch.randn(3, 6, generator=g, dtype=dtype)
    torch.testing.assert_close(ref2(x), ours(x))


def test_shapes_and_rank_consistency() -> None:
    layer = CoralLayer(5, 6)
    assert layer(torch.randn(2, 3, 5)).shape == (2, 3, 5)  # (*, d) -> (*, K-1)
    assert layer(torch.randn(0, 5)).shape == (0, 5)
    # logits differ only by the biases: ordered biases give ordered probabilities for every input
    z = layer(torch.randn(50, 5))
    assert (z[:, :-1] >= z[:, 1:]).all()
    assert repr(layer) == (
        "CoralLayer(\n  in_features=5, num_classes=6, preinit_bias=True\n"
        "  (coral_weights): Linear(in_features=5, out_features=1, bias=False)\n)"
    )


def test_default_dtype() -> None:
    prev = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        layer = CoralLayer(3, 4)
        assert layer.coral_bias.dtype == layer.coral_weights.weight.dtype == torch.float64
    finally:
        torch.set_default_dtype(prev)


def test_errors() -> None:
    with pytest.raises(ValueError, match=r"`num_classes` must be >= 2"):
        CoralLayer(3, 1)
    with pytest.raises(ValueError, match=r"`num_classes` must be a positive int"):
        CoralLayer(3, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`in_features` must be a positive int"):
        CoralLayer(0, 4)
    with pytest.raises(TypeError, match=r"`preinit_bias` must be a bool"):
        CoralLayer(3, 4, preinit_bias="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        CoralLayer(3, 4, True)  # type: ignore[misc]  # preinit_bias is keyword-only
    layer = CoralLayer(3, 4)
    with pytest.raises(ValueError, match=r"`x` must have shape \(\*, in_features\) = \(\*, 3\), got \(2, 4\)"):
        layer(torch.randn(2, 4))
    with pytest.raises(TypeError, match=r"`x` must be a torch.Tensor"):
        layer([[1.0, 2.0, 3.0]])  # type: ignore[arg-type]


def test_coral_fit_through_the_layer() -> None:
    """CORAL on a noiseless 1-d ordinal problem (class = number of cut points below x): a few hundred
    Adam steps recover the classes, with rank-consistent predictions."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(256, 1, generator=g) * 5
    y = x[:, 0].floor().long().clamp(max=4)
    levels = levels_from_labels(y, 5)
    torch.manual_seed(0)
    head = CoralLayer(1, 5)
    opt = torch.optim.Adam(head.parameters(), lr=0.1)
    first = None
    for _ in range(300):
        opt.zero_grad()
        loss = coral_loss(head(x), levels)
        first = loss.item() if first is None else first
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first
    pred = coral_predict(head(x))
    assert (pred == y).float().mean() > 0.9
    assert (head.coral_bias[:-1] > head.coral_bias[1:]).all()  # the biases stay ordered
