"""Every registered operator and loss has example inputs in ``tests/registry_examples.py`` (and no
example names an entry that does not exist), so a newly registered entry cannot skip the
registry-wide suites; the library itself never reaches into ``tests``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import rankwise
from rankwise.losses import LOSSES
from rankwise.ops import OPS
from tests.registry_examples import EXAMPLES, VARIANTS, Example, factories

SRC = Path(__file__).resolve().parents[1] / "src" / "rankwise"


def _registered() -> set[tuple[str, str]]:
    """Every registered entry and every test variant."""
    rankwise.list_ops()  # the plugin operators (SoDeep) too
    return {("op", n) for n in OPS.names()} | {("loss", n) for n in LOSSES.names()} | set(VARIANTS)


def test_every_variant_is_an_entry_with_its_options() -> None:
    cpu = torch.device("cpu")
    for (kind, name), v in sorted(VARIANTS.items()):
        registry = OPS if kind == "op" else LOSSES
        assert v.entry in registry.names() and name == f"{v.entry}.{v.tag}" and "." not in v.entry, name
        assert v.options, f"{name}: a variant is its entry with options"
        kwargs = factories(kind, name).example(torch.float32, cpu).kwargs
        assert {k: kwargs.get(k) for k in v.options} == dict(v.options), f"{name}: {kwargs} lack {v.options}"


def test_every_registered_op_and_loss_has_examples() -> None:
    missing = sorted(f"{kind} {name!r}" for kind, name in _registered() - set(EXAMPLES))
    assert not missing, f"registered without example inputs in tests/registry_examples.py: {', '.join(missing)}"


def test_every_example_names_a_registered_entry() -> None:
    stale = sorted(f"{kind} {name!r}" for kind, name in set(EXAMPLES) - _registered())
    assert not stale, f"example inputs for entries that are not registered: {', '.join(stale)}"


def test_every_entry_has_all_three_factories() -> None:
    cpu = torch.device("cpu")
    for kind, name in sorted(_registered()):
        f = factories(kind, name)
        assert isinstance(f.example(torch.float32, cpu), Example), name
        assert f.degenerate is not None and all(isinstance(d, Example) for d in f.degenerate(torch.float32, cpu)), name
        assert f.fuzz is not None, name


def test_a_missing_entry_is_named() -> None:
    with pytest.raises(LookupError, match=r"loss 'no_such_loss' is registered but has no example inputs"):
        factories("loss", "no_such_loss")


def test_the_registry_holds_no_test_inputs() -> None:
    fields = set(OPS.entry("rank").__dataclass_fields__)
    assert not fields & {"example", "degenerate", "fuzz"}, fields


def test_the_library_never_imports_tests() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            bad = [n for n in names if n == "tests" or n.startswith("tests.")]
            offenders += [f"{path.relative_to(SRC.parent)}: {n}" for n in bad]
    assert not offenders, offenders
