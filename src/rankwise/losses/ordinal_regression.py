"""Order-aware regularizers and losses of regression: Ordinal Entropy and Dist Loss."""

from __future__ import annotations

__all__: list[str] = []
