"""Task loss and regularizers of the regression recipes, built from the loss registry.

A config lists ``loss.regularizers: [{name, weight, options}]`` and names the task loss with
``loss.name`` (or ``loss.kind: l1``, shorthand for ``loss.name: regression_l1``); each ``name``
is looked up with :func:`rankwise.losses.get_loss_entry`. The registry entry declares which batch
tensors the loss takes (``inputs``: parameter name -> role among ``features``, ``predictions``,
``targets``, ``weights``), so the recipe knows, without any table of its own, whether a loss
applies to the backbone features (RankSim, ConR) or to the predictions (Spearman, pairwise
difference). When the config is read, the options are checked against the
signature of what is built with them -- the loss's ``nn.Module`` twin (whose keyword arguments are
the function's hyperparameters), or the function when there is no twin; the recipe then builds the
twin (batch-level losses get ``distributed="auto"``: under DDP they see the global batch). A loss
module with parameters (e.g. a learnable noise scale) is a submodule of the recipe's
LightningModule: trained, checkpointed, and with ``loss.lr`` its own optimizer parameter group.

What batch a loss takes is its registry entry's ``takes`` (one of
:data:`rankwise._registry.LOSS_INPUTS`: ``predictions``, ``features``, ``logits``, ``padded_lists``,
``embeddings_labels``, ``embedding_pairs``, ``class_logits``); a recipe accepts a loss by it (:func:`check_takes`),
never by its signature.

Every recipe trains one :class:`Objective`: its task loss plus its weighted regularizers, evaluated
on the batch tensors by role; it returns the total and each part by name, and
:meth:`Objective.log` logs them under the same keys in every recipe: ``train/loss`` (the total, per
step and per epoch) and ``train/loss/<name>`` (each unweighted part, per epoch).

Adding a loss usable as a regularizer = the loss function + its registry entry with ``inputs`` +
its test (see docs/recipes.md).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from rankwise._validation import did_you_mean
from rankwise.recipes.config import ConfigError, LossConfig, RegularizerConfig, check_kwargs

__all__ = [
    "REGRESSION_REGULARIZERS",
    "REGRESSION_TASK_LOSSES",
    "LossTerm",
    "Objective",
    "ObjectiveValue",
    "Term",
    "build_regularizers",
    "build_task_loss",
    "build_term",
    "check_loss_config",
    "check_takes",
    "ordinal_head_of",
    "task_loss_name",
    "usable_losses",
]

#: options of a ``loss.kind`` task loss that the recipe fixes (the kind itself and the mean reduction)
_KIND_SUPPLIED = ("kind", "reduction")


def task_loss_name(loss: LossConfig) -> str:
    """The registered task loss of a ``loss`` section: ``loss.name``, else ``regression_<loss.kind>``.

    ``loss.kind: l1`` is shorthand for ``loss.name: regression_l1`` (``rankwise.imbalanced.regression_loss``
    with ``kind="l1"``, registered in the loss registry), so both go through one :class:`LossTerm`.
    """
    return loss.name if loss.name is not None else f"regression_{loss.kind}"


def ordinal_head_of(loss: LossConfig) -> Any:
    """The :class:`~rankwise._registry.OrdinalHead` of the section's task loss (``None``: not ordinal)."""
    from rankwise.losses import LOSSES

    name = task_loss_name(loss)
    return LOSSES.entry(name).ordinal if name in LOSSES else None


#: what the regression recipes (dir, rrt, rnc's second stage, brain_age) accept as the task loss
REGRESSION_TASK_LOSSES = ("predictions", "logits")
#: ... and as a regularizer
REGRESSION_REGULARIZERS = ("predictions", "features")

#: the batch of each ``takes`` value, in words (error messages)
_TAKES_WORDS = {
    "predictions": "per-sample predictions and targets",
    "features": "per-sample features and targets",
    "logits": "an ordinal head's logits and classes",
    "padded_lists": "padded query lists",
    "embeddings_labels": "embeddings and class labels",
    "embedding_pairs": "embedding pairs",
    "class_logits": "a classifier's logits and classes",
}


