"""Argument checks and numerical conventions shared by all operators and losses.

Every check raises ``TypeError`` or ``ValueError`` whose message names the argument, what was
expected and what was given, e.g. ``"`tau` must be > 0, got -1.0"``. The rules these helpers
implement (dtype promotion, half-precision outputs, NaN/inf policy, device mismatches) are written
down in ``docs/conventions.md``; new operators and losses use them instead of their own copies.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import threading
from collections.abc import Callable, Iterable
from numbers import Integral, Real
from typing import Any, ParamSpec, TypeVar

import torch

from rankwise._suggest import CLOSE_COUNT, CLOSE_CUTOFF, did_you_mean, suggestion  # noqa: F401  re-exported

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "batch_loss",
    "check_bool",
    "check_choice",
    "check_class_logits",
    "check_dim",
    "check_floating",
    "check_floating_nd",
    "check_generator",
    "check_grades",
    "check_int",
    "check_k",
    "check_ndim",
    "check_positive",
    "check_positive_int",
    "check_real",
    "check_same_device",
    "check_tensor",
    "common_compute_dtype",
    "compute_dtype",
    "did_you_mean",
    "nan_if_nonfinite",
    "nan_slices",
    "rank_dtype",
    "sort_padding_last",
    "suggestion",
    "to_compute",
]


def check_tensor(x: Any, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_floating(x: Any, name: str) -> torch.Tensor:
    """``x`` must be a floating-point tensor (gradients need one)."""
    check_tensor(x, name)
    if not (x.is_floating_point()):
        raise TypeError(
            f"`{name}` must be a floating-point tensor, got dtype {x.dtype}; convert it with `{name}.float()`"
        )
    return x


def check_real(x: Any, name: str) -> torch.Tensor:
    """``x`` must be a real (integer, bool or floating) tensor, not complex (labels, targets, weights)."""
    check_tensor(x, name)
    if x.is_complex():
        raise TypeError(f"`{name}` must be a real tensor, got dtype {x.dtype}")
    return x


def check_grades(y_true: torch.Tensor, padding: float, name: str = "y_true") -> None:
    """Every label of the padded lists ``y_true`` is a grade ``>= 0`` or the padding label ``padding``: a
    ``ValueError`` naming ``name`` on CPU in eager mode (one host read), a device-side assertion
    (``torch._assert_async``, no host sync) on other devices and under ``torch.compile``."""
    if y_true.numel() == 0:
        return
    bad = (y_true < 0) & (y_true != padding)
    if y_true.device.type != "cpu" or torch.compiler.is_compiling():
        torch._assert_async(~bad.any(), f"`{name}` must hold grades >= 0 or the padding label {padding:g}")
        return
    if bool(bad.any()):
        i = int(bad.reshape(-1).nonzero()[0, 0])
        raise ValueError(
            f"`{name}` must hold relevance grades >= 0 or the padding label {padding:g}, "
            f"got {y_true.reshape(-1)[i].item()!r} (flat index {i})"
        )


def sort_padding_last(key: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``key`` sorted descending along the last dim with every padded slot (``~valid``) after every real
    one, whatever the real keys (``-inf`` included): ``(sorted keys, indices)``.

    Among the real slots the order is that of ``torch.sort(descending=True)`` of the key with the
    padding masked to ``-inf``; a stable partition (a cumulative sum, no second sort) then moves the
    padded slots, which tie with a real ``-inf``, behind the real ones. The padded slots' sorted keys
    are ``-inf``; the sort is differentiable in the real keys."""
    vals, idx = key.masked_fill(~valid, float("-inf")).sort(descending=True, dim=-1)
    vs = valid.gather(-1, idx)
    real = vs.to(torch.int64)
    count = real.sum(dim=-1, keepdim=True)
    pos = torch.where(vs, real.cumsum(dim=-1) - 1, count + (1 - real).cumsum(dim=-1) - 1)
    order = torch.empty_like(pos).scatter_(-1, pos, torch.arange(pos.shape[-1], device=pos.device).expand_as(pos))
    return vals.gather(-1, order), idx.gather(-1, order)


