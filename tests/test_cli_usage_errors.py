"""Usage errors of the command line parser (unknown option or command, missing argument, wrong type or
choice) follow the CLI's rule for user errors: one ``error: ...`` line naming the option, argument or
command, exit status 2, no usage text, box or traceback. ``--help``, ``--version`` and a bare group
keep click's behaviour."""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest

pytest.importorskip("typer")

import typer
from typer.testing import CliRunner

from rankwise._cli_help import Command, Group
from rankwise.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _paths(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group below ``cmd`` as its argv path (``("data", "make", "ltr-synthetic")``)."""
    out = [path] if path else []
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        out += _paths(sub, (*path, name))
    return out


COMMANDS = _paths(typer.main.get_command(app))


def _one_line(r: Any) -> str:
    """Exit status 2 and exactly one non-empty output line, an ``error: `` line; returns it."""
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("error: "), r.output
    for junk in ("Usage:", "Try '", "╭", "│", "Traceback"):
        assert junk not in r.output, r.output
    return lines[0]


def test_the_walk_reaches_every_command():
    assert {("train",), ("evaluate",), ("data", "make", "ltr-synthetic"), ("sodeep", "train")} <= set(COMMANDS)
    assert len(COMMANDS) >= 14


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p))
def test_unknown_option_of_every_command_is_one_line(path):
    line = _one_line(runner.invoke(app, [*path, "--no-such-flag"]))
    assert "no such option: --no-such-flag" in line
    assert f"`rankwise {' '.join(path)} --help`" in line


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["evaluate"], ["missing argument", "run_dir", "`rankwise evaluate --help`"]),
        (["compare"], ["missing argument", "sources"]),
        (["data", "show"], ["missing argument", "name"]),
        (["data", "make", "ltr-synthetic"], ["missing option '--out'"]),
        (["data", "make", "brain-age-synthetic", "--out", "x", "--n", "abc"], ["invalid value for '--n'", "integer"]),
        (["data", "make", "ltr-synthetic", "--out", "x", "--seed", "1.5"], ["invalid value for '--seed'"]),
        (["demo", "--seeds", "x"], ["invalid value for '--seeds'", "`rankwise demo --help`"]),
        (["train", "x", "--num-nodes", "two"], ["invalid value for '--num-nodes'"]),
        (["sodeep", "train", "--lr", "fast"], ["invalid value for '--lr'", "`rankwise sodeep train --help`"]),
        (["bogus"], ["no such command 'bogus'", "`rankwise --help`"]),
        (["data", "bogus"], ["no such command 'bogus'", "`rankwise data --help`"]),
        (["data", "make", "bogus"], ["no such command 'bogus'"]),
        (["--no-such-flag"], ["no such option: --no-such-flag"]),
        (["presets", "extra"], ["no such command", "extra"]),
        (["data", "show", "abalone", "-O"], ["option '-O' requires an argument"]),
        (["evaluate", "x", "--plots=3"], ["option '--plots' does not take a value"]),
    ],
)
def test_parser_errors_are_one_line_naming_the_parameter(argv, needles):
    line = _one_line(runner.invoke(app, argv))
    for needle in needles:
        assert needle in line, line


class _Kind(str, enum.Enum):
    a = "a"
    b = "b"


def test_bad_choice_is_one_line():
    toy = typer.Typer(cls=Group)

    @toy.command(cls=Command)
    def run(kind: Annotated[_Kind, typer.Option("--kind")] = _Kind.a) -> None:
        typer.echo(kind.value)

    @toy.command(cls=Command)
    def other() -> None:  # two commands: the toy app is a group, as `rankwise` is
        pass

    assert runner.invoke(toy, ["run", "--kind", "b"]).output.strip() == "b"
    line = _one_line(runner.invoke(toy, ["run", "--kind", "c"]))
    assert "invalid value for '--kind'" in line and "'c'" in line


def test_help_version_and_a_bare_group_are_unchanged():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0 and "Usage:" in r.output and "train" in r.output
    r = runner.invoke(app, ["data", "make", "ltr-synthetic", "--help"])
    assert r.exit_code == 0 and "--train-queries" in r.output
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("rankwise ")
    r = runner.invoke(app, ["data"])  # a group without a command prints its help (click: status 2)
    assert r.exit_code == 2 and "Usage:" in r.output and "error:" not in r.output


@pytest.mark.parametrize(
    "args,start",
    [
        (["train", "abalone_vanilla", "--set", "trainer.max_epochs=0"], "error: `trainer.max_epochs` must be >= 1"),
        (["train", "abalone_vanilla", "--set", "model.options.hidden=[16"], "error: --set model.options.hidden:"),
        (["train", "no_such_preset"], "error: `no_such_preset` is neither a config file nor a preset"),
        (["evaluate", "{tmp}"], "error: "),
    ],
)
def test_a_user_error_is_one_line_on_stderr_and_nothing_on_stdout(args, start, tmp_path):
    r = runner.invoke(app, [a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 2, r.output
    assert r.stdout == "", r.stdout
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith(start), r.stderr


def test_console_script_prints_one_line_on_stderr(tmp_path):
    script = Path(sys.executable).with_name("rankwise")
    argv = [str(script)] if script.is_file() else [sys.executable, "-m", "rankwise.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "40"}
    r = subprocess.run(
        [*argv, "data", "make", "ltr-synthetic", "--out", str(tmp_path / "d"), "--train-queries", "many"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: invalid value for '--train-queries'")
    assert lines[0].endswith("(see `rankwise data make ltr-synthetic --help`)")
    assert not (tmp_path / "d").exists()
    r = subprocess.run(
        [*argv, "train", "abalone_vanilla", "--set", "run.name=a/b", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.splitlines() == [
        "error: `run.name` must be a single path component (no '/', not '.' or '..'), got 'a/b'"
    ]


#: a refused value of each option of `rankwise data make ...` (the wrong types come from the parser)
_BAD_VALUES = {
    "ltr-synthetic": {
        "--seed": ["-1"],
        "--train-queries": ["-3", "0", "100000000"],
        "--val-queries": ["0"],
        "--test-queries": ["-1"],
        "--num-features": ["0", "1000000000"],
        "--informative": ["0", "47"],
    },
    "brain-age-synthetic": {
        "--n": ["0", "-1"],
        "--spacing": ["0", "nan", "-2", "9"],
        "--seed": ["-1"],
        "--sites": ["0"],
        "--patients": ["-0.1", "1", "nan"],
        "--patient-shift": ["nan", "31", "-40"],
    },
}


def _make_cases() -> list[tuple[str, str, str]]:
    make = typer.main.get_command(app).commands["data"].commands["make"]  # type: ignore[attr-defined]
    out = []
    for name, cmd in sorted(make.commands.items()):
        options = [
            p.opts[0]
            for p in cmd.params
            if p.opts[0].startswith("--") and p.opts[0] not in ("--out", "--help") and not getattr(p, "is_flag", False)
        ]  # a flag (`--raw`) takes no value to refuse
        assert sorted(options) == sorted(_BAD_VALUES[name]), name  # a new option needs its bad values here
        for opt in options:
            out += [(name, opt, v) for v in ["abc", "", *_BAD_VALUES[name][opt]]]
    return out


@pytest.mark.parametrize("command,option,value", _make_cases())
def test_data_make_refuses_each_bad_option_in_one_line_naming_it(command, option, value, tmp_path):
    r = runner.invoke(app, ["data", "make", command, "--out", str(tmp_path / "d"), option, value])
    line = _one_line(r)
    assert option in line, line
    assert not (tmp_path / "d").exists()
