"""Scale: peak memory of training and prediction on large files, the brain-age memory estimate against
the real peak, and the brain-age loader's volumes per second from its cache.

Usage::

    python benchmarks/scale.py                  # every case (about an hour on 2 CPUs; files in a temp dir)
    python benchmarks/scale.py --only estimate,predict --predict-rows 1000000,10000000
    python benchmarks/scale.py --markdown benchmarks/results/scale.json   # the docs table only

Every measured command runs in a fresh process; its peak resident set is the kernel's ``ru_maxrss`` of
that child (``os.wait4``), so imports, reading, training and writing are all counted; its CPU time
(user + system) comes from the same call. Cases:

* **estimate**: :mod:`rankwise.recipes.brain_age.memory` estimates a ScaleDense training step (one
  measured forward/backward of two volumes at a small grid, scaled by the grid and the batch) against the
  real peak of that step (forward, backward, Adam step) of the same network, grid and batch in a child
  whose peak is reset (``/proc/self/clear_refs``) after the estimate: the ratio estimate / peak, for
  three configurations; then the estimate and the one-line refusal of the authors' preset
  (``brain_age_tsan``: ScaleDense 8 filters, 5 blocks, 91 x 109 x 91, batch 32) on this machine.
* **predict**: ``rankwise predict RUN --data FILE`` of a table run (a small MLP trained on 2,000 rows
  of 8 features) on files of ``--predict-rows`` rows: wall time and peak resident set (the file is read
  and written in blocks of 100,000 rows, so the peak should not grow with the rows).
* **train_table**: ``rankwise train --data FILE --target y --method vanilla``, one epoch, on a table of
  ``--table-rows`` rows x 20 columns.
* **letor**: ``rankwise train`` of ``ltr_synthetic_listnet``'s loss and a 64-unit MLP on an MSLR-WEB10K
  layout (``Fold1/{train,vali,test}.txt``, 60 / 20 / 20 %, 136 features, 120 documents a query) of
  ``--letor-scale`` x 1.2e6 documents, one epoch.
* **loader**: a synthetic brain-age cohort (``make_brain_age_synthetic``, ``--cohort`` volumes at
  ``--cohort-spacing`` mm, 2 mm: 91 x 109 x 91) preprocessed once into its cache; then the training
  loader alone (no model) over the cached training volumes, one epoch for each of ``--loader-workers``
  x ``--loader-batches``: volumes per second; then ``--step-repeats`` training steps (forward, MSE
  backward, Adam step; the recipe's loss adds terms, so a real step is no faster) of the authors'
  ScaleDense (8 filters, 5 blocks) on the CPU, 1 thread, at the cohort's grid and each of
  ``--step-batches``, and for every loader setting the ratio of its time for a batch to that step's
  (the fastest step a volume times the batch). ``--cohort-distinct K`` generates K volumes and copies
  them up to ``--cohort`` (each copy differs in its gzip header, so that it is its own cache entry and
  is preprocessed and read like a new subject); ``--cohort-csv`` uses an existing cohort.

The JSON (``benchmarks/results/scale.json``) holds every figure with the commit, date, machine, load
averages and thread count; ``--markdown JSON`` prints the docs table from it and runs nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES = ("estimate", "predict", "train_table", "letor", "loader")
GiB = float(2**30)

#: ScaleDense configurations whose estimate is checked against the real peak: name, options, grid, batch
ESTIMATE_CONFIGS = (
    ("ScaleDense 4 filters, 3 blocks", {"nb_filter": 4, "nb_block": 3, "use_sex": True}, (32, 40, 32), 4),
    (
        "ScaleDense 4 filters, 3 blocks (synthetic preset)",
        {"nb_filter": 4, "nb_block": 3, "use_sex": True},
        (46, 54, 46),
        8,
    ),
    ("ScaleDense 8 filters, 5 blocks (authors')", {"nb_filter": 8, "nb_block": 5, "use_sex": True}, (48, 57, 48), 2),
)


# ------------------------------------------------------------------------------------------ provenance


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True).stdout
        return out.stdout.strip() + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _machine() -> dict[str, Any]:
    mem = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = float(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(mem / GiB, 1),
    }


# ------------------------------------------------------------------------------------------ children


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("RANKWISE_NUMBA", "sync")
    return env


def _run(cmd: list[str], *, cwd: Path | None = None) -> dict[str, Any]:
    """Run ``cmd`` in a fresh process: its exit code, wall seconds, CPU seconds (user + system, its own and
    those of the children it waited for), peak resident set (GiB, the kernel's ``ru_maxrss``: the
    largest ``VmHWM`` of the process and of those children) and output tail."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    res = {
        "code": proc.returncode,
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_gib": round(usage.ru_maxrss * 1024 / GiB, 3),
    }
    if proc.returncode != 0:
        res["output_tail"] = text[-2000:]
    else:
        res["output"] = text.strip().splitlines()[-3:]
    return res


