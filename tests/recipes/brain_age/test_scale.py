"""The brain-age recipe's output scaling (``task.age_scale``) and the second stage's start at the stage-1 age."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")

from rankwise import discretize_age
from rankwise.models import sex_one_hot
from rankwise.recipes import load_config
from rankwise.recipes.brain_age.module import BrainAgeModule
from rankwise.recipes.brain_age.recipe import _second, resolve_age_scale

SMALL = "model.options={nb_filter: 4, nb_block: 2, use_sex: true}"


def _cfg(*sets: str):
    return load_config("brain_age_tsan_synthetic", [SMALL, *sets])


def test_age_scale_null_is_the_sd_of_the_training_ages() -> None:
    ages = np.array([20.0, 35.0, 50.0, 80.0])
    assert resolve_age_scale(_cfg(), ages) == pytest.approx(float(np.std(ages)))  # the synthetic preset: null
    assert resolve_age_scale(_cfg("task.age_scale=1.0"), ages) == 1.0  # the authors' raw ages
    assert resolve_age_scale(_cfg("task.age_scale=null"), np.full(3, 40.0)) == 1.0  # one age: no scaling
    sfcn = load_config("brain_age_sfcn_synthetic", ["task.age_scale=null"])
    assert resolve_age_scale(sfcn, ages) == 1.0  # SFCN classifies over bins


def test_stage_one_predicts_scale_times_the_network_output() -> None:
    torch.manual_seed(0)
    cfg = _cfg()
    module = BrainAgeModule(cfg, stage="first", age_scale=7.5).eval()
    x, sex = torch.randn(3, 1, 24, 24, 24), sex_one_hot(torch.tensor([0, 1, 1]))
    with torch.no_grad():
        raw = module.net(x, sex).reshape(-1)
        out = module.predict_age(x, sex)["age"]
    torch.testing.assert_close(out, 7.5 * raw)


def test_second_stage_starts_at_the_discretized_stage_one_age() -> None:
    torch.manual_seed(0)
    cfg = _cfg()
    first = BrainAgeModule(cfg, stage="first", age_scale=12.0)
    with torch.no_grad():
        first.net.end_fc_with_gender[1].bias.fill_(4.0)  # about 48 years once scaled
    run = SimpleNamespace(cfg=cfg)
    x, sex = torch.randn(3, 1, 24, 24, 24), sex_one_hot(torch.tensor([0, 1, 0]))
    second = _second(run, first, init=True).eval()  # type: ignore[arg-type]
    with torch.no_grad():
        stage1 = 12.0 * first.net.eval()(x, sex).reshape(-1)
        out = second.predict_age(x, sex)
    expect = discretize_age(stage1, 5.0)
    torch.testing.assert_close(out["discretized"], expect)  # the frozen stage 1 is scaled before rounding
    torch.testing.assert_close(out["age"], expect)  # residual 0 at the start
    fresh = _second(run, first).eval()  # type: ignore[arg-type]
    with torch.no_grad():
        assert float(fresh.predict_age(x, sex)["residual"].abs().max()) > 0  # without init: a random offset
