"""Config schema: one typed pass, validation messages with suggestions and ranges, --set, presets, paths."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("yaml")

from rankwise.recipes import config_fields, config_from_dict, load_config
from rankwise.recipes.config import (
    Config,
    ConfigError,
    apply_overrides,
    config_to_dict,
    list_presets,
)
from rankwise.recipes.registry import get_recipe, list_recipes


def test_defaults_roundtrip():
    cfg = config_from_dict({})
    assert isinstance(cfg, Config)
    assert cfg.data.name == "abalone" and cfg.loss.kind == "l1" and cfg.recipe == "dir"
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
    with pytest.raises(ConfigError, match=r"`task\.lds\.lds` is true but `task\.lds\.reweight` is 'none'"):
        config_from_dict({"task": {"lds": {"lds": True}}})
    with pytest.raises(ConfigError, match=r"`task\.lds\.ks` must be odd"):
        config_from_dict({"task": {"lds": {"ks": 4}}})
    with pytest.raises(
        ConfigError, match=r"`loss\.regularizers\.ranksin\.name`: unknown loss 'ranksin'; did you mean 'ranksim'"
    ):
        config_from_dict({"loss": {"regularizers": [{"name": "ranksin", "weight": 1}]}})
    with pytest.raises(ConfigError, match=r"`loss\.regularizers\[0\]\.name` is required"):
        config_from_dict({"loss": {"regularizers": [{"weight": 1}]}})
    with pytest.raises(ConfigError, match=r"`task\.init_checkpoint` is required"):
        config_from_dict({"recipe": "rrt"})
    with pytest.raises(ConfigError, match=r"`schedule\.milestones` must be increasing"):
        config_from_dict({"schedule": {"kind": "multistep", "milestones": [80, 60]}})
    with pytest.raises(ConfigError, match=r"`data` must be a mapping"):
        config_from_dict({"data": 3})
    with pytest.raises(ConfigError, match=r"`recipe`: unknown recipe 'sortt'; did you mean 'sort'"):
        config_from_dict({"recipe": "sortt"})


@pytest.mark.parametrize(
    "override,match",
    [  # every field's range is checked where the config is read
        ("schedule.gamma=-1", r"`schedule\.gamma` must be > 0, got -1\.0"),
        ("schedule.gamma=2", r"`schedule\.gamma` must be <= 1"),
        ("optimizer.lr=.nan", r"`optimizer\.lr` must be a finite number, got nan"),
        ("optimizer.lr=.inf", r"`optimizer\.lr` must be a finite number"),
        ("optimizer.momentum=1.5", r"`optimizer\.momentum` must be < 1"),
        ("trainer.num_threads=-1", r"`trainer\.num_threads` must be >= 1, got -1"),
        ("trainer.precision=bogus", r"`trainer\.precision` must be one of"),
        ("trainer.devices=-3", r"`trainer\.devices` must be 'auto', a count"),
        ("trainer.limit_train_batches=1.5", r"`trainer\.limit_train_batches` as a fraction must be in \[0, 1\]"),
        ("trainer.limit_train_batches=0", r"`trainer\.limit_train_batches` must be > 0"),
        ("trainer.deterministic=maybe", r"`trainer\.deterministic` must be true, false or 'warn'"),
        ("task.fds.momentum=5", r"`task\.fds\.momentum` must be <= 1, got 5\.0"),
        ("task.fds.sigma=0", r"`task\.fds\.sigma` must be > 0"),
        ("loss.regularizers.ranksim.weight=-1", r"`loss\.regularizers\.ranksim\.weight` must be >= 0"),
        ("report.few_shot=-1", r"`report\.few_shot` must be >= 0, got -1"),
        ("report.few_shot=200", r"`report\.few_shot` \(200\) must be <= `report\.many_shot` \(100\)"),
        ("report.plot_samples=-5", r"`report\.plot_samples` must be >= 1, got -5"),
        ("study.group_column=dx", r"`study` is not used by recipe"),
        ("study.harmonize=combat", r"`study` is not used by recipe"),
        ("study.harmonize=neurocombat", r"`study\.harmonize` must be one of"),
        ("run.seed=-2", r"`run\.seed` must be >= 0"),
        ("data.batch_size=0", r"`data\.batch_size` must be >= 1"),
        ("schedule.warmup_epochs=-1", r"`schedule\.warmup_epochs` must be >= 0"),
        ("schedule.milestones=[0, 3]", r"`schedule\.milestones\[0\]` must be >= 1, got 0"),
    ],
)
def test_field_ranges(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config("abalone_vanilla", [override])


@pytest.mark.parametrize(
    "preset,override,match",
    [
        ("abalone_rnc", "task.feature_dropout=2", r"`task\.feature_dropout` must be < 1, got 2\.0"),
        ("abalone_rnc", "task.temperature=0", r"`task\.temperature` must be > 0"),
        ("mnist5k_supcon", "task.train_subset=1", r"`task\.train_subset` must be >= 2"),
        ("large_mnist_neuralsort", "task.steps=0", r"`task\.steps` must be >= 1"),
        ("mnist5k_dknn", "task.k=0", r"`task\.k` must be >= 1"),
    ],
)
def test_task_ranges(preset, override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(preset, [override])


def test_run_name_is_one_path_component():
    for bad in ("../escaped", "a/b", "..", "."):
        with pytest.raises(ConfigError, match=r"`run\.name` must be a single path component"):
            load_config("abalone_vanilla", [f"run.name={bad}"])
    assert load_config("abalone_vanilla", ["run.name=my-run_1.b"]).run.name == "my-run_1.b"


def test_preset_names_come_from_the_registry(tmp_path, monkeypatch):
    # a preset name never resolves to a file outside the presets folder
    outside = tmp_path / "x.yaml"
    outside.write_text("optimizer: {lr: 0.5}\n")
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    with pytest.raises(ConfigError, match=r"config file \.\./\.\./x does not exist"):
        load_config("../../x")
    with pytest.raises(ConfigError, match="neither a config file nor a preset"):
        load_config("x")
    # an explicit YAML path is a path
    assert load_config("../../x.yaml").optimizer.lr == 0.5
    assert load_config(outside).optimizer.lr == 0.5
    with pytest.raises(ConfigError, match=r"config file .*missing\.yaml does not exist"):
        load_config(str(tmp_path / "missing.yaml"))


def test_set_overrides_are_yaml_typed():
    raw = apply_overrides(
        {"trainer": {"max_epochs": 3}},
        [
            "trainer.max_epochs=7",
            "optimizer.lr=1e-4",
            "loss.regularizers.ranksim.weight=100",
            "schedule.milestones=[60, 80]",
            "report.tsne=false",
            "data.options.per_label=5",
        ],
        recipes=get_recipe,
    )
    cfg = config_from_dict(raw)
    assert cfg.trainer.max_epochs == 7
    assert cfg.optimizer.lr == pytest.approx(1e-4)
    assert [(r.name, r.weight) for r in cfg.loss.regularizers] == [("ranksim", 100.0)]
    assert cfg.schedule.milestones == [60, 80]
    assert cfg.report.tsne is False
    assert cfg.data.options == {"per_label": 5}
    with pytest.raises(ConfigError, match="--set expects key=value"):
        apply_overrides({}, ["trainer.max_epochs"], recipes=get_recipe)
    with pytest.raises(ConfigError, match=r"unknown config key `trainer\.max_epoch`"):
        load_config("abalone_vanilla", ["trainer.max_epoch=3"])


def test_set_addresses_list_entries_by_name_or_index():
    cfg = load_config(
        "abalone_ranksim",
        ["loss.regularizers.ranksim.options.interpolation_lambda=3", "loss.regularizers.conr.weight=0.5"],
    )
    assert [r.name for r in cfg.loss.regularizers] == ["ranksim", "conr"]
    assert cfg.loss.regularizers[0].options == {"interpolation_lambda": 3}
    assert cfg.loss.regularizers[0].weight == pytest.approx(0.03)
    assert load_config("abalone_ranksim", ["loss.regularizers.0.weight=2"]).loss.regularizers[0].weight == 2.0
    with pytest.raises(ConfigError, match="no entry 3"):
        load_config("abalone_ranksim", ["loss.regularizers.3.weight=2"])
    assert load_config("abalone_ranksim", ["loss.regularizers=[]"]).loss.regularizers == []


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
    assert cfg.task.lds.reweight == "sqrt_inv" and cfg.run.name == "mine"
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must contain a mapping"):
        load_config(bad)


def test_unknown_preset_suggests():
    with pytest.raises(ConfigError, match=r"neither a config file nor a preset; did you mean 'abalone_lds'"):
        load_config("abalone_ldss")


def test_sections_a_recipe_does_not_read_are_refused():
    with pytest.raises(ConfigError, match=r"`loss` is not used by recipe 'sort'"):
        load_config("large_mnist_neuralsort", ["loss.kind=mse"])
    assert "loss" not in config_to_dict(load_config("large_mnist_neuralsort"))
    assert "loss" in config_to_dict(load_config("abalone_vanilla"))


def test_lds_fds_and_report_keys_from_a_file_and_set(tmp_path):
    """LDS/FDS are options of the recipes that read them (`task`); plots, t-SNE and shot groups are `report`."""
    user = tmp_path / "mine.yaml"
    user.write_text("extends: abalone_lds\ntask: {lds: {sigma: 3.0}}\nreport: {tsne: false}\n")
    cfg = load_config(user, ["task.fds.enabled=true", "report.few_shot=4"])
    assert (cfg.task.lds.reweight, cfg.task.lds.sigma, cfg.task.fds.enabled) == ("sqrt_inv", 3.0, True)
    assert (cfg.report.tsne, cfg.report.few_shot, cfg.report.many_shot) == (False, 4.0, 100.0)
    with pytest.raises(ConfigError, match=r"`task\.fds\.momentum` must be <= 1, got 5\.0"):
        load_config("abalone_vanilla", ["task.fds.momentum=5"])
    with pytest.raises(ConfigError, match=r"unknown config key `task\.lds`; "):
        load_config("large_mnist_neuralsort", ["task.lds.reweight=inverse"])  # sort reads no LDS
    with pytest.raises(ConfigError, match=r"unknown config key `run\.tsne`; "):
        load_config("abalone_vanilla", ["run.tsne=false"])  # `report.tsne`


PRESETS = sorted(list_presets())


def test_preset_list_covers_the_papers():
    descriptions = list_presets()
    names = set(descriptions)
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
    assert all(descriptions[n] for n in names), "every preset has a description"


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_and_validates(name):
    import yaml

    from rankwise.recipes.config import PRESET_DIR

    cfg = load_config(name)
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert isinstance(cfg.task, get_recipe(cfg.recipe).options)
    for reg in cfg.loss.regularizers:
        assert reg.weight >= 0
    raw = yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text())
    assert "recipe" in raw or "extends" in raw, "a preset names its recipe (or inherits it)"


def test_paper_recipes():
    a = load_config("agedb_dir_ranksim")
    assert (a.data.batch_size, a.optimizer.lr, a.model.backbone, a.optimizer.name) == (64, 2.5e-4, "resnet50", "adam")
    (r,) = a.loss.regularizers
    assert (r.name, r.weight, r.options["interpolation_lambda"]) == ("ranksim", 100, 2)
    i = load_config("imdb_wiki_dir_lds_fds")
    assert (i.data.batch_size, i.optimizer.lr, i.trainer.max_epochs) == (256, 1e-3, 90)
    assert i.schedule.kind == "multistep" and i.schedule.milestones == [60, 80] and i.schedule.gamma == 0.1
    assert i.task.lds.reweight == "sqrt_inv" and i.task.lds.lds and i.task.fds.enabled
    s = load_config("sts_b_dir_ranksim")
    assert s.loss.regularizers[0].weight == pytest.approx(3e-4)
    lars = load_config("mnist5k_supcon_lars")
    assert (lars.optimizer.name, lars.optimizer.lr, lars.schedule.interval) == ("lars", 1.0, "step")


def test_options_are_checked_against_the_library():
    with pytest.raises(
        ConfigError,
        match=r"unknown option `loss\.regularizers\.ranksim\.options\.interp_lambda`; "
        r"did you mean 'interpolation_lambda'",
    ):
        load_config("abalone_ranksim", ["loss.regularizers.ranksim.options.interp_lambda=2"])
    with pytest.raises(
        ConfigError, match=r"`loss\.regularizers\.ranksim\.options\.features` is supplied by the recipe"
    ):
        load_config("abalone_ranksim", ["loss.regularizers.ranksim.options.features=2"])
    with pytest.raises(ConfigError, match=r"`loss\.regularizers\.spearman\.options`: .*ranker"):
        load_config("abalone_spearman", ["loss.regularizers.spearman.options.ranker=bogus"])
    with pytest.raises(ConfigError, match=r"loss 'supcon' does not take per-sample predictions and targets"):
        load_config("abalone_vanilla", ["loss.regularizers.supcon.weight=1"])
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
    with pytest.raises(ConfigError, match=r"`loss\.lr` applies to a task loss from the registry"):
        load_config("abalone_vanilla", ["loss.lr=0.1"])
    assert load_config("abalone_vanilla", ["loss.options.beta=0.3", "loss.kind=focal_l1"]).loss.options["beta"] == 0.3


def test_every_field_is_documented():
    """Each field of every section and recipe option carries a one-line description (docs are generated)."""
    for recipe in list_recipes():
        fields = config_fields(recipe)
        assert fields, recipe
        for f in fields:
            assert f.doc and "\n" not in f.doc, f"{recipe}: `{f.key}` has no one-line description"
        keys = {f.key for f in fields}
        assert {"optimizer.lr", "run.seed", "trainer.max_epochs"} <= keys
        assert ("loss.kind" in keys) == ("loss" in get_recipe(recipe).uses)
        task = get_recipe(recipe).options
        for name in task.model_fields:  # a nested section (task.lds) is documented field by field
            assert any(k == f"task.{name}" or k.startswith(f"task.{name}.") for k in keys), (recipe, name)
    lr = next(f for f in config_fields() if f.key == "optimizer.lr")
    assert (lr.type, lr.default, lr.range) == ("float", 1e-3, "> 0")
    assert any(f.key == "loss.regularizers[].weight" for f in config_fields("dir"))


def test_lr_schedule_formula():
    from rankwise.recipes.config import ScheduleConfig
    from rankwise.recipes.optim import lr_factor

    # multistep in epochs (4 steps per epoch), 1 epoch of per-step warm-up
    s = ScheduleConfig(kind="multistep", milestones=[2, 4], gamma=0.1, warmup_epochs=1)
    f = [lr_factor(step, s, total_steps=24, epochs=6) for step in range(24)]
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f[4:8] == pytest.approx([1.0] * 4) and f[8:16] == pytest.approx([0.1] * 8)
    assert f[16:] == pytest.approx([0.01] * 8)
    # cosine per epoch over the ACTUAL number of epochs (no warm-up): the formula of the DIR recipes
    c = ScheduleConfig(kind="cosine")
    got = [lr_factor(step, c, total_steps=12, epochs=4) for step in range(0, 12, 3)]
    assert got == [0.5 * (1 + math.cos(math.pi * e / 4)) for e in range(4)]
    # per step after a warm-up (the SupCon presets)
    st = ScheduleConfig(kind="cosine", warmup_epochs=1, interval="step")
    got = [lr_factor(step, st, total_steps=10, epochs=5) for step in range(10)]
    assert got[:2] == [0.5, 1.0]
    assert got[2:] == [0.5 * (1 + math.cos(math.pi * min(s - 2, 8) / 8)) for s in range(2, 10)]


def test_half_precision_refuses_an_adam_eps_that_float16_cannot_hold():
    import torch

    from rankwise.recipes.optim import build_optimizer

    with pytest.raises(ConfigError, match=r"`optimizer\.eps` 1e-08 is below the smallest normal float16"):
        config_from_dict({"trainer": {"precision": "16-true"}})
    with pytest.raises(ConfigError, match=r"adamw's state in float16"):
        config_from_dict({"trainer": {"precision": "16-true"}, "optimizer": {"name": "adamw", "eps": 1e-6}})
    config_from_dict({"trainer": {"precision": "16-true"}, "optimizer": {"name": "sgd"}})
    config_from_dict({"trainer": {"precision": "16-mixed"}})
    cfg = config_from_dict({"trainer": {"precision": "16-true"}, "optimizer": {"eps": 1e-4}})
    # the mechanism: a float16 weight whose gradient squares to 0 in float16 steps to inf / nan with eps=1e-8
    for eps, finite in ((1e-8, False), (cfg.optimizer.eps, True)):
        w = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
        opt = build_optimizer([w], cfg.optimizer.model_copy(update={"eps": eps}))
        w.grad = torch.full_like(w, 1e-4)
        opt.step()
        assert bool(torch.isfinite(w).all()) is finite


@pytest.mark.parametrize(
    "preset", ["large_mnist_diffsort_bitonic", "large_mnist_median_stochastic", "mnist5k_dknn", "mnist5k_smooth_ap"]
)
def test_a_step_budget_recipe_refuses_max_epochs_it_would_ignore(preset):
    from rankwise.recipes import ConfigError, load_config

    assert load_config(preset).trainer.max_epochs == 10  # the default, which the recipe does not read
    with pytest.raises(ConfigError, match=r"`trainer.max_epochs` is not read by recipe .*set those instead"):
        load_config(preset, ["trainer.max_epochs=1"])
