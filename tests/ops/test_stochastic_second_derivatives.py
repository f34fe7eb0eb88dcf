"""Second derivatives of the stochastic operators with exact gradients, at fixed noise.

Their value is a Monte-Carlo estimate; at a fixed ``generator`` seed it is a deterministic function
of the input, and its double backward must match finite differences of its gradient. Drawn from the
global RNG, every call of ``gradgradcheck`` sees other noise, so finite differences are meaningless
there (the check fails by construction, not from a wrong derivative).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.registry_examples import factories, registry_cases

STOCHASTIC_EXACT = [e for _, e in registry_cases("op") if e.stochastic and e.gradient == "exact"]


def _fn(entry: Any, fixed: bool):  # type: ignore[no-untyped-def]
    ex = factories("op", entry.name).example(torch.float64, torch.device("cpu"))
    x = ex.args[0].detach().clone().requires_grad_()
    rest = [a.detach() if isinstance(a, torch.Tensor) else a for a in ex.args[1:]]

    def fn(v: torch.Tensor) -> torch.Tensor:
        kw = dict(ex.kwargs)
        if fixed:
            kw["generator"] = torch.Generator().manual_seed(11)
        out = entry.fn(v, *rest, **kw)
        return out[0] if isinstance(out, tuple) else out

    return fn, x


def test_there_are_stochastic_ops_with_exact_gradients() -> None:
    assert {e.name for e in STOCHASTIC_EXACT} >= {"stochastic_neural_sort", "perturbed_fy_loss", "dknn.stochastic"}


@pytest.mark.parametrize("entry", STOCHASTIC_EXACT, ids=lambda e: e.name)
def test_gradgradcheck_at_fixed_noise(entry: Any) -> None:
    fn, x = _fn(entry, fixed=True)
    assert torch.autograd.gradcheck(fn, (x,), atol=1e-5, rtol=1e-3)
    assert torch.autograd.gradgradcheck(fn, (x,), atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("entry", STOCHASTIC_EXACT, ids=lambda e: e.name)
def test_redrawn_noise_defeats_finite_differences(entry: Any) -> None:
    torch.manual_seed(0)
    fn, x = _fn(entry, fixed=False)
    assert not torch.autograd.gradcheck(fn, (x,), atol=1e-5, rtol=1e-3, raise_exception=False)
