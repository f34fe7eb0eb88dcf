"""The stage lifecycle (``rankwise.recipes.stages``): done markers, skipped stages, resume across stages,
run directories laid out before the lifecycle owned the stages, and the lifecycle modules knowing no recipe."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("lightning")
pytest.importorskip("sklego")

import torch

from rankwise.recipes import load_config
from rankwise.recipes.rundir import load_state_dict
from rankwise.recipes.runner import evaluate, train
from rankwise.recipes.stages import read_done, write_done
from tests.recipes._faults import NaNAtStep
from tests.recipes.test_recipe_training import TINY

SRC = Path(__file__).resolve().parents[2] / "src" / "rankwise" / "recipes"
#: RnC at a tiny budget: 1 pretraining epoch, 3 regressor epochs of 3 steps
RNC = [*TINY, "trainer.max_epochs=3", "task.pretrain_epochs=1"]


@pytest.fixture(scope="module")
def abalone():
    from rankwise.data import get_dataset

    return get_dataset("abalone", per_label=10, seed=0)


def test_done_markers(tmp_path):
    assert read_done(tmp_path / "done") is None  # no marker: the stage has not finished
    for text in ("ok", "[1.0]", '{"epoch_seconds": "x"}', '{"epoch_seconds": [true]}'):
        (tmp_path / "done").write_text(text)  # not a marker rankwise writes: the stage is trained again
        assert read_done(tmp_path / "done") is None
    write_done(tmp_path / "stage" / "done", [1.5, 2.0])
    assert json.loads((tmp_path / "stage" / "done").read_text()) == {"epoch_seconds": [1.5, 2.0]}
    assert read_done(tmp_path / "stage" / "done") == [1.5, 2.0]


def test_rnc_writes_a_marker_per_stage_and_hands_the_pretrained_encoder_on(tmp_path, abalone):
    res = train(load_config("abalone_rnc", RNC), out=tmp_path / "run", progress=False, verbose=False, data=abalone)
    d = res.run_dir
    assert len(read_done(d / "pretrain" / "done") or []) == 1  # one pretraining epoch, timed
    assert len(read_done(d / "checkpoints" / "done") or []) == 3
    assert (d / "logs" / "pretrain" / "metrics.csv").is_file() and (d / "logs" / "metrics.csv").is_file()
    pre, final = load_state_dict(d / "pretrain" / "last.ckpt"), load_state_dict(d / "checkpoints" / "best.ckpt")
    backbone = [k for k in pre if k.startswith("backbone.") and pre[k].is_floating_point()]
    assert backbone and all(torch.equal(pre[k], final[k]) for k in backbone)


def test_a_finished_run_and_a_stopped_one_resume_like_an_uninterrupted_run(tmp_path, abalone):
    cfg = load_config("abalone_rnc", RNC)
    ref = train(cfg, out=tmp_path / "ref", progress=False, verbose=False, data=abalone)

    # a finished run: evaluated, and resumed (nothing left to train), to the same metrics
    done = tmp_path / "done"
    shutil.copytree(ref.run_dir, done, ignore=shutil.ignore_patterns(".lock"))
    (done / "metrics.json").unlink()
    got = evaluate(done, plots=False)
    assert got["test"] == ref.metrics["test"] and got["val"] == ref.metrics["val"]
    resumed = train(cfg, out=done, resume=True, progress=False, verbose=False, data=abalone)
    assert resumed.metrics["test"] == ref.metrics["test"]

    # stopped in epoch 1 of the regressor stage (its weights diverged at step 4; epoch 0 = steps 0..2)
    stopped = tmp_path / "stopped"
    with pytest.raises(Exception, match="became nan"):
        train(cfg, out=stopped, progress=False, verbose=False, data=abalone, callbacks=[NaNAtStep(4)])
    assert torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 0
    marker = (stopped / "pretrain" / "done").read_text()
    pretrained = (stopped / "pretrain" / "last.ckpt").stat().st_mtime_ns
    res = train(cfg, out=stopped, resume=True, progress=False, verbose=False, data=abalone)
    assert (stopped / "pretrain" / "last.ckpt").stat().st_mtime_ns == pretrained  # the finished stage was skipped
    assert (stopped / "pretrain" / "done").read_text() == marker
    assert res.metrics["test"] == ref.metrics["test"] and res.metrics["val"] == ref.metrics["val"]
    ref_state = load_state_dict(ref.run_dir / "checkpoints" / "last.ckpt")
    state = load_state_dict(stopped / "checkpoints" / "last.ckpt")
    assert all(torch.equal(state[k], ref_state[k]) for k in ref_state)


def _string_constants(path: Path) -> set[str]:
    """String literals of a module's code (docstrings left out)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    }


