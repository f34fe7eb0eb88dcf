"""Memory and time of a brain-age training step, measured on this machine, and the memory available to it.

A 3D network's training step holds, until its backward pass, the activations autograd saved: a
number of bytes per voxel and per volume of the batch that depends on the network, not on the
batch or the grid. :func:`measure_step` runs one forward/backward of the run's first-stage network
(``model.backbone`` with ``model.options``) on two volumes at a small grid of the configured shape's
proportions (the configured grid itself when it is small), counts the bytes of the tensors autograd
saved (:func:`torch.autograd.graph.saved_tensors_hooks`, each storage once) and times the step.
:class:`StepCost` scales both to the configured grid and a batch: memory ``BACKWARD_FACTOR`` times
the saved bytes (the backward pass holds the gradients of the activations next to them) plus the
parameters with their gradients and two optimizer moments plus the process's ``BASE_BYTES``; time
per volume proportional to the voxels.

:func:`available_memory` reads what the operating system grants: ``MemAvailable`` of
``/proc/meminfo`` (else ``os.sysconf``), bounded by the cgroup's ``memory.max`` and by the
address-space limit (``RLIMIT_AS``) less what the process has mapped; on a CUDA device, its free
memory (``torch.cuda.mem_get_info``).

The ``brain_age`` recipe refuses a run whose estimate exceeds the available memory
(:func:`check_memory`, one ``error:`` line naming both, ``data.batch_size`` and the override
``trainer.memory_check=false``) before training, and
the own-data route (``rankwise train --data cohort.csv --method tsan``) chooses a batch size that
fits (:func:`budget`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "BACKWARD_FACTOR",
    "BASE_BYTES",
    "Available",
    "Budget",
    "StepCost",
    "available_memory",
    "budget",
    "check_memory",
    "measure_step",
]

#: the peak of a training step over the activations autograd saved (their gradients in the backward pass)
BACKWARD_FACTOR = 1.5
#: what a training process holds besides the step: torch, the loaders, the kernels' workspaces
BASE_BYTES = 768 * 2**20
#: the largest grid (voxels) the step is measured at; a larger configured grid is scaled down to it
CALIBRATION_VOXELS = 48 * 56 * 48
#: the share of the available memory a chosen batch size may use
HEADROOM = 0.8

GiB = float(2**30)


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


@dataclass(frozen=True)
class StepCost:
    """One training step of a network, measured at ``measured_shape``: per volume and voxel, and fixed."""

    network: str
    saved_bytes_per_voxel: float
    param_bytes: int
    seconds_per_voxel: float
    measured_shape: tuple[int, ...]

    def bytes(self, shape: Any, batch: int) -> float:
        """Estimated peak memory (bytes) of a training step of ``batch`` volumes of grid ``shape``."""
        voxels = math.prod(int(s) for s in shape)
        activations = BACKWARD_FACTOR * self.saved_bytes_per_voxel * voxels * int(batch)
        return activations + 4 * self.param_bytes + BASE_BYTES

    def seconds(self, shape: Any, volumes: int) -> float:
        """Estimated seconds of the training steps over ``volumes`` volumes of grid ``shape``."""
        return self.seconds_per_voxel * math.prod(int(s) for s in shape) * int(volumes)

    def fitting_batch(self, shape: Any, available: float) -> int:
        """The largest batch whose step fits in ``available`` bytes (0: not even one volume)."""
        per = BACKWARD_FACTOR * self.saved_bytes_per_voxel * math.prod(int(s) for s in shape)
        room = available - 4 * self.param_bytes - BASE_BYTES
        return max(math.floor(room / per + 1e-9), 0) if per > 0 else 1 << 30


class Available(NamedTuple):
    """Memory the run may use (bytes) and where the figure comes from."""

    bytes: float
    source: str


def _meminfo_available() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_room() -> float | None:
    base = Path("/sys/fs/cgroup")
    try:
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return float(limit) - float((base / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None


def _address_space_room() -> float | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = 0.0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                mapped = float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(soft) - mapped


def available_memory(device: str = "cpu") -> Available:
    """The memory a training step on ``device`` ("cpu" or "cuda[:i]") may use (see the module doc)."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return Available(float(free), f"free memory of {device}")
    found = [
        (v, src)
        for v, src in (
            (_meminfo_available(), "MemAvailable"),
            (_cgroup_room(), "the cgroup's memory.max"),
            (_address_space_room(), "the address-space limit (ulimit -v)"),
        )
        if v is not None
    ]
    if not found:
        return Available(float("inf"), "unknown")
    value, source = min(found)
    return Available(max(value, 0.0), source)


