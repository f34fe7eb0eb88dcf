"""PLACEHOLDER — being implemented."""

__all__: list[str] = []