def check_bool(value: Any, name: str) -> bool:
    """``value`` must be a ``bool`` (a truthy string or int would silently change the result)."""
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_same_device(ref_name: str, ref: torch.Tensor, *others: tuple[str, torch.Tensor | None]) -> None:
    """Every tensor in ``others`` (``(name, tensor or None)``) must be on the device of ``ref``.

    Raises ``ValueError: `labels` must be on the device of `features` (cpu), got meta`` instead of
    torch's internal device error deep inside the computation. No host sync (devices are metadata).
    """
    for name, t in others:
        if isinstance(t, torch.Tensor) and t.device != ref.device:
            raise ValueError(f"`{name}` must be on the device of `{ref_name}` ({ref.device}), got {t.device}")


def check_class_logits(logits: Any, targets: Any) -> None:
    """``logits`` (*, C) floating and ``targets`` (*) integer class indices on the same device; else a
    TypeError / ValueError naming the argument."""
    check_floating(logits, "logits")
    check_real(targets, "targets")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise TypeError(f"`targets` must hold integer class indices, got dtype {targets.dtype}")
    check_same_device("logits", logits, ("targets", targets))
    if logits.dim() == 0 or tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"`targets` must have the shape of `logits` without its class dim: `logits` (*, C) and `targets` (*); "
            f"got `logits` {tuple(logits.shape)} and `targets` {tuple(targets.shape)}"
        )


def check_floating_nd(x: Any, name: str) -> torch.Tensor:
    """``x`` must be a floating-point tensor with at least one dimension (the input of a ranking op)."""
    check_floating(x, name)
    if x.dim() == 0:
        raise ValueError(f"`{name}` must have at least 1 dimension, got a 0-d tensor")
    return x


def check_ndim(
    x: torch.Tensor,
    name: str,
    *,
    min_ndim: int = 1,
    max_ndim: int | None = None,
    ndim: int | Iterable[int] | None = None,
) -> None:
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"`{name}` must have {want} dimensions, got shape {tuple(x.shape)} ({x.dim()} dims)")
        return
    if x.dim() < min_ndim:
        raise ValueError(f"`{name}` must have at least {min_ndim} dimension(s), got shape {tuple(x.shape)}")
    if max_ndim is not None and x.dim() > max_ndim:
        raise ValueError(f"`{name}` must have at most {max_ndim} dimension(s), got shape {tuple(x.shape)}")


def check_dim(x: torch.Tensor, dim: Any, name: str = "dim") -> int:
    """Validate ``dim`` for ``x`` and return it as a non-negative index."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"`{name}` must be an int, got {type(dim).__name__}")
    nd = max(x.dim(), 1)
    if not -nd <= dim < nd:
        raise ValueError(f"`{name}` must be in [{-nd}, {nd - 1}] for a {x.dim()}-d input, got {dim}")
    return dim % nd


def check_positive(value: Any, name: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"`{name}` must be a real number, got {type(value).__name__}")
    v = float(value)
    if v != v or (v < 0 if allow_zero else v <= 0) or v == float("inf"):
        op = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"`{name}` must be finite and {op}, got {value!r}")
    return v


def check_positive_int(value: Any, name: str) -> int:
    """``value`` must be an integer (``int`` or a NumPy integer, not ``bool``) >= 1; returned as ``int``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}")
    return int(value)


