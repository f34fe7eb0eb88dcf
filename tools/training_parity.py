"""Train one small run of every recipe family and write its ``metrics.json``; or compare two such folders.

Two checkouts give the same numbers when the training code they differ in is a refactor: run this
script once with each checkout first on ``PYTHONPATH`` and compare the folders::

    PYTHONPATH=/path/to/a/src python tools/training_parity.py run OUT_A
    PYTHONPATH=/path/to/b/src python tools/training_parity.py run OUT_B
    python tools/training_parity.py compare OUT_A OUT_B

``compare`` prints one line per case and exits 1 when any ``metrics.json`` differs outside its
timing fields (``seconds_per_step``, any key ending in ``seconds`` or ``_s``, ``time``); it also
reports the training-loss columns of each run's CSV logs whose epoch values differ (logged keys may
be renamed between the checkouts; those are matched by their values). Every case runs on the CPU
with one thread at a fixed seed, on data that needs no download beyond what the test suite uses.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

QUIET = ["trainer.num_threads=1", "report.plots=false", "trainer.enable_progress_bar=false", "trainer.accelerator=cpu"]
TINY = [
    *QUIET,
    "model.options.hidden=[16]",
    "model.options.feature_dim=8",
    "data.batch_size=128",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=3",
    "trainer.log_every_n_steps=1",
]
LTR = [
    *QUIET,
    "data.options={seed: 0, train_queries: 60, val_queries: 20, test_queries: 30, max_docs: 20}",
    "trainer.max_epochs=2",
    "task.slate_length=12",
    "model.options={hidden: [8], feature_dim: 4, dropout: 0.1}",
    "data.batch_size=8",
]
BRAIN = [
    *QUIET,
    "data.batch_size=4",
    "trainer.max_epochs=1",
    "task.stage2_epochs=1",
    "task.montage=0",
    "model.options={nb_filter: 4, nb_block: 2, use_sex: true}",
    "data.options.shape=null",
]
SORT = [*QUIET, "task.steps=4", "task.steps_per_epoch=2", "task.test_lists=10", "task.val_lists=4"]
SORT += ["task.lists_per_batch=2", "task.bn_recalibration=1"]
SUPCON = [*QUIET, "task.train_subset=32", "data.batch_size=16", "task.probe_epochs=2", "model.options.feature_dim=8"]
SUPCON += ["trainer.max_epochs=1"]
RETRIEVAL = [*QUIET, "task.steps=3", "task.classes_per_batch=3", "task.samples_per_class=3"]
RETRIEVAL += ["model.options.feature_dim=8"]

#: case -> (preset, overrides, data: "digits" | "cohort" | None)
CASES: dict[str, tuple[str, list[str], str | None]] = {
    "dir_regularizers": (
        "abalone_ranksim_lds",
        [
            *TINY,
            "loss.regularizers.pairwise_difference.weight=0.1",
            "loss.regularizers.spearman.weight=0.5",
            "loss.regularizers.conr.weight=0.5",
            "loss.kind=focal_l1",
        ],
        None,
    ),
    "dir_fds": ("abalone_lds_fds", TINY, None),
    "dir_balanced_mse": ("abalone_balanced_mse", TINY, None),
    "dir_ordinal": ("abalone_coral", [*TINY, "loss.regularizers=[{name: ranksim, weight: 1.0}]"], None),
    "rnc": ("abalone_rnc", [*TINY, "task.pretrain_epochs=1"], None),
    "ltr": ("ltr_synthetic_lambda_ndcgloss2", [*LTR, "loss.regularizers=[{name: listnet, weight: 0.5}]"], None),
    "ltr_listnet": ("ltr_synthetic_listnet", LTR, None),
    "brain_age_tsan": ("brain_age_tsan_synthetic", BRAIN, "cohort"),
    "brain_age_ranksim": ("brain_age_ranksim_synthetic", BRAIN, "cohort"),
    "supcon": ("mnist5k_supcon", SUPCON, "digits"),
    "simclr": ("mnist5k_simclr", SUPCON, "digits"),
    "retrieval_smooth_ap": ("mnist5k_smooth_ap", RETRIEVAL, "digits"),
    "retrieval_triplet": ("mnist5k_triplet_retrieval", RETRIEVAL, "digits"),
    "sort": ("large_mnist_neuralsort", SORT, "digits"),
    "median": ("large_mnist_median_neuralsort", SORT, "digits"),
    "dknn": (
        "mnist5k_dknn",
        [*QUIET, "task.steps=2", "task.queries=10", "task.neighbors=10", "model.options.feature_dim=8"],
        "digits",
    ),
}


def _digits() -> Any:
    """160 training / 60 test real digits (as the test suite's ``digits`` fixture)."""
    import numpy as np
    import torch

    from rankwise.data import ClassificationData, TensorPairDataset, load_mnist5k_arrays

    images, labels = load_mnist5k_arrays()
    idx = np.random.default_rng(1).permutation(len(labels))[:220]
    x, y = torch.from_numpy(images[idx]).unsqueeze(1), torch.from_numpy(labels[idx])
    return ClassificationData(
        name="mnist5k",
        train=TensorPairDataset(x[:160], y[:160]),
        test=TensorPairDataset(x[160:], y[160:]),
        val=None,
        num_classes=10,
        image_shape=tuple(x.shape[1:]),
        train_targets=labels[idx[:160]],
        test_targets=labels[idx[160:]],
        meta={"backbone_options": {"in_channels": 1}},
    )


def run(out: Path, only: list[str]) -> None:
    from rankwise.data.synthetic_mri import make_brain_age_synthetic
    from rankwise.recipes import load_config
    from rankwise.recipes.runner import train

    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="parity_"))
    made: dict[str, Callable[[], Any]] = {"digits": _digits}
    cache: dict[str, Any] = {}
    cohort: Path | None = None
    for name, (preset, sets, data) in CASES.items():
        if only and name not in only:
            continue
        extra: list[str] = []
        given = None
        if data == "cohort":
            if cohort is None:
                cohort = make_brain_age_synthetic(scratch / "cohort", n=16, spacing=8.0)
            extra = [f"data.options.csv={cohort}", f"data.options.cache_dir={scratch / 'cache'}"]
        elif data is not None:
            given = cache.setdefault(data, made[data]())
        cfg = load_config(preset, [*sets, *extra])
        res = train(cfg, out=out / name, progress=False, verbose=False, data=given, overwrite=True)
        print(f"{name}: {res.run_dir}", flush=True)


