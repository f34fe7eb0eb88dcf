"""Fault injection for the reliability tests: Lightning callbacks passed to ``train(callbacks=...)``.

Nothing in rankwise reads a test hook: the tests hand these callbacks to the public API. For a
fault that must end the process (SIGKILL), the test runs this module in a subprocess::

    python -m tests.recipes._faults kill STEP PRESET OUT [--set key=value ...]
    python -m tests.recipes._faults term STEP PRESET OUT [--set ...]   # SIGTERM, then the CLI exit code
    python -m tests.recipes._faults kill-stage N PRESET OUT [--set ...]  # at the start of the N-th stage (1 = first)
    python -m tests.recipes._faults term-stage N PRESET OUT [--set ...]
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import lightning as L
import torch


def _saved_checkpoints_on_disk(trainer: Any) -> None:
    """Wait for the checkpoints the run has saved so far: a one-process run writes them in the background,
    and a fault at a step means "after the checkpoints before this step"."""
    wait = getattr(trainer.strategy.checkpoint_io, "wait", None)
    if wait is not None:
        wait()


class SignalAtStep(L.Callback):
    """Send ``signum`` to this process at the first training batch with ``global_step >= step``."""

    def __init__(self, step: int, signum: int = signal.SIGKILL) -> None:
        self.step, self.signum, self.sent = int(step), int(signum), False

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step >= self.step and not self.sent:
            self.sent = True
            _saved_checkpoints_on_disk(trainer)
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), self.signum)


class SignalAtStage(L.Callback):
    """Send ``signum`` to this process when the ``n``-th training stage of the run starts (``n = 2``: the
    boundary after the first stage, whose ``done`` marker is written, before the second trains a step)."""

    def __init__(self, n: int, signum: int = signal.SIGKILL) -> None:
        self.n, self.signum, self.started = int(n), int(signum), 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.started += 1
        if self.started == self.n:
            _saved_checkpoints_on_disk(trainer)
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), self.signum)


class NaNAtStep(L.Callback):
    """Turn the module's weights into NaN at ``global_step >= step`` (a diverged model: the loss becomes NaN)."""

    def __init__(self, step: int) -> None:
        self.step = int(step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step >= self.step:
            with torch.no_grad():
                for p in pl_module.parameters():
                    if p.requires_grad:
                        p.fill_(float("nan"))


def _main(argv: list[str]) -> None:
    from rankwise.cli import main
    from rankwise.recipes import runner

    kind, step, preset, out, *rest = argv
    sets = [rest[i + 1] for i in range(len(rest)) if rest[i] == "--set"]
    signum = signal.SIGKILL if kind.startswith("kill") else signal.SIGTERM
    fault = SignalAtStage if kind.endswith("-stage") else SignalAtStep
    real_train = runner.train

    def train_with_fault(cfg: Any, **kw: Any) -> Any:
        return real_train(cfg, **kw, callbacks=[fault(int(step), signum)])

    runner.train = train_with_fault  # this helper process only
    main(["train", preset, "--out", out, "--no-progress", *[a for s in sets for a in ("--set", s)]])


if __name__ == "__main__":
    _main(sys.argv[1:])
