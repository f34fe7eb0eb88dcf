"""Config schema: parsing, validation messages with suggestions, --set overrides, presets."""

from __future__ import annotations

import pytest

pytest.importorskip("yaml")

from rankwise.recipes.config import (
    Config,
    ConfigError,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    list_presets,
    load_config,
)
from rankwise.recipes.modules import _configure_optimizers


def test_defaults_roundtrip():
    cfg = config_from_dict({})
    assert isinstance(cfg, Config)
    assert cfg.data.name == "abalone" and cfg.loss.kind == "l1" and cfg.run.recipe == "dir"
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_unknown_key_names_the_key_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown config key `optimizer\.lrr`; did you mean 'lr'"):
        config_from_dict({"optimizer": {"lrr": 0.1}})
    with pytest.raises(ConfigError, match=r"unknown config key `trainr`; did you mean 'trainer'"):
        config_from_dict({"trainr": {}})
    with pytest.raises(ConfigError, match=r"valid keys: .*max_epochs"):
        config_from_dict({"trainer": {"epochs": 3}})


def test_bad_values_name_the_key():
    with pytest.raises(ConfigError, match=r"`loss\.kind` must be one of .*got 'l3'.*did you mean 'l1'"):
        config_from_dict({"loss": {"kind": "l3"}})
    with pytest.raises(ConfigError, match=r"`trainer\.max_epochs` must be an integer, got 'ten'"):
        config_from_dict({"trainer": {"max_epochs": "ten"}})
    with pytest.raises(ConfigError, match=r"`optimizer\.lr` must be > 0"):
        config_from_dict({"optimizer": {"lr": 0}})
    with pytest.raises(ConfigError, match=r"`loss\.lds\.lds` is true but `loss\.lds\.reweight` is 'none'"):
        config_from_dict({"loss": {"lds": {"lds": True}}})
    with pytest.raises(ConfigError, match=r"`loss\.lds\.ks` must be odd"):
        config_from_dict({"loss": {"lds": {"ks": 4}}})
    with pytest.raises(ConfigError, match=r"unknown regularizer `loss\.regularizers\.ranksin`; did you mean 'ranksim'"):
        config_from_dict({"loss": {"regularizers": {"ranksin": {"weight": 1}}}})
    with pytest.raises(ConfigError, match=r"`run\.init_checkpoint` is required"):
        config_from_dict({"run": {"recipe": "rrt"}})
    with pytest.raises(ConfigError, match=r"`schedule\.milestones` must be increasing"):
        config_from_dict({"schedule": {"kind": "multistep", "milestones": [80, 60]}})
    with pytest.raises(ConfigError, match=r"`data` must be a mapping"):
        config_from_dict({"data": 3})


def test_set_overrides_are_yaml_typed():
    raw = apply_overrides(
        {"trainer": {"max_epochs": 3}},
        [
            "trainer.max_epochs=7",
            "optimizer.lr=1e-4",
            "loss.regularizers.ranksim.weight=100",
            "schedule.milestones=[60, 80]",
            "run.tsne=false",
            "data.options.per_label=5",
        ],
    )
    cfg = config_from_dict(raw)
    assert cfg.trainer.max_epochs == 7
    assert cfg.optimizer.lr == pytest.approx(1e-4)
    assert cfg.loss.regularizers["ranksim"].weight == 100.0
    assert cfg.schedule.milestones == [60, 80]
    assert cfg.run.tsne is False
    assert cfg.data.options == {"per_label": 5}
    with pytest.raises(ConfigError, match="--set expects key=value"):
        apply_overrides({}, ["trainer.max_epochs"])
    with pytest.raises(ConfigError, match=r"unknown config key `trainer\.max_epoch`"):
        load_config("abalone_vanilla", ["trainer.max_epoch=3"])


