"""The one registry class of rankwise: operators, losses, backbones, datasets, soft methods,
sorting relaxations and training recipes are each a :class:`Registry`.

An entry holds metadata only: the function, its ``nn.Module`` twin, what its gradient is, whether
it draws random numbers, its NaN/inf policy, the batch tensors a recipe passes it and, for an
operator, how it serves as a relaxed sort. The example inputs that the registry-wide test suites
(``tests/test_conformance.py``, ``tests/test_properties.py``) call every entry with live in the tests
(``tests/registry_examples.py``), in the :class:`Example` form below; see ``docs/conventions.md``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from rankwise._suggest import suggestion

if TYPE_CHECKING:  # torch is not imported by a registry look-up (the config layer, `rankwise config`)
    import torch

#: batch tensors a training recipe can pass to a registered loss (see ``RegistryEntry.inputs``):
#: the backbone ``features``, the model's ``predictions``, the ``targets`` and per-sample ``weights``;
#: for an ordinal loss (``RegistryEntry.ordinal``) the head's ``logits``, the integer ``classes``
#: ``0..K-1`` of the targets and their extended binary ``levels`` (``(B, K-1)``, CORAL's encoding);
#: for a metric-learning loss the ``embeddings`` and their class ``labels``
INPUT_ROLES = ("features", "predictions", "targets", "weights", "logits", "classes", "levels", "embeddings", "labels")
#: what batch a registered loss takes (``RegistryEntry.takes``), i.e. which recipes can call it:
#:
#: * ``"predictions"``: per-sample predictions ``(B,)`` against regression targets (and optional
#:   per-sample weights): a task loss or regularizer of the regression recipes;
#: * ``"features"``: per-sample backbone features ``(B, D)`` (or views ``(B, V, D)``) against regression
#:   targets: a regularizer of the regression recipes (RankSim, ConR), or Rank-N-Contrast's pretraining;
#: * ``"logits"``: an ordinal head's logits against integer classes or their binary levels;
#: * ``"padded_lists"``: scores ``(Q, L)`` of query lists against graded relevance ``(Q, L)``, padded
#:   slots marked ``-1``: the learning-to-rank recipe;
#: * ``"embeddings_labels"``: embeddings ``(B, D)`` (or views ``(B, V, D)``) against class labels: the
#:   retrieval and contrastive recipes;
#: * ``"embedding_pairs"``: anchor / positive pairs ``(B, 2, D)`` with optional class labels (N-pairs);
#: * ``"class_logits"``: a classifier's logits ``(B, C)`` against class indices (the top-k
#:   classification loss): no ordinal head, no order among the classes.
LOSS_INPUTS = (
    "predictions",
    "features",
    "logits",
    "padded_lists",
    "embeddings_labels",
    "embedding_pairs",
    "class_logits",
)
__all__ = [
    "INPUT_ROLES",
    "LOSS_INPUTS",
    "Example",
    "FuzzFactory",
    "OrdinalHead",
    "Registry",
    "RegistryEntry",
    "RelaxationInfo",
]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Example:
    """Inputs for one call (of a test suite): ``fn(*args, **kwargs)`` and ``Module(**kwargs)(*args)``.

    ``args`` hold the tensors (floating tensors that need gradients have ``requires_grad``);
    ``kwargs`` hold hyperparameters, which are also the keyword arguments of the module twin.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


#: ``fuzz(n, dtype, device, generator)``: random inputs whose ranked / batch length is ``n`` (any
#: ``n >= 0``; return ``None`` for an ``n`` the entry cannot take, e.g. ``k > n``), with floating
#: inputs in ``dtype`` and options drawn from ``generator``; integer label tensors stay integer.
FuzzFactory = Callable[[int, "torch.dtype", "torch.device", "torch.Generator"], "Example | None"]
NonFinite = Literal["propagate", "order"]


@dataclass(frozen=True)
class RelaxationInfo:
    """How an operator serves as a relaxed sort (metadata of its registry entry).

    The sorting recipes (``recipe: sort`` / ``median``) build ``task.method: name`` from it, so a
    new relaxation is one ``register_op(..., relaxation=RelaxationInfo(...))`` next to the operator.

    ``returns``: ``"permutation"`` (the operator returns a relaxed permutation matrix),
    ``"soft_rank"`` (soft ranks 1..n, ascending; the recipe's loss is their mean squared error to the
    true ranks) or ``"rank_loss"`` (the operator is a loss ``fn(scores, ranks, ...)`` of the scores
    against the true ranks). For permutations, ``orientation`` says what ``P[i, j]`` is:
    ``"rows"``: the weight of input ``j`` in sorted position ``i`` (row ``i`` softly selects the
    ``i``-th largest, NeuralSort's :math:`\\hat P`); ``"columns"``: the weight of input ``i`` in
    position ``j`` (the recipe transposes it). ``mass="uniform"``: a transport plan with mass ``1/n``
    per input and per target (the recipe multiplies it by ``n``). ``output``: the position of the
    matrix in a tuple output. ``fixed``: keyword options always passed (e.g. ``descending=True``);
    ``params``: the operator's keyword options that the caller's common hyperparameters fill
    (``tau``, ``power``, ``n_samples``, ``hard``); ``options``: further options and their defaults
    (a config may override them; a value is converted to its default's type). ``straight_through``:
    the operator has no ``hard`` option, the caller applies a straight-through estimator.
    """

    name: str
    returns: Literal["permutation", "soft_rank", "rank_loss"] = "permutation"
    orientation: Literal["rows", "columns"] = "rows"
    mass: Literal["stochastic", "uniform"] = "stochastic"
    output: int | None = None
    fixed: Mapping[str, Any] = field(default_factory=dict, hash=False)
    params: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    straight_through: bool = False
    description: str = ""


