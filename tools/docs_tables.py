"""Generated blocks of the docs: check them against their command, or rewrite them.

A generated block of ``README.md`` or ``docs/*.md`` sits between two marker lines::

    <!-- generated: python benchmarks/NAME.py --markdown benchmarks/results/NAME.json -->
    ...the output of that command, verbatim...
    <!-- end generated -->

The command is run from the repository root, with ``python`` meaning this interpreter and
``src/`` first on ``PYTHONPATH`` (so the checkout's rankwise is the one imported). Only commands
of the form ``python benchmarks/SCRIPT.py ...`` or ``python tools/SCRIPT.py ...`` are run.

Usage::

    python tools/docs_tables.py --check     # exit 1 naming each stale block, with a short diff
    python tools/docs_tables.py --write     # rewrite every block with its command's output
    python tools/docs_tables.py --check docs/benchmarks.md   # only these files
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BLOCK = re.compile(r"^<!-- generated: (?P<cmd>.+?) -->\n(?P<body>.*?)^<!-- end generated -->$", re.M | re.S)

#: lines of diff shown for one stale block
DIFF_LINES = 20


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening marker
    command: str
    body: str
    start: int  # offsets of the body in the file's text
    end: int


def pages(repo: Path) -> list[Path]:
    """``README.md`` and ``docs/*.md`` of ``repo`` (those that exist)."""
    readme = repo / "README.md"
    return ([readme] if readme.is_file() else []) + sorted((repo / "docs").glob("*.md"))


def blocks(path: Path) -> list[Block]:
    """The generated blocks of one Markdown file, in order."""
    text = path.read_text(encoding="utf-8")
    out = []
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out.append(Block(path, line, m.group("cmd").strip(), m.group("body"), m.start("body"), m.end("body")))
    return out


def argv_of(command: str, repo: Path) -> list[str]:
    """The argument list a marker's command runs as; ValueError for a command this tool does not run."""
    args = shlex.split(command)
    if len(args) < 2 or args[0] != "python":
        raise ValueError(f"expected a command 'python benchmarks/SCRIPT.py ...' or 'python tools/...', got {command!r}")
    script = Path(args[1])
    if script.is_absolute() or script.suffix != ".py" or script.parts[0] not in ("benchmarks", "tools"):
        raise ValueError(f"expected a script under benchmarks/ or tools/, got {args[1]!r} in {command!r}")
    if not (repo / script).is_file():
        raise ValueError(f"script {args[1]!r} of {command!r} does not exist")
    return [sys.executable, *args[1:]]


def output(command: str, repo: Path, timeout: float = 300.0) -> str:
    """What ``command`` prints, as the body of its block (ending in one newline); RuntimeError if it fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo / "src"), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        argv_of(command, repo), cwd=repo, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{command!r} exited with {proc.returncode}:\n{tail}")
    return proc.stdout.rstrip("\n") + "\n"


def short_diff(old: str, new: str, name: str) -> str:
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), f"{name} (docs)", f"{name} (JSON)", n=1))
    lines = [ln.rstrip("\n") for ln in lines]
    if len(lines) > DIFF_LINES:
        lines = [*lines[:DIFF_LINES], f"... ({len(lines) - DIFF_LINES} more diff lines)"]
    return "\n".join(lines)


def run(files: list[Path], repo: Path, *, write: bool) -> int:
    """Check (or rewrite) the blocks of ``files``; the exit status: 0 all current, 1 stale or failing."""
    stale = failed = total = 0
    for path in files:
        found = blocks(path)
        if not found:
            continue
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(repo) if path.is_relative_to(repo) else path
        pieces, last = [], 0
        for b in found:
            total += 1
            try:
                new = output(b.command, repo)
            except (ValueError, RuntimeError, subprocess.TimeoutExpired) as e:
                failed += 1
                print(f"{rel}:{b.line}: error: {e}", file=sys.stderr)
                continue
            if new == b.body:
                continue
            stale += 1
            if write:
                pieces += [text[last : b.start], new]
                last = b.end
                print(f"{rel}:{b.line}: rewritten: {b.command}")
            else:
                print(f"{rel}:{b.line}: stale: {b.command}")
                print(short_diff(b.body, new, f"{rel}:{b.line}"))
        if write and pieces:
            path.write_text("".join([*pieces, text[last:]]), encoding="utf-8")
    verb = "rewritten" if write else "stale"
    print(f"{total} generated blocks, {stale} {verb}, {failed} failing")
    return 1 if failed or (stale and not write) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 naming each stale block, with a short diff")
    mode.add_argument("--write", action="store_true", help="rewrite each block with its command's output")
    ap.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/*.md)")
    ap.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    repo = a.repo.resolve()
    files = [f.resolve() for f in a.files] or pages(repo)
    for f in files:
        if not f.is_file():
            print(f"error: {f}: no such file", file=sys.stderr)
            return 2
    return run(files, repo, write=a.write)


if __name__ == "__main__":
    sys.exit(main())