def test_yaml_file_with_extends(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("optimizer: {lr: 0.01}\ntrainer: {max_epochs: 4}\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\ntrainer: {max_epochs: 9}\n")
    cfg = load_config(child)
    assert cfg.optimizer.lr == pytest.approx(0.01) and cfg.trainer.max_epochs == 9
    preset_child = tmp_path / "p.yaml"
    preset_child.write_text("extends: abalone_lds\nrun: {name: mine}\n")
    cfg = load_config(preset_child)
    assert cfg.loss.lds.reweight == "sqrt_inv" and cfg.run.name == "mine"
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must contain a mapping"):
        load_config(bad)


def test_unknown_preset_suggests():
    with pytest.raises(ConfigError, match=r"neither a config file nor a preset; did you mean 'abalone_lds'"):
        load_config("abalone_ldss")


PRESETS = sorted(list_presets())


def test_preset_list_covers_the_papers():
    names = set(PRESETS)
    for n in [
        "abalone_vanilla",
        "abalone_lds",
        "abalone_ranksim",
        "abalone_ranksim_lds",
        "abalone_rnc",
        "agedb_dir_vanilla",
        "agedb_dir_sqinv",
        "agedb_dir_lds",
        "agedb_dir_fds",
        "agedb_dir_lds_fds",
        "agedb_dir_ranksim",
        "imdb_wiki_dir_vanilla",
        "imdb_wiki_dir_lds_fds",
        "imdb_wiki_dir_ranksim",
        "sts_b_dir_ranksim",
        "agedb_dir_rnc",
        "agedb_dir_conr",
    ]:
        assert n in names, n
    assert all(list_presets()[n] for n in names), "every preset has a description"


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_and_validates(name):
    cfg = load_config(name)
    assert config_from_dict(config_to_dict(cfg)) == cfg
    for reg in cfg.loss.regularizers.values():
        assert reg.weight >= 0


def test_paper_recipes():
    a = load_config("agedb_dir_ranksim")
    assert (a.data.batch_size, a.optimizer.lr, a.model.backbone, a.optimizer.name) == (64, 2.5e-4, "resnet50", "adam")
    assert a.loss.regularizers["ranksim"].weight == 100
    assert a.loss.regularizers["ranksim"].options["interpolation_lambda"] == 2
    i = load_config("imdb_wiki_dir_lds_fds")
    assert (i.data.batch_size, i.optimizer.lr, i.trainer.max_epochs) == (256, 1e-3, 90)
    assert i.schedule.kind == "multistep" and i.schedule.milestones == [60, 80] and i.schedule.gamma == 0.1
    assert i.loss.lds.reweight == "sqrt_inv" and i.loss.lds.lds and i.loss.fds.enabled
    s = load_config("sts_b_dir_ranksim")
    assert s.loss.regularizers["ranksim"].weight == pytest.approx(3e-4)


def test_lr_schedule_multistep_and_warmup():
    import torch

    cfg = load_config(
        None, ["schedule.kind=multistep", "schedule.milestones=[2, 4]", "optimizer.lr=1.0", "schedule.warmup_epochs=1"]
    )
    m = torch.nn.Linear(2, 1)
    out = _configure_optimizers(m, cfg)  # type: ignore[arg-type]
    opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.5, 1.0, 0.1, 0.1, 0.01, 0.01])


def test_options_are_checked_against_the_library():
    with pytest.raises(
        ConfigError,
        match=r"unknown option `loss\.regularizers\.ranksim\.options\.interp_lambda`; "
        r"did you mean 'interpolation_lambda'",
    ):
        load_config("abalone_ranksim", ["loss.regularizers.ranksim.options.interp_lambda=2"])
    with pytest.raises(ConfigError, match=r"unknown option `model\.options\.hiden`; did you mean 'hidden'"):
        load_config("abalone_vanilla", ["model.options.hiden=[8]"])
    with pytest.raises(ConfigError, match=r"unknown option `data\.options\.perlabel`; did you mean 'per_label'"):
        load_config("abalone_vanilla", ["data.options.perlabel=3"])
    with pytest.raises(ConfigError, match=r"unknown option `loss\.options\.betta`; did you mean 'beta'"):
        load_config("abalone_vanilla", ["loss.options.betta=3"])
    with pytest.raises(ConfigError, match=r"`data\.name`: unknown dataset 'abalon'"):
        load_config("abalone_vanilla", ["data.name=abalon"])
    with pytest.raises(ConfigError, match=r"`model\.backbone`: unknown backbone"):
        load_config("abalone_vanilla", ["model.backbone=resnet5"])
    assert load_config("abalone_vanilla", ["loss.options.beta=0.3", "loss.kind=focal_l1"]).loss.options["beta"] == 0.3
