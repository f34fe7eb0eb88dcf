"""Reference points of the synthetic learning-to-rank demo: random, linear least-squares and noise-free scores.

The ``ltr_synthetic`` presets train an MLP on the dataset ``ltr_synthetic`` (seed 0, default sizes).
This script ranks the same 200 test queries three ways and reports NDCG@1/5/10 and MRR in percent
(``rankwise.metrics``, NDCG 1 for a query without a relevant document, as the recipe):

* ``random``: uniform random scores (mean over 20 draws);
* ``linear_least_squares``: a pointwise linear regression of the grade on the standardised training
  features (numpy ``lstsq``), i.e. what a linear scorer without any ranking loss gets;
* ``noise_free_signal``: the relevance model's score without its noise term (the best ranking the
  features allow, up to the quadratic term's exact form; the grades were cut from signal + noise).

Usage: ``python benchmarks/ltr_synthetic_bounds.py`` -> ``benchmarks/results/ltr_synthetic_bounds.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from rankwise.data import load_ltr_synthetic, pad_lists
from rankwise.data.ltr_synthetic import _draws
from rankwise.metrics import mrr, ndcg

OUT = Path(__file__).resolve().parent / "results" / "ltr_synthetic_bounds.json"


def _metrics(scores: np.ndarray, lists) -> dict[str, float]:
    bounds = zip(lists.offsets[:-1], lists.offsets[1:], strict=True)
    _, y = pad_lists([lists[i] for i in range(len(lists))])
    _, s = pad_lists([(lists.y[a:b, None], torch.from_numpy(scores[a:b]).float()) for a, b in bounds])
    n = ndcg(s, y, ats=[1, 5, 10]).mean(0) * 100
    return {"ndcg@1": float(n[0]), "ndcg@5": float(n[1]), "ndcg@10": float(n[2]), "mrr": float(mrr(s, y).mean() * 100)}


def main() -> None:
    data = load_ltr_synthetic(seed=0)
    test = data.test
    raw, _ = _draws(seed=0)
    signal = raw["test"][2]  # documents of the test split in file order = grouped order (contiguous queries)
    rng = np.random.default_rng(0)
    runs = [_metrics(rng.random(test.num_documents), test) for _ in range(20)]
    random = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
    xt, yt = data.train.x.numpy().astype(np.float64), data.train.y.numpy().astype(np.float64)
    design = np.c_[xt, np.ones(len(xt))]
    coef, *_ = np.linalg.lstsq(design, yt, rcond=None)
    linear = _metrics(np.c_[test.x.numpy(), np.ones(test.num_documents)] @ coef, test)
    out = {"random": random, "linear_least_squares": linear, "noise_free_signal": _metrics(signal, test)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"dataset": "ltr_synthetic seed 0 (500/100/200 queries), test split", **out}, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
