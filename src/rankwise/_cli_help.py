"""Help and usage text of the ``rankwise`` command line: flags print as flags, arguments as NAME.

typer's own rendering shows a ``<bool>`` type after every flag (``--debug``, ``--help``) and a
required argument as ``{config}`` in the usage line; these command classes print ``--debug`` and
``CONFIG`` / ``[CONFIG]`` / ``SOURCES...`` instead.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

__all__ = ["Command", "Group"]


def _flags_without_type(params: list[Any]) -> list[Any]:
    for p in params:
        if isinstance(p, TyperOption) and p.is_flag and p.metavar is None:
            p.metavar = ""  # an empty type column for a flag
    return params


def _usage(params: list[Any], ctx: Any, options_metavar: str | None) -> list[str]:
    pieces = [options_metavar] if options_metavar else []
    for p in params:
        if isinstance(p, TyperArgument):
            name = (p.metavar or p.name or "arg").upper()
            name = name if p.required else f"[{name}]"
            pieces.append(name + ("..." if p.nargs != 1 else ""))
        else:
            pieces.extend(p.get_usage_pieces(ctx))
    return pieces


class Command(TyperCommand):
    """A command whose help shows flags without a type and arguments as ``NAME``."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage(self.get_params(ctx), ctx, self.options_metavar)


class Group(TyperGroup):
    """A command group whose help shows flags without a type and arguments as ``NAME``."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*_usage(self.get_params(ctx), ctx, self.options_metavar), self.subcommand_metavar]