def check_int(value: Any, name: str, *, low: int) -> int:
    """``value`` as an int ``>= low`` (``bool`` is refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"`{name}` must be >= {low}, got {value}")
    return value


def check_k(k: Any, n: int, what: str) -> int:
    """``k`` as an int in ``[1, n]`` (``what`` names ``n`` in the message, e.g. "row length")."""
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"`k` must be an int, got {type(k).__name__}")
    if n < 1:
        raise ValueError(f"`k` = {k} selects from no element ({what} 0): the input is empty along the selected dim")
    if not 1 <= k <= n:
        raise ValueError(f"`k` must be in [1, {n}] ({what} {n}), got {k}")
    return k


def check_generator(generator: Any, x: torch.Tensor) -> torch.Generator | None:
    """``generator`` (``None`` or a ``torch.Generator`` on the device of ``x``)."""
    if generator is None:
        return None
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"`generator` must be a torch.Generator or None, got {type(generator).__name__}")
    gdev = torch.device(generator.device)
    same = gdev.type == x.device.type and (gdev.index is None or x.device.index is None or gdev.index == x.device.index)
    if not same:
        raise ValueError(
            f"`generator` is on device {gdev} but the input is on {x.device}; "
            f"create it with torch.Generator(device={str(x.device)!r})"
        )
    return generator


def check_choice(value: Any, name: str, choices: Iterable[Any]) -> Any:
    options = tuple(choices)
    if value not in options:
        valid = ", ".join(repr(c) for c in options)
        raise ValueError(f"`{name}` must be one of {valid}; got {value!r}")
    return value


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half and bfloat16 are computed in float32; other floating dtypes are kept."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if not dtype.is_floating_point:
        return torch.get_default_dtype()
    return dtype


def common_compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """The compute dtype of several inputs: their floating dtypes promoted (``torch.promote_types``), with
    fp16/bf16 computed in float32; integer/bool inputs do not take part (default dtype if none is floating).

    Two tensors are never cast to the first one's dtype: a float64 target with a float32 prediction is
    computed in float64 (so target values 1e-9 apart stay distinct).
    """
    dt: torch.dtype | None = None
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            c = compute_dtype(t.dtype)
            dt = c if dt is None else torch.promote_types(dt, c)
    return dt if dt is not None else torch.get_default_dtype()


def rank_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which ranks (exact or soft, values up to n) of an input of ``dtype`` are returned.

    float16 holds integers exactly only up to 2048 and bfloat16 up to 256, so ranks of half inputs are
    float32; other floating dtypes are kept, integer inputs give the default dtype.
    """
    return compute_dtype(dtype)


def nan_slices(out: torch.Tensor, x: torch.Tensor, *, nan_only: bool = False, out_dims: int = 1) -> torch.Tensor:
    """NaN in every slice of ``out`` whose input slice ``x[..., :]`` holds a NaN (or, unless ``nan_only``,
    an inf): the NaN/inf policy of an operator whose outputs along the last ``out_dims`` dims all depend
    on the whole last dim of ``x`` (soft sort/rank: ``out_dims=1``; a permutation matrix: 2).

    ``x`` has the leading dims of ``out``; no host sync (a ``torch.where``). Gradients of the masked
    slices are zero.
    """
    if x.numel() == 0 or not x.is_floating_point():
        return out
    bad = torch.isnan(x) if nan_only else ~torch.isfinite(x)
    bad = bad.any(dim=-1)
    bad = bad.reshape((*bad.shape, *([1] * out_dims)))
    return torch.where(bad, torch.full((), math.nan, dtype=out.dtype, device=out.device), out)


class MissingTrainLabelsError(ValueError):
    """A loss module needs something fitted on the training labels (e.g. Balanced MSE's GMM) and
    got neither that nor ``train_labels``. The recipes check a config by building its losses
    without the labels and accept this error there (they pass the labels when they build the run)."""


#: up to this many elements `nan_if_nonfinite` uses sum(t * 0) (fewer calls), above it min and max (no buffer)
_POISON_BUFFER_MAX = 1 << 16


def nan_if_nonfinite(out: torch.Tensor, *inputs: torch.Tensor | None) -> torch.Tensor:
    """``out`` (a loss) where every floating input is finite, NaN everywhere otherwise (no host sync).

    The NaN/inf policy of the batch losses: each value depends on the whole batch (rankings,
    softmax denominators, sampled subsets), so one non-finite feature, label, prediction or weight
    makes the whole loss NaN instead of a finite value that silently ignores it.

    ``out`` plus ``min(t) * 0 + max(t) * 0`` over the floating inputs: the extremes are NaN if any
    element is NaN (min and max propagate NaN), ``-inf`` / ``+inf`` if any is infinite, so the term is
    0 for finite inputs and NaN otherwise (``inf * 0`` is NaN). Read-only passes, no buffer the size
    of the input, instead of ``isfinite``/``all``/``where``; inputs of at most ``2**16`` elements use
    ``sum(t * 0)`` (the same 0 or NaN: ``x * 0`` is exactly 0 for a finite ``x``), fewer calls.
    Gradients flow to ``out`` unchanged (those of non-finite inputs are unspecified).
    """
    poison: torch.Tensor | None = None
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0:
            t = t.detach()
            zero = (t * 0).sum() if t.numel() <= _POISON_BUFFER_MAX else t.amin() * 0 + t.amax() * 0
            poison = zero if poison is None else poison + zero
    if poison is None:
        return out
    if poison.dtype != out.dtype or poison.device != out.device:  # a 0-d float64 would promote a 0-d float32
        poison = poison.to(device=out.device, dtype=out.dtype)
    return out + poison


