"""Help, usage and usage-error text of the ``rankwise`` command line.

typer's own rendering shows a ``<bool>`` type after every flag (``--debug``, ``--help``) and a
required argument as ``{config}`` in the usage line; these command classes print ``--debug`` and
``CONFIG`` / ``[CONFIG]`` / ``SOURCES...`` instead.

A usage error of the command line parser (unknown option or command, missing argument, a value of
the wrong type or outside a choice) prints one line ``error: ...`` naming the option or argument,
with a ``--help`` hint, on stderr and exits with status 2 — the rule of every other user error of
the CLI — instead of click's usage text and boxed message.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

__all__ = ["Command", "Group", "usage_error_line"]

#: the usage-error class of the click that typer runs on (its own copy in recent typer, ``click`` before):
#: the base of ``typer.BadParameter``, also of ``NoSuchOption``, ``MissingParameter``, ... and a bad command
UsageError: type[Exception] = typer.BadParameter.__mro__[1]


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
    """A command group whose help shows flags without a type and arguments as ``NAME``, and whose usage
    errors (its own and those of its commands) are one ``error: ...`` line with exit status 2."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        return _one_line_usage_errors(lambda: super(Group, self).make_context(info_name, args, parent, **extra))

    def invoke(self, ctx: Any) -> Any:
        return _one_line_usage_errors(lambda: super(Group, self).invoke(ctx))

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*_usage(self.get_params(ctx), ctx, self.options_metavar), self.subcommand_metavar]


def usage_error_line(e: Any) -> str:
    """One ``error: ...`` line for a usage error: click's message (which names the option, argument or
    command) made one line, and the ``--help`` of the command it concerns."""
    msg = " ".join(e.format_message().split()).rstrip(".") or "invalid command line"
    if len(msg) > 1 and msg[0].isupper() and msg[1].islower():
        msg = msg[0].lower() + msg[1:]
    ctx = e.ctx
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None and ctx.command_path else ""
    return f"error: {msg}{hint}"


def _one_line_usage_errors(call: Any) -> Any:
    """Run ``call``; a usage error prints :func:`usage_error_line` on stderr and exits 2 (``typer.Exit``,
    which every caller, standalone or not, turns into the exit status). ``rankwise`` or a group given
    without arguments still prints its help (click's ``NoArgsIsHelpError``)."""
    try:
        return call()
    except UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            raise
        sys.stdout.flush()
        typer.echo(usage_error_line(e), err=True)
        raise typer.Exit(2) from None
