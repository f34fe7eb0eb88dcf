"""Learning to rank on query lists, ``recipe: ltr``: a per-document scorer trained with a listwise loss.

Data: a :class:`~rankwise.data.RankingData` -- LETOR / svmlight files (dataset ``letor``:
MSLR-WEB10K / 30K, Yahoo! LTR, LETOR 4.0) or the synthetic ``ltr_synthetic`` -- whose splits are
lists of documents grouped by query, features standardised on the training documents.

Model (allRank's ``fc_model`` + ``post_model``): the backbone ``model.backbone`` (``mlp``: linear
layers with ReLU and dropout, ``model.options.hidden``, ``feature_dim``, ``dropout``) maps every
document's features to a vector, a linear layer to its score; documents are scored independently.

Loss: the shared ``loss`` section names a registered learning-to-rank loss taking padded lists
(``loss.name``: ``listnet``, ``listmle``, ``ranknet``, ``lambda_loss``, ``approx_ndcg``,
``neural_ndcg``, ``pirank``; ``loss.options`` are its keyword options with allRank's names, e.g.
``{weighing_scheme: ndcgLoss2_scheme}``), and ``loss.regularizers`` may add weighted terms of other
such losses (a loss fits when its registry entry has ``takes="padded_lists"``); each is called as
``loss(y_pred=scores (Q, L), y_true=relevance (Q, L))`` with padded slots ``y_true = -1``, and their
weighted sum is the run's :class:`~rankwise.recipes.loss_terms.Objective` (logged as ``train/loss``
and ``train/loss/<name>``).

Training: ``data.batch_size`` queries per step (allRank's ``batch_size``), for ``trainer.max_epochs``
epochs over the training queries in a seeded order; a query with more than ``task.slate_length``
documents contributes a fresh random subset of that many every epoch (allRank's ``slate_length``,
:class:`~rankwise.data.SlateSampler`), shorter ones are padded to the longest list of the batch.
After every epoch the validation queries are ranked whole and ``val/<task.val_metric>`` (default
``ndcg@5``, allRank's ``val_metric``) selects ``checkpoints/best.ckpt``.

Test (best checkpoint, whole lists): ``ndcg@k`` for ``task.ats`` (default 1, 3, 5, 10) and ``mrr``
(reciprocal rank of the first document with the list's top grade), from
:mod:`rankwise.metrics` in percent, averaged over queries; a query without a relevant document
counts NDCG 1 (allRank's and LightGBM's convention) and MRR 0. ``seconds_per_step`` is the
wall time of one training step. ``plots/ndcg_at_k.png`` shows test NDCG@k for k = 1..20.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, cast

import lightning as L
import torch
from pydantic import Field
from torch import nn

from rankwise.recipes._progress import StepTimer
from rankwise.recipes.common import EpochIndexSampler, build_backbone, check_finite, device_name, loader_workers, reseed
from rankwise.recipes.config import Config, ConfigError, LossConfig, Options
from rankwise.recipes.datamodules import LoaderData
from rankwise.recipes.eval_metrics import MeanValue, shard_keep_mask, val_sampler
from rankwise.recipes.loss_terms import Objective, build_regularizers, build_task_loss, check_loss_config
from rankwise.recipes.optim import configure
from rankwise.recipes.registry import Recipe, register_recipe
from rankwise.recipes.rundir import Run
from rankwise.recipes.stages import Stage

__all__ = ["LTRModule", "LTROptions", "LTRRecipe", "ltr_metrics"]

_METRICS = ("ndcg@", "mrr")


class LTROptions(Options):
    """A per-document scorer trained on query lists with a learning-to-rank loss (``loss.name``)."""

    slate_length: int | None = Field(
        240,
        description="training lists longer than this are randomly subsampled to it (allRank slate_length; null: whole)",
        ge=1,
    )
    ats: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [1, 3, 5, 10], description="ranks k of the reported ndcg@k"
    )
    val_metric: str = Field(
        "ndcg@5", description="validation metric selecting best.ckpt: ndcg@<k> or mrr (higher is better)"
    )


def ltr_metrics(scores: torch.Tensor, relevance: torch.Tensor, ats: list[int]) -> dict[str, torch.Tensor]:
    """Per-query ``ndcg@k`` (for ``ats``) and ``mrr`` of padded ``(Q, L)`` scores and relevance (``-1`` = padding).

    Example:
        >>> import torch
        >>> m = ltr_metrics(torch.tensor([[0.9, 0.1, 0.0]]), torch.tensor([[0.0, 2.0, -1.0]]), [1])
        >>> round(float(m["ndcg@1"][0]), 4), round(float(m["mrr"][0]), 4)
        (0.0, 0.5)
    """
    from rankwise.metrics import mrr, ndcg

    n = ndcg(scores, relevance, ats=list(ats))
    out = {f"ndcg@{k}": n[..., i] for i, k in enumerate(ats)}
    out["mrr"] = mrr(scores, relevance)[..., 0]
    return out


class LTRModule(L.LightningModule):
    """Backbone + linear scorer over each document; ``batch`` = ``(features (Q, L, D), relevance (Q, L))``."""

    def __init__(self, cfg: Config, *, num_features: int, meta: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.task: LTROptions = cfg.task
        self.net, dim = build_backbone(cfg.model, meta=meta, input_dim=num_features)
        self.head = nn.Linear(int(dim), 1)
        self.loss_term = build_task_loss(cfg.loss)
        self.terms = build_regularizers(cfg.loss.regularizers)
        self.objective = Objective(self.loss_term, self.terms)
        # per-query sums and a query count over every rank, each validation query once
        # (rankwise.recipes.eval_metrics); in percent
        self._val_keys = [*(f"ndcg@{k}" for k in self.task.ats), "mrr"]
        self.val_means = nn.ModuleList(MeanValue(scale=100.0) for _ in self._val_keys)
        self._val_seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x)).squeeze(-1).float()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        reseed(self.cfg.run.seed, self.global_step, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        tensors = {"predictions": self(x), "targets": y, "features": None, "weights": None}
        value = self.objective(tensors)
        check_finite(value.total, self, self.loss_term.name)
        self.objective.log(self, value, batch_size=y.shape[0])
        return value.total

    def on_validation_epoch_start(self) -> None:
        self._val_seen = 0

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        # a query the DistributedSampler repeats to even out the shards counts once
        keep = shard_keep_mask(val_sampler(self.trainer), self._val_seen, y.shape[0], y.device)
        self._val_seen += y.shape[0]
        values = ltr_metrics(self(x).detach(), y, self.task.ats)
        for key, module in zip(self._val_keys, self.val_means, strict=True):
            metric = cast(MeanValue, module)
            metric.update(values[key][keep])
            # a Metric object: Lightning computes it over the whole split at the epoch's end and resets it
            self.log(f"val/{key}", metric, prog_bar=key == self.task.val_metric, on_step=False, on_epoch=True)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        x, y = batch
        return {"scores": self(x).detach().cpu(), "relevance": y.cpu()}

    def configure_optimizers(self) -> Any:
        return configure(self, self.cfg.optimizer, self.cfg.schedule)


class LTRRecipe(Recipe):
    """Learning to rank: a per-document MLP scorer, a listwise loss, test NDCG@k and MRR."""

    name = "ltr"
    per_step = True
    uses = frozenset({"loss"})
    learns: Literal["regression", "classification", "ranking"] = "ranking"
    description = (
        "learning to rank: a per-document scorer trained on query lists with a ranking loss, test NDCG@k / MRR"
    )
    options: type = LTROptions

    def method(self, cfg: Config) -> str:
        scheme = cfg.loss.options.get("weighing_scheme")
        name = str(cfg.loss.name)
        return f"{name}({str(scheme).removesuffix('_scheme')})" if scheme else name

    def check(self, cfg: Config) -> None:
        t: LTROptions = cfg.task
        loss: LossConfig = cfg.loss
        if loss.name is None:
            raise ConfigError(
                "recipe 'ltr' needs `loss.name`: a learning-to-rank loss (listnet, listmle, ranknet, lambda_loss, "
                "approx_ndcg, neural_ndcg, pirank)"
            )
        # a learning-to-rank loss: its registry entry says it takes padded query lists
        check_loss_config(loss, task_takes=("padded_lists",), regularizer_takes=("padded_lists",))
        valid = [f"ndcg@{k}" for k in t.ats] + ["mrr"]
        if t.val_metric not in valid:
            raise ConfigError(
                f"`task.val_metric` must be one of {', '.join(valid)} (ndcg@k for k in `task.ats`); "
                f"got {t.val_metric!r}"
            )
        if not t.ats or len(set(t.ats)) != len(t.ats):
            raise ConfigError(f"`task.ats` must be a non-empty list of distinct positive ints; got {t.ats!r}")

    def load_data(self, cfg: Config) -> Any:
        """The run's :class:`~rankwise.data.RankingData` (its loader's notes become ``warning:`` lines).

        A ``letor`` ``num_features`` that only a bundled preset gave (the preset's dataset's count,
        e.g. MSLR-WEB10K's 136) is kept when it fits the files and replaced by their largest feature
        index when it does not (the user's own files through a preset):
        :func:`~rankwise.data.load_letor_preset`. One the user set is checked against the files
        (:func:`~rankwise.data.load_letor`). The run's ``config.yaml`` records the count used.
        """
        from rankwise.data import get_dataset, load_letor_preset
        from rankwise.recipes.common import warn_data_notes
        from rankwise.recipes.config import inherited_options

        opts = dict(cfg.data.options)
        data: Any
        inherited = "num_features" in inherited_options(cfg)
        if cfg.data.name == "letor" and opts.get("num_features") is not None and inherited:
            data = load_letor_preset(opts.pop("num_features"), **opts)
        else:
            data = get_dataset(cfg.data.name, **opts)
        warn_data_notes(data)
        return data

    def _loaders(self, run: Run) -> tuple[Any, Any, Any]:
        from torch.utils.data import DataLoader

        from rankwise.data import SlateSampler, pad_lists

        cfg, data = run.cfg, run.data
        slates = SlateSampler(data.train, cfg.task.slate_length, cfg.run.seed)
        kw: dict[str, Any] = {**loader_workers(cfg.data.num_workers), "collate_fn": pad_lists}
        train = DataLoader(
            slates, batch_size=cfg.data.batch_size, sampler=EpochIndexSampler(len(slates), cfg.run.seed), **kw
        )
        val = DataLoader(data.val, batch_size=cfg.data.eval_batch_size, shuffle=False, **kw)
        test = DataLoader(data.test, batch_size=cfg.data.eval_batch_size, shuffle=False, **kw)
        return train, val, test

    def _module(self, run: Run) -> LTRModule:
        return LTRModule(run.cfg, num_features=run.data.num_features, meta=run.data.meta)

    def fit(self, run: Run) -> dict[str, Any]:
        cfg = run.cfg
        torch.manual_seed(cfg.run.seed)
        module = self._module(run)
        data = LoaderData(*self._loaders(run))
        timer = StepTimer()
        monitor = f"val/{cfg.task.val_metric}"
        epochs = cfg.trainer.max_epochs
        stage = Stage("", module, data, epochs=epochs, monitor=monitor, mode="max", hand_on=None, callbacks=[timer])
        run.run_stage(stage)
        return run.rank_zero(self._finish, run, module, data, timer)

    def _finish(self, run: Run, module: LTRModule, data: LoaderData, timer: StepTimer) -> dict[str, Any]:
        out = self._evaluate(run, module, data.val_dataloader(), data.test_dataloader(), "best")
        if timer.steps:
            out["seconds_per_step"] = timer.seconds / timer.steps
        return out

    def evaluate(self, run: Run, checkpoint: str | None) -> dict[str, Any]:
        _, val_dl, test_dl = self._loaders(run)
        return self._evaluate(run, self._module(run), val_dl, test_dl, checkpoint or "best")

    def predict_file(self, run: Run, path: Path, checkpoint: str | None) -> dict[str, Any]:
        """Scores of the documents of a new LETOR / svmlight file, in file order.

        The file is read like the run's own files (:func:`~rankwise.data.read_letor`, at most the
        run's ``num_features`` feature indices; its documents x features within
        :func:`~rankwise.data.letor.check_dense_size`), standardised with the run's training moments
        (:func:`~rankwise.data.standardize_like`), grouped by query and scored whole by
        ``checkpoints/<checkpoint>.ckpt`` (default ``best``). Columns: ``qid``, ``document`` (the
        document's position among the file's documents, 1 = the first), ``relevance`` (the file's
        grade), ``score`` (the network's float32 output) and ``rank`` (1 = the highest score of its
        query; equal scores in file order).
        """
        import numpy as np
        from torch.utils.data import DataLoader

        from rankwise.data import group_queries, pad_lists, query_order, standardize_like
        from rankwise.data.letor import read_letor_dense

        data = run.data
        d = int(data.num_features)
        limit = f"the {d} features the run's model scores (its training files' largest feature index)"
        x, y, qid = read_letor_dense(path, num_features=d, limit=limit)
        order, _, _ = query_order(qid)
        xs = standardize_like(x[order], data.meta)
        lists = group_queries(xs, y[order], qid[order])  # contiguous by construction: grouped = sorted order
        kw: dict[str, Any] = {**loader_workers(run.cfg.data.num_workers), "collate_fn": pad_lists}
        dl = DataLoader(lists, batch_size=run.cfg.data.eval_batch_size, shuffle=False, **kw)
        batches, _ = run.predict(self._module(run), dl, checkpoint or "best")
        # padded slots carry relevance -1; a file's relevance is >= 0 (read_letor refuses negatives)
        grouped = torch.cat([b["scores"][b["relevance"] >= 0] for b in batches]).float().numpy()
        score = np.empty_like(grouped)
        score[order] = grouped
        # rank within the query: by query, then by decreasing score, equal scores in file order
        by_rank = np.lexsort((np.arange(len(score)), -score, qid))
        q_sorted = qid[by_rank]
        starts = np.flatnonzero(np.r_[True, q_sorted[1:] != q_sorted[:-1]])
        first_of_query = np.repeat(starts, np.diff(np.r_[starts, len(q_sorted)]))
        rank = np.empty(len(score), dtype=np.int64)
        rank[by_rank] = np.arange(len(score)) - first_of_query + 1
        return {
            "qid": qid,
            "document": np.arange(1, len(score) + 1),
            "relevance": y,
            "score": score,
            "rank": rank,
        }

    def _evaluate(self, run: Run, module: LTRModule, val_dl: Any, test_dl: Any, checkpoint: str) -> dict[str, Any]:
        """Test and val NDCG of ``checkpoints/<checkpoint>.ckpt`` (``Trainer.predict`` loads it)."""
        out: dict[str, Any] = {"checkpoint": checkpoint, "device": device_name(run.cfg)}
        for split, dl in (("test", test_dl), ("val", val_dl)):
            batches, ckpt = run.predict(module, dl, checkpoint)
            out["checkpoint"] = str(ckpt.relative_to(run.dir))
            per_query = [ltr_metrics(b["scores"], b["relevance"], run.cfg.task.ats) for b in batches]
            out[split] = {k: float(torch.cat([m[k] for m in per_query]).mean()) * 100.0 for k in per_query[0]}
            if split == "test":
                _plot_ndcg_at_k(run, batches)
        return out


def _plot_ndcg_at_k(run: Run, batches: list[dict[str, torch.Tensor]]) -> None:
    """``plots/ndcg_at_k.png``: mean test NDCG@k for k = 1..20."""
    pdir = run.plots_dir
    if pdir is None:
        return
    from rankwise.metrics import ndcg
    from rankwise.recipes.reports import pyplot, save_figure

    ks = list(range(1, 21))
    values = torch.cat([ndcg(b["scores"], b["relevance"], ats=ks) for b in batches]).mean(0) * 100.0
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ks, values.numpy(), marker="o")
    ax.set_xlabel("k")
    ax.set_ylabel("test NDCG@k (%)")
    ax.set_title(f"{run.cfg.run.name} (seed {run.cfg.run.seed})")
    ax.grid(alpha=0.3)
    save_figure(plt, fig, pdir / "ndcg_at_k.png")


register_recipe(LTRRecipe())