_checked = threading.local()


def finite_checked() -> None:
    """Tell the enclosing :func:`batch_loss` that the loss about to be returned already is NaN where
    an input is not finite (a kernel that reads every input checks it for free), so that its
    :func:`nan_if_nonfinite` pass is skipped for this call (this thread only; eager mode only:
    under ``torch.compile`` the wrapper always checks)."""
    _checked.flag = True


def batch_loss(*tensor_args: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator applying the device and NaN/inf conventions of a batch loss to ``fn``.

    ``tensor_args`` name ``fn``'s tensor parameters, the first being the reference (e.g.
    ``@batch_loss("features", "labels", "mask")``). Before ``fn`` runs, every other one that is a
    tensor must be on the reference's device (``ValueError`` naming both, see
    :func:`check_same_device`); the returned loss goes through :func:`nan_if_nonfinite` with all of
    them, so a NaN/inf feature, label, prediction or weight makes the whole loss NaN (every element
    for ``reduction="none"``). No host sync.
    """

    def decorator(fn: Callable[P, R]) -> Callable[P, R]:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        simple = all(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
        # where each tensor argument is found: (name, index among the positional parameters or None)
        where = [(n, positional.index(n) if n in positional else None) for n in tensor_args]

        def lookup(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]] | None:
            """The tensor arguments by name without ``Signature.bind`` (which is slow per call); None for a
            call that binding would reject (``fn`` then raises its own error)."""
            if not simple:
                try:
                    bound = sig.bind_partial(*args, **kwargs).arguments
                except TypeError:
                    return None
                return [(n, bound.get(n)) for n in tensor_args]
            if len(args) > len(positional) or any(n in kwargs for n in positional[: len(args)]):
                return None
            return [(n, args[i] if i is not None and i < len(args) else kwargs.get(n)) for n, i in where]

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            tensors = lookup(args, kwargs)
            if tensors is None:  # a bad call: let the function raise its own error
                return fn(*args, **kwargs)
            ref_name, ref = tensors[0]
            if isinstance(ref, torch.Tensor):
                check_same_device(ref_name, ref, *tensors[1:])
            eager = not torch.compiler.is_compiling()
            if eager:
                _checked.flag = False
            out = fn(*args, **kwargs)
            if eager and _checked.flag:  # see finite_checked
                _checked.flag = False
                return out
            if isinstance(out, torch.Tensor):
                return nan_if_nonfinite(out, *(t for _, t in tensors if isinstance(t, torch.Tensor)))  # type: ignore[return-value]
            return out

        return wrapper

    return decorator


def to_compute(x: torch.Tensor) -> torch.Tensor:
    """Upcast fp16/bf16 (and integer) tensors to the dtype used for computation."""
    dt = compute_dtype(x.dtype)
    return x if x.dtype == dt else x.to(dt)


def autocast_off(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """A context in which autocast is disabled on ``device`` (matmuls inside keep their input dtype:
    an op that computes in float32 stays float32 under ``torch.autocast``). Outside an autocast region
    of that device it is a no-op context (entering ``torch.autocast`` costs microseconds a call)."""
    kind = device.type
    # cpu / cuda first: ``is_autocast_available`` is a builtin dynamo does not trace (a graph break)
    known = kind in ("cpu", "cuda") or torch.amp.is_autocast_available(kind)
    if known and torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()
