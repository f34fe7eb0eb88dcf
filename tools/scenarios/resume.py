"""Resume: a run stopped at a stage boundary or mid-stage and continued with ``--resume`` reproduces the
uninterrupted run, keeps every row of its logs, and refuses (or reports in one line) the edits it cannot
honour."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from . import _harness as H
from ._harness import Context, Hang, Result, expect_refusal, expect_success, scenario

#: RnC with a long regressor epoch (batch 8: hundreds of steps) so that a kill right after the
#: pretraining stage's ``done`` marker lands before the regressor's first checkpoint
RNC = ("task.pretrain_epochs=1", "trainer.max_epochs=2", "data.batch_size=8")
#: TSAN on a tiny synthetic cohort: 1 + 2 epochs
TSAN = (
    "model.options={nb_filter: 4, nb_block: 2, use_sex: true}",
    "data.options.shape=null",
    "data.batch_size=4",
    "trainer.max_epochs=1",
    "task.stage2_epochs=2",
    "trainer.num_threads=1",
    "run.plots=false",
)


def _sets(sets: tuple[str, ...] | list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def _leaves(obj: Any, prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics.json (times left out), by dotted key."""
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if "seconds" not in str(k):
                out |= _leaves(v, f"{prefix}{k}.")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix.rstrip(".")] = float(obj)
    return out


def _compare(a: Path, b: Path) -> tuple[str, str]:
    ma, mb = (_leaves(json.loads((p / "metrics.json").read_text()).get("test", {})) for p in (a, b))
    diff = [k for k in ma if k not in mb or not H.same([ma[k]], [mb[k]])]
    if not ma or diff or ma.keys() != mb.keys():
        k = (diff or ["(keys)"])[0]
        return "silent_wrong", f"test metrics differ from the uninterrupted run, e.g. {k}: {ma.get(k)} vs {mb.get(k)}"
    return "ok", f"{len(ma)} test metrics equal to the uninterrupted run (1e-6)"


