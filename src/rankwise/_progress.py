"""Progress lines of the long steps of a command: the time estimates of the CLI's lines and the lines
of the steps outside training (reading a LETOR file, checking and caching the volumes of a NIfTI
cohort, predicting the blocks of a large file).

A step reports what it has done (:meth:`Steps.advance`); nothing is printed unless the command
turned the lines on (:func:`progress_lines`: the CLI does, ``--no-progress`` turns them off) and
the step has run longer than :data:`DELAY_S` seconds; then one line on stderr at most every
:data:`EVERY_S` seconds, and one when it ends::

    reading train.txt: 96.0/240.0 MB (40%), 4 s, ETA 6 s
    reading train.txt: 240.0/240.0 MB, done in 9 s

Training has its own display (the progress bar of :mod:`rankwise.recipes._progress`, or one line
per epoch with ``--no-progress``); a library call prints nothing unless it runs inside
:func:`progress_lines`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

__all__ = ["DELAY_S", "EVERY_S", "Steps", "eta", "progress_lines", "runs_line"]

#: seconds a step runs before its first progress line
DELAY_S = 2.0
#: seconds between two progress lines of a step
EVERY_S = 2.0

#: whether the lines are on, and their delay and interval (``None``: the module's constants)
_settings: dict[str, float | bool | None] = {"on": False, "delay": None, "every": None}


@contextlib.contextmanager
def progress_lines(on: bool = True, *, delay: float | None = None, every: float | None = None) -> Iterator[None]:
    """Within the block, the steps print their progress lines (``on=False``: none); ``delay`` and ``every``
    (seconds; default :data:`DELAY_S`, :data:`EVERY_S`) set when the first line comes and how often."""
    saved = dict(_settings)
    _settings.update(on=bool(on), delay=delay, every=every)
    try:
        yield
    finally:
        _settings.clear()
        _settings.update(saved)


def eta(left: float) -> str:
    """The progress lines' estimate of the time left (``ETA 2 min 5 s``, ``ETA 12 s``)."""
    left = max(0.0, left)
    return f"ETA {int(left // 60)} min {int(left % 60)} s" if left >= 60 else f"ETA {left:.0f} s"


def runs_line(done: int, total: int, elapsed: float) -> str:
    """``[k/N runs, 12 s, ETA 40 s]``: the progress of a comparison after its k-th finished run."""
    left = "done" if done >= total else eta(elapsed / max(done, 1) * (total - done))
    return f"[{done}/{total} runs, {elapsed:.0f} s, {left}]"


def _amount(n: float, unit: str) -> str:
    return f"{n / 1e6:.1f}" if unit == "bytes" else f"{int(n)}"


class Steps:
    """The progress of one long step: ``what`` (``reading train.txt``), ``total`` amount of work (``None``:
    unknown) in ``unit`` (``bytes`` are shown in MB). Lines as the module doc says; :meth:`close` (or the
    end of a ``with`` block) prints the last line when any came before."""

    def __init__(self, what: str, total: float | None = None, unit: str = "items") -> None:
        self.what, self.total, self.unit = what, total, unit
        self.done = 0.0
        self.lines = 0
        self._t0 = time.perf_counter()
        self._last = self._t0

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()

    def advance(self, amount: float = 1) -> None:
        """``amount`` more of the work is done; a line when it is due."""
        self.done += amount
        if not _settings["on"]:
            return
        now = time.perf_counter()
        delay = DELAY_S if _settings["delay"] is None else float(_settings["delay"])  # type: ignore[arg-type]
        every = EVERY_S if _settings["every"] is None else float(_settings["every"])  # type: ignore[arg-type]
        if now - self._t0 < delay or (self.lines and now - self._last < every):
            return
        self._last = now
        self._print(self._line(now))

    def close(self) -> None:
        """The last line (``done in 9 s``), only after lines were printed."""
        if self.lines and _settings["on"]:
            unit = "MB" if self.unit == "bytes" else self.unit
            total = f"/{_amount(self.total, self.unit)}" if self.total else ""
            elapsed = time.perf_counter() - self._t0
            self._print(f"{self.what}: {_amount(self.done, self.unit)}{total} {unit}, done in {elapsed:.0f} s")
            self.lines = 0

    def _line(self, now: float) -> str:
        elapsed = now - self._t0
        unit = "MB" if self.unit == "bytes" else self.unit
        text = f"{self.what}: {_amount(self.done, self.unit)}"
        if self.total:
            share = min(self.done / self.total, 1.0)
            left = eta(elapsed / share * (1 - share)) if share > 0 else "ETA unknown"
            return f"{text}/{_amount(self.total, self.unit)} {unit} ({share:.0%}), {elapsed:.0f} s, {left}"
        return f"{text} {unit}, {elapsed:.0f} s"

    def _print(self, line: str) -> None:
        self.lines += 1
        sys.stdout.flush()  # what the command printed before comes first
        print(line, file=sys.stderr, flush=True)
