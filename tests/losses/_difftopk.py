"""difftopk 0.2.0 as a test-only reference for the top-k classification loss.

Two stand-ins let the installed package run where it cannot as shipped:

* ``torch_sparse.spmm`` (a compiled package; difftopk's sparse bitonic and splitter selection
  networks call it for the product of a sparse ``(m, n)`` matrix given by ``index`` / ``value`` with
  a dense one) is replaced by the same product written with ``index_add`` (duplicates summed, as a
  COO matrix sums them), differentiable in ``value`` and in the dense matrix;
* float64: difftopk builds its networks' matrices and its NeuralSort constants in float32
  (``.float()``, ``torch.FloatTensor``); :func:`reference_loss` builds the loss under the input's
  default dtype, casts the network's matrices to it, and points ``difftopk.neuralsort``'s
  ``torch.FloatTensor`` at the input's dtype.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch


def _spmm(index: torch.Tensor, value: torch.Tensor, m: int, n: int, matrix: torch.Tensor) -> torch.Tensor:
    """``sparse(index, value, (m, n)) @ matrix``."""
    out = matrix.new_zeros((m, matrix.shape[1]))
    return out.index_add(0, index[0], value.unsqueeze(-1) * matrix[index[1]])


class _TensorType(str):
    """A ``torch.FloatTensor`` stand-in: ``t.type(it)`` and ``it(*shape)`` in the dtype it names."""

    dtype = torch.float32

    def __call__(self, *shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=self.dtype)


class _Torch(types.ModuleType):
    """``torch`` with another ``FloatTensor`` (everything else is torch's)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@contextlib.contextmanager
def _dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def load() -> Any:
    """The ``difftopk`` package, with the stand-ins in place (skips when it is not installed)."""
    difftopk = pytest.importorskip("difftopk")
    import difftopk.functional as functional
    import difftopk.neuralsort as neuralsort

    functional.torch_sparse = types.SimpleNamespace(spmm=_spmm)
    functional.SPARSE_INSTALLED = True
    if not isinstance(neuralsort.torch, _Torch):
        proxy = _Torch("torch")
        proxy.FloatTensor = _TensorType("torch.FloatTensor")
        neuralsort.torch = proxy
    return difftopk


def reference_loss(logits: torch.Tensor, targets: torch.Tensor, method: str, **options: Any) -> torch.Tensor:
    """``difftopk.TopKCrossEntropyLoss(method, n=C, **options)(logits, targets)`` in the dtype of ``logits``."""
    difftopk = load()
    import difftopk.neuralsort as neuralsort

    name = "torch.DoubleTensor" if logits.dtype == torch.float64 else "torch.FloatTensor"
    kind = _TensorType(name)
    kind.dtype = logits.dtype
    neuralsort.torch.FloatTensor = kind
    with _dtype(logits.dtype):
        loss = difftopk.TopKCrossEntropyLoss(method, n=logits.shape[-1], **options)
        net = getattr(loss, "top_k_net", None)
        if net is not None:
            net.sorting_network = [
                [t.to(logits.dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in layer]
                for layer in net.sorting_network
            ]
        return loss(logits, targets)  # type: ignore[no-any-return]
