"""What every scenario uses: a scratch folder of its own, the `rankwise` command in a subprocess
(memory-capped, timed), and the judgements shared by all sections."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path()
SRC = str(Path(__file__).resolve().parents[2] / "src")
SCENARIOS: list[Scenario] = []
#: the small-run settings every story trains with unless it says otherwise
TINY = (
    "model.options.hidden=[16]",
    "data.batch_size=128",
    "trainer.max_epochs=2",
    "trainer.num_threads=1",
    "run.plots=false",
)


class Hang(Exception):
    """A command of the story ran past its time limit."""


@dataclass
class Scenario:
    section: str
    name: str
    fn: Callable[[Context], tuple[str, str]]


def scenario(fn: Callable[[Context], tuple[str, str]]) -> Callable[[Context], tuple[str, str]]:
    """Register ``fn(ctx) -> (outcome, detail)`` under its module's section and its own name."""
    SCENARIOS.append(Scenario(fn.__module__.rsplit(".", 1)[-1], fn.__name__, fn))
    return fn


def setup(out: Path) -> None:
    global OUT
    OUT = out.resolve()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)


@dataclass
class Result:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def errors(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.startswith("error:")]

    def tail(self, n: int = 3) -> str:
        lines = (self.stdout + self.stderr).strip().splitlines()
        return " | ".join(lines[-n:])[:400]


def _limits(memory_gib: float) -> Callable[[], None]:
    def apply() -> None:
        b = int(memory_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (b, b))
        os.setsid()

    return apply


class Context:
    """One story's scratch folder (``ctx.dir``) and its commands."""

    def __init__(self, sc: Scenario) -> None:
        self.scenario = sc
        self.dir = OUT / sc.section / sc.name
        self.dir.mkdir(parents=True, exist_ok=True)

    def rankwise(
        self,
        *args: str | Path,
        cwd: Path | None = None,
        timeout: float = 300.0,
        memory_gib: float = 8.0,
        env: dict[str, str] | None = None,
        kill_after: tuple[str, int] | None = None,
    ) -> Result:
        """``rankwise ARGS`` from ``cwd`` (default: the story's folder).

        ``kill_after=(text, signum)``: send ``signum`` to the process group as soon as ``text`` appears
        in its output (a kill at a chosen moment); the result's rc is then the signal's."""
        argv = [sys.executable, "-m", "rankwise.cli", *map(str, args)]
        full_env = {**os.environ, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1", **(env or {})}
        t0 = time.time()
        log_out, log_err = self.dir / f".out{os.getpid()}_{time.time_ns()}", self.dir / f".err{time.time_ns()}"
        with open(log_out, "w") as o, open(log_err, "w") as e:
            p = subprocess.Popen(
                argv,
                cwd=cwd or self.dir,
                env=full_env,
                stdout=o,
                stderr=e,
                stdin=subprocess.DEVNULL,
                preexec_fn=_limits(memory_gib),
            )
            while p.poll() is None:
                time.sleep(0.1)
                if time.time() - t0 > timeout:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                    raise Hang(f"{' '.join(map(str, args))} ran past {timeout:.0f} s")
                if kill_after is not None:
                    text, sig = kill_after
                    if text in log_out.read_text(errors="replace") + log_err.read_text(errors="replace"):
                        os.killpg(p.pid, sig)
                        p.wait()
                        break
        res = Result(
            [*map(str, args)],
            p.returncode,
            log_out.read_text(errors="replace"),
            log_err.read_text(errors="replace"),
            time.time() - t0,
        )
        log_out.unlink()
        log_err.unlink()
        return res

    def train(self, *args: str | Path, tiny: bool = True, **kw: Any) -> Result:
        """``rankwise train ARGS --no-progress`` with the TINY settings first (ARGS' own ``--set`` win)."""
        sets = [a for s in TINY for a in ("--set", s)] if tiny else []
        return self.rankwise("train", *sets, *args, "--no-progress", **kw)


# ----------------------------------------------------------------------------------- judgements
def is_clear(res: Result, wording: str | None = None) -> bool:
    """Refused as the project promises: exit 2 (130 after a signal), one `error:` line, no traceback."""
    text = res.stdout + res.stderr
    return (
        res.rc in (2, 130)
        and len(res.errors) == 1
        and "Traceback" not in text
        and not res.errors[0].startswith("error: unexpected")
        and (wording is None or wording.lower() in res.errors[0].lower())
    )


def crashed(res: Result) -> bool:
    text = res.stdout + res.stderr
    return (
        "Traceback" in text or res.rc not in (0, 2, 130) or any(e.startswith("error: unexpected") for e in res.errors)
    )


def expect_refusal(res: Result, wording: str | None = None) -> tuple[str, str]:
    """The story's last command must be refused (``wording``: words its error line must hold)."""
    if crashed(res):
        return "crash", res.tail()
    if res.rc == 0:
        return "accepts", res.tail()
    if is_clear(res, wording):
        return "clear", res.errors[0]
    return "crash", f"unclear refusal (wanted {wording!r}): {res.tail()}"


def expect_success(res: Result) -> tuple[str, str] | None:
    """None when the command succeeded; else the outcome that ends the story."""
    if crashed(res):
        return "crash", res.tail()
    if res.rc != 0:
        return ("refuses_valid", res.errors[0]) if is_clear(res) else ("crash", res.tail())
    return None


def numbers_of(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", text)]


def same(a: Sequence[float], b: Sequence[float], tol: float = 1e-6) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(x)) for x, y in zip(a, b))
