"""Hostile configs, checkpoints, data files and flags through the CLI, each under a time limit.

Every case must end with a one-line ``error: ...`` naming the file/key and the documented exit
status (2 for a user error, 130 for Ctrl-C), never a traceback, a hang or a silent success.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("typer")
pytest.importorskip("lightning")
pytest.importorskip("sklego")

import torch
from typer.testing import CliRunner

from rankwise.cli import app
from tests.cli_helpers import TINY
from tests.cli_helpers import one_error_line as one_error

runner = CliRunner()


class _TimeLimit(BaseException):
    """Raised by SIGALRM when a command runs past its time limit (a hang)."""


def invoke(args, seconds=120):
    """``rankwise ARGS`` in process (typer's runner), stopped with a failure after ``seconds``."""

    def on_alarm(signum, frame):
        raise _TimeLimit(f"rankwise {' '.join(map(str, args))[:200]} ran for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _sets(extra=()):
    return [a for s in [*TINY, *extra] for a in ("--set", s)]


def _alias_bomb(levels=9, width=10, indent=""):
    lines = [f"{indent}l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ item 7: YAML size and depth


def test_alias_bomb_in_a_config_file_is_refused_at_once(tmp_path):
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text("extends: abalone_vanilla\ndata:\n  options:\n" + _alias_bomb(indent="    "))
    t0 = time.perf_counter()
    line = one_error(invoke(["train", cfg, "--out", tmp_path / "r"], seconds=60))
    assert "alias" in line and str(cfg) in line
    assert time.perf_counter() - t0 < 30


def test_alias_bomb_in_an_extended_file_and_in_a_set_value(tmp_path):
    parent = tmp_path / "parent.yaml"
    parent.write_text("recipe: dir\nrun:\n  name: x\nbomb:\n" + _alias_bomb(indent="  "))
    child = tmp_path / "child.yaml"
    child.write_text("extends: parent.yaml\n")
    line = one_error(invoke(["train", child, "--out", tmp_path / "r"], seconds=60))
    assert "alias" in line and "parent.yaml" in line
    value = "{" + _alias_bomb().strip().replace("\n", ", ") + "}"
    line = one_error(invoke(["train", "abalone_vanilla", "--set", f"data.options.x={value}"], seconds=60))
    assert "--set data.options.x" in line and "alias" in line


def test_deep_yaml_is_refused_with_one_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("recipe: dir\nx: " + "[" * 5000 + "]" * 5000 + "\n")
    line = one_error(invoke(["train", deep], seconds=60))
    assert "nested deeper" in line and str(deep) in line
    line = one_error(
        invoke(["train", "abalone_vanilla", "--set", "data.options.x=" + "{a: " * 3000 + "1" + "}" * 3000])
    )
    assert "nested deeper" in line


def test_recursive_alias_and_python_tags_are_refused(tmp_path):
    rec = tmp_path / "rec.yaml"
    rec.write_text("recipe: dir\nx: &a [*a]\n")
    assert "recursive alias" in one_error(invoke(["train", rec]))
    marker = tmp_path / "pwned"
    tag = tmp_path / "tag.yaml"
    tag.write_text(f"recipe: !!python/object/apply:os.system ['touch {marker}']\n")
    line = one_error(invoke(["train", tag]))
    assert "invalid YAML" in line and "line 1" in line
    assert not marker.exists()


# ------------------------------------------------------------------------------ item 8: one-line user errors


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("model.options.hidden=-3", "model.options"),
        ("model.options.hidden=[abc]", "model.options"),
        ("model.options.hidden=[100000000000]", "too large"),
        ("trainer.strategy=bogus", "trainer"),
    ],
)
def test_model_and_trainer_errors_are_user_errors(tmp_path, override, needle):
    line = one_error(invoke(["train", "abalone_vanilla", *_sets([override]), "--out", tmp_path / "r", "--no-progress"]))
    assert needle in line


def test_invalid_relaxation_options_in_a_preset(tmp_path):
    cfg = tmp_path / "sink.yaml"
    cfg.write_text("extends: large_mnist_sinkhorn\ntask:\n  options:\n    epsilon: -1\n")
    line = one_error(invoke(["train", cfg, "--out", tmp_path / "r"]))
    assert "sinkhorn" in line and "epsilon" in line


def _fake_run_dir(path, metrics_text):
    """A run directory as `rankwise train` leaves it, without training (config + meta + metrics)."""
    import yaml

    from rankwise.recipes import load_config
    from rankwise.recipes.config import config_to_dict

    path.mkdir(parents=True)
    cfg = load_config("abalone_vanilla", ["report.plots=false"])
    (path / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg)))
    (path / "meta.json").write_text(json.dumps({"rankwise_version": "0", "status": "completed"}))
    (path / "metrics.json").write_text(metrics_text)
    return path


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"recipe": "dir"}', "\xff\xfe"])
def test_compare_over_a_run_with_a_corrupt_metrics_file(tmp_path, text):
    run = _fake_run_dir(tmp_path / "run", text)
    line = one_error(invoke(["compare", run, "--out", tmp_path / "cmp"]))
    assert str(run / "metrics.json") in line


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "run"
    r = invoke(["train", "abalone_vanilla", *_sets(), "--out", out, "--no-progress"], seconds=300)
    assert r.exit_code == 0, r.output
    return out


