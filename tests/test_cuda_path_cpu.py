"""The CUDA code paths of registry entries, checked on CPU (no GPU needed).

* host synchronization: each entry's example runs forward + backward on *fake* CUDA tensors
  (``torch._subclasses.FakeTensorMode``: shapes, dtypes and devices without data), so that every
  ``device.type == "cuda"`` branch is taken. An operation that reads device data on the host
  (``.item()``, ``bool(t)``, ``nonzero``, boolean-mask indexing) raises there, and a host-to-device
  copy (``torch.tensor(0.0, device=...)``: a blocking copy from pageable memory) is recorded; a
  ``non_blocking=True`` copy returns without waiting for the device and is not.
  These are the synchronizations that ``torch.cuda.set_sync_debug_mode("error")`` reports on a
  device (tests/test_cuda.py runs that check on a GPU).
* autocast: under CPU autocast (fp16/bf16 matmuls) the outputs keep their float32 dtype and the
  backward runs (tests/test_cuda.py checks CUDA autocast on a GPU).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from rankwise._registry import RegistryEntry
from tests.registry_examples import entry_factories, registry_cases

#: entries whose CUDA path is checked here (those that run without data-dependent Python control
#: flow outside the registry's example, numba or Triton, which fake tensors cannot execute)
SYNC_FREE = [
    "loss:conr",
    "loss:triplet",
    "loss:ranksim",
    "loss:supcon",
    "loss:recall_at_k",
    "loss:balanced_mse",
    "loss:balanced_mse.bmc",
    "loss:balanced_mse.bni",
    "loss:balanced_mse.gai",
    "loss:balanced_mse.gai_2d",
    "loss:listmle",
    "loss:coral",
    "loss:corn",
    "loss:condor",
    "op:sinkhorn_transport",
    "op:soft_rank_sinkhorn",
    "op:soft_sort_sinkhorn",
    "op:soft_sort_sinkhorn.quantized",
]

_DATA_DEPENDENT = ("DataDependentOutput", "DynamicOutputShape")


def _entry(key: str) -> RegistryEntry:
    kind, name = key.split(":")
    return next(e for k, e in registry_cases(kind) if e.name == name)


class _HostCopies(TorchDispatchMode):
    """Records copies from host memory to a non-CPU device (and scalar reads of device data)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default:
            src, dst = args[0].device, kwargs.get("device")
            # a non-blocking copy from host memory returns without waiting for the device
            blocking = not kwargs.get("non_blocking", False)
            if blocking and src.type == "cpu" and dst is not None and torch.device(dst).type != "cpu":
                self.seen.append(f"host-to-device copy of a {tuple(args[0].shape)} tensor")
        elif func is torch.ops.aten.copy_.default and args[1].device.type == "cpu" and args[0].device.type != "cpu":
            self.seen.append(f"host-to-device copy_ of a {tuple(args[1].shape)} tensor")
        elif func is torch.ops.aten._local_scalar_dense.default:
            self.seen.append("scalar read (.item() / bool / float of a device tensor)")
        return func(*args, **kwargs)


def _fake_cuda(obj: Any, mode: FakeTensorMode) -> Any:
    if isinstance(obj, torch.Tensor):
        fake = mode.from_tensor(obj.detach(), static_shapes=True)
        with mode:
            out = fake.to("cuda")
        return out.requires_grad_(obj.requires_grad)
    if isinstance(obj, tuple):
        return tuple(_fake_cuda(o, mode) for o in obj)
    if isinstance(obj, list):
        return [_fake_cuda(o, mode) for o in obj]
    if isinstance(obj, dict):
        return {k: _fake_cuda(v, mode) for k, v in obj.items()}
    return obj


def _outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _outputs(o)]
    return []


