"""The one prediction path of the regression recipes: a plain torch loop, no Lightning.

Evaluation (after training and ``rankwise evaluate``) and ``rankwise predict`` run
:meth:`DIRNet.predict_batch <rankwise.recipes.regression.net.DIRNet.predict_batch>` over the
loaders on the device and at the precision that the run's single-device Lightning Trainer would
predict with, so the numbers are those of ``Trainer.predict``:

* the device (:func:`prediction_device`): ``trainer.accelerator`` resolved as Lightning resolves it
  (``auto``: MPS, else CUDA, else the CPU; ``gpu``: MPS, else CUDA), a CUDA device being the first
  of ``trainer.devices`` when that is a list, else device 0;
* the precision (:class:`Placement`), as Lightning's precision plugins treat a prediction:
  ``32-true`` plain float32; ``64-true``, ``16-true``, ``bf16-true`` the module and the floating
  inputs in float64, float16, bfloat16, with that default dtype while the step runs;
  ``16-mixed`` / ``bf16-mixed`` under ``torch.autocast`` in float16 / bfloat16 (without its
  cache), ``16-mixed`` on the CPU in bfloat16; the aliases ``32``, ``64``, ``16``, ``bf16`` are
  ``32-true``, ``64-true``, ``16-mixed``, ``bf16-mixed``.

The module takes the precision's dtype before the checkpoint is loaded into it, so a checkpoint
saved in float64 (``64-true`` training) keeps every bit. The outputs come back as float32 numpy.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rankwise.recipes.config import Config, ConfigError

__all__ = ["Placement", "concat_predictions", "placement", "predict", "prediction_device"]

#: Lightning's aliases of the precision flags
_ALIASES = {"32": "32-true", "64": "64-true", "16": "16-mixed", "bf16": "bf16-mixed"}
#: the precisions that hold the module and the inputs in one dtype
_TRUE_DTYPES = {"64-true": torch.float64, "16-true": torch.float16, "bf16-true": torch.bfloat16}
_MIXED_DTYPES = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


def _mps_available() -> bool:
    """Whether Lightning would use MPS: an Apple-silicon machine with MPS, not disabled by ``DISABLE_MPS=1``."""
    mps = getattr(torch.backends, "mps", None)
    if os.getenv("DISABLE_MPS", "0") == "1" or mps is None or not mps.is_available():
        return False
    return platform.processor() in ("arm", "arm64")


def prediction_device(cfg: Config) -> torch.device:
    """The device of the run's single-device prediction Trainer (``trainer.accelerator``, ``trainer.devices``);
    a ``ConfigError`` naming ``trainer.accelerator`` when that device is not on this machine."""
    t = cfg.trainer
    asked = str(t.accelerator)
    acc = asked
    if acc == "auto":
        acc = "mps" if _mps_available() else "cuda" if torch.cuda.is_available() else "cpu"
    elif acc == "gpu":
        acc = "mps" if _mps_available() else "cuda"
    if acc == "cpu":
        return torch.device("cpu")
    if acc == "mps":
        if not _mps_available():
            raise ConfigError(f"`trainer.accelerator` {asked!r}: MPS is not available on this machine")
        return torch.device("mps")
    if acc == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"`trainer.accelerator` {asked!r}: no CUDA device is available on this machine")
        devices = t.devices
        return torch.device("cuda", int(devices[0]) if isinstance(devices, list) and devices else 0)
    raise ConfigError(f"`trainer.accelerator` {asked!r}: evaluation and prediction run on cpu, cuda (gpu) or mps")


@dataclass(frozen=True)
class Placement:
    """Where and in which precision a prediction runs.

    ``dtype``: the dtype of the module, of the floating inputs and the default dtype during each step
    (a ``*-true`` precision other than ``32-true``); ``autocast``: the dtype of ``torch.autocast`` (a
    ``*-mixed`` precision). Both ``None``: float32.
    """

    device: torch.device
    precision: str
    dtype: torch.dtype | None = None
    autocast: torch.dtype | None = None

    def convert_module(self, module: nn.Module) -> nn.Module:
        """``module`` (in place) in the precision's dtype: its floating parameters and buffers."""
        return module if self.dtype is None else module.to(dtype=self.dtype)

    def convert_input(self, batch: Any) -> Any:
        """``batch`` with its floating tensors in the precision's dtype."""
        dtype = self.dtype
        if dtype is None:
            return batch
        return _apply(batch, lambda t: t.to(dtype) if torch.is_floating_point(t) else t)

    def to_device(self, batch: Any) -> Any:
        """``batch`` with its tensors on :attr:`device`."""
        return _apply(batch, lambda t: t.to(self.device))

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        """The context of one prediction step: autocast, or the default dtype of a ``*-true`` precision."""
        if self.autocast is not None:
            with torch.autocast(self.device.type, dtype=self.autocast, cache_enabled=False):
                yield
        elif self.dtype is not None:
            default = torch.get_default_dtype()
            torch.set_default_dtype(self.dtype)
            try:
                yield
            finally:
                torch.set_default_dtype(default)
        else:
            yield


def placement(cfg: Config) -> Placement:
    """The device and precision of the run's prediction Trainer (``trainer.accelerator``, ``trainer.devices``,
    ``trainer.precision``)."""
    device = prediction_device(cfg)
    precision = str(cfg.trainer.precision)
    precision = _ALIASES.get(precision, precision)
    if precision == "16-mixed" and device.type == "cpu":  # Lightning: no float16 autocast on the CPU
        precision = "bf16-mixed"
    if precision in _TRUE_DTYPES:
        return Placement(device, precision, dtype=_TRUE_DTYPES[precision])
    if precision in _MIXED_DTYPES:
        return Placement(device, precision, autocast=_MIXED_DTYPES[precision])
    if precision != "32-true":
        raise ConfigError(f"`trainer.precision` {cfg.trainer.precision!r} is not a precision rankwise predicts in")
    return Placement(device, precision)


def _apply(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` on every tensor of a batch (nested tuples, lists and mappings)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(_apply(v, fn) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_apply(v, fn) for v in obj)
    if isinstance(obj, Mapping):
        items = {k: _apply(v, fn) for k, v in obj.items()}
        return items if type(obj) is dict else type(obj)(items)  # type: ignore[call-arg]
    return obj


def predict(module: Any, loaders: Sequence[Any], where: Placement) -> list[dict[str, np.ndarray]]:
    """``module.predict_batch`` over each loader in eval and inference mode, on ``where.device`` at its
    precision: ``pred``, ``label``, ``features`` of each loader, concatenated, float32 numpy.

    ``module`` (a :class:`~rankwise.recipes.regression.net.DIRNet` holding its checkpoint's weights, already
    converted by :meth:`Placement.convert_module`) is moved to the device and left there in eval mode.
    """
    module.to(where.device)
    module.eval()
    out = []
    with torch.inference_mode():
        for loader in loaders:
            batches = []
            for batch in loader:
                batch = where.to_device(where.convert_input(batch))
                with where.forward_context():
                    step = module.predict_batch(batch)
                batches.append({k: v.cpu() for k, v in step.items()})
            out.append(concat_predictions(batches))
    return out


def concat_predictions(outs: list[dict[str, torch.Tensor]]) -> dict[str, np.ndarray]:
    """The per-batch ``pred``, ``label``, ``features`` of a prediction loop, concatenated (numpy)."""
    return {k: torch.cat([o[k] for o in outs]).cpu().numpy() for k in ("pred", "label", "features")}
