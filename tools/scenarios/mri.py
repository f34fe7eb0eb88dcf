"""Hostile MRI input: volumes stored in another orientation, a tampered or half-written volume cache,
odd numbers and fields in a cohort CSV, paths that are not volume files, a degenerate bias correction.

Most stories share one tiny TSAN run on an 8 mm synthetic cohort (trained once, by the first story that
needs it) and predict cohorts written from its volumes."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np

from . import _harness as H
from ._harness import Context, expect_refusal, expect_success, scenario

GRID = [23, 27, 23]
_LOCK = threading.Lock()
_SHARED: dict[str, Any] = {}


def _sets(csv_path: Path, cache: Path) -> list[str]:
    sets = [
        f"data.options.csv={csv_path}",
        f"data.options.cache_dir={cache}",
        f"data.options.shape={GRID}",
        "model.options={nb_filter: 4, nb_block: 2, use_sex: true}",
        "data.batch_size=4",
        "trainer.max_epochs=1",
        "task.stage2_epochs=1",
        "trainer.num_threads=1",
        "task.montage=0",
        "run.plots=false",
    ]
    return [a for s in sets for a in ("--set", s)]


def _cohort(folder: Path, n: int = 20, seed: int = 5) -> Path:
    """A synthetic cohort of ``n`` 8 mm volumes (participants.csv)."""
    make = ["data", "make", "brain-age-synthetic", "--n", str(n), "--spacing", "8", "--seed", str(seed)]
    res = subprocess.run(
        [sys.executable, "-m", "rankwise.cli", *make, "--out", str(folder)],
        env={"PYTHONPATH": H.SRC, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if res.returncode != 0:
        raise RuntimeError(f"cannot make the synthetic cohort: {res.stderr[-300:]}")
    return folder / "participants.csv"


def _shared(ctx: Context) -> dict[str, Any]:
    """The shared run: ``run``, ``csv``, ``cache``, ``train`` (its Result) and ``rows`` (the CSV's rows)."""
    with _LOCK:
        if not _SHARED:
            root = H.OUT / "mri" / "_shared"
            root.mkdir(parents=True, exist_ok=True)
            src = _cohort(root / "cohort")
            res = ctx.rankwise("train", "brain_age_tsan_synthetic", *_sets(src, root / "cache"), "--out", root / "run")
            _SHARED.update(
                run=root / "run",
                csv=src,
                cache=root / "cache",
                train=res,
                rows=list(csv.DictReader(open(src))),
            )
        return _SHARED


def _predictions(path: Path) -> list[float]:
    """Each row's stage-1 and final predictions (a tiny run's second stage may predict almost one age)."""
    rows = csv.DictReader(open(path))
    return [float(r[c] or "nan") for r in rows for c in ("stage1_prediction", "prediction")]


def _predict(ctx: Context, shared: dict[str, Any], cohort: Path, out: Path) -> H.Result:
    return ctx.rankwise("predict", shared["run"], "--data", cohort, "--out", out)


def _rewritten(ctx: Context, shared: dict[str, Any], change: Any, k: int = 4) -> Path:
    """A cohort of the first ``k`` volumes of the shared cohort, each written by ``change(data, affine)``."""
    import nibabel as nib

    folder = ctx.dir / "cohort"
    folder.mkdir(exist_ok=True)
    rows = shared["rows"][:k]
    out = []
    for r in rows:
        img = nib.load(str(shared["csv"].parent / r["path"]))
        data, affine = change(np.asarray(img.dataobj, dtype=np.float32), img.affine.copy())
        nib.save(nib.Nifti1Image(np.ascontiguousarray(data), affine), str(folder / r["path"]))
        out.append({**r})
    path = folder / "participants.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(out)
    return path


def _original(ctx: Context, shared: dict[str, Any], k: int = 4) -> list[float] | tuple[str, str]:
    """Predictions of the first ``k`` volumes as stored (or the outcome that ends the story)."""
    path = _rewritten(ctx, shared, lambda d, a: (d, a), k)
    orig = path.parent.parent / "orig"
    if orig.exists():
        shutil.rmtree(orig)
    path.parent.rename(orig)
    res = _predict(ctx, shared, orig / "participants.csv", ctx.dir / "orig.csv")
    return expect_success(res) or _predictions(ctx.dir / "orig.csv")


def _flip_axis(data: np.ndarray, affine: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """The same image in world space with voxel axis ``axis`` stored in reverse."""
    n = data.shape[axis]
    flip = np.eye(4)
    flip[axis, axis] = -1
    flip[axis, 3] = n - 1
    return np.flip(data, axis), affine @ flip


def _same_image_story(ctx: Context, change: Any) -> tuple[str, str]:
    """Predictions of volumes rewritten by ``change`` (the same image in world space) must equal the originals'."""
    shared = _shared(ctx)
    bad = expect_success(shared["train"])
    if bad:
        return bad
    orig = _original(ctx, shared)
    if isinstance(orig, tuple):
        return orig
    path = _rewritten(ctx, shared, change)
    res = _predict(ctx, shared, path, ctx.dir / "new.csv")
    bad = expect_success(res)
    if bad:
        return bad
    new = _predictions(ctx.dir / "new.csv")
    if H.same(orig, new, 1e-4):
        return "ok", f"same predictions {new[:2]}"
    return "silent_wrong", f"the same images stored otherwise predict {new} instead of {orig}"


@scenario
def orientation_x_flipped(ctx: Context) -> tuple[str, str]:
    return _same_image_story(ctx, lambda d, a: _flip_axis(d, a, 0))


@scenario
def orientation_axes_swapped(ctx: Context) -> tuple[str, str]:
    def swap(d: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        perm = np.eye(4)[[1, 0, 2, 3]]
        return np.swapaxes(d, 0, 1), a @ perm

    return _same_image_story(ctx, swap)


@scenario
def orientation_fully_mirrored(ctx: Context) -> tuple[str, str]:
    def mirror(d: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        for axis in range(3):
            d, a = _flip_axis(d, a, axis)
        return d, a

    return _same_image_story(ctx, mirror)


@scenario
def orientation_oblique_is_said(ctx: Context) -> tuple[str, str]:
    """A 20-degree oblique affine: not an axis reordering; the command must say what it did with it."""
    shared = _shared(ctx)
    bad = expect_success(shared["train"])
    if bad:
        return bad
    t = np.deg2rad(20)
    rot = np.array([[np.cos(t), -np.sin(t), 0, 0], [np.sin(t), np.cos(t), 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    path = _rewritten(ctx, shared, lambda d, a: (d, rot @ a), k=2)
    res = _predict(ctx, shared, path, ctx.dir / "new.csv")
    if H.crashed(res):
        return "crash", res.tail()
    said = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("warning:") and "oblique" in ln]
    if res.rc == 0 and not said:
        return "silent_wrong", "a 20-degree oblique volume is predicted without a word"
    if res.rc == 0:
        return "ok", said[0][:300]
    return expect_refusal(res, "oblique")


# ----------------------------------------------------------------------------------- the cache
def _cache_story(ctx: Context, tamper: Any) -> tuple[str, str]:
    """Predict, tamper with every cached volume of that cohort, predict again: a warning and the same numbers."""
    shared = _shared(ctx)
    bad = expect_success(shared["train"])
    if bad:
        return bad
    cache = ctx.dir / "cache"
    folder = ctx.dir / "cohort"
    shutil.copytree(shared["csv"].parent, folder)
    csv_path = folder / "participants.csv"
    rows = list(csv.DictReader(open(csv_path)))[:3]
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    # the run's cache_dir is the shared one: predict with a copy of the run pointing at our own cache
    run = ctx.dir / "run"
    shutil.copytree(shared["run"], run)
    cfg = run / "config.yaml"
    cfg.write_text(cfg.read_text().replace(str(shared["cache"]), str(cache)))
    first = ctx.rankwise("predict", run, "--data", csv_path, "--out", ctx.dir / "a.csv")
    bad = expect_success(first)
    if bad:
        return bad
    entries = sorted(cache.glob("*.npy"))
    if not entries:
        return "crash", f"no cache entries in {cache}"
    for e in entries:
        tamper(e)
    second = ctx.rankwise("predict", run, "--data", csv_path, "--out", ctx.dir / "b.csv")
    if H.crashed(second):
        return "crash", second.tail()
    if second.rc != 0:
        return ("refuses_valid", second.errors[0]) if H.is_clear(second) else ("crash", second.tail())
    a, b = _predictions(ctx.dir / "a.csv"), _predictions(ctx.dir / "b.csv")
    warned = [ln for ln in (second.stdout + second.stderr).splitlines() if ln.startswith("warning:") and "cache" in ln]
    if not H.same(a, b, 1e-5):
        return "silent_wrong", f"a tampered cache predicts {b} instead of {a}"
    if not warned:
        return "silent_wrong", "the cache entries were rebuilt without a word"
    return "ok", warned[0][:300]


def _overwrite(value: Any) -> Any:
    def tamper(path: Path) -> None:
        arr = np.load(path)
        np.save(path, np.full(arr.shape, value, dtype=arr.dtype))

    return tamper


@scenario
def cache_entry_zeroed(ctx: Context) -> tuple[str, str]:
    return _cache_story(ctx, _overwrite(0))


@scenario
def cache_entry_nan(ctx: Context) -> tuple[str, str]:
    return _cache_story(ctx, _overwrite(np.nan))


@scenario
def cache_entry_complex(ctx: Context) -> tuple[str, str]:
    def tamper(path: Path) -> None:
        arr = np.load(path)
        np.save(path, arr.astype(np.complex64))

    return _cache_story(ctx, tamper)


@scenario
def cache_entry_truncated(ctx: Context) -> tuple[str, str]:
    def tamper(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])

    return _cache_story(ctx, tamper)


@scenario
def cache_entry_empty(ctx: Context) -> tuple[str, str]:
    return _cache_story(ctx, lambda path: path.write_bytes(b""))


# ----------------------------------------------------------------------------------- the cohort CSV
def _edited_cohort(ctx: Context, edit: Any, header: list[str] | None = None) -> Path:
    """The shared cohort's CSV (absolute paths) with ``edit(rows)`` applied, in the story's folder."""
    shared = _shared_cohort(ctx)
    rows = [dict(r) for r in shared["rows"]]
    for r in rows:
        r["path"] = str(shared["csv"].parent / r["path"])
    edit(rows)
    path = ctx.dir / "cohort.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header or list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _shared_cohort(ctx: Context) -> dict[str, Any]:
    """The shared synthetic cohort alone (no training)."""
    with _LOCK:
        if "cohort" not in _SHARED:
            root = H.OUT / "mri" / "_cohort"
            src = _cohort(root)
            _SHARED["cohort"] = {"csv": src, "rows": list(csv.DictReader(open(src)))}
        return _SHARED["cohort"]


def _show(ctx: Context, path: Path) -> H.Result:
    """Load a cohort with `rankwise data show nifti` (every row parsed, every volume read and cached)."""
    return ctx.rankwise(
        "data", "show", "nifti", "-O", f"csv={path}", "-O", f"cache_dir={ctx.dir / 'cache'}", "-O", f"shape={GRID}"
    )


def _set_first(column: str, value: str) -> Any:
    def edit(rows: list[dict[str, str]]) -> None:
        rows[0][column] = value

    return edit


@scenario
def age_with_digit_separator(ctx: Context) -> tuple[str, str]:
    return expect_refusal(_show(ctx, _edited_cohort(ctx, _set_first("age", "1_0"))), "age")


@scenario
def age_in_arabic_indic_digits(ctx: Context) -> tuple[str, str]:
    return expect_refusal(_show(ctx, _edited_cohort(ctx, _set_first("age", "\u0664\u0665"))), "age")


@scenario
def csv_field_over_128_kib(ctx: Context) -> tuple[str, str]:
    return expect_refusal(_show(ctx, _edited_cohort(ctx, _set_first("site", "x" * 200_000))), "row")


@scenario
def path_column_named_file(ctx: Context) -> tuple[str, str]:
    def rename(rows: list[dict[str, str]]) -> None:
        for r in rows:
            r["file"] = r.pop("path")

    header = ["file", "age", "sex", "site", "subject"]
    path = _edited_cohort(ctx, rename, header)
    res = ctx.rankwise("train", "--data", path, "--target", "age", "--method", "tsan", "--out", ctx.dir / "run")
    return expect_refusal(res, "path")


def _volume_story(ctx: Context, make: Any, wording: str) -> tuple[str, str]:
    special = make(ctx.dir)

    def edit(rows: list[dict[str, str]]) -> None:
        rows[1]["path"] = str(special)

    return expect_refusal(_show(ctx, _edited_cohort(ctx, edit)), wording)


@scenario
def volume_is_a_fifo(ctx: Context) -> tuple[str, str]:
    import os

    def make(folder: Path) -> Path:
        p = folder / "v.nii.gz"
        os.mkfifo(p)
        return p

    return _volume_story(ctx, make, "is a FIFO")


@scenario
def volume_is_a_directory(ctx: Context) -> tuple[str, str]:
    def make(folder: Path) -> Path:
        p = folder / "v.nii.gz"
        p.mkdir()
        return p

    return _volume_story(ctx, make, "is a directory")


@scenario
def volume_is_dev_zero(ctx: Context) -> tuple[str, str]:
    return _volume_story(ctx, lambda folder: Path("/dev/zero"), "is a character device")


# ----------------------------------------------------------------------------------- disk full
_ENOSPC_PATCH = """
import errno
import numpy.lib.format as _fmt

_write_array = _fmt.write_array


def _full(fp, array, *args, **kw):
    fp.write(b"\\x93NUMPY" + b"\\0" * 100)  # part of the file, then the disk is full
    raise OSError(errno.ENOSPC, "No space left on device")


_fmt.write_array = _full
"""


@scenario
def disk_full_while_caching(ctx: Context) -> tuple[str, str]:
    src = _shared_cohort(ctx)["csv"]
    patch = ctx.dir / "patch"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(textwrap.dedent(_ENOSPC_PATCH))
    cache = ctx.dir / "cache"
    res = ctx.rankwise(
        "data",
        "show",
        "nifti",
        "-O",
        f"csv={src}",
        "-O",
        f"cache_dir={cache}",
        "-O",
        f"shape={GRID}",
        env={"PYTHONPATH": f"{H.SRC}:{patch}"},
    )
    left = sorted(p.name for p in cache.iterdir()) if cache.is_dir() else []
    if left:
        return "loss", f"left in the cache after a failed write: {left[:4]}; {res.tail(1)}"
    return expect_refusal(res, "no space left")


# ----------------------------------------------------------------------------------- the bias correction
_BIAS = """
import warnings, numpy as np
from rankwise.brain_age import correct_age_bias
rng = np.random.default_rng(0)
fit_age = rng.uniform(20, 90, 40); age = rng.uniform(20, 90, 10)
case = {case!r}
try:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if case == "flat_predictions":
            out = correct_age_bias(50 + rng.uniform(0, 1e-6, 10), age, fit_pred=50 + rng.uniform(0, 1e-6, 40),
                                   fit_age=fit_age, method="prediction")
        elif case == "tiny_age_spread":
            fa = 50 + np.array([0.0, 1e-9, 0.5e-9, 1e-9])
            out = correct_age_bias(np.array([40.0, 60.0]), np.array([40.0, 60.0]),
                                   fit_pred=np.array([49, 51, 50, 52.0]), fit_age=fa, method="gap")
        elif case == "string_ages":
            out = correct_age_bias(np.array([40.0]), ["45"], fit_pred=[40.0, 60.0], fit_age=["30", True])
        elif case == "few_subjects":
            out = correct_age_bias(np.array([40.0]), np.array([45.0]), fit_pred=[30.0, 40.0, 55.0, 70.0],
                                   fit_age=[25.0, 40.0, 60.0, 80.0])
    print("RESULT", np.round(np.asarray(out, dtype=float), 3).tolist())
    for x in w:
        print("WARNING", x.message)
except (ValueError, TypeError) as e:
    print("REFUSED", type(e).__name__, e)
"""


def _bias(ctx: Context, case: str) -> str:
    res = subprocess.run(
        [sys.executable, "-c", _BIAS.format(case=case)],
        env={"PYTHONPATH": H.SRC, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return (res.stdout + res.stderr).strip()


def _bias_refused(ctx: Context, case: str, kind: str) -> tuple[str, str]:
    out = _bias(ctx, case)
    if "Traceback" in out:
        return "crash", out[-300:]
    if out.startswith(f"REFUSED {kind}"):
        return "clear", out[:300]
    if out.startswith("REFUSED"):
        return "crash", f"refused with another error type (wanted {kind}): {out[:300]}"
    return "accepts", out[:300]


@scenario
def bias_correction_of_flat_predictions(ctx: Context) -> tuple[str, str]:
    return _bias_refused(ctx, "flat_predictions", "ValueError")


@scenario
def bias_correction_of_a_tiny_age_spread(ctx: Context) -> tuple[str, str]:
    return _bias_refused(ctx, "tiny_age_spread", "ValueError")


@scenario
def bias_correction_of_string_ages(ctx: Context) -> tuple[str, str]:
    return _bias_refused(ctx, "string_ages", "TypeError")


@scenario
def bias_correction_on_four_subjects_says_so(ctx: Context) -> tuple[str, str]:
    out = _bias(ctx, "few_subjects")
    if "Traceback" in out or out.startswith("REFUSED"):
        return "crash", out[-300:]
    warned = [ln for ln in out.splitlines() if ln.startswith("WARNING") and "4" in ln]
    return ("ok", warned[0][:300]) if warned else ("silent_wrong", f"no word about the 4 subjects: {out[:200]}")
