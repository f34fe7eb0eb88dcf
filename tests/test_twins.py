"""The ``nn.Module`` twins built on :class:`rankwise._twin.FunctionModule`: the constructor keeps the
function's option names, ``forward`` equals the function, ``repr`` lists the options."""

from __future__ import annotations

import inspect

import pytest
import torch

from rankwise._registry import RegistryEntry
from rankwise._twin import FunctionModule
from tests.registry_examples import EXAMPLES, entry_factories, registry_cases


def _twin_entries() -> list[tuple[str, RegistryEntry]]:
    out: list[tuple[str, RegistryEntry]] = []
    for kind, e in registry_cases():
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


def test_pair_loss_twins_keep_their_surface() -> None:
    """``TripletLoss`` / ``NPairsLoss`` on the base: the same constructor, ``repr`` and (empty) state, and
    ``forward`` passes ``labels`` and ``mask`` on to the function."""
    from rankwise.losses import NPairsLoss, TripletLoss, npairs_loss, triplet_loss

    assert repr(TripletLoss(margin=0.3, mining="hard")) == (
        "TripletLoss(margin=0.3, distance='squared', mining='hard', normalize=True, reduction='mean')"
    )
    assert repr(NPairsLoss(temperature=2.0)) == "NPairsLoss(temperature=2.0, normalize=False, reduction='mean')"
    assert list(TripletLoss().state_dict()) == [] and list(NPairsLoss().state_dict()) == []
    assert list(inspect.signature(TripletLoss).parameters) == [
        "margin",
        "distance",
        "mining",
        "normalize",
        "reduction",
        "distributed",
    ]
    assert list(inspect.signature(NPairsLoss).parameters) == ["temperature", "normalize", "reduction", "distributed"]
    g = torch.Generator().manual_seed(0)
    x, labels = torch.randn(6, 4, generator=g), torch.tensor([0, 1, 0, 1, 2, 2])
    mask = labels[:, None] == labels[None, :]
    mask[0, 2] = mask[2, 0] = False  # a mask that differs from the labels' one
    torch.testing.assert_close(
        TripletLoss(margin=0.5, mining="hard")(x, mask=mask), triplet_loss(x, mask=mask, margin=0.5, mining="hard")
    )
    torch.testing.assert_close(TripletLoss(margin=0.5)(x, labels), triplet_loss(x, labels, margin=0.5))
    assert not torch.allclose(TripletLoss(margin=0.5)(x, mask=mask), TripletLoss(margin=0.5)(x, labels))
    pairs = torch.randn(3, 2, 4, generator=g)
    torch.testing.assert_close(NPairsLoss(temperature=2.0)(pairs), npairs_loss(pairs, temperature=2.0))


def test_supcon_and_regression_twins_keep_their_surface() -> None:
    """``SupConLoss`` / ``RegressionLoss`` on the base: the same ``repr``, (empty) state and constructor;
    ``mask`` and ``weights`` reach the function."""
    from rankwise.imbalanced import RegressionLoss, regression_loss
    from rankwise.losses import SupConLoss, supcon_loss

    assert repr(SupConLoss(temperature=0.5, chunk_size=3, variant="in")) == (
        "SupConLoss(temperature=0.5, base_temperature=None, contrast_mode='all', variant='in', normalize=True, "
        "chunk_size=3)"
    )
    assert repr(RegressionLoss(kind="huber", huber_beta=0.7)) == (
        "RegressionLoss(kind='huber', beta=0.2, gamma=1.0, activate='sigmoid', huber_beta=0.7, reduction='mean')"
    )
    assert list(SupConLoss().state_dict()) == [] and list(RegressionLoss().state_dict()) == []
    assert list(inspect.signature(RegressionLoss).parameters) == [
        "kind",
        "beta",
        "gamma",
        "activate",
        "huber_beta",
        "reduction",
    ]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2, 4, generator=g)
    mask = torch.eye(5, dtype=torch.bool)
    mask[0, 1] = mask[1, 0] = True
    torch.testing.assert_close(SupConLoss(temperature=0.5)(x, mask=mask), supcon_loss(x, mask=mask, temperature=0.5))
    p, t, w = torch.randn(6, generator=g), torch.randn(6, generator=g), torch.rand(6, generator=g) + 0.1
    torch.testing.assert_close(RegressionLoss(kind="mse")(p, t, w), regression_loss(p, t, w, kind="mse"))
    torch.testing.assert_close(
        RegressionLoss(kind="mse")(pred=p, target=t, weights=w), regression_loss(p, t, w, kind="mse")
    )
    assert not torch.allclose(RegressionLoss(kind="mse")(p, t, w), RegressionLoss(kind="mse")(p, t))