def _calibration_shapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Grids of ``shape``'s proportions from :data:`CALIBRATION_VOXELS` voxels, doubling up to ``shape`` itself."""
    out = []
    voxels = CALIBRATION_VOXELS
    while voxels < math.prod(shape):
        f = (voxels / math.prod(shape)) ** (1 / len(shape))
        out.append(tuple(max(math.ceil(s * f), 1) for s in shape))
        voxels *= 2
    return [*out, shape]


#: volumes of the measured step (two: BatchNorm trains on a 1^3 feature map of two volumes)
CALIBRATION_BATCH = 2


def _step(net: Any, backbone: str, shape: tuple[int, ...], device: str) -> tuple[float, float]:
    """Saved bytes and seconds of one forward/backward of :data:`CALIBRATION_BATCH` volumes of ``shape``."""
    import torch

    x = torch.randn(CALIBRATION_BATCH, 1, *shape, device=device)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
        return t

    net.train()
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if backbone == "sfcn":
            out = net(x)
        else:
            sex = torch.zeros(CALIBRATION_BATCH, 2, device=device)
            sex[:, 1] = 1
            out = net(x, sex)
    out.float().sum().backward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return float(sum(storages.values())), time.perf_counter() - t0


@functools.lru_cache(maxsize=8)
def _measure(backbone: str, options: str, shape: tuple[int, ...], device: str) -> StepCost:
    from rankwise import models

    net, _ = models.build_backbone(backbone, **json.loads(options))
    net = net.to(device)
    params = sum(p.numel() * p.element_size() for p in net.parameters())
    grids = _calibration_shapes(shape)
    for small in grids:
        try:
            saved, secs = _step(net, backbone, small, device)
            break
        except (RuntimeError, ValueError):  # a grid too small for the network's poolings: the next larger one
            if small == grids[-1]:
                raise
    voxels = math.prod(small) * CALIBRATION_BATCH
    return StepCost(backbone, saved / voxels, int(params), secs / voxels, small)


def measure_step(cfg: Any, shape: Any, device: str = "cpu") -> StepCost:
    """The measured :class:`StepCost` of the first-stage network of ``cfg`` (cached per network and grid)."""
    return _measure(
        str(cfg.model.backbone),
        json.dumps(dict(cfg.model.options), sort_keys=True),
        tuple(int(s) for s in shape),
        device,
    )


def training_device(cfg: Any) -> str:
    """``"cuda"`` when the run trains on a CUDA GPU (``trainer.accelerator`` gpu/cuda, or auto with one), else
    ``"cpu"``."""
    acc = str(cfg.trainer.accelerator)
    if acc in ("gpu", "cuda") or acc == "auto":
        import torch

        if torch.cuda.is_available():
            return "cuda"
    return "cpu"


def _shape_text(shape: Any) -> str:
    return "x".join(str(int(s)) for s in shape)


class _NoRoom(Exception):
    """Even the measured step ran out of memory."""


