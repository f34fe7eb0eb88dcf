"""TSAN (Cheng et al., IEEE TMI 2021) and SFCN (Peng et al., MedIA 2021) networks, TSAN's discretisation and losses.

The reference values in ``data/tsan_reference.pt`` were produced by running the authors' released
code (networks with 8 filters and 2 blocks on a 20x24x20 grid, BatchNorm statistics randomised, in
eval mode; their ``discretize_age``; their ``rank_difference_loss`` with an exact sorter in place
of the LSTM and numpy seed 123); ``data/tsan_reference_keys.json`` lists their default networks'
``state_dict`` keys and shapes. ``data/sfcn_reference.pt`` holds values produced by running Peng et
al.'s released code (UKBiobank_deep_pretrain: their ``SFCN`` with channels 4-4-8-8-8-4 and 10 outputs
at their 160x192x160 grid, input ``numpy.random.default_rng(0).standard_normal``, BatchNorm
statistics randomised; their ``num2vect`` and ``my_KLDivLoss``); ``data/sfcn_reference_keys.json``
their default SFCN's keys, shapes and parameter count. Only tensors are stored (loaded with
``weights_only=True``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import rankwise
from rankwise.losses import pairwise_difference_loss, spearman_loss
from rankwise.models import SFCN, ScaleDense, TSANSecondStage, build_backbone, load_tsan_checkpoint, sex_one_hot
from rankwise.models.volumetric import sfcn_kl_loss, sfcn_soft_labels

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def ref() -> dict[str, torch.Tensor]:
    return torch.load(DATA / "tsan_reference.pt", weights_only=True)


def _sub(ref: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k.removeprefix(prefix): v for k, v in ref.items() if k.startswith(prefix)}


def test_default_networks_have_the_authors_keys_shapes_and_sizes() -> None:
    keys = json.loads((DATA / "tsan_reference_keys.json").read_text())
    for name, net in (("scale_dense", ScaleDense()), ("second_stage", TSANSecondStage())):
        mine = {k: list(v.shape) for k, v in net.state_dict().items()}
        assert mine == keys[f"{name}_keys"]
        assert sum(p.numel() for p in net.parameters()) == keys[f"{name}_params"]
    assert keys["scale_dense_params"] == 102_378_307 and keys["second_stage_params"] == 102_379_411


def test_scale_dense_matches_the_authors_outputs(ref: dict[str, torch.Tensor]) -> None:
    net = ScaleDense(nb_filter=8, nb_block=2).eval()
    net.load_state_dict(_sub(ref, "sd."))
    sex = sex_one_hot(ref["sex"])
    with torch.no_grad():
        torch.testing.assert_close(net(ref["x"], sex), ref["sd_out"], rtol=1e-5, atol=1e-5)
        net.use_sex = False
        torch.testing.assert_close(net(ref["x"], None), ref["sd_nosex_out"], rtol=1e-5, atol=1e-5)


def test_second_stage_matches_the_authors_outputs(ref: dict[str, torch.Tensor]) -> None:
    net = TSANSecondStage(nb_filter=8, nb_block=2).eval()
    net.load_state_dict(_sub(ref, "ss."))
    with torch.no_grad():
        res, age = net(ref["x"], sex_one_hot(ref["sex"]), ref["ss_dis"])
    torch.testing.assert_close(res, ref["ss_out_residual"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(age, ref["ss_out_age"], rtol=1e-5, atol=1e-5)


def test_load_tsan_checkpoint_strips_dataparallel_prefix(tmp_path: Path, ref: dict[str, torch.Tensor]) -> None:
    state = _sub(ref, "sd.")
    path = tmp_path / "ScaleDense_best_model.pth.tar"
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in state.items()}}, path)
    net = ScaleDense(nb_filter=8, nb_block=2).eval()
    loaded = load_tsan_checkpoint(path, net)
    assert set(loaded) == set(state)
    with torch.no_grad():
        torch.testing.assert_close(net(ref["x"], sex_one_hot(ref["sex"])), ref["sd_out"], rtol=1e-5, atol=1e-5)
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"bad\.pth"):
        load_tsan_checkpoint(bad)


def test_discretize_age_matches_the_authors_rule(ref: dict[str, torch.Tensor]) -> None:
    ages = ref["dis_in"]
    torch.testing.assert_close(rankwise.discretize_age(ages, step=5), ref["dis_out5"].reshape(ages.shape))
    torch.testing.assert_close(rankwise.discretize_age(ages, step=2), ref["dis_out2"].reshape(ages.shape))
    assert rankwise.discretize_age(torch.tensor([42, 43]), step=5).tolist() == [40.0, 45.0]
    with pytest.raises(ValueError, match="`step`"):
        rankwise.discretize_age(ages, step=0)
    with pytest.raises(TypeError, match="`age`"):
        rankwise.discretize_age([1.0], step=5)  # type: ignore[arg-type]


def test_ranking_and_age_difference_losses_match_the_authors(
    ref: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    pred, gt = ref["rank_pred"], ref["rank_gt"]
    # an almost exact soft rank reproduces their Spearman term with an exact sorter
    sp = spearman_loss(pred, gt, ranker="isotonic", regularization_strength=1e-4)
    torch.testing.assert_close(sp, ref["spearman_exact"], rtol=1e-5, atol=1e-6)
    # their random pairs: numpy's legacy RNG seeded 123, two draws of B indices in [0, B)
    rs = np.random.RandomState(123)
    draws = [torch.as_tensor(rs.randint(0, 8, 8)), torch.as_tensor(rs.randint(0, 8, 8))]
    monkeypatch.setattr(torch, "randint", lambda *a, **k: draws.pop(0))
    ld = pairwise_difference_loss(pred, gt, pairs="random")
    torch.testing.assert_close(sp + ld, ref["rank_loss_beta1_seed123"], rtol=1e-5, atol=1e-4)


def test_random_pairs_estimate_the_all_pairs_loss() -> None:
    g = torch.Generator().manual_seed(0)
    pred, gt = torch.randn(16, generator=g), torch.randn(16, generator=g)
    torch.manual_seed(0)
    est = torch.stack([pairwise_difference_loss(pred, gt, pairs=64) for _ in range(400)]).mean()
    full = pairwise_difference_loss(pred, gt)  # mean over i != j; random pairs include i == j
    torch.testing.assert_close(est, full * 15 / 16, rtol=0.05, atol=0.0)
    with pytest.raises(ValueError, match="`pairs`"):
        pairwise_difference_loss(pred, gt, pairs=0)


def test_sfcn_shapes_soft_labels_and_kl() -> None:
    net = SFCN(channels=(4, 4, 4, 4, 4, 4), bins=14, age_range=(20.0, 90.0)).eval()
    assert [k for k in net.state_dict() if "conv_6" in k] == ["classifier.conv_6.weight", "classifier.conv_6.bias"]
    logp = net(torch.randn(3, 1, 32, 36, 32))
    assert logp.shape == (3, 14)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(3))
    centers: torch.Tensor = net.bin_centers  # type: ignore[assignment]
    torch.testing.assert_close(centers[:2], torch.tensor([22.5, 27.5]))
    q = sfcn_soft_labels(torch.tensor([22.5, 60.0, 88.0]), centers, sigma=1.0)
    # the Gaussian's mass in each 5-year bin, by scipy's normal CDF (independent of torch.special)
    from scipy.stats import norm

    edges = centers.double().numpy()[None] + np.array([[-2.5], [2.5]])[:, :, None]
    expect = norm.cdf(edges[1], loc=[[22.5], [60.0], [88.0]]) - norm.cdf(edges[0], loc=[[22.5], [60.0], [88.0]])
    torch.testing.assert_close(q, torch.tensor(expect, dtype=torch.float32))
    # not renormalised: an age 2 SD below the top of the range (90) keeps Phi(2) of its mass
    assert float(q[1].sum()) == pytest.approx(1.0, abs=1e-5)
    assert float(q[2].sum()) == pytest.approx(norm.cdf(2.0), abs=1e-5)
    kl = sfcn_kl_loss(logp, q)
    ref = torch.nn.functional.kl_div(logp, q + 1e-16, reduction="sum") / 3
    torch.testing.assert_close(kl, ref)
    with pytest.raises(ValueError, match="`soft_labels`"):
        sfcn_kl_loss(logp, q[:2])
    assert float(net.predict_age(torch.log(q))[0]) == pytest.approx(float((q[0] * centers).sum()))
    # the authors' layer sizes: sum over conv (k^3 cin cout + cout) and BN (2 c) parameters, 40 bins
    assert sum(p.numel() for p in SFCN().parameters()) == 2_952_936


def test_registered_backbones_and_input_errors() -> None:
    net, dim = build_backbone("scale_dense", nb_filter=4, nb_block=2)
    assert isinstance(net, ScaleDense) and dim == 1
    assert isinstance(build_backbone("tsan_second_stage", nb_filter=4, nb_block=1)[0], TSANSecondStage)
    assert build_backbone("sfcn", bins=7, age_range=[20, 90])[1] == 7
    with pytest.raises(ValueError, match=r"`x` must have shape \(B, 1, D, H, W\)"):
        net(torch.randn(2, 16, 16, 16), sex_one_hot(torch.tensor([0, 1])))
    with pytest.raises(ValueError, match="`sex` must be the one-hot"):
        net(torch.randn(2, 1, 16, 16, 16), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="`sex` must hold 0"):
        sex_one_hot(torch.tensor([2]))
    with pytest.raises(ValueError, match="`nb_block`"):
        ScaleDense(nb_block=0)


@pytest.fixture(scope="module")
def sfcn_ref() -> dict[str, torch.Tensor]:
    return torch.load(DATA / "sfcn_reference.pt", weights_only=True)


def test_sfcn_has_the_authors_keys_shapes_and_size() -> None:
    keys = json.loads((DATA / "sfcn_reference_keys.json").read_text())
    mine = {k: list(v.shape) for k, v in SFCN().state_dict().items()}
    assert mine == keys["sfcn_keys"]
    assert sum(p.numel() for p in SFCN().parameters()) == keys["sfcn_params"] == 2_952_936


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_sfcn_matches_the_authors_outputs(sfcn_ref: dict[str, torch.Tensor], mode: str) -> None:
    channels = json.loads((DATA / "sfcn_reference_keys.json").read_text())["small_channels"]
    net = SFCN(channels=channels, bins=10, age_range=(42.0, 82.0))
    net.load_state_dict(_sub(sfcn_ref, "net."))
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 1, 160, 192, 160), dtype=np.float32))
    net.eval()
    if mode == "train":  # BatchNorm on the batch's statistics, dropout off (it draws random masks)
        net.train()
        net.classifier.dropout.eval()
    with torch.no_grad():
        out = net(x)
    torch.testing.assert_close(out, sfcn_ref[f"{mode}_out"].reshape(2, 10), rtol=1e-5, atol=1e-5)
    if mode == "eval":
        kl = sfcn_kl_loss(out, sfcn_ref["kl_soft"])
        torch.testing.assert_close(kl, sfcn_ref["kl_value"].float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("key", "bins", "sigma"), [("soft_step1", 40, 1.0), ("soft_step2", 20, 1.0), ("soft_step2_sigma2.5", 20, 2.5)]
)
def test_sfcn_soft_labels_match_the_authors_num2vect(
    sfcn_ref: dict[str, torch.Tensor], key: str, bins: int, sigma: float
) -> None:
    net = SFCN(channels=(4, 4), bins=bins, age_range=(42.0, 82.0))
    centers: torch.Tensor = net.bin_centers  # type: ignore[assignment]
    step = key.split("_")[1]
    torch.testing.assert_close(centers.double(), sfcn_ref[f"centers_{step}"])
    q = sfcn_soft_labels(sfcn_ref["ages"], centers.double(), sigma=sigma)
    torch.testing.assert_close(q, sfcn_ref[key], rtol=1e-9, atol=1e-12)


def test_narrow_scale_dense_builds_without_warnings_and_its_gate_is_a_constant() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net = ScaleDense(nb_filter=4, nb_block=3)
    se = next(m for m in net.modules() if type(m).__name__ == "_SqueezeExcite")
    assert se.FC1.out_features == 0  # the authors' channels // 16 for 8 channels
    x = torch.randn(3, 8, 4, 4, 4)
    gate = torch.sigmoid(se.FC2.bias)
    torch.testing.assert_close(se(x), x * gate[None, :, None, None, None])