_TIMING = ("seconds_per_step", "time")


def _timing(key: str) -> bool:
    return key in _TIMING or key.endswith(("seconds", "_s", "_time"))


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not _timing(k)}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _loss_columns(run_dir: Path) -> dict[str, list[tuple[str, list[float]]]]:
    """Per CSV log: the epoch values of every loss column (name, values)."""
    out: dict[str, list[tuple[str, list[float]]]] = {}
    for log in sorted(run_dir.glob("logs/**/metrics.csv")):
        with open(log, newline="") as fh:
            rows = list(csv.DictReader(fh))
        cols: dict[str, list[float]] = {}
        for r in rows:
            for k, v in r.items():
                if "loss" in k and not k.endswith("_step") and v not in (None, ""):
                    cols.setdefault(k, []).append(float(v))
        out[str(log.relative_to(run_dir))] = sorted(cols.items())
    return out


def compare(a: Path, b: Path) -> int:
    bad = 0
    for case in sorted(p.name for p in a.iterdir() if (p / "metrics.json").is_file()):
        ma = _strip(json.loads((a / case / "metrics.json").read_text()))
        pb = b / case / "metrics.json"
        if not pb.is_file():
            print(f"{case}: missing in {b}")
            bad += 1
            continue
        mb = _strip(json.loads(pb.read_text()))
        same = ma == mb
        la, lb = _loss_columns(a / case), _loss_columns(b / case)
        losses = []
        for log, cols in la.items():
            values_b = [v for _, v in lb.get(log, [])]
            for key, values in cols:
                if not any(v == values for v in values_b):
                    losses.append(f"{log}:{key}")
        print(
            f"{case}: metrics.json {'identical' if same else 'DIFFERENT'}; loss columns "
            f"{'all found with equal values' if not losses else 'unmatched: ' + ', '.join(losses)}"
        )
        bad += (not same) + bool(losses)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--only", nargs="*", default=[], choices=sorted(CASES))
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "run":
        run(args.out, args.only)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
