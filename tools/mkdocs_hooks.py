"""MkDocs hooks (``hooks:`` in mkdocs.yml): add the generated pages of ``tools/docs_gen.py``.

The API reference and the presets/configuration reference are generated from the code at every
build, so they cannot drift from it; the ``API reference`` entry of the navigation is filled in here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docs_gen

CONFIG_PAGE = "config-reference.md"


def on_config(config: Any) -> Any:
    for entry in config["nav"]:
        if isinstance(entry, dict) and "API reference" in entry:
            entry["API reference"] = [
                {"Overview": "reference/index.md"},
                *({m: docs_gen.api_page_path(m)} for m in docs_gen.API_MODULES),
            ]
    return config


def on_files(files: Files, config: Any) -> Files:
    pages = docs_gen.api_pages()
    pages[CONFIG_PAGE] = docs_gen.config_reference()
    for path, content in pages.items():
        files.append(File.generated(config, path, content=content))
    return files
