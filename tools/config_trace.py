"""Follow one ``load_config`` call by call (``sys.setprofile``) and summarise it.

Two configs: a 3-file ``extends:`` chain (two files written to a temporary folder on top of the
bundled preset ``mslr_web10k_listnet``) plus one ``--set``; and the preset ``abalone_lds``
switched to a small CSV by ``--set data.name=csv`` (the own-data route of a preset). Printed as
JSON: the calls into rankwise (count, the modules they are in, the calls from one module into
another), the config files read and the YAML texts parsed (each by name), and whether any dataset
was loaded. A warm-up load first, so that lazy imports and caches do not count.

    PYTHONPATH=src python tools/config_trace.py
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any


def trace(source: str, overrides: list[str]) -> dict[str, Any]:
    from rankwise.recipes import load_config
    from rankwise.recipes.config import _parsing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_config(source, overrides)  # warm: imports, the registry's lazy recipe
    _parsing._PARSED.clear()  # parse again what a first load parses
    calls: collections.Counter[str] = collections.Counter()
    modules: collections.Counter[str] = collections.Counter()
    crossings: collections.Counter[str] = collections.Counter()
    reads: list[str] = []
    parses: list[str] = []
    datasets: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        mod = frame.f_globals.get("__name__", "")
        if not mod.startswith("rankwise"):
            return
        name = frame.f_code.co_name
        calls[f"{mod}.{name}"] += 1
        modules[mod] += 1
        back = frame.f_back
        caller = back.f_globals.get("__name__", "") if back is not None else ""
        if caller != mod:  # a call from another module (of rankwise, or pydantic's into a validator)
            crossings[f"{caller or '?'} -> {mod}"] += 1
        if name == "_read_config_text":
            reads.append(Path(frame.f_locals["path"]).name)
        elif name == "_parse_yaml":
            where = str(frame.f_locals["where"])
            parses.append(where.rsplit("/", 1)[-1] if where.startswith("config file") else where)
        elif name == "get_dataset" and mod.startswith("rankwise.data"):
            datasets.append(str(frame.f_locals.get("name")))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sys.setprofile(profile)
        try:
            load_config(source, overrides)
        finally:
            sys.setprofile(None)
    return {
        "rankwise_calls": sum(calls.values()),
        "distinct_functions": len(calls),
        "modules": dict(sorted(modules.items())),
        "cross_module_calls": sum(crossings.values()),
        "crossings": dict(sorted(crossings.items())),
        "file_reads": reads,
        "yaml_parses": parses,
        "datasets_loaded": datasets,
    }


def run() -> dict[str, Any]:
    """Both traces, by name."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.yaml"
        base.write_text("extends: mslr_web10k_listnet\ndata: {options: {fold: 2}}\n")
        mine = Path(tmp) / "mine.yaml"
        mine.write_text("extends: base.yaml\ntrainer: {max_epochs: 3}\n")
        table = Path(tmp) / "table.csv"
        rows = ["x,y"] + [f"{i / 97:.4f},{(i * 37) % 50}" for i in range(200)]
        table.write_text("\n".join(rows) + "\n")
        switched = ["data.name=csv", f"data.options.path={table}", "data.options.target=y"]
        out = {
            "extends_chain_and_one_set": trace(str(mine), ["optimizer.lr=0.5"]),
            "preset_switched_to_a_csv": trace("abalone_lds", switched),
        }
    return out


def main() -> None:
    print(json.dumps(run(), indent=1))


if __name__ == "__main__":
    main()