def _train_killed_when(ctx: Context, marker: Path, sig: int, *args: str | Path, timeout: float = 300) -> Result:
    """``rankwise train ARGS --no-progress`` killed (process group, ``sig``) as soon as ``marker`` exists."""
    argv = [sys.executable, "-m", "rankwise.cli", "train", *map(str, args), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": H.SRC, "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    p = subprocess.Popen(
        argv,
        cwd=ctx.dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
    )
    while p.poll() is None:
        time.sleep(0.01)
        if marker.exists():
            os.killpg(p.pid, sig)
            break
        if time.time() - t0 > timeout:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise Hang(f"{' '.join(argv[3:])} ran past {timeout:.0f} s")
    out, err = p.communicate()
    return Result([*map(str, args)], p.returncode, out, err, time.time() - t0)


def _killed_then_resumed(
    ctx: Context, config: str, sets: list[str], stage_done: str, next_ckpt: str, sig: int
) -> tuple[str, str]:
    ref, run = ctx.dir / "ref", ctx.dir / "run"
    bad = expect_success(ctx.train(config, "--out", ref, *_sets(sets), tiny=False))
    if bad:
        return bad
    res = _train_killed_when(ctx, run / stage_done, sig, config, "--out", run, *_sets(sets))
    if res.rc == 0:
        return "crash", "the run finished before the kill: the story did not test the boundary"
    if (run / next_ckpt).exists():
        return "crash", f"the kill came after {next_ckpt}: not at the stage boundary"
    bad = expect_success(ctx.train(config, "--resume", "--out", run, tiny=False))
    return bad or _compare(run, ref)


def _rnc_sets() -> list[str]:
    return [*H.TINY, *RNC]


def _cohort(ctx: Context) -> list[str] | tuple[str, str]:
    cohort = ctx.dir / "cohort"
    res = ctx.rankwise("data", "make", "brain-age-synthetic", "--n", "24", "--spacing", "6", "--out", cohort)
    bad = expect_success(res)
    if bad:
        return bad
    return [f"data.options.csv={cohort / 'participants.csv'}", f"data.options.cache_dir={ctx.dir / 'cache'}", *TSAN]


@scenario
def rnc_sigkill_between_stages(ctx: Context) -> tuple[str, str]:
    return _killed_then_resumed(
        ctx, "abalone_rnc", _rnc_sets(), "pretrain/done", "checkpoints/last.ckpt", signal.SIGKILL
    )


@scenario
def rnc_sigterm_between_stages(ctx: Context) -> tuple[str, str]:
    return _killed_then_resumed(
        ctx, "abalone_rnc", _rnc_sets(), "pretrain/done", "checkpoints/last.ckpt", signal.SIGTERM
    )


@scenario
def tsan_sigkill_between_stages(ctx: Context) -> tuple[str, str]:
    sets = _cohort(ctx)
    if isinstance(sets, tuple):
        return sets
    return _killed_then_resumed(
        ctx, "brain_age_tsan_synthetic", sets, "stage1/done", "checkpoints/last.ckpt", signal.SIGKILL
    )


@scenario
def tsan_sigterm_between_stages(ctx: Context) -> tuple[str, str]:
    sets = _cohort(ctx)
    if isinstance(sets, tuple):
        return sets
    return _killed_then_resumed(
        ctx, "brain_age_tsan_synthetic", sets, "stage1/done", "checkpoints/last.ckpt", signal.SIGTERM
    )


# ----------------------------------------------------------------------------------- logs


def _epochs(log: Path) -> list[int]:
    """The epochs of a CSV log's validation rows (one per epoch)."""
    with open(log, newline="") as f:
        return [int(float(r["epoch"])) for r in csv.DictReader(f) if r.get("val/mae")]


def _edit(run: Path, **changes: Any) -> None:
    """Edit the run's config.yaml: ``section__key=value``."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    for dotted, value in changes.items():
        node = cfg
        *path, last = dotted.split("__")
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


@scenario
def log_keeps_every_epoch_after_kill_mid_stage(ctx: Context) -> tuple[str, str]:
    run = ctx.dir / "run"
    sets = ["trainer.max_epochs=5", "task.pretrain_epochs=1"]
    res = ctx.train(
        "abalone_rnc", "--out", run, *_sets([*H.TINY, *sets]), tiny=False, kill_after=("epoch 3/5", signal.SIGKILL)
    )
    if res.rc == 0:
        return "crash", "the run finished before the kill"
    bad = expect_success(ctx.train("abalone_rnc", "--resume", "--out", run, tiny=False))
    if bad:
        return bad
    got = _epochs(run / "logs" / "metrics.csv")
    if got != list(range(5)):
        return "loss", f"logs/metrics.csv holds the epochs {got} after the resume, not 0..4 once each"
    return "ok", "logs/metrics.csv holds epochs 0..4 once each"


@scenario
def log_keeps_rows_when_extending(ctx: Context) -> tuple[str, str]:
    run = ctx.dir / "run"
    bad = expect_success(ctx.train("abalone_vanilla", "--out", run))
    if bad:
        return bad
    _edit(run, trainer__max_epochs=3)
    bad = expect_success(ctx.train("abalone_vanilla", "--resume", "--out", run))
    if bad:
        return bad
    got = _epochs(run / "logs" / "metrics.csv")
    if got != [0, 1, 2]:
        return "loss", f"logs/metrics.csv holds the epochs {got} after extending 2 -> 3 epochs"
    return "ok", "logs/metrics.csv holds epochs 0..2"


def _stopped(ctx: Context, config: str = "abalone_vanilla") -> Path | tuple[str, str]:
    """A 4-epoch run killed during its third epoch."""
    run = ctx.dir / "run"
    sets = _sets([*H.TINY, "trainer.max_epochs=4"])
    res = ctx.train(config, "--out", run, *sets, tiny=False, kill_after=("epoch 2/4", signal.SIGKILL))
    if res.rc == 0:
        return "crash", "the run finished before the kill"
    return run


@scenario
def lowered_max_epochs_refused_log_kept(ctx: Context) -> tuple[str, str]:
    run = _stopped(ctx)
    if isinstance(run, tuple):
        return run
    log = run / "logs" / "metrics.csv"
    before = log.read_bytes() if log.is_file() else None
    _edit(run, trainer__max_epochs=1)
    res = ctx.train("abalone_vanilla", "--resume", "--out", run, tiny=False)
    after = log.read_bytes() if log.is_file() else None
    if before is not None and after != before:
        return (
            "loss",
            f"logs/metrics.csv changed by a resume that failed ({'deleted' if after is None else 'rewritten'})",
        )
    return expect_refusal(res, "max_epochs")


@scenario
def edited_lr_refused(ctx: Context) -> tuple[str, str]:
    run = _stopped(ctx)
    if isinstance(run, tuple):
        return run
    _edit(run, optimizer__lr=0.5)
    return expect_refusal(ctx.train("abalone_vanilla", "--resume", "--out", run, tiny=False), "optimizer.lr")


@scenario
def precision_with_resume_refused(ctx: Context) -> tuple[str, str]:
    run = _stopped(ctx)
    if isinstance(run, tuple):
        return run
    res = ctx.train("abalone_vanilla", "--resume", "--out", run, "--precision", "64-true", tiny=False)
    return expect_refusal(res, "precision")


@scenario
def other_preset_resume_refused(ctx: Context) -> tuple[str, str]:
    run = ctx.dir / "run"
    bad = expect_success(ctx.train("abalone_rnc", "--out", run, "--set", "task.pretrain_epochs=1"))
    if bad:
        return bad
    return expect_refusal(ctx.train("abalone_lds", "--resume", "--out", run, tiny=False), "rnc")


@scenario
def data_seed_changed_refused(ctx: Context) -> tuple[str, str]:
    run = _stopped(ctx)
    if isinstance(run, tuple):
        return run
    _edit(run, data__options__seed=7)
    return expect_refusal(ctx.train("abalone_vanilla", "--resume", "--out", run, tiny=False), "seed")
