"""Example inputs of every registered operator and loss, for the registry-wide tests.

The registries (``rankwise.ops.OPS``, ``rankwise.losses.LOSSES``) hold metadata only; the inputs that
``tests/test_conformance.py``, ``tests/test_properties.py`` and the other registry-wide tests call an
entry with live here, keyed by ``(registry, entry name)`` (``"op"`` or ``"loss"``):

* ``example(dtype, device) -> Example``: one call, ``fn(*args, **kwargs)`` and
  ``Module(**kwargs)(*args)`` (floating tensors that need gradients have ``requires_grad``);
* ``degenerate(dtype, device) -> list[Example]``: n = 1, empty, all ties, no positives, ...;
* ``fuzz(n, dtype, device, generator) -> Example | None``: random inputs whose ranked / batch length
  is ``n`` (any ``n >= 0``; ``None`` for an ``n`` the entry cannot take, e.g. ``k > n``), floating
  inputs in ``dtype``, options drawn from ``generator``; integer label tensors stay integer.

The registries hold public names only; a configuration of an entry that the suites also run (a
weighing scheme of ``lambda_loss``, ``neural_sort`` with ``hard=True``, ...) is a :class:`Variant`
here: the entry's name and the options that make the configuration, with its own factories (keyed
by the variant's name ``"<entry>.<tag>"``) and the metadata the options change (``stochastic``,
``gradient``). :func:`registry_cases` lists every entry and every variant, as the suites iterate them.

A newly registered entry without factories here fails ``tests/test_registry_examples.py``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from rankwise._registry import Example, FuzzFactory, RegistryEntry

ExampleFactory = Callable[[torch.dtype, torch.device], Example]
DegenerateFactory = Callable[[torch.dtype, torch.device], list[Example]]

__all__ = [
    "EXAMPLES",
    "VARIANTS",
    "Example",
    "Factories",
    "Variant",
    "case_entry",
    "entry_factories",
    "factories",
    "register_examples",
    "registry_cases",
]


@dataclass(frozen=True)
class Factories:
    """The input factories of one registry entry (``fuzz=None``: the suites fall back to ``example``)."""

    example: ExampleFactory
    degenerate: DegenerateFactory | None = None
    fuzz: FuzzFactory | None = None


#: ``(registry, name)`` -> factories; registry is ``"op"`` or ``"loss"``
EXAMPLES: dict[tuple[str, str], Factories] = {}


def register_examples(
    kind: str,
    name: str,
    example: ExampleFactory,
    degenerate: DegenerateFactory | None = None,
    fuzz: FuzzFactory | None = None,
) -> None:
    """Store the factories of entry ``name`` of registry ``kind`` (``"op"`` or ``"loss"``)."""
    if kind not in ("op", "loss"):
        raise ValueError(f"`kind` must be 'op' or 'loss', got {kind!r}")
    EXAMPLES[(kind, name)] = Factories(example, degenerate, fuzz)


def factories(kind: str, name: str) -> Factories:
    """The factories of entry ``name`` of registry ``kind``; a ``LookupError`` naming it when there are none."""
    try:
        return EXAMPLES[(kind, name)]
    except KeyError:
        raise LookupError(
            f"{kind} {name!r} is registered but has no example inputs: add its example / degenerate / fuzz "
            "factories to tests/registry_examples.py"
        ) from None


@dataclass(frozen=True)
class Variant:
    """A configuration of registry entry ``entry`` (of registry ``kind``) that the suites run as a case of
    its own: ``fn(*args, entry's options + options)``. ``name`` is ``"<entry>.<tag>"``; ``stochastic`` /
    ``gradient`` (``None``: the entry's) are the metadata these options give the call."""

    kind: str
    entry: str
    tag: str
    options: Mapping[str, Any] = field(default_factory=dict)
    stochastic: bool | None = None
    gradient: Literal["exact", "surrogate", "none"] | None = None

    @property
    def name(self) -> str:
        return f"{self.entry}.{self.tag}"


#: ``(registry, variant name)`` -> variant
VARIANTS: dict[tuple[str, str], Variant] = {}
_VARIANT_ENTRIES: dict[tuple[str, str], RegistryEntry] = {}


def _registry(kind: str) -> Any:
    from rankwise.losses import LOSSES
    from rankwise.ops import OPS, list_ops

    list_ops()  # the plugin operators (SoDeep) too
    return OPS if kind == "op" else LOSSES


def variant_entry(variant: Variant) -> RegistryEntry:
    """The registry entry of ``variant``'s entry, named after the variant, with the variant's metadata."""
    key = (variant.kind, variant.name)
    if key not in _VARIANT_ENTRIES:
        base = _registry(variant.kind).entry(variant.entry)
        meta: dict[str, Any] = {"name": variant.name}
        if variant.stochastic is not None:
            meta["stochastic"] = variant.stochastic
        if variant.gradient is not None:
            meta["gradient"] = variant.gradient
        _VARIANT_ENTRIES[key] = dataclasses.replace(base, **meta)
    return _VARIANT_ENTRIES[key]


def registry_cases(kind: str | None = None) -> list[tuple[str, RegistryEntry]]:
    """``(registry, entry)`` for every registered operator and loss and every :class:`Variant` (its
    :func:`variant_entry`), operators first, each sorted by name (``kind``: that registry only)."""
    out: list[tuple[str, RegistryEntry]] = []
    for k in ("op", "loss") if kind is None else (kind,):
        cases = [(k, e) for e in _registry(k).entries()]
        cases += [(k, variant_entry(v)) for (vk, _), v in VARIANTS.items() if vk == k]
        out += sorted(cases, key=lambda c: c[1].name)
    return out


def case_entry(kind: str, name: str) -> RegistryEntry:
    """The registry entry ``name`` of registry ``kind``, or the :func:`variant_entry` of variant ``name``."""
    if (kind, name) in VARIANTS:
        return variant_entry(VARIANTS[(kind, name)])
    return _registry(kind).entry(name)


def entry_factories(entry: RegistryEntry) -> Factories:
    """The factories of ``entry``, an entry of ``rankwise.ops.OPS`` or ``rankwise.losses.LOSSES`` or a
    :func:`variant_entry`."""
    for kind in ("op", "loss"):
        registry = _registry(kind)
        if entry.name in registry and registry.entry(entry.name) is entry:
            return factories(kind, entry.name)
        if _VARIANT_ENTRIES.get((kind, entry.name)) is entry:
            return factories(kind, entry.name)
    raise LookupError(f"{entry.name!r} is not an entry of the operator or loss registry, nor a variant")


def variant(
    kind: str,
    entry: str,
    tag: str,
    options: Mapping[str, Any],
    *,
    stochastic: bool | None = None,
    gradient: Literal["exact", "surrogate", "none"] | None = None,
) -> str:
    """Declare the variant ``"<entry>.<tag>"`` (its factories are registered under the returned name)."""
    v = Variant(kind, entry, tag, dict(options), stochastic, gradient)
    VARIANTS[(kind, v.name)] = v
    return v.name


def _op(name: str, example: ExampleFactory, degenerate: DegenerateFactory, fuzz: FuzzFactory) -> None:
    register_examples("op", name, example, degenerate, fuzz)


def _loss(name: str, example: ExampleFactory, degenerate: DegenerateFactory, fuzz: FuzzFactory) -> None:
    register_examples("loss", name, example, degenerate, fuzz)


# --------------------------------------------------------------------------------------------------
# helpers for fuzz factories (random inputs drawn from the given generator, on the CPU first)
# --------------------------------------------------------------------------------------------------
def fuzz_choice(generator: torch.Generator, options: Any) -> Any:
    """One element of the sequence ``options``, drawn from ``generator``."""
    seq = list(options)
    return seq[int(torch.randint(len(seq), (), generator=generator))]


def fuzz_int(generator: torch.Generator, low: int, high: int) -> int:
    """An int in ``[low, high]``."""
    return int(torch.randint(low, high + 1, (), generator=generator))


def fuzz_lead(generator: torch.Generator, max_dims: int = 2, max_size: int = 3) -> tuple[int, ...]:
    """Random leading dims (0 to ``max_dims`` of them, sizes 0..``max_size``; size 0 now and then)."""
    return tuple(fuzz_int(generator, 0, max_size) for _ in range(fuzz_int(generator, 0, max_dims)))


def fuzz_tensor(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    generator: torch.Generator,
    *,
    grad: bool = True,
    positive: bool = False,
    scale: float = 1.0,
) -> torch.Tensor:
    """A leaf of standard-normal values (``positive``: uniform in [0.5, 1.5]) times ``scale``."""
    if positive:
        x = torch.rand(shape, generator=generator, dtype=torch.float64) + 0.5
    else:
        x = torch.randn(shape, generator=generator, dtype=torch.float64)
    return (x * scale).to(device=device, dtype=dtype).requires_grad_(grad)


def fuzz_labels(
    n: int, device: torch.device, generator: torch.Generator, *, classes: int | None = None
) -> torch.Tensor:
    """``(n,)`` int64 labels in ``[0, classes)`` (default about ``n / 2`` classes, so labels repeat)."""
    c = classes if classes is not None else max(1, n // 2 + 1)
    return torch.randint(c, (n,), generator=generator).to(device)


def _fuzz_dim0(x: torch.Tensor, lead: tuple[int, ...], kw: dict[str, Any], g: torch.Generator) -> torch.Tensor:
    """With leading dims, now and then rank along dim 0 (``(n, *lead)``, ``dim=0``)."""
    if lead and fuzz_choice(g, [False, True]):
        x, kw["dim"] = x.movedim(-1, 0).contiguous(), 0
    return x


# --------------------------------------------------------------------------------------------------
# fixed inputs
# --------------------------------------------------------------------------------------------------
def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Seeded float64 standard-normal values, cast, as a leaf with ``requires_grad``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype).requires_grad_()


def random_features(dtype: torch.dtype, device: torch.device, *shape: int, seed: int = 0) -> torch.Tensor:
    """Seeded (float32) standard-normal leaf features with ``requires_grad``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_()


def _filled(shape: tuple[int, ...], fill: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.full(shape, fill, dtype=dtype, device=device).requires_grad_()


# ==================================================================================================
# operators
# ==================================================================================================

# --- exact and blackbox ranks (rankwise.ops.ranking) ----------------------------------------------
_TIES = ("ordinal", "average", "min", "max", "dense")


def _rank_example(dtype: torch.dtype, device: torch.device) -> Example:
    g = torch.Generator().manual_seed(0)
    return Example(
        (torch.randn(3, 7, generator=g).to(device=device, dtype=dtype),),
        {"descending": True, "ties": "average", "normalize": True},
    )


def _bb_example(dtype: torch.dtype, device: torch.device) -> Example:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, generator=g).to(device=device, dtype=dtype).requires_grad_()
    return Example((x,), {"lambda_val": 2.0, "descending": True, "normalize": True})


def _rank_degenerate(dtype: torch.dtype, device: torch.device, grad: bool) -> list[Example]:
    shapes = [(0,), (4, 0), (1,), (2, 1)]
    out = [Example((torch.zeros(s, dtype=dtype, device=device).requires_grad_(grad),)) for s in shapes]
    out.append(Example((torch.ones(2, 5, dtype=dtype, device=device).requires_grad_(grad),)))
    return out


def _rank_fuzz_x(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator, grad: bool) -> Example:
    """Random ``(*lead, n)`` input, sometimes ranked along dim 0 (``(n, *lead)``)."""
    lead = fuzz_lead(g)
    x = fuzz_tensor((*lead, n), dtype, device, g, grad=False)
    kw: dict[str, Any] = {"descending": fuzz_choice(g, [False, True]), "normalize": fuzz_choice(g, [False, True])}
    x = _fuzz_dim0(x, lead, kw, g)
    return Example((x.requires_grad_(grad),), kw)


def _rank_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
    ex = _rank_fuzz_x(n, dtype, device, g, grad=False)
    ex.kwargs["ties"] = fuzz_choice(g, _TIES)
    return ex


def _bb_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
    ex = _rank_fuzz_x(n, dtype, device, g, grad=True)
    ex.kwargs["lambda_val"] = fuzz_choice(g, [0.5, 2.0, 10.0])
    return ex


_op("rank", _rank_example, lambda dt, dev: _rank_degenerate(dt, dev, False), _rank_fuzz)
_op(
    "blackbox_rank",
    _bb_example,
    lambda dt, dev: [Example(e.args, {"lambda_val": 1.0}) for e in _rank_degenerate(dt, dev, True)],
    _bb_fuzz,
)


# --- top-k and differentiable kNN (rankwise.ops.topk) ---------------------------------------------
def _t(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    fill: float | None = None,
    grad: bool = True,
) -> torch.Tensor:
    if fill is None:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    else:
        x = torch.full(shape, fill, dtype=torch.float64)
    return x.to(device=device, dtype=dtype).requires_grad_(grad)


def _topk_example(dtype: torch.dtype, device: torch.device) -> Example:
    return Example((_t((3, 7), dtype, device),), {"k": 3, "tau": 0.7})


def _topk_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    return [
        Example((_t((0, 4), dtype, device, fill=0.0),), {"k": 2}),
        Example((_t((1,), dtype, device, fill=0.0),), {"k": 1}),
        Example((_t((2, 1), dtype, device, fill=0.0),), {"k": 1}),
        Example((_t((2, 5), dtype, device, fill=0.3),), {"k": 2}),  # all ties
        Example((_t((2, 5), dtype, device, fill=0.3),), {"k": 5}),  # k = n
    ]


def _topk_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example | None:
    if n == 0:
        return None  # k must be in [1, n]
    lead = fuzz_lead(g)
    x = fuzz_tensor((*lead, n), dtype, device, g, grad=False)
    kw: dict[str, Any] = {
        "k": fuzz_int(g, 1, n),
        "tau": fuzz_choice(g, [0.05, 0.7, 5.0]),
        "method": fuzz_choice(g, ["neuralsort", "softsort"]),
    }
    x = _fuzz_dim0(x, lead, kw, g)
    return Example((x.requires_grad_(),), kw)


def _dknn_kwargs(stochastic: bool) -> dict[str, Any]:
    return {"method": "stochastic", "n_samples": 3} if stochastic else {}


def _dknn_example(stochastic: bool) -> ExampleFactory:
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        q, y = _t((4, 3), dtype, device, seed=1), _t((6, 3), dtype, device, seed=2)
        return Example((q, y), {"k": 2, "tau": 0.7, **_dknn_kwargs(stochastic)})

    return example


def _dknn_degenerate(stochastic: bool) -> DegenerateFactory:
    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        kw = _dknn_kwargs(stochastic)
        return [
            Example((_t((0, 3), dtype, device), _t((4, 3), dtype, device, seed=2)), {"k": 2, **kw}),  # no queries
            Example((_t((2, 3), dtype, device), _t((1, 3), dtype, device, seed=2)), {"k": 1, **kw}),  # N = 1
            Example((_t((2, 3), dtype, device), _t((5, 3), dtype, device, fill=1.0)), {"k": 2, **kw}),  # ties
            Example((_t((2, 0), dtype, device), _t((3, 0), dtype, device)), {"k": 1, **kw}),  # D = 0
        ]

    return degenerate


def _dknn_fuzz(stochastic: bool) -> FuzzFactory:
    def factory(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example | None:
        if n == 0:
            return None  # k must be in [1, N]
        d = fuzz_int(g, 1, 4)
        q = fuzz_tensor((fuzz_int(g, 0, 4), d), dtype, device, g)
        y = fuzz_tensor((n, d), fuzz_choice(g, [dtype, torch.float64]), device, g)
        kw: dict[str, Any] = {"k": fuzz_int(g, 1, n), "tau": fuzz_choice(g, [0.05, 0.7, 5.0])}
        if stochastic:
            kw.update(method="stochastic", n_samples=fuzz_int(g, 1, 3))
        return Example((q, y), kw)

    return factory


def _class_example(dtype: torch.dtype, device: torch.device) -> Example:
    m = torch.rand(3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    labels = torch.tensor([0, 2, 1, 2, 0], device=device)
    return Example((m.to(device=device, dtype=dtype).requires_grad_(), labels), {"num_classes": 3})


def _class_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    lab = torch.tensor([0, 0, 0], device=device)
    return [
        Example((_t((0, 3), dtype, device), lab), {"num_classes": 2}),
        Example((_t((2, 3), dtype, device), lab), {"num_classes": 1}),
        Example((_t((2, 0), dtype, device), lab[:0]), {"num_classes": 2}),
    ]


def _class_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
    c = fuzz_int(g, 1, 4)
    m = fuzz_tensor((*fuzz_lead(g, max_dims=1), fuzz_int(g, 0, 4), n), dtype, device, g, positive=True)
    return Example((m, fuzz_labels(n, device, g, classes=c + 1)), {"num_classes": c})


_op("soft_topk", _topk_example, _topk_degenerate, _topk_fuzz)

#: the other soft_topk methods: their options in the example and in fuzzing (temperatures drawn from the list)
_TOPK_METHOD_OPTIONS: dict[str, tuple[dict[str, Any], str, list[Any]]] = {
    "softsort": ({"power": 1.0}, "tau", [0.05, 0.7, 5.0]),
    "isotonic": ({}, "regularization_strength", [0.05, 0.7, 5.0]),
    "isotonic_kl": ({"regularization": "kl"}, "regularization_strength", [0.05, 0.7, 5.0]),
    "sparse": ({}, "regularization_strength", [0.05, 0.7, 5.0]),
    "sparse_p43": ({"p": 4.0 / 3.0}, "regularization_strength", [0.05, 0.7, 5.0]),
    "sparse_dykstra": ({"solver": "dykstra", "num_iter": 400}, "regularization_strength", [0.7, 5.0]),
    "ot": ({"max_iter": 400}, "epsilon", [0.1, 0.5]),
    "diffsort": ({}, "steepness", [2.0, 10.0]),
    "lapsum": ({}, "alpha", [0.05, 0.7, 5.0]),
}


def _topk_method_factories(tag: str, values: bool) -> None:
    method = tag.split("_")[0]
    extra, temp, temps = _TOPK_METHOD_OPTIONS[tag]
    options = {"method": method, **extra}
    entry = "soft_topk_values" if values else "soft_topk"
    # ot: the authors' backward treats the cost's normalization (its largest entry) as a constant
    name = variant("op", entry, tag, options, gradient="surrogate" if method == "ot" else None)

    def example(dtype: torch.dtype, device: torch.device) -> Example:
        return Example((_t((3, 7), dtype, device),), {"k": 3, **options, temp: temps[-1]})

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        return [Example(e.args, {**e.kwargs, **options}) for e in _topk_degenerate(dtype, device)]

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example | None:
        if n == 0:
            return None
        lead = fuzz_lead(g)
        x = fuzz_tensor((*lead, n), dtype, device, g, grad=False)
        kw: dict[str, Any] = {"k": fuzz_int(g, 1, n), **options, temp: fuzz_choice(g, temps)}
        x = _fuzz_dim0(x, lead, kw, g)
        return Example((x.requires_grad_(),), kw)

    _op(name, example, degenerate, fuzz)


for _tag in _TOPK_METHOD_OPTIONS:
    _topk_method_factories(_tag, values=False)
_op(
    variant("op", "soft_topk", "perturbed", {"method": "perturbed"}, stochastic=True, gradient="surrogate"),
    lambda dtype, device: Example((_t((3, 7), dtype, device),), {"k": 3, "method": "perturbed", "n_samples": 8}),
    lambda dtype, device: [
        Example(e.args, {**e.kwargs, "method": "perturbed", "n_samples": 4}) for e in _topk_degenerate(dtype, device)
    ],
    lambda n, dtype, device, g: (
        None
        if n == 0
        else Example(
            (fuzz_tensor((2, n), dtype, device, g, grad=True),),
            {"k": fuzz_int(g, 1, n), "method": "perturbed", "n_samples": 4, "sigma": 0.5},
        )
    ),
)
_op("soft_topk_values", _topk_example, _topk_degenerate, _topk_fuzz)
for _tag in ("softsort", "isotonic", "diffsort", "lapsum"):
    _topk_method_factories(_tag, values=True)
_op("dknn", _dknn_example(False), _dknn_degenerate(False), _dknn_fuzz(False))
_op(
    variant("op", "dknn", "stochastic", _dknn_kwargs(True), stochastic=True),
    _dknn_example(True),
    _dknn_degenerate(True),
    _dknn_fuzz(True),
)
_op("dknn_class_scores", _class_example, _class_degenerate, _class_fuzz)


# --- relaxed permutation matrices (rankwise.ops.permutation) --------------------------------------
def _pos(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
    return x.to(device=device, dtype=dtype).requires_grad_()


def _permutation_op(name: str, kwargs: dict[str, Any], positive: bool = False) -> None:
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        x = _pos((3, 6), dtype, device) if positive else _randn((3, 6), dtype, device)
        return Example((x,), dict(kwargs))

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        fill = 1.0 if positive else 0.0
        xs = [_filled(s, fill, dtype, device) for s in [(0,), (4, 0), (0, 3), (1,), (2, 1)]]
        xs.append(_filled((2, 5), 0.7, dtype, device))  # all ties
        return [Example((x,), dict(kwargs)) for x in xs]

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        lead = fuzz_lead(g)
        kw = dict(kwargs)
        log_scores = positive and fuzz_choice(g, [False, True])
        x = fuzz_tensor((*lead, n), dtype, device, g, grad=False, positive=positive and not log_scores)
        kw["tau"] = fuzz_choice(g, [0.05, 0.7, 5.0])
        if "n_samples" in kw:
            kw["n_samples"] = fuzz_int(g, 1, 3)
            kw["log_scores"] = log_scores
        if "power" in kw:
            kw["power"] = fuzz_choice(g, [0.5, 1.0, 2.0])
        if kw.get("method") in ("neuralsort", "softsort"):
            kw["descending"] = fuzz_choice(g, [False, True])
        x = _fuzz_dim0(x, lead, kw, g)
        return Example((x.requires_grad_(),), kw)

    _op(name, example, degenerate, fuzz)


_HARD = {"hard": True}
_permutation_op("neural_sort", {"tau": 0.7})
_permutation_op(variant("op", "neural_sort", "hard", _HARD, gradient="surrogate"), {"tau": 0.7, **_HARD})
_permutation_op("stochastic_neural_sort", {"tau": 0.7, "n_samples": 2}, positive=True)
_permutation_op(
    variant("op", "stochastic_neural_sort", "hard", _HARD, gradient="surrogate"),
    {"tau": 0.7, "n_samples": 2, **_HARD},
    positive=True,
)
_permutation_op("softsort", {"tau": 0.7, "power": 1.0})
_permutation_op(variant("op", "softsort", "hard", _HARD, gradient="surrogate"), {"tau": 0.7, **_HARD})
for _fn in (
    "soft_sort",
    "soft_rank",
):  # the soft sort / rank front ends, `method` neuralsort (their entry) and softsort
    _permutation_op(_fn, {"method": "neuralsort", "tau": 0.7})
    _permutation_op(
        variant("op", _fn, "softsort", {"method": "softsort"}), {"method": "softsort", "tau": 0.7, "power": 2.0}
    )


# --- perturbed optimizers (rankwise.ops.perturbed) ------------------------------------------------
_DEGENERATE_SHAPES = [(0,), (4, 0), (0, 3), (1,), (2, 1)]


def _perturbed_op(name: str, kwargs: dict[str, Any], kind: str) -> None:
    """``kind``: ``"rank"`` (perturbed ranks), ``"topk"`` or ``"fy"`` (the Fenchel-Young loss)."""
    topk = kind == "topk"

    def example(dtype: torch.dtype, device: torch.device) -> Example:
        if kind == "fy":
            x = _randn((3, 6), dtype, device)
            target = torch.stack([torch.randperm(6, generator=torch.Generator().manual_seed(i)) for i in range(3)]) + 1
            return Example((x, target.to(device=device, dtype=dtype)), {"n_samples": 8, "sigma": 0.5})
        return Example((_randn((3, 6), dtype, device),), {"k": 2, **kwargs} if topk else dict(kwargs))

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        if kind == "fy":
            out = []
            for s in _DEGENERATE_SHAPES:
                x = torch.zeros(s, dtype=dtype, device=device).requires_grad_()
                out.append(Example((x, torch.ones(s, dtype=dtype, device=device)), {"n_samples": 4}))
            ties = _filled((2, 5), 0.7, dtype, device)
            out.append(Example((ties, torch.full((2, 5), 3.0, dtype=dtype, device=device)), {"n_samples": 4}))
            return out
        xs = [torch.zeros(s, dtype=dtype, device=device).requires_grad_() for s in _DEGENERATE_SHAPES]
        xs.append(_filled((2, 5), 0.7, dtype, device))  # all ties
        if topk:
            return [Example((x,), {"k": 1, **kwargs}) for x in xs if x.shape[-1] > 0]
        return [Example((x,), dict(kwargs)) for x in xs]

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example | None:
        if topk and n == 0:
            return None  # k must be in [1, n]
        lead = fuzz_lead(g)
        x = fuzz_tensor((*lead, n), dtype, device, g, grad=False)
        kw: dict[str, Any] = {"method": "perturbed"} if kwargs.get("method") == "perturbed" else {}
        kw["sigma"] = fuzz_choice(g, [0.05, 0.5, 5.0])
        kw["n_samples"] = fuzz_int(g, 1, 4)
        kw["noise"] = fuzz_choice(g, ("gumbel", "normal"))
        if topk:
            kw["k"] = fuzz_int(g, 1, n)
        else:
            kw["descending"] = fuzz_choice(g, [False, True])
        args: tuple[torch.Tensor, ...] = (x,)
        if kind == "fy":
            perm = torch.rand((*lead, n), generator=g).argsort(-1) + 1
            args = (x, perm.to(fuzz_choice(g, [dtype, torch.float64, torch.int64])).to(device))
            kw["reduction"] = fuzz_choice(g, ("mean", "sum", "none"))
        if lead and fuzz_choice(g, [False, True]):
            args = tuple(a.movedim(-1, 0).contiguous() for a in args)
            kw["dim"] = 0
        args[0].requires_grad_()
        return Example(args, kw)

    _op(name, example, degenerate, fuzz)


_perturbed_op("perturbed_rank", {"n_samples": 8}, "rank")
_perturbed_op(
    variant("op", "perturbed_rank", "normal", {"noise": "normal"}), {"noise": "normal", "descending": True}, "rank"
)
_perturbed_op("perturbed_topk", {"n_samples": 8, "sigma": 0.5}, "topk")
_perturbed_op("perturbed_fy_loss", {}, "fy")
_perturbed_op(
    variant("op", "soft_rank", "perturbed", {"method": "perturbed"}, stochastic=True, gradient="surrogate"),
    {"method": "perturbed", "n_samples": 8},
    "rank",
)


# --- Sinkhorn optimal transport (rankwise.ops.sinkhorn) -------------------------------------------
def _sinkhorn_op(name: str, kwargs: dict[str, Any]) -> None:
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        return Example((_randn((3, 6), dtype, device),), dict(kwargs))

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        # an empty row cannot be transported onto num_targets >= 1 targets (a ValueError)
        shapes = [(0, 3), (1,), (2, 1)] + ([] if kwargs.get("num_targets") else [(0,), (4, 0)])
        out = [Example((torch.zeros(s, dtype=dtype, device=device).requires_grad_(),), dict(kwargs)) for s in shapes]
        ties = torch.full((2, 5), 0.7, dtype=dtype, device=device)
        out.append(Example((ties.clone().requires_grad_(),), dict(kwargs)))
        out.append(Example((ties.clone().requires_grad_(),), {**kwargs, "epsilon": 1e-3, "descending": True}))
        return out

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example | None:
        kw = dict(kwargs)
        if kw.get("num_targets"):
            if n == 0:
                return None  # an empty row cannot be transported onto num_targets >= 1 targets
            kw["num_targets"] = fuzz_int(g, 1, n)
        kw["epsilon"] = fuzz_choice(g, [1e-2, 0.1, 1.0])
        kw["descending"] = fuzz_choice(g, [False, True])
        lead = fuzz_lead(g)
        x = fuzz_tensor((*lead, n), dtype, device, g, grad=False)
        x = _fuzz_dim0(x, lead, kw, g)
        return Example((x.requires_grad_(),), kw)

    _op(name, example, degenerate, fuzz)


_sinkhorn_op("sinkhorn_transport", {"epsilon": 0.1})
_sinkhorn_op("soft_rank_sinkhorn", {"epsilon": 0.1})
_sinkhorn_op("soft_sort_sinkhorn", {"epsilon": 0.1, "descending": True})
_sinkhorn_op(variant("op", "soft_sort_sinkhorn", "quantized", {"num_targets": 4}), {"epsilon": 0.05, "num_targets": 4})


# --- differentiable sorting networks (rankwise.ops.sorting_network) -------------------------------
_NETWORKS = ("odd_even", "bitonic")
_DISTRIBUTIONS = ("cauchy", "logistic", "logistic_phi", "optimal", "gaussian", "reciprocal")


def _diffsort_op(name: str, kwargs: dict[str, Any]) -> None:
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        return Example((_randn((3, 6), dtype, device),), dict(kwargs))

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        shapes = [(0,), (4, 0), (0, 3), (1,), (2, 1)]
        xs = [torch.zeros(s, dtype=dtype, device=device).requires_grad_() for s in shapes]
        xs.append(_filled((2, 5), 0.7, dtype, device))  # all ties
        xs.append(_filled((2, 3), 0.7, dtype, device))  # ties, bitonic padding
        return [Example((x,), dict(kwargs)) for x in xs]

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        lead = fuzz_lead(g)
        x = fuzz_tensor((*lead, n), dtype, device, g, grad=False)
        kw = dict(kwargs)
        kw.pop("dim", None)
        kw["network"] = fuzz_choice(g, _NETWORKS)
        kw["distribution"] = fuzz_choice(g, _DISTRIBUTIONS)
        kw["steepness"] = fuzz_choice(g, [0.5, 10.0, 100.0])
        kw["art_lambda"] = fuzz_choice(g, [0.0, 0.25, 1.0])
        kw["descending"] = fuzz_choice(g, [False, True])
        if "return_matrix" in kw:  # P of a deep odd-even network is O(n^3): only for small n
            kw["return_matrix"] = fuzz_choice(g, [False, True]) and (n <= 64 or kw["network"] == "bitonic")
        x = _fuzz_dim0(x, lead, kw, g)
        return Example((x.requires_grad_(),), kw)

    _op(name, example, degenerate, fuzz)


_diffsort_op("diffsort", {"steepness": 2.0, "return_matrix": True})
_diffsort_op(
    variant("op", "diffsort", "bitonic", {"network": "bitonic"}),
    {"network": "bitonic", "steepness": 2.0, "distribution": "optimal"},
)
_diffsort_op(
    variant("op", "diffsort", "logistic_phi", {"distribution": "logistic_phi"}),
    {"network": "bitonic", "distribution": "logistic_phi", "steepness": 3.0, "descending": True, "dim": 0},
)
_diffsort_op(
    variant("op", "diffsort", "values", {"return_matrix": False}),
    {"distribution": "reciprocal", "return_matrix": False},
)
# error-free swaps (Kim et al., ICLR 2024): exact forward, relaxed backward -- a surrogate gradient
_diffsort_op(
    variant("op", "diffsort", "error_free", {"error_free": True}, gradient="surrogate"),
    {"error_free": True, "steepness": 2.0, "return_matrix": True},
)
_diffsort_op(
    variant("op", "diffsort", "error_free_bitonic", {"network": "bitonic", "error_free": True}, gradient="surrogate"),
    {"network": "bitonic", "error_free": True, "distribution": "optimal", "descending": True},
)
for _fn in ("soft_sort", "soft_rank"):
    _diffsort_op(variant("op", _fn, "diffsort", {"method": "diffsort"}), {"method": "diffsort", "steepness": 2.0})
    _diffsort_op(
        variant("op", _fn, "diffsort_error_free", {"method": "diffsort", "error_free": True}, gradient="surrogate"),
        {"method": "diffsort", "error_free": True, "network": "bitonic"},
    )
    _bitonic = {"method": "diffsort", "network": "bitonic"}
    _diffsort_op(
        variant("op", _fn, "diffsort_bitonic", _bitonic), {**_bitonic, "distribution": "gaussian", "descending": True}
    )


# --- isotonic soft sort / rank (rankwise.ops.isotonic) --------------------------------------------
def _isotonic_op(name: str, reg: str, descending: bool) -> None:
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(3, 6, generator=g).to(device=device, dtype=dtype).requires_grad_()
        return Example((x,), {"regularization": reg, "regularization_strength": 0.5, "descending": descending})

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        kw = {"regularization": reg, "regularization_strength": 1.0}
        shapes = [(0,), (4, 0), (1,), (2, 1)]
        out = [Example((torch.zeros(s, dtype=dtype, device=device).requires_grad_(),), dict(kw)) for s in shapes]
        out.append(Example((_filled((2, 5), 1.0, dtype, device),), dict(kw)))
        out.append(
            Example((_filled((2, 5), 1.0, dtype, device),), {**kw, "regularization_strength": 1e-3, "descending": True})
        )
        return out

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        lead = fuzz_lead(g)
        x = fuzz_tensor((*lead, n), dtype, device, g, grad=False)
        kw: dict[str, Any] = {
            "regularization": reg,
            "regularization_strength": fuzz_choice(g, [1e-3, 1e-2, 0.1, 1.0, 10.0]),
            "descending": fuzz_choice(g, [False, True]),
        }
        x = _fuzz_dim0(x, lead, kw, g)
        return Example((x.requires_grad_(),), kw)

    _op(name, example, degenerate, fuzz)


_isotonic_op("soft_rank_isotonic", "l2", False)
_isotonic_op("soft_sort_isotonic", "l2", True)
_isotonic_op(variant("op", "soft_rank_isotonic", "kl", {"regularization": "kl"}), "kl", False)
_isotonic_op(variant("op", "soft_sort_isotonic", "kl", {"regularization": "kl"}), "kl", True)


# --- LapSum (rankwise.ops.lapsum) ----------------------------------------------------------------
def _lapsum_op(name: str, kind: str, kwargs: dict[str, Any]) -> None:
    """``kind``: ``"rank"`` / ``"sort"`` (the input alone) or ``"topk"`` (``k`` too)."""
    topk = kind == "topk"

    def example(dtype: torch.dtype, device: torch.device) -> Example:
        return Example((_randn((3, 7), dtype, device),), {"k": 3, **kwargs} if topk else dict(kwargs))

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        xs = [torch.zeros(s, dtype=dtype, device=device).requires_grad_() for s in _DEGENERATE_SHAPES]
        xs.append(_filled((2, 5), 0.7, dtype, device))  # all ties
        if not topk:
            out = [Example((x,), dict(kwargs)) for x in xs]
            return [*out, Example((_filled((2, 5), 0.7, dtype, device),), {**kwargs, "descending": True})]
        out = [Example((x,), {"k": 1, **kwargs}) for x in xs if x.shape[-1] > 0]
        out.append(Example((_filled((2, 5), 0.7, dtype, device),), {"k": 5, **kwargs}))  # k = n
        return [*out, Example((_filled((2, 5), 0.7, dtype, device),), {"k": 2.5, **kwargs, "descending": False})]

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example | None:
        if topk and n == 0:
            return None  # k must be in (0, n]
        lead = fuzz_lead(g)
        x = fuzz_tensor((*lead, n), dtype, device, g, grad=False)
        kw = dict(kwargs)
        kw["alpha"] = fuzz_choice(g, [0.05, 0.7, 5.0])
        kw["descending"] = fuzz_choice(g, [False, True])
        if topk:
            kw["k"] = fuzz_choice(g, [fuzz_int(g, 1, n), n * 0.4 + 0.1])
        x = _fuzz_dim0(x, lead, kw, g)
        return Example((x.requires_grad_(),), kw)

    _op(name, example, degenerate, fuzz)


_lapsum_op("lapsum_rank", "rank", {"alpha": 0.5})
_lapsum_op("lapsum_sort", "sort", {"alpha": 0.5, "descending": True})
_lapsum_op("lapsum_topk", "topk", {"alpha": 0.5})
for _fn in ("soft_sort", "soft_rank"):
    _lapsum_op(variant("op", _fn, "lapsum", {"method": "lapsum"}), _fn[5:], {"method": "lapsum", "alpha": 0.5})


# --- Gumbel-Sinkhorn (rankwise.ops.gumbel_sinkhorn) ------------------------------------------------
def _gumbel_sinkhorn_example(dtype: torch.dtype, device: torch.device) -> Example:
    return Example((_randn((3, 4, 4), dtype, device),), {"temperature": 0.7, "n_iters": 10, "n_samples": 2})


def _gumbel_sinkhorn_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    shapes = [(0, 0), (2, 0, 0), (0, 3, 3), (1, 1), (2, 1, 1)]
    out = [Example((torch.zeros(s, dtype=dtype, device=device).requires_grad_(),), {"n_iters": 5}) for s in shapes]
    out.append(Example((_filled((2, 4, 4), 0.7, dtype, device),), {"noise_factor": 0.0}))  # all ties
    return out


def _gumbel_sinkhorn_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example | None:
    if n > 64:
        return None  # n x n matrices: O(n_iters n^2) per sample
    lead = fuzz_lead(g, max_dims=1)
    x = fuzz_tensor((*lead, n, n), dtype, device, g)
    kw: dict[str, Any] = {
        "temperature": fuzz_choice(g, [0.1, 1.0, 3.0]),
        "n_iters": fuzz_int(g, 0, 20),
        "noise_factor": fuzz_choice(g, [0.0, 0.5, 1.0]),
        "n_samples": fuzz_int(g, 1, 3),
    }
    return Example((x,), kw)


_op("gumbel_sinkhorn", _gumbel_sinkhorn_example, _gumbel_sinkhorn_degenerate, _gumbel_sinkhorn_fuzz)


# --- SoDeep learned sorter (rankwise.sodeep.hub) --------------------------------------------------
def _sodeep_example(dtype: torch.dtype, device: torch.device) -> Example:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 32, generator=g).to(device=device, dtype=dtype).requires_grad_()
    return Example((x,), {"descending": True})


def _sodeep_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    def t(*shape: int, fill: float = 0.0) -> torch.Tensor:
        return _filled(shape, fill, dtype, device)

    return [
        Example((t(0),)),
        Example((t(3, 0),)),
        Example((t(1),)),
        Example((t(2, 1),)),
        Example((t(2, 32, fill=3.0),)),  # all ties: a constant sequence
        Example((t(2, 16, fill=1.0),), {"model": "exact"}),
    ]


def _sodeep_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
    """Random input; ``n > 1`` becomes 32 (a bundled sorter length)."""
    lead = fuzz_lead(g)
    x = fuzz_tensor((*lead, n if n <= 1 else 32), dtype, device, g)
    return Example((x,), {"descending": fuzz_choice(g, [False, True])})


_op("sodeep_rank", _sodeep_example, _sodeep_degenerate, _sodeep_fuzz)


# ==================================================================================================
# losses
# ==================================================================================================


# --- triplet and N-pairs (rankwise.losses._pairs) -------------------------------------------------
def _triplet_example(dtype: torch.dtype, device: torch.device) -> Example:
    labels = torch.tensor([0, 1, 0, 2, 1, 2], device=device)
    return Example((random_features(dtype, device, 6, 5), labels), {"margin": 0.5, "mining": "all"})


def _triplet_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    f = functools.partial(random_features, dtype, device)
    return [
        Example((f(0, 4),)),
        Example((f(1, 4),)),  # n = 1: no positive
        Example((f(3, 2, 4), torch.zeros(3, dtype=torch.long, device=device))),  # no negative
        Example((f(3, 4), torch.arange(3, device=device)), {"mining": "hard"}),  # no positive
        Example((_filled((4, 2, 3), 1.0, dtype, device),), {"distance": "euclidean"}),
    ]


def _npairs_example(dtype: torch.dtype, device: torch.device) -> Example:
    labels = torch.tensor([0, 1, 2, 0, 3], device=device)
    return Example((random_features(dtype, device, 5, 2, 4), labels), {"temperature": 2.0})


def _npairs_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    f = functools.partial(random_features, dtype, device)
    return [
        Example((f(0, 2, 4),)),
        Example((f(1, 2, 4),)),
        Example((f(3, 2, 4), torch.zeros(3, dtype=torch.long, device=device))),  # one label
        Example((_filled((3, 2, 4), 1.0, dtype, device),), {"normalize": True}),
    ]


def _pair_fuzz(triplet: bool) -> FuzzFactory:
    def factory(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        shape = fuzz_choice(g, [(n, fuzz_int(g, 1, 5)), (n, 2, fuzz_int(g, 1, 4))]) if triplet else (n, 2, 3)
        feats = fuzz_tensor(shape, dtype, device, g)
        args: tuple[Any, ...] = (feats,)
        if fuzz_choice(g, [False, True]):
            args = (feats, fuzz_labels(n, device, g).to(fuzz_choice(g, [torch.int64, torch.float32])))
        kw: dict[str, Any] = {"reduction": fuzz_choice(g, ["mean", "sum", "none"])}
        if triplet:
            kw.update(
                margin=fuzz_choice(g, [0.0, 0.2]),
                distance=fuzz_choice(g, ["squared", "euclidean"]),
                mining=fuzz_choice(g, ["all", "hard"]),
            )
        else:
            kw["temperature"] = fuzz_choice(g, [0.1, 2.0])
        return Example(args, kw)

    return factory


_loss("triplet", _triplet_example, _triplet_degenerate, _pair_fuzz(True))
_loss("npairs", _npairs_example, _npairs_degenerate, _pair_fuzz(False))


# --- supervised contrastive (rankwise.losses._supcon) ---------------------------------------------
def _supcon_example(dtype: torch.dtype, device: torch.device) -> Example:
    feats = random_features(dtype, device, 5, 2, 6)
    labels = torch.tensor([0, 1, 0, 2, 1], device=device)
    return Example((feats, labels), {"temperature": 0.5, "variant": "out", "chunk_size": 3})


def _supcon_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    def f(*shape: int) -> torch.Tensor:
        return random_features(dtype, device, *shape, seed=1)

    return [
        Example((f(0, 2, 4),)),  # empty batch
        Example((f(1, 1, 4),)),  # one view of one sample: no positive
        Example((f(3, 4),)),  # single view, no labels: no positive
        Example((f(3, 4), torch.tensor([0, 1, 2], device=device))),  # all labels distinct, one view
        Example((f(3, 2, 4), torch.zeros(3, dtype=torch.long, device=device))),  # a single label
        Example((f(1, 2, 4),), {"variant": "in"}),  # n = 1 sample, SimCLR
        Example((_filled((3, 2, 4), 1.0, dtype, device),)),  # all equal features
    ]


def _supcon_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
    feats = fuzz_tensor((n, fuzz_int(g, 1, 3), fuzz_int(g, 1, 5)), dtype, device, g)
    if fuzz_choice(g, [False, True]):
        feats = feats.detach()[:, 0].requires_grad_()  # (B, D): one view
    args: tuple[Any, ...] = (feats,)
    if fuzz_choice(g, [False, True]):
        args = (feats, fuzz_labels(n, device, g).to(fuzz_choice(g, [torch.int64, torch.float32])))
    kw: dict[str, Any] = {
        "temperature": fuzz_choice(g, [0.07, 0.5]),
        "variant": fuzz_choice(g, ["out", "in"]),
        "contrast_mode": fuzz_choice(g, ["all", "one"]),
        "chunk_size": fuzz_choice(g, [None, 1, 3]),
    }
    return Example(args, kw)


_loss("supcon", _supcon_example, _supcon_degenerate, _supcon_fuzz)


# --- Balanced MSE (rankwise.losses.balanced_mse) --------------------------------------------------
def _bmse_kwargs(method: str, d: int, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    if method == "gai":
        a = torch.randn(3, d, d, generator=g, dtype=torch.float64)
        cov = a @ a.mT / d + 0.2 * torch.eye(d, dtype=torch.float64)
        means = torch.randn(3, d, generator=g, dtype=torch.float64)
        weights = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
        return {"method": "gai", "gmm": tuple(v.to(device=device, dtype=dtype) for v in (means, cov, weights))}
    if method == "bni":
        centers = torch.linspace(-2, 2, 9, dtype=torch.float64)
        weights = torch.softmax(-(centers**2), 0)
        return {
            "method": "bni",
            "bucket_centers": centers.to(device=device, dtype=dtype),
            "bucket_weights": weights.to(device=device, dtype=dtype),
        }
    return {"method": "bmc"}


def _bmse_loss(name: str, method: str, d: int) -> None:
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        g = torch.Generator().manual_seed(0)
        pred = torch.randn(6, d, generator=g, dtype=torch.float64).to(device=device, dtype=dtype).requires_grad_()
        target = torch.randn(6, d, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
        # noise_var as a plain input: the detached 2 sigma^2 scale makes its gradient a surrogate
        # (tested against the reference in tests/losses/test_balanced_mse.py), pred's is exact
        noise_var = torch.tensor(0.7, dtype=dtype, device=device)
        return Example((pred, target, noise_var), _bmse_kwargs(method, d, dtype, device))

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        kw = _bmse_kwargs(method, 1, dtype, device)
        var = torch.tensor(0.7, dtype=dtype, device=device)

        def z(*s: int) -> torch.Tensor:
            return torch.zeros(s, dtype=dtype, device=device)

        return [
            Example((z(0, 1).requires_grad_(), z(0, 1), var), kw),  # empty batch
            Example((z(0).requires_grad_(), z(0), var), kw),
            Example((z(1, 1).requires_grad_(), torch.ones(1, 1, dtype=dtype, device=device), var), kw),  # B = 1
            Example((z(4, 1).requires_grad_(), z(4, 1), var), kw),  # all equal (one unique label, zero error)
            Example((_filled((3,), 50.0, dtype, device), z(3), var), kw),  # far
        ]

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        shape = (n, d) if d > 1 or fuzz_choice(g, [False, True]) else (n,)
        pred = fuzz_tensor(shape, dtype, device, g)
        target = fuzz_tensor(shape, fuzz_choice(g, [dtype, torch.float64]), device, g, grad=False)
        var: float | torch.Tensor = fuzz_choice(g, [0.5, 2.0])  # a float or a scalar tensor
        if fuzz_choice(g, [False, True]):
            var = torch.tensor(var, dtype=dtype, device=device)
        kw = {**_bmse_kwargs(method, d, dtype, device), "reduction": fuzz_choice(g, ["mean", "sum", "none"])}
        return Example((pred, target, var), kw)

    _loss(name, example, degenerate, fuzz)


for _method, _d in (("bmc", 1), ("gai", 1), ("bni", 1), ("bmc", 3), ("gai", 2)):
    _tag = _method + ("" if _d == 1 else f"_{_d}d")
    _bmse_loss(variant("loss", "balanced_mse", _tag, {"method": _method}), _method, _d)
_bmse_loss("balanced_mse", "bmc", 1)


# --- learning to rank (rankwise.losses.learning_to_rank) ------------------------------------------
def _padded_batch(dtype: torch.dtype, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """4 lists of 6 slots, graded labels 0..3 without ties in the scores, padding at the end and inside."""
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(4, 6, generator=g, dtype=torch.float64)
    true = torch.tensor(
        [
            [3.0, 0.0, 1.0, 2.0, 0.0, 1.0],
            [1.0, 2.0, 0.0, -1.0, -1.0, -1.0],
            [0.0, 2.0, -1.0, 1.0, 3.0, -1.0],
            [2.0, 1.0, 0.0, 0.0, 3.0, 1.0],
        ]
    )
    return pred.to(device=device, dtype=dtype).requires_grad_(), true.to(device=device, dtype=torch.float32)


def _ltr_loss(name: str, options: dict[str, Any], fuzz_options: dict[str, list[Any]]) -> None:
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        return Example(_padded_batch(dtype, device), dict(options))

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        def p(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=torch.Generator().manual_seed(3)).to(device, dtype).requires_grad_()

        def y(rows: list[list[float]]) -> torch.Tensor:
            return torch.tensor(rows, device=device)

        return [
            Example((p(0, 5), torch.zeros(0, 5, device=device)), options),  # empty batch
            Example((p(2, 0), torch.zeros(2, 0, device=device)), options),  # empty lists
            Example((p(2, 3), y([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])), options),  # all padding
            Example((p(2, 1), y([[1.0], [0.0]])), options),  # a single item
            Example((p(2, 4), y([[2.0, 2.0, 2.0, 2.0], [1.0, 1.0, -1.0, -1.0]])), options),  # all-equal relevance
            Example((p(2, 4), y([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, -1.0]])), options),  # no relevant item
            Example((p(2, 3), y([[-1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])), options),  # mixed
        ]

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        bsz = fuzz_int(g, 1, 4)
        pred = fuzz_tensor((bsz, n), dtype, device, g)
        labels = torch.randint(-1, 4, (bsz, n), generator=g)
        true = labels.to(device=device, dtype=fuzz_choice(g, [torch.float32, torch.float64, torch.int64]))
        return Example((pred, true), {k: fuzz_choice(g, v) for k, v in fuzz_options.items()})

    _loss(name, example, degenerate, fuzz)


_ltr_loss("listnet", {}, {"eps": [0.0, 1e-10]})
_ltr_loss("listmle", {}, {"eps": [1e-10]})
_ltr_loss("ranknet", {"weight_by_diff": True}, {"weight_by_diff": [False, True], "weight_by_diff_powed": [False, True]})
#: the weighing schemes run as variants of their own (``lambda_loss.<scheme>``)
_LAMBDA_SCHEMES = ("ndcgLoss1_scheme", "ndcgLoss2_scheme", "lambdaRank_scheme", "ndcgLoss2PP_scheme", "rankNet_scheme")
for _scheme in (None, *_LAMBDA_SCHEMES):
    _ltr_loss(
        "lambda_loss"
        if _scheme is None
        else variant("loss", "lambda_loss", _scheme.removesuffix("_scheme"), {"weighing_scheme": _scheme}),
        {"weighing_scheme": _scheme, "k": 4, "sigma": 1.5, "reduction": "mean"} if _scheme else {"reduction": "sum"},
        {
            "weighing_scheme": [_scheme],
            "k": [None, 1, 3],
            "reduction": ["sum", "mean"],
            "reduction_log": ["binary", "natural"],
        },
    )
_ltr_loss("approx_ndcg", {"alpha": 2.0}, {"alpha": [0.5, 1.0, 10.0]})
_ltr_loss(
    "neural_ndcg",
    {"temperature": 0.5, "k": 4},
    {"temperature": [0.1, 1.0], "k": [None, 2], "powered_relevancies": [True, False]},
)
_ltr_loss(
    variant("loss", "neural_ndcg", "stochastic", {"stochastic": True}, stochastic=True),
    {"stochastic": True, "n_samples": 3, "temperature": 0.5},
    {"stochastic": [True], "n_samples": [1, 4], "beta": [0.1, 1.0], "log_scores": [True, False]},
)
for _method, _opts in (
    ("neuralsort", {"tau": 0.5}),
    ("softsort", {"tau": 0.5}),
    ("diffsort", {"steepness": 5.0}),
    ("isotonic", {"regularization_strength": 0.5}),
):
    _ltr_loss(
        "pirank" if _method == "neuralsort" else variant("loss", "pirank", _method, {"method": _method}),
        {"method": _method, "k": 4, **_opts},
        {"method": [_method], "k": [None, 2], **{key: [v] for key, v in _opts.items()}},
    )


# --- Rank-N-Contrast and ConR (rankwise.losses._regression_contrastive) ---------------------------
def _rnc_example(dtype: torch.dtype, device: torch.device) -> Example:
    labels = torch.tensor([3.0, 1.0, 3.0, 0.5, 2.0], device=device, dtype=dtype)
    return Example((random_features(dtype, device, 5, 2, 4), labels), {"temperature": 2.0})


def _rnc_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    f = functools.partial(random_features, dtype, device)

    def lab(*vals: float) -> torch.Tensor:
        return torch.tensor(vals, device=device, dtype=dtype)

    return [
        Example((f(0, 2, 4), lab())),
        Example((f(1, 4), lab(1.0))),  # a single view
        Example((f(1, 2, 4), lab(1.0))),  # n = 1 sample
        Example((f(4, 2, 4), lab(2.0, 2.0, 2.0, 2.0))),  # all labels tied
        Example((_filled((3, 2, 4), 1.0, dtype, device), lab(0.0, 1.0, 2.0))),
    ]


def _conr_example(dtype: torch.dtype, device: torch.device) -> Example:
    y = torch.tensor([1.0, 1.5, 4.0, 4.2, 9.0, 2.0], device=device, dtype=dtype)
    yp = torch.tensor([1.2, 3.5, 3.9, 4.0, 8.0, 2.5], device=device, dtype=dtype)
    return Example((random_features(dtype, device, 6, 2, 4), y, yp), {"window": 1.0, "temperature": 0.5, "eta": 0.1})


def _conr_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    f = functools.partial(random_features, dtype, device)

    def t(*vals: float) -> torch.Tensor:
        return torch.tensor(vals, device=device, dtype=dtype)

    return [
        Example((f(0, 2, 4), t(), t())),
        Example((f(1, 4), t(1.0), t(1.0))),  # a single view
        Example((f(3, 2, 4), t(1.0, 1.0, 1.0), t(0.0, 5.0, 9.0))),  # no negatives
        Example((f(3, 4), t(0.0, 5.0, 10.0), t(1.0, 1.0, 1.0))),  # no positives
        Example((_filled((4, 2, 3), 1.0, dtype, device), t(0, 0, 3, 3), t(1, 1, 1, 1))),
    ]


def _rnc_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
    x = fuzz_tensor((n, fuzz_int(g, 1, 2), fuzz_int(g, 1, 4)), dtype, device, g)
    y = fuzz_labels(n, device, g).to(fuzz_choice(g, [dtype, torch.float64, torch.int64]))
    return Example((x, y), {"temperature": fuzz_choice(g, [0.1, 2.0])})


def _conr_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
    x = fuzz_tensor((n, fuzz_int(g, 1, 2), fuzz_int(g, 1, 4)), dtype, device, g)
    y = fuzz_labels(n, device, g).to(fuzz_choice(g, [dtype, torch.float64]))
    yp = y.to(torch.float64) + fuzz_tensor((n,), torch.float64, device, g, grad=False)
    kw: dict[str, Any] = {
        "window": fuzz_choice(g, [0.0, 1.0]),
        "temperature": fuzz_choice(g, [0.2, 1.0]),
        "eta": fuzz_choice(g, [0.0, 0.1]),
        "variant": fuzz_choice(g, ["in", "out"]),
    }
    if fuzz_choice(g, [False, True]):
        kw["weights"] = fuzz_tensor((n,), dtype, device, g, grad=False, positive=True)
    return Example((x, y, yp.to(dtype)), kw)


_loss("rnc", _rnc_example, _rnc_degenerate, _rnc_fuzz)
_loss("conr", _conr_example, _conr_degenerate, _conr_fuzz)


# --- rank-based losses (rankwise.losses.ranking) --------------------------------------------------
def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ranksim_example(dtype: torch.dtype, device: torch.device) -> Example:
    z = torch.randn(10, 6, generator=_gen()).to(device=device, dtype=dtype).requires_grad_()
    y = torch.tensor([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0], device=device)
    return Example((z, y), {"interpolation_lambda": 2.0})


def _ranksim_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    def z(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=_gen()).to(device=device, dtype=dtype).requires_grad_()

    return [
        Example((z(0, 4), torch.zeros(0, device=device))),  # empty batch
        Example((z(1, 4), torch.ones(1, 1, device=device))),  # B = 1, (B, 1) targets
        Example((z(5, 4), torch.full((5,), 7.0, device=device))),  # one distinct label
        Example((z(4, 4), torch.arange(4.0, device=device)), {"unique_labels": False}),
        Example((torch.zeros(3, 4, dtype=dtype, device=device).requires_grad_(), torch.arange(3.0, device=device))),
    ]


def _ranksim_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
    z = fuzz_tensor((n, *fuzz_choice(g, [(4,), (2, 3)])), dtype, device, g)
    y = fuzz_labels(n, device, g).to(fuzz_choice(g, [torch.float32, torch.float64, torch.int64]))
    if fuzz_choice(g, [False, True]):
        y = y[:, None]
    kw = {"interpolation_lambda": fuzz_choice(g, [0.5, 2.0]), "unique_labels": fuzz_choice(g, [False, True])}
    return Example((z, y), kw)


def _pt(dtype: torch.dtype, device: torch.device, n: int = 8, lead: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
    g = _gen(1)
    pred = torch.randn(*lead, n, generator=g).to(device=device, dtype=dtype).requires_grad_()
    target = torch.randn(*lead, n, generator=g).to(device=device, dtype=dtype)
    return pred, target


def _pt_degenerate(kwargs: dict[str, Any]) -> DegenerateFactory:
    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        def p(*shape: int, fill: float | None = None) -> torch.Tensor:
            x = torch.full(shape, fill) if fill is not None else torch.randn(*shape, generator=_gen(2))
            return x.to(device=device, dtype=dtype).requires_grad_()

        return [
            Example((p(0), torch.zeros(0, device=device, dtype=dtype)), kwargs),  # empty
            Example((p(1), torch.ones(1, device=device, dtype=dtype)), kwargs),  # n = 1
            Example((p(1, 1), torch.ones(1, 1, device=device, dtype=dtype)), kwargs),  # (B, 1) with B = 1
            Example((p(5, fill=2.0), torch.full((5,), 3.0, device=device, dtype=dtype)), kwargs),  # all ties
        ]

    return degenerate


def _pt_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    lead = fuzz_lead(g, max_dims=1)
    shape = (*lead, n) if lead or fuzz_choice(g, [False, True]) else (n, 1)
    pred = fuzz_tensor(shape, dtype, device, g)
    tdt = fuzz_choice(g, [dtype, torch.float64, torch.float32, torch.int64])
    if tdt == torch.int64:
        target = torch.randint(-3, 4, shape, generator=g).to(device)
    else:
        target = fuzz_tensor(shape, tdt, device, g, grad=False)
    return pred, target


#: soft-rank options of each ranker's fixed example
_SPEARMAN_EXAMPLES: dict[str, dict[str, Any]] = {
    "isotonic": {"regularization_strength": 0.1},
    "neuralsort": {"tau": 1.0},
    "softsort": {"tau": 1.0},
    "blackbox": {"lambda_val": 2.0},
}
#: randomized ranker options of the fuzz factories
_SPEARMAN_FUZZ: dict[str, dict[str, list[Any]]] = {
    "isotonic": {"regularization_strength": [1e-3, 0.1, 1.0], "regularization": ["l2", "kl"]},
    "neuralsort": {"tau": [0.05, 1.0]},
    "softsort": {"tau": [0.05, 1.0], "power": [1.0, 2.0]},
    "blackbox": {"lambda_val": [0.5, 2.0]},
}


def _spearman_fuzz(ranker: str | None, correlation: bool = False) -> FuzzFactory:
    def factory(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        kw: dict[str, Any] = {}
        if ranker is not None:
            kw["ranker"] = ranker
            kw.update({k: fuzz_choice(g, v) for k, v in _SPEARMAN_FUZZ[ranker].items()})
            if not correlation:
                kw["l1_weight"] = fuzz_choice(g, [0.0, 0.5])
        return Example(_pt_fuzz(n, dtype, device, g), kw)

    return factory


def _pairs_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
    return Example(_pt_fuzz(n, dtype, device, g), {"pairs": fuzz_choice(g, [1, 7, 16])})


def _spearman_example(kwargs: dict[str, Any]) -> ExampleFactory:
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        return Example(_pt(dtype, device), {**kwargs, "l1_weight": 0.5})

    return example


for _ranker, _opts in _SPEARMAN_EXAMPLES.items():
    _spearman_kwargs = {"ranker": _ranker, **_opts}
    _loss(
        variant(
            "loss", "spearman", _ranker, {"ranker": _ranker}, gradient="surrogate" if _ranker == "blackbox" else None
        ),
        _spearman_example(_spearman_kwargs),
        _pt_degenerate(_spearman_kwargs),
        _spearman_fuzz(_ranker),
    )
_loss("ranksim", _ranksim_example, _ranksim_degenerate, _ranksim_fuzz)
_loss(
    "spearman",
    lambda dt, dev: Example(_pt(dt, dev), {**_SPEARMAN_EXAMPLES["isotonic"], "l1_weight": 0.5}),
    _pt_degenerate({}),
    _spearman_fuzz("isotonic"),
)
_loss(
    "spearman_correlation",
    lambda dt, dev: Example(_pt(dt, dev, lead=(2,)), {"ranker": "isotonic", "regularization_strength": 0.1}),
    _pt_degenerate({"ranker": "isotonic", "regularization_strength": 0.1}),
    _spearman_fuzz("isotonic", correlation=True),
)
_loss("pairwise_difference", lambda dt, dev: Example(_pt(dt, dev)), _pt_degenerate({}), _spearman_fuzz(None))
_loss(
    variant("loss", "pairwise_difference", "random", {"pairs": 16}, stochastic=True),
    lambda dt, dev: Example(_pt(dt, dev), {"pairs": 16}),
    _pt_degenerate({"pairs": "random"}),
    _pairs_fuzz,
)


# --- retrieval losses (rankwise.losses.retrieval) -------------------------------------------------
def _retrieval_loss(name: str, kwargs: dict[str, Any], options: Callable[[torch.Generator], dict[str, Any]]) -> None:
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        labels = torch.tensor([0, 1, 0, 2, 1, 2, 0, 3], device=device)
        return Example((random_features(dtype, device, 8, 5), labels), dict(kwargs))

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        def f(*shape: int) -> torch.Tensor:
            return random_features(dtype, device, *shape, seed=1)

        long = torch.long
        return [
            Example((f(0, 4), torch.zeros(0, dtype=long, device=device))),  # empty batch
            Example((f(1, 4), torch.zeros(1, dtype=long, device=device))),  # a single item
            Example((f(4, 3), torch.arange(4, device=device))),  # no positives
            Example((f(4, 3), torch.zeros(4, dtype=long, device=device))),  # all the same label
            Example((_filled((4, 3), 1.0, dtype, device), torch.tensor([0, 0, 1, 1]))),  # ties
        ]

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        emb = fuzz_tensor((n, fuzz_int(g, 1, 6)), dtype, device, g)
        labels = fuzz_labels(n, device, g).to(fuzz_choice(g, [torch.int64, torch.float32]))
        return Example((emb, labels), options(g))

    _loss(name, example, degenerate, fuzz)


_retrieval_loss(
    "smooth_ap",
    {"temperature": 0.5},
    lambda g: {"temperature": fuzz_choice(g, [0.05, 0.5]), "include_query": fuzz_choice(g, [False, True])},
)
_retrieval_loss(
    "recall_at_k",
    {"k": (1, 2, 4), "temperature": 0.5},
    lambda g: {
        "k": fuzz_choice(g, [(1, 2, 4), 1, (2, 16)]),
        "temperature": fuzz_choice(g, [0.05, 0.5]),
        "include_query": fuzz_choice(g, [False, True]),
    },
)
_retrieval_loss(
    "blackbox_ap",
    {"interpolation_lambda": 4.0, "margin": 0.02},
    lambda g: {
        "interpolation_lambda": fuzz_choice(g, [0.5, 4.0]),
        "margin": fuzz_choice(g, [0.0, 0.1]),
        "include_query": fuzz_choice(g, [False, True]),
    },
)
_retrieval_loss("fastap", {"num_bins": 10}, lambda g: {"num_bins": fuzz_choice(g, [1, 4, 10])})


# --- DIR regression losses (rankwise.losses._regression) ------------------------------------------
_REGRESSION_KWARGS: dict[str, dict[str, object]] = {
    "l1": {"kind": "l1"},
    "mse": {"kind": "mse"},
    "focal_l1": {"kind": "focal_l1", "beta": 0.5, "gamma": 2.0, "activate": "sigmoid"},
    "focal_mse": {"kind": "focal_mse", "beta": 0.5, "gamma": 1.0, "activate": "tanh"},
    "huber": {"kind": "huber", "huber_beta": 0.7},
}


def _regression_loss(kind: str) -> None:
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        g = torch.Generator().manual_seed(0)
        pred = torch.randn(6, 1, generator=g).to(device=device, dtype=dtype).requires_grad_()
        target = torch.randn(6, 1, generator=g).to(device=device, dtype=dtype).requires_grad_()
        weights = (torch.rand(6, generator=g) + 0.5).to(device=device, dtype=dtype)
        return Example((pred, target, weights), dict(_REGRESSION_KWARGS[kind]))

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        kw = dict(_REGRESSION_KWARGS[kind])

        def z(*s: int) -> torch.Tensor:
            return torch.zeros(s, dtype=dtype, device=device)

        out = [
            Example((z(0).requires_grad_(), z(0)), kw),  # empty batch
            Example((z(0, 1).requires_grad_(), z(0, 1), z(0)), kw),  # empty with weights
            Example((z(1, 1).requires_grad_(), torch.ones(1, 1, dtype=dtype, device=device)), kw),  # n = 1
            Example((z(4).requires_grad_(), z(4)), kw),  # zero error everywhere (|e| kink)
            Example((_filled((3, 1), 1.0, dtype, device), z(3, 1), z(3)), kw),  # zero weights
        ]
        if kind.startswith("focal"):
            out.append(Example((z(4).requires_grad_(), z(4)), {**kw, "gamma": 0.5}))  # 0 ** 0.5 at e = 0
        return out

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        shape = fuzz_choice(g, [(n,), (n, 1)])
        pred = fuzz_tensor(shape, dtype, device, g)
        target = fuzz_tensor(shape, fuzz_choice(g, [dtype, torch.float64]), device, g, grad=False)
        kw: dict[str, object] = {**_REGRESSION_KWARGS[kind], "reduction": fuzz_choice(g, ["mean", "sum", "none"])}
        args: tuple[torch.Tensor, ...] = (pred, target)
        if fuzz_choice(g, [False, True]):
            args = (pred, target, fuzz_tensor((n,), dtype, device, g, grad=False, positive=True))
        return Example(args, kw)

    _loss(f"regression_{kind}", example, degenerate, fuzz)


for _kind in _REGRESSION_KWARGS:
    _regression_loss(_kind)


# --- Ordinal Entropy and Dist Loss (rankwise.losses.ordinal_regression) ---------------------------
def _oe_example(dtype: torch.dtype, device: torch.device) -> Example:
    z = torch.randn(10, 6, generator=_gen()).to(device=device, dtype=dtype).requires_grad_()
    y = torch.tensor([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0], device=device)
    return Example((z, y), {"tightness": True, "centers": True})


def _oe_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    def z(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=_gen()).to(device=device, dtype=dtype).requires_grad_()

    return [
        Example((z(0, 4), torch.zeros(0, device=device))),  # empty batch
        Example((z(1, 4), torch.ones(1, 1, device=device))),  # n = 1, (B, 1) targets
        Example((z(5, 4), torch.full((5,), 7.0, device=device))),  # all targets equal
        Example((z(5, 4), torch.full((5,), 7.0, device=device)), {"centers": False}),
        Example((z(4, 4), torch.arange(4.0, device=device))),  # all distinct: no tightness
        Example((z(6, 3), torch.arange(6.0, device=device)), {"tightness": False, "indices": [0, 2, 3]}),
        Example((z(6, 3), torch.arange(6.0, device=device)), {"num_samples": 1}),
        Example((torch.zeros(3, 4, dtype=dtype, device=device).requires_grad_(), torch.arange(3.0, device=device))),
    ]


def _oe_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
    z = fuzz_tensor((n, *fuzz_choice(g, [(4,), (2, 3)])), dtype, device, g)
    y = fuzz_labels(n, device, g).to(fuzz_choice(g, [torch.float32, torch.float64, torch.int64]))
    if fuzz_choice(g, [False, True]):
        y = y[:, None]
    kw = {"tightness": fuzz_choice(g, [False, True]), "centers": fuzz_choice(g, [False, True])}
    return Example((z, y), kw)


#: training labels of the Dist Loss examples: skewed ages 20..60
_DIST_LABELS = [float(v) for v in "20 21 22 22 23 25 25 25 26 28 30 31 33 35 40 44 52 60".split()]


def _dist_kwargs(device: torch.device, **more: Any) -> dict[str, Any]:
    labels = torch.tensor(_DIST_LABELS, dtype=torch.float64, device=device)
    return {"train_labels": labels, "label_range": (20.0, 60.0), "regularization_strength": 1.0, **more}


def _dist_example(dtype: torch.dtype, device: torch.device) -> Example:
    g = _gen(3)
    pred = (torch.randn(8, generator=g) * 10 + 35).to(device=device, dtype=dtype).requires_grad_()
    target = (torch.randn(8, generator=g) * 10 + 35).round().to(device=device, dtype=dtype)
    return Example((pred, target), _dist_kwargs(device, kind="mse", loss_weight=0.5))


def _dist_degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
    def p(*shape: int, fill: float | None = None) -> torch.Tensor:
        x = torch.full(shape, fill) if fill is not None else torch.randn(*shape, generator=_gen(2)) * 10 + 30
        return x.to(device=device, dtype=dtype).requires_grad_()

    def t(*shape: int) -> torch.Tensor:
        return torch.full(shape, 30.0, dtype=dtype, device=device)

    one = torch.tensor([35.0], dtype=torch.float64, device=device)
    return [
        Example((p(0), t(0)), _dist_kwargs(device)),  # empty batch
        Example((p(1), t(1)), _dist_kwargs(device)),  # n = 1
        Example((p(1, 1), t(1, 1)), _dist_kwargs(device, kind="huber")),  # (B, 1) with B = 1
        Example((p(5, fill=30.0), t(5)), _dist_kwargs(device)),  # all predictions and targets equal
        Example((p(4), t(4)), _dist_kwargs(device, train_labels=one)),  # training labels of zero spread
        Example((p(4), t(4)), _dist_kwargs(device, train_labels=one * 100)),  # no training label in range
        Example((p(3), t(3)), _dist_kwargs(device, reduction="none")),
    ]


def _dist_fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
    shape = fuzz_choice(g, [(n,), (n, 1)])
    pred = fuzz_tensor(shape, dtype, device, g)
    target = fuzz_tensor(shape, fuzz_choice(g, [dtype, torch.float64]), device, g, grad=False)
    labels = fuzz_tensor((fuzz_int(g, 1, 12),), torch.float64, device, g, grad=False)
    kw: dict[str, Any] = {
        "train_labels": labels,
        "label_range": (-2.0, 2.0),
        "step": fuzz_choice(g, [0.25, 1.0]),
        "kind": fuzz_choice(g, ["l1", "mse", "huber", "focal_l1"]),
        "loss_weight": fuzz_choice(g, [0.0, 1.0]),
        "regularization_strength": fuzz_choice(g, [0.1, 1.0]),
        "reduction": fuzz_choice(g, ["mean", "sum", "none"]),
    }
    return Example((pred, target), kw)


_loss("ordinal_entropy", _oe_example, _oe_degenerate, _oe_fuzz)
_loss("dist_loss", _dist_example, _dist_degenerate, _dist_fuzz)


# --- threshold ordinal losses: CORAL, CORN, CONDOR (rankwise.losses.ordinal) -------------------------
def _ordinal_labels(n: int, k: int, device: torch.device, g: torch.Generator) -> torch.Tensor:
    return torch.randint(k, (n,), generator=g).to(device)


def _levels(labels: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    return (labels.unsqueeze(1) > torch.arange(k - 1, device=labels.device)).to(dtype)


def _threshold_loss(name: str, *, targets: str, reduction: bool, weights: bool = False) -> None:
    """``targets``: ``"levels"`` (CORAL, CONDOR: extended binary levels) or ``"classes"`` (CORN: integer
    labels, with ``num_classes`` as an option)."""

    def call(logits: torch.Tensor, labels: torch.Tensor, k: int, kw: dict[str, Any], dtype: torch.dtype) -> Example:
        if targets == "classes":
            return Example((logits, labels), {"num_classes": k, **kw})
        level_dtype = dtype if dtype.is_floating_point else torch.float32
        return Example((logits, _levels(labels, k, level_dtype)), kw)

    def example(dtype: torch.dtype, device: torch.device) -> Example:
        g = _gen(3)
        k = 5
        logits = torch.randn(7, k - 1, generator=g).to(device=device, dtype=dtype).requires_grad_()
        labels = torch.tensor([0, 4, 2, 1, 3, 2, 4], device=device)
        return call(logits, labels, k, {"reduction": "mean"} if reduction else {}, dtype)

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        def lg(b: int, k: int) -> torch.Tensor:
            return torch.randn(b, k - 1, generator=_gen(4)).to(device=device, dtype=dtype).requires_grad_()

        long = torch.long
        cases = [
            (lg(0, 4), torch.zeros(0, dtype=long, device=device), 4),  # empty batch
            (lg(1, 4), torch.tensor([2], device=device), 4),  # one example
            (lg(5, 4), torch.zeros(5, dtype=long, device=device), 4),  # all in class 0: CORN's tasks 1.. empty
            (lg(5, 4), torch.full((5,), 3, dtype=long, device=device), 4),  # all in class K-1
            (lg(3, 2), torch.tensor([0, 1, 1], device=device), 2),  # K = 2: one threshold
            # z = 0 exactly (the kinks of the stable cross-entropy forms)
            (torch.zeros(3, 3, dtype=dtype, device=device).requires_grad_(), torch.tensor([0, 1, 3], device=device), 4),
        ]
        out = [call(x, y, k, {}, dtype) for x, y, k in cases]
        if reduction:
            out += [call(x, y, k, {"reduction": r}, dtype) for x, y, k in cases[:2] for r in ("sum", "none")]
        return out

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        k = fuzz_choice(g, [2, 3, 5, 8])
        logits = fuzz_tensor((n, k - 1), dtype, device, g, scale=fuzz_choice(g, [1.0, 4.0]))
        labels = _ordinal_labels(n, k, device, g)
        kw: dict[str, Any] = {}
        if reduction:
            kw["reduction"] = fuzz_choice(g, ["mean", "sum", "none", None])
        if weights and fuzz_choice(g, [False, True]):
            kw["importance_weights"] = fuzz_tensor((k - 1,), dtype, device, g, grad=False, positive=True)
        return call(logits, labels, k, kw, dtype)

    _loss(name, example, degenerate, fuzz)


# --- ordinal losses over class logits (rankwise.losses.label_distribution) ------------------------
def _ordinal_unimodal_params(g: torch.Generator, k: int) -> dict[str, Any]:
    """A distribution of ``unimodal_ce`` and its options, drawn from ``g`` (K in 3..14 for beta)."""
    dist = fuzz_choice(
        g, ["beta", "binomial", "poisson", "exponential", "triangular", "general_triangular", "geometric"]
    )
    kw: dict[str, Any] = {"distribution": dist}
    if dist == "exponential":
        kw.update(p=fuzz_choice(g, [1.0, 1.5, 2.0]), tau=fuzz_choice(g, [0.5, 1.0, 2.0]))
    elif dist == "triangular":
        kw["alpha2"] = fuzz_choice(g, [0.01, 0.05, 0.2])
    elif dist == "general_triangular":
        kw["alphas"] = [0.0] + [float(v) for v in (torch.rand(2 * k - 1, generator=g, dtype=torch.float64) * 0.3)]
    elif dist == "geometric":
        kw["alphas"] = fuzz_choice(g, [0.0, 0.1, 0.4])
    return kw


_ORDINAL_KWARGS: dict[str, dict[str, Any]] = {
    "cdw_ce": {"alpha": 1.0, "margin": 0.2},
    "unimodal_ce": {"distribution": "geometric", "eta": 0.7, "alphas": 0.2},
    "sord": {"alpha": 1.5},
    "emd": {},
    "qwk": {"penalization": "quadratic"},
    "slace": {"alpha": 1.0},
    "mean_variance": {"lambda_mean": 0.2, "lambda_variance": 0.05},
    "dldl": {"sigma": 2.0, "lambda_l1": 1.0},
}


def _ordinal_logits_loss(name: str) -> None:
    reduces = name != "qwk"

    def example(dtype: torch.dtype, device: torch.device) -> Example:
        logits = _randn((6, 5), dtype, device, seed=3)
        targets = torch.tensor([0, 4, 2, 2, 1, 3], device=device)
        return Example((logits, targets), dict(_ORDINAL_KWARGS[name]))

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        kw = dict(_ORDINAL_KWARGS[name])

        def cls(*v: int) -> torch.Tensor:
            return torch.tensor(v, dtype=torch.long, device=device)

        out = [
            Example((_randn((0, 5), dtype, device), cls()), kw),  # empty batch
            Example((_randn((1, 5), dtype, device), cls(4)), kw),  # n = 1
            Example((_randn((5, 5), dtype, device, seed=1), cls(2, 2, 2, 2, 2)), kw),  # one class only
            Example(
                ((_randn((3, 5), dtype, device, seed=2).detach() * 40).requires_grad_(), cls(0, 4, 1)), kw
            ),  # confident
            Example((_filled((4, 5), 0.0, dtype, device), cls(0, 1, 3, 4)), kw),  # uniform softmax
        ]
        if name != "unimodal_ce":  # the standard beta set starts at K = 3: K = 2 with the other losses
            out.append(Example((_randn((3, 2), dtype, device), cls(0, 1, 1)), kw))
        if reduces:
            out.append(Example((_randn((0, 5), dtype, device), cls()), {**kw, "reduction": "none"}))
        if name == "sord":
            train = cls(0, 1, 1, 2, 3, 3, 3, 4)
            for ftype in ("max", "norm_log", "division"):
                ex = Example((_randn((4, 5), dtype, device), cls(0, 2, 4, 4)), {**kw, "prox": True, "ftype": ftype})
                ex.kwargs["train_targets"] = train
                out.append(ex)
        return out

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        k = fuzz_choice(g, [3, 4, 7, 10])
        lead = fuzz_choice(g, [(), (), (2,)])
        logits = fuzz_tensor((*lead, n, k), dtype, device, g, scale=fuzz_choice(g, [1.0, 3.0]))
        targets = torch.randint(k, (*lead, n), generator=g).to(device)
        kw: dict[str, Any] = dict(_ORDINAL_KWARGS[name])
        if name == "unimodal_ce":
            kw = {**_ordinal_unimodal_params(g, k), "eta": fuzz_choice(g, [0.0, 0.5, 1.0])}
        elif name == "sord" and fuzz_choice(g, [False, True]):
            kw.update(
                prox=True, ftype=fuzz_choice(g, ["max", "norm_max", "log", "norm_log", "division", "norm_division"])
            )
            kw["train_targets"] = torch.cat([torch.arange(k), torch.randint(k, (9,), generator=g)]).to(device)
        elif name == "qwk":
            kw["penalization"] = fuzz_choice(g, ["linear", "quadratic"])
        if name in ("cdw_ce", "sord", "slace", "qwk") and fuzz_choice(g, [False, True]):
            kw["weight"] = fuzz_tensor((k,), dtype, device, g, grad=False, positive=True)
        if reduces:
            kw["reduction"] = fuzz_choice(g, ["mean", "sum", "none"])
        return Example((logits, targets), kw)

    _loss(name, example, degenerate, fuzz)


_threshold_loss("coral", targets="levels", reduction=True, weights=True)
_threshold_loss("corn", targets="classes", reduction=False)
_threshold_loss("condor", targets="levels", reduction=True)
for _name in _ORDINAL_KWARGS:
    _ordinal_logits_loss(_name)


# --------------------------------------------------------------------------------------------------
# the top-k classification loss
# --------------------------------------------------------------------------------------------------
def _topk_ce_factories(method: str) -> tuple[ExampleFactory, DegenerateFactory, FuzzFactory]:
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        targets = torch.tensor([0, 3, 5, 2], device=device)
        kw = {"p_k": [0.5, 0.25, 0.25], "inverse_temperature": 2.0, "method": method}
        return Example((_randn((4, 6), dtype, device), targets), kw)

    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        kw = {"p_k": [0.5, 0.5], "method": method}
        lab = torch.tensor([1, 0, 2], device=device)
        return [
            Example((_randn((1, 4), dtype, device), lab[:1]), kw),  # one example
            Example((_randn((0, 4), dtype, device), lab[:0]), kw),  # empty batch
            Example((_randn((3, 1), dtype, device), lab * 0), {"p_k": [1.0], "method": method}),  # one class
            Example((_filled((3, 4), 0.5, dtype, device), lab), {**kw, "top1_mode": "sort"}),  # all ties
        ]

    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example | None:
        if n == 0:
            return None
        k = fuzz_int(g, 1, min(n, 3))
        w = torch.rand(k, generator=g, dtype=torch.float64) + 0.1
        p_k = [float(v) for v in (w / w.sum()).tolist()]
        p_k[-1] = 1.0 - sum(p_k[:-1])
        kw: dict[str, Any] = {
            "p_k": p_k,
            "method": method,
            "inverse_temperature": fuzz_choice(g, [0.5, 2.0, 8.0]),
            "top1_mode": fuzz_choice(g, ["sm", "smce", "sort"]),
            "m": fuzz_choice(g, [None, fuzz_int(g, k, n)]),
            "reduction": fuzz_choice(g, ["mean", "sum", "none"]),
        }
        if method in ("odd_even", "bitonic", "splitter_selection"):
            kw["distribution"] = fuzz_choice(g, ["cauchy", "logistic", "logistic_phi", "optimal", "gaussian"])
        lead = fuzz_lead(g, max_dims=1, max_size=3)
        logits = fuzz_tensor((*lead, n), dtype, device, g, scale=fuzz_choice(g, [1.0, 10.0]))
        targets = torch.randint(n, lead, generator=g).to(device)
        return Example((logits, targets), kw)

    return example, degenerate, fuzz


_loss("topk_cross_entropy", *_topk_ce_factories("odd_even"))
for _method in ("bitonic", "splitter_selection", "neuralsort", "softsort"):
    _loss(variant("loss", "topk_cross_entropy", _method, {"method": _method}), *_topk_ce_factories(_method))