def _meta(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("meta").requires_grad_(obj.requires_grad)
    if isinstance(obj, tuple):
        return tuple(_meta(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _meta(v) for k, v in obj.items()}
    return obj


@pytest.mark.parametrize("key", SYNC_FREE)
def test_cuda_path_has_no_host_sync(key: str) -> None:
    entry = _entry(key)
    ex = entry_factories(entry).example(torch.float32, torch.device("cpu"))
    # forward on fake CUDA tensors: exactly the branches a CUDA tensor takes
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    args, kwargs = _fake_cuda(ex.args, mode), _fake_cuda(ex.kwargs, mode)
    spy = _HostCopies()
    try:
        with mode, spy:
            outs = _outputs(entry.fn(*args, **kwargs))
    except Exception as exc:  # a data-dependent operation: its result needs the device data on the host
        if any(s in type(exc).__name__ for s in _DATA_DEPENDENT):
            pytest.fail(f"{key}: host synchronization ({type(exc).__name__}: {exc})")
        raise
    assert outs and all(t.device.type == "cuda" for t in outs)
    assert spy.seen == [], f"{key} forward: {spy.seen}"
    # forward + backward on the data-less "meta" device (the autograd engine does not run fake CUDA
    # tensors without a GPU); non-CPU branches as on CUDA; .item() / nonzero raise there
    margs, mkwargs = _meta(ex.args), _meta(ex.kwargs)
    with _HostCopies() as spy:
        outs = _outputs(entry.fn(*margs, **mkwargs))
        total = sum(t.float().sum() * (i + 1) for i, t in enumerate(outs))
        assert isinstance(total, torch.Tensor) and total.requires_grad
        total.backward()
    assert spy.seen == [], f"{key} forward + backward: {spy.seen}"


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("key", ["loss:ranksim", "op:dknn_class_scores"])
def test_cpu_autocast_keeps_float32(key: str, half: torch.dtype) -> None:
    entry = _entry(key)
    example = entry_factories(entry).example

    def run(autocast: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        ex = example(torch.float32, torch.device("cpu"))
        args = [a.detach().clone().requires_grad_(a.requires_grad) if torch.is_tensor(a) else a for a in ex.args]
        with torch.autocast("cpu", dtype=half, enabled=autocast):
            outs = _outputs(entry.fn(*args, **ex.kwargs))
        torch.stack([t.sum() for t in outs]).sum().backward()  # outside autocast, as a training step does
        return outs, [a.grad for a in args if isinstance(a, torch.Tensor) and a.grad is not None]

    torch.manual_seed(0)
    ref, ref_grads = run(False)
    torch.manual_seed(0)
    outs, grads = run(True)
    for t, r in zip(outs, ref, strict=True):
        assert t.dtype == r.dtype == torch.float32
        # computed in float32 with autocast off inside: the same values
        torch.testing.assert_close(t, r, rtol=1e-6, atol=1e-6)
    assert grads
    for g, rg in zip(grads, ref_grads, strict=True):
        assert g.dtype == rg.dtype
        torch.testing.assert_close(g, rg, rtol=1e-5, atol=1e-6)


def test_fake_cuda_sync_check_can_fail() -> None:
    """The check above detects a scalar tensor built from a Python number on the device."""
    mode = FakeTensorMode()
    x = _fake_cuda(torch.randn(3), mode)
    spy = _HostCopies()
    with mode, spy:
        torch.where(x > 0, x, torch.tensor(float("-inf"), device=x.device))
    assert spy.seen and "host-to-device" in spy.seen[0]
    with mode, spy, pytest.raises(Exception, match=""):
        x[x > 0]


def test_supcon_cuda_one_pass_threshold_and_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA, SupCon ("out") takes the one-pass path up to the dense limit (B = 1024 and 4096 with
    two views included); its torch branch (the one CUDA runs) equals the general blockwise path."""
    import rankwise.losses._supcon as sc

    assert 4096 * 2 * 4096 * 2 <= sc._SMALL_MAX_ELEMENTS_CUDA
    assert 1024 * 2 * 1024 * 2 > sc._SMALL_MAX_ELEMENTS  # CPU: unchanged threshold
    calls: list[int] = []
    real = sc._SupConOutSmall.apply

    def counted(*a: Any) -> Any:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(sc._SupConOutSmall, "apply", counted)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(300, 2, 16, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 7, (300,), generator=gen)

    def value_and_grad() -> tuple[torch.Tensor, torch.Tensor]:
        xr = x.clone().requires_grad_()
        out = sc.supcon_loss(xr, y, temperature=0.2)
        out.backward()
        assert xr.grad is not None
        return out.detach(), xr.grad

    monkeypatch.setattr(sc, "_NUMBA_MAX_N", 0)  # the torch branch, as on CUDA
    monkeypatch.setattr(sc, "_SMALL_MAX_ELEMENTS", 1 << 30)
    one_pass = value_and_grad()
    assert calls == [1]
    monkeypatch.setattr(sc, "_SMALL_MAX_ELEMENTS", 0)
    general = value_and_grad()
    assert calls == [1]
    torch.testing.assert_close(one_pass[0], general[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(one_pass[1], general[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("numba", [True, False], ids=["numba", "torch"])
def test_supcon_one_pass_under_autocast(half: torch.dtype, numba: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-pass SupCon path (CUDA takes it up to B = 4096) computes in float32 under autocast."""
    import rankwise.losses._supcon as sc

    if not numba:
        monkeypatch.setattr(sc, "_NUMBA_MAX_N", 0)  # the torch branch, as on CUDA
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 2, 16, generator=gen)
    y = torch.randint(0, 5, (64,), generator=gen)

    def run(autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
        xr = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=half, enabled=autocast):
            out = sc.supcon_loss(xr, y, temperature=0.2)
        out.backward()
        assert xr.grad is not None
        return out.detach(), xr.grad

    ref, got = run(False), run(True)
    assert got[0].dtype == torch.float32
    torch.testing.assert_close(got[0], ref[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-7)
