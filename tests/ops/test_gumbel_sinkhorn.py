"""gumbel_sinkhorn and matching: the authors' operator, a loop Sinkhorn, limits, sampling, brute-force assignment.

``data/gumbel_sinkhorn_reference.npz`` holds the authors' Sinkhorn operator (TensorFlow, github.com/
google/gumbel_sinkhorn), its vector-Jacobian products and their matching, from
``tools/gumbel_sinkhorn_reference.py``.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rankwise
from rankwise import GumbelSinkhorn, gumbel_sinkhorn, matching
from tests.conftest import gradcheck


def _x(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def loop_sinkhorn(x: list[list[float]], n_iters: int) -> list[list[float]]:
    """Rows then columns of exp(x), normalised in the linear domain with loops."""
    n = len(x)
    a = [[math.exp(v) for v in row] for row in x]
    for _ in range(n_iters):
        a = [[v / sum(row) for v in row] for row in a]
        col = [sum(a[i][j] for i in range(n)) for j in range(n)]
        a = [[a[i][j] / col[j] for j in range(n)] for i in range(n)]
    return a


def brute_force_matching(x: torch.Tensor) -> tuple[int, ...]:
    n = x.shape[-1]
    return max(itertools.permutations(range(n)), key=lambda p: sum(float(x[i, p[i]]) for i in range(n)))


@pytest.mark.parametrize("n_iters", [0, 1, 5, 20])
def test_deterministic_operator_equals_the_loop(n_iters: int) -> None:
    x = _x(3, 5, 5)
    out = gumbel_sinkhorn(x, temperature=0.7, noise_factor=0.0, n_iters=n_iters)
    assert out.shape == (1, 3, 5, 5)
    for b in range(3):
        expected = torch.tensor(loop_sinkhorn((x[b] / 0.7).tolist(), n_iters), dtype=torch.float64)
        torch.testing.assert_close(out[0, b], expected, rtol=1e-12, atol=1e-14)


def test_rows_and_columns_sum_to_one(dtype: torch.dtype) -> None:
    x = _x(4, 6, 6, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    p = gumbel_sinkhorn(x, temperature=1.0, n_iters=500, n_samples=3, generator=g)
    assert p.shape == (3, 4, 6, 6) and p.dtype == dtype
    assert (p >= 0).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(p.sum(-2), torch.ones(3, 4, 6, dtype=dtype), atol=tol, rtol=0)  # exact: last step
    torch.testing.assert_close(p.sum(-1), torch.ones(3, 4, 6, dtype=dtype), atol=tol, rtol=0)  # converged


def test_generator_reproducibility_and_samples_differ() -> None:
    x = _x(2, 4, 4)
    a = gumbel_sinkhorn(x, n_samples=5, generator=torch.Generator().manual_seed(3))
    b = gumbel_sinkhorn(x, n_samples=5, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.allclose(a[0], a[1])
    torch.manual_seed(0)
    c = gumbel_sinkhorn(x, n_samples=2)
    torch.manual_seed(0)
    torch.testing.assert_close(c, gumbel_sinkhorn(x, n_samples=2), rtol=0, atol=0)
    # noise_factor = 0: every sample is the deterministic operator
    d = gumbel_sinkhorn(x, n_samples=3, noise_factor=0.0)
    torch.testing.assert_close(d, d[:1].expand_as(d))


def test_noise_is_scaled_gumbel_noise_added_before_the_temperature() -> None:
    x = _x(3, 3)
    g = torch.Generator().manual_seed(5)
    p = gumbel_sinkhorn(x, temperature=0.3, noise_factor=0.5, n_samples=2, n_iters=7, generator=g)
    noise = rankwise.ops.permutation.gumbel_noise((2, 3, 3), x, torch.Generator().manual_seed(5))
    expected = gumbel_sinkhorn(x + 0.5 * noise, temperature=0.3, noise_factor=0.0, n_iters=7)[0]
    torch.testing.assert_close(p, expected)


def test_low_temperature_gives_the_matching() -> None:
    # a planted assignment that beats every other one by a margin (near-ties need n_iters -> infinity)
    perms = torch.stack([torch.randperm(5, generator=torch.Generator().manual_seed(b)) for b in range(6)])
    planted = torch.nn.functional.one_hot(perms, 5).double()
    x = 0.5 * _x(6, 5, 5, seed=2) + 3 * planted
    assert torch.equal(matching(x), perms)
    p = gumbel_sinkhorn(x, temperature=0.05, noise_factor=0.0, n_iters=200)[0]
    torch.testing.assert_close(p, planted, atol=1e-6, rtol=0)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_matching_equals_brute_force(n: int) -> None:
    x = _x(5, n, n, seed=n)
    perm = matching(x)
    assert perm.shape == (5, n) and perm.dtype == torch.int64
    for b in range(5):
        assert tuple(perm[b].tolist()) == brute_force_matching(x[b])


def test_matching_shapes_and_errors() -> None:
    assert matching(torch.zeros(3, 0, 0)).shape == (3, 0)
    assert matching(torch.zeros(0, 4, 4)).shape == (0, 4)
    assert matching(_x(2, 3, 4, 4)).shape == (2, 3, 4)
    x = _x(4, 4)
    x[1, 2] = math.nan
    with pytest.raises(ValueError, match="log_alpha"):
        matching(x)
    with pytest.raises(ValueError, match="square"):
        matching(torch.zeros(3, 4))


def test_gradcheck() -> None:
    x = _x(2, 4, 4)
    assert gradcheck(lambda t: gumbel_sinkhorn(t, temperature=0.8, noise_factor=0.0, n_iters=10), x)
    assert gradcheck(
        lambda t: gumbel_sinkhorn(t, temperature=0.5, n_samples=2, generator=torch.Generator().manual_seed(0)), x
    )


def test_edge_cases_and_policy() -> None:
    assert gumbel_sinkhorn(torch.zeros(2, 0, 0), n_samples=3).shape == (3, 2, 0, 0)
    one = gumbel_sinkhorn(torch.tensor([[0.3]]))
    torch.testing.assert_close(one, torch.ones(1, 1, 1))
    ties = gumbel_sinkhorn(torch.zeros(4, 4, dtype=torch.float64), noise_factor=0.0)
    torch.testing.assert_close(ties, torch.full((1, 4, 4), 0.25, dtype=torch.float64))
    x = _x(3, 3, 3)
    x[1, 0, 2] = math.inf
    out = gumbel_sinkhorn(x, noise_factor=0.0)
    assert torch.isnan(out[0, 1]).all() and torch.isfinite(out[0, [0, 2]]).all()
    h = gumbel_sinkhorn(_x(3, 3).half(), noise_factor=0.0)
    assert h.dtype == torch.float16
    torch.testing.assert_close(h.float(), gumbel_sinkhorn(_x(3, 3).half().float(), noise_factor=0.0), atol=1e-3, rtol=0)


def test_module_and_errors() -> None:
    x = _x(2, 3, 3)
    torch.testing.assert_close(
        GumbelSinkhorn(temperature=0.5, noise_factor=0.0)(x), gumbel_sinkhorn(x, temperature=0.5, noise_factor=0.0)
    )
    assert "temperature=0.5" in repr(GumbelSinkhorn(temperature=0.5))
    for kwargs, match in [
        ({"temperature": 0.0}, "temperature"),
        ({"n_iters": -1}, "n_iters"),
        ({"noise_factor": -1.0}, "noise_factor"),
        ({"n_samples": 0}, "n_samples"),
    ]:
        with pytest.raises(ValueError, match=match):
            gumbel_sinkhorn(x, **kwargs)
    with pytest.raises(ValueError, match="square"):
        gumbel_sinkhorn(torch.zeros(3, 4))
    with pytest.raises(TypeError, match="log_alpha"):
        gumbel_sinkhorn(torch.zeros(3, 3, dtype=torch.int64))


# ----------------------------------------------------------------------------------------------
# the authors' code (reference values from tools/gumbel_sinkhorn_reference.py)
# ----------------------------------------------------------------------------------------------
def _reference_cases() -> list[dict[str, Any]]:
    data = np.load(Path(__file__).parent / "data" / "gumbel_sinkhorn_reference.npz")
    keys = sorted({k.split("/")[0] for k in data.files})
    out = []
    for key in keys:
        temp, n_iters = (str(v) for v in data[f"{key}/meta"])
        fields = {f: data[f"{key}/{f}"] for f in ("x", "v", "out", "grad", "matching")}
        out.append({"temperature": float(temp), "n_iters": int(n_iters), **fields})
    return out


REFERENCE = _reference_cases()


@pytest.mark.parametrize(
    "case", REFERENCE, ids=lambda c: f"n{c['x'].shape[-1]}-{c['x'].dtype}-t{c['temperature']}-i{c['n_iters']}"
)
def test_equals_the_authors_sinkhorn_operator_and_matching(case: dict[str, Any]) -> None:
    x = torch.from_numpy(case["x"]).requires_grad_()
    out = gumbel_sinkhorn(x, temperature=case["temperature"], n_iters=case["n_iters"], noise_factor=0.0)[0]
    tol = {"rtol": 1e-10, "atol": 1e-12} if x.dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(out.detach(), torch.from_numpy(case["out"]), **tol)
    (grad,) = torch.autograd.grad(out, x, torch.from_numpy(case["v"]))
    scale = max(1.0, float(np.abs(case["grad"]).max()))
    torch.testing.assert_close(grad, torch.from_numpy(case["grad"]), rtol=tol["rtol"], atol=tol["atol"] * scale)
    assert torch.equal(matching(x), torch.from_numpy(case["matching"]))


def test_reference_covers_both_dtypes_and_n_one() -> None:
    assert {str(c["x"].dtype) for c in REFERENCE} == {"float32", "float64"}
    assert {c["x"].shape[-1] for c in REFERENCE} >= {1, 8}