@dataclass(frozen=True)
class OrdinalHead:
    """What network head an ordinal loss trains and how its logits become a class (registry metadata).

    ``outputs``: ``"classes"`` (``K`` logits, one per class: the label-distribution and
    distance-weighted losses) or ``"thresholds"`` (``K - 1`` logits, one per rank threshold: CORAL,
    CORN, CONDOR). ``layer``: ``"linear"`` (an ``nn.Linear`` with that many outputs) or ``"coral"``
    (:class:`rankwise.models.CoralLayer`: one shared weight vector and ``K - 1`` biases, the
    rank-consistent head CORAL needs). ``predict(logits) -> (B,)``: the predicted class position,
    an integer class (as float) or, for the expectation-based losses (mean-variance, DLDL), the
    expected class in ``[0, K - 1]``. ``num_classes``: the loss takes the number of classes as a
    keyword option, which the recipe supplies from the data. ``train_classes``: the name of a keyword
    option taking the training set's classes (an integer tensor), which the recipe supplies (SORD's
    ``train_targets``, read when ``prox=True``).
    """

    outputs: Literal["classes", "thresholds"]
    predict: Callable[[torch.Tensor], torch.Tensor]
    layer: Literal["linear", "coral"] = "linear"
    num_classes: bool = False
    train_classes: str | None = None

    def num_outputs(self, num_classes: int) -> int:
        """The head's width for ``num_classes`` classes."""
        return int(num_classes) if self.outputs == "classes" else int(num_classes) - 1


@dataclass(frozen=True)
class RegistryEntry:
    """What a registry knows about one item."""

    name: str
    fn: Callable[..., Any]
    module: type[torch.nn.Module] | None = None
    #: "exact": true gradients (gradcheck applies); "surrogate": a defined but non-analytic
    #: backward (blackbox differentiation, straight-through); "none": not differentiable.
    gradient: Literal["exact", "surrogate", "none"] = "exact"
    #: stochastic items use the global torch RNG; the conformance test reseeds before each call.
    stochastic: bool = False
    description: str = ""
    #: for training recipes (losses): parameter name -> batch tensor role (one of ``INPUT_ROLES``), e.g.
    #: ``{"features": "features", "targets": "targets"}`` for RankSim. A loss with ``inputs`` can be a
    #: recipe's regularizer or task loss: the recipe calls it (or its module twin, whose ``forward``
    #: takes the same tensor parameters) with those tensors by keyword. ``None``: not usable there.
    inputs: Mapping[str, str] | None = field(default=None, hash=False)
    #: what a NaN/inf input does (docs/conventions.md): "propagate": every output that depends on it is
    #: NaN (or +-inf where IEEE arithmetic gives one); "order": exact ordering ops rank +-inf as the
    #: largest/smallest values (finite outputs) and only NaN propagates.
    nonfinite: NonFinite = "propagate"
    #: operators: how the operator serves as a relaxed sort, one :class:`RelaxationInfo` per relaxation
    #: it provides (``diffsort``: its odd-even and bitonic networks); empty: it does not
    relaxations: tuple[RelaxationInfo, ...] = ()
    #: ordinal losses: the head they train and how its logits decode to a class (``None``: not ordinal)
    ordinal: OrdinalHead | None = None
    #: losses: what batch the loss takes, one of ``LOSS_INPUTS`` (``None``: not a loss, or a loss that
    #: declares neither ``takes`` nor ``inputs``); a recipe accepts a loss by it
    takes: str | None = None

    @property
    def relaxation(self) -> RelaxationInfo | None:
        """The first of :attr:`relaxations` (``None``: the operator is no relaxed sort)."""
        return self.relaxations[0] if self.relaxations else None


def _takes_of(inputs: Mapping[str, str] | None) -> str | None:
    """The :data:`LOSS_INPUTS` entry that the roles of ``inputs`` imply (``None``: no ``inputs``)."""
    if not inputs:
        return None
    roles = set(inputs.values())
    for role, takes in (("logits", "logits"), ("embeddings", "embeddings_labels"), ("features", "features")):
        if role in roles:
            return takes
    return "predictions"


