"""Training (Lightning, imported lazily) and evaluation of SoDeep sorters.

Training follows the paper: fresh synthetic sequences every step (all families of
:mod:`rankwise.sodeep.data` mixed), L1 loss between predicted and true normalized ranks, Adam.
rankwise uses a cosine learning-rate decay instead of the paper's step decay.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from rankwise._fileio import atomic_write
from rankwise._lightning import quiet_lightning
from rankwise._stats import pearson
from rankwise.sodeep.data import FAMILIES, generate, mixed_batch
from rankwise.sodeep.models import SORTER_MODELS, Sorter, build_sorter
from rankwise.sodeep.weights_io import save_sorter

__all__ = ["evaluate_sorter", "real_score_sequences", "sorter_metrics", "train_sorter"]

log = logging.getLogger(__name__)

#: generator seed offset of the held-out evaluation sequences (training uses ``seed`` itself).
EVAL_SEED_OFFSET = 1_000_003


# ----------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------
def _pearson(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pearson's r per sequence; 1 where either sequence is constant."""
    return pearson(a, b).nan_to_num(nan=1.0)


def sorter_metrics(sorter: Sorter, x: torch.Tensor) -> dict[str, float]:
    """Quality of ``sorter`` on sequences ``x`` ``(B, n)`` against the exact (average-tie) ranks.

    * ``mae_rank`` — mean ``|r_pred - r_true|`` in rank units (ranks ``1..n``);
    * ``spearman`` — mean over sequences of Spearman's rho between predicted and true ranks
      (Pearson correlation of the average-tie ranks of the predictions with the true ranks);
    * ``pearson`` — mean Pearson correlation between the predicted (continuous) and true ranks,
      a stricter score that also sees calibration errors;
    * ``exact_order`` — fraction of sequences whose predicted order is exactly right.
    """
    from rankwise.ops.ranking import rank

    n = x.shape[-1]
    with torch.no_grad():
        pred = sorter(x, descending=False).double() * n  # ascending ranks 1..n
    true = rank(x.double(), ties="average")
    pred_r = rank(pred, ties="average")
    return {
        "mae_rank": float((pred - true).abs().mean()),
        "spearman": float(_pearson(pred_r, true).mean()),
        "pearson": float(_pearson(pred, true).mean()),
        "exact_order": float((pred_r == true).all(-1).double().mean()),
    }


