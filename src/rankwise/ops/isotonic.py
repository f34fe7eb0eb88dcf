"""Isotonic soft sort / rank (Blondel et al., ICML'20).

PLACEHOLDER — being implemented (see issue "Foundation"). Registers soft method "isotonic".
"""

from __future__ import annotations

__all__: list[str] = []
