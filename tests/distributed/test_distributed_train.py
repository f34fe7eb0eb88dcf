"""2-process ``rankwise train`` on abalone (CPU, gloo): Lightning DDP launch, torchrun, resume on 1 process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable"),
]

TINY = [
    "--no-progress",
    "--accelerator",
    "cpu",
    "--set",
    "trainer.max_epochs=1",
    "--set",
    "trainer.limit_train_batches=3",
    "--set",
    "trainer.limit_val_batches=2",
    "--set",
    "trainer.log_every_n_steps=1",
    "--set",
    "trainer.num_threads=1",
]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return env


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _ckpt(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


def test_ddp_train_then_resume_on_one_process(tmp_path: Path) -> None:
    run = tmp_path / "ddp"
    cli = [sys.executable, "-m", "rankwise.cli", "train", "abalone_lds_fds", "--out", str(run)]
    # LDS + FDS (statistics all-reduced) + three global-batch regularizers
    regs = ["ranksim.weight=0.03", "conr.weight=0.1", "spearman.weight=0.1"]
    extra = [a for r in regs for a in ("--set", f"loss.regularizers.{r}")]
    proc = _run([*cli, "--devices", "2", "--strategy", "ddp", *TINY, *extra], tmp_path)
    assert proc.stdout.count("run directory:") == 1  # only rank 0 evaluates and reports
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["trainer"]["devices"] == 2 and cfg["trainer"]["strategy"] == "ddp"
    first = _ckpt(run)
    assert first["epoch"] == 0 and first["global_step"] == 3

    # LDS weights come from the FULL training set (not a rank's shard): same table as a 1-process build
    from rankwise.data import get_dataset
    from rankwise.recipes import config_from_dict
    from rankwise.recipes.regression.module import DIRRegressor

    c = config_from_dict(cfg)
    d = get_dataset(c.data.name, **c.data.options)
    module = DIRRegressor(c, input_dim=d.input_dim, bin_width=d.bin_width, train_labels=d.train_labels, meta=d.meta)
    assert torch.equal(first["state_dict"]["lds_table"], module.lds_table)

    # resume on ONE process for a second epoch (hardware flags apply on --resume)
    cfg["trainer"]["max_epochs"] = 2
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    _run([*cli, "--resume", "--devices", "1", "--strategy", "auto", "--accelerator", "cpu", "--no-progress"], tmp_path)
    second = _ckpt(run)
    assert second["global_step"] == 6, (second["epoch"], second["global_step"])  # 3 steps per epoch, 2 epochs
    assert "completed" in (run / "meta.json").read_text()


@pytest.mark.skipif(
    shutil.which("torchrun") is None and not Path(sys.executable).with_name("torchrun").exists(),
    reason="torchrun not installed",
)
def test_torchrun_launch(tmp_path: Path) -> None:
    run = tmp_path / "trun"
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    cmd = [torchrun, "--standalone", "--nproc_per_node", "2", "-m", "rankwise.cli", "train", "abalone_rnc"]
    # two stages: RnC pretraining (global-batch rnc_loss), then the regressor
    proc = _run([*cmd, "--out", str(run), *TINY, "--set", "task.pretrain_epochs=1"], tmp_path)
    # devices / strategy come from torchrun's environment: one DDP run, reported once by rank 0
    assert proc.stdout.count("run directory:") == 1, proc.stdout[-3000:]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["trainer"]["devices"] == 2 and cfg["trainer"]["strategy"] == "ddp"
    assert _ckpt(run)["global_step"] == 3


@pytest.mark.parametrize(
    "preset,sets,steps",
    [
        # 4 batches of lists per epoch split over 2 ranks: 2 optimizer steps per epoch, 2 epochs
        # (about 35 s: extended, over CI's time budget; the SupCon case below runs a DDP recipe in CI)
        pytest.param(
            "large_mnist_neuralsort",
            ["task.steps=8", "task.steps_per_epoch=4", "task.lists_per_batch=4"],
            4,
            marks=pytest.mark.extended,
        ),
        # 64 images, batch 16 per rank: 2 steps per epoch, 1 epoch; then the probe on rank 0
        ("mnist5k_supcon", ["task.train_subset=64", "data.batch_size=16", "task.probe_epochs=1"], 2),
    ],
)
def test_ddp_reproduction_recipes(tmp_path: Path, preset: str, sets: list[str], steps: int) -> None:
    run = tmp_path / "ddp"
    cli = [sys.executable, "-m", "rankwise.cli", "train", preset, "--out", str(run)]
    extra = ["task.test_lists=20", "model.options.feature_dim=16", "data.options.test_fraction=0.05", *sets]
    extra = [s for s in extra if preset.startswith("large") or not s.startswith("task.test_lists")]
    args = [a for s in extra for a in ("--set", s)]
    proc = _run([*cli, "--devices", "2", "--strategy", "ddp", *TINY, *args], tmp_path)
    assert proc.stdout.count("run directory:") == 1, proc.stdout[-3000:]
    assert _ckpt(run)["global_step"] == steps
    metrics = yaml.safe_load((run / "metrics.json").read_text())
    assert metrics["recipe"] in ("sort", "supcon") and metrics["test"]
    assert "completed" in (run / "meta.json").read_text()
