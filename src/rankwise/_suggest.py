"""The "did you mean" hints of rankwise's error messages (no torch: the config layer and the registries use them).

Every "did you mean" of rankwise comes from :func:`suggestion` (one cutoff, :data:`CLOSE_CUTOFF`);
:mod:`rankwise._validation` re-exports these names.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

__all__ = ["CLOSE_COUNT", "CLOSE_CUTOFF", "did_you_mean", "suggestion"]

#: how similar (``difflib`` ratio) a valid name must be to an unknown one to be suggested, and how many are
CLOSE_CUTOFF, CLOSE_COUNT = 0.5, 3


def suggestion(value: Any, valid: Iterable[Any]) -> str:
    """``"did you mean 'a' or 'b'?"``: the valid names closest to ``value`` (``""`` when none is close).

    Every "did you mean" of rankwise comes from here (one cutoff, :data:`CLOSE_CUTOFF`).

    Example:
        >>> suggestion("lrr", ["lr", "momentum"])
        "did you mean 'lr'?"
        >>> suggestion("xyz", ["lr"])
        ''
    """
    close = difflib.get_close_matches(str(value), sorted(str(v) for v in valid), n=CLOSE_COUNT, cutoff=CLOSE_CUTOFF)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def did_you_mean(value: str, valid: Iterable[str], what: str = "keys") -> str:
    """``"did you mean 'x'? valid <what>: a, b, c"`` (the hint only when a close match exists)."""
    names = sorted(valid)
    hint = suggestion(value, names)
    return f"{hint + ' ' if hint else ''}valid {what}: {', '.join(names)}"
