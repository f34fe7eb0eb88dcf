"""Size, disk and memory limits, and signals: LETOR files that would expand into huge dense arrays,
big sparse files given to train and predict, a checkpoint that does not fit on the disk, predictions
from a killed or failed run, SIGTERM of a run with DataLoader workers."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from ._harness import SRC, Context, Result, crashed, expect_refusal, expect_success, is_clear, scenario

#: ``--set`` overrides that make the MSLR preset train on small LETOR files in seconds
LTR_TINY = (
    "data.options.fold=null",
    "model.options.hidden=[16]",
    "model.options.feature_dim=16",
    "data.batch_size=8",
    "data.num_workers=0",
    "trainer.max_epochs=2",
    "trainer.num_threads=1",
    "task.slate_length=10",
    "run.plots=false",
)
#: a long abalone run (a signal or a kill reaches it while it trains)
LONG = ("trainer.max_epochs=1000", "trainer.limit_train_batches=2")


def _sets(*values: str) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def _letor_lines(queries: int, docs: int, features: int, seed: int) -> str:
    import random

    rnd = random.Random(seed)
    lines = []
    for q in range(1, queries + 1):
        for _ in range(docs):
            feats = " ".join(f"{j}:{rnd.random():.3f}" for j in range(1, features + 1))
            lines.append(f"{rnd.randint(0, 2)} qid:{q} {feats}")
    return "\n".join(lines) + "\n"


def _letor_folder(ctx: Context, name: str = "letor", train: str | None = None) -> Path:
    d = ctx.dir / name
    d.mkdir(exist_ok=True)
    for i, f in enumerate(("train.txt", "vali.txt", "test.txt")):
        (d / f).write_text(_letor_lines(8, 6, 5, i))
    if train is not None:
        (d / "train.txt").write_text(train)
    return d


def _ltr_train(ctx: Context, folder: Path, *extra: str, memory_gib: float = 8.0) -> Result:
    run = ctx.dir / "run"
    sets = _sets(*LTR_TINY, f"data.options.path={folder}", *extra)
    return ctx.rankwise("train", "mslr_web10k_listnet", "--out", run, *sets, "--no-progress", memory_gib=memory_gib)


def _sparse(path: Path, size: int, head: str = "") -> Path:
    with open(path, "wb") as f:
        f.write(head.encode())
        f.truncate(size)
    return path


@scenario
def letor_feature_index_bomb(ctx: Context) -> tuple[str, str]:
    folder = _letor_folder(ctx, train="1 qid:1 1000000000:0.5\n0 qid:1 1:0.5\n")
    res = _ltr_train(ctx, folder, "data.options.num_features=null", memory_gib=4)
    return expect_refusal(res, "feature index")


@scenario
def letor_wide_documents(ctx: Context) -> tuple[str, str]:
    lines = "".join(f"{i % 3} qid:{1 + i // 20} 1:0.5 2000000:0.25\n" for i in range(400))
    folder = _letor_folder(ctx, train=lines)
    res = _ltr_train(ctx, folder, "data.options.num_features=null", memory_gib=4)
    return expect_refusal(res, "feature index")


@scenario
def letor_sparse_train_file(ctx: Context) -> tuple[str, str]:
    folder = _letor_folder(ctx)
    _sparse(folder / "train.txt", 6 * 2**30, "1 qid:1 1:0.5\n")
    res = _ltr_train(ctx, folder, memory_gib=4)
    return expect_refusal(res, "bytes")


@scenario
def ltr_predict_sparse_file(ctx: Context) -> tuple[str, str]:
    folder = _letor_folder(ctx)
    bad = expect_success(_ltr_train(ctx, folder))
    if bad:
        return bad
    new = _sparse(ctx.dir / "new.txt", 6 * 2**30, "1 qid:1 1:0.5\n")
    res = ctx.rankwise("predict", ctx.dir / "run", "--data", new, memory_gib=4)
    return expect_refusal(res, "bytes")


@scenario
def csv_predict_sparse_file(ctx: Context) -> tuple[str, str]:
    run = ctx.dir / "run"
    bad = expect_success(ctx.train("abalone_vanilla", "--out", run))
    if bad:
        return bad
    new = _sparse(ctx.dir / "new.csv", 8 * 2**30, "sex,length\n")
    res = ctx.rankwise("predict", run, "--data", new, memory_gib=4)
    return expect_refusal(res, "bytes")


@scenario
def cohort_predict_sparse_file(ctx: Context) -> tuple[str, str]:
    cohort = ctx.dir / "cohort"
    res = ctx.rankwise("data", "make", "brain-age-synthetic", "--n", "12", "--spacing", "8", "--out", cohort)
    bad = expect_success(res)
    if bad:
        return bad
    run = ctx.dir / "run"
    sets = _sets(
        f"data.options.csv={cohort / 'participants.csv'}",
        f"data.options.cache_dir={ctx.dir / 'cache'}",
        "data.options.shape=[23, 27, 23]",
        "model.options={nb_filter: 4, nb_block: 2, use_sex: true}",
        "data.batch_size=4",
        "trainer.max_epochs=1",
        "task.stage2_epochs=1",
        "trainer.num_threads=1",
        "task.montage=0",
        "run.plots=false",
    )
    bad = expect_success(ctx.rankwise("train", "brain_age_tsan_synthetic", "--out", run, *sets, "--no-progress"))
    if bad:
        return bad
    new = _sparse(ctx.dir / "new.csv", 8 * 2**30, "path,age\n")
    res = ctx.rankwise("predict", run, "--data", new, memory_gib=4)
    return expect_refusal(res, "bytes")


def _rankwise_fsize(ctx: Context, args: list[str], fsize: int, timeout: float = 300.0) -> Result:
    """``rankwise ARGS`` with every file it writes limited to ``fsize`` bytes (a write beyond fails
    as on a full disk: EFBIG instead of ENOSPC)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        os.setsid()

    t0 = time.time()
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "rankwise.cli", *args],
        cwd=ctx.dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        stdin=subprocess.DEVNULL,
    )
    return Result(args, p.returncode, p.stdout, p.stderr, time.time() - t0)


