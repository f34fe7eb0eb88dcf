"""Metrics of ordinal predictions: label MAE / RMSE, exact and off-by-one accuracy, quadratic weighted
kappa, Spearman and Kendall correlation, shot-group MAEs."""

from __future__ import annotations

__all__: list[str] = []
