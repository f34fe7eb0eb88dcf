"""The data readers of rankwise beside the parsers users know, side by side in one process.

- **CSV**: :func:`rankwise.data.load_csv` (the reader of a user's table: parse, split, standardise,
  tensors) vs ``pandas.read_csv`` + ``to_numpy()`` (C engine), tables of 1e5 and 1e6 rows x 20
  numeric columns (``--scale`` scales the rows).
- **LETOR**: :func:`rankwise.data.read_letor_dense` vs ``sklearn.datasets.load_svmlight_file``
  (its C parser; also with ``.toarray()``, the dense array a model needs) on a synthetic
  MSLR-WEB10K-sized file (1.2e6 documents x 136 features, 10,000 queries; ``--scale`` scales the
  documents and queries). Time: median of repeats in this process. Peak memory: each reader once in
  a fresh subprocess (after a warm-up on a tiny file, so numba's kernels and the imports are
  already resident): the growth of the resident set's high-water mark (``VmHWM``) above the
  resident set before the call, beside the dense float32 array's size. The same for
  :func:`rankwise.data.load_letor` (train = that file, small vali / test files): the loader's peak
  beyond the feature matrix.
- **NIfTI**: the cohort preprocessing of training (``NiftiPreprocessing.cache_volumes``: read,
  reorient to RAS+, resample to the run's spacing, crop/pad, brain z-score, write the cache) vs a
  TorchIO pipeline of the same steps (``ToCanonical``, ``Resample``, ``CropOrPad``,
  ``ZNormalization`` over the voxels > 0, ``np.save``), volumes per second with 1 and 2 worker
  processes (each worker takes every W-th volume; one torch thread per worker; a fresh cache per repeat).
- **Image CSV**: :func:`rankwise.data.load_image_csv` + ``DataLoader`` vs torchvision's
  ``ImageFolder`` + ``DataLoader`` over the same JPEG files with the same eval transform, images per
  second for one pass with 0 and 2 loader workers (and the time to build each dataset).

The generated inputs are written once into ``--cache`` (default ``$TMPDIR/rankwise_readers``; the
free disk space is checked first) and reused. ``python benchmarks/readers.py --markdown JSON``
prints the table of ``docs/benchmarks.md`` from a result file (and runs nothing else).

Example (quick, a loaded machine): ``nice -n 10 python benchmarks/readers.py --scale 0.05``;
the full sizes: ``python benchmarks/readers.py`` on a quiet machine (the LETOR file is ~1.3 GB of
text and scikit-learn takes minutes per read).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "readers.json"
MSLR = {"documents": 1_200_000, "features": 136, "queries": 10_000}
CSV_ROWS = (100_000, 1_000_000)
CSV_COLUMNS = 20
GOALS = {"csv": 1.0, "letor_time": 0.8, "letor_memory": 1.5, "nifti": 1.0}


# ------------------------------------------------------------------------------------------ inputs


def _free_bytes(path: Path) -> int:
    path.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(path).free


def _need(path: Path, nbytes: int) -> None:
    free = _free_bytes(path)
    if free < 2 * nbytes:
        sys.exit(f"error: {path} has {free / 1e9:.1f} GB free; the inputs need about {nbytes / 1e9:.1f} GB (x2 margin)")


def _csv_file(cache: Path, rows: int) -> Path:
    path = cache / f"table_{rows}x{CSV_COLUMNS}.csv"
    if path.exists():
        return path
    import numpy as np

    _need(cache, rows * CSV_COLUMNS * 12)
    rng = np.random.default_rng(rows)
    names = [f"x{i}" for i in range(CSV_COLUMNS - 1)] + ["y"]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        fh.write(",".join(names) + "\n")
        for start in range(0, rows, 50_000):
            n = min(50_000, rows - start)
            block = rng.normal(size=(n, CSV_COLUMNS)) * 10.0 ** rng.integers(-2, 3, size=CSV_COLUMNS)
            np.savetxt(fh, block, fmt="%.6g", delimiter=",")
    tmp.rename(path)
    return path


def _letor_line_block(rng: Any, qids: Any, d: int) -> str:
    import numpy as np

    n = len(qids)
    rel = rng.integers(0, 5, size=n)
    vals = np.round(rng.gamma(1.5, 2.0, size=(n, d)) * (rng.random((n, d)) > 0.15), 4)  # some exact zeros
    cols = [f"{k}:" for k in range(1, d + 1)]
    lines = []
    for i in range(n):
        feats = " ".join(c + format(v, "g") for c, v in zip(cols, vals[i].tolist()))
        lines.append(f"{rel[i]} qid:{qids[i]} {feats} #docid = {i}")
    return "\n".join(lines) + "\n"


def _letor_file(cache: Path, documents: int, queries: int, d: int, name: str = "train.txt") -> Path:
    folder = cache / f"letor_{documents}x{d}_{queries}q"
    path = folder / name
    if path.exists():
        return path
    import numpy as np

    _need(cache, documents * d * 9)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(documents)
    sizes = rng.multinomial(documents - queries, np.ones(queries) / queries) + 1  # every query has a document
    qids = np.repeat(np.arange(1, queries + 1), sizes)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        for start in range(0, documents, 20_000):
            fh.write(_letor_line_block(rng, qids[start : start + 20_000], d))
    tmp.rename(path)
    return path


def _letor_folder(cache: Path, documents: int, queries: int, d: int) -> Path:
    """train.txt (the big file) with small vali.txt / test.txt (1% each) beside it."""
    train = _letor_file(cache, documents, queries, d)
    import numpy as np

    for name in ("vali.txt", "test.txt"):
        p = train.parent / name
        if not p.exists():
            rng = np.random.default_rng(len(name))
            n = max(documents // 100, 10)
            p.write_text(_letor_line_block(rng, np.repeat(np.arange(1, n // 10 + 2), 10)[:n], d))
    return train.parent


# ------------------------------------------------------------------------------------------ children


def _status_bytes(key: str) -> int:
    import re

    m = re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(m.group(1)) * 1024 if m else -1


def _child(kind: str, path: str) -> None:
    """One reader in this fresh process: warm up on a tiny file, then report the peak resident growth of one read."""
    import numpy as np

    tiny = Path(tempfile.mkdtemp()) / "tiny"
    tiny.mkdir()
    for name in ("train.txt", "vali.txt", "test.txt"):
        (tiny / name).write_text("1 qid:1 1:0.5 2:1\n0 qid:1 1:2\n")
    if kind == "sklearn":
        from sklearn.datasets import load_svmlight_file

        def run(p: str) -> Any:
            return load_svmlight_file(p, dtype=np.float32, zero_based=False, query_id=True)

    elif kind == "sklearn_dense":
        from sklearn.datasets import load_svmlight_file

        def run(p: str) -> Any:
            x, y, q = load_svmlight_file(p, dtype=np.float32, zero_based=False, query_id=True)
            return x.toarray(), y, q

    elif kind == "rankwise":
        from rankwise.data import read_letor_dense

        def run(p: str) -> Any:
            return read_letor_dense(p)

    elif kind == "load_letor":
        from rankwise.data import load_letor

        def run(p: str) -> Any:
            return load_letor(str(Path(p).parent if Path(p).is_file() else p))

    else:
        raise SystemExit(f"unknown child {kind}")
    run(str(tiny / "train.txt") if kind != "load_letor" else str(tiny))
    base = _status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    result = run(path)
    wall = time.perf_counter() - t0
    peak = _status_bytes("VmHWM")
    print(json.dumps({"wall_s": wall, "base_rss": base, "peak_rss": peak, "growth": peak - base}))
    del result


def _measure_child(kind: str, path: Path) -> dict[str, Any]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run(
        [sys.executable, __file__, "--_child", kind, str(path)], env=env, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {kind} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------ sections


def bench_csv(cache: Path, scale: float, repeats: int) -> list[dict[str, Any]]:
    import pandas as pd

    from _timing import time_cases
    from rankwise.data import load_csv

    out = []
    for rows in CSV_ROWS:
        n = max(1000, int(rows * scale))
        path = _csv_file(cache, n)

        def ours(path: Path = path) -> Any:
            return load_csv(path, target="y")

        def pandas(path: Path = path) -> Any:
            return pd.read_csv(path).to_numpy(dtype="float64")

        t = time_cases({"pandas": pandas, "rankwise": ours}, repeats, warmup=1)
        out.append(
            {
                "rows": n,
                "columns": CSV_COLUMNS,
                "bytes": path.stat().st_size,
                "pandas_ms": t["pandas"]["median_ms"],
                "rankwise_ms": t["rankwise"]["median_ms"],
                "ratio": t["pandas"]["median_ms"] / t["rankwise"]["median_ms"],
                "repeats": t["rankwise"]["repeats"],
            }
        )
        print(
            f"csv {n:>9,} rows: pandas {out[-1]['pandas_ms']:9.1f} ms  rankwise {out[-1]['rankwise_ms']:9.1f} ms"
            f"  ratio {out[-1]['ratio']:.2f}",
            flush=True,
        )
    return out


def bench_letor(cache: Path, scale: float, repeats: int) -> dict[str, Any]:
    import numpy as np
    from sklearn.datasets import load_svmlight_file

    from _timing import time_cases
    from rankwise.data import read_letor_dense

    n = max(1000, int(MSLR["documents"] * scale))
    queries = max(10, int(MSLR["queries"] * scale))
    d = MSLR["features"]
    folder = _letor_folder(cache, n, queries, d)
    path = folder / "train.txt"

    ref: dict[str, Any] = {}

    def sk() -> Any:
        ref["x"] = load_svmlight_file(str(path), dtype=np.float32, zero_based=False, query_id=True)
        return ref["x"]

    def sk_dense() -> Any:
        x, y, q = load_svmlight_file(str(path), dtype=np.float32, zero_based=False, query_id=True)
        return x.toarray(), y, q

    def ours() -> Any:
        return read_letor_dense(path)

    t = time_cases({"sklearn": sk, "sklearn_dense": sk_dense, "rankwise": ours}, repeats, warmup=1)
    x, y, q = ours()
    rx, ry, rq = ref["x"]
    same = bool(np.array_equal(x, rx.toarray()) and np.array_equal(y, ry) and np.array_equal(q, rq))
    del rx, ry, rq, x, y, q
    ref.clear()
    memory = {k: _measure_child(k, path) for k in ("sklearn", "sklearn_dense", "rankwise")}
    memory["load_letor"] = _measure_child("load_letor", folder)
    dense = n * d * 4
    dense_all = dense + 2 * max(n // 100, 10) * d * 4  # the loader also holds vali / test
    result = {
        "documents": n,
        "features": d,
        "queries": queries,
        "bytes": path.stat().st_size,
        "dense_bytes": dense,
        "dense_bytes_all_splits": dense_all,
        "identical_to_sklearn": same,
        "sklearn_ms": t["sklearn"]["median_ms"],
        "sklearn_dense_ms": t["sklearn_dense"]["median_ms"],
        "rankwise_ms": t["rankwise"]["median_ms"],
        "ratio": t["sklearn"]["median_ms"] / t["rankwise"]["median_ms"],
        "ratio_dense": t["sklearn_dense"]["median_ms"] / t["rankwise"]["median_ms"],
        "repeats": t["rankwise"]["repeats"],
        "memory": memory,
        "memory_ratio": memory["rankwise"]["growth"] / dense,
        "memory_ratio_sklearn": memory["sklearn"]["growth"] / dense,
        "memory_ratio_load_letor": memory["load_letor"]["growth"] / dense_all,
    }
    print(
        f"letor {n:,} docs: sklearn {result['sklearn_ms']:.0f} ms (+toarray {result['sklearn_dense_ms']:.0f}) "
        f"rankwise {result['rankwise_ms']:.0f} ms ratio {result['ratio']:.2f}; peak growth / dense: rankwise "
        f"{result['memory_ratio']:.2f}, sklearn {result['memory_ratio_sklearn']:.2f}, load_letor "
        f"{result['memory_ratio_load_letor']:.2f}; identical {same}",
        flush=True,
    )
    return result


def _nifti_cohort(cache: Path, volumes: int) -> list[Path]:
    import nibabel as nib
    import numpy as np

    folder = cache / f"nifti_{volumes}"
    paths = [folder / f"sub{i:03d}.nii.gz" for i in range(volumes)]
    if all(p.exists() for p in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    shape = (120, 144, 120)  # 1.5 mm voxels, stored left-to-right flipped (LAS): reorientation has work to do
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, s) for s in shape], indexing="ij"))
    for i, p in enumerate(paths):
        r = np.sqrt(((grid / np.array([0.8, 0.85, 0.8])[:, None, None, None]) ** 2).sum(0))
        vol = np.where(r < 1, 100 + 30 * np.cos(6 * r + i) + rng.normal(0, 5, shape), 0).astype(np.float32)
        affine = np.diag([-1.5, 1.5, 1.5, 1.0])
        affine[:3, 3] = [90.0, -108.0, -90.0]
        nib.save(nib.Nifti1Image(vol[::-1].copy(), affine), str(p))
    return paths


def _positive(x: Any) -> Any:
    return x > 0


def _nifti_worker(args: tuple[str, list[str], str, float, tuple[int, int, int]]) -> int:
    import torch

    torch.set_num_threads(1)
    which, paths, out, spacing, shape = args
    if which == "rankwise":
        from rankwise.data import NiftiPreprocessing

        prep = NiftiPreprocessing(shape=list(shape), spacing=spacing, cache_dir=out)
        items = [{"path": Path(p), "row": i + 2} for i, p in enumerate(paths)]
        prep.cache_volumes(items, Path(out) / "cohort.csv")
    else:
        import numpy as np
        import torchio as tio

        pipeline = tio.Compose(
            [
                tio.ToCanonical(),
                tio.Resample(spacing),
                tio.CropOrPad(shape),
                tio.ZNormalization(masking_method=_positive),
            ]
        )
        for p in paths:
            img = pipeline(tio.ScalarImage(p))
            np.save(Path(out) / (Path(p).name + ".npy"), img.data[0].numpy().astype(np.float32))
    return len(paths)


def bench_nifti(cache: Path, volumes: int, repeats: int) -> dict[str, Any]:
    import multiprocessing as mp

    paths = [str(p) for p in _nifti_cohort(cache, volumes)]
    spacing, shape = 2.0, (80, 96, 80)
    rows = []
    ctx = mp.get_context("spawn")
    for workers in (1, 2):
        with ctx.Pool(workers) as pool:
            pool.map(_nifti_worker, [("torchio", paths[:1], tempfile.mkdtemp(), spacing, shape)] * workers)  # warm-up
            pool.map(_nifti_worker, [("rankwise", paths[:1], tempfile.mkdtemp(), spacing, shape)] * workers)
            times: dict[str, list[float]] = {"rankwise": [], "torchio": []}
            for rep in range(repeats):
                for which in ("rankwise", "torchio") if rep % 2 == 0 else ("torchio", "rankwise"):
                    out = tempfile.mkdtemp(prefix=f"readers_{which}_")
                    t0 = time.perf_counter()
                    pool.map(_nifti_worker, [(which, paths[w::workers], out, spacing, shape) for w in range(workers)])
                    times[which].append(time.perf_counter() - t0)
                    shutil.rmtree(out)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append(
            {
                "workers": workers,
                "rankwise_volumes_per_s": volumes / med["rankwise"],
                "torchio_volumes_per_s": volumes / med["torchio"],
                "ratio": med["torchio"] / med["rankwise"],
                "repeats": repeats,
            }
        )
        print(
            f"nifti {volumes} volumes, {workers} worker(s): rankwise {rows[-1]['rankwise_volumes_per_s']:.2f}/s "
            f"torchio {rows[-1]['torchio_volumes_per_s']:.2f}/s ratio {rows[-1]['ratio']:.2f}",
            flush=True,
        )
    return {
        "volumes": volumes,
        "input_shape": [120, 144, 120],
        "input_mm": 1.5,
        "spacing": spacing,
        "shape": list(shape),
        "runs": rows,
    }


def _image_set(cache: Path, images: int, size: int = 160) -> tuple[Path, Path]:
    import numpy as np
    from PIL import Image

    folder = cache / f"images_{images}"
    csv = folder / "images.csv"
    if csv.exists():
        return csv, folder / "test"
    rng = np.random.default_rng(0)
    lines = ["path,age,split"]
    for i in range(images + 2):
        split = "train" if i == 0 else "val" if i == 1 else "test"
        cls = f"c{i % 4}"
        rel = Path(split) / cls / f"img{i:05d}.jpg"
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        arr = (rng.random((size, size, 3)) * 64 + np.linspace(0, 190, size)[None, :, None]).astype(np.uint8)
        Image.fromarray(arr).save(folder / rel, quality=90)
        lines.append(f"{rel},{20 + i % 50},{split}")
    csv.write_text("\n".join(lines) + "\n")
    return csv, folder / "test"


def bench_images(cache: Path, images: int, repeats: int, image_size: int = 112) -> dict[str, Any]:
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    from rankwise.data import load_image_csv
    from rankwise.data.images import dir_image_transforms

    csv, folder = _image_set(cache, images)
    _, transform = dir_image_transforms(image_size)

    def build_ours() -> Any:
        return load_image_csv(csv, target="age", split_column="split", image_size=image_size).test

    def build_tv() -> Any:
        return ImageFolder(str(folder), transform=transform)

    ours, tv = build_ours(), build_tv()
    assert len(ours) == len(tv) == images
    from _timing import time_cases

    build = time_cases({"rankwise": build_ours, "torchvision": build_tv}, repeats, warmup=1)
    rows = []
    for workers in (0, 2):
        loaders = {
            "rankwise": DataLoader(ours, batch_size=32, num_workers=workers, persistent_workers=workers > 0),
            "torchvision": DataLoader(tv, batch_size=32, num_workers=workers, persistent_workers=workers > 0),
        }

        def one_pass(dl: Any) -> Any:
            return lambda: [b[0].shape for b in dl]

        t = time_cases({k: one_pass(dl) for k, dl in loaders.items()}, repeats, warmup=1)
        rows.append(
            {
                "workers": workers,
                "rankwise_images_per_s": images / (t["rankwise"]["median_ms"] / 1e3),
                "torchvision_images_per_s": images / (t["torchvision"]["median_ms"] / 1e3),
                "ratio": t["torchvision"]["median_ms"] / t["rankwise"]["median_ms"],
                "repeats": t["rankwise"]["repeats"],
            }
        )
        print(
            f"images {images}, {workers} workers: rankwise {rows[-1]['rankwise_images_per_s']:.0f}/s "
            f"torchvision {rows[-1]['torchvision_images_per_s']:.0f}/s ratio {rows[-1]['ratio']:.2f}",
            flush=True,
        )
    return {
        "images": images,
        "image_size": image_size,
        "build_ms": {k: v["median_ms"] for k, v in build.items()},
        "runs": rows,
    }


# ------------------------------------------------------------------------------------------ table


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def markdown(result: dict[str, Any]) -> str:
    """The docs table of a result of this script."""
    lines = [
        "| reader | size | reference | reference | rankwise | ratio | goal | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("csv", []):
        lines.append(
            f"| CSV table (`load_csv`) | {r['rows']:,} rows x {r['columns']} | `pandas.read_csv` "
            f"| {r['pandas_ms'] / 1e3:.2f} s | {r['rankwise_ms'] / 1e3:.2f} s | {r['ratio']:.2f} "
            f"| >= {GOALS['csv']:g} | {_met(r['ratio'] >= GOALS['csv'])} |"
        )
    le = result.get("letor")
    if le:
        size = f"{le['documents']:,} docs x {le['features']}, {le['queries']:,} queries ({le['bytes'] / 1e6:,.0f} MB)"
        lines.append(
            f"| LETOR (`read_letor_dense`), time | {size} | `load_svmlight_file` (sparse) "
            f"| {le['sklearn_ms'] / 1e3:.2f} s | {le['rankwise_ms'] / 1e3:.2f} s | {le['ratio']:.2f} "
            f"| >= {GOALS['letor_time']:g} | {_met(le['ratio'] >= GOALS['letor_time'])} |"
        )
        lines.append(
            f"| LETOR, time to a dense array | same | `load_svmlight_file` + `toarray()` "
            f"| {le['sklearn_dense_ms'] / 1e3:.2f} s | {le['rankwise_ms'] / 1e3:.2f} s | {le['ratio_dense']:.2f} | | |"
        )
        mem = le["memory"]
        dense_mb = le["dense_bytes"] / 1e6
        lines.append(
            f"| LETOR, peak memory growth / dense float32 ({dense_mb:,.0f} MB) | same | `load_svmlight_file` "
            f"| {mem['sklearn']['growth'] / 1e6:,.0f} MB ({le['memory_ratio_sklearn']:.2f}x) "
            f"| {mem['rankwise']['growth'] / 1e6:,.0f} MB ({le['memory_ratio']:.2f}x) | "
            f"| <= {GOALS['letor_memory']:g}x | {_met(le['memory_ratio'] <= GOALS['letor_memory'])} |"
        )
        lines.append(
            f"| LETOR loader (`load_letor`: read, group, standardise), peak growth / dense | train = that file "
            f"| `load_svmlight_file` + `toarray()` | {mem['sklearn_dense']['growth'] / 1e6:,.0f} MB "
            f"| {mem['load_letor']['growth'] / 1e6:,.0f} MB ({le['memory_ratio_load_letor']:.2f}x) | | | |"
        )
    ni = result.get("nifti")
    if ni:
        for r in ni["runs"]:
            lines.append(
                f"| NIfTI cohort preprocessing, volumes/s, {r['workers']} worker{'s' if r['workers'] > 1 else ''} "
                f"| {ni['volumes']} x {tuple(ni['input_shape'])} at {ni['input_mm']} mm -> {ni['spacing']:g} mm "
                f"{tuple(ni['shape'])} | TorchIO pipeline | {r['torchio_volumes_per_s']:.2f} "
                f"| {r['rankwise_volumes_per_s']:.2f} | {r['ratio']:.2f} | >= {GOALS['nifti']:g} "
                f"| {_met(r['ratio'] >= GOALS['nifti'])} |"
            )
    im = result.get("images")
    if im:
        for r in im["runs"]:
            lines.append(
                f"| image CSV (`load_image_csv`) + DataLoader, images/s, {r['workers']} workers "
                f"| {im['images']} JPEG 160 px -> {im['image_size']} px | `ImageFolder` + DataLoader "
                f"| {r['torchvision_images_per_s']:.0f} | {r['rankwise_images_per_s']:.0f} | {r['ratio']:.2f} | | |"
            )
        b = im["build_ms"]
        lines.append(
            f"| image CSV, building the dataset | same | `ImageFolder(...)` | {b['torchvision']:.0f} ms "
            f"| {b['rankwise']:.0f} ms | {b['torchvision'] / b['rankwise']:.2f} | | |"
        )
    load = result.get("loadavg_start") or []
    lines.append("")
    lines.append(
        f"*`{result.get('command', 'python benchmarks/readers.py')}` at rankwise commit `{result.get('commit')}`"
        f"{' (with uncommitted changes)' if result.get('dirty') else ''}, {result.get('date')}, "
        f"{result['machine'].get('cpu_count')} CPUs ({result['machine'].get('platform')}), torch "
        f"{result['machine'].get('torch')}, {result.get('threads')} torch thread(s), load average "
        f"{' / '.join(f'{x:.2f}' for x in load) or 'n/a'} at the start. Ratio = reference time / rankwise time "
        "(above 1: rankwise is faster); memory: growth of the peak resident set of one read in a fresh process.*"
    )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", metavar="JSON", help="print the docs table of a result file and exit")
    ap.add_argument("--scale", type=float, default=1.0, help="scale of the CSV rows and LETOR documents (1: full)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--letor-repeats", type=int, default=3)
    ap.add_argument("--volumes", type=int, default=16, help="NIfTI volumes in the cohort")
    ap.add_argument("--images", type=int, default=512, help="images of the image-CSV case")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the CSV / LETOR / image cases")
    ap.add_argument("--only", default="csv,letor,nifti,images", help="comma-separated sections")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "rankwise_readers")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.markdown:
        print(markdown(json.loads(Path(a.markdown).read_text())))
        return
    if a._child:
        _child(*a._child)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    from _timing import loadavg, machine

    torch.set_num_threads(a.threads)
    only = set(a.only.split(","))
    result: dict[str, Any] = {
        "benchmark": "readers",
        "command": "python benchmarks/readers.py"
        + "".join(f" {x}" for x in (argv if argv is not None else sys.argv[1:])),
        "commit": _git("rev-parse", "--short", "HEAD") or None,
        "dirty": bool(_git("status", "--porcelain", "src")),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "threads": a.threads,
        "scale": a.scale,
        "loadavg_start": loadavg(),
    }
    print(f"inputs in {a.cache} ({_free_bytes(a.cache) / 1e9:.0f} GB free); load {result['loadavg_start']}", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    sections = {
        "csv": lambda: bench_csv(a.cache, a.scale, a.repeats),
        "letor": lambda: bench_letor(a.cache, a.scale, a.letor_repeats),
        "nifti": lambda: bench_nifti(a.cache, a.volumes, a.repeats),
        "images": lambda: bench_images(a.cache, a.images, a.repeats),
    }
    for name, run in sections.items():
        if name in only:
            result[name] = run()
            result["loadavg_end"] = loadavg()
            a.out.write_text(json.dumps(result, indent=1) + "\n")  # after every section: a partial run keeps its part
    print(markdown(result))


if __name__ == "__main__":
    main()
