"""``tools/import_graph.py`` counts modules, layers and import edges of a package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("import_graph_tool", REPO / "tools" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["import_graph_tool"] = mod
    spec.loader.exec_module(mod)
    return mod


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_counts_modules_layers_edges(tool, tmp_path, capsys) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from . import b\nfrom .b import thing\n",  # one edge, however many statements
            "pkg/b.py": "def f():\n    from pkg import c  # lazy imports count\n",
            "pkg/c.py": "import os\n",  # outside the package: no edge
            "pkg/sub/__init__.py": "from .x import y\n",
            "pkg/sub/x.py": "from ..a import z\n",
        },
    )
    g = tool.graph("pkg", src=tmp_path)
    assert g == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.c"},
        "pkg.c": set(),
        "pkg.sub": {"pkg.a"},
    }
    layer, cyclic = tool.layers(g)
    assert layer == {"pkg": 1, "pkg.c": 1, "pkg.b": 2, "pkg.a": 3, "pkg.sub": 4} and cyclic == []
    assert tool.main(["pkg", "--src", str(tmp_path)]) == 0
    assert "pkg: 5 modules, 4 layers, 3 import edges" in capsys.readouterr().out
    by_file = tool.graph("pkg", whole_subpackages=False, src=tmp_path)
    assert by_file["pkg.sub"] == {"pkg.sub.x"} and by_file["pkg.sub.x"] == {"pkg.a"}


def test_reports_a_cycle(tool, tmp_path, capsys) -> None:
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from . import b\n", "pkg/b.py": "from . import a\n"})
    assert tool.main(["pkg", "--src", str(tmp_path)]) == 1
    assert "cycles: 2 modules" in capsys.readouterr().out