def test_isotonic_twins_keep_their_surface() -> None:
    from rankwise.ops import IsotonicSoftSort, soft_sort_isotonic

    m = IsotonicSoftSort(regularization="kl", regularization_strength=0.3, descending=True, dim=0)
    assert repr(m) == "IsotonicSoftSort(regularization='kl', regularization_strength=0.3, descending=True, dim=0)"
    assert list(m.state_dict()) == []
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    want = soft_sort_isotonic(x, regularization="kl", regularization_strength=0.3, descending=True, dim=0)
    torch.testing.assert_close(m(x), want)
    assert not torch.allclose(m(x), soft_sort_isotonic(x, regularization="kl", regularization_strength=0.3, dim=0))


def test_learning_to_rank_and_sinkhorn_twins_keep_their_surface() -> None:
    """The learning-to-rank twins and the Sinkhorn twins on the base: the same ``repr`` (options shown with
    ``repr`` for the former), no state, and ``forward`` passes every option, the ``**`` ones of PiRank too."""
    from rankwise.losses import LambdaLoss, PiRankNDCGLoss, lambda_loss, pirank_ndcg_loss
    from rankwise.ops import SinkhornSoftRank, soft_rank_sinkhorn

    assert repr(LambdaLoss(k=3, weighing_scheme="ndcgLoss2_scheme")) == (
        "LambdaLoss(eps=1e-10, padded_value_indicator=-1, weighing_scheme='ndcgLoss2_scheme', k=3, sigma=1.0, "
        "mu=10.0, reduction='sum', reduction_log='binary')"
    )
    assert repr(PiRankNDCGLoss(tau=0.5)) == (
        "PiRankNDCGLoss(method='neuralsort', k=None, powered_relevancies=True, padded_value_indicator=-1, tau=0.5)"
    )
    assert repr(SinkhornSoftRank(epsilon=0.1, num_targets=2)) == (
        "SinkhornSoftRank(epsilon=0.1, p=2.0, num_targets=2, descending=False, tol=None, max_iter=50, dim=-1)"
    )
    assert list(PiRankNDCGLoss().state_dict()) == [] and list(SinkhornSoftRank().state_dict()) == []
    assert list(inspect.signature(PiRankNDCGLoss).parameters) == [
        "method",
        "k",
        "powered_relevancies",
        "padded_value_indicator",
        "method_options",
    ]
    g = torch.Generator().manual_seed(0)
    y_pred, y_true = torch.randn(3, 6, generator=g), torch.randint(0, 4, (3, 6), generator=g).float()
    want = pirank_ndcg_loss(y_pred, y_true, k=3, tau=0.2)
    torch.testing.assert_close(PiRankNDCGLoss(k=3, tau=0.2)(y_pred, y_true), want)
    assert not torch.allclose(PiRankNDCGLoss(k=3)(y_pred, y_true), want)  # tau reaches the function
    torch.testing.assert_close(
        LambdaLoss(k=2, sigma=2.0)(y_pred=y_pred, y_true=y_true), lambda_loss(y_pred, y_true, k=2, sigma=2.0)
    )
    x = torch.randn(4, 5, generator=g)
    m = SinkhornSoftRank(epsilon=0.3, descending=True, dim=0)
    torch.testing.assert_close(m(x), soft_rank_sinkhorn(x, epsilon=0.3, descending=True, dim=0))