def _out_of_memory(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or "out of memory" in str(e) or "allocate" in str(e)


def _measured(cfg: Any, shape: Any, device: str) -> StepCost | None:
    """:func:`measure_step`, or None where the network cannot run on the grid (training reports it);
    :class:`_NoRoom` where the measured step itself runs out of memory."""
    try:
        return measure_step(cfg, shape, device)
    except (RuntimeError, ValueError, TypeError, MemoryError) as e:
        if _out_of_memory(e):
            raise _NoRoom(" ".join(str(e).split())[:120]) from None
        return None


def check_memory(cfg: Any, shape: Any, *, available: Available | None = None) -> StepCost | None:
    """Refuse (:class:`~rankwise.recipes.config.ConfigError`, one line) a run whose training step would not fit.

    The line names the estimate, the available memory and its source, and the ``data.batch_size``
    that fits (or ``data.options.shape`` / ``model.options`` when not even one volume does). Returns
    the measured cost (None: the network does not run on ``shape``, which training then reports).
    """
    from rankwise.recipes.config import ConfigError

    device = training_device(cfg)
    avail = available if available is not None else available_memory(device)
    try:
        cost = _measured(cfg, shape, device)
    except _NoRoom as e:
        raise ConfigError(
            f"a training step of {cfg.model.backbone} on volumes of {_shape_text(shape)} does not fit in the "
            f"{_gib(avail.bytes)} available ({avail.source}): measuring one step of two volumes at a smaller grid "
            f"already ran out of memory ({e}); lower data.options.shape or the network's size (model.options), "
            "or set trainer.memory_check=false to train anyway"
        ) from None
    if cost is None:
        return None
    batch = int(cfg.data.batch_size)
    need = cost.bytes(shape, batch)
    if need <= avail.bytes:
        return cost
    fits = cost.fitting_batch(shape, avail.bytes)
    lower = (
        f"lower data.batch_size (at most {fits} fits)"
        if fits >= 1
        else "lower data.options.shape or the network's size (model.options): not even one volume fits"
    )
    raise ConfigError(
        f"a training step of {cfg.model.backbone} with data.batch_size={batch} volumes of "
        f"{_shape_text(shape)} needs about {_gib(need)} of memory (measured on this machine at "
        f"{_shape_text(cost.measured_shape)}), but {_gib(avail.bytes)} is available ({avail.source}): {lower}, "
        "or set trainer.memory_check=false to train anyway"
    )


@dataclass(frozen=True)
class Budget:
    """What the own-data route needs to choose a batch size and describe the run's cost."""

    cost: StepCost
    shape: tuple[int, ...]
    available: Available

    @property
    def max_batch(self) -> int:
        """The largest batch that fits in :data:`HEADROOM` of the available memory (at least 1)."""
        return max(self.cost.fitting_batch(self.shape, HEADROOM * self.available.bytes), 1)

    def describe(self, batch: int, steps: int, n_val: int = 0) -> str:
        """``about 2.1 of 20.5 GiB available per training step; about 3 min per epoch``."""
        train = self.cost.seconds(self.shape, steps * batch)
        secs = train + self.cost.seconds(self.shape, n_val) / 3  # a forward pass: about a third of a step
        at = _shape_text(self.cost.measured_shape)
        scaled = "" if tuple(self.cost.measured_shape) == self.shape else f" scaled to {_shape_text(self.shape)}"
        return (
            f"training step about {_gib(self.cost.bytes(self.shape, batch))} of {_gib(self.available.bytes)} "
            f"available; about {_duration(secs)} per epoch (one measured step at {at}{scaled})"
        )


def _duration(secs: float) -> str:
    if secs < 90:
        return f"{secs:.0f} s"
    if secs < 5400:
        return f"{secs / 60:.0f} min"
    return f"{secs / 3600:.1f} h"


def budget(cfg: Any, data: Any) -> Budget | None:
    """The :class:`Budget` of ``cfg``'s first-stage network on ``data``'s grid (``data.meta["shape"]``);
    None where the network does not run on that grid (training reports it)."""
    shape = tuple(int(s) for s in data.meta["shape"])
    device = training_device(cfg)
    try:
        cost = _measured(cfg, shape, device)
    except _NoRoom:  # the recipe's check before training says so
        return None
    return None if cost is None else Budget(cost, shape, available_memory(device))