def usable_losses(takes: Iterable[str] | None = None) -> list[str]:
    """Registered losses a recipe can call (their registry entry declares ``inputs``); with ``takes``,
    only those whose entry's ``takes`` is among them."""
    from rankwise.losses import LOSSES

    accepted = None if takes is None else set(takes)
    return [e.name for e in LOSSES.entries() if e.inputs and (accepted is None or e.takes in accepted)]


def check_takes(name: str, key: str, accepted: Sequence[str]) -> Any:
    """The registry entry of loss ``name``, checked to take one of the batches ``accepted`` (values of
    :data:`~rankwise._registry.LOSS_INPUTS`); a :class:`ConfigError` naming ``key`` and the loss otherwise.

    An entry whose ``takes`` is not a known batch (a registry entry built by hand) is an error naming
    the loss, as is a loss of another batch; the message lists the losses that fit.
    """
    from rankwise._registry import LOSS_INPUTS

    entry = _entry(name, key)
    if entry.takes not in LOSS_INPUTS:
        raise ConfigError(
            f"`{key}`: loss {name!r} declares takes={entry.takes!r} in its registry entry, which is no known "
            f"batch; expected one of {', '.join(LOSS_INPUTS)}"
        )
    if entry.takes not in accepted:
        words = " or ".join(_TAKES_WORDS[a] for a in accepted)
        raise ConfigError(
            f"`{key}`: loss {name!r} does not take {words} (its registry entry: takes={entry.takes!r}); "
            f"losses that do: {', '.join(usable_losses(accepted))}"
        )
    return entry


def _entry(name: str, key: str) -> Any:
    from rankwise.losses import get_loss_entry

    usable = usable_losses()
    try:
        entry = get_loss_entry(name)
    except ValueError:
        raise ConfigError(f"`{key}`: unknown loss {name!r}; " + did_you_mean(name, usable, "losses")) from None
    if not entry.inputs:
        raise ConfigError(
            f"`{key}`: loss {name!r} declares no recipe inputs in its registry entry, so a recipe cannot call it; "
            f"usable losses: {', '.join(usable)}"
        )
    return entry


def _check_kwargs(fn: Any, options: Mapping[str, Any], key: str, supplied: tuple[str, ...]) -> None:
    check_kwargs(fn, dict(options), key, supplied=supplied)


def _built(entry: Any) -> Any:
    """What the recipe constructs with the options: the module twin (its ``__init__``), else the function."""
    return entry.module if entry.module is not None else entry.fn


