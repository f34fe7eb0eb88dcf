"""The import graph of ``src/rankwise``: no cycle anywhere, and the library never imports upward.

Every ``import`` / ``from ... import`` statement of every module counts, including the ones inside
functions (a lazy import is still a dependency) and the type-only ones under ``if TYPE_CHECKING:``
(a type checker and a reader follow them too).
``from pkg import name`` depends on ``pkg.name`` when that is a module, else on ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rankwise"

#: packages of the library: they never import the training system (recipes) or the command line
LIBRARY = (
    "_kernels",
    "ops",
    "losses",
    "metrics",
    "imbalanced",
    "data",
    "models",
    "sodeep",
    "distributed",
    "brain_age",
    "_registry",
    "_validation",
    "_suggest",
    "_twin",
    "_binning",
    "_stats",
    "_fileio",
    "_extras",
)


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in SRC.rglob("*.py"):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (p, is_pkg)
    return out


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module: top level, lazy (in a function) and type-only alike."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def import_graph() -> dict[str, set[str]]:
    """Module -> the rankwise modules it imports."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, (path, is_pkg) in mods.items():
        deps: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {r for a in node.names if a.name.startswith("rankwise") and (r := resolve(a.name))}
                continue
            if node.level:
                base = mod if is_pkg else mod.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                full = f"{base}.{node.module}" if node.module else base
            else:
                full = node.module or ""
            if full != "rankwise" and not full.startswith("rankwise."):
                continue
            for a in node.names:
                target = f"{full}.{a.name}" if f"{full}.{a.name}" in mods else resolve(full)
                if target:
                    deps.add(target)
        deps.discard(mod)
        graph[mod] = deps
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_walker_finds_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_lazy_imports():
    g = import_graph()
    assert "rankwise.recipes.runner" in g["rankwise.cli"]  # imported inside a command
    assert "rankwise.recipes.config" in g["rankwise.recipes.regression.recipe"]


def test_graph_sees_type_only_imports():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rankwise.recipes import rundir\n")
    assert [n.module for n in _imports(tree) if isinstance(n, ast.ImportFrom)] == ["typing", "rankwise.recipes"]
    assert "rankwise.recipes.rundir" in import_graph()["rankwise.recipes.registry"]  # under TYPE_CHECKING there


def test_the_config_layer_imports_no_recipe_and_not_the_registry():
    g = import_graph()
    layer = {m for m in g if m == "rankwise.recipes.config" or m.startswith("rankwise.recipes.config.")}
    assert len(layer) > 1  # the package and its modules
    deps = set().union(*(g[m] for m in layer)) - layer
    assert not {d for d in deps if d.startswith("rankwise.recipes")}, deps


def test_no_import_cycle_in_rankwise():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_library_never_imports_recipes_or_cli():
    g = import_graph()
    bad = {
        m: sorted(d for d in deps if d.startswith(("rankwise.recipes", "rankwise.cli")))
        for m, deps in g.items()
        if m.split(".")[1:2] and m.split(".")[1] in LIBRARY
    }
    assert not {m: d for m, d in bad.items() if d}


def test_imbalanced_does_not_import_losses():
    g = import_graph()
    bad = {m: sorted(d for d in deps if d.startswith("rankwise.losses")) for m, deps in g.items()}
    assert not {m: d for m, d in bad.items() if d and m.startswith("rankwise.imbalanced")}


def private_imports() -> list[str]:
    """``from rankwise.m import _x`` (and relative forms) where ``_x`` is a private name of another
    module, not a submodule: shared helpers live under a public name (``rankwise._validation``, or a
    name outside the module's ``__all__``), so a private name is only ever used where it is defined."""
    mods = _modules()
    found = []
    for mod, (path, is_pkg) in sorted(mods.items()):
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}  # local name -> the rankwise module it is bound to
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "rankwise" or a.name.startswith("rankwise."):
                        bound[a.asname or a.name.partition(".")[0]] = a.name if a.asname else "rankwise"
                continue
            if node.level:
                base = mod if is_pkg else mod.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                full = f"{base}.{node.module}" if node.module else base
            else:
                full = node.module or ""
            if full != "rankwise" and not full.startswith("rankwise."):
                continue
            for a in node.names:
                private = a.name.startswith("_") and not (a.name.startswith("__") and a.name.endswith("__"))
                if private and f"{full}.{a.name}" not in mods:
                    found.append(f"{mod}: from {full} import {a.name}")
                elif f"{full}.{a.name}" in mods:
                    bound[a.asname or a.name] = f"{full}.{a.name}"
        # ``module._name`` on an imported rankwise module (the same private name, read as an attribute)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
                owner, attr = bound[node.value.id], node.attr
                private = attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))
                if private and owner != mod and f"{owner}.{attr}" not in mods:
                    found.append(f"{mod}: {node.value.id}.{attr} of {owner}")
    return found


def test_the_private_import_walker_finds_one(tmp_path: Path) -> None:
    pkg = tmp_path / "rankwise"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "_private_mod.py").write_text("")
    (pkg / "a.py").write_text("def _helper(): ...\n")
    (pkg / "b.py").write_text(
        "from rankwise.a import _helper\nfrom rankwise.sub import _private_mod\nfrom .a import __doc__\n"
        "from rankwise import a as mod_a\nimport rankwise.a\n"
        "def f():\n    return mod_a._helper, rankwise.a, mod_a.__doc__\n"
    )
    global SRC
    saved, SRC = SRC, pkg
    try:
        assert private_imports() == [
            "rankwise.b: from rankwise.a import _helper",
            "rankwise.b: mod_a._helper of rankwise.a",
        ]
    finally:
        SRC = saved


def test_no_private_name_is_imported_from_another_module() -> None:
    found = private_imports()
    assert not found, "private names imported across modules:\n" + "\n".join(found)
