"""The reference protocols: SupCon's loss scale, RankSim before FDS, Balanced MSE presets."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("lightning")
pytest.importorskip("sklego")

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.losses import supcon_loss
from rankwise.recipes import load_config
from rankwise.recipes.loss_terms import LossTerm, Objective
from rankwise.recipes.runner import train
from tests.recipes.test_recipe_training import TINY

# ------------------------------------------------------------------------------ SupCon loss scale


def _stage1_loss(preset: str, sets: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The recipe's stage-1 loss on a fixed two-view batch, and the unscaled (factor 1) supcon_loss on it."""
    from rankwise.recipes.supcon import ContrastivePretrainer

    cfg = load_config(preset, ["model.options.feature_dim=8", "task.projection_dim=4", *sets])
    torch.manual_seed(0)
    module = ContrastivePretrainer(cfg, num_classes=10).eval()
    g = torch.Generator().manual_seed(1)
    views = torch.rand(6, 2, 1, 28, 28, generator=g)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        loss = module.training_step((views, labels), 0)
        z = F.normalize(module.head(module.encoder(views.flatten(0, 1))), dim=-1).view(6, 2, -1)
        t = cfg.task
        plain = supcon_loss(z, labels if t.method == "supcon" else None, temperature=t.temperature)
    return loss, plain


@pytest.mark.parametrize(("preset", "tau"), [("mnist5k_supcon", 0.1), ("mnist5k_simclr", 0.5)])
def test_supcon_recipes_use_the_reference_loss_scale(preset, tau):
    """Reference losses.py: loss = (temperature / base_temperature) * mean, base_temperature = 0.07."""
    cfg = load_config(preset)
    assert cfg.task.base_temperature == 0.07 and cfg.task.temperature == tau
    loss, plain = _stage1_loss(preset, [])
    assert float(plain) > 0
    torch.testing.assert_close(loss, plain * (tau / 0.07))
    # base_temperature = temperature gives the unscaled loss
    loss1, plain1 = _stage1_loss(preset, [f"task.base_temperature={tau}"])
    torch.testing.assert_close(loss1, plain1)


def test_simclr_preset_lr_is_the_reference_lr_scaled_to_our_batch():
    """SupContrast README: SimCLR with SGD lr 0.5 at batch 1024 under the x7.14 loss scale; linear scaling.

    The SupCon preset keeps lr 0.1 (docs/results.md section 4); SimCLR inherits everything else from it.
    """
    simclr, supcon = load_config("mnist5k_simclr"), load_config("mnist5k_supcon")
    assert simclr.optimizer.name == "sgd" and simclr.task.base_temperature == 0.07
    assert simclr.optimizer.lr == pytest.approx(0.5 * simclr.data.batch_size / 1024) == 0.0625
    assert supcon.optimizer.lr == 0.1
    assert (simclr.optimizer.momentum, simclr.optimizer.weight_decay) == (
        supcon.optimizer.momentum,
        supcon.optimizer.weight_decay,
    )
    assert (simclr.data, simclr.schedule) == (supcon.data, supcon.schedule)


# ------------------------------------------------------------------------------ RankSim before FDS


