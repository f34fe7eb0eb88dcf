"""The documentation: generated pages cover every public name, preset and config field; code runs.

``tools/docs_gen.py`` generates the API reference and the presets/configuration reference when the
site is built (``mkdocs build --strict``, run by ``.ci/run``). These tests check what it generates
without needing MkDocs, and run every ``python`` code block of the README and of ``docs/*.md``
(blocks fenced as ``py`` are illustrations with placeholders, e.g. a file name, and are not run).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def docs_gen():
    spec = importlib.util.spec_from_file_location("docs_gen", REPO / "tools" / "docs_gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_gen"] = module
    spec.loader.exec_module(module)
    return module


def test_api_reference_lists_every_public_name(docs_gen) -> None:
    pages = docs_gen.api_pages()
    assert set(pages) == {"reference/index.md"} | {f"reference/{m}.md" for m in docs_gen.API_MODULES}
    for module in docs_gen.API_MODULES:
        page = pages[f"reference/{module}.md"]
        mod = importlib.import_module(module)
        assert mod.__all__, module
        for name in mod.__all__:
            documented = f"::: {docs_gen.api_identifier(module, name)}\n" in page
            linked = f"| `{module}.{name}` |" in page
            assert documented or linked, f"{module}.{name} is missing from its API page"
        assert f"[`{module}`]({module}.md)" in pages["reference/index.md"]


def test_api_reference_documents_each_object_once(docs_gen) -> None:
    """A name re-exported by several modules is rendered on one page and linked from the others."""
    rendered: dict[int, str] = {}
    for module in docs_gen.API_MODULES:
        mod = importlib.import_module(module)
        for name in mod.__all__:
            if docs_gen._home(module, name) == module and not isinstance(getattr(mod, name), type(sys)):
                obj = getattr(mod, name)
                if isinstance(obj, (str, int, float, tuple)):  # constants may be equal objects by chance
                    continue
                assert id(obj) not in rendered, f"{module}.{name} is also rendered as {rendered[id(obj)]}"
                rendered[id(obj)] = f"{module}.{name}"


def test_config_reference_lists_every_field_and_preset(docs_gen) -> None:
    pytest.importorskip("yaml")
    from rankwise.recipes import config

    page = docs_gen.config_reference()
    presets = config.list_presets()
    assert len(presets) > 10
    for name in presets:
        assert f"| [`{name}`](#preset-{name}) |" in page, name
        assert f'??? example "`{name}`"' in page, name
    sections = docs_gen.config_sections()
    classes = {cls for _, cls in sections}
    assert config.DataConfig in classes and config.TrainerConfig in classes
    n_fields = 0
    for prefix, cls in sections:
        for name, f in cls.model_fields.items():
            key = f"{prefix}.{name}"
            if isinstance(f.annotation, type) and issubclass(f.annotation, config.Section):
                continue
            row = re.search(rf"^\| `{re.escape(key)}` \| `([^`]+)` \| ([^|]*) \|", page, flags=re.M)
            assert row, f"{cls.__name__}.{name} ({key}) is missing from the configuration reference"
            n_fields += 1
    assert n_fields > 50
    for name, f in config.Config.model_fields.items():
        if not (isinstance(f.annotation, type) and issubclass(f.annotation, config.Section)):
            assert f"| `{name}` |" in page
    lr = re.search(r"^\| `optimizer\.lr` \| `float` \| `0\.001` \| `> 0` \| learning rate \|", page, flags=re.M)
    assert lr, "the row of optimizer.lr is read from the JSON schema (type, default, range, description)"


def test_type_names(docs_gen) -> None:
    from typing import Any, Literal

    assert docs_gen.type_name(Literal["a", "b"]) == '"a" | "b"'
    assert docs_gen.type_name(int | None) == "int | None"
    assert docs_gen.type_name(dict[str, Any]) == "dict[str, any]"
    assert docs_gen.type_name(list[int]) == "list[int]"


def test_readme_benchmark_figures_are_those_of_the_benchmarks_page() -> None:
    """The README's short table quotes docs/benchmarks.md: each ratio is in a full-table row of the same
    case (the same first word and size)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Benchmarks\n(.*?)(?=^## )", readme, flags=re.M | re.S)
    assert section is not None
    rows = [ln for ln in section.group(1).splitlines() if ln.startswith("| ") and not ln.startswith("| case")]
    assert len(rows) >= 4
    full = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8").splitlines()
    for row in rows:
        case, _reference, cpu, gpu = (c.strip() for c in row.strip("|").split("|"))
        word = case.split()[0].strip(",")
        size = re.search(r"(?:×|B =) (\d+(?:,\d{3})*)", case)
        assert size is not None, case
        same_case = [
            ln for ln in full if ln.startswith(f"| {word}") and re.search(rf"(?<![\d,]){size.group(1)}(?!,?\d)", ln)
        ]
        assert same_case, f"{case}: no row of docs/benchmarks.md"
        for figure in (cpu, gpu):
            pattern = rf"(?<![\d.]){re.escape(figure)}(?![\d])"
            assert any(re.search(pattern, ln) for ln in same_case), f"{case}: {figure} is not in its rows"


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.M | re.S)


PAGES = [p for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))] if _python_blocks(p)]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_code_blocks_run(path: Path, tmp_path, monkeypatch) -> None:
    blocks = _python_blocks(path)
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{path.name}[python block {i}]", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"{path.name}, python block {i} fails:\n{block}") from e


def test_imbalanced_own_table_is_its_json() -> None:
    """docs/imbalanced.md's diabetes table is ``benchmarks/results/own_table_diabetes.json``, cell by cell."""
    import json

    data = json.loads((REPO / "benchmarks" / "results" / "own_table_diabetes.json").read_text())
    text = (REPO / "docs" / "imbalanced.md").read_text(encoding="utf-8")
    assert f"rankwise commit\n`{data['commit']}`" in text or f"rankwise commit `{data['commit']}`" in text
    for method, r in data["methods"].items():
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| `{method}` "))
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        want = [r["mae"][g] for g in ("all", "many", "medium", "few")] + [r["gm_all"]]
        assert cells == [f"{v:.2f}" for v in want], (method, cells)


def test_topk_tables_are_their_json() -> None:
    """docs/topk.md's result tables are ``benchmarks/results/topk_synthetic.json``, cell by cell."""
    import json

    data = json.loads((REPO / "benchmarks" / "results" / "topk_synthetic.json").read_text())
    text = (REPO / "docs" / "topk.md").read_text(encoding="utf-8")
    assert f"`{data['commit']}`" in text
    for name, block in data["settings"].items():
        start = text.index(f"**{name}** (`{block['command']}`)")
        lines = text[start:].splitlines()
        for preset, m in block["methods"].items():
            row = next(ln for ln in lines if ln.startswith(f"| `{preset}` "))
            cells = [c.strip() for c in row.strip("|").split("|")]
            t1, t5 = m["top1_summary"], m["top5_summary"]
            assert cells[2:4] == [f"{t1['mean']:.2f} ± {t1['std']:.2f}", f"{t5['mean']:.2f} ± {t5['std']:.2f}"], (
                name,
                preset,
            )
