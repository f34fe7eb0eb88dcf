"""Ordinal losses over ``K`` class logits: distance-weighted, soft-label and label-distribution losses."""

from __future__ import annotations

__all__: list[str] = []
