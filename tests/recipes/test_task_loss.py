"""The task loss of the regression recipes: ``loss.kind`` is shorthand for ``loss.name: regression_<kind>``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("yaml")

from rankwise.imbalanced import regression_loss
from rankwise.recipes import load_config
from rankwise.recipes.config import ConfigError
from rankwise.recipes.loss_terms import LossTerm, build_task_loss, task_loss_name


def _batch():
    g = torch.Generator().manual_seed(3)
    pred, y = torch.randn(7, generator=g), torch.randn(7, generator=g)
    w = torch.rand(7, generator=g) + 0.5
    return {"features": None, "predictions": pred, "targets": y, "weights": w}


@pytest.mark.parametrize("kind", ["l1", "mse", "huber", "focal_l1", "focal_mse"])
def test_kind_is_shorthand_for_the_registered_regression_loss(kind):
    options = ["loss.options.beta=0.3"] if kind.startswith("focal") else []
    short = load_config("abalone_vanilla", [f"loss.kind={kind}", *options]).loss
    named = load_config("abalone_vanilla", [f"loss.name=regression_{kind}", *options]).loss
    assert task_loss_name(short) == task_loss_name(named) == f"regression_{kind}"
    t = _batch()
    a, b = build_task_loss(short), build_task_loss(named)
    assert isinstance(a, LossTerm) and a.name == f"regression_{kind}"
    kw = {"beta": 0.3} if kind.startswith("focal") else {}
    expected = regression_loss(t["predictions"], t["targets"], t["weights"], kind=kind, **kw)
    torch.testing.assert_close(a(t), expected)
    torch.testing.assert_close(b(t), expected)  # the name alone selects the kind


def test_kind_shorthand_keeps_its_checks():
    with pytest.raises(ConfigError, match=r"option `loss\.options\.kind` is supplied by the recipe"):
        load_config("abalone_vanilla", ["loss.options.kind=mse"])
    with pytest.raises(ConfigError, match=r"`loss\.lr` applies to a task loss from the registry"):
        load_config("abalone_vanilla", ["loss.lr=0.1"])


@pytest.mark.parametrize("preset", ["mnist5k_supcon", "mnist5k_simclr", "abalone_rnc"])
def test_contrastive_recipes_call_their_loss_through_a_loss_term(preset):
    """SupCon / SimCLR and RnC pretraining build their loss from the registry (a LossTerm, options from `task`)."""
    from rankwise.losses import rnc_loss, supcon_loss

    cfg = load_config(preset)
    g = torch.Generator().manual_seed(5)
    y = torch.randint(0, 3, (6,), generator=g)
    if preset == "abalone_rnc":
        from rankwise.recipes.regression.rnc import RnCPretrainer

        term = RnCPretrainer(cfg, input_dim=8).rnc
        f = torch.randn(6, 2, 4, generator=g)
        expected = rnc_loss(f, y.float(), temperature=cfg.task.temperature)
        got = term({"features": f, "targets": y.float()})
    else:
        from rankwise.recipes.supcon import ContrastivePretrainer

        term = ContrastivePretrainer(cfg, num_classes=10).contrastive
        f = torch.nn.functional.normalize(torch.randn(6, 2, 4, generator=g), dim=-1)
        labels = y if cfg.task.method == "supcon" else None
        t = cfg.task
        expected = supcon_loss(
            f, labels, temperature=t.temperature, base_temperature=t.base_temperature, variant=t.variant
        )
        got = term({"embeddings": f, "labels": labels})
    assert isinstance(term, LossTerm)
    torch.testing.assert_close(got, expected)
