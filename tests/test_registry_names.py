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


#: every registry of rankwise (module, attribute), and whether it holds functions (``register``) or records
#: (``add``: soft methods, relaxations, prediction readers, recipes)
_REGISTRIES = {
    ("rankwise.ops._registry", "OPS"): True,
    ("rankwise.losses._registry", "LOSSES"): True,
    ("rankwise.models._registry", "BACKBONES"): True,
    ("rankwise.data._spec", "DATASET_SPECS"): False,
    ("rankwise.data._spec", "DATASETS"): True,
    ("rankwise.recipes.predict_data", "CLASS_PREDICTION_READERS"): True,
    ("rankwise.ops.soft", "SOFT_METHODS"): False,
    ("rankwise.recipes.sorting", "RELAXATIONS"): False,
    ("rankwise.recipes.predict_data", "PREDICTION_READERS"): False,
    ("rankwise.recipes.registry", "RECIPES"): False,
}


def test_the_list_of_registries_is_complete() -> None:
    import re
    from pathlib import Path

    src = Path(rankwise.__file__).parent
    found = set()
    for path in src.rglob("*.py"):
        module = ".".join(path.relative_to(src.parent).with_suffix("").parts).removesuffix(".__init__")
        for m in re.finditer(r"^(\w+)\s*:\s*Registry\[.*?\]\s*=\s*(?:Registry|SpecView)\(", path.read_text(), re.M):
            found.add((module, m.group(1)))
    assert found == set(_REGISTRIES)


@pytest.mark.parametrize(("module", "attr"), sorted(_REGISTRIES), ids=[a for _, a in sorted(_REGISTRIES)])
def test_every_registry_holds_public_names_and_functions_where_it_registers_them(module: str, attr: str) -> None:
    import importlib

    from rankwise._registry import Registry

    registry = getattr(importlib.import_module(module), attr)
    assert isinstance(registry, Registry)
    names = registry.names(load=True)
    assert names
    assert all(n.isidentifier() and not n.startswith("_") for n in names), names
    if _REGISTRIES[(module, attr)]:
        assert all(callable(registry.get(n)) for n in names)


def test_a_dotted_name_is_refused_by_both_ways_in() -> None:
    from rankwise._registry import Registry

    reg: Registry[object] = Registry("thing")
    with pytest.raises(ValueError, match=r"without '\.'"):
        reg.register("a.b")
    with pytest.raises(ValueError, match=r"without '\.'"):
        reg.add("a.b", object())
