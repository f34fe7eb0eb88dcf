"""soft_sort / soft_rank entry point: torchsort-compatible default method and up-front validation of
method-specific keyword options (errors name the public function and every method's options)."""

from __future__ import annotations

import pytest
import torch

import rankwise
from rankwise import SoftRank, SoftSort, soft_rank, soft_rank_isotonic, soft_sort, soft_sort_isotonic


def test_default_method_is_isotonic() -> None:
    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(soft_rank(x), soft_rank_isotonic(x))
    torch.testing.assert_close(
        soft_sort(x, regularization_strength=0.3), soft_sort_isotonic(x, regularization_strength=0.3)
    )
    torch.testing.assert_close(
        soft_rank(x, regularization="kl", regularization_strength=0.5),
        soft_rank(x, method="isotonic", regularization="kl", regularization_strength=0.5),
    )
    torch.testing.assert_close(SoftRank()(x), soft_rank_isotonic(x))
    torch.testing.assert_close(
        SoftSort(regularization_strength=0.1)(x), soft_sort_isotonic(x, regularization_strength=0.1)
    )


def test_torchsort_call_works_by_changing_the_import() -> None:
    torchsort = pytest.importorskip("torchsort")
    x = torch.randn(4, 16, dtype=torch.float64)
    for mod in (torchsort, rankwise):
        # the same source line, only the module differs
        r = mod.soft_rank(x, regularization_strength=1.0)
        s = mod.soft_sort(x, regularization="kl", regularization_strength=0.5)
        if mod is torchsort:
            r_ts, s_ts = r, s
    torch.testing.assert_close(r, r_ts)
    torch.testing.assert_close(s, s_ts)


@pytest.mark.parametrize("kind", ["rank", "sort"])
def test_wrong_option_names_function_and_options(kind: str) -> None:
    fn = soft_rank if kind == "rank" else soft_sort
    x = torch.randn(2, 5)
    with pytest.raises(TypeError) as err:
        fn(x, tau=0.1)
    msg = str(err.value)
    assert msg.startswith(f"soft_{kind}(method='isotonic') got unexpected keyword argument 'tau'; ")
    assert "'isotonic' accepts regularization, regularization_strength" in msg
    assert "neuralsort: tau" in msg and "softsort: tau, power" in msg
    assert "diffsort: network, steepness, distribution, art_lambda" in msg
    assert "_soft_" not in msg  # no private names
    with pytest.raises(
        TypeError, match=r"soft_\w+\(method='neuralsort'\) got unexpected keyword arguments 'power', 'foo'"
    ):
        fn(x, method="neuralsort", tau=1.0, power=2.0, foo=1)
    with pytest.raises(TypeError, match=r"'diffsort' accepts network, steepness"):
        fn(x, method="diffsort", regularization_strength=1.0)


def test_modules_validate_options_at_construction() -> None:
    with pytest.raises(TypeError, match=r"soft_rank\(method='softsort'\) got unexpected keyword argument 'steepness'"):
        SoftRank(method="softsort", steepness=1.0)
    with pytest.raises(TypeError, match=r"soft_sort\(method='isotonic'\) got unexpected keyword argument 'tau'"):
        SoftSort(tau=1.0)
    with pytest.raises(ValueError, match=r"`method` must be one of .* for soft_rank; got 'nope'"):
        SoftRank(method="nope")


def test_valid_options_still_pass_through() -> None:
    x = torch.randn(2, 6, dtype=torch.float64)
    for method, kw in {
        "isotonic": {"regularization": "l2", "regularization_strength": 0.5},
        "neuralsort": {"tau": 0.5},
        "softsort": {"tau": 0.5, "power": 2.0},
        "diffsort": {"network": "bitonic", "steepness": 5.0, "distribution": "optimal", "art_lambda": 0.25},
    }.items():
        assert soft_rank(x, method=method, **kw).shape == x.shape
        assert soft_sort(x, method=method, descending=True, **kw).shape == x.shape


@pytest.mark.parametrize("handles", [False, True])
def test_nonfinite_pass_skipped_only_for_methods_handling_it(handles: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``register_soft_method(..., handles_nonfinite=True)``: the dispatcher trusts the method's own
    NaN/inf policy; otherwise it NaNs every slice holding a NaN or inf itself."""
    import math

    from rankwise.ops import soft

    monkeypatch.setattr(soft.SOFT_METHODS, "_entries", dict(soft.SOFT_METHODS._entries))

    def identity_rank(x: torch.Tensor, *, descending: bool) -> torch.Tensor:
        return torch.zeros_like(x)  # ignores NaN: only the dispatcher's pass can add it

    soft.register_soft_method("_test_zero", rank=identity_rank, handles_nonfinite=handles)
    x = torch.tensor([[1.0, math.nan, 0.0], [1.0, 2.0, 0.0]]).T  # dim=0 below: columns are the slices
    out = rankwise.soft_rank(x, method="_test_zero", dim=0)
    assert out.shape == x.shape
    assert bool(torch.isnan(out[:, 0]).all()) is (not handles)
    assert (out[:, 1] == 0).all()
