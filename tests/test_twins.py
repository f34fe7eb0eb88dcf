"""The ``nn.Module`` twins built on :class:`rankwise._twin.FunctionModule`: the constructor keeps the
function's option names, ``forward`` equals the function, ``repr`` lists the options."""

from __future__ import annotations

import inspect

import pytest
import torch

import rankwise
from rankwise._registry import RegistryEntry
from rankwise._twin import FunctionModule
from rankwise.losses import LOSSES
from rankwise.ops import OPS
from tests.registry_examples import EXAMPLES, entry_factories


def _twin_entries() -> list[tuple[str, RegistryEntry]]:
    rankwise.list_ops()
    out: list[tuple[str, RegistryEntry]] = []
    for kind, reg in (("op", OPS), ("loss", LOSSES)):
        for e in reg.entries():
            if isinstance(e.module, type) and issubclass(e.module, FunctionModule) and (kind, e.name) in EXAMPLES:
                out.append((e.name, e))
    return out


def test_the_twins_use_the_base() -> None:
    names = {e.module.__name__ for _, e in _twin_entries() if e.module is not None}
    assert {"NeuralSort", "Rank", "DiffSort", "SoftTopK", "SoftRank", "SpearmanLoss", "RnCLoss", "FastAPLoss"} <= names


@pytest.mark.parametrize(("name", "entry"), _twin_entries(), ids=[n for n, _ in _twin_entries()])
def test_twin_options_are_the_function_options(name: str, entry) -> None:  # type: ignore[no-untyped-def]
    cls = entry.module
    fn_params = inspect.signature(cls._function).parameters
    init_params = inspect.signature(cls.__init__).parameters
    for option in (*cls._positional, *cls._options):
        assert option in fn_params, f"{name}: {option} is not an option of {cls._function.__name__}"
        assert option in init_params, f"{name}: {option} is not a constructor argument"
        if fn_params[option].default is not inspect.Parameter.empty:
            assert init_params[option].default == fn_params[option].default
    ex = entry_factories(entry).example(torch.float64, torch.device("cpu"))
    module = cls(**ex.kwargs)
    shown = cls._shown if cls._shown is not None else (*cls._positional, *cls._options)
    for option in (*cls._positional, *cls._options):
        if option in ex.kwargs and isinstance(ex.kwargs[option], (int, float, str, bool)) and option in shown:
            assert f"{option}=" in repr(module)
    if entry.stochastic:
        torch.manual_seed(0)
    got = module(*ex.args)
    if entry.stochastic:
        torch.manual_seed(0)
    want = entry.fn(*ex.args, **ex.kwargs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, equal_nan=True)
