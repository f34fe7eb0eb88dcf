"""A run stands on its own: predict needs no training file, and evaluate / predict / resume refuse data
that changed since training (a file's content, config.yaml's data section) instead of rebuilding the
split and statistics from them."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from ._harness import Context, expect_refusal, expect_success, scenario

#: the table runs of these stories: a vanilla regressor on the user's own CSV, one epoch
TABLE = ("--method", "vanilla", "--set", "trainer.max_epochs=1")
LTR_TINY = (
    "data.options.fold=null",
    "model.options.hidden=[16]",
    "model.options.feature_dim=16",
    "data.batch_size=8",
    "data.num_workers=0",
    "trainer.max_epochs=1",
    "trainer.num_threads=1",
    "task.slate_length=10",
    "run.plots=false",
)


def _table(path: Path, n: int, seed: int, shift: float = 0.0) -> Path:
    rng = random.Random(seed)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["a", "b", "y"])
        for _ in range(n):
            a, b = rng.uniform(0, 10) + shift, rng.uniform(-5, 5) * (1 + shift)
            w.writerow([f"{a:.4f}", f"{b:.4f}", f"{3 * a + b + rng.gauss(0, 1):.3f}"])
    return path


def _trained_table(ctx: Context) -> tuple[Path, Path, tuple[str, str] | None]:
    """A run trained from ``ctx.dir/a`` on the relative ``train.csv``; its folder and the run."""
    a = ctx.dir / "a"
    a.mkdir(exist_ok=True)
    _table(a / "train.csv", 400, 0)
    run = ctx.dir / "run"
    bad = expect_success(ctx.train("--data", "train.csv", "--target", "y", *TABLE, "--out", run, cwd=a))
    return a, run, bad


def _predictions(path: Path) -> list[float]:
    with open(path, newline="") as fh:
        return [float(r["prediction"]) for r in csv.DictReader(fh)]


def _predict(ctx: Context, run: Path, new: Path, out: Path, cwd: Path) -> tuple[list[float] | None, tuple | None]:
    res = ctx.rankwise("predict", run, "--data", new, "--out", out, cwd=cwd)
    bad = expect_success(res)
    return (None, bad) if bad else (_predictions(out), None)


def _compare(before: list[float], after: list[float]) -> tuple[str, str]:
    gap = max(abs(x - y) for x, y in zip(before, after, strict=True))
    return ("ok", "same predictions") if gap <= 1e-6 else ("silent_wrong", f"predictions moved by up to {gap:.4g}")


@scenario
def predict_from_a_directory_with_another_train_csv(ctx: Context) -> tuple[str, str]:
    a, run, bad = _trained_table(ctx)
    if bad:
        return bad
    new = _table(ctx.dir / "new.csv", 20, 7)
    ref, bad = _predict(ctx, run, new, ctx.dir / "ref.csv", a)
    if bad or ref is None:
        return bad or ("crash", "no predictions")
    b = ctx.dir / "b"
    b.mkdir()
    _table(b / "train.csv", 400, 5, shift=20.0)  # the same columns, other numbers
    got, bad = _predict(ctx, run, new, ctx.dir / "got.csv", b)
    return bad or _compare(ref, got or [])


@scenario
def predict_with_the_training_file_deleted(ctx: Context) -> tuple[str, str]:
    a, run, bad = _trained_table(ctx)
    if bad:
        return bad
    new = _table(ctx.dir / "new.csv", 20, 7)
    ref, bad = _predict(ctx, run, new, ctx.dir / "ref.csv", a)
    if bad or ref is None:
        return bad or ("crash", "no predictions")
    (a / "train.csv").unlink()
    got, bad = _predict(ctx, run, new, ctx.dir / "got.csv", ctx.dir)
    return bad or _compare(ref, got or [])


@scenario
def predict_after_rows_were_appended(ctx: Context) -> tuple[str, str]:
    a, run, bad = _trained_table(ctx)
    if bad:
        return bad
    new = _table(ctx.dir / "new.csv", 20, 7)
    ref, bad = _predict(ctx, run, new, ctx.dir / "ref.csv", a)
    if bad or ref is None:
        return bad or ("crash", "no predictions")
    extra = _table(ctx.dir / "extra.csv", 300, 9, shift=5.0).read_text().splitlines()[1:]
    with open(a / "train.csv", "a") as fh:
        fh.write("\n".join(extra) + "\n")
    got, bad = _predict(ctx, run, new, ctx.dir / "got.csv", a)
    return bad or _compare(ref, got or [])


def _evaluate_refuses(ctx: Context, run: Path, cwd: Path, wording: str) -> tuple[str, str]:
    before = (run / "metrics.json").read_bytes()
    res = ctx.rankwise("evaluate", run, "--no-plots", cwd=cwd)
    outcome = expect_refusal(res, wording)
    if (run / "metrics.json").read_bytes() != before:
        return ("silent_wrong" if res.rc == 0 else "loss"), f"metrics.json rewritten ({outcome[0]}: {outcome[1]})"
    return outcome


@scenario
def evaluate_after_rows_were_appended(ctx: Context) -> tuple[str, str]:
    a, run, bad = _trained_table(ctx)
    if bad:
        return bad
    extra = _table(ctx.dir / "extra.csv", 300, 9).read_text().splitlines()[1:]
    with open(a / "train.csv", "a") as fh:
        fh.write("\n".join(extra) + "\n")
    return _evaluate_refuses(ctx, run, a, "train.csv")


@scenario
def evaluate_after_rows_were_shuffled(ctx: Context) -> tuple[str, str]:
    a, run, bad = _trained_table(ctx)
    if bad:
        return bad
    lines = (a / "train.csv").read_text().splitlines()
    body = lines[1:]
    random.Random(1).shuffle(body)
    (a / "train.csv").write_text("\n".join([lines[0], *body]) + "\n")
    return _evaluate_refuses(ctx, run, a, "train.csv")


@scenario
def evaluate_with_allow_changed_data_keeps_metrics_json(ctx: Context) -> tuple[str, str]:
    a, run, bad = _trained_table(ctx)
    if bad:
        return bad
    extra = _table(ctx.dir / "extra.csv", 300, 9).read_text().splitlines()[1:]
    with open(a / "train.csv", "a") as fh:
        fh.write("\n".join(extra) + "\n")
    before = (run / "metrics.json").read_bytes()
    res = ctx.rankwise("evaluate", run, "--no-plots", "--allow-changed-data", cwd=a)
    bad = expect_success(res)
    if bad:
        return bad
    if (run / "metrics.json").read_bytes() != before:
        return "silent_wrong", "metrics.json rewritten from changed data"
    if "warning" not in (res.stdout + res.stderr).lower():
        return "silent_wrong", "no warning that the data changed"
    return "ok", res.tail(1)


def _edit_config(run: Path, key: str, value: object) -> None:
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"]["options"][key] = value
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


@scenario
def evaluate_after_config_seed_was_edited(ctx: Context) -> tuple[str, str]:
    a, run, bad = _trained_table(ctx)
    if bad:
        return bad
    _edit_config(run, "seed", 123)
    return _evaluate_refuses(ctx, run, a, "seed")


@scenario
def predict_after_config_target_was_edited(ctx: Context) -> tuple[str, str]:
    a, run, bad = _trained_table(ctx)
    if bad:
        return bad
    new = _table(ctx.dir / "new.csv", 20, 7)
    _edit_config(run, "target", "b")
    return expect_refusal(ctx.rankwise("predict", run, "--data", new, "--out", ctx.dir / "p.csv", cwd=a), "target")


@scenario
def resume_after_rows_were_appended(ctx: Context) -> tuple[str, str]:
    a = ctx.dir / "a"
    a.mkdir()
    _table(a / "train.csv", 400, 0)
    run = ctx.dir / "run"
    bad = expect_success(ctx.train("--data", "train.csv", "--target", "y", *TABLE, "--out", run, cwd=a))
    if bad:
        return bad
    meta = json.loads((run / "meta.json").read_text())
    meta["status"] = "failed"
    (run / "meta.json").write_text(json.dumps(meta))
    extra = _table(ctx.dir / "extra.csv", 300, 9).read_text().splitlines()[1:]
    with open(a / "train.csv", "a") as fh:
        fh.write("\n".join(extra) + "\n")
    res = ctx.rankwise(
        "train", "--data", "train.csv", "--target", "y", "--resume", "--out", run, "--no-progress", cwd=a
    )
    return expect_refusal(res, "train.csv")


@scenario
def evaluate_after_letor_train_txt_was_appended(ctx: Context) -> tuple[str, str]:
    own = ctx.dir / "own"
    res = ctx.rankwise(
        "data", "make", "ltr-synthetic", "--out", own, "--train-queries", "40", "--val-queries", "10",
        "--test-queries", "24", "--seed", "3",
    )  # fmt: skip
    bad = expect_success(res)
    if bad:
        return bad
    run = ctx.dir / "run"
    sets = [a for s in ("data.options.path=own", *LTR_TINY) for a in ("--set", s)]
    bad = expect_success(ctx.train("mslr_web10k_listnet", "--out", run, *sets, tiny=False))
    if bad:
        return bad
    lines = (own / "train.txt").read_text().splitlines()
    with open(own / "train.txt", "a") as fh:
        fh.write("\n".join(ln.replace("qid:", "qid:9") for ln in lines[:100]) + "\n")
    return _evaluate_refuses(ctx, run, ctx.dir, "train.txt")