@pytest.mark.parametrize("module", ["rundir", "runner", "config", "stages"])
def test_the_lifecycle_names_no_recipe_and_no_recipe_stage(module):
    from rankwise.recipes import Config, list_recipes

    # the default of `recipe:` is the one recipe name the config layer holds
    names = (set(list_recipes()) - {Config.model_fields["recipe"].default}) | {"probe", "pretrain", "stage1"}
    # a module, or a package of modules
    files = [SRC / f"{module}.py"] if (SRC / f"{module}.py").exists() else sorted((SRC / module).glob("*.py"))
    assert files, module
    for path in files:
        found = {s for s in _string_constants(path) if s in names or any(f"/{n}" in s for n in names)}
        assert not found, f"{path.name} names {sorted(found)}"


def test_no_recipe_module_imports_another():
    from tests.test_import_graph import import_graph

    # a recipe module registers its recipes (module-level `register_recipe(...)` calls); it may sit in a
    # subpackage of its own (rankwise.recipes.brain_age.recipe)
    recipe_modules = {
        ".".join(("rankwise.recipes", *p.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")
        for p in SRC.rglob("*.py")
        if any(
            isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Call)
            and getattr(n.value.func, "id", "") == "register_recipe"
            for n in ast.parse(p.read_text()).body
        )
    }
    assert len(recipe_modules) == 9
    assert {
        "rankwise.recipes.regression.rnc",
        "rankwise.recipes.topk",
        "rankwise.recipes.brain_age.recipe",
    } <= recipe_modules
    graph = import_graph()
    crossing = {m: sorted(graph[m] & (recipe_modules - {m})) for m in recipe_modules}
    assert not any(crossing.values()), crossing


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "a/b"}, "`name` must be a folder name"),
        ({"name": ".."}, "`name` must be a folder name"),
        ({"epochs": 0}, r"`epochs` must be an int >= 1, got 0"),
        ({"mode": "up"}, "`mode` must be 'min' or 'max'"),
        ({"hand_on": "first"}, "`hand_on` must be 'best', 'last' or None"),
        ({"best": False}, "keeps no best.ckpt to hand on"),
        ({"local": True}, "keeps no best.ckpt to hand on"),
    ],
)
def test_a_stage_refuses_what_the_lifecycle_cannot_do(kwargs, match):
    from rankwise.recipes.stages import Stage

    with pytest.raises(ValueError, match=match):
        Stage(**{"name": "s", "module": None, "data": None, **kwargs})
    assert Stage("s", None, None, best=False, hand_on="last").hand_on == "last"


def test_a_finished_stage_given_more_epochs_continues_on_resume(tmp_path, abalone):
    import yaml

    run = tmp_path / "run"
    cfg1 = load_config("abalone_vanilla", [*TINY, "trainer.max_epochs=1"])
    train(cfg1, out=run, progress=False, verbose=False, data=abalone)
    assert len(read_done(run / "checkpoints" / "done") or []) == 1
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["trainer"]["max_epochs"] = 2  # the user extends the finished run
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    train(None, out=run, resume=True, progress=False, verbose=False, data=abalone)
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert (ckpt["epoch"], ckpt["global_step"]) == (1, 6)  # 3 steps per epoch
    assert len(read_done(run / "checkpoints" / "done") or []) == 1  # the epoch trained by the resumed process
    # resumed again with nothing left to train: skipped, same weights
    train(None, out=run, resume=True, progress=False, verbose=False, data=abalone)
    again = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert again["global_step"] == 6


def _numbers(obj, prefix=""):
    """The numbers of a metrics.json section by dotted key (timings left out)."""
    if isinstance(obj, dict):
        return {
            k: v
            for key, val in obj.items()
            if "seconds" not in key
            for k, v in _numbers(val, f"{prefix}{key}.").items()
        }
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return {prefix.rstrip("."): float(obj)}
    return {}


def _assert_same_metrics(got: dict, ref: dict) -> None:
    for section in ("test", "val"):
        a, b = _numbers(got.get(section, {})), _numbers(ref.get(section, {}))
        assert a and a.keys() == b.keys(), section
        assert a == pytest.approx(b, rel=1e-6, abs=1e-9), section


def _killed_at_stage_then_resumed(tmp_path, kind, preset, sets, first, ref):
    from tests.recipes.test_recipe_training import _cli, _cli_with_fault

    run = tmp_path / kind
    killed = _cli_with_fault(kind, 2, preset, run, sets)  # as the second stage starts
    assert killed.returncode == (-9 if kind == "kill-stage" else 143), killed.stderr[-2000:]
    assert (run / first / "done").is_file() and not (run / "checkpoints" / "last.ckpt").exists()
    resumed = _cli(["train", preset, "--out", str(run), "--resume", "--no-progress"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_metrics(json.loads((run / "metrics.json").read_text()), ref)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["kill-stage", "term-stage"])
def test_rnc_killed_between_its_stages_resumes_to_the_uninterrupted_metrics(tmp_path, abalone, kind):
    ref = train(load_config("abalone_rnc", RNC), out=tmp_path / "ref", progress=False, verbose=False, data=abalone)
    _killed_at_stage_then_resumed(tmp_path, kind, "abalone_rnc", RNC, "pretrain", ref.metrics)