def _copy(trained, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(trained, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def _hostile_checkpoints(good):
    state = good["state_dict"]
    first = next(iter(state))
    return {
        "plain dict": {"weights": torch.zeros(3)},
        "list": [torch.zeros(3)],
        "missing key": {**good, "state_dict": {k: v for k, v in state.items() if k != first}},
        "wrong shape": {**good, "state_dict": {**state, first: torch.zeros(7, 7)}},
        "no optimizer state": {k: v for k, v in good.items() if k != "optimizer_states"},
        "integer weights": {**good, "state_dict": {k: v.long() for k, v in state.items()}},
        "NaN weights": {
            **good,
            "state_dict": {
                k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state.items()
            },
        },
    }


@pytest.mark.parametrize(
    "kind", ["plain dict", "list", "missing key", "wrong shape", "no optimizer state", "integer weights", "NaN weights"]
)
def test_resume_and_evaluate_refuse_a_checkpoint_of_the_wrong_structure(trained, tmp_path, kind):
    run = _copy(trained, tmp_path)
    last, best = run / "checkpoints" / "last.ckpt", run / "checkpoints" / "best.ckpt"
    bad = _hostile_checkpoints(torch.load(last, weights_only=True))[kind]
    torch.save(bad, last)
    line = one_error(invoke(["train", "--resume", "--out", run, "--no-progress", "abalone_vanilla"]))
    assert str(last) in line
    if kind != "no optimizer state":  # evaluation needs the weights only
        torch.save(bad, best)
        line = one_error(invoke(["evaluate", run, "--no-plots", "--checkpoint", "best"]))
        assert str(best) in line


# ------------------------------------------------------------------------------ item 9: no tracebacks


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["data", "show", "abalone", "-O", "path=[unclosed"], "--option path"),
        (["data", "show", "abalone", "-O", "path=!!python/object:os.system x"], "--option path"),
        (["train", "abalone_vanilla", "--devices", "0,,x"], "--devices"),
        (["sodeep", "train", "--seq-len", "0", "--steps", "1"], "seq_len"),
        (["sodeep", "train", "--model", "bogus", "--steps", "1"], "model"),
        (["sodeep", "train", "--threads", "0", "--steps", "1"], "num_threads"),
        (["sodeep", "train", "--eval-num", "0", "--steps", "1"], "eval_num"),
        (["sodeep", "evaluate", "--num", "0", "--no-real"], "num"),
        (["compare", "abalone_vanilla", "--seeds", "0-100000000000"], "--seeds"),
        (["compare", "abalone_vanilla", "--seeds", "3-1"], "--seeds"),
    ],
)
def test_flags_that_showed_a_traceback(tmp_path, args, needle):
    assert needle in one_error(invoke(args))


def test_plot_into_a_missing_folder_or_proc(tmp_path):
    line = one_error(invoke(["data", "show", "abalone", "--plot", tmp_path / "nope" / "h.png"]))
    assert "does not exist" in line and str(tmp_path / "nope") in line
    line = one_error(invoke(["data", "show", "abalone", "--plot", "/proc/h.png"]))
    assert "/proc" in line


# ------------------------------------------------------------------------------ item 10: silent acceptance