class _Recorder(nn.Module):
    """A feature regularizer that records what it is given (value 0, keeping the graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        self.seen.append(features.detach().clone())
        return features.sum() * 0.0


def test_feature_regularizers_see_the_encoder_output_before_fds(monkeypatch):
    """RankSim's reference applies the regularizer to the encoding; FDS smooths only what the head sees."""
    from rankwise.data import get_dataset
    from rankwise.recipes.regression.module import DIRRegressor

    data = get_dataset("abalone", per_label=10, seed=0)
    cfg = load_config(
        "abalone_lds_fds",
        ["model.options.hidden=[16]", "model.options.feature_dim=8"],
    )
    monkeypatch.setattr(DIRRegressor, "current_epoch", property(lambda self: 5))  # smoothing from epoch 1
    torch.manual_seed(0)
    module = DIRRegressor(cfg, input_dim=data.input_dim, train_labels=data.train_labels)
    rec = _Recorder()
    module.regularizers = nn.ModuleList([LossTerm("recorder", rec, {"features": "features"}, 1.0)])
    module.objective = Objective(module.task_loss, module.regularizers)
    x = torch.stack([data.train[i][0] for i in range(256)]).float()
    y = torch.as_tensor([float(data.train[i][1]) for i in range(256)])
    # FDS statistics of two epochs with a shifted second epoch, so the calibration is far from the identity
    with torch.no_grad():
        f = module.features(x)
        module.fds.update(f, y, 0)  # type: ignore[union-attr]
        module.fds.update(3.0 * f + 1.0, y, 1)  # type: ignore[union-attr]
        module.fds.update(f, y, 2)  # type: ignore[union-attr]
    module.train()
    with torch.no_grad():
        encoded = module.features(x)
        smoothed = module.fds(encoded, y, 5)  # type: ignore[misc]
    assert (smoothed - encoded).abs().max() > 0.1  # smoothing is active: the test can tell the two apart
    loss = module.training_step((x, y), 0)
    assert torch.isfinite(loss)
    assert len(rec.seen) == 1
    torch.testing.assert_close(rec.seen[0], encoded)
    # the head (hence the task loss) still sees the smoothed features
    with torch.no_grad():
        pred = module.head(smoothed).squeeze(-1)
        w = module.sample_weights(y)
        assert w is not None
        task = ((pred - y).abs() * w).mean()
    torch.testing.assert_close(loss, task, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ Balanced MSE presets


@pytest.mark.parametrize("preset", ["abalone_balanced_mse", "sts_b_dir_balanced_mse"])
def test_balanced_mse_presets(preset):
    """Beside the LDS/FDS/RankSim presets: BMC with the reference's init_noise_sigma 1 and sigma_lr 1e-2."""
    cfg = load_config(preset)
    assert cfg.loss.name == "balanced_mse"
    assert cfg.loss.options == {"init_noise_sigma": 1.0, "method": "bmc"}
    assert cfg.loss.lr == 0.01 and cfg.optimizer.lr != 0.01
    base = load_config(preset.replace("balanced_mse", "vanilla"))
    assert (cfg.model, cfg.data, cfg.optimizer, cfg.trainer) == (base.model, base.data, base.optimizer, base.trainer)


@pytest.mark.parametrize("method", ["gai", "bni"])
def test_balanced_mse_gai_bni_presets_fit_on_training_labels(method):
    """GAI / BNI presets: the recipe passes the full training labels, the loss fits its GMM / buckets on them."""
    from rankwise.data import get_dataset
    from rankwise.imbalanced import bni_buckets, fit_label_gmm
    from rankwise.recipes.regression.module import DIRRegressor

    cfg = load_config(f"abalone_balanced_mse_{method}")
    assert cfg.loss.options["method"] == method and cfg.loss.lr == 0.01
    data = get_dataset(cfg.data.name, **cfg.data.options)
    module = DIRRegressor(cfg, input_dim=data.input_dim, bin_width=data.bin_width, train_labels=data.train_labels)
    crit = module.task_loss.loss
    if method == "gai":
        means = fit_label_gmm(data.train_labels, n_components=8)[0]
        torch.testing.assert_close(crit.gmm_means, means)
    else:
        centers, weights = bni_buckets(data.train_labels, bin_width=1.0, centers="mid")
        torch.testing.assert_close(crit.bucket_centers, centers)
        torch.testing.assert_close(crit.bucket_weights, weights)


def test_abalone_balanced_mse_tiny_run(tmp_path):
    """The noise sigma trains in its own optimizer param group (lr 0.01) and moves from its initial value."""
    cfg = load_config("abalone_balanced_mse", TINY)
    res = train(cfg, out=tmp_path / "run", progress=False, verbose=False)
    ckpt = torch.load(res.run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    sigma = float(ckpt["state_dict"]["task_loss.loss.noise_sigma"])
    assert sigma != 1.0 and math.isfinite(sigma)
    groups = ckpt["optimizer_states"][0]["param_groups"]
    assert [g["initial_lr"] for g in groups] == [cfg.optimizer.lr, 0.01]
    assert len(groups[1]["params"]) == 1
    assert math.isfinite(res.metrics["test"]["all"]["mae"])


def test_balanced_mse_gai_options_checked_when_the_config_is_read():
    """The GAI/BNI presets build without training labels at config time (their GMM / buckets come
    later), but bad option values are still refused then."""
    from rankwise.recipes.config import ConfigError

    load_config("abalone_balanced_mse_gai")  # no error: the GMM is fitted when the run starts
    with pytest.raises(ConfigError, match=r"`loss.options`: `method` must be one of 'bmc', 'gai', 'bni'; got 'bogus'"):
        load_config("abalone_balanced_mse_gai", ["loss.options.method=bogus"])
    with pytest.raises(ConfigError, match=r"`loss.options`: `bucket_width` must be finite and > 0, got -1"):
        load_config("abalone_balanced_mse_bni", ["loss.options.bucket_width=-1"])
