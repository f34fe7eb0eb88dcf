"""Deep imbalanced regression toolkit: weighted/focal losses, LDS, FDS, shot metrics."""

__all__: list[str] = []