def real_score_sequences(seq_len: int, num: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Offline "real" scores, as random subsets of length ``seq_len`` (``num`` of them each).

    * ``abalone_ridge`` — a ridge regression's predictions of abalone rings from the 8 other
      columns (scikit-lego's bundled ``abalone.zip``; sex one-hot encoded);
    * ``abalone_rings`` — the integer ring counts themselves (many ties);
    * ``diabetes_ridge`` — ridge predictions on scikit-learn's diabetes data.

    Needs scikit-learn / scikit-lego / pandas (optional); sources that cannot be loaded are skipped.
    """
    import numpy as np

    out: dict[str, np.ndarray] = {}
    try:
        from sklearn.datasets import load_diabetes
        from sklearn.linear_model import Ridge

        xd, yd = load_diabetes(return_X_y=True)
        out["diabetes_ridge"] = Ridge(alpha=1.0).fit(xd, yd).predict(xd)
    except ImportError:  # pragma: no cover - optional dependency
        log.warning("scikit-learn is not installed: skipping the diabetes scores")
    try:
        from importlib import resources

        import pandas as pd
        from sklearn.linear_model import Ridge

        path = resources.files("sklego").joinpath("data").joinpath("abalone.zip")
        with resources.as_file(path) as p:
            df = pd.read_csv(p)
        rings = df["rings"].to_numpy(dtype=float)
        feats = pd.get_dummies(df.drop(columns=["rings"]), dtype=float).to_numpy()
        out["abalone_ridge"] = Ridge(alpha=1.0).fit(feats, rings).predict(feats)
        out["abalone_rings"] = rings
    except (ImportError, FileNotFoundError, KeyError) as err:  # pragma: no cover - optional dependency
        log.warning("abalone data unavailable (%s): skipping it", err)
    g = torch.Generator().manual_seed(seed)
    seqs = {}
    for name, values in out.items():
        v = torch.as_tensor(values, dtype=torch.float64)
        if v.numel() < seq_len:
            continue
        idx = torch.rand(num, v.numel(), generator=g).argsort(-1)[:, :seq_len]
        seqs[name] = v[idx]
    return seqs


def evaluate_sorter(sorter: Sorter, *, num: int = 512, seed: int = 0, real: bool = True) -> dict[str, dict[str, float]]:
    """Metrics of :func:`sorter_metrics` on held-out sequences of every family (+ real scores).

    The held-out data use the generator seed ``seed + 1_000_003`` (training uses ``seed``). The
    result maps each family (and ``"real:<name>"``) to its metrics; ``"families_mean"`` averages
    the synthetic families.
    """
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ValueError(f"`num` (held-out sequences per family) must be an int >= 1, got {num!r}")
    sorter = sorter.eval()
    n = sorter.seq_len
    g = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
    report: dict[str, dict[str, float]] = {}
    for fam in FAMILIES:
        x = generate(fam, num, n, generator=g, dtype=torch.float32)
        report[fam] = sorter_metrics(sorter, x)
    keys = next(iter(report.values())).keys()
    report["families_mean"] = {k: sum(report[f][k] for f in FAMILIES) / len(FAMILIES) for k in keys}
    if real:
        for name, x in real_score_sequences(n, num, seed=seed).items():
            report[f"real:{name}"] = sorter_metrics(sorter, x.float())
    return report


def format_report(report: dict[str, dict[str, float]]) -> str:
    """A fixed-width table of an :func:`evaluate_sorter` report."""
    lines = [f"{'sequences':<22}{'mae_rank':>10}{'spearman':>10}{'pearson':>10}{'exact':>8}"]
    for name, m in report.items():
        lines.append(
            f"{name:<22}{m['mae_rank']:>10.3f}{m['spearman']:>10.4f}{m['pearson']:>10.4f}{m['exact_order']:>8.3f}"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------
def _lightning_module(sorter: Sorter, lr: float, steps: int, batch_size: int, seed: int) -> Any:
    import lightning as L

    class _SorterTask(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.sorter = sorter
            self.lr, self.steps, self.batch_size = lr, steps, batch_size

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            x = batch[0] if isinstance(batch, (list, tuple)) else batch
            n = x.shape[-1]
            target = _target(x)
            pred = self.sorter(x, descending=False)  # ascending normalized ranks r / n
            loss = (pred - target).abs().mean() * n  # L1 in rank units
            self.log("train/l1_rank", loss, prog_bar=True, on_step=True, batch_size=x.shape[0])
            return loss

        def configure_optimizers(self) -> Any:
            opt = torch.optim.Adam(self.sorter.parameters(), lr=self.lr)
            warm = max(1, min(200, self.steps // 20))

            def factor(step: int) -> float:
                if step < warm:
                    return (step + 1) / warm
                t = (step - warm) / max(1, self.steps - warm)
                return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))

            sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return _SorterTask()


def _target(x: torch.Tensor) -> torch.Tensor:
    from rankwise.ops.ranking import rank

    return rank(x, ties="average") / x.shape[-1]


class _SyntheticStream(torch.utils.data.IterableDataset):
    """Endless stream of mixed-family batches from one seeded generator."""

    def __init__(self, seq_len: int, batch_size: int, seed: int) -> None:
        super().__init__()
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed

    def __iter__(self):  # type: ignore[no-untyped-def]
        g = torch.Generator().manual_seed(self.seed)
        while True:
            yield mixed_batch(self.batch_size, self.seq_len, generator=g)


def train_sorter(
    seq_len: int,
    model: str = "gru",
    *,
    steps: int = 4000,
    batch_size: int = 128,
    lr: float = 1e-3,
    seed: int = 0,
    out: str | Path = "sodeep_runs",
    hidden_size: int | None = None,
    num_layers: int | None = None,
    num_features: int | None = None,
    eval_num: int = 512,
    progress_bar: bool = True,
    accelerator: str = "auto",
    num_threads: int | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train a sorter on fresh synthetic sequences with Lightning, save it and evaluate it.

    Writes to ``out``: Lightning checkpoints (``checkpoints/last.ckpt``), the final weights
    ``{model}_{seq_len}.pt`` (see :func:`rankwise.sodeep.save_sorter`; the evaluation report is
    stored in its metadata) and ``report.json``. A sorter trained before into ``out`` (its weights or
    its ``checkpoints/last.ckpt``) is a ``FileExistsError`` unless ``overwrite``, which replaces those
    files only. Returns ``{"weights": path, "report": {...},
    "seconds": ...}``. Reproducible for a given ``seed`` on a given device / thread count.

    Example::

        from rankwise.sodeep import train_sorter
        train_sorter(64, "gru", steps=3000, seed=0, out="runs/gru64")
    """
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    if model not in SORTER_MODELS or model == "exact":
        raise ValueError(f"`model` must be one of 'gru', 'lstm', 'mlp' for training; got {model!r}")
    if steps < 1 or batch_size < 1:
        raise ValueError(f"`steps` and `batch_size` must be >= 1, got steps={steps}, batch_size={batch_size}")
    if eval_num < 1:
        raise ValueError(f"`eval_num` (held-out sequences per family) must be >= 1, got {eval_num}")
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"`num_threads` must be >= 1, got {num_threads}")
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    out = Path(out)
    earlier = [p for p in (out / f"{model}_{seq_len}.pt", out / "checkpoints" / "last.ckpt") if p.exists()]
    if earlier and not overwrite:
        raise FileExistsError(
            f"{earlier[0]} exists (a sorter trained into {out} before): pass overwrite=True "
            "(--overwrite) to replace it, or choose another out (--out)"
        )
    out.mkdir(parents=True, exist_ok=True)
    hp: dict[str, Any] = {}
    if hidden_size is not None:
        hp["hidden_size"] = hidden_size
    if num_layers is not None:
        hp["num_layers"] = num_layers
    if num_features is not None:
        hp["num_features"] = num_features
    quiet_lightning()
    L.seed_everything(seed, workers=True, verbose=False)
    sorter = build_sorter(model, seq_len, **hp)
    task = _lightning_module(sorter, lr, steps, batch_size, seed)
    loader = torch.utils.data.DataLoader(_SyntheticStream(seq_len, batch_size, seed), batch_size=None, num_workers=0)
    ckpt = ModelCheckpoint(
        dirpath=out / "checkpoints",
        save_last=True,
        every_n_train_steps=max(1, min(500, steps)),
        save_top_k=0,
        enable_version_counter=False,
    )
    trainer = L.Trainer(
        max_steps=steps,
        accelerator=accelerator,
        devices=1,
        logger=False,
        callbacks=[ckpt],
        enable_progress_bar=progress_bar,
        enable_model_summary=False,
        deterministic=False,
        log_every_n_steps=50,
        gradient_clip_val=1.0,
    )
    t0 = time.perf_counter()
    trainer.fit(task, train_dataloaders=loader)
    seconds = time.perf_counter() - t0
    sorter = task.sorter.to("cpu").eval()
    report = evaluate_sorter(sorter, num=eval_num, seed=seed)
    train_meta = {
        "seq_len": seq_len,
        "model": model,
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
        "seconds": round(seconds, 1),
        "torch": str(torch.__version__),
    }
    weights = save_sorter(sorter, out / f"{model}_{seq_len}.pt", metrics=report, train=train_meta)
    atomic_write(out / "report.json", json.dumps({"train": train_meta, "report": report}, indent=2))
    return {"weights": weights, "report": report, "seconds": seconds}