def _rankwise(*args: str) -> list[str]:
    return [sys.executable, "-c", "from rankwise.cli import main; main()", *args]


_PEAK_CHILD = """
import json, sys, torch
from rankwise import models
from rankwise.recipes.brain_age.memory import _measure
opts, shape, batch = json.loads(sys.argv[1]), tuple(json.loads(sys.argv[2])), int(sys.argv[3])
torch.set_num_threads(1)
cost = _measure("scale_dense", json.dumps(opts, sort_keys=True), shape, "cpu")
estimate = cost.bytes(shape, batch)
torch.manual_seed(0)
net, _ = models.build_backbone("scale_dense", **opts)
opt = torch.optim.Adam(net.parameters())
x, sex = torch.randn(batch, 1, *shape), torch.zeros(batch, 2)
sex[:, 1] = 1
open("/proc/self/clear_refs", "w").write("5")  # the peak of the step and what the process holds
net(x, sex).sum().backward()
opt.step()
hwm = [int(ln.split()[1]) * 1024 for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
print(json.dumps({"estimate": estimate, "peak": hwm, "measured_at": list(cost.measured_shape)}))
"""

_REFUSAL_CHILD = """
import json, torch
from rankwise.recipes.brain_age.memory import available_memory, check_memory
from rankwise.recipes.config import ConfigError
from rankwise.recipes import load_config
torch.set_num_threads(1)
cfg = load_config("brain_age_tsan", [])
shape = tuple(cfg.data.options["shape"])
try:
    cost = check_memory(cfg, shape)
    print(json.dumps({"refused": False, "estimate": cost.bytes(shape, cfg.data.batch_size) if cost else None}))
except ConfigError as e:
    print(json.dumps({"refused": True, "message": "error: " + str(e), "available": available_memory().bytes}))
"""


def _child_json(code: str, *args: str) -> dict[str, Any]:
    res = _run([sys.executable, "-c", code, *args])
    if res["code"] != 0:
        return res
    return {**json.loads(res["output"][-1]), "wall_s": res["wall_s"], "peak_rss_gib": res["peak_rss_gib"]}


