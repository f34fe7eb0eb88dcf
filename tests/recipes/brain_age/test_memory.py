"""The measured memory and time of a brain-age training step, the memory available, the check before training."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rankwise.recipes import load_config
from rankwise.recipes.brain_age import memory as bm
from rankwise.recipes.config import ConfigError

#: a small ScaleDense the estimate is checked against: the real peak of a training step of 4 volumes
_PEAK = """
import json, resource, sys, torch
from rankwise import models
from rankwise.recipes.brain_age.memory import _measure
shape, batch, opts = (32, 40, 32), 4, {"nb_filter": 4, "nb_block": 3, "use_sex": True}
cost = _measure("scale_dense", json.dumps(opts, sort_keys=True), shape, "cpu")
torch.manual_seed(0)
net, _ = models.build_backbone("scale_dense", **opts)
opt = torch.optim.Adam(net.parameters())
x, sex = torch.randn(batch, 1, *shape), torch.zeros(batch, 2)
sex[:, 1] = 1
try:  # the peak of the step and what the process holds, not of a transient while importing
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass
net(x, sex).sum().backward()
opt.step()
hwm = [int(ln.split()[1]) * 1024 for ln in open("/proc/self/status") if ln.startswith("VmHWM:")]
peak = hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"estimate": cost.bytes(shape, batch), "peak": peak}))
"""


def _cfg(batch: int = 4) -> object:
    return load_config(
        "brain_age_tsan",
        [f"data.batch_size={batch}", "model.options={nb_filter: 2, nb_block: 2, use_sex: true}"],
    )


def test_the_estimate_is_within_a_factor_of_the_real_peak() -> None:
    out = subprocess.run([sys.executable, "-c", _PEAK], capture_output=True, text=True, timeout=600, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0.5 < got["estimate"] / got["peak"] < 2.0, got


def test_the_cost_scales_with_the_batch_and_the_grid() -> None:
    cost = bm.measure_step(_cfg(), (24, 28, 24))
    assert cost.measured_shape == (24, 28, 24) and cost.saved_bytes_per_voxel > 0 and cost.seconds_per_voxel > 0
    one, four = cost.bytes((24, 28, 24), 1), cost.bytes((24, 28, 24), 4)
    assert four - one == pytest.approx(3 * (one - 4 * cost.param_bytes - bm.BASE_BYTES))
    assert cost.fitting_batch((24, 28, 24), four) == 4
    assert cost.fitting_batch((24, 28, 24), bm.BASE_BYTES) == 0
    big = bm._calibration_shapes((91, 109, 91))
    assert big[-1] == (91, 109, 91) and big[0] == (48, 57, 48)  # measured small, larger where it must


def test_check_memory_refuses_in_one_line_naming_the_estimate_the_memory_and_the_option() -> None:
    cfg = _cfg(batch=16)
    shape = (24, 28, 24)
    cost = bm.measure_step(cfg, shape)
    need = cost.bytes(shape, 16)
    room = bm.Available(cost.bytes(shape, 5) + 1, "MemAvailable")
    with pytest.raises(ConfigError) as e:
        bm.check_memory(cfg, shape, available=room)
    msg = str(e.value)
    assert "\n" not in msg and f"needs about {need / 2**30:.1f} GiB" in msg
    assert f"{room.bytes / 2**30:.1f} GiB is available (MemAvailable)" in msg
    assert "data.batch_size=16" in msg and "lower data.batch_size (at most 5 fits)" in msg
    assert msg.endswith("or set trainer.memory_check=false to train anyway")
    assert bm.check_memory(cfg, shape, available=bm.Available(need, "MemAvailable")) == cost


def test_available_memory_reads_the_address_space_limit() -> None:
    code = (
        "import resource\n"
        "from rankwise.recipes.brain_age.memory import available_memory\n"
        "vm = [int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize:')][0]\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vm + 2**30, resource.RLIM_INFINITY))\n"
        "a = available_memory()\n"
        "print(a.bytes / 2**30, a.source)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    gib, source = out.stdout.split(maxsplit=1)
    assert 0.8 < float(gib) <= 1.0 and "address-space" in source
    assert bm.available_memory().bytes > 0


def test_a_measured_step_out_of_memory_is_one_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def oom(cfg: object, shape: object, device: str = "cpu") -> bm.StepCost:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 2123456 bytes.")

    monkeypatch.setattr(bm, "measure_step", oom)
    room = bm.Available(2**30, "the address-space limit (ulimit -v)")
    with pytest.raises(ConfigError) as e:
        bm.check_memory(_cfg(), (91, 109, 91), available=room)
    msg = str(e.value)
    assert "\n" not in msg and "91x109x91 does not fit in the 1.0 GiB available" in msg
    assert "lower data.options.shape" in msg
    assert bm.budget(_cfg(), type("D", (), {"meta": {"shape": [91, 109, 91]}})()) is None

    def too_small(cfg: object, shape: object, device: str = "cpu") -> bm.StepCost:
        raise RuntimeError("Output size is too small")

    monkeypatch.setattr(bm, "measure_step", too_small)  # the network's own error comes from training
    assert bm.check_memory(_cfg(), (4, 4, 4), available=room) is None
