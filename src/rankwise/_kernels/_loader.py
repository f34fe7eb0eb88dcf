"""The one lazy loader of the kernel layer, and the ``RANKWISE_NUMBA`` policy (parsed once, here).

Importing numba and reading (or compiling) the cached kernels takes about a second with a warm
cache, more on a fresh install, so ``import rankwise`` never does it. Each kernel family (sort,
isotonic, supcon, rnc, ranksim) is a :class:`Family`: its numba module is imported, and its
specializations are read or compiled by a warm-up on tiny inputs, on first need, as
``RANKWISE_NUMBA`` says:

* ``"background"`` (default): calls made before a family is loaded take the torch path (same values
  up to float rounding); the ``start_after``-th such call starts loading it in a daemon thread, so
  that no call waits for numba; a call with ``wait=True`` (an input too large for the torch path to
  be a fair stand-in) loads it and waits. At exit, a load in progress stops after its current step
  (never inside LLVM).
* ``"sync"``: the first call loads the family and waits (the path never depends on timing).
* ``"off"``: numba is never used; every kernel takes its torch path.

Once a family is loaded (or known to be unavailable), :meth:`Family.get` is one attribute read:
no lock is taken and no thread started on the call path.
"""

from __future__ import annotations

import atexit
import importlib
import threading
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["MODE", "MODES", "WARMUP_TORCH_MAX", "Family", "usable"]

MODES = ("background", "sync", "off")


def _parse_mode() -> str:
    import os

    mode = os.environ.get("RANKWISE_NUMBA", "background").strip().lower() or "background"
    if mode not in MODES:
        warnings.warn(
            f"rankwise: RANKWISE_NUMBA must be one of {', '.join(MODES)}, got {mode!r}; using 'background'",
            RuntimeWarning,
            stacklevel=2,
        )
        mode = "background"
    return mode


#: the policy of every family, parsed once at import (tests set it through ``monkeypatch``)
MODE = _parse_mode()
#: in "background" mode, isotonic inputs above this many ``rows * n^2`` elements wait for the kernels
#: (the O(n^2) torch path would be slower than loading them)
WARMUP_TORCH_MAX = 1 << 22

_UNSET: Any = object()


class Family:
    """One family of kernels: ``module`` (a ``rankwise._kernels._numba_*`` module) loaded lazily.

    ``warm(module)`` reads or compiles the specializations the callers use (called once, by the
    loading thread); ``start_after``: the number of unloaded calls after which the background load
    starts; ``warn``: warn once when numba is unavailable (else a debug-level silence: the torch path
    is as fast there).
    """

    def __init__(self, name: str, module: str, warm: Callable[[Any], None], *, start_after: int, warn: bool) -> None:
        self.name = name
        self._module_name = module
        self._warm = warm
        self.start_after = start_after
        self._warn = warn
        self.kernels: Any = _UNSET  # the loaded module, None (unavailable), or _UNSET (not yet)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._unloaded_calls = 0
        self._warming: tuple[int, Any] | None = None
        self._pending_warning: str | None = None

    # -- the call path ------------------------------------------------------------------------------
    def get(self, *, wait: bool = False, call: bool = True) -> Any:
        """The kernels module, or ``None`` for the torch path. ``wait``: load now in "background" mode
        too; ``call``: an operator call (counted towards the background load), not a step inside one."""
        k = self.kernels
        if k is not _UNSET:
            if self._pending_warning is not None:  # a failed background load is reported by a caller
                self._report(self._pending_warning)
            return k
        if MODE == "off":
            return None
        if MODE == "sync" or wait:
            return self.load()
        if call:
            self._unloaded_calls += 1
            if self._unloaded_calls >= self.start_after and self._thread is None:
                self._start()
        return None

    def require(self) -> Any:
        """The kernels, loading them now if needed (inside a kernel call, also while the warm-up of the
        loading thread runs), or ``None`` when numba cannot be used."""
        k = self.kernels
        if k is not _UNSET:
            return k
        warming = self._warming
        if warming is not None and warming[0] == threading.get_ident():
            return warming[1]
        return self.load() if MODE != "off" else None

    @property
    def loaded(self) -> bool:
        """Whether the kernels are loaded (``get`` returns them without waiting)."""
        return self.kernels is not _UNSET and self.kernels is not None

    # -- loading ------------------------------------------------------------------------------------
    def _report(self, message: str) -> None:
        self._pending_warning = None
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    def load(self, *, quiet: bool = False) -> Any:
        """Import and warm up the kernels now (once), or ``None`` when numba cannot be used (``quiet``: the
        loading thread's call, whose failure the next caller reports: the warnings filters are global,
        so the thread must not change them)."""
        if self.kernels is not _UNSET:
            return self.kernels
        with self._lock:
            if self.kernels is _UNSET:
                try:
                    module = importlib.import_module(self._module_name)
                    self._warming = (threading.get_ident(), module)
                    try:
                        self._warm(module)
                    finally:
                        self._warming = None
                    self.kernels = module
                except Exception as exc:  # numba missing or broken: the torch path
                    self.kernels = None
                    if self._warn:
                        message = (
                            f"rankwise: numba is unavailable ({exc!r}); the {self.name} kernels use the "
                            "slower PyTorch path on CPU"
                        )
                        if quiet:
                            self._pending_warning = message
                        else:
                            warnings.warn(message, RuntimeWarning, stacklevel=3)
        return self.kernels

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._load_in_background, name=f"rankwise-numba-{self.name}", daemon=True
                )
                atexit.register(self._stop_at_exit)
                self._thread.start()

    def _load_in_background(self) -> None:
        # no warnings.catch_warnings() here: it saves and restores the process-wide filters, so a
        # thread inside it would drop the filters that the main thread adds meanwhile
        try:
            if not self._stop.is_set():
                self.load(quiet=True)
        except BaseException:  # e.g. interpreter shutdown: callers load the kernels themselves
            return

    def _stop_at_exit(self) -> None:
        """At exit: let the loader finish its current step (never kill it inside LLVM), then stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def reset(self) -> None:
        """Forget the loaded state (tests only)."""
        self.kernels = _UNSET
        self._thread = None
        self._unloaded_calls = 0
        self._pending_warning = None


_usable: bool | None = None


def usable() -> bool:
    """Whether numba can be imported and ``RANKWISE_NUMBA`` allows it (without importing numba)."""
    global _usable
    if MODE == "off":
        return False
    if _usable is None:
        from importlib.util import find_spec

        _usable = find_spec("numba") is not None
    return _usable
