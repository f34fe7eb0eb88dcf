"""The operator and loss registries hold public, callable names only: every name ``list_ops()`` /
``list_losses()`` prints is a function that ``get_op`` / ``get_loss`` returns and that computes what the
name says; a configuration of an entry is the entry's name and options."""

from __future__ import annotations

import pytest
import torch

import rankwise
from rankwise.imbalanced import regression_loss
from rankwise.losses import get_loss_entry
from rankwise.ops import get_op_entry


def _listed() -> list[tuple[str, str]]:
    return [("op", n) for n in rankwise.list_ops()] + [("loss", n) for n in rankwise.list_losses()]


def test_no_listed_name_holds_a_dot() -> None:
    dotted = [f"{kind} {name}" for kind, name in _listed() if "." in name]
    assert not dotted, f"registry names that are no public function name: {dotted}"


@pytest.mark.parametrize(("kind", "name"), _listed(), ids=[f"{k}:{n}" for k, n in _listed()])
def test_every_listed_name_is_a_public_function_of_that_name(kind: str, name: str) -> None:
    fn = rankwise.get_op(name) if kind == "op" else rankwise.get_loss(name)
    entry = get_op_entry(name) if kind == "op" else get_loss_entry(name)
    assert callable(fn) and fn is entry.fn
    # the function the name calls: `soft_rank_isotonic`, `listnet` -> listnet_loss, `regression_mse` -> ..._mse_loss
    assert fn.__name__ == name or fn.__name__.startswith(f"{name}_"), (name, fn.__name__)


def test_a_name_gives_its_own_loss() -> None:
    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(8, generator=g), torch.randn(8, generator=g)
    for kind in ("l1", "mse", "huber", "focal_l1", "focal_mse"):
        want = regression_loss(pred, target, kind=kind)
        torch.testing.assert_close(rankwise.get_loss(f"regression_{kind}")(pred, target), want)
        torch.testing.assert_close(get_loss_entry(f"regression_{kind}").module()(pred, target), want)


def test_a_configuration_is_the_name_and_its_options() -> None:
    pred = torch.tensor([[0.5, 3.0, -1.0, 2.0, 0.1]])
    true = torch.tensor([[2.0, 0.0, 1.0, 0.0, 3.0]])
    lambda_loss = rankwise.get_loss("lambda_loss")
    scheme = lambda_loss(pred, true, weighing_scheme="ndcgLoss2_scheme")
    assert float(scheme) != pytest.approx(float(lambda_loss(pred, true)))
    torch.testing.assert_close(scheme, rankwise.losses.lambda_loss(pred, true, weighing_scheme="ndcgLoss2_scheme"))
    with pytest.raises(ValueError, match=r"unknown loss 'lambda_loss\.ndcgLoss2'"):
        rankwise.get_loss("lambda_loss.ndcgLoss2")
