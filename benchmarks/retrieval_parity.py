"""Parity of the retrieval losses and metrics with pytorch-metric-learning: max value / gradient differences.

Usage::

    python benchmarks/retrieval_parity.py     # writes benchmarks/results/retrieval_parity.json

Cases (float64 embeddings unless said otherwise, seeds 0..N-1):

* ``smooth_ap_loss`` vs ``SmoothAPLoss(temperature=0.01)``: C classes x C embeddings sorted by class
  (pytorch-metric-learning's loss reshapes the batch as (samples per class, classes), which groups
  the right embeddings only when the two are equal; its per-query buffer is float32);
* ``smooth_ap_loss`` vs ``SmoothAPLoss`` with unequal class size and count, to show that defect;
* ``fastap_loss`` vs ``FastAPLoss(num_bins)``: random labels (any class sizes), 3 and 10 bins;
* ``retrieval_metrics`` vs ``AccuracyCalculator`` (``precision_at_1`` = recall@1, ``r_precision``,
  ``mean_average_precision_at_r``; Euclidean kNN), float32 clustered embeddings with a lone label.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from rankwise.losses import fastap_loss, smooth_ap_loss
from rankwise.metrics import retrieval_metrics


def _vg(fn: Any, e: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor]:
    v = fn(e, y)
    (g,) = torch.autograd.grad(v, e)
    return float(v.detach()), g


def _loss_parity(ours: Any, ref: Any, batches: list[tuple[int, torch.Tensor]], seeds: int) -> dict[str, Any]:
    dv, dg, n = 0.0, 0.0, 0
    for d, y in batches:
        for s in range(seeds):
            e = torch.randn(len(y), d, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
            e.requires_grad_()
            v1, g1 = _vg(ours, e, y)
            v2, g2 = _vg(ref, e, y)
            dv, dg, n = max(dv, abs(v1 - v2)), max(dg, float((g1 - g2).abs().max())), n + 1
    return {"cases": n, "max_abs_value_diff": dv, "max_abs_grad_diff": dg}


def main() -> None:
    from pytorch_metric_learning import losses as pml
    from pytorch_metric_learning.distances import LpDistance
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import CustomKNN

    out: dict[str, Any] = {"torch": torch.__version__}
    square = [(8, torch.arange(c).repeat_interleave(c)) for c in (2, 3, 4, 6, 8, 12)]
    out["smooth_ap_square"] = _loss_parity(
        lambda e, y: smooth_ap_loss(e, y, temperature=0.01), pml.SmoothAPLoss(temperature=0.01), square, 5
    )
    unequal = [(8, torch.arange(c).repeat_interleave(m)) for c, m in ((3, 4), (4, 6), (8, 2))]
    out["smooth_ap_classes_ne_samples_per_class"] = _loss_parity(
        lambda e, y: smooth_ap_loss(e, y, temperature=0.01), pml.SmoothAPLoss(temperature=0.01), unequal, 3
    )
    g = torch.Generator().manual_seed(0)
    rand = [(8, torch.randint(c, (b,), generator=g)) for b, c in ((16, 3), (40, 5), (64, 20), (128, 10), (256, 32))]
    for bins in (3, 10):
        out[f"fastap_bins{bins}"] = _loss_parity(
            lambda e, y, b=bins: fastap_loss(e, y, num_bins=b), pml.FastAPLoss(num_bins=bins), rand, 5
        )
    calc = AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
        knn_func=CustomKNN(LpDistance(normalize_embeddings=False)),
    )
    diffs = {"recall@1": 0.0, "r_precision": 0.0, "map@r": 0.0}
    n = 0
    for size, classes in ((100, 5), (500, 20), (2000, 50)):
        for s in range(3):
            gen = torch.Generator().manual_seed(s)
            y = torch.randint(classes, (size,), generator=gen)
            x = torch.randn(classes, 16, generator=gen)[y] + 1.5 * torch.randn(size, 16, generator=gen)
            y[0] = classes + 1
            ref = calc.get_accuracy(x, y)
            got = retrieval_metrics(x, y, block_size=97)
            diffs["recall@1"] = max(diffs["recall@1"], abs(got["recall@1"] - ref["precision_at_1"]))
            diffs["r_precision"] = max(diffs["r_precision"], abs(got["r_precision"] - ref["r_precision"]))
            diffs["map@r"] = max(diffs["map@r"], abs(got["map@r"] - ref["mean_average_precision_at_r"]))
            n += 1
    out["retrieval_metrics"] = {"cases": n, "max_abs_diff": diffs}
    path = Path(__file__).resolve().parent / "results" / "retrieval_parity.json"
    path.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
