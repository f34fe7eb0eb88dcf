"""The ListNet / ListMLE kernels of rankwise._kernels.ltr against the losses' torch path: values and
gradients (padding anywhere, lists made only of padding, n = 1, ties, eps = 0 and large), half
inputs, non-contiguous inputs and leading dims, the row-parallel routes, the NaN policy, a second
backward and double backward."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import rankwise.losses.learning_to_rank as ltr_losses
from rankwise._kernels import _parallel
from rankwise._kernels import ltr as kltr
from rankwise._validation import finite_checked
from rankwise.losses import listmle_loss, listnet_loss, ranknet_loss

PAD = -1.0
LOSSES = [listnet_loss, listmle_loss]


@pytest.fixture(autouse=True)
def _kernels_loaded() -> None:
    if kltr.FAMILY.load() is None:
        pytest.skip("numba unavailable")


def _batch(
    seed: int, b: int, n: int, dtype: torch.dtype = torch.float32, ties: bool = False
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(b, n, generator=g, dtype=torch.float64)
    if ties:
        pred = (pred * 2).round() / 2
    true = torch.randint(0, 5, (b, n), generator=g).double()
    true[torch.rand(b, n, generator=g) < 0.3] = PAD  # padding anywhere
    true[0] = PAD  # a list made only of padding
    if n > 1:
        true[1, 0], true[1, 1:] = 3.0, PAD  # a list of one real item
    return pred.to(dtype), true.to(dtype)


def _run(
    loss: Any, pred: torch.Tensor, true: torch.Tensor, kernel: bool, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    if loss is listmle_loss:
        kw["generator"] = torch.Generator().manual_seed(7)
    x = pred.clone().requires_grad_()
    with pytest.MonkeyPatch.context() as mp:
        if not kernel:
            mp.setattr(ltr_losses.kernels, "ready", lambda: False)
        out = loss(x, true, **kw)
    out.backward()
    assert x.grad is not None
    return out.detach(), x.grad


def _close(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...], dtype: torch.dtype) -> None:
    rtol, atol = (1e-10, 1e-13) if dtype == torch.float64 else (2e-5, 1e-7)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 7, 60, 300])
@pytest.mark.parametrize("eps", [1e-10, 0.0, 0.5])
def test_kernel_equals_the_torch_path(loss: Any, dtype: torch.dtype, n: int, eps: float) -> None:
    pred, true = _batch(n, 9, n, dtype, ties=n == 60)
    if eps == 0.0 and loss is listnet_loss:
        pred = pred.clamp(-3, 3)  # (no probability underflows: log(0) would be -inf on both paths)
    got = _run(loss, pred, true, True, eps=eps)
    assert torch.isfinite(got[0]) and torch.isfinite(got[1]).all()
    _close(got, _run(loss, pred, true, False, eps=eps), dtype)
    assert float(got[1][0].abs().sum()) == 0.0  # the list made only of padding
    assert float(got[1][true == PAD].abs().sum()) == 0.0


@pytest.mark.parametrize("loss", LOSSES)
def test_kernel_ties_in_scores_and_labels(loss: Any) -> None:
    pred = torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.0, 2.0, -1.0, -1.0]])
    true = torch.tensor([[2.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, PAD]])
    _close(_run(loss, pred, true, True), _run(loss, pred, true, False), torch.float32)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_kernel_half_inputs_compute_in_float32(loss: Any, half: torch.dtype) -> None:
    pred, true = _batch(1, 6, 11)
    pred, true = pred.to(half), true.to(half)
    value, grad = _run(loss, pred, true, True)
    assert value.dtype == torch.float32 and grad.dtype == half
    ref_value, ref_grad = _run(loss, pred.float(), true.float(), True)
    torch.testing.assert_close(value, ref_value)
    torch.testing.assert_close(grad, ref_grad.to(half))


@pytest.mark.parametrize("loss", LOSSES)
def test_kernel_non_contiguous_inputs_and_leading_dims(loss: Any) -> None:
    pred, true = _batch(2, 12, 5)
    flat = _run(loss, pred, true, True)
    # (2, 6, n) leading dims, given as transposed (non-contiguous) views
    p3 = pred.reshape(2, 6, 5).transpose(-1, -2).contiguous().transpose(-1, -2)
    t3 = true.reshape(2, 6, 5).transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not p3.is_contiguous() and not t3.is_contiguous()
    value, grad = _run(loss, p3, t3, True)
    _close((value, grad.reshape(12, 5)), flat, torch.float32)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_row_parallel_routes_equal_the_serial_one(loss: Any, dtype: torch.dtype) -> None:
    # float32: torch's OpenMP team (when found); float64: Python threads
    pred, true = _batch(4, 40, _parallel.PARALLEL_MIN_NUMEL // 40 + 1, dtype)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = _run(loss, pred, true, True)
        torch.set_num_threads(2)
        parallel = _run(loss, pred, true, True)
    finally:
        torch.set_num_threads(before)
    _close(parallel, serial, dtype)
    _close(parallel, _run(loss, pred, true, False), dtype)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize(("where", "value"), [("pred_pad", float("nan")), ("true_real", float("inf"))])
def test_kernel_non_finite_inputs_give_nan(loss: Any, where: str, value: float) -> None:
    pred, true = _batch(3, 4, 6)
    if where == "pred_pad":  # a non-finite score in a padded slot still makes the loss NaN
        pred[true == PAD] = value
    else:
        true[2, 0] = value
    assert torch.isnan(_run(loss, pred, true, True)[0])


def test_finite_checked_flag_does_not_leak_to_the_next_loss() -> None:
    finite_checked()  # set outside any loss: the next batch loss still checks its inputs
    pred, true = torch.tensor([[float("nan"), 1.0]]), torch.tensor([[1.0, 0.0]])
    assert torch.isnan(ranknet_loss(pred, true))
    assert torch.isnan(listnet_loss(pred, true))


@pytest.mark.parametrize("loss", LOSSES)
def test_kernel_backward_twice_and_without_grad(loss: Any) -> None:
    pred, true = _batch(5, 5, 8, torch.float64)
    kw: dict[str, Any] = {"generator": torch.Generator().manual_seed(1)} if loss is listmle_loss else {}
    x = pred.clone().requires_grad_()
    out = loss(x, true, **kw)
    out.backward(retain_graph=True)
    assert x.grad is not None
    first = x.grad.clone()
    out.backward(torch.tensor(3.0, dtype=torch.float64))  # the gradient is recomputed and scaled
    torch.testing.assert_close(x.grad, 4 * first, rtol=1e-12, atol=0.0)
    with torch.no_grad():
        if kw:
            kw["generator"].manual_seed(1)
        assert float(loss(x, true, **kw)) == pytest.approx(float(out), rel=1e-12)


@pytest.mark.parametrize("loss", LOSSES)
def test_kernel_double_backward_is_exact(loss: Any) -> None:
    pred, true = _batch(6, 3, 5, torch.float64)

    def f(x: torch.Tensor) -> torch.Tensor:
        kw = {"generator": torch.Generator().manual_seed(2)} if loss is listmle_loss else {}
        return loss(x, true, **kw)

    assert torch.autograd.gradgradcheck(f, (pred.clone().requires_grad_(),))