def test_empty_config_and_decimal_strings(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    assert "is empty" in one_error(invoke(["train", empty, "--out", tmp_path / "r"]))
    assert not (tmp_path / "r").exists()
    line = one_error(invoke(["train", "abalone_vanilla", "--set", 'optimizer.lr="1_0"', "--out", tmp_path / "r"]))
    assert "optimizer.lr" in line


def test_resume_with_overwrite_is_refused(trained, tmp_path):
    run = _copy(trained, tmp_path)
    before = sorted(p.name for p in run.rglob("*"))
    line = one_error(invoke(["train", "abalone_vanilla", "--resume", "--overwrite", "--out", run]))
    assert "--resume and --overwrite" in line
    assert sorted(p.name for p in run.rglob("*")) == before


@pytest.mark.parametrize("target", ["/dev/zero", "dir"])
def test_resume_refuses_a_last_checkpoint_that_is_not_a_regular_file(trained, tmp_path, target):
    run = _copy(trained, tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    last.unlink()
    if target == "dir":
        last.mkdir()
    else:
        last.symlink_to(target)
    line = one_error(invoke(["train", "abalone_vanilla", "--resume", "--out", run, "--no-progress"]))
    assert str(last) in line


def test_plot_onto_an_existing_directory(tmp_path):
    folder = tmp_path / "plots"
    folder.mkdir()
    assert "is a directory" in one_error(invoke(["data", "show", "abalone", "--plot", folder]))
    assert list(folder.iterdir()) == []


def _csv(path, text):
    path.write_text(text)
    return path


def test_unterminated_quote_in_a_csv(tmp_path):
    rows = ["x,y"] + [f"{i},{i % 7}" for i in range(60)]
    rows[30] = '"30,2'
    data = _csv(tmp_path / "q.csv", "\n".join(rows) + "\n")
    line = one_error(invoke(["data", "show", "csv", "-O", f"path={data}", "-O", "target=y"]))
    assert str(data) in line and "row 31" in line and "quote" in line


# ------------------------------------------------------------------------------ item 11: size and width


def test_a_million_columns_is_refused_quickly(tmp_path):
    header = ",".join(f"c{i}" for i in range(10**6)) + ",y"
    data = _csv(tmp_path / "wide.csv", header + "\n" + ",".join(["1"] * (10**6 + 1)) + "\n")
    line = one_error(invoke(["data", "show", "csv", "-O", f"path={data}", "-O", "target=y"], seconds=60))
    assert "100,000 columns" in line and str(data) in line


def test_column_lookups_are_linear(tmp_path):
    from rankwise.data import load_csv

    n = 60_000  # the old list-membership test took minutes at this width
    names = [f"c{i}" for i in range(n)]
    rng = np.random.default_rng(0)
    rows = [",".join([*names, "y"])] + [",".join(["1"] * n + [str(v)]) for v in rng.integers(0, 50, 40)]
    data = _csv(tmp_path / "wide.csv", "\n".join(rows) + "\n")
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(_TimeLimit("load_csv took more than 60 s")))
    signal.alarm(60)
    try:
        d = load_csv(data, target="y", standardize_features=False)
    finally:
        signal.alarm(0)
    assert d.input_dim == n and d.meta["feature_names"][-1] == f"c{n - 1}"


def test_gzip_bomb_and_sparse_file_are_refused_before_reading(tmp_path):
    bomb = tmp_path / "bomb.csv.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        fh.write(b"x,y\n")
        chunk = b"1,2\n" * 2**20
        for _ in range(300):  # 1.2 GiB decompressed, about 1 MiB on disk
            fh.write(chunk)
    line = one_error(invoke(["data", "show", "csv", "-O", f"path={bomb}", "-O", "target=y"], seconds=60))
    assert "limit" in line and str(bomb) in line
    sparse = tmp_path / "sparse.csv"
    with open(sparse, "wb") as fh:
        fh.truncate(20 * 2**30)
    line = one_error(invoke(["data", "show", "csv", "-O", f"path={sparse}", "-O", "target=y"], seconds=60))
    assert "limit" in line and str(sparse) in line


# ------------------------------------------------------------------------------ item 12: resume without last.ckpt


def test_resume_refuses_when_only_best_checkpoint_remains(trained, tmp_path):
    run = _copy(trained, tmp_path)
    (run / "checkpoints" / "last.ckpt").unlink()
    line = one_error(invoke(["train", "abalone_vanilla", "--resume", "--out", run, "--no-progress"]))
    assert "last.ckpt" in line and "best.ckpt" in line
    assert json.loads((run / "metrics.json").read_text())["test"]  # the finished run is untouched


# ------------------------------------------------------------------------------ item 13: Ctrl-C


def test_ctrl_c_exits_130_with_an_interrupted_line(tmp_path):
    out = tmp_path / "run"
    import rankwise

    env = {**os.environ, "PYTHONPATH": str(Path(rankwise.__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "rankwise.cli", "train", "abalone_vanilla", "--out", str(out), "--no-progress"]
    cmd += _sets(["trainer.max_epochs=1000", "trainer.limit_train_batches=2"])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.time() + 240
        while not (out / "checkpoints" / "last.ckpt").is_file():
            assert proc.poll() is None and time.time() < deadline, "the run did not start"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    assert proc.returncode == 130, output
    errors = [ln for ln in output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "interrupted" in errors[0], output
    assert "Traceback" not in output
    assert json.loads((out / "meta.json").read_text())["status"] == "failed"


# ------------------------------------------------------------------------------ item 14: honest messages


def test_extends_names_what_the_target_is(tmp_path):
    (tmp_path / "folder").mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, needle in (
        ("folder", "is a directory"),
        ("/dev/zero", "not a regular file"),
        ("fifo", "not a regular"),
    ):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"extends: {target}\n")
        line = one_error(invoke(["train", cfg], seconds=30))
        assert needle in line and "does not exist" not in line


def test_truncated_zip_and_unlisted_file_content(tmp_path):
    good = tmp_path / "good.zip"
    with zipfile.ZipFile(good, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("data.csv", "x,y\n" + "".join(f"{i},{i}\n" for i in range(500)))
    cut = tmp_path / "cut.zip"
    cut.write_bytes(good.read_bytes()[:300])
    line = one_error(invoke(["data", "show", "csv", "-O", f"path={cut}", "-O", "target=y"]))
    assert "zip" in line and "UTF-8" not in line
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$SECRETHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    for args in (
        ["data", "show", "csv", "-O", f"path={secret}", "-O", "target=y"],
        ["train", "abalone_vanilla", "--set", "data.name=csv", "--set", f"data.options={{path: {secret}, target: y}}"],
        ["train", "abalone_vanilla", "--set", f"data.options.path={secret}"],
    ):
        line = one_error(invoke([*args]))
        assert "SECRETHASH" not in line and "daemon" not in line and "19000" not in line


def test_plot_path_without_suffix_reports_the_written_file(tmp_path):
    r = invoke(["data", "show", "abalone", "--plot", tmp_path / "hist"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "hist.png").is_file()
    assert f"histogram: {tmp_path / 'hist.png'}" in r.output


def test_fit_label_gmm_numpy_ints_and_huge_labels():
    from rankwise.imbalanced import fit_label_gmm

    y = torch.cat([torch.zeros(50), torch.full((50,), 10.0)]) + torch.linspace(-1, 1, 100)
    means, covs, _ = fit_label_gmm(y, n_components=np.int64(2))
    assert sorted(means.flatten().tolist()) == pytest.approx([-0.50505, 10.50505], abs=1e-3)
    # labels of 1e150: the same mixture, scaled (their squares overflow float64 inside EM)
    m2, c2, _ = fit_label_gmm(y.double() * 1e150, n_components=2)
    assert sorted((m2.flatten() / 1e150).tolist()) == pytest.approx(sorted(means.flatten().tolist()), rel=1e-3)
    assert (c2.flatten() / 1e300).tolist() == pytest.approx(covs.flatten().tolist(), rel=1e-2)
    with pytest.raises(ValueError, match="rescale the labels"):
        fit_label_gmm(y.double() * 1e200, n_components=2)


# ------------------------------------------------------------------------------ item 15: overflowing targets


@pytest.mark.parametrize("scale", [3e38, -3e38, 1e20])
def test_targets_that_overflow_the_training_dtype_are_refused_before_training(tmp_path, scale):
    rng = np.random.default_rng(0)
    x = rng.random(300)
    rows = ["x,y"] + [f"{a:.4f},{b:.6e}" for a, b in zip(x, scale * rng.random(300))]
    data = _csv(tmp_path / "big.csv", "\n".join(rows) + "\n")
    out = tmp_path / "r"
    args = ["train", "abalone_vanilla", *_sets(["data.name=csv", f"data.options={{path: {data}, target: y}}"])]
    line = one_error(invoke([*args, "--out", out]))
    assert "rescale the target" in line
    assert not (out / "checkpoints").exists()


# ------------------------------------------------------------------------------ a diverged run's plots


@pytest.mark.parametrize("features", ["zeros", "nan"])
def test_tsne_of_a_dead_or_diverged_network_does_not_crash(tmp_path, features):
    """`optimizer.lr=1000` kills every ReLU of abalone's MLP: constant features made scikit-learn's
    t-SNE crash the process (SIGSEGV) after training; run in a subprocess, which a crash cannot take down."""
    import rankwise

    code = (
        "import numpy as np; from rankwise.recipes.reports import plot_tsne; "
        f"f = np.{'zeros' if features == 'zeros' else 'full'}((200, 8){', np.nan' if features == 'nan' else ''}); "
        f"p = plot_tsne(f, np.arange(200.0), {str(tmp_path / 't.png')!r}); print(p)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(rankwise.__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "t.png").is_file()


def test_sigterm_stops_compare_at_once_with_143(tmp_path):
    """SIGTERM during a compare's training: one `error:` line, exit 143, and the process gone at once
    (not after the seconds that tearing down an interpreter holding torch and Lightning takes)."""
    out = tmp_path / "cmp"
    import rankwise

    env = {**os.environ, "PYTHONPATH": str(Path(rankwise.__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "rankwise.cli", "compare", "abalone_vanilla", "abalone_lds", "--seeds", "0,1"]
    cmd += ["--out", str(out), *_sets(["trainer.max_epochs=1000", "trainer.limit_train_batches=2"])]
    # the output goes to a file, not a pipe: a pipe nobody reads until the end could fill and block the
    # process in a write, which would be timed here as a slow exit
    log = tmp_path / "compare.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, env=env)
    run = out / "runs" / "abalone_vanilla" / "seed0"
    try:
        deadline = time.time() + 240
        while not (run / "checkpoints" / "last.ckpt").is_file():
            assert proc.poll() is None and time.time() < deadline, "the first run did not start"
            time.sleep(0.2)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None and time.perf_counter() - t0 < 60:
            time.sleep(0.02)
        took = time.perf_counter() - t0
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    output = log.read_text()
    assert proc.returncode == 143, output
    errors = [ln for ln in output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "terminated by signal SIGTERM" in errors[0], output
    assert "Traceback" not in output
    assert json.loads((run / "meta.json").read_text())["status"] == "failed"
    assert not (out / "runs" / "abalone_lds").exists()  # no further run was started
    assert took < 5, f"the process took {took:.1f} s to exit after SIGTERM; its output:\n{output[-3000:]}"


def test_set_into_a_scalar_section_is_refused(tmp_path):
    cfg = tmp_path / "scalar.yaml"
    cfg.write_text("extends: abalone_vanilla\ntrainer: 3\n")
    line = one_error(invoke(["train", cfg, *_sets(), "--out", tmp_path / "run", "--no-progress"]))
    assert "`trainer` is int 3" in line
    assert not (tmp_path / "run").exists()


def test_train_without_a_config_or_data_asks_for_one_and_both_is_refused(tmp_path):
    line = one_error(invoke(["train", "--resume", "--out", str(tmp_path / "run")]))
    assert "give a config (a preset name or YAML file) or --data FILE --target COLUMN" in line
    assert "not both" not in line  # none was given
    line = one_error(invoke(["train", "abalone_vanilla", "--data", str(tmp_path / "x.csv"), "--target", "y"]))
    assert "not both" in line


def test_set_values_are_read_by_yaml_1_2_and_saved_to_read_back(tmp_path):
    from rankwise.recipes.config import load_raw

    run = tmp_path / "run"
    args = ["train", "abalone_vanilla", *_sets(["run.seed=010", "run.name=no"]), "--out", run, "--no-progress"]
    r = invoke(args)
    assert r.exit_code == 0, r.output
    text = (run / "config.yaml").read_text()
    assert "name: 'no'" in text and "seed: 10" in text
    saved = load_raw(run / "config.yaml")
    assert (saved["run"]["name"], saved["run"]["seed"]) == ("no", 10)
    line = one_error(invoke(["train", "abalone_vanilla", "--set", "trainer.max_epochs=1:30", "--out", tmp_path / "b"]))
    assert "`trainer.max_epochs` must be an integer, got '1:30'" in line
    line = one_error(invoke(["train", "abalone_vanilla", "--set", "report.plots=yes", "--out", tmp_path / "b"]))
    assert "`report.plots` must be true or false, got 'yes'" in line
    assert not (tmp_path / "b").exists()
