"""The DIR recipes' loss mechanisms in the brain-age recipe's one ScaleDense stage, on a tiny synthetic cohort.

``task.lds`` weights (the DIR table and lookup), registry task losses on the ages (Balanced MSE with its
noise in its own parameter group, Dist Loss), feature regularizers (RankSim, Ordinal Entropy) on
ScaleDense's penultimate features, the shot-group MAE and QWK of the evaluation, and the configs that
do not fit a stage, refused with one error line.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("nibabel")
pytest.importorskip("nilearn")
pytest.importorskip("torchio")

from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.data.synthetic_mri import make_brain_age_synthetic
from rankwise.recipes import load_config
from rankwise.recipes.brain_age.module import BrainAgeModule
from rankwise.recipes.regression.net import lds_weight_table

TINY = [
    "data.batch_size=4",
    "trainer.max_epochs=1",
    "trainer.num_threads=1",
    "task.montage=0",
    "report.plots=false",
    "model.options={nb_filter: 4, nb_block: 2, use_sex: true}",
    "data.options.shape=null",
]
AGES = np.linspace(20.0, 90.0, 12)


def _invoke(*args: str, code: int = 0) -> str:
    res = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert res.exit_code == code, res.output
    return res.output


def _sets(*sets: str) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_brain_age_synthetic(tmp_path_factory.mktemp("dir_cohort") / "cohort", n=16, spacing=8.0)


def _train(cohort: Path, root: Path, preset: str, *sets: str) -> tuple[Path, str]:
    run = root / "run"
    data = [f"data.options.csv={cohort}", f"data.options.cache_dir={root / 'cache'}"]
    out = _invoke("train", preset, "--out", str(run), "--no-progress", *_sets(*data, *TINY, *sets))
    return run, out


def _module(preset: str, *sets: str) -> BrainAgeModule:
    cfg = load_config(preset, [*TINY, *sets])
    return BrainAgeModule(cfg, stage="first", train_labels=AGES, bin_width=1.0)


def _batch(n: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    vol = torch.randn(n, 1, 18, 18, 18, generator=g)
    sex = torch.nn.functional.one_hot(torch.arange(n) % 2, 2).float()
    return vol, sex, torch.tensor([20.0, 44.0, 61.5, 90.0])[:n]


def _log(run: Path, key: str) -> list[float]:
    rows = list(csv.DictReader(open(run / "logs" / "metrics.csv")))
    return [float(r[key]) for r in rows if r.get(key)]


def test_lds_weights_are_the_dir_table_and_weight_the_l1_loss() -> None:
    m = _module("brain_age_lds_synthetic")
    bins, table = lds_weight_table(AGES, 1.0, reweight="sqrt_inv", lds=True, kernel="gaussian", ks=5, sigma=2.0)
    assert m.lds_bins.tolist() == bins.tolist()
    np.testing.assert_allclose(m.lds_table.numpy(), table, rtol=1e-6)
    vol, sex, y = _batch()
    out = m.predict_age(vol, sex)
    tensors = m.loss_tensors(out, y)
    w = tensors["weights"]
    lookup = dict(zip(bins.tolist(), table.tolist()))
    expected = torch.tensor([lookup.get(int(np.floor(float(a))), 1.0) for a in y])
    torch.testing.assert_close(w, expected.float())
    loss = m.objective(tensors).parts[m.objective.task.name]
    torch.testing.assert_close(loss, (w * (out["age"] - y).abs()).mean(), rtol=1e-5, atol=1e-5)  # mean(w * l)


def test_lds_run_trains_and_evaluates_from_its_checkpoint(cohort: Path, tmp_path: Path) -> None:
    run, _ = _train(cohort, tmp_path, "brain_age_lds_synthetic")
    state = torch.load(run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert state["lds_table"].numel() == state["lds_bins"].numel() > 0
    test = json.loads((run / "metrics.json").read_text())["test"]
    for key in ("mae", "mae_many", "mae_medium", "mae_few", "qwk", "exact_acc"):
        assert key in test
    assert test["n_many"] + test["n_medium"] + test["n_few"] == test["n"]
    _invoke("evaluate", str(run))
    assert json.loads((run / "metrics.json").read_text())["test"]["mae"] == pytest.approx(test["mae"], abs=1e-6)


def test_balanced_mse_noise_trains_in_its_own_parameter_group(cohort: Path, tmp_path: Path) -> None:
    m = _module("brain_age_balanced_mse_synthetic")
    groups = m.param_groups()
    assert len(groups) == 2 and groups[1]["lr"] == 0.01
    assert m.task_loss is not None
    (name,) = [n for n, _ in m.task_loss.named_parameters()]  # the noise scale
    assert groups[1]["params"][0] is m.task_loss.get_parameter(name)
    start = float(m.task_loss.get_parameter(name).detach())
    run, _ = _train(cohort, tmp_path, "brain_age_balanced_mse_synthetic")
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert float(state[f"task_loss.{name}"]) != pytest.approx(start, abs=1e-7)  # it trained
    assert np.isfinite(json.loads((run / "metrics.json").read_text())["test"]["mae"])


def test_dist_loss_gets_the_training_ages(cohort: Path, tmp_path: Path) -> None:
    m = _module("brain_age_dist_loss_synthetic")
    vol, sex, y = _batch()
    out = m.predict_age(vol, sex)
    loss = m.objective(m.loss_tensors(out, y)).parts["dist_loss"]
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert m.net.pre[0].weight.grad is not None  # type: ignore[index]
    run, _ = _train(cohort, tmp_path, "brain_age_dist_loss_synthetic")
    assert json.loads((run / "metrics.json").read_text())["method"] == "scale_dense_dist_loss"


@pytest.mark.parametrize("preset", ["brain_age_ranksim_synthetic", "brain_age_ordinal_entropy_synthetic"])
def test_feature_regularizers_see_the_penultimate_features(preset: str) -> None:
    m = _module(preset)
    vol, sex, y = _batch()
    out = m.predict_age(vol, sex)
    feats = out["features"]
    assert feats.shape == (4, 40)  # deep_fc (32) + the sex branch (8): what the final layers receive
    torch.testing.assert_close(m.net.final_layers(feats).reshape(-1) * m.age_scale, out["age"])  # type: ignore[operator]
    (term,) = m.terms
    assert term.applies_to == "features"
    value = term(m.loss_tensors(out, y))
    value.backward()
    assert torch.isfinite(value) and m.net.deep_fc[0].weight.grad is not None  # type: ignore[index]


def test_ranksim_trains_beside_an_ordinal_head(cohort: Path, tmp_path: Path) -> None:
    reg = "loss.regularizers=[{name: ranksim, weight: 1.0, options: {interpolation_lambda: 2.0}}]"
    run, _ = _train(cohort, tmp_path, "brain_age_coral_synthetic", reg)
    values = _log(run, "train/loss/ranksim")
    assert values and all(np.isfinite(values))


def test_ordinal_entropy_run_logs_its_term(cohort: Path, tmp_path: Path) -> None:
    run, _ = _train(cohort, tmp_path, "brain_age_ordinal_entropy_synthetic")
    values = _log(run, "train/loss/ordinal_entropy")
    assert values and all(np.isfinite(values))


RANKSIM = "loss.regularizers=[{name: ranksim, weight: 1.0}]"
LDS = "task.lds={reweight: sqrt_inv, lds: true}"
SFCN = [
    "model.backbone=sfcn",
    "model.options={channels: [4, 4, 4, 4, 4, 4], bins: 35, age_range: [20.0, 90.0], dropout: 0.5}",
]


@pytest.mark.parametrize(
    ("preset", "sets", "message"),
    [
        (
            "brain_age_tsan_synthetic",
            [RANKSIM],
            "error: `loss.regularizers.ranksim` applies to ScaleDense's penultimate features, which only its one "
            "stage trains (`model.backbone: scale_dense`, `task.stages: 1`), not TSAN's two stages",
        ),
        (
            "brain_age_sfcn_synthetic",
            ["loss.regularizers=[{name: ordinal_entropy, weight: 1.0}]"],
            "error: `loss.regularizers.ordinal_entropy` applies to ScaleDense's penultimate features",
        ),
        (
            "brain_age_tsan_synthetic",
            [LDS],
            "error: `task.lds.reweight: sqrt_inv` reweights the task loss of ScaleDense's one stage",
        ),
        ("brain_age_sfcn_synthetic", [LDS], "error: `task.lds.reweight: sqrt_inv` reweights the task loss"),
        (
            "brain_age_balanced_mse_synthetic",
            [LDS],
            "error: `task.lds.reweight: sqrt_inv` weights the task loss per sample, but `balanced_mse` takes no "
            "per-sample weights",
        ),
        (
            "brain_age_l1_synthetic",
            ["task.lds={reweight: sqrt_inv, ks: 4}"],
            "error: `task.lds.ks` must be odd, got 4",
        ),
        (
            "brain_age_balanced_mse_synthetic",
            ["task.stages=2"],
            "error: `loss.name: balanced_mse` trains ScaleDense's one stage: set `task.stages: 1`, got "
            "`task.stages: 2`",
        ),
        ("brain_age_dist_loss_synthetic", SFCN, "error: `loss.name: dist_loss` is a loss of predicted ages"),
    ],
)
def test_what_does_not_fit_a_stage_is_one_error_line(
    cohort: Path, tmp_path: Path, preset: str, sets: list[str], message: str
) -> None:
    data = [f"data.options.csv={cohort}", f"data.options.cache_dir={tmp_path}"]
    out = _invoke("train", preset, "--out", str(tmp_path / "x"), *_sets(*data, *sets), code=2)
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), out
