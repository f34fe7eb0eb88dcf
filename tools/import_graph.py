"""The import graph of one package of ``src/rankwise``: its modules, their layers and import edges.

Usage::

    python tools/import_graph.py                       # rankwise.recipes, subpackages as one module each
    python tools/import_graph.py rankwise.recipes --files --list   # every file a module; the layers listed

A *module* is a ``.py`` file directly in the package, or a subpackage taken whole (``--files``: every
file, ``__init__.py`` included, is its own module). An *edge* is an ordered pair of modules where
the first imports the second, counted once however many statements name it; every ``import`` /
``from ... import`` counts, also those inside functions and under ``if TYPE_CHECKING:``. Imports
from outside the package draw no edge. The *layer* of a module is 1 for one that imports no other
module of the package, else one more than the highest layer it imports; the number of layers is the
longest import chain. A cycle is reported and leaves its modules without a layer.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def files(package: str, src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (path, is a package's ``__init__``) for every file of ``package``."""
    root = src.joinpath(*package.split("."))
    if not (root / "__init__.py").is_file():
        raise SystemExit(f"error: {package}: no package at {root}")
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(src).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


def file_graph(package: str, src: Path = SRC) -> dict[str, set[str]]:
    """File -> the files of ``package`` it imports (a name of a package resolves to its ``__init__``)."""
    mods = files(package, src)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, (path, is_pkg) in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                deps |= {r for a in node.names if (r := resolve(a.name))}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod if is_pkg else mod.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    full = f"{base}.{node.module}" if node.module else base
                else:
                    full = node.module or ""
                for a in node.names:
                    target = f"{full}.{a.name}" if f"{full}.{a.name}" in mods else resolve(full)
                    if target:
                        deps.add(target)
        deps.discard(mod)
        graph[mod] = deps
    return graph


def module_of(name: str, package: str, *, whole_subpackages: bool) -> str:
    if not whole_subpackages or name == package:
        return name
    rest = name[len(package) + 1 :].split(".")
    return f"{package}.{rest[0]}"


def graph(package: str, *, whole_subpackages: bool = True, src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports."""
    out: dict[str, set[str]] = {}
    for name, deps in file_graph(package, src).items():
        a = module_of(name, package, whole_subpackages=whole_subpackages)
        out.setdefault(a, set())
        out[a] |= {b for d in deps if (b := module_of(d, package, whole_subpackages=whole_subpackages)) != a}
    return out


def layers(g: dict[str, set[str]]) -> tuple[dict[str, int], list[str]]:
    """The layer of each module outside a cycle, and the modules on or above a cycle."""
    layer: dict[str, int] = {}
    state: dict[str, int] = {}  # 1 visiting, 2 done
    cyclic: set[str] = set()

    def visit(v: str) -> int | None:
        if state.get(v) == 2:
            return layer.get(v)
        if state.get(v) == 1:
            cyclic.add(v)
            return None
        state[v] = 1
        below = [visit(w) for w in sorted(g.get(v, ()))]
        state[v] = 2
        if any(b is None for b in below):
            cyclic.add(v)
            return None
        layer[v] = 1 + max((b for b in below if b is not None), default=0)
        return layer[v]

    sys.setrecursionlimit(max(1000, 10 * len(g)))
    for v in sorted(g):
        visit(v)
    return layer, sorted(cyclic)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("package", nargs="?", default="rankwise.recipes", help="dotted package under src/")
    ap.add_argument("--files", action="store_true", help="every file its own module (subpackages not taken whole)")
    ap.add_argument("--list", action="store_true", help="list the modules by layer, top first, with their imports")
    ap.add_argument("--src", type=Path, default=SRC, help="the folder holding the package (default: src/)")
    a = ap.parse_args(argv)
    g = graph(a.package, whole_subpackages=not a.files, src=a.src)
    layer, cyclic = layers(g)
    edges = sum(len(d) for d in g.values())
    print(f"{a.package}: {len(g)} modules, {max(layer.values(), default=0)} layers, {edges} import edges")
    if cyclic:
        print(f"cycles: {len(cyclic)} modules on or above an import cycle: {', '.join(cyclic)}")
    if a.list:
        short = {m: m[len(a.package) + 1 :] or "__init__" for m in g}
        for m in sorted(layer, key=lambda m: (-layer[m], m)):
            print(f"  {layer[m]:2d}  {short[m]}  -> {', '.join(sorted(short[d] for d in g[m])) or '-'}")
    return 1 if cyclic else 0


if __name__ == "__main__":
    sys.exit(main())
