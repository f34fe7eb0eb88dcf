"""Threshold (cumulative-link) ordinal losses: CORAL, CORN and CONDOR, their label encoding and decoding."""

from __future__ import annotations

__all__: list[str] = []
