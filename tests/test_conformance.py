"""Generic conformance test run over every registered operator and loss.

For each registry entry: forward and backward give finite values, the module twin equals the
function, float64 gradcheck passes for exact gradients, half-precision inputs work, and the
entry's degenerate batches (n=1, empty, all ties, no positives, ...) give finite results with a
working backward (losses: a value that keeps the graph, never NaN).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import rankwise
from rankwise._registry import Example, RegistryEntry
from tests.conftest import DEVICES
from tests.registry_examples import factories, registry_cases
from tests.registry_helpers import tensors as _tensors

ENTRIES: list[tuple[str, RegistryEntry]] = registry_cases()  # every entry and every test variant
IDS = [f"{kind}:{e.name}" for kind, e in ENTRIES]


def _example(kind: str, entry: RegistryEntry, dtype: torch.dtype, device: torch.device) -> Example:
    return factories(kind, entry.name).example(dtype, device)


def _grad_inputs(ex: Example) -> list[torch.Tensor]:
    return [a for a in ex.args if isinstance(a, torch.Tensor) and a.requires_grad]


def _call(entry: RegistryEntry, ex: Example, *, module: bool = False) -> Any:
    if entry.stochastic:
        torch.manual_seed(1234)
    if module:
        assert entry.module is not None
        return entry.module(**ex.kwargs)(*ex.args)
    return entry.fn(*ex.args, **ex.kwargs)


def _scalarize(outs: list[torch.Tensor]) -> torch.Tensor:
    total = None
    for i, t in enumerate(outs):
        if not t.is_floating_point():
            continue
        w = torch.linspace(0.5, 1.5, t.numel(), dtype=t.dtype, device=t.device).reshape(t.shape) if t.numel() else t
        term = (t * w).sum() * (i + 1)
        total = term if total is None else total + term
    assert total is not None, "no floating output"
    return total


def test_registries_are_populated() -> None:
    assert {"rank", "blackbox_rank"} <= set(rankwise.list_ops())
    assert len(ENTRIES) >= 2


@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
def test_entry_metadata(kind: str, entry: RegistryEntry) -> None:
    f = factories(kind, entry.name)  # a LookupError naming the entry when tests/registry_examples.py lacks it
    assert f.degenerate is not None, f"{entry.name}: add degenerate examples to tests/registry_examples.py"
    assert entry.description, f"{entry.name}: needs a docstring"
    if kind == "loss":
        assert entry.module is not None, f"loss {entry.name}: needs an nn.Module twin"


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.type)
@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
def test_forward_backward_finite(kind: str, entry: RegistryEntry, device: torch.device) -> None:
    ex = _example(kind, entry, torch.float32, device)
    outs = _tensors(_call(entry, ex))
    assert outs, "no tensor output"
    for t in outs:
        assert t.device.type == device.type
        if t.is_floating_point():
            assert torch.isfinite(t).all(), f"{entry.name}: non-finite output"
    if entry.gradient == "none":
        return
    inputs = _grad_inputs(ex)
    assert inputs, f"{entry.name}: example has no input requiring grad"
    _scalarize(outs).backward()
    for x in inputs:
        assert x.grad is not None, f"{entry.name}: no gradient reached an input"
        assert torch.isfinite(x.grad).all(), f"{entry.name}: non-finite gradient"


@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
def test_module_equals_function(kind: str, entry: RegistryEntry) -> None:
    if entry.module is None:
        pytest.skip("no module twin")
    ex = _example(kind, entry, torch.float64, torch.device("cpu"))
    a = _tensors(_call(entry, ex))
    b = _tensors(_call(entry, ex, module=True))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize(
    ("kind", "entry"),
    [(k, e) for k, e in ENTRIES if e.gradient == "exact"],
    ids=[i for i, (_, e) in zip(IDS, ENTRIES) if e.gradient == "exact"],
)
def test_gradcheck_float64(kind: str, entry: RegistryEntry) -> None:
    ex = _example(kind, entry, torch.float64, torch.device("cpu"))
    inputs = _grad_inputs(ex)
    assert inputs, f"{entry.name}: example has no input requiring grad"
    positions = [i for i, a in enumerate(ex.args) if isinstance(a, torch.Tensor) and a.requires_grad]

    def f(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args = list(ex.args)
        for p, x in zip(positions, xs):
            args[p] = x
        return tuple(t for t in _tensors(_call(entry, Example(tuple(args), ex.kwargs))) if t.is_floating_point())

    xs = tuple(x.detach().clone().requires_grad_() for x in inputs)
    assert torch.autograd.gradcheck(f, xs, eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
def test_half_precision_inputs(kind: str, entry: RegistryEntry, half: torch.dtype) -> None:
    ex = _example(kind, entry, half, torch.device("cpu"))
    outs = _tensors(_call(entry, ex))
    ref = _tensors(_call(entry, _example(kind, entry, torch.float32, torch.device("cpu"))))
    for t, r in zip(outs, ref):
        if t.is_floating_point():
            assert torch.isfinite(t).all(), f"{entry.name}: non-finite output for {half}"
            assert t.shape == r.shape
    if entry.gradient != "none":
        _scalarize(outs).backward()
        for x in _grad_inputs(ex):
            assert x.grad is not None and torch.isfinite(x.grad.float()).all()


@pytest.mark.parametrize(("kind", "entry"), ENTRIES, ids=IDS)
def test_degenerate_batches(kind: str, entry: RegistryEntry) -> None:
    degenerate = factories(kind, entry.name).degenerate
    assert degenerate is not None
    for ex in degenerate(torch.float32, torch.device("cpu")):
        outs = _tensors(_call(entry, ex))
        for t in outs:
            if t.is_floating_point():
                assert torch.isfinite(t).all(), f"{entry.name}: non-finite output on a degenerate batch"
        if entry.gradient == "none":
            continue
        inputs = _grad_inputs(ex)
        if not inputs:
            continue
        if kind == "loss":
            assert outs[0].requires_grad, f"{entry.name}: degenerate loss must keep the graph"
        floating = [t for t in outs if t.is_floating_point() and t.requires_grad]
        if floating:
            sum(t.sum() for t in floating).backward()  # type: ignore[union-attr]
            for x in inputs:
                if x.grad is not None:
                    assert torch.isfinite(x.grad).all(), f"{entry.name}: non-finite gradient on a degenerate batch"
