"""The extension points of docs/recipes.md, exercised end to end on tiny runs.

* a loss registered with ``inputs`` is a regularizer at once (no other table to edit);
* a registered task loss with learnable parameters is trained, checkpointed, with its own lr;
* a new recipe registered with ``register_recipe`` goes through train / evaluate / compare;
* a new sorting relaxation registered with ``register_relaxation`` is a ``task.method``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("lightning")
pytest.importorskip("sklego")

import lightning as L
import torch
from pydantic import Field
from torch import nn

from rankwise.losses import LOSSES, register_loss
from rankwise.recipes import ConfigError, Recipe, load_config
from rankwise.recipes.config import Options
from rankwise.recipes.rundir import load_state_dict
from rankwise.recipes.runner import compare, evaluate, train
from tests.recipes.test_recipe_training import TINY


@pytest.fixture(scope="module")
def abalone():
    from rankwise.data import get_dataset

    return get_dataset("abalone", per_label=10, seed=0)


@pytest.fixture
def registered():
    """Registers what a test adds to a registry, and removes it afterwards."""
    from rankwise.recipes import registry
    from rankwise.recipes.sorting import RELAXATIONS

    added: list[tuple[Any, str]] = []

    def add(table: Any, name: str) -> None:
        added.append((table, name))

    yield {"add": add, "losses": LOSSES._entries, "recipes": registry.RECIPES, "relaxations": RELAXATIONS}
    for table, name in added:
        table.pop(name, None)


# ------------------------------------------------------------------------------ a new regularizer


def feature_norm_loss(features: torch.Tensor, *, p: float = 2.0) -> torch.Tensor:
    """Mean ``p``-norm of the feature rows (a toy regularizer on the features)."""
    return features.norm(p=p, dim=-1).mean()


def test_a_registered_loss_is_a_regularizer(tmp_path, abalone, registered):
    register_loss("feature_norm", inputs={"features": "features"})(feature_norm_loss)
    registered["add"](registered["losses"], "feature_norm")
    cfg = load_config(
        "abalone_vanilla",
        [*TINY, "loss.regularizers=[{name: feature_norm, weight: 0.1, options: {p: 1.0}}]"],
    )
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False, data=abalone)
    csv = (res.run_dir / "logs" / "metrics.csv").read_text()
    assert "train/loss/feature_norm" in csv and res.metrics["test"]["all"]["count"] > 0
    with pytest.raises(ConfigError, match=r"unknown option `loss\.regularizers\.feature_norm\.options\.q`"):
        load_config("abalone_vanilla", ["loss.regularizers.feature_norm.options.q=1"])


# ------------------------------------------------------------------------------ a task loss with parameters


def noisy_mse_loss(
    pred: torch.Tensor, target: torch.Tensor, log_sigma: torch.Tensor | float = 0.0, *, reduction: str = "mean"
) -> torch.Tensor:
    """Gaussian negative log-likelihood with a learnable noise scale (a toy Balanced-MSE-like loss)."""
    log_sigma = torch.as_tensor(log_sigma, dtype=pred.dtype, device=pred.device)
    nll = 0.5 * (pred - target) ** 2 * torch.exp(-2 * log_sigma) + log_sigma
    return nll.mean() if reduction == "mean" else nll


class NoisyMSELoss(nn.Module):
    def __init__(self, *, init_sigma: float = 1.0) -> None:
        super().__init__()
        self.log_sigma = nn.Parameter(torch.tensor(float(init_sigma)).log())

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return noisy_mse_loss(pred, target, self.log_sigma)


def test_task_loss_with_parameters_and_its_own_lr(tmp_path, abalone, registered):
    register_loss("noisy_mse", module=NoisyMSELoss, inputs={"pred": "predictions", "target": "targets"})(noisy_mse_loss)
    registered["add"](registered["losses"], "noisy_mse")
    with pytest.raises(ConfigError, match=r"unknown option `loss\.options\.init_sigmaa`"):
        load_config("abalone_vanilla", ["loss.name=noisy_mse", "loss.options.init_sigmaa=2"])
    cfg = load_config("abalone_vanilla", [*TINY, "loss.name=noisy_mse", "loss.options.init_sigma=3.0", "loss.lr=0.05"])

    from rankwise.recipes.regression.module import DIRRegressor

    module = DIRRegressor(cfg, input_dim=abalone.input_dim, train_labels=abalone.train_labels)
    groups = module.param_groups()
    assert len(groups) == 2 and groups[1]["lr"] == 0.05 and groups[1]["params"] == [module.task_loss.loss.log_sigma]
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False, data=abalone)
    state = load_state_dict(res.run_dir / "checkpoints" / "last.ckpt")
    log_sigma = state["task_loss.loss.log_sigma"]
    assert not torch.isclose(log_sigma, torch.tensor(3.0).log())  # trained
    ckpt = torch.load(res.run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert [g["initial_lr"] for g in ckpt["optimizer_states"][0]["param_groups"]] == [cfg.optimizer.lr, 0.05]


def test_balanced_mse_task_loss(tmp_path, abalone):
    """``loss.name: balanced_mse``: the noise scale is a trained parameter with its own learning rate."""
    cfg = load_config(
        "abalone_vanilla",
        [*TINY, "loss.name=balanced_mse", "loss.options={init_noise_sigma: 8.0, method: bmc}", "loss.lr=0.01"],
    )
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False, data=abalone)
    ckpt = torch.load(res.run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    sigma = ckpt["state_dict"]["task_loss.loss.noise_sigma"]
    assert float(sigma) != 8.0
    assert [g["initial_lr"] for g in ckpt["optimizer_states"][0]["param_groups"]] == [cfg.optimizer.lr, 0.01]
    with pytest.raises(ConfigError, match=r"`loss\.options`: `method` must be one of"):
        load_config("abalone_vanilla", ["loss.name=balanced_mse", "loss.options.method=bogus"])


class CenteredL1Loss(nn.Module):
    """A toy loss built from the training labels: L1 of (pred - mean) against (target - mean)."""

    def __init__(self, *, train_labels: torch.Tensor, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.register_buffer("center", train_labels.float().mean())

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.scale * ((pred - self.center) - (target - self.center)).abs().mean()


def centered_l1_loss(pred: torch.Tensor, target: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
    return scale * (pred - target).abs().mean()


def test_a_loss_built_from_the_training_labels(tmp_path, abalone, registered):
    register_loss("centered_l1", module=CenteredL1Loss, inputs={"pred": "predictions", "target": "targets"})(
        centered_l1_loss
    )
    registered["add"](registered["losses"], "centered_l1")
    cfg = load_config("abalone_vanilla", [*TINY, "loss.name=centered_l1", "loss.options.scale=2.0"])
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False, data=abalone)
    state = load_state_dict(res.run_dir / "checkpoints" / "best.ckpt")
    assert float(state["task_loss.loss.center"]) == pytest.approx(float(abalone.train_labels.mean()), rel=1e-5)


# ------------------------------------------------------------------------------ a new recipe


class LinearOptions(Options):
    """Options of the toy recipe."""

    l2: float = Field(0.0, description="weight decay of the linear model", ge=0)


class LinearModule(L.LightningModule):
    def __init__(self, input_dim: int, cfg: Any) -> None:
        super().__init__()
        self.cfg, self.linear = cfg, nn.Linear(input_dim, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.linear(x).squeeze(-1), y.float())
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> Any:
        from rankwise.recipes.optim import configure

        return configure(self, self.cfg.optimizer, self.cfg.schedule)


class LinearRecipe(Recipe):
    """The docs' worked example: a linear regressor, test MAE (overrides every reporting default of Recipe)."""

    name = "toy_linear"
    description = "linear regression on tabular features"
    options = LinearOptions
    uses: frozenset[str] = frozenset()
    learns = "regression"
    report_kind = "scalar"

    def check(self, cfg: Any) -> None:
        if cfg.data.name != "abalone":
            raise ConfigError("`data.name`: the toy recipe reads abalone only")

    def method(self, cfg: Any) -> str:
        return self.name

    def fit(self, run: Any) -> dict[str, Any]:
        from torch.utils.data import DataLoader

        module = LinearModule(run.data.input_dim, run.cfg)
        loader = DataLoader(run.data.train, batch_size=run.cfg.data.batch_size, shuffle=False)
        run.fit(run.trainer(max_epochs=run.cfg.trainer.max_epochs), module, loader)
        return self._test(run, module) if run.global_rank == 0 else {}

    def evaluate(self, run: Any, checkpoint: str | None) -> dict[str, Any]:
        module = LinearModule(run.data.input_dim, run.cfg)
        module.load_state_dict(load_state_dict(run.checkpoint(checkpoint or "last")))
        return self._test(run, module)

    def _test(self, run: Any, module: LinearModule) -> dict[str, Any]:
        x = torch.stack([run.data.test[i][0] for i in range(len(run.data.test))])
        with torch.no_grad():
            pred = module.linear(x).squeeze(-1)
        return {"test": {"mae": float((pred - torch.as_tensor(run.data.test_labels)).abs().mean())}}

    def summary(self, metrics: Any) -> str:
        return f"MAE {metrics['test']['mae']:.3f}"

    def tables(self, results: Any) -> Any:
        from rankwise.recipes.reports import scalar_table_rows

        return [scalar_table_rows(results)]

    def write_report(self, out_dir: Any, results: Any, run_dirs: Any, *, title: str, extra: str) -> Any:
        from rankwise.recipes.reports import write_scalar_report

        return write_scalar_report(out_dir, results, run_dirs, title=title, extra=extra)


