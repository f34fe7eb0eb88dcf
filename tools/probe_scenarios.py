"""Multi-step scenarios through the `rankwise` command: train, change something, run again, compare.

Usage: PYTHONPATH=$PWD/src python tools/probe_scenarios.py OUT_DIR [WORKERS] [SECTIONS]

Where tools/probe_cli.py sends one command per case, a scenario here is a short story (train a run,
move to another directory, append rows to its data, kill it between stages, tamper with a cache,
fill the disk) whose last command is judged. Each section is a module of tools/scenarios/ holding
functions decorated with ``@scenario``; SECTIONS is a comma-separated subset of their names (default:
all). The summary and every scenario go to OUT_DIR/results.json and
benchmarks/results/probe_scenarios.json (env PROBE_JSON: elsewhere).

Outcomes:
  ok             accepted and right (same numbers where the story expects them)
  clear          refused with exactly one `error:` line on stderr, exit 2 (or 130), no traceback
  silent_wrong   exit 0 with results that differ from what the story expects, or with no word
  crash          a traceback, an `error: unexpected ...` line, another exit status, a signal
  accepts        exit 0 where the story expects a refusal
  refuses_valid  a clear refusal where the story expects acceptance
  loss           data the user had (logs, files) lost or leaked, temporary files left behind
  hang           the story ran past its time limit
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios import _harness as H

OUTCOMES = ("ok", "clear", "silent_wrong", "crash", "accepts", "refuses_valid", "loss", "hang")


def main() -> None:
    names = sorted(
        m.name for m in pkgutil.iter_modules([str(Path(__file__).parent / "scenarios")]) if not m.name.startswith("_")
    )
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="scratch folder (deleted and recreated)")
    ap.add_argument("workers", nargs="?", type=int, default=2, help="scenarios run at once (default 2)")
    ap.add_argument("sections", nargs="?", default=",".join(names), help=f"comma-separated subset of {','.join(names)}")
    args = ap.parse_args()
    sections = args.sections.split(",")
    unknown = sorted(set(sections) - set(names))
    if unknown:
        ap.error(f"unknown section(s) {unknown}; choose from {','.join(names)}")
    for s in sections:
        importlib.import_module(f"scenarios.{s}")
    H.setup(Path(args.out_dir))
    chosen = [sc for sc in H.SCENARIOS if sc.section in sections]

    def run_one(sc: H.Scenario) -> dict:
        t0 = time.time()
        ctx = H.Context(sc)
        try:
            outcome, detail = sc.fn(ctx)
        except H.Hang as e:
            outcome, detail = "hang", str(e)
        except Exception:  # a broken story is reported as such, never as a pass
            outcome, detail = "crash", "probe error: " + traceback.format_exc(limit=3)[-600:]
        if outcome not in OUTCOMES:
            outcome, detail = "crash", f"probe returned unknown outcome {outcome!r}: {detail}"
        res = {"section": sc.section, "name": sc.name, "outcome": outcome, "detail": str(detail)[:600]}
        res["seconds"] = round(time.time() - t0, 1)
        print(json.dumps(res), flush=True)
        return res

    t0 = time.time()
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(run_one, chosen))
    counts = {o: sum(r["outcome"] == o for r in results) for o in OUTCOMES}
    summary = {"scenarios": len(results), "counts": counts, "sections": sections, "seconds": round(time.time() - t0)}
    (H.OUT / "results.json").write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    dest = Path(
        os.environ.get("PROBE_JSON") or Path(__file__).resolve().parents[1] / "benchmarks/results/probe_scenarios.json"
    )
    dest.write_text(
        json.dumps(
            {
                "command": " ".join(["python", "tools/probe_scenarios.py", *sys.argv[1:]]),
                "summary": summary,
                "not_ok": [r for r in results if r["outcome"] not in ("ok", "clear")],
            },
            indent=1,
        )
        + "\n"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
