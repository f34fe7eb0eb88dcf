"""The package loads lazily: ``import rankwise`` and the ``rankwise`` command do not import torch,
and the first attribute access registers every operator, loss and SoDeep sorter as before."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import rankwise


def _run(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return res.stdout.strip()


def test_import_and_cli_do_not_import_torch() -> None:
    assert _run("import sys, rankwise; print('torch' in sys.modules)") == "False"
    code = "import sys, rankwise.cli, rankwise.sodeep.cli; print('torch' in sys.modules, 'numba' in sys.modules)"
    assert _run(code) == "False False"


_COMMAND_THEN_MODULES = """
import contextlib, io, sys
from rankwise.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main({argv!r})
    except SystemExit as e:
        assert e.code in (0, None), e.code
assert out.getvalue().strip()
print(sorted(m for m in ("torch", "lightning", "numpy", "pandas", "matplotlib") if m in sys.modules))
"""


@pytest.mark.parametrize(
    "argv", [["--help"], ["config"], ["config", "dir"], ["config", "ltr"], ["config", "--help"], ["train", "--help"]]
)
def test_help_and_config_reference_import_neither_torch_nor_numpy(argv: list[str]) -> None:
    """`rankwise --help`, `rankwise config` (the shared sections, read from the config's schema) and
    `rankwise config RECIPE` (a built-in recipe's rows, stored) run without torch, Lightning or numpy:
    the recipe registry and the config layer import none of them."""
    assert _run(_COMMAND_THEN_MODULES.format(argv=argv)) == "[]"


def test_config_layer_and_recipe_registry_do_not_import_torch() -> None:
    code = (
        "import sys; from rankwise.recipes import config_fields, list_presets, load_config; "
        "from rankwise.recipes.registry import RECIPES; from rankwise._registry import Registry; "
        "print(len(config_fields()) > 0, 'torch' in sys.modules)"
    )
    assert _run(code) == "True False"


def test_first_attribute_access_loads_and_registers_everything() -> None:
    code = (
        "import sys, rankwise; f = rankwise.rank; "
        "print('torch' in sys.modules, 'numba' in sys.modules, 'lightning' in sys.modules, "
        "'sodeep' in rankwise.list_soft_methods(), 'supcon' in rankwise.list_losses())"
    )
    assert _run(code) == "True False False True True"


@pytest.mark.slow
def test_registries_complete_whatever_is_imported_first() -> None:
    """``rankwise.ops`` alone still knows the SoDeep method and operator (registered from rankwise.sodeep)."""
    code = (
        "from rankwise.ops import list_ops, soft_rank, list_soft_methods; "
        "print('sodeep_rank' in list_ops(), 'sodeep' in list_soft_methods())"
    )
    assert _run(code) == "True True"
    code = "import torch; from rankwise.ops import soft_rank as f; print(f(torch.ones(2, 32), method='sodeep').shape)"
    assert _run(code) == "torch.Size([2, 32])"


def test_top_level_names() -> None:
    names = rankwise.__all__
    assert {"rank", "soft_rank", "neural_sort", "list_losses", "get_loss", "losses", "ops", "sodeep_sorter"} <= set(
        names
    )
    assert set(names) <= set(dir(rankwise))
    for name in names:
        assert getattr(rankwise, name) is not None
    namespace: dict[str, object] = {}
    exec("from rankwise import *", namespace)
    assert namespace["rank"] is rankwise.ops.rank
    assert rankwise.__version__
    assert rankwise.data.__name__ == "rankwise.data"
    torch.testing.assert_close(rankwise.rank(torch.tensor([[3.0, 1.0]])), torch.tensor([[2.0, 1.0]]))


def test_unknown_attribute() -> None:
    with pytest.raises(AttributeError, match="module 'rankwise' has no attribute 'nope'"):
        rankwise.nope
    with pytest.raises(AttributeError):
        rankwise.sodeep.nope


_EVERY_MODULE_FIRST = """
import importlib, pkgutil, sys, rankwise
names = sorted(m.name for m in pkgutil.walk_packages(rankwise.__path__, "rankwise."))
failed = []
for name in names:
    for mod in [m for m in sys.modules if m == "rankwise" or m.startswith("rankwise.")]:
        del sys.modules[mod]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {exc!r}")
print(len(names))
print("\\n".join(failed))
"""


@pytest.mark.slow
def test_every_module_imports_first() -> None:
    """No import cycle whichever module a program imports first (the package no longer imports
    everything up front)."""
    out = _run(_EVERY_MODULE_FIRST).splitlines()
    assert int(out[0]) > 40
    assert out[1:] == []
