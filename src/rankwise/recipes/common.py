"""Pieces every recipe shares: reproducible sampling and seeding, the backbone, the NaN/inf stop.

* :func:`reseed` -- seed every RNG from ``(seed, step, rank)`` before each training step, so a run
  resumed after a kill replays the same random draws;
* :class:`EpochShuffleSampler` / :class:`EpochIndexSampler` + :func:`item_seed` -- data order and
  random items that depend only on ``(seed, epoch, index)``;
* :func:`epochs_and_batches` -- a step budget in epochs (the episode / list recipes);
* :func:`build_backbone` -- ``rankwise.models.build_backbone`` with the dataset's options and the
  optional local ``model.weights``;
* :func:`check_finite` -- raise :class:`NonFiniteLossError` (the run stops, its last good
  checkpoint stays) when a training loss is NaN/inf;
* :func:`loader_workers` -- DataLoader worker options for ``data.num_workers``, capped at the CPUs
  this process may use; :func:`regression_loaders` / :func:`eval_loader` -- the loaders of a
  ``RegressionData`` (the regression recipes, brain age);
* :func:`tensors`, :func:`to_builtin` -- small conversions.
"""

from __future__ import annotations

import functools
import math
import os
import random
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from rankwise.recipes.config import Config, ConfigError, ModelConfig, StepBudget