def _kwargs(entry: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    params = inspect.signature(_built(entry)).parameters
    kw = {k: _tensor_if_declared(params.get(k), v) for k, v in options.items()}
    if "distributed" in params and "distributed" not in kw:
        kw["distributed"] = "auto"  # batch-level losses see the global batch under DDP
    return kw


def _tensor_if_declared(param: inspect.Parameter | None, value: Any) -> Any:
    """A config list (YAML ``[1, 2, 3]``) for an option annotated as a tensor: the tensor (int64 when
    every entry is an integer, else the default float dtype)."""
    if param is None or not isinstance(value, list) or "Tensor" not in str(param.annotation):
        return value
    whole = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    try:
        return torch.tensor(value, dtype=torch.int64 if whole else torch.get_default_dtype())
    except (TypeError, ValueError, RuntimeError):
        return value  # not numbers: the loss names the option and what it needs


class _FunctionLoss(nn.Module):
    """A registered loss without a module twin, with its options bound."""

    def __init__(self, fn: Any, **options: Any) -> None:
        super().__init__()
        self.fn, self.options = fn, options

    def forward(self, **tensors: Any) -> torch.Tensor:
        return self.fn(**tensors, **self.options)


def _construct(entry: Any, kw: dict[str, Any]) -> nn.Module:
    """The loss module: the registry entry's module twin, else its function with the options bound."""
    return entry.module(**kw) if entry.module is not None else _FunctionLoss(entry.fn, **kw)


def _takes_train_labels(entry: Any) -> bool:
    try:
        return "train_labels" in inspect.signature(_built(entry)).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return False


def _module(
    entry: Any,
    options: Mapping[str, Any],
    key: str,
    train_labels: torch.Tensor | None = None,
    num_classes: int | None = None,
    train_classes: torch.Tensor | None = None,
) -> nn.Module:
    kw = _kwargs(entry, options)
    if train_labels is not None and _takes_train_labels(entry):
        kw["train_labels"] = train_labels  # e.g. a GMM or histogram fitted to the training labels
    if entry.ordinal is not None and entry.ordinal.num_classes:
        kw["num_classes"] = 2 if num_classes is None else int(num_classes)  # the data's classes (2: a check)
    if entry.ordinal is not None and entry.ordinal.train_classes and train_classes is not None:
        kw.setdefault(entry.ordinal.train_classes, train_classes)
    try:
        return _construct(entry, kw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"`{key}`: {e}") from None


def _check_build(entry: Any, options: Mapping[str, Any], key: str) -> None:
    """Build the loss with its options (without the training labels) to check their values; a
    loss that needs something fitted on the training labels may refuse (it is built again with
    them when the run starts)."""
    from rankwise._validation import MissingTrainLabelsError

    if _takes_train_labels(entry):
        param = inspect.signature(_built(entry)).parameters["train_labels"]
        if param.default is inspect.Parameter.empty:  # cannot be built without them
            return
    kw = _kwargs(entry, options)
    if entry.ordinal is not None and entry.ordinal.num_classes:
        kw["num_classes"] = 2  # the run supplies the data's number of classes
    if entry.ordinal is not None and entry.ordinal.train_classes:
        kw.setdefault(entry.ordinal.train_classes, torch.arange(2))  # the run supplies the training classes
    try:
        _construct(entry, kw)
    except MissingTrainLabelsError as e:
        if not _takes_train_labels(entry):
            raise ConfigError(f"`{key}`: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"`{key}`: {e}") from None


def check_loss_config(
    loss: LossConfig,
    key: str = "loss",
    *,
    task_takes: Sequence[str] = REGRESSION_TASK_LOSSES,
    regularizer_takes: Sequence[str] = REGRESSION_REGULARIZERS,
) -> None:
    """Check names and options of the task loss and the regularizers against the registry and signatures.

    ``task_takes`` / ``regularizer_takes``: the batches (registry ``takes``) the recipe can give its
    task loss and its regularizers (default: the regression recipes'; learning to rank gives both
    ``("padded_lists",)``).
    """
    name = task_loss_name(loss)
    shorthand = loss.name is None
    if shorthand and loss.lr is not None:
        raise ConfigError(f"`{key}.lr` applies to a task loss from the registry (`{key}.name`), not to `{key}.kind`")
    entry = check_takes(name, f"{key}.kind" if shorthand else f"{key}.name", task_takes)
    roles = set(entry.inputs.values())
    if entry.ordinal is not None:
        if "logits" not in roles or not roles & {"classes", "levels"}:
            raise ConfigError(
                f"`{key}.name`: ordinal loss {name!r} takes {sorted(roles)}; an ordinal task loss needs logits "
                "and classes or levels"
            )
    elif not {"predictions", "targets"} <= roles:
        raise ConfigError(
            f"`{key}.name`: loss {name!r} takes {sorted(roles)}; a task loss needs predictions and targets"
        )
    supplied = (*entry.inputs, "train_labels", *(_KIND_SUPPLIED if shorthand else ()))
    if entry.ordinal is not None and entry.ordinal.num_classes:
        supplied = (*supplied, "num_classes")
    _check_kwargs(_built(entry), loss.options, f"{key}.options", supplied)
    _check_build(entry, loss.options, f"{key}.options")
    names = [name]
    for reg in loss.regularizers:
        k = f"{key}.regularizers.{reg.name}"
        entry = _entry(reg.name, f"{k}.name")
        if entry.ordinal is not None:
            raise ConfigError(
                f"`{k}.name`: {reg.name!r} is an ordinal loss of a head's logits; it can be the task loss "
                f"(`{key}.name: {reg.name}`), not a regularizer"
            )
        entry = check_takes(reg.name, f"{k}.name", regularizer_takes)
        if reg.weight != 0 and reg.name in names:
            raise ConfigError(
                f"`{k}`: the loss {reg.name!r} is already a term of the objective; each term is logged as "
                f"`train/loss/<name>`, so a loss can be one term only"
            )
        names.append(reg.name)
        _check_kwargs(_built(entry), reg.options, f"{k}.options", (*entry.inputs, "train_labels"))
        _check_build(entry, reg.options, f"{k}.options")


class LossTerm(nn.Module):
    """A registered loss bound to its options and its batch inputs: ``term(tensors) -> scalar``.

    ``tensors`` maps roles (``features``, ``predictions``, ``targets``, ``weights``) to tensors;
    the term passes each declared input by its parameter name.
    """

    def __init__(self, name: str, loss: nn.Module, inputs: Mapping[str, str] | None, weight: float = 1.0) -> None:
        super().__init__()
        self.name, self.loss, self.weight = name, loss, float(weight)
        self.inputs = dict(inputs or {})
        #: "features" or "predictions": the model tensor the term applies to (documentation, logs)
        self.applies_to = "features" if "features" in self.inputs.values() else "predictions"

    def forward(self, tensors: Mapping[str, torch.Tensor | None]) -> torch.Tensor:
        return self.loss(**{param: tensors[role] for param, role in self.inputs.items()})


@dataclass(frozen=True)
class Term:
    """A term of an :class:`Objective` that is no registered loss: ``fn(tensors) -> scalar`` under ``name``.

    For a recipe's own task loss (the sorting recipes' permutation cross-entropy, SFCN's KL, the
    differentiable-kNN loss); a registered loss is a :class:`LossTerm` (:func:`build_term`).
    """

    name: str
    fn: Callable[[Mapping[str, Any]], torch.Tensor]
    weight: float = 1.0

    def __call__(self, tensors: Mapping[str, Any]) -> torch.Tensor:
        return self.fn(tensors)


class ObjectiveValue(NamedTuple):
    """What an :class:`Objective` returns: the ``total`` to minimise and each term's unweighted value by name."""

    total: torch.Tensor
    parts: dict[str, torch.Tensor]


class Objective:
    r"""A recipe's training objective: the task loss plus its weighted regularizers.

    .. math::
        L = \ell_{\text{task}} + \sum_i w_i\, r_i

    ``objective(tensors)`` evaluates every term on the batch tensors by role (``features``,
    ``predictions``, ``targets``, ``weights``, ``logits``, ``embeddings``, ``labels``, ...; each
    :class:`LossTerm` reads the roles its registry entry declares) and returns an
    :class:`ObjectiveValue`: the total, summed in the order task, then regularizers in config order,
    and ``parts``, each term's unweighted value under its name (the task loss first). The task loss
    is unweighted (its ``weight`` is not read). A regularizer of weight 0 is skipped: it is not
    evaluated and has no part (as :func:`build_regularizers` builds none), so a zero weight costs
    nothing. Term names must differ (they are the log keys). The objective holds references to the
    terms, which stay submodules of the recipe's module (its state dict does not change).

    Example:
        >>> import torch
        >>> from rankwise.recipes.loss_terms import Objective, Term
        >>> mse = Term("mse", lambda t: ((t["predictions"] - t["targets"]) ** 2).mean())
        >>> size = Term("size", lambda t: t["predictions"].abs().mean(), weight=0.5)
        >>> value = Objective(mse, [size])({"predictions": torch.tensor([1.0, 3.0]), "targets": torch.zeros(2)})
        >>> value.total, value.parts
        (tensor(6.), {'mse': tensor(5.), 'size': tensor(2.)})
    """

    def __init__(self, task: Any, regularizers: Iterable[Any] = ()) -> None:
        # each term: a LossTerm or a Term (``name``, ``weight``, ``term(tensors) -> scalar``)
        self.task = task
        self.regularizers = [r for r in regularizers if float(r.weight) != 0.0]
        #: the epoch whose means :meth:`log` accumulates (Trainer id, epoch, prefix), and their (sum, count)
        self._epoch: tuple[int, int, str] | None = None
        self._sums: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        names = [task.name, *(r.name for r in self.regularizers)]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(
                f"the terms of an objective need distinct names (their log keys); {', '.join(map(repr, repeated))} "
                f"appears more than once in {names}"
            )

    @property
    def names(self) -> list[str]:
        """The terms' names: the task loss, then the regularizers of non-zero weight."""
        return [self.task.name, *(r.name for r in self.regularizers)]

    def __call__(self, tensors: Mapping[str, Any]) -> ObjectiveValue:
        task = self.task(tensors)
        total = task
        parts = {self.task.name: task}
        for term in self.regularizers:
            value = term(tensors)
            total = total + term.weight * value
            parts[term.name] = value
        return ObjectiveValue(total, parts)

    def log(self, module: Any, value: ObjectiveValue, *, batch_size: int, prefix: str = "train") -> None:
        """Log ``value`` from a LightningModule's training step: ``<prefix>/loss`` (the total, per step and
        per epoch) and ``<prefix>/loss/<name>`` (each part, per epoch), averaged over the ranks' batches.

        In a single process whose epochs have a known length, the epoch means are accumulated here, as
        Lightning's mean reduction does (``sum + value * batch_size``, ``count + batch_size``, then
        ``sum / count`` in the default float dtype), and handed to Lightning once, at the epoch's last
        batch, as ``<prefix>/loss_epoch`` and ``<prefix>/loss/<name>``; ``<prefix>/loss_step`` only at the
        steps whose values the loggers write (``trainer.log_every_n_steps``). The logged keys and values
        are those of logging every step with ``on_step=True, on_epoch=True``; a Lightning call costs about a
        millisecond of host time, which is what a small model's whole step takes.
        """
        trainer = _epoch_trainer(module)
        if trainer is None:
            kw: dict[str, Any] = {"batch_size": batch_size, "sync_dist": True}
            module.log(f"{prefix}/loss", value.total.detach(), on_step=True, on_epoch=True, **kw)
            parts = {f"{prefix}/loss/{name}": v.detach() for name, v in value.parts.items()}
            module.log_dict(parts, on_step=False, on_epoch=True, **kw)
            return
        epoch = (id(trainer), int(trainer.current_epoch), prefix)
        if self._epoch != epoch:
            self._epoch, self._sums = epoch, {}
        total = value.total.detach()
        values = {f"{prefix}/loss_epoch": total, **{f"{prefix}/loss/{n}": v.detach() for n, v in value.parts.items()}}
        for key, v in values.items():
            self._sums[key] = _mean_update(self._sums.get(key), v, batch_size)
        connector = trainer._logger_connector
        if connector.should_update_logs or trainer.fast_dev_run:
            module.log(f"{prefix}/loss_step", total, on_step=True, on_epoch=False, batch_size=batch_size)
        if trainer.fit_loop.epoch_loop.batch_idx + 1 >= trainer.num_training_batches:
            for key, (acc, count) in self._sums.items():
                module.log(key, acc / count, on_step=False, on_epoch=True, batch_size=1)
            self._epoch, self._sums = None, {}


def _epoch_trainer(module: Any) -> Any:
    """The Trainer of ``module`` when :meth:`Objective.log` may accumulate the epoch means itself: one
    process, automatic optimization without gradient accumulation, a finite epoch; else None."""
    trainer = getattr(module, "_trainer", None)
    if trainer is None or not getattr(module, "automatic_optimization", False):
        return None
    try:
        finite = math.isfinite(float(trainer.num_training_batches))
        single = int(trainer.world_size) == 1 and int(trainer.accumulate_grad_batches) == 1
        hooks = hasattr(trainer, "_logger_connector") and hasattr(trainer.fit_loop.epoch_loop, "batch_idx")
    except (AttributeError, TypeError, ValueError):
        return None
    return trainer if finite and single and hooks and trainer.training else None


def _mean_update(state: Any, value: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum, count)`` after one more batch, in the dtype and order of Lightning's mean reduction."""
    dtype = torch.get_default_dtype()
    dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    if not torch.is_floating_point(value) or value.dtype not in (torch.float32, torch.float64):
        value = value.to(dtype)
    if state is None:
        state = (torch.tensor(0.0, dtype=dtype, device=value.device), torch.tensor(0, device=value.device))
    acc, count = state
    return acc + value * batch_size, count + batch_size


def build_term(
    name: str,
    options: Mapping[str, Any],
    key: str,
    *,
    weight: float = 1.0,
    inputs: Mapping[str, str] | None = None,
    train_labels: torch.Tensor | None = None,
) -> LossTerm:
    """The registered loss ``name`` with ``options`` as a :class:`LossTerm` (``key`` names it in errors).

    The one way a recipe builds a loss: the task loss, each regularizer, and the contrastive losses
    of RnC (``build_term("rnc", {"temperature": t}, "task.temperature")``) and SupCon. ``inputs``
    (parameter -> role) is for a loss whose registry entry declares none because no other recipe
    may call it (SupCon's labels are classes, not regression targets); else the entry's are used.
    """
    if inputs is None:
        entry = _entry(name, f"{key}.name" if key.startswith("loss") else key)
    else:
        from rankwise.losses import get_loss_entry

        entry = get_loss_entry(name)
    return LossTerm(name, _module(entry, options, key, train_labels), inputs or entry.inputs, weight)


def build_regularizers(
    regs: list[RegularizerConfig], key: str = "loss.regularizers", *, train_labels: torch.Tensor | None = None
) -> nn.ModuleList:
    """One :class:`LossTerm` per regularizer with a non-zero weight, in config order (see :func:`build_task_loss`)."""
    terms = nn.ModuleList()
    for reg in regs:
        if reg.weight == 0:
            continue
        entry = _entry(reg.name, f"{key}.{reg.name}.name")
        module = _module(entry, reg.options, f"{key}.{reg.name}.options", train_labels)
        terms.append(LossTerm(reg.name, module, entry.inputs, reg.weight))  # as build_term, keyed by name
    return terms


def build_task_loss(
    loss: LossConfig,
    key: str = "loss",
    *,
    train_labels: torch.Tensor | None = None,
    num_classes: int | None = None,
    train_classes: torch.Tensor | None = None,
) -> LossTerm:
    """The task loss as a :class:`LossTerm` of the registry: ``loss.name``, or ``regression_<loss.kind>``.

    A loss module whose constructor takes ``train_labels`` receives the FULL training labels
    (float64 tensor), e.g. to fit a label GMM or histogram once when it is built; an ordinal loss
    whose :class:`~rankwise._registry.OrdinalHead` says so receives ``num_classes`` (the data's) and
    ``train_classes`` (the training rows' classes, int64). A list option of a tensor parameter
    (``weight: [1, 2, 3]``) becomes a tensor.
    """
    name = task_loss_name(loss)
    entry = _entry(name, f"{key}.name" if loss.name is not None else f"{key}.kind")
    module = _module(entry, loss.options, f"{key}.options", train_labels, num_classes, train_classes)
    return LossTerm(name, module, entry.inputs)