def test_a_recipe_without_fit_is_refused_naming_it():
    from rankwise.recipes.registry import register_recipe

    class NoFit(Recipe):
        name, options = "no_fit", LinearOptions

        def evaluate(self, run: Any, checkpoint: str | None) -> dict[str, Any]:
            return {}

    with pytest.raises(TypeError, match="fit"):
        register_recipe(NoFit())
    with pytest.raises(TypeError, match=r"`recipe` must be an instance of a rankwise\.recipes\.Recipe subclass"):
        register_recipe(object())  # type: ignore[arg-type]


def test_a_registered_recipe_goes_through_the_lifecycle(tmp_path, abalone, registered):
    from rankwise.recipes.registry import get_recipe, list_recipes, register_recipe

    register_recipe(LinearRecipe())
    registered["add"](registered["recipes"], "toy_linear")
    assert "toy_linear" in list_recipes() and get_recipe("toy_linear").name == "toy_linear"
    raw = {"recipe": "toy_linear", "data": {"options": {"per_label": 10}}, "trainer": {"max_epochs": 2}, "run": {}}
    with pytest.raises(ConfigError, match=r"unknown config key `task\.l3`; did you mean 'l2'"):
        load_config({**raw, "task": {"l3": 1}})
    with pytest.raises(ConfigError, match=r"`loss` is not used by recipe 'toy_linear'"):
        load_config({**raw, "loss": {"kind": "mse"}})
    res = train(load_config(raw), out=tmp_path / "run", progress=False, verbose=False, data=abalone)
    assert res.metrics["recipe"] == "toy_linear" and res.metrics["test"]["mae"] > 0
    for f in ("config.yaml", "meta.json", "metrics.json", "checkpoints/best.ckpt", "checkpoints/last.ckpt"):
        assert (res.run_dir / f).is_file(), f
    assert (res.run_dir / "plots" / "training_curves.png").is_file()
    assert evaluate(res.run_dir, data=abalone)["test"] == res.metrics["test"]
    cfg_file = tmp_path / "toy.yaml"
    cfg_file.write_text(json.dumps(raw))  # JSON is YAML
    cmp = compare([str(cfg_file), str(res.run_dir)], seeds=[1], out=tmp_path / "cmp")
    assert "| method | seeds | mae | train s |" in cmp.report.read_text()
    with pytest.raises(ValueError, match="already registered"):
        register_recipe(LinearRecipe())


