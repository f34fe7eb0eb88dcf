"""A missing optional dependency is one ``error:`` line naming the extra that installs it, exit status 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("typer")

from typer.testing import CliRunner

from rankwise._extras import EXTRAS, extra_of, missing_dependency
from rankwise.cli import app
from tests.cli_helpers import one_error_line

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_the_extras_are_those_of_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, dists in EXTRAS.items():
        names = {d.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip() for d in declared[extra]}
        assert set(dists) == names, extra


@pytest.mark.parametrize(
    "module,extra",
    [
        ("nibabel", "mri"),
        ("nilearn.datasets", "mri"),
        ("torchio", "mri"),
        ("lightning", "train"),
        ("lightning.pytorch", "train"),
        ("sklearn.mixture", "train"),
        ("sklego", "train"),
        ("yaml", "train"),
        ("scipy.ndimage", "train"),
        ("diffsort", "parity"),
        ("numpy", None),
    ],
)
def test_each_optional_module_maps_to_its_extra(module, extra):
    assert extra_of(module) == extra


@pytest.fixture
def without(monkeypatch):
    def hide(*modules):
        for m in list(sys.modules):
            if m.split(".")[0] in modules:
                monkeypatch.delitem(sys.modules, m)
        for m in modules:
            monkeypatch.setitem(sys.modules, m, None)

    return hide


def test_a_wrapped_import_error_is_found_through_its_context(without):
    without("nibabel")
    from rankwise.data import nifti

    with pytest.raises(ImportError) as info:
        nifti._mri_modules()
    assert "rankwise[mri]" in str(info.value)  # the library's own message
    assert missing_dependency(info.value) == (
        "the optional dependency nibabel is not installed; install it with: pip install 'rankwise[mri]'"
    )
    assert missing_dependency(ImportError("cannot import name 'x' from 'lightning'", name="lightning")) is None
    assert missing_dependency(ModuleNotFoundError("No module named 'numpy'", name="numpy")) is None


def test_missing_mri_extra_names_rankwise_mri(without, tmp_path):
    without("nibabel")
    r = runner.invoke(app, ["data", "make", "brain-age-synthetic", "--out", str(tmp_path / "c"), "--n", "8"])
    line = one_error_line(r)
    assert "nibabel is not installed" in line and "pip install 'rankwise[mri]'" in line
    assert r.stdout == "" and r.stderr == line + "\n"  # a user error goes to stderr


def test_missing_train_extra_names_rankwise_train(without, tmp_path):
    without("lightning")
    r = runner.invoke(app, ["train", "abalone_vanilla", "--out", str(tmp_path / "r"), "--no-progress"])
    line = one_error_line(r)
    assert "lightning is not installed" in line and "pip install 'rankwise[train]'" in line
    assert not (tmp_path / "r").exists()
