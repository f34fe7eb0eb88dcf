"""The own-cohort brain-age route on this machine: `rankwise train --data cohort.csv --target age --method tsan`
with the defaults it prints, batches no bundled SoDeep sorter has, its memory check, and the commands that
show what can be set (`rankwise config brain_age`, `rankwise presets show`)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from ._harness import Context, Result, expect_refusal, expect_success, is_clear, scenario

#: a two-block ScaleDense at the cohort's own 8 mm grid, one epoch per stage: seconds per run
SMALL = (
    "data.options.shape=null",
    "model.options={nb_filter: 2, nb_block: 2, use_sex: true}",
    "trainer.max_epochs=1",
    "task.stage2_epochs=1",
    "data.num_workers=0",
    "task.montage=0",
    "trainer.num_threads=1",
)


def _cohort(ctx: Context) -> Path | tuple[str, str]:
    """40 synthetic subjects at 8 mm (28 of them in the training split)."""
    out = ctx.dir / "cohort"
    res = ctx.rankwise("data", "make", "brain-age-synthetic", "--n", "40", "--spacing", "8", "--out", out)
    return expect_success(res) or out / "participants.csv"


def _tsan(ctx: Context, csv: Path, *sets: str, small: bool = True, **kw: object) -> Result:
    args: list[str | Path] = ["train", "--data", csv, "--target", "age", "--method", "tsan", "--out", ctx.dir / "run"]
    for s in (*(SMALL if small else ()), f"data.options.cache_dir={ctx.dir / 'cache'}", *sets):
        args += ["--set", s]
    return ctx.rankwise(*args, "--no-progress", **kw)  # type: ignore[arg-type]


def _defaults_line(res: Result) -> str:
    return next((ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("defaults from")), "")


def _note(res: Result) -> str:
    return next((ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("note:")), "")


@scenario
def cohort_under_32_trains_tsan(ctx: Context) -> tuple[str, str]:
    """28 training subjects, the route's own batch size: trains, a note names the fallback ranker."""
    csv = _cohort(ctx)
    if isinstance(csv, tuple):
        return csv
    res = _tsan(ctx, csv)
    bad = expect_success(res)
    if bad:
        return bad
    note = _note(res)
    if "fallback" not in note or "32, 64, 128" not in note:
        return "silent_wrong", f"trained without a note naming the sorter lengths and the fallback: {res.tail()}"
    return "ok", note


@scenario
def one_batch_shorter_than_the_sorter(ctx: Context) -> tuple[str, str]:
    """data.batch_size=32 (a bundled sorter's length) on 28 training subjects: their one batch is shorter."""
    csv = _cohort(ctx)
    if isinstance(csv, tuple):
        return csv
    res = _tsan(ctx, csv, "data.batch_size=32")
    return expect_success(res) or ("ok", _note(res) or res.tail(1))


@scenario
def batch_without_a_bundled_sorter_trains(ctx: Context) -> tuple[str, str]:
    """data.batch_size=16 (a CPU user's batch; no bundled sorter has length 16): trains with the fallback."""
    csv = _cohort(ctx)
    if isinstance(csv, tuple):
        return csv
    res = _tsan(ctx, csv, "data.batch_size=16")
    return expect_success(res) or ("ok", _note(res) or res.tail(1))


@scenario
def defaults_batch_fits_the_cohort_and_memory(ctx: Context) -> tuple[str, str]:
    """The printed default batch is at most the training subjects and its step fits the memory it names."""
    csv = _cohort(ctx)
    if isinstance(csv, tuple):
        return csv
    res = _tsan(ctx, csv, kill_after=("defaults from", signal.SIGKILL))
    line = _defaults_line(res)
    batch = re.search(r"batch size (\d+)", line)
    rows = re.search(r"\((\d+) training rows\)", line)
    mem = re.search(r"about ([\d.]+) GiB of ([\d.]+) GiB available", line)
    if not (batch and rows):
        return "crash", res.tail()
    if int(batch.group(1)) > int(rows.group(1)) or not mem or float(mem.group(1)) > float(mem.group(2)):
        return "silent_wrong", line
    return "ok", line


@scenario
def defaults_line_estimates_the_epoch_time(ctx: Context) -> tuple[str, str]:
    """The defaults line says how long an epoch will take on this machine."""
    csv = _cohort(ctx)
    if isinstance(csv, tuple):
        return csv
    res = _tsan(ctx, csv, kill_after=("defaults from", signal.SIGKILL))
    line = _defaults_line(res)
    if not line:
        return "crash", res.tail()
    return ("ok", line) if re.search(r"about [\d.]+ (s|min|h) per epoch", line) else ("silent_wrong", line)


@scenario
def full_grid_over_memory_is_one_error_line(ctx: Context) -> tuple[str, str]:
    """The preset's 91x109x91 grid and network under a 6 GiB address-space cap: refused before training."""
    csv = _cohort(ctx)
    if isinstance(csv, tuple):
        return csv
    res = _tsan(
        ctx,
        csv,
        "data.options.shape=[91, 109, 91]",
        "data.num_workers=0",
        "trainer.max_epochs=1",
        small=False,
        memory_gib=6.0,
        timeout=600.0,
    )
    out = expect_refusal(res, "available")
    if out[0] == "clear" and "GiB" not in out[1]:
        return "crash", f"refused without the estimate: {out[1]}"
    return out


@scenario
def defaults_line_shows_the_set_values(ctx: Context) -> tuple[str, str]:
    """--set data.batch_size=64 --set trainer.max_epochs=2: the defaults line prints 64 and 2."""
    csv = _cohort(ctx)
    if isinstance(csv, tuple):
        return csv
    res = _tsan(ctx, csv, "data.batch_size=64", "trainer.max_epochs=2", kill_after=("defaults from", signal.SIGKILL))
    line = _defaults_line(res)
    if not line:
        return ("refuses_valid", res.errors[0]) if is_clear(res) else ("crash", res.tail())
    ok = "batch size 64" in line and "2 epochs" in line
    return ("ok", line) if ok else ("silent_wrong", line)


@scenario
def config_lists_the_options_inside_dict_fields(ctx: Context) -> tuple[str, str]:
    """`rankwise config brain_age` names data.options.shape and model.options.nb_filter."""
    res = ctx.rankwise("config", "brain_age")
    bad = expect_success(res)
    if bad:
        return bad
    missing = [k for k in ("data.options.shape", "model.options.nb_filter") if k not in res.stdout]
    return ("silent_wrong", f"missing {missing}") if missing else ("ok", "both listed")


@scenario
def presets_show_prints_the_yaml(ctx: Context) -> tuple[str, str]:
    """`rankwise presets show brain_age_tsan` prints YAML that reads back to the preset's settings."""
    import yaml

    res = ctx.rankwise("presets", "show", "brain_age_tsan")
    bad = expect_success(res)
    if bad:
        return bad
    try:
        raw = yaml.safe_load(res.stdout)
    except yaml.YAMLError as e:
        return "silent_wrong", f"not YAML: {e}"
    if not isinstance(raw, dict) or raw.get("recipe") != "brain_age" or raw.get("model", {}).get("backbone") is None:
        return "silent_wrong", res.tail()
    return "ok", f"{len(res.stdout.splitlines())} lines of YAML"
