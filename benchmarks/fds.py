"""FDS: rankwise against a re-implementation of the DIR reference, side by side (CPU, float32).

Usage::

    python benchmarks/fds.py                           # 100k x 512, 1 and 2 threads
    python benchmarks/fds.py --samples 20000 --threads 1
    python benchmarks/fds.py --markdown benchmarks/results/fds.json   # docs table

Two operations on the whole set of ``--samples`` features of dimension ``--dim`` with integer labels
``0..bins-1`` (one bin per label, AgeDB-like skew: label ``k`` drawn with weight ``1 + k``):

* ``update_running_stats`` - the end-of-epoch update of the per-bin running mean/variance
  (``FDS.update_running_stats`` against the reference's loop);
* whole-set calibration - every feature re-scaled with its bin's frozen statistics, forward only,
  no autograd (``FDS.calibrate`` against the reference's ``smooth``), as an evaluation-time or
  analysis pass over a whole dataset would run it.

Reference (written from the description of the DIR repository's ``fds.py``, not copied): one loop
over ``torch.unique(labels)``; for each label a boolean mask over the labels (the first / last
bucket also take the labels below / above it), the masked rows gathered; the update takes their
mean and (unbiased; biased for a single row) variance and blends them into row ``label`` of the
running buffers with ``factor = momentum`` (``0`` at ``epoch == start_update``); the calibration
skips a bin whose variances sum to less than ``1e-10``, computes
``(z - m1) * sqrt(clamp(v2 / v1, 0.1, 10)) + m2`` on the masked rows (only over dimensions with
``v1 != 0`` if some are zero) and writes them back into the features in place.

Each printed line gives the reference time, the rankwise time, their ratio (reference / rankwise:
above 1 means rankwise is faster), the thread count and the 1-minute load average; both results
are checked to agree first. JSON: ``benchmarks/results/fds.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _tables import load_range, provenance, ratio, read
from _timing import loadavg, machine, row, time_cases
from rankwise.imbalanced import FDS


class ReferenceFDS:
    """The DIR reference's FDS statistics and calibration (loops over the labels present)."""

    def __init__(self, feature_dim: int, bucket_num: int, bucket_start: int = 0, momentum: float = 0.9) -> None:
        k = bucket_num - bucket_start
        self.bucket_num, self.bucket_start, self.momentum, self.start_update = bucket_num, bucket_start, momentum, 0
        self.running_mean = torch.zeros(k, feature_dim)
        self.running_var = torch.ones(k, feature_dim)
        self.num_samples_tracked = torch.zeros(k)
        self.running_mean_last_epoch = torch.zeros(k, feature_dim)
        self.running_var_last_epoch = torch.ones(k, feature_dim)
        self.smoothed_mean_last_epoch = torch.zeros(k, feature_dim)
        self.smoothed_var_last_epoch = torch.ones(k, feature_dim)

    def _rows(self, labels: torch.Tensor, label: torch.Tensor) -> torch.Tensor | None:
        if label > self.bucket_num - 1 or label < self.bucket_start:
            return None
        if label == self.bucket_start:
            return labels <= label
        if label == self.bucket_num - 1:
            return labels >= label
        return labels == label

    def update_running_stats(self, features: torch.Tensor, labels: torch.Tensor, epoch: int) -> None:
        for label in torch.unique(labels):
            mask = self._rows(labels, label)
            if mask is None:
                continue
            feats = features[mask]
            count = feats.size(0)
            mean = torch.mean(feats, 0)
            var = torch.var(feats, 0, unbiased=count != 1)
            b = int(label - self.bucket_start)
            self.num_samples_tracked[b] += count
            factor = 0.0 if epoch == self.start_update else self.momentum
            self.running_mean[b] = (1 - factor) * mean + factor * self.running_mean[b]
            self.running_var[b] = (1 - factor) * var + factor * self.running_var[b]

    @staticmethod
    def _calibrate(z: torch.Tensor, m1: torch.Tensor, v1: torch.Tensor, m2: torch.Tensor, v2: torch.Tensor) -> Any:
        if torch.sum(v1) < 1e-10:
            return z
        if (v1 == 0.0).any():
            valid = v1 != 0.0
            factor = torch.clamp(v2[valid] / v1[valid], 0.1, 10.0)
            z[:, valid] = (z[:, valid] - m1[valid]) * torch.sqrt(factor) + m2[valid]
            return z
        factor = torch.clamp(v2 / v1, 0.1, 10.0)
        return (z - m1) * torch.sqrt(factor) + m2

    def smooth(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        for label in torch.unique(labels):
            mask = self._rows(labels, label)
            if mask is None:
                continue
            b = int(label - self.bucket_start)
            features[mask] = self._calibrate(
                features[mask],
                self.running_mean_last_epoch[b],
                self.running_var_last_epoch[b],
                self.smoothed_mean_last_epoch[b],
                self.smoothed_var_last_epoch[b],
            )
        return features


def _setup(n: int, d: int, bins: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, FDS, ReferenceFDS]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.multinomial(torch.arange(1, bins + 1, dtype=torch.float), n, replacement=True, generator=g)
    feats = torch.randn(n, d, generator=g) * (1 + labels[:, None] / bins) + labels[:, None] / 10
    ours = FDS(d, label_range=(0, bins))
    # frozen statistics for the calibration: ours after two epochs, copied into the reference
    ours.update(feats, labels, epoch=0)
    ours.update(feats * 1.1 + 0.05, labels, epoch=1)
    ref = ReferenceFDS(d, bins)
    for name in ("running_mean", "running_var", "smoothed_mean", "smoothed_var"):
        getattr(ref, f"{name}_last_epoch").copy_(getattr(ours, f"{name}_last_epoch"))
    return feats, labels, ours, ref


_CASES = {
    "update_running_stats": "FDS `update_running_stats`",
    "calibration": "FDS whole-set calibration",
}


def markdown(result: dict[str, Any]) -> str:
    """The docs table of a result: ratio reference / rankwise per operation, one column per thread count."""
    res = result["results"]
    threads = sorted({r["threads"] for r in res.values()})
    rows, dim = result["shape"]
    head = " | ".join(f"{t} thread" + ("s" if t != 1 else "") for t in threads)
    lines = [
        "Ratio = the reference's time / rankwise's (above 1, rankwise is faster).",
        "",
        f"| case | ratio against | {head} |",
        "|---|---|" + "---|" * len(threads),
    ]
    for op, label in _CASES.items():
        cells = [ratio(res.get(f"threads={t} {op}", {}).get("ratio")) for t in threads]
        lines.append(
            f"| {label}, {rows // 1000}k × {dim} | the DIR reference's per-label loop | " + " | ".join(cells) + " |"
        )
    loads = [result.get("loadavg_start"), result.get("loadavg_end"), *(r.get("loadavg") for r in res.values())]
    lines += [
        "",
        provenance(
            "fds.py",
            commit=result.get("commit"),
            date=result.get("date"),
            machine=result,
            load=load_range(*loads),
            threads=" and ".join(map(str, threads)),
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts (default 1,2)")
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--bins", type=int, default=100)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fds.json")
    p.add_argument("--markdown", type=Path, default=None, help="print the docs table of this result JSON and stop")
    args = p.parse_args()
    if args.markdown is not None:
        print(markdown(read(args.markdown)))
        return
    random.seed(args.seed)
    n, d = args.samples, args.dim
    feats, labels, ours, ref = _setup(n, d, args.bins, args.seed)

    # agreement: the update from the same start, and the calibration of the same frozen statistics
    ours_u, ref_u = FDS(d, label_range=(0, args.bins)), ReferenceFDS(d, args.bins)
    ours_u.update_running_stats(feats, labels, epoch=1)
    ref_u.update_running_stats(feats, labels, epoch=1)
    agree_update = bool(
        torch.allclose(ours_u.running_mean, ref_u.running_mean, rtol=1e-4, atol=1e-5)
        and torch.allclose(ours_u.running_var, ref_u.running_var, rtol=1e-4, atol=1e-5)
    )
    calibrated = ours.calibrate(feats, labels)
    agree_calibration = bool(torch.allclose(calibrated, ref.smooth(feats.clone(), labels), atol=1e-4))
    print(f"values agree: update {agree_update}, calibration {agree_calibration}", flush=True)

    result: dict[str, Any] = {
        "device": "cpu",
        **machine(),
        "shape": [n, d],
        "bins": args.bins,
        "values_agree": {"update_running_stats": agree_update, "calibration": agree_calibration},
        "loadavg_start": loadavg(),
        "results": {},
    }
    work = feats.clone()  # the reference calibrates in place: it gets its own copy (same cost every time)
    for threads in (int(v) for v in args.threads.split(",")):
        torch.set_num_threads(threads)
        with torch.no_grad():
            t_upd = time_cases(
                {
                    "reference": lambda: ref_u.update_running_stats(feats, labels, epoch=1),
                    "rankwise": lambda: ours_u.update_running_stats(feats, labels, epoch=1),
                },
                args.repeats,
            )
            t_cal = time_cases(
                {"reference": lambda: ref.smooth(work, labels), "rankwise": lambda: ours.calibrate(feats, labels)},
                args.repeats,
            )
        for name, t in (("update_running_stats", t_upd), ("calibration", t_cal)):
            r, o = t["reference"]["median_ms"], t["rankwise"]["median_ms"]
            print(row("fds", f"{name} {n}x{d}", threads, "reference", r, o), flush=True)
            result["results"][f"threads={threads} {name}"] = {
                "threads": threads,
                "times": t,
                "ratio": r / o,
                "loadavg": loadavg(),
            }
    result["loadavg_end"] = loadavg()
    result["target"] = "ratio >= 1 for update_running_stats and calibration, 1 and 2 threads"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
