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

Adding a loss usable as a regularizer = the loss function + its registry entry with ``inputs`` +
its test (see docs/recipes.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rankwise._validation import did_you_mean
from rankwise.recipes.config import ConfigError, LossConfig, RegularizerConfig, check_kwargs

__all__ = [
    "LossTerm",
    "build_regularizers",
    "build_task_loss",
    "build_term",
    "check_loss_config",
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


def usable_losses() -> list[str]:
    """Registered losses a recipe can call (their registry entry declares ``inputs``)."""
    from rankwise.losses import LOSSES

    return [e.name for e in LOSSES.entries() if e.inputs]


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


def check_loss_config(loss: LossConfig, key: str = "loss") -> None:
    """Check names and options of the task loss and the regularizers against the registry and signatures."""
    name = task_loss_name(loss)
    shorthand = loss.name is None
    if shorthand and loss.lr is not None:
        raise ConfigError(f"`{key}.lr` applies to a task loss from the registry (`{key}.name`), not to `{key}.kind`")
    entry = _entry(name, f"{key}.kind" if shorthand else f"{key}.name")
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
    for reg in loss.regularizers:
        k = f"{key}.regularizers.{reg.name}"
        entry = _entry(reg.name, f"{k}.name")
        if entry.ordinal is not None or not set(entry.inputs.values()) <= {
            "features",
            "predictions",
            "targets",
            "weights",
        }:
            raise ConfigError(
                f"`{k}.name`: {reg.name!r} is an ordinal loss of a head's logits; it can be the task loss "
                f"(`{key}.name: {reg.name}`), not a regularizer"
            )
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
