"""The README's short benchmark table: a few cells of the CPU and GPU tables of docs/benchmarks.md.

Usage::

    python tools/readme_benchmarks.py --isotonic benchmarks/results/isotonic_soft_rank.json \\
        --supcon benchmarks/results/losses_supcon_time.json --losses benchmarks/results/losses.json \\
        --gpu benchmarks/results/gpu.json

It reads only the JSON (no torch) and formats every ratio as the scripts' ``--markdown`` tables do,
so each cell is a cell of docs/benchmarks.md (``tests/test_docs.py`` checks that too).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _tables import machine_text, ratio, read  # benchmarks/ is not a package


def _gpu_op(gpu: dict[str, Any], shape: str) -> float | None:
    cases = gpu.get("ops", {}).get(shape, {})
    a = cases.get("soft_rank.isotonic_l2", {}).get("median_ms")
    b = cases.get("ref:torchsort_l2", {}).get("median_ms")
    return None if a is None or b is None else b / a


def _gpu_loss(gpu: dict[str, Any], batch: int, name: str) -> float | None:
    return gpu.get("losses", {}).get(f"B={batch}", {}).get(f"public:{name}", {}).get("ratio")


def markdown(isotonic: dict[str, Any], supcon: dict[str, Any], losses: dict[str, Any], gpu: dict[str, Any]) -> str:
    iso = isotonic["results"]
    sup = supcon["sections"]["supcon"]["threads=1"]
    ranksim = losses["sections"]["ranksim"]["threads=1"]
    rnc = losses["sections"]["rnc"]["threads=1"]
    rows = [
        (
            "isotonic `soft_rank` l2, 1 × 10,000",
            "torchsort",
            iso.get("threads=1 soft_rank l2 1x10000", {}).get("ratio"),
            _gpu_op(gpu, "1x10000"),
        ),
        (
            "isotonic `soft_rank` l2, 1 × 100,000",
            "torchsort",
            iso.get("threads=1 soft_rank l2 1x100000", {}).get("ratio"),
            _gpu_op(gpu, "1x100000"),
        ),
        (
            "SupCon, B = 1,024 (2 views, D = 128)",
            "HobbitLong's `SupConLoss`",
            sup.get("B=1024", {}).get("ratio"),
            _gpu_loss(gpu, 1024, "supcon"),
        ),
        (
            "RankSim, B = 1,024, d = 512",
            "the public code's per-row loop",
            ranksim.get("B=1024", {}).get("ratio_vs_reference"),
            _gpu_loss(gpu, 1024, "ranksim"),
        ),
        (
            "Rank-N-Contrast, B = 256 (2 views)",
            "the public code's O(N³) loop",
            rnc.get("B=256", {}).get("ratio"),
            _gpu_loss(gpu, 256, "rnc"),
        ),
    ]
    env = gpu.get("environment", {})
    lines = ["| case | reference | CPU, 1 thread | GPU |", "|---|---|---|---|"]
    lines += [f"| {case} | {ref} | {ratio(cpu)} | {ratio(g)} |" for case, ref, cpu, g in rows]
    lines += [
        "",
        f"CPU: a {isotonic.get('cpu_count', '?')}-core machine, torch {isotonic.get('torch', '?')}; "
        f"GPU: {machine_text({k: env.get(k) for k in ('gpu', 'torch')})}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--isotonic", type=Path, required=True, help="a benchmarks/isotonic.py JSON (soft_rank)")
    ap.add_argument("--supcon", type=Path, required=True, help="a benchmarks/losses.py JSON with supcon")
    ap.add_argument("--losses", type=Path, required=True, help="a benchmarks/losses.py JSON with ranksim and rnc")
    ap.add_argument("--gpu", type=Path, required=True, help="a benchmarks/gpu.py JSON")
    a = ap.parse_args(argv)
    print(markdown(read(a.isotonic), read(a.supcon), read(a.losses), read(a.gpu)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