@scenario
def checkpoint_disk_full(ctx: Context) -> tuple[str, str]:
    run = ctx.dir / "run"
    args = ["train", "abalone_vanilla", "--out", str(run), "--no-progress", *_sets("run.plots=false", *LONG[1:])]
    res = _rankwise_fsize(ctx, [*args, "--set", "model.options.hidden=[256, 256]"], 64 * 1024)
    left = sorted(str(p.relative_to(run)) for p in run.rglob("*tmp*")) if run.is_dir() else []
    if left:
        return "loss", f"temporary files left: {left}; {res.tail()}"
    if crashed(res):
        return "crash", res.tail()
    if is_clear(res, "ckpt"):
        return "clear", res.errors[0]
    return expect_refusal(res, "ckpt")


def _long_run(ctx: Context, run: Path, sig: int, text: str, *extra: str) -> Result:
    """A long abalone run in ``run``, sent ``sig`` (its process group) once ``text`` is printed."""
    sets = _sets("model.options.hidden=[16]", "trainer.num_threads=1", "run.plots=false", *LONG, *extra)
    return ctx.rankwise("train", "abalone_vanilla", "--out", run, *sets, "--no-progress", kill_after=(text, sig))


def _stopped_run(ctx: Context, sig: int) -> tuple[Path, Result]:
    run = ctx.dir / "run"
    return run, _long_run(ctx, run, sig, "epoch 3/")


def _predict_stopped(ctx: Context, sig: int, word: str) -> tuple[str, str]:
    run, _ = _stopped_run(ctx, sig)
    meta = json.loads((run / "meta.json").read_text())
    res = ctx.rankwise("predict", run, "--data", ctx.dir / "new.csv", "--out", ctx.dir / "p.csv")
    bad = expect_success(res)
    if bad:
        return bad
    said = [ln for ln in (res.stdout + res.stderr).splitlines() if word in ln.lower()]
    if not said:
        return "silent_wrong", f"meta status {meta.get('status')!r}, predict said nothing of it: {res.tail()}"
    return "ok", said[0][:300]


@scenario
def predict_after_a_kill(ctx: Context) -> tuple[str, str]:
    _abalone_rows(ctx.dir / "new.csv")
    return _predict_stopped(ctx, signal.SIGKILL, "killed")


@scenario
def predict_after_a_failure(ctx: Context) -> tuple[str, str]:
    _abalone_rows(ctx.dir / "new.csv")
    return _predict_stopped(ctx, signal.SIGTERM, "failed")


def _abalone_rows(path: Path) -> None:
    cols = "sex,length,diameter,height,whole_weight,shucked_weight,viscera_weight,shell_weight"
    path.write_text(
        cols + "\nM,0.455,0.365,0.095,0.514,0.2245,0.101,0.15\nF,0.53,0.42,0.135,0.677,0.2565,0.1415,0.21\n"
    )


@scenario
def sigterm_with_workers(ctx: Context) -> tuple[str, str]:
    """Five SIGTERMs of a run whose DataLoader has two workers: each one clean line, nothing else."""
    for i in range(5):
        res = _long_run(ctx, ctx.dir / f"run{i}", signal.SIGTERM, "epoch 2/", "data.num_workers=2")
        text = res.stdout + res.stderr
        noise = [ln for ln in text.splitlines() if "Signal" in ln or "Exception ignored" in ln or "OSError" in ln]
        if noise or "Traceback" in text:
            return "crash", f"try {i}: {' | '.join(noise) or res.tail()}"
        if res.rc != 128 + signal.SIGTERM or len(res.errors) != 1 or "terminated" not in res.errors[0]:
            return "crash", f"try {i}: exit {res.rc}: {res.tail()}"
    return "clear", res.errors[0]