# ------------------------------------------------------------------------------ a new sorting relaxation


@pytest.mark.slow
def test_a_registered_relaxation_is_a_sort_method(tmp_path, registered):
    from rankwise.ops import neural_sort
    from rankwise.recipes.sorting import register_relaxation, relaxation_options

    def sharpened(scores: torch.Tensor, t: Any) -> torch.Tensor:
        return neural_sort(scores * relaxation_options(t)["gain"], tau=t.tau, hard=t.hard)

    register_relaxation("sharpened_neuralsort", sharpened, options={"gain": 1.0}, description="scores x gain")
    registered["add"](registered["relaxations"], "sharpened_neuralsort")
    with pytest.raises(ConfigError, match=r"unknown option `task\.options\.gian` for relaxation"):
        load_config("large_mnist_neuralsort", ["task.method=sharpened_neuralsort", "task.options.gian=2"])
    cfg = load_config(
        "large_mnist_median_neuralsort",
        [
            "task.method=sharpened_neuralsort",
            "task.options.gain=2.0",
            "task.steps=2",
            "task.test_lists=20",
            "task.lists_per_batch=4",
            "trainer.num_threads=1",
            "data.options.test_fraction=0.05",
        ],
    )
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False)
    assert res.metrics["method"] == "sharpened_neuralsort" and res.metrics["test"]["mse_1e4"] >= 0