__all__ = [
    "DataDefaultsWarning",
    "EpochIndexSampler",
    "EpochShuffleSampler",
    "NonFiniteLossError",
    "build_backbone",
    "check_finite",
    "device_name",
    "empty_group_message",
    "empty_shot_groups",
    "encode",
    "epochs_and_batches",
    "eval_loader",
    "item_seed",
    "loader_workers",
    "plot_embedding",
    "regression_loaders",
    "reseed",
    "shot_thresholds",
    "tensors",
    "to_builtin",
    "usable_cpus",
    "warn_data_notes",
]


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or inf; the run stops and keeps its last good checkpoint."""


def check_finite(
    loss: torch.Tensor, module: Any, what: str, hint: str | Callable[[], str] = "try a smaller learning rate"
) -> None:
    """Raise :class:`NonFiniteLossError` naming the epoch and step when ``loss`` is NaN/inf (``hint``: a
    callable is called for the text only then, e.g. to read a tensor's value)."""
    if not bool(torch.isfinite(loss.detach())):
        if callable(hint):
            hint = hint()
        raise NonFiniteLossError(
            f"the {what} loss became {loss.detach().item()} at epoch {module.current_epoch}, global step "
            f"{module.global_step}; stopping. The last good checkpoint is kept; {hint}."
        )


def reseed(seed: int, step: int, rank: int = 0) -> None:
    """Seed every RNG from ``(seed, step, rank)`` so a step replays identically after a resume.

    The recipes call it before every training step (with the global step), so random choices in
    the losses (e.g. RankSim's one-example-per-label draw), dropout and augmentations do not depend
    on how many random numbers Lightning's loops consumed before (which differs after a restart).
    """
    s = (int(seed) * 1_000_003 + int(step) * 7919 + int(rank) * 104_729) % (2**31 - 1)
    random.seed(s)
    np.random.seed(s)  # noqa: NPY002 - user code (e.g. augmentations) may use the legacy global RNG
    if _accelerator_present():
        torch.manual_seed(s)
    else:  # what torch.manual_seed does where no accelerator exists, without its lazy per-device seeders
        torch.default_generator.manual_seed(s)


@functools.cache
def _accelerator_present() -> bool:
    """Whether ``torch.manual_seed`` would seed more than the CPU generator: CUDA, MPS, XPU or MTIA is
    available, or a custom (``privateuse1``) backend is registered. Asked once per process (under
    Lightning ``torch.cuda.is_available()`` queries NVML at every call: tens of microseconds)."""
    if torch.cuda.is_available():
        return True
    for name in ("mps", "xpu", "mtia"):
        mod = getattr(torch, name, None)
        available = getattr(mod, "is_available", None)
        if callable(available) and available():
            return True
    return hasattr(torch, torch._C._get_privateuse1_backend_name())


class EpochShuffleSampler(torch.utils.data.Sampler[int]):
    """Random permutation that depends only on ``(seed, epoch)`` (Lightning calls ``set_epoch``)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = int(n)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        # a generator: the order is drawn at the first ``next``, i.e. after Lightning's ``set_epoch``, also when
        # the DataLoader iterator was created before it (``batch_size=None`` loaders of a resumed run)
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        yield from torch.randperm(self.n, generator=g).tolist()


class EpochIndexSampler(EpochShuffleSampler):
    """Indices ``epoch * n + i`` (``i`` shuffled by ``(seed, epoch)`` when ``shuffle``): fresh every epoch.

    For datasets whose items are random draws seeded by the index (``dataset[g]`` uses item
    ``g % n`` and the seed :func:`item_seed` ``(seed, g)``): every epoch sees new draws (new
    augmentations, new random lists), and a run resumed from an end-of-epoch checkpoint replays
    exactly the draws of an uninterrupted run, whatever the number of processes or workers.
    """

    def __init__(self, n: int, seed: int, *, shuffle: bool = True) -> None:
        super().__init__(n, seed)
        self.shuffle = bool(shuffle)

    def __iter__(self):
        base = self.epoch * self.n
        if not self.shuffle:
            yield from range(base, base + self.n)
            return
        yield from (base + torch.as_tensor(list(super().__iter__()))).tolist()


def epochs_and_batches(t: StepBudget) -> tuple[int, int]:
    """``(E, batches per epoch)`` for ``t.steps`` training batches in epochs of at most ``t.steps_per_epoch``."""
    epochs = math.ceil(t.steps / t.steps_per_epoch)
    return epochs, math.ceil(t.steps / epochs)


def item_seed(seed: int, index: int) -> int:
    """A 63-bit seed for random item ``index`` of a run seeded ``seed`` (see :class:`EpochIndexSampler`)."""
    return (int(seed) * 0x9E3779B97F4A7C15 + int(index) * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) % (2**63 - 1)


def build_backbone(
    m: ModelConfig, *, meta: dict[str, Any] | None = None, input_dim: int | None = None, **defaults: Any
) -> tuple[nn.Module, int]:
    """``rankwise.models.build_backbone(m.backbone, ...)`` and its feature dimension.

    Options, lowest priority first: ``defaults`` (set by the recipe, e.g. an embedding size), the
    dataset's ``meta["backbone_options"]`` (e.g. ``vocab_size``), ``m.options``; an ``mlp`` gets
    ``in_dim = input_dim``. ``m.weights`` (a local file) is loaded into the backbone.
    """
    from rankwise import models

    opts = {**defaults, **dict((meta or {}).get("backbone_options", {}) or {}), **m.options}
    if m.backbone == "mlp" and "in_dim" not in opts and input_dim is not None:
        opts["in_dim"] = input_dim
    try:
        module, feature_dim = models.build_backbone(m.backbone, **opts)
    except (ValueError, TypeError, OverflowError) as e:
        raise ConfigError(
            f"cannot build `model.backbone` {m.backbone!r} with `model.options` {m.options}: {e}"
        ) from None
    except (RuntimeError, MemoryError) as e:  # e.g. a negative size, or more memory than the machine has
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"cannot build `model.backbone` {m.backbone!r} with `model.options` {m.options} (too large?): {first}"
        ) from None
    if m.weights:
        load_backbone_weights(module, m.weights)
    return module, int(feature_dim)


def load_backbone_weights(backbone: nn.Module, path: str) -> None:
    """Load a local state dict (or a Lightning checkpoint's ``backbone.*`` keys) into ``backbone``."""
    from rankwise.recipes.rundir import load_state_dict

    state = load_state_dict(path)
    if any(k.startswith("backbone.") for k in state):
        state = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
    missing, _ = backbone.load_state_dict(state, strict=False)
    if len(missing) == len(backbone.state_dict()):
        raise ConfigError(f"`model.weights` {path}: no parameter matches the backbone (first keys: {list(state)[:3]})")


def device_name(cfg: Any) -> str:
    """The device ``trainer.accelerator`` resolves to: cuda (auto with CUDA available, gpu, cuda), mps or cpu."""
    acc = str(cfg.trainer.accelerator)
    if acc in ("gpu", "cuda") or (acc == "auto" and torch.cuda.is_available()):
        return "cuda"
    return "mps" if acc == "mps" else "cpu"


def tensors(ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` tensors of a dataset of ``(x, y)`` items (fast path for ``TensorPairDataset``)."""
    if hasattr(ds, "x") and hasattr(ds, "y"):
        return ds.x, ds.y
    xs, ys = zip(*(ds[i] for i in range(len(ds))), strict=True)
    return torch.stack(xs), torch.as_tensor(ys)


def to_builtin(obj: Any) -> Any:
    """Tensors / numpy values inside dicts and lists -> plain Python (JSON-serializable)."""
    if isinstance(obj, dict):
        return {str(k): to_builtin(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_builtin(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.item() if obj.numel() == 1 else obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj


def encode(run: Any, module: Any, x: torch.Tensor, batch: int = 512, *, checkpoint: str | None = None) -> torch.Tensor:
    """``module.predict_step`` outputs (e.g. features) of images ``x``, CPU float32, on one device.

    ``checkpoint``: the run's ``checkpoints/<checkpoint>.ckpt``, loaded into ``module`` by
    ``Trainer.predict(ckpt_path=...)`` (:meth:`Run.predict <rankwise.recipes.rundir.Run.predict>`);
    None: the weights ``module`` holds.
    """
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(x), batch_size=batch)
    if checkpoint is None:
        out = run.local_trainer().predict(module, loader)
    else:
        out, _ = run.predict(module, loader, checkpoint)
    return torch.cat([o.cpu().float() for o in out])


def plot_embedding(run: Any, features: torch.Tensor, labels: torch.Tensor) -> None:
    """``plots/tsne.png``: t-SNE of (at most ``report.plot_samples``) test features coloured by class."""
    pdir = run.plots_dir
    if pdir is None or not run.cfg.report.tsne:
        return
    from rankwise.recipes import reports

    r = run.cfg.run
    n = int(features.shape[0])
    idx = np.sort(np.random.default_rng(0).choice(n, size=min(n, run.cfg.report.plot_samples), replace=False))
    reports.plot_tsne(
        features[idx].numpy(),
        labels.cpu().numpy()[idx],
        pdir / "tsne.png",
        seed=r.seed,
        title=f"t-SNE of test features: {r.name} (seed {r.seed})",
        label="class",
        classes=True,
    )


class DataDefaultsWarning(UserWarning):
    """A run's settings were derived from (or do not fit) its data or machine; the CLI prints it as ``warning: ...``."""


class DataNote(DataDefaultsWarning):
    """What a run derived from its data and the user should know (e.g. an ordinal head's classes); the CLI
    prints it as ``note: ...``."""


def warn_data_notes(data: Any) -> None:
    """Each note a dataset's loader left in ``data.meta["notes"]`` (a setting that does not fit the files,
    e.g. a preset's grid on the user's own volumes) as a :class:`DataDefaultsWarning`."""
    meta = getattr(data, "meta", None)
    for note in meta.get("notes", ()) if isinstance(meta, dict) else ():
        warnings.warn(note, DataDefaultsWarning, stacklevel=3)


_CAPPED_WORKERS: set[tuple[int, int]] = set()


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # macOS, Windows
        return max(os.cpu_count() or 1, 1)


def loader_workers(num_workers: int) -> dict[str, Any]:
    """``DataLoader`` keyword options for ``data.num_workers`` worker processes.

    A preset written for a workstation (e.g. 4 workers) on a machine with fewer usable CPUs would
    over-subscribe them (torch warns at every loader): the count is capped at :func:`usable_cpus`
    and a ``UserWarning`` says so once per process. ``persistent_workers`` keeps the workers between
    epochs whenever there are any. The warning is a :class:`DataDefaultsWarning` (one ``warning:``
    line in the CLI).

    Example:
        >>> loader_workers(0)
        {'num_workers': 0, 'persistent_workers': False}
    """
    cpus = usable_cpus()
    n = min(int(num_workers), cpus)
    if n < num_workers and (num_workers, cpus) not in _CAPPED_WORKERS:
        _CAPPED_WORKERS.add((num_workers, cpus))
        warnings.warn(
            f"data.num_workers={num_workers} is more than the {cpus} CPUs this process may use: {n} DataLoader workers",
            DataDefaultsWarning,
            stacklevel=2,
        )
    return {"num_workers": n, "persistent_workers": n > 0}


def regression_loaders(data: Any, cfg: Config) -> tuple[Any, Any, Any]:
    """Train (seeded per-epoch shuffle), val and test loaders of a ``RegressionData``."""
    from torch.utils.data import DataLoader

    collate = data.meta.get("collate_fn")
    n = len(data.train)
    bs = cfg.data.batch_size
    kw: dict[str, Any] = {**loader_workers(cfg.data.num_workers), "collate_fn": collate}
    train_dl = DataLoader(
        data.train, batch_size=bs, sampler=EpochShuffleSampler(n, cfg.run.seed), drop_last=n > bs, **kw
    )
    return train_dl, eval_loader(data.val, data, cfg), eval_loader(data.test, data, cfg)


def eval_loader(dataset: Any, data: Any, cfg: Config) -> Any:
    """The loader of an evaluation split (or of a new file's rows) of a ``RegressionData``: in order, batches of
    ``cfg.data.eval_batch_size``, the loader workers and ``collate_fn`` of the training loader."""
    from torch.utils.data import DataLoader

    kw: dict[str, Any] = {**loader_workers(cfg.data.num_workers), "collate_fn": data.meta.get("collate_fn")}
    return DataLoader(dataset, batch_size=cfg.data.eval_batch_size, shuffle=False, **kw)


def shot_thresholds(data: Any) -> tuple[float, float]:
    """``(many_shot, few_shot)`` of a dataset: its own ``shot_thresholds``, else derived from its training labels."""
    from rankwise.data import suggest_shot_thresholds

    own = getattr(data, "shot_thresholds", None)
    if own is not None:
        return float(own[0]), float(own[1])
    return suggest_shot_thresholds(data.train_labels, data.bin_width)


def empty_shot_groups(data: Any, many_shot: float, few_shot: float) -> list[str]:
    """The shot groups (``"many"``, ``"medium"``, ``"few"``) that hold no test example of ``data``."""
    from rankwise.data import label_bins

    train_bins = label_bins(np.asarray(data.train_labels, dtype=np.float64), data.bin_width)
    test_bins = label_bins(np.asarray(data.test_labels, dtype=np.float64), data.bin_width)
    uniq, counts = np.unique(train_bins, return_counts=True)
    lookup = dict(zip(uniq.tolist(), counts.tolist()))
    n = np.asarray([lookup.get(b, 0) for b in test_bins.tolist()], dtype=np.float64)
    groups = {"many": n > many_shot, "medium": (n <= many_shot) & (n >= few_shot), "few": n < few_shot}
    return [g for g, mask in groups.items() if not mask.any()]


def empty_group_message(data: Any, many_shot: float, few_shot: float) -> str | None:
    """The warning for a test split with an empty shot group, or ``None``."""
    empty = empty_shot_groups(data, many_shot, few_shot)
    if not empty:
        return None
    return (
        f"the test split of {data.name} has no {' and no '.join(empty)}-shot example with many-shot > "
        f"{many_shot:g} and few-shot < {few_shot:g} training rows per bin of width {data.bin_width:g}: "
        f"{'that group reports' if len(empty) == 1 else 'those groups report'} nothing (choose other "
        "thresholds with --set report.many_shot=... --set report.few_shot=...)"
    )
