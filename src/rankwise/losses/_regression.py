"""Registry entries of the DIR regression losses (``rankwise.imbalanced.regression_loss``, one per kind).

They are registered here, in ``rankwise.losses`` (which imports ``rankwise.imbalanced``), so that
``rankwise.imbalanced`` never imports upward into ``rankwise.losses``.
"""

from __future__ import annotations

import functools

import torch

from rankwise._registry import Example, fuzz_choice, fuzz_tensor
from rankwise.imbalanced.losses import REGRESSION_KINDS, RegressionLoss, regression_loss
from rankwise.losses._registry import register_loss

_EXAMPLE_KWARGS: dict[str, dict[str, object]] = {
    "l1": {"kind": "l1"},
    "mse": {"kind": "mse"},
    "focal_l1": {"kind": "focal_l1", "beta": 0.5, "gamma": 2.0, "activate": "sigmoid"},
    "focal_mse": {"kind": "focal_mse", "beta": 0.5, "gamma": 1.0, "activate": "tanh"},
    "huber": {"kind": "huber", "huber_beta": 0.7},
}


def _make_example(kind: str):
    def example(dtype: torch.dtype, device: torch.device) -> Example:
        g = torch.Generator().manual_seed(0)
        pred = torch.randn(6, 1, generator=g).to(device=device, dtype=dtype).requires_grad_()
        target = torch.randn(6, 1, generator=g).to(device=device, dtype=dtype).requires_grad_()
        weights = (torch.rand(6, generator=g) + 0.5).to(device=device, dtype=dtype)
        return Example((pred, target, weights), dict(_EXAMPLE_KWARGS[kind]))

    return example


def _make_degenerate(kind: str):
    def degenerate(dtype: torch.dtype, device: torch.device) -> list[Example]:
        kw = dict(_EXAMPLE_KWARGS[kind])
        z = lambda *s: torch.zeros(s, dtype=dtype, device=device)  # noqa: E731
        out = [
            Example((z(0).requires_grad_(), z(0)), kw),  # empty batch
            Example((z(0, 1).requires_grad_(), z(0, 1), z(0)), kw),  # empty with weights
            Example((z(1, 1).requires_grad_(), torch.ones(1, 1, dtype=dtype, device=device)), kw),  # n = 1
            Example((z(4).requires_grad_(), z(4)), kw),  # zero error everywhere (|e| kink)
            Example((torch.ones(3, 1, dtype=dtype, device=device).requires_grad_(), z(3, 1), z(3)), kw),  # zero w
        ]
        if kind.startswith("focal"):
            out.append(Example((z(4).requires_grad_(), z(4)), {**kw, "gamma": 0.5}))  # 0 ** 0.5 at e = 0
        return out

    return degenerate


def _make_fuzz(kind: str):
    def fuzz(n: int, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Example:
        shape = fuzz_choice(g, [(n,), (n, 1)])
        pred = fuzz_tensor(shape, dtype, device, g)
        target = fuzz_tensor(shape, fuzz_choice(g, [dtype, torch.float64]), device, g, grad=False)
        kw: dict[str, object] = {**_EXAMPLE_KWARGS[kind], "reduction": fuzz_choice(g, ["mean", "sum", "none"])}
        args: tuple[torch.Tensor, ...] = (pred, target)
        if fuzz_choice(g, [False, True]):
            args = (pred, target, fuzz_tensor((n,), dtype, device, g, grad=False, positive=True))
        return Example(args, kw)

    return fuzz


#: what a training recipe passes (the per-sample LDS weights may be None)
_INPUTS = {"pred": "predictions", "target": "targets", "weights": "weights"}

for _kind in REGRESSION_KINDS:
    register_loss(
        f"regression_{_kind}",
        module=functools.partial(RegressionLoss, kind=_kind),  # type: ignore[arg-type]  # the twin of this kind
        inputs=_INPUTS,
        example=_make_example(_kind),
        degenerate=_make_degenerate(_kind),
        description=f"DIR weighted {_kind} regression loss: regression_loss(..., kind={_kind!r})",
        fuzz=_make_fuzz(_kind),
    )(regression_loss)