def bench_estimate(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    rows = []
    for name, opts, shape, batch in ESTIMATE_CONFIGS:
        got = _child_json(_PEAK_CHILD, json.dumps(opts), json.dumps(list(shape)), str(batch))
        if "estimate" in got:
            got["ratio"] = round(got["estimate"] / got["peak"], 3)
            got["estimate_gib"], got["peak_gib"] = round(got["estimate"] / GiB, 3), round(got["peak"] / GiB, 3)
        rows.append({"config": name, "shape": list(shape), "batch": batch, **got})
        print(f"estimate  {name} {shape} batch {batch}: {got}", flush=True)
    refusal = _child_json(_REFUSAL_CHILD)
    print(f"refusal   brain_age_tsan: {refusal}", flush=True)
    return {"configs": rows, "brain_age_tsan": refusal}


# ------------------------------------------------------------------------------------------ table files


def _write_table(path: Path, rows: int, cols: int, *, seed: int, block: int = 200_000) -> None:
    """``rows`` rows of ``cols - 1`` features ``x0..`` (3 decimals) and a target ``y`` (a linear function + noise)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    w = rng.normal(size=cols - 1)
    fmt = ",".join(["%.3f"] * cols)
    with open(path, "w") as fh:
        fh.write(",".join([f"x{i}" for i in range(cols - 1)] + ["y"]) + "\n")
        for start in range(0, rows, block):
            n = min(block, rows - start)
            x = rng.normal(size=(n, cols - 1))
            y = 50 + 10 * x @ w / np.sqrt(cols) + rng.normal(size=n)
            a = np.column_stack([x, y])
            fh.write("\n".join(fmt % tuple(r) for r in a.tolist()) + "\n")


def _small_table_run(work: Path) -> Path:
    src = work / "small.csv"
    _write_table(src, 2000, 9, seed=0)
    run = work / "table_run"
    sets = ["trainer.max_epochs=1", "trainer.num_threads=1", "report.plots=false", "model.options.hidden=[32]"]
    res = _run(
        _rankwise(
            "train",
            "--data",
            str(src),
            "--target",
            "y",
            "--method",
            "vanilla",
            "--out",
            str(run),
            "--no-progress",
            *[a for s in sets for a in ("--set", s)],
        )
    )
    if res["code"] != 0:
        raise RuntimeError(f"training the table run failed: {res}")
    return run


def bench_predict(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    run = _small_table_run(work)
    out: dict[str, Any] = {}
    for n in args.predict_rows:
        data = work / f"predict_{n}.csv"
        t0 = time.perf_counter()
        _write_table(data, n, 9, seed=1)
        made = time.perf_counter() - t0
        res = _run(_rankwise("predict", str(run), "--data", str(data), "--out", str(work / f"pred_{n}.csv")))
        res.update(rows=n, file_gib=round(data.stat().st_size / GiB, 3), generate_s=round(made, 1), loadavg=_loadavg())
        out[str(n)] = res
        print(f"predict   {n:,} rows: {res}", flush=True)
        data.unlink()
        (work / f"pred_{n}.csv").unlink(missing_ok=True)
    return out


def bench_train_table(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in args.table_rows:
        data = work / f"train_{n}.csv"
        _write_table(data, n, 20, seed=2)
        sets = ["trainer.max_epochs=1", "trainer.num_threads=1", "report.plots=false", "data.batch_size=256"]
        cmd = _rankwise(
            "train",
            "--data",
            str(data),
            "--target",
            "y",
            "--method",
            "vanilla",
            "--out",
            str(work / f"run_{n}"),
            "--no-progress",
        )
        res = _run([*cmd, *[a for s in sets for a in ("--set", s)]])
        res.update(rows=n, columns=20, file_gib=round(data.stat().st_size / GiB, 3), loadavg=_loadavg())
        out[str(n)] = res
        print(f"train     table {n:,} x 20: {res}", flush=True)
        data.unlink()
        shutil.rmtree(work / f"run_{n}", ignore_errors=True)
    return out


def _write_letor(path: Path, docs: int, queries: int, *, seed: int, features: int = 136) -> None:
    """A LETOR file of ``docs`` documents over ``queries`` queries (consecutive), ``features`` values in
    [0, 1) with 3 decimals, grades 0-4; fixed-width lines built in numpy (fast)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    qids = np.sort(rng.integers(0, queries, size=docs))
    head = [b"g", b" qid:", b"000000"]
    tokens = [f" {j + 1}:0.".encode() for j in range(features)]
    width = 1 + 5 + 6 + sum(len(t) + 3 for t in tokens) + 1
    block = 50_000
    with open(path, "wb") as fh:
        for start in range(0, docs, block):
            n = min(block, docs - start)
            buf = np.full((n, width), ord(" "), dtype=np.uint8)
            grade = rng.integers(0, 5, size=n)
            buf[:, 0] = ord("0") + grade
            buf[:, 1:6] = np.frombuffer(b" qid:", dtype=np.uint8)
            q = qids[start : start + n]
            for k in range(6):
                buf[:, 6 + k] = ord("0") + (q // 10 ** (5 - k)) % 10
            pos = 12
            vals = rng.integers(0, 1000, size=(n, features))
            vals[:, 0] = np.minimum(999, vals[:, 0] // 2 + 200 * grade)  # a feature that carries the grade
            for j, t in enumerate(tokens):
                buf[:, pos : pos + len(t)] = np.frombuffer(t, dtype=np.uint8)
                pos += len(t)
                v = vals[:, j]
                buf[:, pos] = ord("0") + v // 100
                buf[:, pos + 1] = ord("0") + (v // 10) % 10
                buf[:, pos + 2] = ord("0") + v % 10
                pos += 3
            buf[:, pos] = ord("\n")
            fh.write(buf[:, : pos + 1].tobytes())
    del head


def bench_letor(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    docs, queries = int(1.2e6 * args.letor_scale), int(10_000 * args.letor_scale)
    fold = work / "mslr" / "Fold1"
    fold.mkdir(parents=True)
    t0 = time.perf_counter()
    for name, share, seed in (("train.txt", 0.6, 3), ("vali.txt", 0.2, 4), ("test.txt", 0.2, 5)):
        _write_letor(fold / name, int(docs * share), max(int(queries * share), 1), seed=seed)
    made = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in fold.iterdir())
    sets = [
        "data.name=letor",
        f"data.options={{path: {work / 'mslr'}, fold: 1, num_features: 136}}",
        "model.options={hidden: [64], feature_dim: 32, dropout: 0.0}",
        "trainer.max_epochs=1",
        "trainer.num_threads=1",
        "data.num_workers=0",
        "report.plots=false",
    ]
    cmd = _rankwise("train", "ltr_synthetic_listnet", "--out", str(work / "ltr_run"), "--no-progress")
    res = _run([*cmd, *[a for s in sets for a in ("--set", s)]])
    res.update(documents=docs, queries=queries, features=136, files_gib=round(size / GiB, 3), generate_s=round(made, 1))
    res["dense_float32_gib"] = round(docs * 136 * 4 / GiB, 3)
    res["loadavg"] = _loadavg()
    print(f"train     letor {docs:,} documents: {res}", flush=True)
    shutil.rmtree(work / "mslr", ignore_errors=True)
    shutil.rmtree(work / "ltr_run", ignore_errors=True)
    return res


_LOADER_CHILD = """
import json, sys, time, torch
from torch.utils.data import DataLoader
from rankwise.data.nifti import load_nifti_csv
torch.set_num_threads(1)
csv, cache, workers, batches = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
t0 = time.perf_counter()
data = load_nifti_csv(csv, cache_dir=cache)
first = time.perf_counter() - t0
t0 = time.perf_counter()
data = load_nifti_csv(csv, cache_dir=cache)
again = time.perf_counter() - t0
out = {"volumes": len(data.train) + len(data.val) + len(data.test), "train": len(data.train),
       "shape": list(data.meta["shape"]), "preprocess_and_cache_s": round(first, 2), "reload_s": round(again, 2),
       "rates": []}
for w in workers:
    for b in batches:
        g = torch.Generator().manual_seed(0)
        dl = DataLoader(data.train, batch_size=b, shuffle=True, generator=g, num_workers=w,
                        collate_fn=data.meta.get("collate_fn"), drop_last=True)
        seen, t0, c0, first_batch = 0, time.perf_counter(), time.process_time(), None
        for batch in dl:
            seen += batch[0]["volume"].shape[0]
            if first_batch is None:
                first_batch = time.perf_counter() - t0
        wall = time.perf_counter() - t0
        out["rates"].append({"workers": w, "batch": b, "volumes": seen, "wall_s": round(wall, 2),
                             "first_batch_s": round(first_batch or 0.0, 2),
                             "main_cpu_s": round(time.process_time() - c0, 2),
                             "volumes_per_s": round(seen / wall, 1)})
        print(json.dumps(out["rates"][-1]), file=sys.stderr, flush=True)
print(json.dumps(out))
"""

#: one training step (forward, MSE backward, Adam step) of the authors' ScaleDense (TSAN's first stage) on CPU
_STEP_CHILD = """
import json, sys, time, torch
from rankwise import models
shape, batch, steps = tuple(json.loads(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
torch.manual_seed(0)
net, _ = models.build_backbone("scale_dense", nb_filter=8, nb_block=5, use_sex=True)
opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=5e-4)
x, sex, y = torch.randn(batch, 1, *shape), torch.zeros(batch, 2), torch.full((batch,), 50.0)
sex[:, 1] = 1
wall, cpu = [], []
for _ in range(steps):
    t0, c0 = time.perf_counter(), time.process_time()
    opt.zero_grad()
    loss = ((net(x, sex).reshape(batch, -1)[:, 0] - y) ** 2).mean()
    loss.backward()
    opt.step()
    wall.append(round(time.perf_counter() - t0, 2))
    cpu.append(round(time.process_time() - c0, 2))
print(json.dumps({"shape": list(shape), "batch": batch, "step_wall_s": wall, "step_cpu_s": cpu}))
"""


def _ints(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",") if v]


def _replicate_cohort(csv: Path, n: int) -> Path:
    """A cohort of ``n`` rows from the distinct volumes of ``csv`` (a ``make_brain_age_synthetic`` cohort),
    written next to it as ``participants_<n>.csv``: copy ``k`` of ``sub-X.nii.gz`` is ``sub-X_rk.nii.gz``
    whose bytes differ from the original only in the gzip header's MTIME field, so every copy is its own
    cache entry (the cache is keyed by the file's bytes), decoded and preprocessed like a new subject; a
    copy keeps its subject id (and so the split of its original) and its age."""
    import csv as csvlib

    with open(csv, newline="") as fh:
        rows = list(csvlib.DictReader(fh))
    if not rows:
        raise ValueError(f"{csv}: no volume to replicate")
    out = []
    for k in range((n + len(rows) - 1) // len(rows)):
        for row in rows:
            if len(out) == n:
                break
            if k == 0:
                out.append(row)
                continue
            src = csv.parent / row["path"]
            name = row["path"].removesuffix(".nii.gz") + f"_r{k}.nii.gz"
            data = bytearray(src.read_bytes())
            if data[:2] != b"\x1f\x8b" or data[3] & 0x02:  # not gzip, or a header CRC that would break
                raise ValueError(f"{src}: not a gzip file without a header CRC")
            data[4:8] = k.to_bytes(4, "little")
            (csv.parent / name).write_bytes(bytes(data))
            out.append({**row, "path": name})
    dest = csv.parent / f"participants_{n}.csv"
    with open(dest, "w", newline="") as fh:
        writer = csvlib.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(out)
    return dest


def bench_loader(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    csv = args.cohort_csv
    distinct = args.cohort_distinct or args.cohort
    generate_s = None
    if csv is None:
        gen = (
            "import sys; from rankwise.data.synthetic_mri import make_brain_age_synthetic; "
            "print(make_brain_age_synthetic(sys.argv[1], n=int(sys.argv[2]), spacing=float(sys.argv[3]), seed=0))"
        )
        made = _run([sys.executable, "-c", gen, str(work / "cohort"), str(distinct), str(args.cohort_spacing)])
        if made["code"] != 0:
            return {"error": made}
        csv, generate_s = work / "cohort" / "participants.csv", made["wall_s"]
    if distinct < args.cohort:
        csv = _replicate_cohort(Path(csv), args.cohort)
    res = _child_json(
        _LOADER_CHILD,
        str(csv),
        str(work / "cache"),
        json.dumps(_ints(args.loader_workers)),
        json.dumps(_ints(args.loader_batches)),
    )
    res.update(
        generate_s=generate_s,
        distinct_volumes=min(distinct, args.cohort),
        cohort_spacing_mm=args.cohort_spacing,
        loadavg=_loadavg(),
    )
    print(f"loader    {args.cohort} volumes at {args.cohort_spacing} mm: {res}", flush=True)
    shutil.rmtree(work / "cohort", ignore_errors=True)
    shutil.rmtree(work / "cache", ignore_errors=True)
    steps = []
    for batch in _ints(args.step_batches) if "shape" in res else []:
        step = _child_json(_STEP_CHILD, json.dumps(res["shape"]), str(batch), str(args.step_repeats))
        if "step_wall_s" in step:
            step["step_s_per_volume"] = round(min(step["step_wall_s"]) / batch, 2)
        steps.append(step)
        print(f"step      ScaleDense {res['shape']} batch {batch}: {step}", flush=True)
    timed = [st["step_s_per_volume"] for st in steps if "step_s_per_volume" in st]
    if timed:
        per_volume = min(timed)  # the fastest step a volume: the loader's hardest comparison
        for rate in res["rates"]:
            # a step of that batch takes about batch x this (a lower bound: the real loss adds its terms);
            # the loader delivers the batch in batch / rate: their ratio, < 1 when the loader keeps up
            rate["loader_over_step"] = round(1.0 / (rate["volumes_per_s"] * per_volume), 5)
            rate["loader_s_per_batch"] = round(rate["batch"] / rate["volumes_per_s"], 3)
            rate["step_s_per_batch_linear"] = round(rate["batch"] * per_volume, 1)
    res["tsan_steps"] = steps
    return res


# ------------------------------------------------------------------------------------------ table


def _gib(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "–"


def markdown(result: dict[str, Any]) -> str:
    """The docs table of a result of this script (provenance line first)."""
    m = result["machine"]
    lines = [f"Machine: {m['platform']}, {m['cpu_count']} CPUs, {m['memory_gib']} GiB; 1 torch thread. Cases:"]
    for case, prov in result.get("provenance", {}).items():
        load = f"{prov['loadavg_start'][0]} / {prov['loadavg_end'][0]}" if prov["loadavg_start"] else "?"
        lines.append(
            f"`{case}` at commit `{prov['commit']}` on {prov['date']} (1-minute load average {load} at its start / "
            f"end; `python benchmarks/scale.py {prov['argv']}`);"
        )
    lines += ["", "| case | size | wall (s) | CPU (s) | peak RSS (GiB) | note |", "|---|---|---|---|---|---|"]
    cases = result.get("cases", {})
    for row in cases.get("estimate", {}).get("configs", []):
        shape = "x".join(str(s) for s in row["shape"])
        lines.append(
            f"| memory estimate: {row['config']} | {shape}, batch {row['batch']} | {row.get('wall_s', '–')} "
            f"| {row.get('cpu_s', '–')} | {_gib(row.get('peak_gib'))} | estimate {_gib(row.get('estimate_gib'))} GiB, "
            f"estimate / peak {row.get('ratio', '–')} |"
        )
    refusal = cases.get("estimate", {}).get("brain_age_tsan")
    if refusal:
        note = "refused before training" if refusal.get("refused") else "fits"
        lines.append(
            f"| `brain_age_tsan` memory check | 91x109x91, batch 32 | {refusal.get('wall_s', '–')} "
            f"| {refusal.get('cpu_s', '–')} | {_gib(refusal.get('peak_rss_gib'))} | {note} |"
        )
    for n, row in cases.get("predict", {}).items():
        lines.append(
            f"| `rankwise predict` (table run) | {int(n):,} rows ({row['file_gib']:.2f} GiB file) | {row['wall_s']} "
            f"| {row.get('cpu_s', '–')} | {_gib(row['peak_rss_gib'])} | exit {row['code']} |"
        )
    for n, row in cases.get("train_table", {}).items():
        lines.append(
            f"| `rankwise train`, one epoch (table) | {int(n):,} rows x 20 columns ({row['file_gib']:.2f} GiB) "
            f"| {row['wall_s']} | {row.get('cpu_s', '–')} | {_gib(row['peak_rss_gib'])} | exit {row['code']} |"
        )
    letor = cases.get("letor")
    if letor:
        lines.append(
            f"| `rankwise train`, one epoch (LETOR, MSLR-WEB10K layout) | {letor['documents']:,} documents x 136, "
            f"{letor['queries']:,} queries ({letor['files_gib']:.2f} GiB) | {letor['wall_s']} "
            f"| {letor.get('cpu_s', '–')} | {_gib(letor['peak_rss_gib'])} "
            f"| dense float32 features {letor['dense_float32_gib']:.2f} GiB; exit {letor['code']} |"
        )
    loader = cases.get("loader")
    if loader and "volumes" in loader:
        shape = "x".join(str(s) for s in loader["shape"])
        distinct = loader.get("distinct_volumes", loader["volumes"])
        made = f", {distinct} distinct" if distinct < loader["volumes"] else ""
        lines.append(
            f"| brain-age cohort preprocessed into its cache | {loader['volumes']} synthetic volumes{made}, {shape} "
            f"| {loader['preprocess_and_cache_s']} | – | {_gib(loader.get('peak_rss_gib'))} "
            f"| read back from the cache in {loader['reload_s']} s |"
        )
        for rate in loader.get("rates", []):
            vs = f"{rate['volumes_per_s']} volumes/s"
            if "loader_over_step" in rate:
                vs += (
                    f"; a batch in {rate['loader_s_per_batch']} s against about {rate['step_s_per_batch_linear']} s "
                    f"for the ScaleDense step (loader / step {rate['loader_over_step']:.4f})"
                )
            lines.append(
                f"| brain-age training loader from the cache (no model) | {rate['volumes']} volumes, batch "
                f"{rate['batch']}, {rate['workers']} worker(s) | {rate['wall_s']} "
                f"| {rate['main_cpu_s']} (main process) | – | {vs} |"
            )
        for step in loader.get("tsan_steps", []):
            if "step_wall_s" not in step:
                continue
            lines.append(
                f"| ScaleDense (TSAN, 8 filters, 5 blocks) training step on the CPU, 1 thread | {shape}, batch "
                f"{step['batch']} | {min(step['step_wall_s'])} | {min(step['step_cpu_s'])} "
                f"| {_gib(step.get('peak_rss_gib'))} "
                f"| {step['step_s_per_volume']} s a volume (fastest of {len(step['step_wall_s'])} steps) |"
            )
    if refusal and refusal.get("message"):
        lines += ["", "The refusal of `brain_age_tsan` on this machine:", "", "```text", refusal["message"], "```"]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", "--case", default=",".join(CASES), help=f"comma-separated among {', '.join(CASES)}")
    p.add_argument("--predict-rows", default="1000000,10000000")
    p.add_argument("--table-rows", default="1000000")
    p.add_argument("--letor-scale", type=float, default=1.0, help="share of MSLR-WEB10K's 1.2e6 documents")
    p.add_argument("--cohort", type=int, default=2000, help="synthetic volumes of the loader case")
    p.add_argument("--cohort-spacing", type=float, default=2.0, help="their grid (mm; 2 mm: 91 x 109 x 91)")
    p.add_argument(
        "--cohort-distinct",
        type=int,
        help="generate this many distinct volumes and copy them up to --cohort (byte-distinct copies; default all)",
    )
    p.add_argument(
        "--cohort-csv", type=Path, help="an existing cohort's participants.csv (make_brain_age_synthetic's) instead"
    )
    p.add_argument("--loader-workers", default="1,2", help="DataLoader workers of the loader case")
    p.add_argument("--loader-batches", default="8,32", help="its batch sizes")
    p.add_argument("--step-batches", default="1,4", help="batches of the timed ScaleDense steps (empty: none)")
    p.add_argument("--step-repeats", type=int, default=2, help="steps timed (the fastest is used)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scale.json")
    p.add_argument("--markdown", type=Path, metavar="JSON", help="only print the docs table of this JSON")
    a = p.parse_args()
    if a.markdown:
        print(markdown(json.loads(a.markdown.read_text())))
        return
    a.predict_rows = [int(float(v)) for v in a.predict_rows.split(",") if v]
    a.table_rows = [int(float(v)) for v in a.table_rows.split(",") if v]
    only = [c for c in a.only.split(",") if c]
    unknown = sorted(set(only) - set(CASES))
    if unknown:
        p.error(f"--only: unknown case(s) {unknown}; choose among {', '.join(CASES)}")
    result: dict[str, Any] = json.loads(a.out.read_text()) if a.out.exists() else {}
    result.update(
        commit=_commit(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        machine=_machine(),
        loadavg_start=_loadavg(),
        threads=1,
        argv=" ".join(sys.argv[1:]),
    )
    result.setdefault("cases", {})
    benches = {
        "estimate": bench_estimate,
        "predict": bench_predict,
        "train_table": bench_train_table,
        "letor": bench_letor,
        "loader": bench_loader,
    }
    with tempfile.TemporaryDirectory(prefix="rankwise_scale_") as tmp:
        for case in only:
            start = _loadavg()
            result["cases"][case] = benches[case](a, Path(tmp))
            result.setdefault("provenance", {})[case] = {
                "commit": result["commit"],
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "loadavg_start": start,
                "loadavg_end": _loadavg(),
                "argv": result["argv"],
            }
    result["loadavg_end"] = _loadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")
    print(markdown(result))


if __name__ == "__main__":
    main()