class Registry(Generic[F]):
    """A name -> :class:`RegistryEntry` mapping with helpful errors.

    Operators and losses are functions registered with :meth:`register` (with their metadata); other
    registries (soft methods, relaxations, recipes) store any object with :meth:`add`. Reading it as
    a mapping (``reg[name]``, ``name in reg``, ``iter``, ``items()``) gives the stored objects.
    ``lazy`` maps names to the modules that register them: a look-up of such a name imports its
    module first (the built-in recipes load on first use). ``noun`` names what an entry is in the
    registry's messages (``unknown loss 'x'``).
    """

    def __init__(self, noun: str, *, lazy: Mapping[str, str] | None = None) -> None:
        self.noun = noun
        self._entries: dict[str, RegistryEntry] = {}
        self._lazy: dict[str, str] = dict(lazy or {})

    def register(
        self,
        name: str,
        *,
        module: type[torch.nn.Module] | None = None,
        gradient: Literal["exact", "surrogate", "none"] = "exact",
        stochastic: bool = False,
        description: str = "",
        inputs: Mapping[str, str] | None = None,
        nonfinite: NonFinite = "propagate",
        relaxation: RelaxationInfo | tuple[RelaxationInfo, ...] | None = None,
        ordinal: OrdinalHead | None = None,
        takes: str | None = None,
    ) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name`` (a public, callable name: no ``.``; a configuration of
        an entry is the entry's name and options, never an entry of its own).

        ``takes`` (losses): the batch the loss takes, one of :data:`LOSS_INPUTS`; left out, it follows
        from the roles of ``inputs`` (``logits`` -> ``"logits"``, ``embeddings`` -> ``"embeddings_labels"``,
        ``features`` -> ``"features"``, ``predictions`` -> ``"predictions"``). A loss of padded query
        lists or of embedding pairs declares it."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"`name` must be a non-empty string, got {name!r}")
        if "." in name:
            raise ValueError(
                f"`name` must be a public function name without '.', got {name!r}: register the function once "
                "and pass its options to it"
            )
        relaxations = (relaxation,) if isinstance(relaxation, RelaxationInfo) else tuple(relaxation or ())
        if inputs is not None:
            bad = {k: v for k, v in inputs.items() if v not in INPUT_ROLES}
            if bad:
                raise ValueError(f"`inputs` roles must be among {INPUT_ROLES}, got {bad}")
        if takes is not None and takes not in LOSS_INPUTS:
            raise ValueError(f"`takes` of {self.noun} {name!r} must be one of {LOSS_INPUTS}, got {takes!r}")
        takes = takes if takes is not None else _takes_of(inputs)

        def decorator(fn: F) -> F:
            if name in self._entries and self._entries[name].fn is not fn:
                raise ValueError(f"{self.noun} {name!r} is already registered")
            doc = description or (fn.__doc__ or "").strip().split("\n")[0]
            self._entries[name] = RegistryEntry(
                name=name,
                fn=fn,
                module=module,
                gradient=gradient,
                stochastic=stochastic,
                description=doc,
                inputs=dict(inputs) if inputs is not None else None,
                nonfinite=nonfinite,
                relaxations=relaxations,
                ordinal=ordinal,
                takes=takes,
            )
            return fn

        return decorator

    def add(self, name: str, obj: Any, *, replace: bool = False, description: str = "") -> Any:
        """Store ``obj`` under ``name`` (``replace=False``: a second, different object is an error);
        returns ``obj``. ``name`` is a public name, as in :meth:`register` (no ``.``)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"`name` must be a non-empty string, got {name!r}")
        if "." in name:
            raise ValueError(f"`name` must be a public name without '.', got {name!r}: add the object once")
        if not replace and name in self._entries and self._entries[name].fn is not obj:
            raise ValueError(f"{self.noun} {name!r} is already registered")
        self._entries[name] = RegistryEntry(name=name, fn=obj, description=description)
        return obj

    def pop(self, name: str, default: Any = None) -> Any:
        """Remove ``name``; its object, or ``default`` when it was not registered."""
        entry = self._entries.pop(name, None)
        return default if entry is None else entry.fn

    def _load(self, name: object) -> None:
        if name not in self._entries and isinstance(name, str) and name in self._lazy:
            importlib.import_module(self._lazy[name])

    def entry(self, name: str) -> RegistryEntry:
        self._load(name)
        try:
            return self._entries[name]
        except KeyError:
            valid = sorted({*self._entries, *self._lazy})
            hint = suggestion(name, valid)
            hint += " " if hint else ""
            raise ValueError(f"unknown {self.noun} {name!r}; {hint}expected one of: {', '.join(valid)}") from None

    def get(self, name: str) -> Any:
        """The function (or object) registered as ``name``."""
        return self.entry(name).fn

    def names(self, *, load: bool = False) -> list[str]:
        """Registered names, sorted (``load``: import the ``lazy`` modules first)."""
        if load:
            for module in sorted(set(self._lazy.values())):
                importlib.import_module(module)
        return sorted(self._entries)

    def entries(self) -> Iterator[RegistryEntry]:
        for name in self.names():
            yield self._entries[name]

    def items(self) -> list[tuple[str, Any]]:
        """``(name, object)`` pairs, sorted by name."""
        return [(e.name, e.fn) for e in self.entries()]

    def __getitem__(self, name: str) -> Any:
        self._load(name)
        return self._entries[name].fn

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        self._load(name)
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)
